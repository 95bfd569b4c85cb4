/* PostgreSQL store: prepared statements, binary parameters for bytea and
 * integers, one round trip per claim. */
#include "store_pg.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrations.h"
#include "pg_link.h"
#include "sqlsplit.h"
#include "wake.h"

struct store {
	pg_link link;
	bool outage; /* the last failure: no connection, or it broke */
	bool citus;  /* the records are distributed: reaper works per shard */
	bool many;   /* sends complete_many: many_settings */
	ip_buf arr[9]; /* their array parameters */
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
	Oid types[9];
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
#define HELD_WALKED(LIST) \
	"(SELECT array(SELECT DISTINCT h FROM unnest(" LIST "::tid[] || " \
	"array(SELECT ctid FROM walk WHERE state = 'processing' " \
	"AND hold_on_unknown)) h))::text"

static const stmt_def stmts[] = {
	{"claim", 8,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_INT8, OID_INT8, OID_BOOL,
	  OID_UUID},
	 "SELECT o_decision, o_owner, o_attempt, o_lease_ms, o_status, "
	 "o_headers, o_body, o_replayable, o_expires_ms "
	 "FROM idem_claim($1, $2, $3, $4, $5, $6, $7, $8)"},
	/* A late answer may still be recorded after the reaper released the
	 * record, as long as no other attempt took it over (owner unchanged):
	 * it is the truth about the one attempt that was sent. It changes no
	 * indexed column (lease_until keeps the end of the last lease), so it
	 * is a HOT update (sql/006_hot_complete.sql). */
	{"complete", 9,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_UUID, OID_INT4, OID_BYTEA, OID_BYTEA,
	  OID_BOOL, OID_TEXT},
	 "UPDATE idempotency_records SET state = 'completed', "
	 "response_status = $5, response_headers = $6, response_body = $7, "
	 "replayable = $8, seal_key = $9, updated_at = now() "
	 "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	 "AND owner_token = $4 AND state IN ('processing', 'released') "
	 "AND expires_at > now() RETURNING wait_notify"},
	{"release", 4,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_UUID},
	 "UPDATE idempotency_records SET state = 'released', "
	 "lease_until = NULL, updated_at = now() "
	 "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	 "AND owner_token = $4 AND state = 'processing' RETURNING wait_notify"},
	/* Dead leases are found by walking the lease_until index from where
	 * the last walk ended ($2), $1 rows at a time, not by an index of
	 * processing rows (complete would have to update it). A held row is
	 * neither written nor locked: its row's ctid joins the list ($3) the
	 * gauges below look at. Returns the rows released, the rows walked,
	 * the last lease_until walked and the list of held rows. */
	{"reap_leases", 3,
	 {OID_INT4, OID_TSTZ, OID_TEXT},
	 "WITH walk AS (SELECT ctid, tenant, operation, idem_key, "
	 "lease_until, state, hold_on_unknown FROM idempotency_records "
	 "WHERE lease_until >= $2 AND lease_until <= now() "
	 "ORDER BY lease_until LIMIT $1), "
	 RELEASE_WALKED("idempotency_records")
	 "SELECT (SELECT count(*) FROM done)::int4, "
	 "(SELECT count(*) FROM walk)::int4, "
	 "(SELECT CASE WHEN count(*) >= $1 AND max(lease_until) = $2 "
	 "THEN $2 + interval '1 microsecond' ELSE max(lease_until) END "
	 "FROM walk)::text, " HELD_WALKED("$3")},
	/* The walk trusts that a lease ends after the place it has reached,
	 * which a claim whose commit waited longer than its lease, a row
	 * written by hand or a row another session had locked betray. So each
	 * pass also reads $1 pages of the table in order, from page $2 (a
	 * bounded TID range scan, no index), and releases what it finds dead
	 * there as the walk would. Returns the rows released, the page to
	 * start from next time (0 after the last) and the list of held
	 * rows. */
	{"sweep_leases", 3,
	 {OID_INT4, OID_INT8, OID_TEXT},
	 "WITH walk AS (SELECT ctid, tenant, operation, idem_key, "
	 "state, hold_on_unknown FROM idempotency_records "
	 "WHERE ctid >= ('(' || $2 || ',0)')::tid "
	 "AND ctid < ('(' || ($2 + $1) || ',0)')::tid "
	 "AND state = 'processing' AND lease_until <= now()), "
	 RELEASE_WALKED("idempotency_records")
	 "SELECT (SELECT count(*) FROM done)::int4, "
	 "(CASE WHEN $2 + $1 < pg_relation_size('idempotency_records') / "
	 "current_setting('block_size')::int8 THEN $2 + $1 ELSE 0 END)::text, "
	 HELD_WALKED("$3")},
	{"purge", 1,
	 {OID_INT4},
	 "WITH doomed AS (SELECT tenant, operation, idem_key "
	 "FROM idempotency_records WHERE expires_at <= now() "
	 "AND (lease_until IS NULL OR lease_until <= now()) "
	 "LIMIT $1 FOR UPDATE SKIP LOCKED) "
	 "DELETE FROM idempotency_records t USING doomed "
	 "WHERE t.tenant = doomed.tenant AND t.operation = doomed.operation "
	 "AND t.idem_key = doomed.idem_key"},
	/* After a repeated complete or release wrote nothing: did the first
	 * try commit? */
	{"owned_state", 4,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_UUID},
	 "SELECT state FROM idempotency_records "
	 "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	 "AND owner_token = $4"},
	/* Processing rows: a live lease or one the walk ($1) has not reached
	 * (a range of the lease_until index), and the held rows the walk
	 * passed ($2, by ctid: a row changed since is another version, and
	 * what it became is in the range if it is processing again). Returns
	 * the count, the oldest one's age and the held rows still held. */
	{"processing_stats", 2,
	 {OID_TSTZ, OID_TEXT},
	 "WITH live AS (SELECT updated_at FROM idempotency_records "
	 "WHERE state = 'processing' AND lease_until >= $1), "
	 "held AS (SELECT ctid, updated_at FROM idempotency_records "
	 "WHERE ctid = ANY ($2::tid[]) AND state = 'processing' "
	 "AND hold_on_unknown AND lease_until < $1) "
	 "SELECT ((SELECT count(*) FROM live) + "
	 "(SELECT count(*) FROM held))::int8, "
	 "coalesce(extract(epoch FROM now() - least("
	 "(SELECT min(updated_at) FROM live), "
	 "(SELECT min(updated_at) FROM held))), 0)::float8::text, "
	 "(SELECT array(SELECT ctid FROM held))::text"},
	/* Citus refuses a cross-shard UPDATE or DELETE driven by a
	 * SELECT .. FOR UPDATE SKIP LOCKED: on a distributed store the reaper
	 * sends the batch statement ($1, with %1$s for the shard) to every
	 * shard, in parallel, each a bounded batch of its own. The command
	 * status of each ("UPDATE n") gives the rows. */
	{"per_shard", 1,
	 {OID_TEXT},
	 "SELECT coalesce(sum(n), 0)::int8, count(*) FILTER (WHERE NOT success), "
	 "count(*), min(result) FILTER (WHERE NOT success) FROM ("
	 "SELECT success, result, CASE WHEN success THEN "
	 "split_part(result, ' ', 2)::int8 END AS n "
	 "FROM run_command_on_shards('idempotency_records', $1)) r"},
	/* On Citus, the walk of reap_leases and processing_stats per shard:
	 * each shard keeps its own place in its lease_until index and its
	 * held rows, in a map kept by the reaper ($2: {"shard": ["since",
	 * "held tid[]"]}, returned updated). The per-shard command ($1) gets
	 * them as literals (%2$L, %3$L: constants the shard's planner sees)
	 * and answers "released|more|since|held|count|age"; the commands go
	 * to the workers in parallel (as run_command_on_shards sends them).
	 * A shard that failed keeps its place. Returns the rows released,
	 * whether any shard walked a full batch, the processing count, the
	 * oldest age, the failures, the shards, the first error and the map. */
	{"shard_walk", 2,
	 {OID_TEXT, OID_TEXT},
	 "WITH m AS (SELECT coalesce(nullif($2, '')::jsonb, '{}') AS m), "
	 "s AS (SELECT ds.shardid, shard_name(ds.logicalrelid, ds.shardid) "
	 "AS name, min(p.nodename) AS node, min(p.nodeport) AS port "
	 "FROM pg_dist_shard ds JOIN pg_dist_shard_placement p USING (shardid) "
	 "WHERE ds.logicalrelid = 'idempotency_records'::regclass "
	 "AND p.shardstate = 1 GROUP BY ds.shardid, ds.logicalrelid), "
	 "c AS (SELECT array_agg(s.name ORDER BY s.shardid) AS names, "
	 "array_agg(s.node ORDER BY s.shardid) AS nodes, "
	 "array_agg(s.port ORDER BY s.shardid) AS ports, "
	 "array_agg(format($1, s.name, "
	 "coalesce(m.m -> s.name ->> 0, '-infinity'), "
	 "coalesce(m.m -> s.name ->> 1, '{}'), "
	 "coalesce(m.m -> s.name ->> 2, '0')) ORDER BY s.shardid) AS cmds "
	 "FROM s, m), "
	 "r AS (SELECT c.names[w.o] AS name, w.success, w.result, "
	 "string_to_array(w.result, '|') AS f FROM c, "
	 "master_run_on_worker(c.nodes, c.ports, c.cmds, true) "
	 "WITH ORDINALITY w(node_name, node_port, success, result, o)) "
	 "SELECT coalesce(sum(f[1]::int8) FILTER (WHERE success), 0)::int8, "
	 "coalesce(bool_or(f[2] = '1') FILTER (WHERE success), false), "
	 "coalesce(sum(nullif(f[5], '')::int8) FILTER (WHERE success), 0)::int8, "
	 "coalesce(max(nullif(f[6], '')::float8) FILTER (WHERE success), 0)"
	 "::float8::text, count(*) FILTER (WHERE NOT success), count(*), "
	 "min(result) FILTER (WHERE NOT success), "
	 "coalesce(jsonb_object_agg(name, CASE WHEN success THEN "
	 "jsonb_build_array(f[3], f[4], f[7]) ELSE (SELECT m.m -> name FROM m) END) "
	 "FILTER (WHERE success OR (SELECT m.m ? name FROM m)), '{}')::text "
	 "FROM r"},
	/* A waiter marks the record it waits for; the row comes back only
	 * while its attempt is alive, so a record that changed first is seen
	 * at once (the UPDATE reads the newest version under the row lock).
	 * The lease left is counted outside the UPDATE: Citus refuses now()
	 * (not immutable) in the RETURNING of a distributed UPDATE, and with
	 * the UPDATE in a CTE it is still one task on the tenant's worker. */
	{"wait_mark", 3,
	 {OID_TEXT, OID_TEXT, OID_TEXT},
	 "WITH u AS (UPDATE idempotency_records SET wait_notify = true "
	 "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	 "AND state = 'processing' AND lease_until > now() "
	 "RETURNING lease_until) "
	 "SELECT ceil(extract(epoch FROM lease_until - now()) * 1000)::int8 "
	 "FROM u"},
	/* No table: it runs in this session on the node the proxy talks to,
	 * where the instances LISTEN (a distributed PostgreSQL runs functions
	 * on the node holding a shard, and NOTIFY is per node). */
	{"wait_notify", 1,
	 {OID_TEXT},
	 "SELECT pg_notify('" STORE_WAIT_CHANNEL "', $1)"},
	/* A fresh key on a plain store: idem_claim's first step as a plain
	 * statement, with the same parameters. One row inserted: the key is
	 * this attempt's, and the proxy knows what the function would have
	 * returned for it (store_claim_fresh). None: the key exists, and
	 * idem_claim decides (a second round trip, for repeats only). Saves
	 * the PL/pgSQL call on every first attempt, and, with no RETURNING,
	 * the server's projection and row description (35k of the 364k
	 * instructions a claim and its record cost the server, callgrind).
	 * On Citus the function call alone, delegated to the tenant's
	 * worker, stays one round trip. */
	{"claim_new", 8,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_INT8, OID_INT8, OID_BOOL,
	  OID_UUID},
	 "INSERT INTO idempotency_records (tenant, operation, idem_key, "
	 "request_hash, state, owner_token, attempt, lease_until, "
	 "hold_on_unknown, created_at, updated_at, expires_at) "
	 "VALUES ($1, $2, $3, $4, 'processing', $8, 1, "
	 "now() + $5 * interval '1 millisecond', $7, now(), now(), "
	 "now() + greatest($6, $5) * interval '1 millisecond') "
	 "ON CONFLICT DO NOTHING"},
	/* claim_new for many first attempts at once (store_batch.h), its
	 * parameters as arrays, one element per attempt: one statement and
	 * one commit for them all. The rows inserted come back by their owner
	 * tokens (each attempt's own); an attempt whose key exists gets none,
	 * and idem_claim decides for it as after claim_new. */
	{"claim_many", 8,
	 {OID_TEXT_ARR, OID_TEXT_ARR, OID_TEXT_ARR, OID_BYTEA_ARR, OID_INT8_ARR,
	  OID_INT8_ARR, OID_BOOL_ARR, OID_UUID_ARR},
	 "INSERT INTO idempotency_records (tenant, operation, idem_key, "
	 "request_hash, state, owner_token, attempt, lease_until, "
	 "hold_on_unknown, created_at, updated_at, expires_at) "
	 "SELECT t, o, k, h, 'processing', w, 1, "
	 "now() + l * interval '1 millisecond', hd, now(), now(), "
	 "now() + greatest(ttl, l) * interval '1 millisecond' "
	 "FROM unnest($1, $2, $3, $4, $5, $6, $7, $8) "
	 "AS u(t, o, k, h, l, ttl, hd, w) "
	 "ON CONFLICT DO NOTHING RETURNING owner_token"},
	/* complete for many attempts at once, likewise: the rows written come
	 * back by their owner tokens, with their waiters' marks. The join is
	 * an index lookup per element whatever the table's size (the settings
	 * of the connection that sends it, many_settings). */
	{"complete_many", 9,
	 {OID_TEXT_ARR, OID_TEXT_ARR, OID_TEXT_ARR, OID_UUID_ARR, OID_INT4_ARR,
	  OID_BYTEA_ARR, OID_BYTEA_ARR, OID_BOOL_ARR, OID_TEXT_ARR},
	 "UPDATE idempotency_records r SET state = 'completed', "
	 "response_status = u.s, response_headers = u.h, response_body = u.b, "
	 "replayable = u.rp, seal_key = u.sk, updated_at = now() "
	 "FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9) "
	 "AS u(t, o, k, w, s, h, b, rp, sk) "
	 "WHERE r.tenant = u.t AND r.operation = u.o AND r.idem_key = u.k "
	 "AND r.owner_token = u.w AND r.state IN ('processing', 'released') "
	 "AND r.expires_at > now() RETURNING r.owner_token, r.wait_notify"},
	/* Adds this instance's seals per key id, and reads every key's total
	 * (the CTE's new values for the keys it wrote: the outer query's
	 * snapshot does not see them). */
	{"seal_count", 2,
	 {OID_TEXT_ARR, OID_INT8_ARR},
	 "WITH a AS (INSERT INTO idemproxy_seal_counts AS c (seal_key, seals) "
	 "SELECT * FROM unnest($1::text[], $2::int8[]) "
	 "ON CONFLICT (seal_key) DO UPDATE SET seals = c.seals + "
	 "EXCLUDED.seals, updated_at = now() RETURNING seal_key, seals) "
	 "SELECT seal_key, seals FROM a UNION ALL "
	 "SELECT seal_key, seals FROM idemproxy_seal_counts "
	 "WHERE seal_key <> ALL ($1) ORDER BY 1"},
};

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
	ST_SEAL_COUNT
};

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
	"WITH live AS (SELECT updated_at FROM %1$s " \
	"WHERE state = 'processing' AND lease_until >= %2$L), " \
	"held AS (SELECT ctid, updated_at FROM %1$s " \
	"WHERE ctid = ANY (%3$L::tid[]) AND state = 'processing' " \
	"AND hold_on_unknown AND lease_until < %2$L) " \
	"SELECT concat_ws('|', 0, 0, %2$L, " \
	"(SELECT array(SELECT ctid FROM held))::text, " \
	"(SELECT count(*) FROM live) + (SELECT count(*) FROM held), " \
	"coalesce(extract(epoch FROM now() - least(" \
	"(SELECT min(updated_at) FROM live), " \
	"(SELECT min(updated_at) FROM held))), 0), %4$L)"
#define SHARD_PURGE_SQL \
	"WITH doomed AS (SELECT tenant, operation, idem_key FROM %%1$s " \
	"WHERE expires_at <= now() " \
	"AND (lease_until IS NULL OR lease_until <= now()) " \
	"LIMIT %d FOR UPDATE SKIP LOCKED) " \
	"DELETE FROM %%1$s t USING doomed WHERE t.tenant = doomed.tenant " \
	"AND t.operation = doomed.operation AND t.idem_key = doomed.idem_key"

store *store_new(const char *url, int64_t statement_timeout_ms)
{
	store *s = xcalloc(1, sizeof *s);
	pg_link_init(&s->link, url, "idemproxy", statement_timeout_ms);
	return s;
}

void store_set_wake_key(store *s, const wake_key *wk)
{
	s->wake = wk;
}

void store_set_distributed(store *s, bool citus)
{
	s->citus = citus;
}

void store_set_many(store *s)
{
	s->many = true;
}

void store_free(store *s)
{
	if (!s)
		return;
	pg_link_close(&s->link);
	for (size_t i = 0; i < sizeof s->arr / sizeof s->arr[0]; i++)
		ip_buf_free(&s->arr[i]);
	free(s);
}

void store_set_statement_timeout(store *s, int64_t ms)
{
	pg_link_set_statement_timeout(&s->link, ms);
}

void store_set_deadline(store *s, double deadline_ms)
{
	pg_link_cap(&s->link, deadline_ms);
}

static int exec_ok(store *s, PGresult *res, ExecStatusType want, char *err,
		   size_t errlen, const char *what)
{
	if (res && PQresultStatus(res) == want)
		return 0;
	pg_link_err(err, errlen, what,
		    res ? PQresultErrorMessage(res) : pg_link_error(&s->link));
	s->outage = pg_link_drop_if_broken(&s->link);
	return -1;
}

bool store_outage(const store *s)
{
	return s->outage;
}

/* Tokens come from a per-thread pool that RAND_bytes refills 64 at a time:
 * one call per token cost as much as the rest of the claim's client side.
 * The bytes are the same CSPRNG's, used once each. */
#define TOKEN_POOL 64

static __thread struct {
	uint8_t bytes[TOKEN_POOL * STORE_TOKEN_LEN];
	int left;
} token_pool;

void store_new_token(uint8_t out[STORE_TOKEN_LEN])
{
	if (token_pool.left == 0) {
		IP_ASSERT(RAND_bytes(token_pool.bytes,
				     sizeof token_pool.bytes) == 1);
		token_pool.left = TOKEN_POOL;
	}
	token_pool.left--;
	uint8_t *p = token_pool.bytes + token_pool.left * STORE_TOKEN_LEN;
	memcpy(out, p, STORE_TOKEN_LEN);
	OPENSSL_cleanse(p, STORE_TOKEN_LEN);
	out[6] = (uint8_t)((out[6] & 0x0f) | 0x40); /* a version 4 UUID */
	out[8] = (uint8_t)((out[8] & 0x3f) | 0x80);
}

/* The next call starts over on a new connection. */
static void drop_conn(store *s)
{
	if (s->link.conn)
		PQfinish(s->link.conn);
	s->link.conn = NULL;
}

/* The connection that sends complete_many (store_set_many) sends nothing
 * else. Its join is planned once, and the plan must stay right as the
 * table grows: made while the table was small, a plan free to choose would
 * hash the whole table for every batch. With scans of the whole table and
 * the joins that need them priced out, the one plan left is the one wanted
 * at any size, an index lookup of the primary key per element; planning it
 * for every call instead cost the record's backend a sixth of its CPU. */
static const char many_settings[] =
	"SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
	"set_config('enable_seqscan', 'off', false), "
	"set_config('enable_bitmapscan', 'off', false), "
	"set_config('enable_hashjoin', 'off', false), "
	"set_config('enable_mergejoin', 'off', false)";

int store_ensure(store *s, char *err, size_t errlen)
{
	bool fresh;
	s->outage = false;
	if (pg_link_connect(&s->link, &fresh, err, errlen)) {
		s->outage = true;
		return -1;
	}
	if (!fresh)
		return 0;
	for (size_t i = 0; i < sizeof stmts / sizeof stmts[0]; i++) {
		/* run_command_on_shards exists only with Citus. */
		if ((i == ST_PER_SHARD || i == ST_SHARD_WALK) && !s->citus)
			continue;
		PGresult *r = pg_link_result(
			&s->link,
			PQsendPrepare(s->link.conn, stmts[i].name,
				      stmts[i].sql, stmts[i].nparams,
				      stmts[i].types) == 1);
		int rc = exec_ok(s, r, PGRES_COMMAND_OK, err, errlen,
				 "prepare");
		PQclear(r);
		/* A missing function means an old schema; the caller reports
		 * it. Next call starts over on a new connection. */
		if (rc) {
			drop_conn(s);
			return -1;
		}
	}
	if (s->many) {
		PGresult *r = pg_link_exec(&s->link, many_settings);
		int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "set");
		PQclear(r);
		if (rc) {
			drop_conn(s);
			return -1;
		}
	}
	return 0;
}

static int64_t get_i64(const char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | (uint8_t)p[i];
	return (int64_t)v;
}

static int32_t get_i32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return (int32_t)ntohl(v);
}

static void put_i64(char out[8], int64_t v)
{
	for (int i = 7; i >= 0; i--) {
		out[i] = (char)(v & 0xff);
		v >>= 8;
	}
}

/* PQexecPrepared, awaited within the store-wait deadline (pg_link.h). The
 * result is PQexec's: the last one, NULL if the query was not sent or its
 * answer did not come in time. */
static PGresult *run(store *s, int st, const char *const *vals,
		     const int *lens, const int *fmts, int result_binary)
{
	bool sent = PQsendQueryPrepared(s->link.conn, stmts[st].name,
					stmts[st].nparams, vals, lens, fmts,
					result_binary) == 1;
	return pg_link_result(&s->link, sent);
}

static const struct {
	const char *name;
	enum claim_decision d;
} decisions[] = {
	{"forward", CLAIM_FORWARD},	{"takeover", CLAIM_TAKEOVER},
	{"replay", CLAIM_REPLAY},	{"in_flight", CLAIM_IN_FLIGHT},
	{"held", CLAIM_HELD},		{"mismatch", CLAIM_MISMATCH},
};

static int affected(PGresult *r)
{
	const char *n = PQcmdTuples(r);
	return n && *n ? atoi(n) : 0;
}

void store_claim_fresh(const claim_req *req, claim_result *out)
{
	memset(out, 0, sizeof *out);
	out->decision = CLAIM_FORWARD;
	memcpy(out->owner, req->owner, STORE_TOKEN_LEN);
	out->attempt = 1;
	out->lease_left_ms = req->lease_ms;
	out->expires_in_ms =
		req->ttl_ms > req->lease_ms ? req->ttl_ms : req->lease_ms;
}

/* A claim's parameters, as claim_new and idem_claim take them. */
typedef struct claim_params {
	char lease[8], ttl[8], hold;
	const char *vals[8];
	int lens[8];
	int fmts[8];
} claim_params;

static void claim_params_of(const claim_req *req, claim_params *p)
{
	put_i64(p->lease, req->lease_ms);
	put_i64(p->ttl, req->ttl_ms);
	p->hold = req->hold_on_unknown ? 1 : 0;
	const char *vals[8] = {req->tenant, req->operation, req->key,
			       (const char *)req->hash, p->lease, p->ttl,
			       &p->hold, (const char *)req->owner};
	int lens[8] = {0, 0, 0, 32, 8, 8, 1, STORE_TOKEN_LEN};
	int fmts[8] = {0, 0, 0, 1, 1, 1, 1, 1};
	memcpy(p->vals, vals, sizeof vals);
	memcpy(p->lens, lens, sizeof lens);
	memcpy(p->fmts, fmts, sizeof fmts);
}

/* idem_claim's answer into out. */
static int claim_call(store *s, const claim_req *req, claim_result *out,
		      char *err, size_t errlen)
{
	claim_params cp;
	claim_params_of(req, &cp);
	double asked = ip_now_ms();
	PGresult *r = run(s, ST_CLAIM, cp.vals, cp.lens, cp.fmts, 1);
	if (exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "claim")) {
		PQclear(r);
		return -1;
	}
	if (PQntuples(r) != 1) {
		snprintf(err, errlen, "claim: %d rows", PQntuples(r));
		PQclear(r);
		return -1;
	}
	const char *d = PQgetvalue(r, 0, 0);
	int dlen = PQgetlength(r, 0, 0);
	bool known = false;
	for (size_t i = 0; i < sizeof decisions / sizeof decisions[0]; i++) {
		if ((int)strlen(decisions[i].name) == dlen &&
		    !memcmp(decisions[i].name, d, (size_t)dlen)) {
			out->decision = decisions[i].d;
			known = true;
		}
	}
	if (!known) {
		snprintf(err, errlen, "claim: unknown decision");
		PQclear(r);
		return -1;
	}
	if (!PQgetisnull(r, 0, 1) && PQgetlength(r, 0, 1) == STORE_TOKEN_LEN)
		memcpy(out->owner, PQgetvalue(r, 0, 1), STORE_TOKEN_LEN);
	if (!PQgetisnull(r, 0, 2))
		out->attempt = get_i32(PQgetvalue(r, 0, 2));
	if (!PQgetisnull(r, 0, 3))
		out->lease_left_ms = get_i64(PQgetvalue(r, 0, 3));
	if (!PQgetisnull(r, 0, 8))
		out->expires_in_ms = get_i64(PQgetvalue(r, 0, 8));
	out->asked_ms = asked;
	if (out->decision == CLAIM_REPLAY) {
		out->status = get_i32(PQgetvalue(r, 0, 4));
		out->headers = PQgetvalue(r, 0, 5);
		out->headers_len = (size_t)PQgetlength(r, 0, 5);
		out->body = PQgetvalue(r, 0, 6);
		out->body_len = (size_t)PQgetlength(r, 0, 6);
		out->replayable = !PQgetisnull(r, 0, 7) &&
				  PQgetvalue(r, 0, 7)[0] != 0;
	}
	out->res = r;
	return 0;
}

/* One try of a claim: on a plain store the insert first (claim_new), and
 * idem_claim only when it inserted nothing (or with existing set: at
 * once). */
static int claim_once(store *s, const claim_req *req, bool existing,
		      claim_result *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (store_ensure(s, err, errlen))
		return -1;
	if (!s->citus && !existing) {
		claim_params cp;
		claim_params_of(req, &cp);
		double asked = ip_now_ms();
		PGresult *r = run(s, ST_CLAIM_NEW, cp.vals, cp.lens, cp.fmts,
				  1);
		if (exec_ok(s, r, PGRES_COMMAND_OK, err, errlen, "claim")) {
			PQclear(r);
			return -1;
		}
		int inserted = affected(r);
		PQclear(r);
		if (inserted == 1) {
			store_claim_fresh(req, out);
			out->asked_ms = asked;
			return 0;
		}
	}
	return claim_call(s, req, out, err, errlen);
}

/* A connection that broke while idle (database restarted) shows only on
 * first use: try once more on a fresh one. Repeating a claim is safe: it
 * carries the same owner token, so if the first one did take the key, this
 * one carries on as that attempt. */
static int claim_retried(store *s, const claim_req *req, bool existing,
			 claim_result *out, char *err, size_t errlen)
{
	bool was_connected = s->link.conn != NULL;
	int rc = claim_once(s, req, existing, out, err, errlen);
	if (rc && was_connected && !s->link.conn)
		rc = claim_once(s, req, existing, out, err, errlen);
	return rc;
}

int store_claim(store *s, const claim_req *req, claim_result *out, char *err,
		size_t errlen)
{
	return claim_retried(s, req, false, out, err, errlen);
}

int store_claim_existing(store *s, const claim_req *req, claim_result *out,
			 char *err, size_t errlen)
{
	return claim_retried(s, req, true, out, err, errlen);
}

/* ---- many attempts in one statement (store_batch.h) ---------------- */

static void put_be32(ip_buf *b, int32_t v)
{
	uint32_t n = htonl((uint32_t)v);
	ip_buf_append(b, &n, 4);
}

/* A one-dimensional array parameter in PostgreSQL's binary form
 * (array_recv): dimensions, whether any element is NULL, the element
 * type, the length and lower bound; then each element's length (-1 for
 * NULL) and bytes. */
static void arr_start(ip_buf *b, Oid elem, int n)
{
	ip_buf_reset(b);
	put_be32(b, 1);
	put_be32(b, 0);
	put_be32(b, (int32_t)elem);
	put_be32(b, n);
	put_be32(b, 1);
}

static void arr_add(ip_buf *b, const void *p, int len)
{
	put_be32(b, len);
	if (len > 0)
		ip_buf_append(b, p, (size_t)len);
	if (len < 0) {
		uint32_t one = htonl(1);
		memcpy(b->data + 4, &one, 4);
	}
}

static void arr_add_str(ip_buf *b, const char *s)
{
	arr_add(b, s, (int)strlen(s));
}

/* Runs a *_many statement over the arrays in s->arr. */
static PGresult *run_arrays(store *s, int st)
{
	const char *vals[9];
	int lens[9], fmts[9];
	for (int i = 0; i < stmts[st].nparams; i++) {
		vals[i] = s->arr[i].data;
		lens[i] = (int)s->arr[i].len;
		fmts[i] = 1;
	}
	return run(s, st, vals, lens, fmts, 1);
}

/* The element whose owner token row i of r (column 0) names; -1 if none. */
static int owner_row(PGresult *r, int i, const uint8_t *const *owners, int n)
{
	if (PQgetisnull(r, i, 0) || PQgetlength(r, i, 0) != STORE_TOKEN_LEN)
		return -1;
	const char *t = PQgetvalue(r, i, 0);
	for (int j = 0; j < n; j++)
		if (!memcmp(owners[j], t, STORE_TOKEN_LEN))
			return j;
	return -1;
}

static int claim_many_once(store *s, const claim_req *const *reqs, int n,
			   bool *inserted, char *err, size_t errlen)
{
	memset(inserted, 0, (size_t)n * sizeof *inserted);
	if (store_ensure(s, err, errlen))
		return -1;
	static const Oid types[8] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA,
				     OID_INT8, OID_INT8, OID_BOOL, OID_UUID};
	for (int c = 0; c < 8; c++)
		arr_start(&s->arr[c], types[c], n);
	const uint8_t *owners[STORE_MANY_MAX];
	for (int i = 0; i < n; i++) {
		const claim_req *q = reqs[i];
		char lease[8], ttl[8], hold = q->hold_on_unknown ? 1 : 0;
		put_i64(lease, q->lease_ms);
		put_i64(ttl, q->ttl_ms);
		arr_add_str(&s->arr[0], q->tenant);
		arr_add_str(&s->arr[1], q->operation);
		arr_add_str(&s->arr[2], q->key);
		arr_add(&s->arr[3], q->hash, 32);
		arr_add(&s->arr[4], lease, 8);
		arr_add(&s->arr[5], ttl, 8);
		arr_add(&s->arr[6], &hold, 1);
		arr_add(&s->arr[7], q->owner, STORE_TOKEN_LEN);
		owners[i] = q->owner;
	}
	PGresult *r = run_arrays(s, ST_CLAIM_MANY);
	if (exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "claim")) {
		PQclear(r);
		return -1;
	}
	for (int i = 0; i < PQntuples(r); i++) {
		int j = owner_row(r, i, owners, n);
		if (j >= 0)
			inserted[j] = true;
	}
	PQclear(r);
	return 0;
}

int store_claim_new_many(store *s, const claim_req *const *reqs, int n,
			 bool *inserted, char *err, size_t errlen)
{
	IP_ASSERT(n > 0 && n <= STORE_MANY_MAX && !s->citus);
	bool was_connected = s->link.conn != NULL;
	int rc = claim_many_once(s, reqs, n, inserted, err, errlen);
	/* As claim_retried: an insert that did commit leaves its rows to
	 * their own owners, whom idem_claim recognises. */
	if (rc && was_connected && !s->link.conn)
		rc = claim_many_once(s, reqs, n, inserted, err, errlen);
	return rc;
}

void claim_result_clear(claim_result *r)
{
	if (r->res)
		PQclear(r->res);
	r->res = NULL;
}

/* After a write that changed nothing: when an earlier try of it may have
 * committed, the row already in the state it would have written, under this
 * owner, means done; anything else means fenced. */
static int settle(store *s, const record_key *k, const char *want,
		  bool *fenced, char *err, size_t errlen)
{
	const char *vals[4] = {k->tenant, k->operation, k->key,
			       (const char *)k->owner};
	int lens[4] = {0, 0, 0, STORE_TOKEN_LEN};
	int fmts[4] = {0, 0, 0, 1};
	PGresult *r = run(s, ST_OWNED, vals, lens, fmts, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "owned_state");
	if (!rc)
		*fenced = !(PQntuples(r) == 1 &&
			    !strcmp(PQgetvalue(r, 0, 0), want));
	PQclear(r);
	return rc;
}

/* One try of a fenced write (complete or release). *marked: someone waits
 * for this record (a repeat that finds its first try committed cannot
 * tell, and says yes). */
static int write_once(store *s, int st, const char *want,
		      const char *const *vals, const int *lens,
		      const int *fmts, const record_key *k, bool repeat,
		      bool *fenced, bool *marked, char *err, size_t errlen)
{
	*fenced = false;
	*marked = false;
	if (store_ensure(s, err, errlen))
		return -1;
	PGresult *r = run(s, st, vals, lens, fmts, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, stmts[st].name);
	bool none = !rc && affected(r) == 0;
	if (!rc && !none)
		*marked = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	if (rc || !none)
		return rc;
	if (!repeat) {
		*fenced = true;
		return 0;
	}
	rc = settle(s, k, want, fenced, err, errlen);
	*marked = !rc && !*fenced;
	return rc;
}

/* Wakes the waiters of other instances, after the record committed (so a
 * notification never announces a write that rolled back). Sent only for a
 * record a waiter marked: recording a fresh key costs no NOTIFY. A failure
 * is not the record's: the waiters claim again when their lease check or
 * wait_max comes. */
static void notify_waiters(store *s, const record_key *k)
{
	if (!s->link.conn || !s->wake)
		return;
	char scope[WAKE_SCOPE_HEX + 1];
	wake_scope_hex(s->wake, k->tenant, k->operation, k->key, scope);
	const char *vals[1] = {scope};
	PGresult *r = run(s, ST_WAIT_NOTIFY, vals, NULL, NULL, 0);
	char err[160];
	(void)exec_ok(s, r, PGRES_TUPLES_OK, err, sizeof err, "notify");
	PQclear(r);
}

/* The write, and once more at once on a fresh connection when the one in
 * hand turned out to be broken: the write is fenced by the owner token, so
 * repeating it is safe, and the repeat knows the first try may have
 * committed. */
static int write_fenced(store *s, int st, const char *want,
			const char *const *vals, const int *lens,
			const int *fmts, const record_key *k, bool *fenced,
			char *err, size_t errlen)
{
	bool was_connected = s->link.conn != NULL, marked = false;
	int rc = write_once(s, st, want, vals, lens, fmts, k, k->repeat,
			    fenced, &marked, err, errlen);
	if (rc && was_connected && !s->link.conn)
		rc = write_once(s, st, want, vals, lens, fmts, k, true,
				fenced, &marked, err, errlen);
	if (!rc && !*fenced && marked)
		notify_waiters(s, k);
	return rc;
}

int store_wait_mark(store *s, const char *tenant, const char *operation,
		    const char *key, bool *marked, int64_t *lease_left_ms,
		    char *err, size_t errlen)
{
	*marked = false;
	*lease_left_ms = 0;
	if (store_ensure(s, err, errlen))
		return -1;
	const char *vals[3] = {tenant, operation, key};
	PGresult *r = run(s, ST_WAIT_MARK, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "wait_mark");
	if (!rc && PQntuples(r) == 1) {
		*marked = true;
		*lease_left_ms = atoll(PQgetvalue(r, 0, 0));
	}
	PQclear(r);
	return rc;
}

int store_complete(store *s, const record_key *k, int status,
		   const char *headers, size_t headers_len, const char *body,
		   size_t body_len, bool replayable, const char *seal_key,
		   bool *fenced, char *err, size_t errlen)
{
	complete_req q = {k,	    status,   headers,	  headers_len,
			  body,	    body_len, replayable, seal_key};
	return store_complete_req(s, &q, fenced, err, errlen);
}

int store_complete_req(store *s, const complete_req *q, bool *fenced,
		       char *err, size_t errlen)
{
	uint32_t st = htonl((uint32_t)q->status);
	char rep = q->replayable ? 1 : 0;
	const record_key *k = q->k;
	const char *vals[9] = {k->tenant,
			       k->operation,
			       k->key,
			       (const char *)k->owner,
			       (const char *)&st,
			       q->headers ? q->headers : "",
			       q->body ? q->body : "",
			       &rep,
			       q->seal_key};
	int lens[9] = {0, 0, 0, STORE_TOKEN_LEN, 4, (int)q->headers_len,
		       (int)q->body_len, 1, 0};
	int fmts[9] = {0, 0, 0, 1, 1, 1, 1, 1, 0};
	return write_fenced(s, ST_COMPLETE, "completed", vals, lens, fmts,
			    k, fenced, err, errlen);
}

static int complete_many_once(store *s, const complete_req *const *reqs,
			      int n, bool *updated, bool *marked, char *err,
			      size_t errlen)
{
	memset(updated, 0, (size_t)n * sizeof *updated);
	memset(marked, 0, (size_t)n * sizeof *marked);
	if (store_ensure(s, err, errlen))
		return -1;
	static const Oid types[9] = {OID_TEXT, OID_TEXT,  OID_TEXT,
				     OID_UUID, OID_INT4,  OID_BYTEA,
				     OID_BYTEA, OID_BOOL, OID_TEXT};
	for (int c = 0; c < 9; c++)
		arr_start(&s->arr[c], types[c], n);
	const uint8_t *owners[STORE_MANY_MAX];
	for (int i = 0; i < n; i++) {
		const complete_req *q = reqs[i];
		uint32_t st = htonl((uint32_t)q->status);
		char rep = q->replayable ? 1 : 0;
		arr_add_str(&s->arr[0], q->k->tenant);
		arr_add_str(&s->arr[1], q->k->operation);
		arr_add_str(&s->arr[2], q->k->key);
		arr_add(&s->arr[3], q->k->owner, STORE_TOKEN_LEN);
		arr_add(&s->arr[4], &st, 4);
		arr_add(&s->arr[5], q->headers, (int)q->headers_len);
		arr_add(&s->arr[6], q->body, (int)q->body_len);
		arr_add(&s->arr[7], &rep, 1);
		if (q->seal_key)
			arr_add_str(&s->arr[8], q->seal_key);
		else
			arr_add(&s->arr[8], NULL, -1);
		owners[i] = q->k->owner;
	}
	PGresult *r = run_arrays(s, ST_COMPLETE_MANY);
	if (exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "complete")) {
		PQclear(r);
		return -1;
	}
	for (int i = 0; i < PQntuples(r); i++) {
		int j = owner_row(r, i, owners, n);
		if (j < 0)
			continue;
		updated[j] = true;
		marked[j] = !PQgetisnull(r, i, 1) &&
			    PQgetvalue(r, i, 1)[0] != 0;
	}
	PQclear(r);
	return 0;
}

int store_complete_many(store *s, const complete_req *const *reqs, int n,
			bool *updated, bool *marked, bool *resent, char *err,
			size_t errlen)
{
	IP_ASSERT(n > 0 && n <= STORE_MANY_MAX);
	bool was_connected = s->link.conn != NULL;
	*resent = false;
	int rc = complete_many_once(s, reqs, n, updated, marked, err, errlen);
	/* Fenced by the owner tokens, like write_fenced; the first try may
	 * have committed, which the caller settles for the elements this one
	 * did not write. */
	if (rc && was_connected && !s->link.conn) {
		*resent = true;
		rc = complete_many_once(s, reqs, n, updated, marked, err,
					errlen);
	}
	return rc;
}

int store_settle(store *s, const record_key *k, bool *fenced, char *err,
		 size_t errlen)
{
	*fenced = false;
	if (store_ensure(s, err, errlen))
		return -1;
	return settle(s, k, "completed", fenced, err, errlen);
}

void store_notify_waiters(store *s, const record_key *k)
{
	notify_waiters(s, k);
}

int store_release(store *s, const record_key *k, bool *fenced, char *err,
		  size_t errlen)
{
	const char *vals[4] = {k->tenant, k->operation, k->key,
			       (const char *)k->owner};
	int lens[4] = {0, 0, 0, STORE_TOKEN_LEN};
	int fmts[4] = {0, 0, 0, 1};
	return write_fenced(s, ST_RELEASE, "released", vals, lens, fmts, k,
			    fenced, err, errlen);
}

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

/* The purge on every shard (see per_shard). *n counts the rows of the
 * shards that answered; a shard that did not (its worker is down) fails the
 * call after the others were done. */
static int shard_batch(store *s, int batch, int *n, char *err, size_t errlen,
		       const char *what)
{
	*n = 0;
	if (store_ensure(s, err, errlen))
		return -1;
	char cmd[1024];
	snprintf(cmd, sizeof cmd, SHARD_PURGE_SQL, batch);
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
	int64_t count;
	double oldest_age_s;
} shard_walk_out;

/* One command on every shard from its place in map (see shard_walk); map
 * takes the places the shards answered with, also when some failed (their
 * worker is down: the call fails after the others were done). */
static int shard_walk(store *s, const char *cmd, ip_buf *map,
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
	out->count = atoll(PQgetvalue(r, 0, 2));
	out->oldest_age_s = atof(PQgetvalue(r, 0, 3));
	ip_buf_reset(map);
	ip_buf_puts(map, PQgetvalue(r, 0, 7));
	rc = shards_failed(r, 4, err, errlen, what);
	PQclear(r);
	return rc;
}

/* A per-shard statement (cmd) through shard_walk, the map in held. */
static int shard_step(store *s, const char *cmd, ip_buf *held,
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
		      ip_buf *held, int *released, bool *more, char *err,
		      size_t errlen)
{
	*released = 0;
	*more = false;
	if (s->citus) {
		char cmd[4096];
		IP_ASSERT(snprintf(cmd, sizeof cmd, SHARD_REAP_SQL, batch,
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
		ip_buf_reset(held);
		ip_buf_puts(held, PQgetvalue(r, 0, 3));
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

int store_sweep_leases(store *s, int pages, int64_t *page, ip_buf *held,
		       int *released, char *err, size_t errlen)
{
	*released = 0;
	if (s->citus) {
		char cmd[4096];
		bool more;
		IP_ASSERT(snprintf(cmd, sizeof cmd, SHARD_SWEEP_SQL, pages,
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
		ip_buf_reset(held);
		ip_buf_puts(held, PQgetvalue(r, 0, 2));
	}
	PQclear(r);
	return rc;
}

int store_purge_expired(store *s, int batch, int *purged, char *err,
			size_t errlen)
{
	if (s->citus)
		return shard_batch(s, batch, purged, err, errlen, "purge");
	return batch_stmt(s, ST_PURGE, batch, purged, err, errlen, "purge");
}

int store_processing_stats(store *s, const char *since, ip_buf *held,
			   int64_t *count, double *oldest_age_s, char *err,
			   size_t errlen)
{
	if (s->citus) {
		shard_walk_out o;
		int rc = shard_walk(s, SHARD_STATS_SQL, held, &o, err, errlen,
				    "stats");
		*count = o.count;
		*oldest_age_s = o.oldest_age_s;
		return rc;
	}
	if (store_ensure(s, err, errlen))
		return -1;
	const char *vals[2] = {since, held->data ? held->data : "{}"};
	PGresult *r = run(s, ST_STATS, vals, NULL, NULL, 0);
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "stats");
	if (!rc) {
		*count = atoll(PQgetvalue(r, 0, 0));
		*oldest_age_s = atof(PQgetvalue(r, 0, 1));
		ip_buf_reset(held);
		ip_buf_puts(held, PQgetvalue(r, 0, 2));
	}
	PQclear(r);
	return rc;
}

/* Schema management runs on a plain connection: the prepared statements need
 * the schema, which may not exist yet. */
static PGconn *plain_connect(store *s, char *err, size_t errlen)
{
	const char *keys[] = {"connect_timeout", "application_name", "dbname",
			      NULL};
	const char *vals[] = {"5", "idemproxy", s->link.url, NULL};
	PGconn *c = PQconnectdbParams(keys, vals, 1);
	if (!c || PQstatus(c) != CONNECTION_OK) {
		pg_link_err(err, errlen, "connect",
			    c ? PQerrorMessage(c) : "out of memory");
		if (c)
			PQfinish(c);
		return NULL;
	}
	pg_link_quiet(c);
	return c;
}

static bool has_version(const PGresult *r, int v)
{
	for (int i = 0; i < PQntuples(r); i++)
		if (atoi(PQgetvalue(r, i, 0)) == v)
			return true;
	return false;
}

/* The applied migrations (NULL result: none yet), or -1. */
static int applied_on(PGconn *c, PGresult **out, char *err, size_t errlen)
{
	*out = NULL;
	PGresult *r = PQexec(c, "SELECT to_regclass('schema_migrations') IS "
				"NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "schema", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	bool exists = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	if (!exists)
		return 0;
	r = PQexec(c, "SELECT version FROM schema_migrations");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "schema", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	*out = r;
	return 0;
}

/* The schema's version: the last embedded migration before the first one
 * missing (migrations are numbered apart by the branches that add them, so
 * a database may have a later one without an earlier one), or, with all of
 * them applied, the highest applied (a newer binary's). */
static int version_on(PGconn *c, int *version, char *err, size_t errlen)
{
	PGresult *r;
	*version = 0;
	if (applied_on(c, &r, err, errlen))
		return -1;
	if (!r)
		return 0;
	bool all = true;
	for (int i = 0; i < ip_n_migrations && all; i++) {
		if (has_version(r, ip_migrations[i].version))
			*version = ip_migrations[i].version;
		else
			all = false;
	}
	for (int i = 0; all && i < PQntuples(r); i++)
		if (atoi(PQgetvalue(r, i, 0)) > *version)
			*version = atoi(PQgetvalue(r, i, 0));
	PQclear(r);
	return 0;
}

int store_schema_version(store *s, int *version, char *err, size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = version_on(c, version, err, errlen);
	PQfinish(c);
	return rc;
}

int store_wake_key_read(store *s, wake_key *out, char *err, size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	PGresult *r = PQexecParams(c, "SELECT secret FROM idemproxy_secrets "
				   "WHERE name = 'wait_notify'", 0, NULL, NULL,
				   NULL, NULL, 1);
	int rc = -1;
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		pg_link_err(err, errlen, "wait secret",
			    PQresultErrorMessage(r));
	else if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0) ||
		 PQgetlength(r, 0, 0) < WAKE_KEY_MIN ||
		 PQgetlength(r, 0, 0) > WAKE_KEY_MAX)
		snprintf(err, errlen, "idemproxy_secrets holds no wait_notify "
			 "secret of %d to %d bytes", WAKE_KEY_MIN,
			 WAKE_KEY_MAX);
	else {
		out->len = (size_t)PQgetlength(r, 0, 0);
		memcpy(out->k, PQgetvalue(r, 0, 0), out->len);
		rc = 0;
	}
	PQclear(r);
	PQfinish(c);
	return rc;
}

/* '{"a","b"}' and '{1,2}': key ids hold no quote or backslash (seal.h),
 * and quoted, an id "NULL" stays a string. */
static void seal_arrays(const seal_tally_entry *add, size_t n, ip_buf *ids,
			ip_buf *counts)
{
	ip_buf_reset(ids);
	ip_buf_reset(counts);
	ip_buf_printf(ids, "{");
	ip_buf_printf(counts, "{");
	for (size_t i = 0; i < n; i++) {
		const char *sep = i ? "," : "";
		ip_buf_printf(ids, "%s\"%s\"", sep, add[i].id);
		ip_buf_printf(counts, "%s%llu", sep,
			      (unsigned long long)add[i].n);
	}
	ip_buf_printf(ids, "}");
	ip_buf_printf(counts, "}");
}

int store_seal_counts(store *s, const seal_tally_entry *add, size_t nadd,
		      seal_tally_entry *out, size_t max, size_t *nout,
		      char *err, size_t errlen)
{
	*nout = 0;
	if (store_ensure(s, err, errlen))
		return -1;
	seal_arrays(add, nadd, &s->arr[0], &s->arr[1]);
	const char *vals[2] = {s->arr[0].data, s->arr[1].data};
	PGresult *r = run(s, ST_SEAL_COUNT, vals, NULL, NULL, 0);
	if (exec_ok(s, r, PGRES_TUPLES_OK, err, errlen, "seal count")) {
		PQclear(r);
		return -1;
	}
	for (int i = 0; i < PQntuples(r) && *nout < max; i++) {
		seal_tally_entry *e = &out[(*nout)++];
		snprintf(e->id, sizeof e->id, "%s", PQgetvalue(r, i, 0));
		e->n = strtoull(PQgetvalue(r, i, 1), NULL, 10);
	}
	PQclear(r);
	return 0;
}

int store_expected_version(void)
{
	int v = 0;
	for (int i = 0; i < ip_n_migrations; i++)
		if (ip_migrations[i].version > v)
			v = ip_migrations[i].version;
	return v;
}

static int simple(PGconn *c, const char *sql, char *err, size_t errlen,
		  const char *what)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	int rc = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, what, PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

static int apply_one(PGconn *c, const struct migration *m, char *err,
		     size_t errlen)
{
	char what[160];
	snprintf(what, sizeof what, "migration %s", m->name);
	if (simple(c, "BEGIN", err, errlen, what))
		return -1;
	/* One statement at a time (sqlsplit.h: Citus passes a DDL
	 * statement's text on to the shards). */
	size_t pos = 0, len;
	const char *st;
	while (sql_next_statement(m->sql, &pos, &st, &len)) {
		char *one = xstrndup(st, len);
		int failed = simple(c, one, err, errlen, what);
		free(one);
		if (failed)
			goto rollback;
	}
	char ver[16];
	snprintf(ver, sizeof ver, "%d", m->version);
	const char *vals[2] = {ver, m->name};
	PGresult *r = PQexecParams(c,
				   "INSERT INTO schema_migrations (version, "
				   "name) VALUES ($1::int, $2)",
				   2, NULL, vals, NULL, NULL, 0);
	int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, what, PQresultErrorMessage(r));
	PQclear(r);
	if (rc)
		goto rollback;
	return simple(c, "COMMIT", err, errlen, what);
rollback:
	PQclear(PQexec(c, "ROLLBACK"));
	return -1;
}

int store_migrate(store *s, int *applied, char *err, size_t errlen)
{
	*applied = 0;
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = -1;
	/* Several instances may migrate at once: one at a time. */
	if (simple(c, "SELECT pg_advisory_lock(7307114101)", err, errlen,
		   "lock"))
		goto out;
	if (simple(c,
		   "CREATE TABLE IF NOT EXISTS schema_migrations ("
		   "version integer PRIMARY KEY, name text NOT NULL, "
		   "applied_at timestamptz NOT NULL DEFAULT now())",
		   err, errlen, "schema_migrations"))
		goto out;
	/* Every embedded migration not applied yet, in order: not only those
	 * above the highest applied one. */
	PGresult *have;
	if (applied_on(c, &have, err, errlen))
		goto out;
	for (int i = 0; i < ip_n_migrations; i++) {
		if (have && has_version(have, ip_migrations[i].version))
			continue;
		if (apply_one(c, &ip_migrations[i], err, errlen)) {
			PQclear(have);
			goto out;
		}
		(*applied)++;
	}
	PQclear(have);
	rc = 0;
out:
	PQfinish(c);
	return rc;
}

/* ---- Citus ----------------------------------------------------------- */

/* The functions the proxy calls, each distributed by its tenant argument
 * and colocated with the records, so that a call is delegated to the
 * worker holding the tenant's shard. Every overload of the name in the
 * records' schema is distributed. */
static const char *const citus_functions[] = {"idem_claim"};

static const char layout_sql[] =
	"SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'citus')";

/* With the extension: is the table hash-distributed by tenant, and how
 * many of the proxy's functions ($1) are not distributed with it? */
static const char citus_layout_sql[] =
	"WITH t AS (SELECT p.logicalrelid, p.partmethod, p.colocationid, "
	"column_to_column_name(p.logicalrelid, p.partkey) AS col "
	"FROM pg_dist_partition p "
	"WHERE p.logicalrelid = to_regclass('idempotency_records')) "
	"SELECT (SELECT count(*) FROM t), "
	"(SELECT count(*) FROM t WHERE partmethod = 'h' AND col = 'tenant'), "
	"(SELECT count(*) FROM pg_proc f "
	"JOIN pg_class c ON c.oid = to_regclass('idempotency_records') "
	"AND f.pronamespace = c.relnamespace "
	"WHERE f.proname = ANY ($1::text[]) AND NOT EXISTS ("
	"SELECT 1 FROM pg_dist_object o, t WHERE o.classid = "
	"'pg_proc'::regclass AND o.objid = f.oid "
	"AND o.distribution_argument_index IS NOT NULL "
	"AND o.colocationid = t.colocationid))";

static void functions_array(char *out, size_t n)
{
	size_t k = (size_t)snprintf(out, n, "{");
	for (size_t i = 0; i < sizeof citus_functions / sizeof *citus_functions;
	     i++)
		k += (size_t)snprintf(out + k, n > k ? n - k : 0, "%s%s",
				      i ? "," : "", citus_functions[i]);
	snprintf(out + k, n > k ? n - k : 0, "}");
}

static int layout_on(PGconn *c, enum store_layout *out, char *err,
		     size_t errlen)
{
	PGresult *r = PQexec(c, layout_sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "layout", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	bool citus = atoi(PQgetvalue(r, 0, 0)) > 0;
	PQclear(r);
	*out = STORE_PLAIN;
	if (!citus)
		return 0;
	char fns[256];
	functions_array(fns, sizeof fns);
	const char *vals[1] = {fns};
	r = PQexecParams(c, citus_layout_sql, 1, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "layout", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	int distributed = atoi(PQgetvalue(r, 0, 0));
	int by_tenant = atoi(PQgetvalue(r, 0, 1));
	int loose = atoi(PQgetvalue(r, 0, 2));
	PQclear(r);
	*out = !distributed ? STORE_CITUS_LOCAL
	       : !by_tenant ? STORE_CITUS_OTHER
	       : loose	    ? STORE_CITUS_PARTIAL
			    : STORE_CITUS_DISTRIBUTED;
	return 0;
}

int store_layout_get(store *s, enum store_layout *out, char *err,
		     size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = layout_on(c, out, err, errlen);
	PQfinish(c);
	return rc;
}

const char *store_layout_mismatch(enum store_layout l, bool citus)
{
	if (!citus)
		return l == STORE_PLAIN || l == STORE_CITUS_LOCAL
			       ? NULL
			       : "idempotency_records is distributed (Citus) "
				 "but database.distributed = \"none\": set "
				 "database.distributed = \"citus\"";
	switch (l) {
	case STORE_PLAIN:
		return "database.distributed = \"citus\" but the database has "
		       "no citus extension";
	case STORE_CITUS_LOCAL:
		return "database.distributed = \"citus\" but "
		       "idempotency_records is not distributed: run --migrate "
		       "on the coordinator";
	case STORE_CITUS_OTHER:
		return "database.distributed = \"citus\" but "
		       "idempotency_records is not hash-distributed by tenant";
	case STORE_CITUS_PARTIAL:
		return "database.distributed = \"citus\" but idem_claim is not "
		       "distributed with idempotency_records: run --migrate";
	case STORE_CITUS_DISTRIBUTED:
		break;
	}
	return NULL;
}

/* Distributes each overload of the proxy's functions; Citus accepts a
 * function that is distributed already, so this runs on every migrate
 * (a numbered migration may have re-created one). */
static int distribute_functions(PGconn *c, char *err, size_t errlen)
{
	char fns[256];
	functions_array(fns, sizeof fns);
	const char *vals[1] = {fns};
	PGresult *r = PQexecParams(
		c,
		"SELECT create_distributed_function(f.oid::regprocedure, "
		"'p_tenant', colocate_with := 'idempotency_records') "
		"FROM pg_proc f JOIN pg_class c ON c.oid = "
		"to_regclass('idempotency_records') "
		"AND f.pronamespace = c.relnamespace "
		"WHERE f.proname = ANY ($1::text[])",
		1, NULL, vals, NULL, NULL, 0);
	int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, "create_distributed_function",
			    PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

int store_distribute(store *s, bool *converted, char *err, size_t errlen)
{
	*converted = false;
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = -1;
	enum store_layout l;
	if (simple(c, "SELECT pg_advisory_lock(7307114101)", err, errlen,
		   "lock") ||
	    layout_on(c, &l, err, errlen))
		goto out;
	if (l == STORE_PLAIN || l == STORE_CITUS_OTHER) {
		snprintf(err, errlen, "%s", store_layout_mismatch(l, true));
		goto out;
	}
	if (l == STORE_CITUS_LOCAL) {
		/* Copies any rows to the shards (a store migrated plain),
		 * then drops the coordinator's local copy of them, in one
		 * transaction. */
		if (simple(c, "BEGIN", err, errlen, "distribute") ||
		    simple(c,
			   "SELECT create_distributed_table("
			   "'idempotency_records', 'tenant')",
			   err, errlen, "create_distributed_table") ||
		    simple(c,
			   "SELECT truncate_local_data_after_distributing_table("
			   "'idempotency_records')",
			   err, errlen, "distribute") ||
		    simple(c, "COMMIT", err, errlen, "distribute")) {
			PQclear(PQexec(c, "ROLLBACK"));
			goto out;
		}
		*converted = true;
	}
	rc = distribute_functions(c, err, errlen);
out:
	PQfinish(c);
	return rc;
}
