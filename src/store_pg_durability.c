#include "store_pg_durability.h"

#include <stdio.h>

#include "store_pg_int.h"

/* Rows of pg_stat_replication whose sync_state is NULL are walsenders the
 * role may not look into (it lacks pg_read_all_stats): then the standbys
 * attached cannot be counted. */
#define DURABILITY_SQL \
	"SELECT current_setting('synchronous_commit'), " \
	"current_setting('synchronous_standby_names'), " \
	"(SELECT count(*) FROM pg_stat_replication " \
	"WHERE sync_state IN ('sync', 'quorum')), " \
	"(SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)"

static void server_of(PGconn *c, char *out, size_t n)
{
	const char *h = PQhost(c), *p = PQport(c);
	snprintf(out, n, "%s:%s", h ? h : "", p ? p : "");
}

int store_read_durability(store *s, store_durability *d, char *err,
			  size_t errlen)
{
	if (store_ensure(s, err, errlen))
		return -1;
	PGresult *r = pg_link_exec(&s->link, DURABILITY_SQL);
	if (exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "durability")) {
		PQclear(r);
		return -1;
	}
	*d = (store_durability){0};
	snprintf(d->commit, sizeof d->commit, "%s", PQgetvalue(r, 0, 0));
	snprintf(d->names, sizeof d->names, "%s", PQgetvalue(r, 0, 1));
	d->attached =
		atoi(PQgetvalue(r, 0, 3)) > 0 ? -1 : atoi(PQgetvalue(r, 0, 2));
	PQclear(r);
	server_of(s->link.conn, d->server, sizeof d->server);
	durability_judge(d);
	return 0;
}

void store_server_id(const store *s, char *out, size_t n)
{
	if (!s->link.conn) {
		snprintf(out, n, "%s", "");
		return;
	}
	char server[128];
	server_of(s->link.conn, server, sizeof server);
	snprintf(out, n, "%s %d", server, PQbackendPID(s->link.conn));
}
