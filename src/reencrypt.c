#include "reencrypt.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "pg_link.h"
#include "seal.h"
#include "util.h"

#define OID_INT4 23
#define OID_TEXT 25

/* Completed records not under the active key ($1), in primary-key order
 * from the cursor on; not a stripped tombstone (nothing left to seal). */
#define RE_COLS                                                                \
	"SELECT tenant, operation, idem_key, request_hash, response_status, "  \
	"response_headers, response_body FROM idempotency_records "          \
	"WHERE state = 'completed' AND seal_key IS DISTINCT FROM $1 "         \
	"AND replay_until IS DISTINCT FROM '-infinity' "
#define RE_TAIL                                                                \
	" ORDER BY tenant, operation, idem_key LIMIT $2 FOR UPDATE SKIP LOCKED"

static const char first_sql[] = RE_COLS RE_TAIL;
static const char next_sql[] =
	RE_COLS "AND (tenant, operation, idem_key) > ($3, $4, $5)" RE_TAIL;

static const char update_sql[] =
	"UPDATE idempotency_records SET response_headers = $4, "
	"response_body = $5, seal_key = $6 "
	"WHERE tenant = $1 AND operation = $2 AND idem_key = $3 "
	"AND state = 'completed'";

static const char left_sql[] =
	"SELECT seal_key, count(*) FROM idempotency_records "
	"WHERE state = 'completed' AND seal_key IS DISTINCT FROM $1 "
	"AND replay_until IS DISTINCT FROM '-infinity' "
	"GROUP BY 1 ORDER BY 1 NULLS FIRST";

/* The batch's seals, added to the key's count in the batch's transaction
 * (idemproxy_seal_counts: every seal draws a nonce of the key's budget). */
static const char count_sql[] =
	"INSERT INTO idemproxy_seal_counts AS c (seal_key, seals) "
	"VALUES ($1, $2::int8) ON CONFLICT (seal_key) DO UPDATE "
	"SET seals = c.seals + EXCLUDED.seals, updated_at = now()";

typedef struct re_ctx {
	pg_link link;
	const seal_keyring *keys;
	FILE *out, *errs;
	char *err;
	size_t errlen;
	growbuf plain_h, plain_b, sealed_h, sealed_b;
	long resealed, unreadable;
	long batch_seals; /* seals of the batch in hand */
	/* tenant, operation, key of the last row, whole: a cut copy sorts
	 * before its row, which a batch that leaves the row as it is would
	 * then select again, forever. */
	char *cursor[3];
	bool started;
} re_ctx;

/* The statement's error, or why there was no answer. */
static const char *re_error(re_ctx *x, const PGresult *r)
{
	return r ? PQresultErrorMessage(r) : pg_link_error(&x->link);
}

/* After a failed statement inside the batch's transaction. */
static void re_rollback(re_ctx *x)
{
	if (x->link.conn)
		PQclear(pg_link_exec(&x->link, "ROLLBACK"));
}

static int re_simple(re_ctx *x, const char *sql)
{
	PGresult *r = pg_link_exec(&x->link, sql);
	int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc)
		pg_link_err(x->err, x->errlen, sql, re_error(x, r));
	PQclear(r);
	return rc;
}

static int32_t get_i32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return (int32_t)ntohl(v);
}

/* Opens row i (if sealed) into plain_h / plain_b, or takes it as stored.
 * -1 with why when it does not open. */
static int re_open(re_ctx *x, PGresult *r, int i, const seal_scope *sc,
		   char *why, size_t whylen)
{
	const char *h = PQgetvalue(r, i, 5), *b = PQgetvalue(r, i, 6);
	size_t hl = (size_t)PQgetlength(r, i, 5);
	size_t bl = (size_t)PQgetlength(r, i, 6);
	growbuf_reset(&x->plain_h);
	growbuf_reset(&x->plain_b);
	if (!seal_is_sealed(h, hl)) {
		growbuf_append(&x->plain_h, h, hl);
		growbuf_append(&x->plain_b, b, bl);
		return 0;
	}
	if (seal_open(x->keys, sc, SEAL_HEADERS, h, hl, &x->plain_h, why,
		      whylen) < 0)
		return -1;
	if (bl == 0)
		return 0;
	return seal_open(x->keys, sc, SEAL_BODY, b, bl, &x->plain_b, why,
			 whylen);
}

static int re_row(re_ctx *x, PGresult *r, int i)
{
	const char *tenant = PQgetvalue(r, i, 0);
	const char *op = PQgetvalue(r, i, 1);
	const char *key = PQgetvalue(r, i, 2);
	bool has_body = PQgetlength(r, i, 6) > 0;
	if (PQgetlength(r, i, 3) != SEAL_HASH_LEN || PQgetisnull(r, i, 4)) {
		fprintf(x->errs,
			"reencrypt: tenant=%s operation=%s key=%s: no "
			"fingerprint or status; left as it is\n",
			tenant, op, key);
		x->unreadable++;
		return 0;
	}
	seal_scope sc = {tenant, op, key,
			 (const uint8_t *)PQgetvalue(r, i, 3),
			 get_i32(PQgetvalue(r, i, 4)), has_body};
	char why[256];
	if (re_open(x, r, i, &sc, why, sizeof why) < 0) {
		fprintf(x->errs,
			"reencrypt: tenant=%s operation=%s key=%s: %s; left "
			"as it is\n",
			tenant, op, key, why);
		x->unreadable++;
		return 0;
	}
	seal_seal(x->keys, &sc, SEAL_HEADERS, x->plain_h.data, x->plain_h.len,
		  &x->sealed_h);
	growbuf_reset(&x->sealed_b);
	if (has_body)
		seal_seal(x->keys, &sc, SEAL_BODY, x->plain_b.data,
			  x->plain_b.len, &x->sealed_b);
	x->batch_seals += has_body ? 2 : 1;
	const char *vals[6] = {tenant, op, key, x->sealed_h.data,
			       x->sealed_b.data ? x->sealed_b.data : "",
			       seal_keyring_active(x->keys)};
	int lens[6] = {0, 0, 0, (int)x->sealed_h.len, (int)x->sealed_b.len, 0};
	int fmts[6] = {0, 0, 0, 1, 1, 0};
	PGresult *u = pg_link_exec_params(&x->link, update_sql, 6, NULL, vals,
					  lens, fmts, 0);
	int rc = PQresultStatus(u) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc)
		pg_link_err(x->err, x->errlen, "reencrypt update",
			    re_error(x, u));
	else
		x->resealed++;
	PQclear(u);
	return rc;
}

static int re_count(re_ctx *x)
{
	if (!x->batch_seals)
		return 0;
	char n[24];
	snprintf(n, sizeof n, "%ld", x->batch_seals);
	const char *vals[2] = {seal_keyring_active(x->keys), n};
	PGresult *r = PQexecParams(x->link.conn, count_sql, 2, NULL, vals,
				   NULL, NULL, 0);
	int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc)
		pg_link_err(x->err, x->errlen, "reencrypt seal count",
			    PQresultErrorMessage(r));
	PQclear(r);
	x->batch_seals = 0;
	return rc;
}

/* One batch in one transaction. *rows: how many the batch selected. */
static int re_batch(re_ctx *x, int batch, int *rows)
{
	*rows = 0;
	if (re_simple(x, "BEGIN") < 0)
		return -1;
	char lim[16];
	snprintf(lim, sizeof lim, "%d", batch);
	const char *vals[5] = {seal_keyring_active(x->keys), lim,
			       x->cursor[0], x->cursor[1], x->cursor[2]};
	Oid types[5] = {OID_TEXT, OID_INT4, OID_TEXT, OID_TEXT, OID_TEXT};
	PGresult *r = pg_link_exec_params(&x->link,
					  x->started ? next_sql : first_sql,
					  x->started ? 5 : 2, types, vals, NULL,
					  NULL, 1);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(x->err, x->errlen, "reencrypt select",
			    re_error(x, r));
		PQclear(r);
		re_rollback(x);
		return -1;
	}
	int n = PQntuples(r);
	for (int i = 0; i < n; i++) {
		if (re_row(x, r, i) < 0) {
			PQclear(r);
			re_rollback(x);
			return -1;
		}
	}
	if (n > 0) {
		for (int c = 0; c < 3; c++) {
			free(x->cursor[c]);
			x->cursor[c] = xstrdup(PQgetvalue(r, n - 1, c));
		}
		x->started = true;
	}
	PQclear(r);
	*rows = n;
	if (re_count(x) < 0) {
		PQclear(PQexec(x->link.conn, "ROLLBACK"));
		return -1;
	}
	return re_simple(x, "COMMIT");
}

/* The records still not under the active key, per key id. */
static int re_report(re_ctx *x, long *left)
{
	const char *vals[1] = {seal_keyring_active(x->keys)};
	PGresult *r = pg_link_exec_params(&x->link, left_sql, 1, NULL, vals,
					  NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(x->err, x->errlen, "reencrypt count",
			    re_error(x, r));
		PQclear(r);
		return -1;
	}
	*left = 0;
	for (int i = 0; i < PQntuples(r); i++) {
		long n = atol(PQgetvalue(r, i, 1));
		*left += n;
		if (PQgetisnull(r, i, 0))
			fprintf(x->out, "left in the clear: %ld\n", n);
		else
			fprintf(x->out, "left under key \"%s\": %ld\n",
				PQgetvalue(r, i, 0), n);
	}
	if (*left == 0)
		fprintf(x->out,
			"every completed record is sealed under \"%s\": the "
			"other keys can be removed from the key file\n",
			seal_keyring_active(x->keys));
	PQclear(r);
	return 0;
}

int reencrypt_run(const config *cfg, int batch, FILE *out, FILE *errs,
		  char *err, size_t errlen)
{
	if (!cfg->seal) {
		snprintf(err, errlen,
			 "store_encryption is not configured: nothing to "
			 "seal records under");
		return -1;
	}
	re_ctx x = {.keys = cfg->seal, .out = out, .errs = errs, .err = err,
		    .errlen = errlen};
	pg_link_init(&x.link, cfg->db_url, "idemproxy-reencrypt",
		     cfg->statement_timeout_ms);
	int rc = -1;
	if (pg_link_connect(&x.link, NULL, err, errlen))
		goto out;
	fprintf(out, "reencrypt: sealing under \"%s\", %d records a batch\n",
		seal_keyring_active(x.keys), batch);
	for (int n = batch; n == batch;) {
		if (re_batch(&x, batch, &n) < 0)
			goto out;
		fprintf(out, "reencrypt: %ld re-sealed, %ld unreadable so far\n",
			x.resealed, x.unreadable);
		fflush(out);
	}
	long left;
	if (re_report(&x, &left) < 0)
		goto out;
	rc = left ? 1 : 0;
out:
	pg_link_close(&x.link);
	growbuf_free(&x.plain_h);
	growbuf_free(&x.plain_b);
	growbuf_free(&x.sealed_h);
	growbuf_free(&x.sealed_b);
	for (int c = 0; c < 3; c++)
		free(x.cursor[c]);
	return rc;
}
