/* What the store's files (store_pg*.c) share and nothing else sees: the
 * store itself, the statements table and the helpers every statement uses.
 * The table is one, in store_pg.c, because store_ensure prepares all of it
 * on each new connection. */
#ifndef IDEMPROXY_STORE_PG_INT_H
#define IDEMPROXY_STORE_PG_INT_H

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "pg_link.h"
#include "store_pg.h"

struct store {
	pg_link link;
	bool outage; /* the last failure: no connection, or it broke */
	bool citus;  /* the records are distributed: reaper works per shard */
	bool many;   /* sends complete_many: many_settings */
	growbuf arr[10]; /* their array parameters */
	const wake_key *wake; /* names the NOTIFY payloads; NULL: sends none */
};

/* Each statement, its name, parameter types (OIDs) and text. */
#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT4 23
#define OID_TEXT 25
#define OID_UUID 2950
#define OID_TSTZ 1184
#define OID_BOOL_ARR 1000
#define OID_BYTEA_ARR 1001
#define OID_INT4_ARR 1007
#define OID_TEXT_ARR 1009
#define OID_INT8_ARR 1016
#define OID_UUID_ARR 2951

typedef struct stmt_def {
	const char *name;
	int nparams;
	Oid types[10];
	const char *sql;
} stmt_def;

/* What the reaper's walks and sweeps (a CTE "walk" of rows of table T)
 * have in common: the due and done CTEs that release the walked rows
 * still processing, not held, with their lease ended, skipping locked
 * ones; and the held rows known before (LIST, a tid[]) with the walked
 * ones that are held. */
#define RELEASE_WALKED(T) \
	"due AS (SELECT t.tenant, t.operation, t.idem_key FROM " T " t " \
	"JOIN walk w ON t.tenant = w.tenant AND t.operation = w.operation " \
	"AND t.idem_key = w.idem_key WHERE w.state = 'processing' " \
	"AND NOT w.hold_on_unknown AND t.state = 'processing' " \
	"AND t.lease_until <= now() AND NOT t.hold_on_unknown " \
	"FOR UPDATE OF t SKIP LOCKED), " \
	"done AS (UPDATE " T " t SET state = 'released', " \
	"lease_until = NULL, updated_at = now() FROM due " \
	"WHERE t.tenant = due.tenant AND t.operation = due.operation " \
	"AND t.idem_key = due.idem_key RETURNING 1) "
/* The held rows among the processing ones the processing figures read:
 * those the walk passed (the CTE held) and those at or past its place
 * whose lease ended on a hold route (the CTE live, flag waiting: the
 * walk's place stays at its last row until a later lease ends). */
#define HELD_NOW \
	"held_all AS (SELECT updated_at FROM held UNION ALL " \
	"SELECT updated_at FROM live WHERE waiting)"
/* The reaper's tombstone statements on table T, LIMIT N: the strip of the
 * responses past their end on keys kept longer (sql/012_tombstones.sql;
 * replay_until leaves the partial index the walk reads; a released or dead
 * processing row has no response and leaves it too, as it counts as absent
 * either way), and the purge of stripped tombstones at the end of their
 * key. A completed row keeps the end of its last lease: only a live
 * attempt's lease matters here. */
#define STRIP_SQL(T, N) \
	"WITH due AS (SELECT tenant, operation, idem_key FROM " T " " \
	"WHERE replay_until > '-infinity' AND replay_until <= now() " \
	"AND NOT (state = 'processing' AND lease_until > now()) " \
	"LIMIT " N " FOR UPDATE SKIP LOCKED) " \
	"UPDATE " T " t SET replay_until = '-infinity', " \
	"response_headers = NULL, response_body = NULL, seal_key = NULL " \
	"FROM due WHERE t.tenant = due.tenant " \
	"AND t.operation = due.operation AND t.idem_key = due.idem_key"
#define PURGE_TOMBS_SQL(T, N) \
	"WITH doomed AS (SELECT tenant, operation, idem_key FROM " T " " \
	"WHERE expires_at <= now() AND replay_until = '-infinity' " \
	"LIMIT " N " FOR UPDATE SKIP LOCKED) " \
	"DELETE FROM " T " t USING doomed WHERE t.tenant = doomed.tenant " \
	"AND t.operation = doomed.operation AND t.idem_key = doomed.idem_key"
#define HELD_WALKED(LIST) \
	"(SELECT array(SELECT DISTINCT h FROM unnest(" LIST "::tid[] || " \
	"array(SELECT ctid FROM walk WHERE state = 'processing' " \
	"AND hold_on_unknown)) h))::text"

enum {
	ST_CLAIM,
	ST_COMPLETE,
	ST_RELEASE,
	ST_REAP,
	ST_SWEEP,
	ST_PURGE,
	ST_OWNED,
	ST_STATS,
	ST_PER_SHARD,
	ST_SHARD_WALK,
	ST_WAIT_MARK,
	ST_WAIT_NOTIFY,
	ST_CLAIM_NEW,
	ST_CLAIM_MANY,
	ST_COMPLETE_MANY,
	ST_SEAL_COUNT,
	ST_STRIP,
	ST_PURGE_TOMBS
};

/* Every statement, indexed by ST_*; store_ensure prepares them. */
extern const stmt_def store_stmts[];

static inline int exec_ok(store *s, PGresult *res, ExecStatusType want,
			  char *err, size_t errlen, const char *what)
{
	if (res && PQresultStatus(res) == want)
		return 0;
	pg_link_err(err, errlen, what,
		    res ? PQresultErrorMessage(res) : pg_link_error(&s->link));
	s->outage = pg_link_drop_if_broken(&s->link);
	return -1;
}

/* The next call starts over on a new connection. */
static inline void drop_conn(store *s)
{
	pg_link_drop(&s->link);
}

static inline int64_t get_i64(const char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | (uint8_t)p[i];
	return (int64_t)v;
}

static inline int32_t get_i32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return (int32_t)ntohl(v);
}

static inline void put_i64(char out[8], int64_t v)
{
	for (int i = 7; i >= 0; i--) {
		out[i] = (char)(v & 0xff);
		v >>= 8;
	}
}

/* PQexecPrepared, awaited within the store-wait deadline (pg_link.h). The
 * result is PQexec's: the last one, NULL if the query was not sent or its
 * answer did not come in time. */
static inline PGresult *run(store *s, int st, const char *const *vals,
			    const int *lens, const int *fmts,
			    int result_binary)
{
	bool sent = PQsendQueryPrepared(s->link.conn, store_stmts[st].name,
					store_stmts[st].nparams, vals, lens,
					fmts, result_binary) == 1;
	return pg_link_result(&s->link, sent);
}

static inline int affected(PGresult *r)
{
	const char *n = PQcmdTuples(r);
	return n && *n ? atoi(n) : 0;
}

#endif
