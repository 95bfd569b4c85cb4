/* PostgreSQL store: the connection, the statements table it prepares,
 * and the statements on one record (claim, complete, release, the
 * waiters' mark and wake-up) and the seal counts; binary parameters for
 * bytea and integers, one round trip per claim. The batch statements are
 * in store_pg_many.c, the reaper's in store_pg_reap.c, the schema and its
 * layout in store_pg_schema.c. */
#include "store_pg.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>

#include "store_pg_int.h"
#include "wake.h"

const stmt_def store_stmts[] = {
	{"claim", 10,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_INT8, OID_INT8, OID_BOOL,
	  OID_UUID, OID_INT8, OID_BYTEA},
	 "SELECT o_decision, o_owner, o_attempt, o_lease_ms, o_status, "
	 "o_headers, o_body, o_replayable, o_expires_ms "
	 "FROM idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"},
	/* A late answer may still be recorded after the reaper released the
	 * record, as long as no other attempt took it over (owner unchanged):
	 * it is the truth about the one attempt that was sent. It changes no
	 * indexed column (lease_until keeps the end of the last lease), so it
	 * is a HOT update (sql/006_hot_complete.sql). Never after the end of
	 * the response (a tombstone keeps the key, not an answer). */
	{"complete", 9,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_UUID, OID_INT4, OID_BYTEA, OID_BYTEA,
	  OID_BOOL, OID_TEXT},
	 "UPDATE idempotency_records SET state = 'completed', "
	 "response_status = $5, response_headers = $6, response_body = $7, "
	 "replayable = $8, seal_key = $9, updated_at = now() "
	 "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	 "AND owner_token = $4 AND state IN ('processing', 'released') "
	 "AND coalesce(replay_until, expires_at) > now() RETURNING wait_notify"},
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
	 * the count, the oldest one's age, the held rows still held, and the
	 * count and oldest age of the held ones among all (HELD_NOW). */
	{"processing_stats", 2,
	 {OID_TSTZ, OID_TEXT},
	 "WITH live AS (SELECT updated_at, hold_on_unknown AND lease_until "
	 "<= now() AS waiting FROM idempotency_records "
	 "WHERE state = 'processing' AND lease_until >= $1), "
	 "held AS (SELECT ctid, updated_at FROM idempotency_records "
	 "WHERE ctid = ANY ($2::tid[]) AND state = 'processing' "
	 "AND hold_on_unknown AND lease_until < $1), "
	 HELD_NOW " "
	 "SELECT ((SELECT count(*) FROM live) + "
	 "(SELECT count(*) FROM held))::int8, "
	 "coalesce(extract(epoch FROM now() - least("
	 "(SELECT min(updated_at) FROM live), "
	 "(SELECT min(updated_at) FROM held))), 0)::float8::text, "
	 "(SELECT array(SELECT ctid FROM held))::text, "
	 "(SELECT count(*) FROM held_all)::int8, "
	 "coalesce(extract(epoch FROM now() - "
	 "(SELECT min(updated_at) FROM held_all)), 0)::float8::text"},
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
	 * oldest age, the failures, the shards, the first error, the map, and
	 * the held count and oldest held age (fields 8 and 9 of the stats). */
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
	 "FILTER (WHERE success OR (SELECT m.m ? name FROM m)), '{}')::text, "
	 "coalesce(sum(nullif(f[8], '')::int8) FILTER (WHERE success), 0)::int8, "
	 "coalesce(max(nullif(f[9], '')::float8) FILTER (WHERE success), 0)"
	 "::float8::text "
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
	{"claim_new", 10,
	 {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_INT8, OID_INT8, OID_BOOL,
	  OID_UUID, OID_INT8, OID_BYTEA},
	 "INSERT INTO idempotency_records (tenant, operation, idem_key, "
	 "request_hash, state, owner_token, attempt, lease_until, "
	 "hold_on_unknown, created_at, updated_at, expires_at, replay_until, "
	 "trace_id) "
	 "VALUES ($1, $2, $3, $4, 'processing', $8, 1, "
	 "now() + $5 * interval '1 millisecond', $7, now(), now(), "
	 "now() + greatest($9, $6, $5) * interval '1 millisecond', "
	 "CASE WHEN $9 > $6 THEN now() + greatest($6, $5) "
	 "* interval '1 millisecond' END, $10) "
	 "ON CONFLICT DO NOTHING"},
	/* claim_new for many first attempts at once (store_batch.h), its
	 * parameters as arrays, one element per attempt: one statement and
	 * one commit for them all. The rows inserted come back by their owner
	 * tokens (each attempt's own); an attempt whose key exists gets none,
	 * and idem_claim decides for it as after claim_new. */
	{"claim_many", 10,
	 {OID_TEXT_ARR, OID_TEXT_ARR, OID_TEXT_ARR, OID_BYTEA_ARR, OID_INT8_ARR,
	  OID_INT8_ARR, OID_BOOL_ARR, OID_UUID_ARR, OID_INT8_ARR, OID_BYTEA_ARR},
	 "INSERT INTO idempotency_records (tenant, operation, idem_key, "
	 "request_hash, state, owner_token, attempt, lease_until, "
	 "hold_on_unknown, created_at, updated_at, expires_at, replay_until, "
	 "trace_id) "
	 "SELECT t, o, k, h, 'processing', w, 1, "
	 "now() + l * interval '1 millisecond', hd, now(), now(), "
	 "now() + greatest(rk, ttl, l) * interval '1 millisecond', "
	 "CASE WHEN rk > ttl THEN now() + greatest(ttl, l) "
	 "* interval '1 millisecond' END, tr "
	 "FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
	 "AS u(t, o, k, h, l, ttl, hd, w, rk, tr) "
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
	 "AND coalesce(r.replay_until, r.expires_at) > now() "
	 "RETURNING r.owner_token, r.wait_notify"},
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
	{"strip_tombstones", 1, {OID_INT4},
	 STRIP_SQL("idempotency_records", "$1")},
	{"purge_tombstones", 1, {OID_INT4},
	 PURGE_TOMBS_SQL("idempotency_records", "$1")}
};

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
		growbuf_free(&s->arr[i]);
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
		ALWAYS_ASSERT(RAND_bytes(token_pool.bytes,
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
	size_t n = sizeof store_stmts / sizeof store_stmts[0];
	for (size_t i = 0; i < n; i++) {
		/* run_command_on_shards exists only with Citus. */
		if ((i == ST_PER_SHARD || i == ST_SHARD_WALK) && !s->citus)
			continue;
		PGresult *r = pg_link_result(
			&s->link,
			PQsendPrepare(s->link.conn, store_stmts[i].name,
				      store_stmts[i].sql,
				      store_stmts[i].nparams,
				      store_stmts[i].types) == 1);
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

static const struct {
	const char *name;
	enum claim_decision d;
} decisions[] = {
	{"forward", CLAIM_FORWARD},	{"takeover", CLAIM_TAKEOVER},
	{"replay", CLAIM_REPLAY},	{"in_flight", CLAIM_IN_FLIGHT},
	{"held", CLAIM_HELD},		{"mismatch", CLAIM_MISMATCH},
	{"expired", CLAIM_EXPIRED},
};


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
	char lease[8], ttl[8], retain[8], hold;
	const char *vals[10];
	int lens[10];
	int fmts[10];
} claim_params;

static void claim_params_of(const claim_req *req, claim_params *p)
{
	put_i64(p->lease, req->lease_ms);
	put_i64(p->ttl, req->ttl_ms);
	put_i64(p->retain, req->retain_ms);
	p->hold = req->hold_on_unknown ? 1 : 0;
	const char *vals[10] = {req->tenant, req->operation, req->key,
				(const char *)req->hash, p->lease, p->ttl,
				&p->hold, (const char *)req->owner, p->retain,
				(const char *)req->trace_id};
	int lens[10] = {0, 0, 0, 32, 8, 8, 1, STORE_TOKEN_LEN, 8,
			STORE_TRACE_LEN};
	int fmts[10] = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
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
	double asked = mono_ms();
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
	if (out->decision == CLAIM_EXPIRED && !PQgetisnull(r, 0, 4))
		out->status = get_i32(PQgetvalue(r, 0, 4));
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
		double asked = mono_ms();
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
	int rc = exec_ok(s, r, PGRES_TUPLES_OK, err, errlen,
			 store_stmts[st].name);
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

/* '{"a","b"}' and '{1,2}': key ids hold no quote or backslash (seal.h),
 * and quoted, an id "NULL" stays a string. */
static void seal_arrays(const seal_tally_entry *add, size_t n, growbuf *ids,
			growbuf *counts)
{
	growbuf_reset(ids);
	growbuf_reset(counts);
	growbuf_printf(ids, "{");
	growbuf_printf(counts, "{");
	for (size_t i = 0; i < n; i++) {
		const char *sep = i ? "," : "";
		growbuf_printf(ids, "%s\"%s\"", sep, add[i].id);
		growbuf_printf(counts, "%s%llu", sep,
			       (unsigned long long)add[i].n);
	}
	growbuf_printf(ids, "}");
	growbuf_printf(counts, "}");
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

