/* What the store offers for the one-effect promise across a failover: a
 * claim or a record acknowledged by the primary survives its loss only if
 * a standby had it before the commit returned (synchronous_standby_names,
 * synchronous_commit on, remote_apply or remote_write). Judged from the
 * store's settings and, when the role can see it, pg_stat_replication;
 * reported as log lines and gauges (durability_report). */
#ifndef IDEMPROXY_DURABILITY_H
#define IDEMPROXY_DURABILITY_H

#include <stdbool.h>

typedef struct store_durability {
	char commit[16];  /* synchronous_commit of the proxy's sessions */
	char names[128];  /* synchronous_standby_names (cut if longer) */
	char server[128]; /* host:port the connection reached */
	int attached;     /* standbys in state sync or quorum; -1: hidden */
	/* Filled by durability_judge: */
	int required; /* standbys synchronous_standby_names asks for */
	int standbys; /* standbys a commit waits for; 0: none */
	bool counted; /* standbys seen in pg_stat_replication */
} store_durability;

/* The standbys a synchronous_standby_names value asks a commit to wait
 * for: "" 0, "a, b" or "*" 1, "[FIRST] n (...)" and "ANY n (...)" n. */
int durability_required(const char *names);

/* From commit, names and attached: required, standbys and counted. When
 * the role cannot see pg_stat_replication's sync_state (attached -1; it
 * is hidden from roles without pg_read_all_stats) the standbys are what
 * synchronous_standby_names asks for; otherwise those attached in sync or
 * quorum state, at most the number asked for. */
void durability_judge(store_durability *d);

/* NULL when commits wait for a standby; otherwise why they do not. */
const char *durability_risk(const store_durability *d);

/* Sets the gauges, and logs one line (info when commits wait for a
 * standby, else a warning naming the risk) unless quiet is set and
 * nothing changed since last (a reconnect to the same server). why:
 * start, reload, new_server or reconnect. */
void durability_report(const store_durability *d, const store_durability *last,
		       const char *why, bool quiet);

#endif
