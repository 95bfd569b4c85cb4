/* The reaper's statements (store_pg_reap.h): the lease walk, the sweep,
 * the purge and the processing figures, on a distributed store per shard
 * (shard_walk). */
#include "store_pg_reap.h"

#include <stdio.h>

#include "store_pg_int.h"
#include "util.h"

/* The reaper's statements as run on each shard (%1$s, formatted by
 * run_command_on_shards or shard_walk with the shard; the batch size is
 * formatted here). SHARD_REAP_SQL is reap_leases on one shard, from that
 * shard's place (%2$L) and held rows (%3$L), answering in shard_walk's
 * form; SHARD_STATS_SQL is processing_stats likewise (no batch: its
 * percent signs are single). */
#define SHARD_REAP_SQL \
	"WITH walk AS (SELECT ctid, tenant, operation, idem_key, " \
	"lease_until, state, hold_on_unknown FROM %%1$s " \
	"WHERE lease_until >= %%2$L AND lease_until <= now() " \
	"ORDER BY lease_until LIMIT %d), " \
	RELEASE_WALKED("%%1$s") ", " \
	"x AS (SELECT (SELECT count(*) FROM done) AS n, " \
	"(SELECT count(*) FROM walk) AS w, " \
	"(SELECT max(lease_until) FROM walk) AS last) " \
	"SELECT concat_ws('|', n, (w >= %d)::int, CASE WHEN w >= %d AND " \
	"last = %%2$L::timestamptz THEN last + interval '1 microsecond' " \
	"ELSE coalesce(last, %%2$L::timestamptz) END, " \
	HELD_WALKED("%%3$L") ", '', '', %%4$L) FROM x"
/* sweep_leases on one shard from its page (%4$L), in shard_walk's form
 * (the pages are formatted here, three times). */
#define SHARD_SWEEP_SQL \
	"WITH walk AS (SELECT ctid, tenant, operation, idem_key, " \
	"state, hold_on_unknown FROM %%1$s " \
	"WHERE ctid >= ('(' || %%4$L || ',0)')::tid " \
	"AND ctid < ('(' || (%%4$L::int8 + %d) || ',0)')::tid " \
	"AND state = 'processing' AND lease_until <= now()), " \
	RELEASE_WALKED("%%1$s") \
	"SELECT concat_ws('|', (SELECT count(*) FROM done), 0, %%2$L, " \
	HELD_WALKED("%%3$L") ", '', '', CASE WHEN %%4$L::int8 + %d < " \
	"pg_relation_size(%%1$L::regclass) / " \
	"current_setting('block_size')::int8 THEN %%4$L::int8 + %d " \
	"ELSE 0 END)"
#define SHARD_STATS_SQL \
	"WITH live AS (SELECT updated_at, hold_on_unknown AND lease_until " \
	"<= now() AS waiting FROM %1$s " \
	"WHERE state = 'processing' AND lease_until >= %2$L), " \
	"held AS (SELECT ctid, updated_at FROM %1$s " \
	"WHERE ctid = ANY (%3$L::tid[]) AND state = 'processing' " \
	"AND hold_on_unknown AND lease_until < %2$L), " HELD_NOW " " \
	"SELECT concat_ws('|', 0, 0, %2$L, " \
	"(SELECT array(SELECT ctid FROM held))::text, " \
	"(SELECT count(*) FROM live) + (SELECT count(*) FROM held), " \
	"coalesce(extract(epoch FROM now() - least(" \
	"(SELECT min(updated_at) FROM live), " \
	"(SELECT min(updated_at) FROM held))), 0), %4$L, " \
	"(SELECT count(*) FROM held_all), coalesce(extract(epoch FROM now() - " \
	"(SELECT min(updated_at) FROM held_all)), 0))"
#define SHARD_PURGE_SQL \
	"WITH doomed AS (SELECT tenant, operation, idem_key FROM %%1$s " \
	"WHERE expires_at <= now() " \
	"AND (lease_until IS NULL OR lease_until <= now()) " \
	"LIMIT %d FOR UPDATE SKIP LOCKED) " \
	"DELETE FROM %%1$s t USING doomed WHERE t.tenant = doomed.tenant " \
	"AND t.operation = doomed.operation AND t.idem_key = doomed.idem_key"

static int batch_stmt(store *s, int st, int batch, int *n, char *err,
		      size_t errlen, const char *what)
{
	*n = 0;
	if (store_ensure(s, err, errlen))
		return -1;
	char b[16];
	snprintf(b, sizeof b, "%d", batch);
	const char *vals[1] = {b};
	PGresult *r = run(s, st, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_COMMAND_OK, err, errlen, what);
	if (!rc)
		*n = affected(r);
	PQclear(r);
	return rc;
}

/* Columns col, col + 1 and col + 2 of a per-shard answer: how many shards
 * failed, of how many, and the first failure. -1 with err when any did. */
static int shards_failed(PGresult *r, int col, char *err, size_t errlen,
			 const char *what)
{
	int failed = atoi(PQgetvalue(r, 0, col));
	if (!failed)
		return 0;
	char msg[512];
	snprintf(msg, sizeof msg, "%d of %s shards failed: %s", failed,
		 PQgetvalue(r, 0, col + 1), PQgetvalue(r, 0, col + 2));
	pg_link_err(err, errlen, what, msg);
	return -1;
}

/* A batch statement (cmd: %1$s for the shard) on every shard (see
 * per_shard). *n counts the rows of the shards that answered; a shard that
 * did not (its worker is down) fails the call after the others were done. */
static int shard_batch(store *s, const char *cmd, int *n, char *err,
		       size_t errlen, const char *what)
{
	*n = 0;
	if (store_ensure(s, err, errlen))
		return -1;
	const char *vals[1] = {cmd};
	PGresult *r = run(s, ST_PER_SHARD, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, what);
	if (rc) {
		PQclear(r);
		return -1;
	}
	*n = atoi(PQgetvalue(r, 0, 0));
	rc = shards_failed(r, 1, err, errlen, what);
	PQclear(r);
	return rc;
}

/* The figures of one shard_walk. */
typedef struct shard_walk_out {
	int released;
	bool more;
	processing_figures fig;
} shard_walk_out;

/* One command on every shard from its place in map (see shard_walk); map
 * takes the places the shards answered with, also when some failed (their
 * worker is down: the call fails after the others were done). */
static int shard_walk(store *s, const char *cmd, growbuf *map,
		      shard_walk_out *out, char *err, size_t errlen,
		      const char *what)
{
	memset(out, 0, sizeof *out);
	if (store_ensure(s, err, errlen))
		return -1;
	const char *vals[2] = {cmd, map->data ? map->data : ""};
	PGresult *r = run(s, ST_SHARD_WALK, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, what);
	if (rc) {
		PQclear(r);
		return -1;
	}
	out->released = atoi(PQgetvalue(r, 0, 0));
	out->more = PQgetvalue(r, 0, 1)[0] == 't';
	out->fig.count = atoll(PQgetvalue(r, 0, 2));
	out->fig.oldest_age_s = atof(PQgetvalue(r, 0, 3));
	out->fig.held = atoll(PQgetvalue(r, 0, 8));
	out->fig.oldest_held_age_s = atof(PQgetvalue(r, 0, 9));
	growbuf_reset(map);
	growbuf_puts(map, PQgetvalue(r, 0, 7));
	rc = shards_failed(r, 4, err, errlen, what);
	PQclear(r);
	return rc;
}

/* A per-shard statement (cmd) through shard_walk, the map in held. */
static int shard_step(store *s, const char *cmd, growbuf *held,
		      int *released, bool *more, char *err, size_t errlen,
		      const char *what)
{
	shard_walk_out o;
	int rc = shard_walk(s, cmd, held, &o, err, errlen, what);
	*released = o.released;
	*more = o.more && !rc;
	return rc;
}

int store_reap_leases(store *s, int batch, char *since, size_t since_len,
		      growbuf *held, int *released, bool *more, char *err,
		      size_t errlen)
{
	*released = 0;
	*more = false;
	if (s->citus) {
		char cmd[4096];
		ALWAYS_ASSERT(snprintf(cmd, sizeof cmd, SHARD_REAP_SQL, batch,
				       batch, batch) < (int)sizeof cmd);
		return shard_step(s, cmd, held, released, more, err, errlen,
				  "reap");
	}
	if (store_ensure(s, err, errlen))
		return -1;
	char b[16];
	snprintf(b, sizeof b, "%d", batch);
	const char *vals[3] = {b, since, held->data ? held->data : "{}"};
	PGresult *r = run(s, ST_REAP, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "reap");
	if (!rc && PQntuples(r) == 1) {
		*released = atoi(PQgetvalue(r, 0, 0));
		int walked = atoi(PQgetvalue(r, 0, 1));
		growbuf_reset(held);
		growbuf_puts(held, PQgetvalue(r, 0, 3));
		/* The next walk starts at the last lease_until walked (>=:
		 * another row may end at the same microsecond), or a
		 * microsecond after a full batch of one instant. */
		if (!PQgetisnull(r, 0, 2) &&
		    strcmp(PQgetvalue(r, 0, 2), since)) {
			snprintf(since, since_len, "%s", PQgetvalue(r, 0, 2));
			*more = walked >= batch;
		}
	}
	PQclear(r);
	return rc;
}

int store_sweep_leases(store *s, int pages, int64_t *page, growbuf *held,
		       int *released, char *err, size_t errlen)
{
	*released = 0;
	if (s->citus) {
		char cmd[4096];
		bool more;
		ALWAYS_ASSERT(snprintf(cmd, sizeof cmd, SHARD_SWEEP_SQL, pages,
				       pages, pages) < (int)sizeof cmd);
		return shard_step(s, cmd, held, released, &more, err, errlen,
				  "sweep");
	}
	if (store_ensure(s, err, errlen))
		return -1;
	char n[16], from[24];
	snprintf(n, sizeof n, "%d", pages);
	snprintf(from, sizeof from, "%lld", (long long)*page);
	const char *vals[3] = {n, from, held->data ? held->data : "{}"};
	PGresult *r = run(s, ST_SWEEP, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "sweep");
	if (!rc && PQntuples(r) == 1) {
		*released = atoi(PQgetvalue(r, 0, 0));
		*page = atoll(PQgetvalue(r, 0, 1));
		growbuf_reset(held);
		growbuf_puts(held, PQgetvalue(r, 0, 2));
	}
	PQclear(r);
	return rc;
}

int store_purge_expired(store *s, int batch, int *purged, char *err,
			size_t errlen)
{
	char cmd[1024];
	if (s->citus) {
		ALWAYS_ASSERT(snprintf(cmd, sizeof cmd, SHARD_PURGE_SQL,
				       batch) < (int)sizeof cmd);
		return shard_batch(s, cmd, purged, err, errlen, "purge");
	}
	return batch_stmt(s, ST_PURGE, batch, purged, err, errlen, "purge");
}

int store_strip_tombstones(store *s, int batch, int *stripped, char *err,
			   size_t errlen)
{
	char cmd[1024];
	if (s->citus) {
		ALWAYS_ASSERT(snprintf(cmd, sizeof cmd,
				       STRIP_SQL("%%1$s", "%d"),
				       batch) < (int)sizeof cmd);
		return shard_batch(s, cmd, stripped, err, errlen, "strip");
	}
	return batch_stmt(s, ST_STRIP, batch, stripped, err, errlen, "strip");
}

int store_purge_tombstones(store *s, int batch, int *purged, char *err,
			   size_t errlen)
{
	char cmd[1024];
	if (s->citus) {
		ALWAYS_ASSERT(snprintf(cmd, sizeof cmd,
				       PURGE_TOMBS_SQL("%%1$s", "%d"),
				       batch) < (int)sizeof cmd);
		return shard_batch(s, cmd, purged, err, errlen, "purge");
	}
	return batch_stmt(s, ST_PURGE_TOMBS, batch, purged, err, errlen,
			  "purge");
}

int store_processing_stats(store *s, const char *since, growbuf *held,
			   processing_figures *fig, char *err, size_t errlen)
{
	memset(fig, 0, sizeof *fig);
	if (s->citus) {
		shard_walk_out o;
		int rc = shard_walk(s, SHARD_STATS_SQL, held, &o, err, errlen,
				    "stats");
		*fig = o.fig;
		return rc;
	}
	if (store_ensure(s, err, errlen))
		return -1;
	const char *vals[2] = {since, held->data ? held->data : "{}"};
	PGresult *r = run(s, ST_STATS, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "stats");
	if (!rc) {
		fig->count = atoll(PQgetvalue(r, 0, 0));
		fig->oldest_age_s = atof(PQgetvalue(r, 0, 1));
		growbuf_reset(held);
		growbuf_puts(held, PQgetvalue(r, 0, 2));
		fig->held = atoll(PQgetvalue(r, 0, 3));
		fig->oldest_held_age_s = atof(PQgetvalue(r, 0, 4));
	}
	PQclear(r);
	return rc;
}

/* The server's clock_timestamp(), not now(): now() is when the statement's
 * transaction began, which a queued statement reads late. */
int store_clock_offset(store *s, double *offset_s, double *error_s, char *err,
		       size_t errlen)
{
	if (store_ensure(s, err, errlen))
		return -1;
	int64_t sent = wall_ms();
	PGresult *r = pg_link_exec(
		&s->link,
		"SELECT extract(epoch FROM clock_timestamp())::float8");
	int64_t back = wall_ms();
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "clock");
	if (!rc) {
		double db = atof(PQgetvalue(r, 0, 0));
		*offset_s = (double)(sent + back) / 2000.0 - db;
		*error_s = (double)(back - sent) / 2000.0 + 0.001;
	}
	PQclear(r);
	return rc;
}
