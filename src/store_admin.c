/* The admin API's store queries, on the admin listener's own connection.
 * Text parameters and results: every value the admin API handles is text
 * or small, and the bytea body is base64-encoded by the database. */
#include "store_admin.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pg_link.h"

struct store_admin {
	pg_link link;
};

store_admin *store_admin_new(const char *url, int64_t statement_timeout_ms)
{
	store_admin *s = xcalloc(1, sizeof *s);
	pg_link_init(&s->link, url, "idemproxy-admin", statement_timeout_ms);
	return s;
}

void store_admin_free(store_admin *s)
{
	if (!s)
		return;
	pg_link_close(&s->link);
	free(s);
}

void store_admin_set_statement_timeout(store_admin *s, int64_t ms)
{
	pg_link_set_statement_timeout(&s->link, ms);
}

/* Runs sql with text parameters and text results. A connection that broke
 * while idle (the database restarted) shows only on first use; when
 * may_repeat is set the statement is then sent once more on a fresh
 * connection. Only statements that are safe to repeat may set it. */
static PGresult *query_fmt(store_admin *s, const char *what, const char *sql,
			   int n, const char *const *vals, const int *lens,
			   const int *fmts, bool may_repeat,
			   ExecStatusType want, char *err, size_t errlen)
{
	for (int round = 0;; round++) {
		bool was_connected = s->link.conn != NULL;
		if (pg_link_connect(&s->link, NULL, err, errlen))
			return NULL;
		PGresult *r = pg_link_exec_params(&s->link, sql, n, NULL, vals,
						  lens, fmts, 0);
		if (r && PQresultStatus(r) == want)
			return r;
		pg_link_err(err, errlen, what,
			    r ? PQresultErrorMessage(r)
			      : pg_link_error(&s->link));
		PQclear(r);
		bool broken = pg_link_drop_if_broken(&s->link);
		if (!may_repeat || !broken || !was_connected || round > 0)
			return NULL;
	}
}

static PGresult *query(store_admin *s, const char *what, const char *sql, int n,
		       const char *const *vals, bool may_repeat,
		       ExecStatusType want, char *err, size_t errlen)
{
	return query_fmt(s, what, sql, n, vals, NULL, NULL, may_repeat, want,
			 err, errlen);
}

int store_admin_ready(store_admin *s, int want, char *err, size_t errlen)
{
	PGresult *r = query(s, "schema",
			    "SELECT coalesce(max(version), 0) "
			    "FROM schema_migrations",
			    0, NULL, true, PGRES_TUPLES_OK, err, errlen);
	if (!r)
		return -1;
	int version = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	if (version < want) {
		snprintf(err, errlen,
			 "database schema is version %d, this binary needs %d: "
			 "run --migrate",
			 version, want);
		return -1;
	}
	return 0;
}

#define TS(col)                                                                \
	"to_char(" col " AT TIME ZONE 'UTC', "                                 \
	"'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

static const char get_sql[] =
	"SELECT tenant, operation, idem_key, state, attempt, "
	"encode(request_hash, 'hex'), owner_token::text, "
	/* A completed row keeps the end of its last lease (006): not a lease. */
	TS("CASE WHEN state = 'processing' THEN lease_until END")
	", " TS("created_at") ", " TS("updated_at") ", " TS("expires_at")
	", expires_at <= now(), hold_on_unknown, response_status, "
	"encode(response_headers, 'hex'), "
	"translate(encode(response_body, 'base64'), "
	"E'\\n', ''), replayable, encode(trace_id, 'hex'), "
	TS("nullif(coalesce(replay_until, expires_at), '-infinity')") ", "
	"state = 'completed' AND expires_at > now() "
	"AND coalesce(replay_until, expires_at) <= now() "
	"FROM idempotency_records "
	"WHERE tenant = $1 AND operation = $2 AND idem_key = $3";

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : 0;
}

/* The stored header bytes (bytea, sent as hex text), NUL-terminated. */
static char *unhex(const char *h, size_t *len)
{
	*len = 0;
	if (!h)
		return NULL;
	size_t n = strlen(h) / 2;
	char *out = xmalloc(n + 1);
	for (size_t i = 0; i < n; i++)
		out[i] = (char)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
	out[n] = '\0';
	*len = n;
	return out;
}

static const char *col(PGresult *r, int c)
{
	return PQgetisnull(r, 0, c) ? NULL : PQgetvalue(r, 0, c);
}

static bool col_true(PGresult *r, int c)
{
	return !PQgetisnull(r, 0, c) && PQgetvalue(r, 0, c)[0] == 't';
}

int store_admin_get(store_admin *s, const char *tenant, const char *operation,
		    const char *key, admin_record *out, bool *found, char *err,
		    size_t errlen)
{
	memset(out, 0, sizeof *out);
	*found = false;
	const char *vals[3] = {tenant, operation, key};
	PGresult *r = query(s, "get", get_sql, 3, vals, true, PGRES_TUPLES_OK,
			    err, errlen);
	if (!r)
		return -1;
	if (PQntuples(r) != 1) {
		PQclear(r);
		return 0;
	}
	*found = true;
	out->res = r;
	out->tenant = col(r, 0);
	out->operation = col(r, 1);
	out->key = col(r, 2);
	out->state = col(r, 3);
	out->attempt = atoi(PQgetvalue(r, 0, 4));
	out->request_hash_hex = col(r, 5);
	out->owner_token = col(r, 6);
	out->lease_until = col(r, 7);
	out->created_at = col(r, 8);
	out->updated_at = col(r, 9);
	out->expires_at = col(r, 10);
	out->expired = col_true(r, 11);
	out->hold_on_unknown = col_true(r, 12);
	out->has_status = !PQgetisnull(r, 0, 13);
	out->response_status = out->has_status ? atoi(col(r, 13)) : 0;
	out->response_headers = unhex(col(r, 14), &out->response_headers_len);
	out->response_body_b64 = col(r, 15);
	out->replayable = PQgetisnull(r, 0, 16) ? -1 : col_true(r, 16);
	out->trace_id = col(r, 17);
	out->response_expires_at = col(r, 18);
	out->tombstone = col_true(r, 19);
	return 0;
}

void store_admin_record_clear(admin_record *r)
{
	free(r->response_headers);
	if (r->res)
		PQclear(r->res);
	memset(r, 0, sizeof *r);
}

/* The branches are disjoint on the statement's snapshot. If an attempt
 * changes the row in between (a claim takes a released key, an answer
 * completes a processing one), the branch whose condition no longer holds
 * on the new row version does nothing and the statement returns no row:
 * the caller reads again. The owner token is kept on release, so a late
 * answer of the released attempt may still be recorded unless another
 * attempt takes the key over first (the same rule as the reaper's). An
 * attempt whose lease is alive is only released when forced ($4): a retry
 * would otherwise be sent upstream beside it. A held attempt's lease has
 * ended, so it is released without force. */
#define SCOPE "WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
static const char delete_sql[] =
	"WITH live AS (SELECT " TS("lease_until") " AS until "
	"FROM idempotency_records " SCOPE "AND state = 'processing' "
	"AND lease_until > now() AND NOT $4::boolean), "
	"rel AS (UPDATE idempotency_records "
	"SET state = 'released', lease_until = NULL, updated_at = now() "
	SCOPE "AND state = 'processing' AND ($4::boolean OR lease_until IS "
	"NULL OR lease_until <= now()) RETURNING 'released'::text AS action, "
	"'processing'::text AS previous, NULL::text AS until), "
	"del AS (DELETE FROM idempotency_records " SCOPE
	"AND state <> 'processing' RETURNING 'purged'::text, state, "
	"NULL::text) "
	"SELECT action, previous, until FROM rel UNION ALL SELECT * FROM del "
	"UNION ALL SELECT 'in_flight', 'processing', until FROM live "
	"UNION ALL SELECT 'absent', '', NULL WHERE NOT EXISTS (SELECT 1 FROM "
	"idempotency_records " SCOPE ")";
#undef SCOPE

#define DELETE_ROUNDS 5

static enum admin_delete_action delete_action(const char *a)
{
	return !strcmp(a, "released")	 ? ADMIN_DEL_RELEASED
	       : !strcmp(a, "purged")	 ? ADMIN_DEL_PURGED
	       : !strcmp(a, "in_flight") ? ADMIN_DEL_IN_FLIGHT
					 : ADMIN_DEL_ABSENT;
}

int store_admin_delete(store_admin *s, const char *tenant,
		       const char *operation, const char *key, bool force,
		       admin_delete_result *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	/* Replace a connection that broke while idle before writing: the
	 * write itself is never sent twice, since a repeated DELETE after a
	 * release that did commit would purge the record. */
	PGresult *r = query(s, "ping", "SELECT 1", 0, NULL, true,
			    PGRES_TUPLES_OK, err, errlen);
	if (!r)
		return -1;
	PQclear(r);
	const char *vals[4] = {tenant, operation, key, force ? "t" : "f"};
	for (int round = 0; round < DELETE_ROUNDS; round++) {
		r = query(s, "delete", delete_sql, 4, vals, false,
			  PGRES_TUPLES_OK, err, errlen);
		if (!r)
			return -1;
		if (PQntuples(r) == 0) {
			PQclear(r);
			continue;
		}
		out->action = delete_action(PQgetvalue(r, 0, 0));
		snprintf(out->previous_state, sizeof out->previous_state, "%s",
			 PQgetvalue(r, 0, 1));
		snprintf(out->lease_until, sizeof out->lease_until, "%s",
			 PQgetvalue(r, 0, 2));
		PQclear(r);
		return 0;
	}
	snprintf(err, errlen, "delete: the record kept changing; try again");
	return -1;
}

/* ---- The key listing ------------------------------------------------- */

/* A processing record whose attempt's outcome is held for an operator:
 * its lease ended on an on_unknown = "hold" route (idem_claim's "held"). */
#define HELD \
	"(state = 'processing' AND hold_on_unknown AND lease_until <= now())"
#define WALK_KEY "created_at, tenant, operation, idem_key"

/* The columns a listed record shows (admin_list_row), in order. */
#define CREATED TS("created_at")
static const char list_cols[] =
	"tenant, operation, idem_key, "
	"CASE WHEN " HELD " THEN 'held' ELSE state::text END, attempt, "
	CREATED ", round(extract(epoch FROM now() - created_at)::numeric, 3)"
	"::text, "
	"CASE WHEN state <> 'completed' THEN NULL "
	"WHEN response_status = 0 THEN 'executed' "
	"ELSE (response_status / 100)::text || 'xx' END, "
	"CASE WHEN state = 'processing' THEN greatest(ceil(extract(epoch FROM "
	"lease_until - now()) * 1000), 0)::int8 END, "
	"hold_on_unknown, expires_at <= now()";

static const char *const state_filters[] = {
	[ADMIN_LIST_ANY] = NULL,
	[ADMIN_LIST_PROCESSING] = "state = 'processing' AND NOT " HELD,
	[ADMIN_LIST_HELD] = HELD,
	[ADMIN_LIST_RELEASED] = "state = 'released'",
	[ADMIN_LIST_COMPLETED] = "state = 'completed'",
};

typedef struct list_sql {
	growbuf sql;
	const char *vals[8];
	int n;
} list_sql;

/* Appends "$k" for a new parameter v. */
static void param(list_sql *q, const char *v)
{
	q->vals[q->n++] = v;
	growbuf_printf(&q->sql, "$%d", q->n);
}

/* The walk: a range of the created_at index from the cursor, in order,
 * bounded; nothing but the range and the age in its WHERE, so that its
 * LIMIT bounds the rows read. */
static void walk_sql(list_sql *q, const admin_list_req *r, char *older)
{
	const char *dir = r->newest ? " DESC" : "";
	growbuf_puts(&q->sql,
		     "WITH walk AS MATERIALIZED (SELECT " WALK_KEY
		     ", state, attempt, response_status, lease_until, "
		     "hold_on_unknown, expires_at FROM idempotency_records "
		     "WHERE true");
	if (r->after) {
		growbuf_printf(&q->sql, " AND (" WALK_KEY ") %s (",
			       r->newest ? "<" : ">");
		param(q, r->after->v[0]);
		growbuf_puts(&q->sql, "::timestamptz");
		for (int i = 1; i < 4; i++) {
			growbuf_puts(&q->sql, ", ");
			param(q, r->after->v[i]);
		}
		growbuf_puts(&q->sql, ")");
	}
	if (r->older_than_ms >= 0) {
		snprintf(older, 24, "%lld", (long long)r->older_than_ms);
		growbuf_puts(&q->sql, " AND created_at < now() - ");
		param(q, older);
		growbuf_puts(&q->sql, "::int8 * interval '1 millisecond'");
	}
	growbuf_printf(&q->sql,
		       " ORDER BY created_at%s, tenant%s, operation%s, "
		       "idem_key%s LIMIT %d)",
		       dir, dir, dir, dir, ADMIN_LIST_WALK);
}

/* The rows of the walk the filters keep (one more than a page, to know
 * whether the page is full), then the last row walked (flag true) and
 * the walk's count. */
static void list_build(list_sql *q, const admin_list_req *r, char *older)
{
	const char *dir = r->newest ? " DESC" : "";
	walk_sql(q, r, older);
	growbuf_printf(&q->sql, ", hit AS (SELECT * FROM walk WHERE true");
	if (state_filters[r->state])
		growbuf_printf(&q->sql, " AND %s", state_filters[r->state]);
	if (r->tenant) {
		growbuf_puts(&q->sql, " AND tenant = ");
		param(q, r->tenant);
	}
	if (r->operation) {
		growbuf_puts(&q->sql, " AND operation = ");
		param(q, r->operation);
	}
	growbuf_printf(&q->sql,
		       " ORDER BY created_at%s, tenant%s, operation%s, "
		       "idem_key%s LIMIT %d), ",
		       dir, dir, dir, dir, r->limit + 1);
	growbuf_printf(&q->sql,
		       "last AS (SELECT * FROM walk ORDER BY created_at%s, "
		       "tenant%s, operation%s, idem_key%s LIMIT 1) ",
		       r->newest ? "" : " DESC", r->newest ? "" : " DESC",
		       r->newest ? "" : " DESC", r->newest ? "" : " DESC");
	growbuf_printf(&q->sql,
		       "SELECT last, %s, walked FROM (SELECT false AS last, "
		       "hit.* FROM hit UNION ALL SELECT true, last.* FROM "
		       "last) u, (SELECT count(*)::int4 AS walked FROM walk) "
		       "c ORDER BY last, created_at%s, tenant%s, operation%s, "
		       "idem_key%s",
		       list_cols, dir, dir, dir, dir);
}

static void list_row(PGresult *r, int i, admin_list_row *o)
{
	const char *lease = PQgetisnull(r, i, 9) ? NULL : PQgetvalue(r, i, 9);
	o->tenant = PQgetvalue(r, i, 1);
	o->operation = PQgetvalue(r, i, 2);
	o->key = PQgetvalue(r, i, 3);
	o->state = PQgetvalue(r, i, 4);
	o->attempt = atoi(PQgetvalue(r, i, 5));
	o->created_at = PQgetvalue(r, i, 6);
	o->age_s = PQgetvalue(r, i, 7);
	o->outcome = PQgetisnull(r, i, 8) ? NULL : PQgetvalue(r, i, 8);
	o->lease_left_ms = lease ? strtoll(lease, NULL, 10) : -1;
	o->hold_on_unknown = PQgetvalue(r, i, 10)[0] == 't';
	o->expired = PQgetvalue(r, i, 11)[0] == 't';
}

/* The page: the rows kept, at most limit; the next page starts after the
 * last row of a full page, or after the last row walked when the walk
 * stopped at its bound; a walk that reached the end has no next page. */
static void list_page(PGresult *r, const admin_list_req *q, admin_list *out)
{
	int n = PQntuples(r);
	int hits = n > 0 && PQgetvalue(r, n - 1, 0)[0] == 't' ? n - 1 : n;
	out->walked = n > 0 ? atoi(PQgetvalue(r, 0, 12)) : 0;
	size_t kept = hits > q->limit ? (size_t)q->limit : (size_t)hits;
	out->rows = xcalloc(kept ? kept : 1, sizeof *out->rows);
	for (size_t i = 0; i < kept; i++)
		list_row(r, (int)i, &out->rows[i]);
	out->n = kept;
	int from = -1;
	if (hits > q->limit)
		from = q->limit - 1;
	else if (out->walked >= ADMIN_LIST_WALK)
		from = n - 1;
	out->more = from >= 0;
	if (!out->more)
		return;
	out->next.v[0] = PQgetvalue(r, from, 6);
	for (int k = 1; k < 4; k++)
		out->next.v[k] = PQgetvalue(r, from, k);
}

int store_admin_list_sql(const admin_list_req *q, growbuf *sql,
			 const char *vals[8], char older[24])
{
	list_sql b = {0};
	list_build(&b, q, older);
	*sql = b.sql;
	memcpy(vals, b.vals, sizeof b.vals);
	return b.n;
}

int store_admin_list(store_admin *s, const admin_list_req *q, admin_list *out,
		     char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	growbuf sql;
	const char *vals[8];
	char older[24];
	int n = store_admin_list_sql(q, &sql, vals, older);
	PGresult *r = query(s, "list", sql.data, n, vals, true, PGRES_TUPLES_OK,
			    err, errlen);
	growbuf_free(&sql);
	if (!r)
		return -1;
	out->res = r;
	list_page(r, q, out);
	return 0;
}

void store_admin_list_clear(admin_list *l)
{
	free(l->rows);
	if (l->res)
		PQclear(l->res);
	memset(l, 0, sizeof *l);
}

/* ---- Settling a key -------------------------------------------------- */

static const char pending_sql[] =
	"SELECT state, attempt, owner_token::text, "
	"state = 'processing' AND lease_until > now(), "
	"encode(request_hash, 'hex') FROM idempotency_records "
	"WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	"AND (expires_at > now() OR (state = 'processing' "
	"AND lease_until > now()))";

int store_admin_pending(store_admin *s, const char *tenant,
			const char *operation, const char *key,
			admin_pending *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	const char *vals[3] = {tenant, operation, key};
	PGresult *r = query(s, "read", pending_sql, 3, vals, true,
			    PGRES_TUPLES_OK, err, errlen);
	if (!r)
		return -1;
	if (PQntuples(r) == 1) {
		out->found = true;
		snprintf(out->state, sizeof out->state, "%s",
			 PQgetvalue(r, 0, 0));
		out->attempt = atoi(PQgetvalue(r, 0, 1));
		snprintf(out->owner_token, sizeof out->owner_token, "%s",
			 PQgetvalue(r, 0, 2));
		out->lease_alive = PQgetvalue(r, 0, 3)[0] == 't';
		size_t n;
		char *h = unhex(PQgetvalue(r, 0, 4), &n);
		if (n == sizeof out->request_hash)
			memcpy(out->request_hash, h, n);
		free(h);
	}
	PQclear(r);
	return 0;
}

/* Completes the record only as the operator saw it: processing, at the
 * attempt (or owner token) and request hash given, lease ended, not
 * expired. A takeover, a late answer of the attempt itself, the reaper
 * or another operator that changed it first make it write nothing. */
static const char resolve_sql[] =
	"UPDATE idempotency_records SET state = 'completed', "
	"response_status = $4::int4, response_headers = $5, "
	"response_body = $6, replayable = $7::boolean, seal_key = $8, "
	"updated_at = now() "
	"WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	"AND state = 'processing' AND lease_until <= now() "
	"AND expires_at > now() AND request_hash = $9 "
	"AND (attempt = $10::int4 OR owner_token = $11::uuid)";

static enum admin_resolve_end resolve_why(const admin_resolve_req *q,
					  const admin_pending *p)
{
	if (!p->found)
		return ADMIN_RES_ABSENT;
	if (strcmp(p->state, "processing"))
		return ADMIN_RES_NOT_PENDING;
	bool same = q->attempt > 0 ? p->attempt == q->attempt
				   : !strcmp(p->owner_token, q->owner_token);
	if (!same ||
	    memcmp(p->request_hash, q->request_hash, sizeof p->request_hash))
		return ADMIN_RES_STALE;
	if (p->lease_alive)
		return ADMIN_RES_IN_FLIGHT;
	return ADMIN_RES_STALE; /* changed and changed back meanwhile */
}

int store_admin_resolve(store_admin *s, const admin_resolve_req *q,
			enum admin_resolve_end *end, admin_pending *now,
			char *err, size_t errlen)
{
	char status[16], attempt[16];
	snprintf(status, sizeof status, "%d", q->status);
	snprintf(attempt, sizeof attempt, "%d", q->attempt);
	bool response = q->status != 0;
	const char *vals[11] = {q->tenant,
				q->operation,
				q->key,
				status,
				response ? q->headers : NULL,
				q->body,
				response ? "t" : "f",
				q->seal_key,
				q->request_hash,
				q->attempt > 0 ? attempt : NULL,
				q->attempt > 0 ? NULL : q->owner_token};
	int lens[11] = {0, 0,  0, 0, (int)q->headers_len, (int)q->body_len, 0,
			0, 32, 0, 0};
	int fmts[11] = {0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0};
	/* Never sent twice: query_fmt repeats nothing (may_repeat false). */
	PGresult *r = query_fmt(s, "resolve", resolve_sql, 11, vals, lens, fmts,
				false, PGRES_COMMAND_OK, err, errlen);
	if (!r)
		return -1;
	bool wrote = atoi(PQcmdTuples(r)) == 1;
	PQclear(r);
	*end = ADMIN_RES_DONE;
	memset(now, 0, sizeof *now);
	if (wrote)
		return 0;
	if (store_admin_pending(s, q->tenant, q->operation, q->key, now, err,
				errlen))
		return -1;
	*end = resolve_why(q, now);
	return 0;
}
