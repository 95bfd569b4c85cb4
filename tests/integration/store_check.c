/* Store-level checks that the black box cannot reach: an attempt whose lease
 * was taken over can no longer write the record (complete and release are
 * fenced by the owner token), a held key is not taken over, and a claim that
 * replays or rejects writes nothing.
 *
 * Usage: store_check DATABASE_URL (a migrated database). Prints one line per
 * check; exits 0, or 1 with a message saying what differed. */
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin_keys.h"
#include "store_pg.h"

#define TENANT "store-check"
#define OPERATION "op"
#define TTL_MS (3600 * 1000)

static const char *current = "setup";
static PGconn *db;

static void fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "store_check: %s: FAIL: ", current);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void uuid_text(const uint8_t *u, char out[37])
{
	static const char hex[] = "0123456789abcdef";
	char *p = out;
	for (int i = 0; i < STORE_TOKEN_LEN; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[u[i] >> 4];
		*p++ = hex[u[i] & 15];
	}
	*p = '\0';
}

static const char *decision_name(enum claim_decision d)
{
	switch (d) {
	case CLAIM_FORWARD:
		return "forward";
	case CLAIM_TAKEOVER:
		return "takeover";
	case CLAIM_REPLAY:
		return "replay";
	case CLAIM_IN_FLIGHT:
		return "in_flight";
	case CLAIM_HELD:
		return "held";
	case CLAIM_MISMATCH:
		return "mismatch";
	case CLAIM_EXPIRED:
		return "expired";
	}
	return "?";
}

/* The row as SQL sees it, including its physical identity: a new row version
 * (any UPDATE, even a no-op one) changes xmin and ctid, a row lock sets xmax. */
typedef struct row {
	char state[16];
	char owner[37];
	int attempt;
	int status; /* -1: NULL */
	char body[256];
	int lease_null;
	int replayable; /* -1: NULL */
	char xmin[32], xmax[32], ctid[32];
} row;

static void read_row(const char *key, row *out)
{
	const char *vals[3] = {TENANT, OPERATION, key};
	PGresult *r = PQexecParams(
		db,
		"SELECT state, owner_token::text, attempt, "
		"coalesce(response_status, -1), "
		"coalesce(convert_from(response_body, 'UTF8'), ''), "
		"(lease_until IS NULL)::int, "
		"coalesce(replayable::int, -1), xmin::text, xmax::text, "
		"ctid::text FROM idempotency_records WHERE tenant = $1 AND "
		"operation = $2 AND idem_key = $3",
		3, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fail("reading the row: %s", PQresultErrorMessage(r));
	if (PQntuples(r) != 1)
		fail("expected one row for key %s, found %d", key,
		     PQntuples(r));
	memset(out, 0, sizeof *out);
	snprintf(out->state, sizeof out->state, "%s", PQgetvalue(r, 0, 0));
	snprintf(out->owner, sizeof out->owner, "%s", PQgetvalue(r, 0, 1));
	out->attempt = atoi(PQgetvalue(r, 0, 2));
	out->status = atoi(PQgetvalue(r, 0, 3));
	snprintf(out->body, sizeof out->body, "%s", PQgetvalue(r, 0, 4));
	out->lease_null = atoi(PQgetvalue(r, 0, 5));
	out->replayable = atoi(PQgetvalue(r, 0, 6));
	snprintf(out->xmin, sizeof out->xmin, "%s", PQgetvalue(r, 0, 7));
	snprintf(out->xmax, sizeof out->xmax, "%s", PQgetvalue(r, 0, 8));
	snprintf(out->ctid, sizeof out->ctid, "%s", PQgetvalue(r, 0, 9));
	PQclear(r);
}

static void expect_untouched(const row *before, const char *key,
			     const char *after_what)
{
	row now;
	read_row(key, &now);
	if (strcmp(before->xmin, now.xmin) || strcmp(before->ctid, now.ctid) ||
	    strcmp(before->xmax, now.xmax))
		fail("%s wrote the row: xmin %s -> %s, xmax %s -> %s, "
		     "ctid %s -> %s",
		     after_what, before->xmin, now.xmin, before->xmax,
		     now.xmax, before->ctid, now.ctid);
}

static void expect_row(const char *key, const char *state,
		       const uint8_t *owner, int attempt)
{
	row r;
	read_row(key, &r);
	char want_owner[37];
	uuid_text(owner, want_owner);
	if (strcmp(r.state, state))
		fail("key %s: state %s, expected %s", key, r.state, state);
	if (strcmp(r.owner, want_owner))
		fail("key %s: owner %s, expected %s", key, r.owner,
		     want_owner);
	if (r.attempt != attempt)
		fail("key %s: attempt %d, expected %d", key, r.attempt,
		     attempt);
}

static void claim_as(store *s, const char *key, const uint8_t *hash,
		     int64_t lease_ms, bool hold, const uint8_t *owner,
		     enum claim_decision want, claim_result *out)
{
	claim_req req = {
		.tenant = TENANT,
		.operation = OPERATION,
		.key = key,
		.hash = hash,
		.lease_ms = lease_ms,
		.ttl_ms = TTL_MS,
		.hold_on_unknown = hold,
		.owner = owner,
	};
	char err[256];
	if (store_claim(s, &req, out, err, sizeof err))
		fail("claim %s: %s", key, err);
	if (out->decision != want)
		fail("claim %s: decision %s, expected %s", key,
		     decision_name(out->decision), decision_name(want));
	if ((want == CLAIM_FORWARD || want == CLAIM_TAKEOVER) &&
	    memcmp(out->owner, owner, STORE_TOKEN_LEN))
		fail("claim %s: the owner is not the token passed in", key);
}

static void claim(store *s, const char *key, const uint8_t *hash,
		  int64_t lease_ms, bool hold, enum claim_decision want,
		  claim_result *out)
{
	uint8_t owner[STORE_TOKEN_LEN];
	store_new_token(owner);
	claim_as(s, key, hash, lease_ms, hold, owner, want, out);
}

static void complete(store *s, const char *key, const uint8_t *owner,
		     const char *body, bool want_fenced)
{
	record_key k = {TENANT, OPERATION, key, owner, false};
	static const char headers[] = "Content-Type: application/json\r\n";
	bool fenced = !want_fenced;
	char err[256];
	if (store_complete(s, &k, 201, headers, strlen(headers), body,
			   strlen(body), true, NULL, &fenced, err, sizeof err))
		fail("complete %s: %s", key, err);
	if (fenced != want_fenced)
		fail("complete %s: fenced=%d, expected %d", key, fenced,
		     want_fenced);
}

static void release(store *s, const char *key, const uint8_t *owner,
		    bool want_fenced)
{
	record_key k = {TENANT, OPERATION, key, owner, false};
	bool fenced = !want_fenced;
	char err[256];
	if (store_release(s, &k, &fenced, err, sizeof err))
		fail("release %s: %s", key, err);
	if (fenced != want_fenced)
		fail("release %s: fenced=%d, expected %d", key, fenced,
		     want_fenced);
}

static const uint8_t hash_a[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
static const uint8_t hash_b[32] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9};

/* A lease of 1 ms is dead by the next claim: that claim takes the key over,
 * and from then on only the new owner may record. */
static void check_complete_is_fenced(store *s)
{
	current = "complete_is_fenced";
	const char *key = "fence-complete";
	claim_result c1, c2, c3;
	claim(s, key, hash_a, 1, false, CLAIM_FORWARD, &c1);
	if (c1.attempt != 1)
		fail("first claim: attempt %d", c1.attempt);
	sleep_ms(20);
	claim(s, key, hash_a, 60000, false, CLAIM_TAKEOVER, &c2);
	if (c2.attempt != 2)
		fail("takeover: attempt %d, expected 2", c2.attempt);
	if (!memcmp(c1.owner, c2.owner, STORE_TOKEN_LEN))
		fail("takeover kept the first owner token");
	expect_row(key, "processing", c2.owner, 2);

	row before;
	read_row(key, &before);
	complete(s, key, c1.owner, "{\"from\":\"first\"}", true);
	expect_untouched(&before, key, "a fenced complete");
	release(s, key, c1.owner, true);
	expect_untouched(&before, key, "a fenced release");
	expect_row(key, "processing", c2.owner, 2);

	complete(s, key, c2.owner, "{\"from\":\"second\"}", false);
	row done;
	read_row(key, &done);
	if (strcmp(done.state, "completed") || done.status != 201 ||
	    strcmp(done.body, "{\"from\":\"second\"}") ||
	    /* complete keeps the end of the last lease (006: a HOT update) */
	    done.lease_null ||
	    done.replayable != 1 || done.attempt != 2)
		fail("after the owner's complete: state %s status %d body %s "
		     "lease_null %d replayable %d attempt %d",
		     done.state, done.status, done.body, done.lease_null,
		     done.replayable, done.attempt);

	claim(s, key, hash_a, 60000, false, CLAIM_REPLAY, &c3);
	if (c3.status != 201 || c3.body_len != strlen(done.body) ||
	    memcmp(c3.body, done.body, c3.body_len) || !c3.replayable)
		fail("replay: status %d, %zu body bytes, replayable %d",
		     c3.status, c3.body_len, c3.replayable);
	claim_result_clear(&c3);

	/* A completed record is final, even for its own owner. */
	complete(s, key, c2.owner, "{\"from\":\"again\"}", true);
	release(s, key, c2.owner, true);
	complete(s, key, c1.owner, "{\"from\":\"first\"}", true);
	expect_untouched(&done, key, "complete/release on a completed record");
	claim_result_clear(&c1);
	claim_result_clear(&c2);
	printf("ok %s\n", current);
}

static void check_release_is_fenced(store *s)
{
	current = "release_is_fenced";
	const char *key = "fence-release";
	claim_result c1, c2, c3;
	claim(s, key, hash_a, 1, false, CLAIM_FORWARD, &c1);
	sleep_ms(20);
	claim(s, key, hash_a, 1, false, CLAIM_TAKEOVER, &c2);

	row before;
	read_row(key, &before);
	release(s, key, c1.owner, true);
	expect_untouched(&before, key, "a stale owner's release");
	expect_row(key, "processing", c2.owner, 2);

	release(s, key, c2.owner, false);
	expect_row(key, "released", c2.owner, 2);
	row released;
	read_row(key, &released);
	complete(s, key, c1.owner, "{\"from\":\"first\"}", true);
	expect_untouched(&released, key, "a stale owner's complete");

	/* The released key is taken over again; both earlier owners are
	 * stale now. */
	claim(s, key, hash_a, 60000, false, CLAIM_TAKEOVER, &c3);
	if (c3.attempt != 3)
		fail("second takeover: attempt %d, expected 3", c3.attempt);
	row third;
	read_row(key, &third);
	complete(s, key, c2.owner, "{\"from\":\"second\"}", true);
	release(s, key, c1.owner, true);
	release(s, key, c2.owner, true);
	expect_untouched(&third, key, "stale owners' complete/release");
	expect_row(key, "processing", c3.owner, 3);
	complete(s, key, c3.owner, "{\"from\":\"third\"}", false);
	expect_row(key, "completed", c3.owner, 3);
	claim_result_clear(&c1);
	claim_result_clear(&c2);
	claim_result_clear(&c3);
	printf("ok %s\n", current);
}

/* Rejections and replays must not write: no new row version, no row lock. */
static void check_reads_do_not_write(store *s)
{
	current = "reads_do_not_write";
	const char *key = "reads";
	claim_result c1, c;
	claim(s, key, hash_a, 60000, false, CLAIM_FORWARD, &c1);
	row live;
	read_row(key, &live);
	claim(s, key, hash_a, 60000, false, CLAIM_IN_FLIGHT, &c);
	if (c.lease_left_ms <= 0 || c.lease_left_ms > 60000)
		fail("in flight: lease_left_ms %lld", (long long)c.lease_left_ms);
	claim_result_clear(&c);
	claim(s, key, hash_b, 60000, false, CLAIM_MISMATCH, &c);
	claim_result_clear(&c);
	expect_untouched(&live, key, "an in-flight or mismatch claim");

	complete(s, key, c1.owner, "{\"paid\":true}", false);
	row done;
	read_row(key, &done);
	for (int i = 0; i < 3; i++) {
		claim(s, key, hash_a, 60000, false, CLAIM_REPLAY, &c);
		claim_result_clear(&c);
	}
	claim(s, key, hash_b, 60000, false, CLAIM_MISMATCH, &c);
	claim_result_clear(&c);
	expect_untouched(&done, key, "a replay or mismatch claim");
	claim_result_clear(&c1);
	printf("ok %s\n", current);
}

/* on_unknown = hold: a dead lease is not taken over, and the attempt that
 * holds the key may still record its late answer. */
static void check_hold(store *s)
{
	current = "hold";
	const char *key = "hold";
	claim_result c1, c;
	claim(s, key, hash_a, 1, true, CLAIM_FORWARD, &c1);
	sleep_ms(20);
	row before;
	read_row(key, &before);
	for (int i = 0; i < 2; i++) {
		claim(s, key, hash_a, 60000, true, CLAIM_HELD, &c);
		claim_result_clear(&c);
	}
	expect_untouched(&before, key, "a claim on a held key");
	complete(s, key, c1.owner, "{\"late\":true}", false);
	expect_row(key, "completed", c1.owner, 1);
	claim_result_clear(&c1);
	printf("ok %s\n", current);
}

/* A claim repeated with the same owner token (its first try committed, but
 * the answer was lost with the connection) carries on as the same attempt,
 * and writes nothing; so does a repeated takeover. A complete or release
 * repeated after the first try committed is a success, not "fenced". */
/* The attempt's lease ends now, as if it had run out. */
static void end_lease(const char *key)
{
	const char *vals[3] = {TENANT, OPERATION, key};
	PGresult *r = PQexecParams(
		db,
		"UPDATE idempotency_records SET lease_until = now() - "
		"interval '1 millisecond' WHERE tenant = $1 AND operation = $2 "
		"AND idem_key = $3",
		3, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		fail("ending the lease: %s", PQresultErrorMessage(r));
	PQclear(r);
}

static void check_repeated_claim(store *s)
{
	current = "repeated_claim";
	const char *key = "repeat";
	uint8_t t1[STORE_TOKEN_LEN], t2[STORE_TOKEN_LEN];
	store_new_token(t1);
	store_new_token(t2);
	claim_result c;
	/* A repeat reads without writing only while its lease lives (after
	 * it, the repeat renews the lease: idem_claim, migration 009). */
	claim_as(s, key, hash_a, 60000, false, t1, CLAIM_FORWARD, &c);
	claim_result_clear(&c);
	row before;
	read_row(key, &before);
	claim_as(s, key, hash_a, 60000, false, t1, CLAIM_FORWARD, &c);
	if (c.attempt != 1)
		fail("repeated forward: attempt %d", c.attempt);
	claim_result_clear(&c);
	expect_untouched(&before, key, "a repeated forward");

	end_lease(key);
	claim_as(s, key, hash_a, 60000, false, t2, CLAIM_TAKEOVER, &c);
	claim_result_clear(&c);
	read_row(key, &before);
	claim_as(s, key, hash_a, 60000, false, t2, CLAIM_TAKEOVER, &c);
	if (c.attempt != 2 || c.lease_left_ms <= 0 || c.lease_left_ms > 60000)
		fail("repeated takeover: attempt %d lease_left_ms %lld",
		     c.attempt, (long long)c.lease_left_ms);
	claim_result_clear(&c);
	expect_untouched(&before, key, "a repeated takeover");
	/* The first attempt's token is stale now. */
	claim_as(s, key, hash_a, 60000, false, t1, CLAIM_IN_FLIGHT, &c);
	claim_result_clear(&c);

	record_key k = {TENANT, OPERATION, key, t2, true};
	bool fenced = true;
	char err[256];
	static const char h[] = "Location: /caf\xe9\r\n";
	for (int i = 0; i < 2; i++) {
		if (store_complete(s, &k, 201, h, strlen(h), "{}", 2, true, NULL,
				   &fenced, err, sizeof err))
			fail("repeated complete %d: %s", i, err);
		if (fenced)
			fail("repeated complete %d: fenced", i);
	}
	claim(s, key, hash_a, 60000, false, CLAIM_REPLAY, &c);
	if (c.headers_len != strlen(h) || memcmp(c.headers, h, c.headers_len))
		fail("replayed headers differ from the bytes recorded");
	claim_result_clear(&c);
	k.owner = t1;
	if (store_complete(s, &k, 201, h, strlen(h), "{}", 2, true, NULL, &fenced,
			   err, sizeof err) ||
	    !fenced)
		fail("a stale owner's repeated complete was not fenced");
	printf("ok %s\n", current);
}

/* store_check --list-sql NAME=VALUE...: the statement GET /admin/keys
 * sends for those query parameters, and its parameters, as JSON
 * {"sql": ..., "params": [...]}, for the tests that EXPLAIN it. */
static int list_sql(int argc, char **argv)
{
	admin_arg args[16];
	int n = 0;
	for (int i = 2; i < argc && n < 16; i++, n++) {
		char *eq = strchr(argv[i], '=');
		if (eq)
			*eq = '\0';
		args[n] = (admin_arg){argv[i], eq ? eq + 1 : NULL};
	}
	admin_list_args a;
	char err[512], older[24];
	if (admin_list_parse(args, (size_t)n, &a, err, sizeof err)) {
		fprintf(stderr, "store_check: %s\n", err);
		return 2;
	}
	growbuf sql;
	const char *vals[8];
	int k = store_admin_list_sql(&a.req, &sql, vals, older);
	json_t *p = json_array();
	for (int i = 0; i < k; i++)
		json_array_append_new(p, json_string(vals[i]));
	json_t *doc = json_pack("{s:s, s:o}", "sql", sql.data, "params", p);
	char *out = json_dumps(doc, JSON_COMPACT);
	printf("%s\n", out);
	free(out);
	json_decref(doc);
	growbuf_free(&sql);
	admin_list_args_free(&a);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "--list-sql"))
		return list_sql(argc, argv);
	if (argc != 2) {
		fprintf(stderr, "usage: store_check DATABASE_URL\n");
		return 2;
	}
	db = PQconnectdb(argv[1]);
	if (PQstatus(db) != CONNECTION_OK)
		fail("connect: %s", PQerrorMessage(db));
	store *s = store_new(argv[1], 5000);
	char err[256];
	if (store_ensure(s, err, sizeof err))
		fail("store_ensure: %s", err);
	check_complete_is_fenced(s);
	check_release_is_fenced(s);
	check_reads_do_not_write(s);
	check_hold(s);
	check_repeated_claim(s);
	store_free(s);
	PQfinish(db);
	printf("store_check: all checks passed\n");
	return 0;
}
