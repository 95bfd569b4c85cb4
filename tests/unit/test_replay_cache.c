#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>

#include "replay_cache.h"
#include "siphash.h"

static const uint8_t H1[FP_LEN] = {1};
static const uint8_t H2[FP_LEN] = {2};
/* The raw form every put here carries. */
#define RAW "request-as-sent"
#define RAW2 "request-as-sent-other"

/* A put that carries the generation read just before it, as a worker's
 * does when nothing raced it. */
static void put_gen(replay_cache *c, const char *key, const uint8_t *hash,
		    const char *body, double expires, uint64_t gen)
{
	replay_key k = {"t", "op", key};
	replay_entry e = {.hash = hash,
			  .raw = RAW,
			  .raw_len = strlen(RAW),
			  .status = 201,
			  .headers = "Content-Type: a/b\r\n",
			  .headers_len = 19,
			  .body = body,
			  .body_len = strlen(body)};
	replay_cache_put(c, &k, &e, expires, gen);
}

static uint64_t gen_of(replay_cache *c, const char *key)
{
	replay_key k = {"t", "op", key};
	return replay_cache_generation(c, &k);
}

static void put(replay_cache *c, const char *key, const uint8_t *hash,
		const char *body, double expires)
{
	put_gen(c, key, hash, body, expires, gen_of(c, key));
}

static void forget(replay_cache *c, const char *key)
{
	replay_key k = {"t", "op", key};
	replay_cache_forget(c, &k);
}

static bool get(replay_cache *c, const char *key, const uint8_t *hash,
		double now, growbuf *body)
{
	replay_key k = {"t", "op", key};
	int status = 0;
	growbuf h = {0};
	bool hit = replay_cache_get(c, &k, hash, now, &status, &h, body);
	if (hit) {
		assert_int_equal(status, 201);
		assert_string_equal(h.data, "Content-Type: a/b\r\n");
	}
	growbuf_free(&h);
	return hit;
}

static void test_hit_needs_same_key_and_fingerprint(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	put(c, "k1", H1, "body-1", 1000);
	growbuf b = {0};
	assert_true(get(c, "k1", H1, 10, &b));
	assert_string_equal(b.data, "body-1");
	growbuf_reset(&b);
	assert_false(get(c, "k1", H2, 10, &b)); /* another payload */
	assert_false(get(c, "k2", H1, 10, &b)); /* another key */
	/* tenant and operation are part of the identity */
	replay_key other = {"t2", "op", "k1"};
	int st;
	growbuf h = {0};
	assert_false(replay_cache_get(c, &other, H1, 10, &st, &h, &b));
	replay_key ambiguous = {"t", "opk", "1"};
	assert_false(replay_cache_get(c, &ambiguous, H1, 10, &st, &h, &b));
	growbuf_free(&b);
	growbuf_free(&h);
	replay_cache_free(c);
}

static bool get_raw(replay_cache *c, const char *key, const char *raw,
		    double now)
{
	replay_key k = {"t", "op", key};
	int status = 0;
	growbuf h = {0}, b = {0};
	bool hit = replay_cache_get_raw(c, &k, raw, strlen(raw), now, &status,
					&h, &b);
	if (hit)
		assert_int_equal(status, 201);
	growbuf_free(&h);
	growbuf_free(&b);
	return hit;
}

/* The raw form finds the entry as the fingerprint does; another raw form
 * (a prefix of it too) misses, and an entry put without one is found only
 * by its fingerprint. */
static void test_raw_fingerprint_finds_the_same_entry(void **state)
{
	(void)state;
	replay_cache *c = replay_cache_new(1 << 20);
	replay_key k = {"t", "op", "k1"};
	assert_false(replay_cache_has(c, &k, 0));
	put(c, "k1", H1, "body1", 100);
	assert_true(replay_cache_has(c, &k, 0));
	assert_true(get_raw(c, "k1", RAW, 0));
	assert_false(get_raw(c, "k1", RAW2, 0));
	assert_false(get_raw(c, "k1", "request-as", 0));
	assert_false(get_raw(c, "k2", RAW, 0));
	assert_false(get_raw(c, "k1", RAW, 100)); /* expired */
	assert_false(replay_cache_has(c, &k, 100));

	replay_key k3 = {"t", "op", "k3"};
	replay_entry e = {.hash = H1, .status = 201, .body = "b", .body_len = 1};
	replay_cache_put(c, &k3, &e, 100, replay_cache_generation(c, &k3));
	assert_true(replay_cache_has(c, &k3, 0));
	assert_false(get_raw(c, "k3", RAW, 0));
	int status = 0;
	growbuf h = {0}, b = {0};
	assert_true(replay_cache_get(c, &k3, H1, 0, &status, &h, &b));
	assert_int_equal(status, 201);
	assert_int_equal(b.len, 1);
	growbuf_free(&h);
	growbuf_free(&b);
	replay_cache_free(c);
}

static void test_expired_entries_miss_and_go(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	put(c, "k1", H1, "x", 100);
	growbuf b = {0};
	assert_true(get(c, "k1", H1, 99.9, &b));
	assert_false(get(c, "k1", H1, 100, &b));
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 0);
	assert_int_equal(bytes, 0);
	growbuf_free(&b);
	replay_cache_free(c);
}

static void test_expired_entries_go_when_new_ones_come(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	double now = mono_ms();
	put(c, "old1", H1, "x", now - 1);
	put(c, "old2", H1, "x", now - 1);
	put(c, "live", H1, "x", now + 60000);
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 1); /* the two expired ones were dropped */
	growbuf b = {0};
	assert_true(get(c, "live", H1, now, &b));
	growbuf_free(&b);
	replay_cache_free(c);
}

static void test_forget_and_replace(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	put(c, "k1", H1, "old", 1000);
	put(c, "k1", H1, "new", 1000);
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 1);
	growbuf b = {0};
	assert_true(get(c, "k1", H1, 1, &b));
	assert_string_equal(b.data, "new");
	replay_key k = {"t", "op", "k1"};
	replay_cache_forget(c, &k);
	assert_false(get(c, "k1", H1, 1, &b));
	growbuf_free(&b);
	replay_cache_free(c);
}

static void test_bounded_in_bytes_oldest_first(void **state)
{
	replay_cache *c = replay_cache_new(4096);
	char key[32], body[600];
	memset(body, 'b', sizeof body - 1);
	body[sizeof body - 1] = '\0';
	for (int i = 0; i < 50; i++) {
		snprintf(key, sizeof key, "k%d", i);
		put(c, key, H1, body, 1000);
		size_t n, bytes;
		replay_cache_stats(c, &n, &bytes);
		assert_true(bytes <= 4096);
	}
	growbuf b = {0};
	assert_false(get(c, "k0", H1, 1, &b));  /* evicted */
	assert_true(get(c, "k49", H1, 1, &b));  /* newest kept */
	/* an entry larger than the whole cache is not stored */
	char *huge = xmalloc(8192);
	memset(huge, 'h', 8191);
	huge[8191] = '\0';
	put(c, "huge", H1, huge, 1000);
	assert_false(get(c, "huge", H1, 1, &b));
	free(huge);
	growbuf_free(&b);
	replay_cache_free(c);
}

/* The race of an admin DELETE with a worker: the worker misses the cache,
 * reads the generation, asks the store (which still has the record), and
 * the operator's forget lands before the worker's put. The put must not
 * bring the entry back. */
static void test_forget_between_store_read_and_put_wins(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	growbuf b = {0};
	assert_false(get(c, "k1", H1, 1, &b));   /* worker: cache miss */
	uint64_t g = gen_of(c, "k1");            /* worker: before the store */
	forget(c, "k1");                         /* admin: DELETE */
	put_gen(c, "k1", H1, "stale", 1000, g);  /* worker: after the store */
	assert_false(get(c, "k1", H1, 1, &b));
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 0);

	/* The same with an entry already cached when the forget comes. */
	put(c, "k2", H1, "cached", 1000);
	g = gen_of(c, "k2");
	forget(c, "k2");
	put_gen(c, "k2", H1, "stale", 1000, g);
	assert_false(get(c, "k2", H1, 1, &b));

	/* A request that starts after the forget caches again. */
	put(c, "k1", H1, "fresh", 1000);
	assert_true(get(c, "k1", H1, 1, &b));
	assert_string_equal(b.data, "fresh");
	growbuf_free(&b);
	replay_cache_free(c);
}

/* Shrinking evicts the oldest entries down to the new bound; 0 empties the
 * cache and stores nothing; growing lets entries in again. */
static void test_resize_evicts_down_to_the_new_bound(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	double later = mono_ms() + 60000; /* resizing also drops the expired */
	char key[32], body[600];
	memset(body, 'b', sizeof body - 1);
	body[sizeof body - 1] = '\0';
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof key, "k%d", i);
		put(c, key, H1, body, later);
	}
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 20);
	replay_cache_resize(c, 2048);
	replay_cache_stats(c, &n, &bytes);
	assert_true(bytes <= 2048 && n > 0 && n < 20);
	growbuf b = {0};
	assert_false(get(c, "k0", H1, 1, &b));
	assert_true(get(c, "k19", H1, 1, &b));
	replay_cache_resize(c, 0);
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 0);
	assert_int_equal(bytes, 0);
	put(c, "k20", H1, "x", later);
	assert_false(get(c, "k20", H1, 1, &b));
	replay_cache_resize(c, 1 << 20);
	put(c, "k20", H1, "x", later);
	assert_true(get(c, "k20", H1, 1, &b));
	growbuf_free(&b);
	replay_cache_free(c);
}

/* Each cache draws its own hash key: a key's bucket is not predictable from
 * outside. Eight keys all landing in the same bucket of two caches by chance
 * has odds of 2^-112. */
static void test_buckets_differ_between_caches(void **state)
{
	replay_cache *a = replay_cache_new(1 << 20);
	replay_cache *b = replay_cache_new(1 << 20);
	int differ = 0;
	for (int i = 0; i < 8; i++) {
		char key[16];
		snprintf(key, sizeof key, "key-%d", i);
		replay_key k = {"t", "op", key};
		if (replay_cache_bucket(a, &k) != replay_cache_bucket(b, &k))
			differ++;
	}
	assert_true(differ > 0);
	/* and the keyed caches still find what they hold */
	put(a, "k1", H1, "in-a", 1000);
	put(b, "k1", H1, "in-b", 1000);
	growbuf buf = {0};
	assert_true(get(a, "k1", H1, 1, &buf));
	assert_string_equal(buf.data, "in-a");
	growbuf_reset(&buf);
	assert_true(get(b, "k1", H1, 1, &buf));
	assert_string_equal(buf.data, "in-b");
	growbuf_free(&buf);
	replay_cache_free(a);
	replay_cache_free(b);
}

static void siphash_openssl(const uint8_t key[16], const uint8_t *p, size_t n,
			    uint8_t out[8])
{
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
	assert_non_null(mac);
	EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
	size_t size = 8, got = 0;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size),
		OSSL_PARAM_construct_end(),
	};
	assert_int_equal(EVP_MAC_init(ctx, key, 16, params), 1);
	assert_int_equal(EVP_MAC_update(ctx, p, n), 1);
	assert_int_equal(EVP_MAC_final(ctx, out, &got, 8), 1);
	assert_int_equal(got, 8);
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
}

/* SipHash-2-4: the reference vector of the paper (appendix A), and agreement
 * with OpenSSL's for every length across two blocks. */
static void test_siphash_matches_the_reference(void **state)
{
	uint8_t key[16], msg[64];
	for (int i = 0; i < 16; i++)
		key[i] = (uint8_t)i;
	for (int i = 0; i < 64; i++)
		msg[i] = (uint8_t)(i * 7 + 3);
	uint8_t seq[15];
	for (int i = 0; i < 15; i++)
		seq[i] = (uint8_t)i;
	assert_true(siphash24(key, seq, 15) ==
		    UINT64_C(0xa129ca6149be45e5));
	for (size_t n = 0; n <= sizeof msg; n++) {
		uint8_t want[8];
		siphash_openssl(key, msg, n, want);
		uint64_t h = siphash24(key, msg, n);
		for (int i = 0; i < 8; i++)
			assert_int_equal((uint8_t)(h >> (8 * i)), want[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hit_needs_same_key_and_fingerprint),
		cmocka_unit_test(test_raw_fingerprint_finds_the_same_entry),
		cmocka_unit_test(test_expired_entries_miss_and_go),
		cmocka_unit_test(test_expired_entries_go_when_new_ones_come),
		cmocka_unit_test(test_forget_and_replace),
		cmocka_unit_test(test_bounded_in_bytes_oldest_first),
		cmocka_unit_test(test_forget_between_store_read_and_put_wins),
		cmocka_unit_test(test_resize_evicts_down_to_the_new_bound),
		cmocka_unit_test(test_buckets_differ_between_caches),
		cmocka_unit_test(test_siphash_matches_the_reference),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
