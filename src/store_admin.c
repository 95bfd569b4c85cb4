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
static PGresult *query(store_admin *s, const char *what, const char *sql,
		       int n, const char *const *vals, bool may_repeat,
		       ExecStatusType want, char *err, size_t errlen)
{
	for (int round = 0;; round++) {
		bool was_connected = s->link.conn != NULL;
		if (pg_link_connect(&s->link, NULL, err, errlen))
			return NULL;
		PGresult *r = pg_link_exec_params(&s->link, sql, n, NULL, vals,
						  NULL, NULL, 0);
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
	"E'\\n', ''), replayable, "
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
	out->response_expires_at = col(r, 17);
	out->tombstone = col_true(r, 18);
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
