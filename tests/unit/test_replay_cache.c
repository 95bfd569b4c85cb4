#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "replay_cache.h"

static const uint8_t H1[FP_LEN] = {1};
static const uint8_t H2[FP_LEN] = {2};

static void put(replay_cache *c, const char *key, const uint8_t *hash,
		const char *body, double expires)
{
	replay_key k = {"t", "op", key};
	replay_entry e = {hash, 201, "Content-Type: a/b\r\n", 19, body,
			  strlen(body)};
	replay_cache_put(c, &k, &e, expires);
}

static bool get(replay_cache *c, const char *key, const uint8_t *hash,
		double now, ip_buf *body)
{
	replay_key k = {"t", "op", key};
	int status = 0;
	ip_buf h = {0};
	bool hit = replay_cache_get(c, &k, hash, now, &status, &h, body);
	if (hit) {
		assert_int_equal(status, 201);
		assert_string_equal(h.data, "Content-Type: a/b\r\n");
	}
	ip_buf_free(&h);
	return hit;
}

static void test_hit_needs_same_key_and_fingerprint(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	put(c, "k1", H1, "body-1", 1000);
	ip_buf b = {0};
	assert_true(get(c, "k1", H1, 10, &b));
	assert_string_equal(b.data, "body-1");
	ip_buf_reset(&b);
	assert_false(get(c, "k1", H2, 10, &b)); /* another payload */
	assert_false(get(c, "k2", H1, 10, &b)); /* another key */
	/* tenant and operation are part of the identity */
	replay_key other = {"t2", "op", "k1"};
	int st;
	ip_buf h = {0};
	assert_false(replay_cache_get(c, &other, H1, 10, &st, &h, &b));
	replay_key ambiguous = {"t", "opk", "1"};
	assert_false(replay_cache_get(c, &ambiguous, H1, 10, &st, &h, &b));
	ip_buf_free(&b);
	ip_buf_free(&h);
	replay_cache_free(c);
}

static void test_expired_entries_miss_and_go(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	put(c, "k1", H1, "x", 100);
	ip_buf b = {0};
	assert_true(get(c, "k1", H1, 99.9, &b));
	assert_false(get(c, "k1", H1, 100, &b));
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 0);
	assert_int_equal(bytes, 0);
	ip_buf_free(&b);
	replay_cache_free(c);
}

static void test_expired_entries_go_when_new_ones_come(void **state)
{
	replay_cache *c = replay_cache_new(1 << 20);
	double now = ip_now_ms();
	put(c, "old1", H1, "x", now - 1);
	put(c, "old2", H1, "x", now - 1);
	put(c, "live", H1, "x", now + 60000);
	size_t n, bytes;
	replay_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 1); /* the two expired ones were dropped */
	ip_buf b = {0};
	assert_true(get(c, "live", H1, now, &b));
	ip_buf_free(&b);
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
	ip_buf b = {0};
	assert_true(get(c, "k1", H1, 1, &b));
	assert_string_equal(b.data, "new");
	replay_key k = {"t", "op", "k1"};
	replay_cache_forget(c, &k);
	assert_false(get(c, "k1", H1, 1, &b));
	ip_buf_free(&b);
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
	ip_buf b = {0};
	assert_false(get(c, "k0", H1, 1, &b));  /* evicted */
	assert_true(get(c, "k49", H1, 1, &b));  /* newest kept */
	/* an entry larger than the whole cache is not stored */
	char *huge = xmalloc(8192);
	memset(huge, 'h', 8191);
	huge[8191] = '\0';
	put(c, "huge", H1, huge, 1000);
	assert_false(get(c, "huge", H1, 1, &b));
	free(huge);
	ip_buf_free(&b);
	replay_cache_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hit_needs_same_key_and_fingerprint),
		cmocka_unit_test(test_expired_entries_miss_and_go),
		cmocka_unit_test(test_expired_entries_go_when_new_ones_come),
		cmocka_unit_test(test_forget_and_replace),
		cmocka_unit_test(test_bounded_in_bytes_oldest_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
