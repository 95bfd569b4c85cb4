#include "durability.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "metrics.h"

static const char *skip_space(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	return p;
}

/* After an optional FIRST or ANY, a number followed by '(' is the count;
 * anything else is a list of names, of which the first one counts. */
int durability_required(const char *names)
{
	const char *p = skip_space(names);
	if (!*p)
		return 0;
	if ((!strncasecmp(p, "FIRST", 5) || !strncasecmp(p, "ANY", 3))) {
		const char *q = p + (toupper((unsigned char)*p) == 'F' ? 5 : 3);
		if (isspace((unsigned char)*q))
			p = skip_space(q);
	}
	if (!isdigit((unsigned char)*p))
		return 1;
	char *end;
	long n = strtol(p, &end, 10);
	if (*skip_space(end) != '(' || n < 1 || n > 1000)
		return 1;
	return (int)n;
}

static bool commit_waits(const char *commit)
{
	return strcmp(commit, "off") != 0 && strcmp(commit, "local") != 0;
}

void durability_judge(store_durability *d)
{
	d->required = durability_required(d->names);
	d->counted = d->attached >= 0;
	int n = d->counted && d->attached < d->required ? d->attached
							: d->required;
	d->standbys = commit_waits(d->commit) ? n : 0;
}

const char *durability_risk(const store_durability *d)
{
	if (!commit_waits(d->commit))
		return "synchronous_commit does not wait for a standby";
	if (d->required == 0)
		return "synchronous_standby_names is empty";
	if (d->standbys == 0)
		return "no synchronous standby is attached";
	return NULL;
}

static bool same(const store_durability *a, const store_durability *b)
{
	return b && a->standbys == b->standbys && a->counted == b->counted &&
	       !strcmp(a->commit, b->commit) && !strcmp(a->names, b->names) &&
	       !strcmp(a->server, b->server);
}

void durability_report(const store_durability *d, const store_durability *last,
		       const char *why, bool quiet)
{
	metrics_set_store_durability(d->standbys, d->counted, d->commit);
	if (quiet && same(d, last))
		return;
	const char *risk = durability_risk(d);
	growbuf f = {0};
	log_field(&f, "synchronous_commit", d->commit);
	log_field(&f, "synchronous_standby_names", d->names);
	growbuf_printf(&f, " synchronous_standbys=%d counted=%s", d->standbys,
		       d->counted ? "pg_stat_replication"
				  : "synchronous_standby_names");
	log_field(&f, "server", d->server);
	log_field(&f, "why", why);
	if (!risk) {
		log_info("store durability: commits wait for a synchronous "
			 "standby",
			 "%s", f.data);
	} else {
		log_field(&f, "reason", risk);
		log_warn("store durability: no synchronous standby; a "
			 "failover can lose acknowledged claims and records, "
			 "and a key can then execute twice",
			 "%s", f.data);
	}
	growbuf_free(&f);
}
