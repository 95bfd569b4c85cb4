/* The store's batch statements (store_pg_many.h): many attempts' claims
 * or records in one statement, their fields as array parameters. */
#include "store_pg_many.h"

#include <stdio.h>

#include "store_pg_int.h"

static void put_be32(growbuf *b, int32_t v)
{
	uint32_t n = htonl((uint32_t)v);
	growbuf_append(b, &n, 4);
}

/* A one-dimensional array parameter in PostgreSQL's binary form
 * (array_recv): dimensions, whether any element is NULL, the element
 * type, the length and lower bound; then each element's length (-1 for
 * NULL) and bytes. */
static void arr_start(growbuf *b, Oid elem, int n)
{
	growbuf_reset(b);
	put_be32(b, 1);
	put_be32(b, 0);
	put_be32(b, (int32_t)elem);
	put_be32(b, n);
	put_be32(b, 1);
}

static void arr_add(growbuf *b, const void *p, int len)
{
	put_be32(b, len);
	if (len > 0)
		growbuf_append(b, p, (size_t)len);
	if (len < 0) {
		uint32_t one = htonl(1);
		memcpy(b->data + 4, &one, 4);
	}
}

static void arr_add_str(growbuf *b, const char *s)
{
	arr_add(b, s, (int)strlen(s));
}

/* Runs a *_many statement over the arrays in s->arr. */
static PGresult *run_arrays(store *s, int st)
{
	const char *vals[10];
	int lens[10], fmts[10];
	for (int i = 0; i < store_stmts[st].nparams; i++) {
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
	static const Oid types[10] = {OID_TEXT,  OID_TEXT, OID_TEXT,
				      OID_BYTEA, OID_INT8, OID_INT8,
				      OID_BOOL,  OID_UUID, OID_INT8,
				      OID_BYTEA};
	for (int c = 0; c < 10; c++)
		arr_start(&s->arr[c], types[c], n);
	const uint8_t *owners[STORE_MANY_MAX];
	for (int i = 0; i < n; i++) {
		const claim_req *q = reqs[i];
		char lease[8], ttl[8], retain[8];
		char hold = q->hold_on_unknown ? 1 : 0;
		put_i64(lease, q->lease_ms);
		put_i64(ttl, q->ttl_ms);
		put_i64(retain, q->retain_ms);
		arr_add_str(&s->arr[0], q->tenant);
		arr_add_str(&s->arr[1], q->operation);
		arr_add_str(&s->arr[2], q->key);
		arr_add(&s->arr[3], q->hash, 32);
		arr_add(&s->arr[4], lease, 8);
		arr_add(&s->arr[5], ttl, 8);
		arr_add(&s->arr[6], &hold, 1);
		arr_add(&s->arr[7], q->owner, STORE_TOKEN_LEN);
		arr_add(&s->arr[8], retain, 8);
		arr_add(&s->arr[9], q->trace_id,
			q->trace_id ? STORE_TRACE_LEN : -1);
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
	ALWAYS_ASSERT(n > 0 && n <= STORE_MANY_MAX && !s->citus);
	bool was_connected = s->link.conn != NULL;
	int rc = claim_many_once(s, reqs, n, inserted, err, errlen);
	/* As claim_retried: an insert that did commit leaves its rows to
	 * their own owners, whom idem_claim recognises. */
	if (rc && was_connected && !s->link.conn)
		rc = claim_many_once(s, reqs, n, inserted, err, errlen);
	return rc;
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
	ALWAYS_ASSERT(n > 0 && n <= STORE_MANY_MAX);
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

