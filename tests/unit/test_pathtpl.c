#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "pathtpl.h"

static pathtpl *compile_ok(const char *pattern)
{
	char err[256] = "";
	pathtpl *t = pathtpl_compile(pattern, err, sizeof err);
	if (t == NULL)
		fail_msg("'%s' rejected: %s", pattern, err);
	assert_string_equal(err, "");
	return t;
}

static void compile_bad(const char *pattern, const char *reason)
{
	char err[256] = "";
	pathtpl *t = pathtpl_compile(pattern, err, sizeof err);
	if (t != NULL) {
		pathtpl_free(t);
		fail_msg("'%s' accepted", pattern);
	}
	if (strstr(err, reason) == NULL)
		fail_msg("'%s': reason '%s' lacks '%s'", pattern, err, reason);
}

static bool m(const pathtpl *t, const char *path)
{
	return pathtpl_match(t, path, strlen(path));
}

/* Normalises path first, as route_match's caller does. */
static bool nm(const pathtpl *t, const char *path)
{
	size_t n = strlen(path), k;
	char *out = malloc(n + 1);
	const char *why = NULL;
	assert_non_null(out);
	bool ok = pathtpl_normalize(path, n, out, &k, &why) == 0 &&
		  pathtpl_match(t, out, k);
	free(out);
	return ok;
}

static void norm_ok(const char *path, const char *want)
{
	size_t n = strlen(path), k = 0;
	char out[256];
	const char *why = NULL;
	if (pathtpl_normalize(path, n, out, &k, &why) != 0)
		fail_msg("'%s' refused: %s", path, why);
	assert_true(k <= n);
	out[k] = '\0';
	assert_string_equal(out, want);
}

static void norm_bad(const char *path, const char *reason)
{
	size_t k = 0;
	char out[256];
	const char *why = NULL;
	if (pathtpl_normalize(path, strlen(path), out, &k, &why) == 0)
		fail_msg("'%s' accepted", path);
	if (why == NULL || strstr(why, reason) == NULL)
		fail_msg("'%s': reason '%s' lacks '%s'", path, why, reason);
}

static void test_normalize(void **state)
{
	(void)state;
	norm_ok("/", "/");
	norm_ok("/v1/payments", "/v1/payments");
	norm_ok("/v1/payments/", "/v1/payments");
	norm_ok("/v1/pay%6dents", "/v1/payments");
	norm_ok("/v1/pay%6Dents", "/v1/payments");
	norm_ok("/%76%31/%70ayments", "/v1/payments");
	norm_ok("/a%2d%2E%5f%7e", "/a-._~");
	norm_ok("/a%3a%3B%20%c3%a9%25", "/a%3A%3B%20%C3%A9%25");
	norm_ok("/a/.../%2e%2e%2e/.x", "/a/.../.../.x");
	norm_ok("/a:b@c!$&'()*+,;=", "/a:b@c!$&'()*+,;=");
	norm_ok("", "");
	norm_ok("*", "*");
	norm_ok("v1/x//", "v1/x//");	/* not a path: left alone */
	norm_bad("//", "empty segment");
	norm_bad("/v1//payments", "empty segment");
	norm_bad("//v1/payments", "empty segment");
	norm_bad("/v1/payments//", "empty segment");
	norm_bad("/v1/./payments", "'..'");
	norm_bad("/v1/x/../payments", "'..'");
	norm_bad("/v1/%2e/payments", "'..'");
	norm_bad("/v1/%2E%2e", "'..'");
	norm_bad("/v1/.%2E/", "'..'");
	norm_bad("/.", "'..'");
	norm_bad("/..", "'..'");
	norm_bad("/v1%2Fpayments", "%2F");
	norm_bad("/v1%2fpayments", "%2F");
	norm_bad("/x/..%2F", "%2F");
	norm_bad("/v1/%", "hex digits");
	norm_bad("/v1/%4", "hex digits");
	norm_bad("/v1/%zz", "hex digits");
	norm_bad("/v1/%4g/x", "hex digits");
	/* len is honoured: a '%' cut off by it is malformed. */
	size_t k;
	char out[8];
	const char *why;
	assert_int_equal(pathtpl_normalize("/a%41", 4, out, &k, &why), -1);
	assert_int_equal(pathtpl_normalize("/a%41", 5, out, &k, &why), 0);
	assert_int_equal(k, 3);
	assert_memory_equal(out, "/aA", 3);
	assert_int_equal(pathtpl_normalize("/a\0b", 4, out, &k, NULL), 0);
	assert_int_equal(k, 4);
	assert_memory_equal(out, "/a\0b", 4);
}

static void test_spellings_of_one_path_match_one_route(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/v1/pay%6dents/{id}/capture");
	assert_true(nm(t, "/v1/payments/x/capture"));
	assert_true(nm(t, "/v1/payments/x/capture/"));
	assert_true(nm(t, "/v1/pay%6Dents/%78/c%61pture"));
	assert_true(nm(t, "/v1/payments/a%2db/capture"));
	assert_false(nm(t, "/v1/payments//capture"));
	assert_false(nm(t, "/v1/payments/x/../x/capture"));
	assert_false(nm(t, "/v1/payments/x%2Fy/capture"));
	pathtpl_free(t);
	compile_bad("/v1/a%2Fb", "%2F");
}

static void test_literal(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/v1/payments");
	assert_true(m(t, "/v1/payments"));
	assert_false(m(t, "/v1/payments/"));
	assert_false(m(t, "/v1/payment"));
	assert_false(m(t, "/v1/paymentsx"));
	assert_false(m(t, "/v1/payments/x"));
	assert_false(m(t, "/v1"));
	assert_false(m(t, "/v1/"));
	assert_false(m(t, "/V1/payments"));
	assert_false(m(t, "v1/payments"));
	assert_false(m(t, "//v1/payments"));
	assert_false(m(t, "/v1//payments"));
	assert_false(m(t, "/v1/payments?x=1"));	/* query is not part of it */
	assert_false(m(t, ""));
	assert_false(m(t, "/"));
	pathtpl_free(t);
}

static void test_root_and_trailing_slash(void **state)
{
	(void)state;
	pathtpl *root = compile_ok("/");
	assert_true(m(root, "/"));
	assert_false(m(root, "//"));
	assert_false(m(root, "/a"));
	assert_false(m(root, ""));
	pathtpl_free(root);

	/* A template's trailing slash is dropped, as a path's is. */
	pathtpl *t = compile_ok("/v1/");
	assert_true(m(t, "/v1"));
	assert_true(nm(t, "/v1/"));
	assert_false(m(t, "/v1/x"));
	pathtpl_free(t);
}

static void test_param(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/v1/payments/{id}/capture");
	assert_true(m(t, "/v1/payments/pay_123/capture"));
	assert_true(m(t, "/v1/payments/x/capture"));
	assert_true(m(t, "/v1/payments/.../capture"));
	assert_false(m(t, "/v1/payments//capture"));
	assert_false(m(t, "/v1/payments/a/b/capture"));
	assert_false(m(t, "/v1/payments/capture"));
	assert_false(m(t, "/v1/payments/x/capture/"));
	assert_false(m(t, "/v1/payments/x"));
	assert_false(m(t, "/v1/payments/x/"));
	assert_false(m(t, "/v1/payments/"));
	pathtpl_free(t);

	pathtpl *two = compile_ok("/{a}/{b_2}");
	assert_true(m(two, "/x/y"));
	assert_false(m(two, "/x"));
	assert_false(m(two, "/x/"));
	assert_false(m(two, "//y"));
	assert_false(m(two, "/x/y/z"));
	pathtpl_free(two);

	pathtpl *last = compile_ok("/items/{id}");
	assert_true(m(last, "/items/1"));
	assert_false(m(last, "/items/"));
	assert_false(m(last, "/items"));
	pathtpl_free(last);
}

static void test_rest(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/hooks/*");
	assert_true(m(t, "/hooks"));
	assert_true(m(t, "/hooks/"));
	assert_true(m(t, "/hooks/a"));
	assert_true(m(t, "/hooks/a/b"));
	assert_true(m(t, "/hooks/a/b/"));
	assert_true(m(t, "/hooks//a"));
	assert_false(m(t, "/hooksx"));
	assert_false(m(t, "/hook"));
	assert_false(m(t, "/Hooks/a"));
	assert_false(m(t, "/"));
	assert_false(m(t, "/other/hooks/a"));
	pathtpl_free(t);

	pathtpl *all = compile_ok("/*");
	assert_true(m(all, "/"));
	assert_true(m(all, "/a"));
	assert_true(m(all, "/a/b/c"));
	assert_false(m(all, ""));
	assert_false(m(all, "a"));
	assert_false(m(all, "*"));
	pathtpl_free(all);

	pathtpl *mix = compile_ok("/t/{tenant}/*");
	assert_true(m(mix, "/t/acme"));
	assert_true(m(mix, "/t/acme/x/y"));
	assert_false(m(mix, "/t"));
	assert_false(m(mix, "/t/"));
	assert_false(m(mix, "/t//x"));
	pathtpl_free(mix);
}

static void test_dot_segments_never_match(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/hooks/*");
	assert_false(m(t, "/hooks/../v1/payments"));
	assert_false(m(t, "/hooks/a/../../v1/payments"));
	assert_false(m(t, "/hooks/./a"));
	assert_false(m(t, "/hooks/.."));
	assert_false(m(t, "/hooks/%2e%2e/v1"));
	assert_false(m(t, "/hooks/%2E./v1"));
	assert_false(m(t, "/hooks/.%2e"));
	assert_false(m(t, "/hooks/%2e"));
	assert_true(m(t, "/hooks/.well-known"));
	assert_true(m(t, "/hooks/..."));
	assert_true(m(t, "/hooks/%2e%2e%2e"));
	assert_true(m(t, "/hooks/a.b"));
	pathtpl_free(t);

	pathtpl *p = compile_ok("/v1/payments/{id}/capture");
	assert_false(m(p, "/v1/payments/../capture"));
	assert_false(m(p, "/v1/payments/./capture"));
	assert_false(m(p, "/v1/payments/%2E%2E/capture"));
	pathtpl_free(p);

	pathtpl *all = compile_ok("/*");
	assert_false(m(all, "/.."));
	assert_false(m(all, "/a/./b"));
	pathtpl_free(all);
}

static void test_literal_chars(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/a-b.c_d~e/!$&'()+,;=:@/%7E/%3a");
	assert_true(nm(t, "/a-b.c_d~e/!$&'()+,;=:@/%7E/%3a"));
	assert_true(nm(t, "/a-b.c_d~e/!$&'()+,;=:@/%7e/%3A"));
	assert_true(nm(t, "/%61-b.c_d%7Ee/!$&'()+,;=:@/~/%3A"));
	assert_false(nm(t, "/a-b.c_d~e/!$&'()+,;=:@/~/:"));	/* reserved */
	pathtpl_free(t);
}

static void test_bytes_in_path(void **state)
{
	(void)state;
	pathtpl *t = compile_ok("/a/{id}");
	assert_true(pathtpl_match(t, "/a/x\0y", 6));
	assert_false(pathtpl_match(t, "/a\0/x", 5));
	assert_false(pathtpl_match(t, "/a/x/\0", 6));
	/* len is honoured: bytes beyond it are not looked at. */
	assert_true(pathtpl_match(t, "/a/x/extra", 4));
	assert_false(pathtpl_match(t, "/a/x", 0));
	assert_false(pathtpl_match(t, NULL, 0));
	assert_false(pathtpl_match(NULL, "/a/x", 4));
	pathtpl_free(t);

	pathtpl *lit = compile_ok("/ab");
	assert_false(pathtpl_match(lit, "/a\0", 3));
	assert_false(pathtpl_match(lit, "/ab\0", 4));
	assert_true(pathtpl_match(lit, "/ab\0", 3));
	pathtpl_free(lit);
}

static void test_bad_templates(void **state)
{
	(void)state;
	compile_bad("", "start with '/'");
	compile_bad("v1/payments", "start with '/'");
	compile_bad("*", "start with '/'");
	compile_bad("/v1/{}", "empty '{}'");
	compile_bad("/v1/{id", "unclosed");
	compile_bad("/v1/{", "unclosed");
	compile_bad("/v1/{id}/{", "unclosed");
	compile_bad("/v1/id}", "whole path segment");
	compile_bad("/v1/x{id}", "whole path segment");
	compile_bad("/v1/{id}x", "whole path segment");
	compile_bad("/v1/{id}}", "whole path segment");
	compile_bad("/v1/{{id}}", "whole path segment");
	compile_bad("/v1/{{id}", "letters, digits");
	compile_bad("/v1/{1id}", "letters, digits");
	compile_bad("/v1/{i-d}", "letters, digits");
	compile_bad("/v1/{i d}", "letters, digits");
	compile_bad("/v1/{a/b}", "unclosed");
	compile_bad("/*/x", "trailing");
	compile_bad("/hooks*", "trailing");
	compile_bad("/hooks/*/", "trailing");
	compile_bad("/hooks/**", "trailing");
	compile_bad("/hooks/a*", "trailing");
	compile_bad("/v1//payments", "empty segment");
	compile_bad("//", "empty segment");
	compile_bad("/v1/pay ments", "not allowed");
	compile_bad("/v1/payments?x=1", "not allowed");
	compile_bad("/v1/payments#frag", "not allowed");
	compile_bad("/v1/pay\"ments", "not allowed");
	compile_bad("/v1/pay\\ments", "not allowed");
	compile_bad("/v1/pay\tments", "0x09");
	compile_bad("/v1/caf\xc3\xa9", "0xc3");
	compile_bad("/v1/%", "hex digits");
	compile_bad("/v1/%2", "hex digits");
	compile_bad("/v1/%zz", "hex digits");
	compile_bad("/v1/%2g/x", "hex digits");
	compile_bad("/v1/..", "'..'");
	compile_bad("/v1/./x", "'..'");
	compile_bad("/v1/%2e%2E", "'..'");
	compile_bad(NULL, "start with '/'");
}

static void test_error_buffer_is_bounded(void **state)
{
	char err[8];

	(void)state;
	memset(err, 'Z', sizeof err);
	assert_null(pathtpl_compile("/v1/pay ments", err, 5));
	assert_int_equal(err[4], '\0');
	assert_int_equal(err[5], 'Z');
	assert_null(pathtpl_compile("nope", NULL, 0));
	pathtpl_free(NULL);
}

/* Reference for "/v1/{id}/capture", written the slow obvious way. */
static bool ref_is_dot(const char *s, size_t n)
{
	char d[64];
	size_t k = 0;

	/* Decode only the escaped dots, then compare. */
	for (size_t i = 0; i < n && k < sizeof d; k++) {
		if (i + 3 <= n && s[i] == '%' && s[i + 1] == '2' &&
		    (s[i + 2] == 'e' || s[i + 2] == 'E')) {
			d[k] = '.';
			i += 3;
		} else {
			d[k] = s[i++];
		}
	}
	return (k == 1 && d[0] == '.') ||
	       (k == 2 && d[0] == '.' && d[1] == '.');
}

static bool ref_match_capture(const char *p, size_t n)
{
	if (n < 4 || memcmp(p, "/v1/", 4) != 0)
		return false;
	const char *id = p + 4;
	const char *slash = memchr(id, '/', n - 4);
	if (!slash || slash == id || ref_is_dot(id, (size_t)(slash - id)))
		return false;
	size_t rest = n - (size_t)(slash - p);
	return rest == 8 && memcmp(slash, "/capture", 8) == 0;
}

/* Deterministic pseudo-random paths over a small alphabet that includes
 * '/', '.', '%', NUL and high bytes: matching must not crash and must
 * agree with the reference. */
static void test_fuzz_against_reference(void **state)
{
	static const char alphabet[] = { '/', 'v', '1', 'c', 'a', '2', 'e',
					 'E', '.', '.', '%', '\0', '\xff' };
	uint32_t seed = 12345;
	char buf[48];
	pathtpl *t = compile_ok("/v1/{id}/capture");
	pathtpl *r = compile_ok("/v1/*");
	int matched = 0, dots_refused = 0;

	(void)state;
	for (int iter = 0; iter < 300000; iter++) {
		seed = seed * 1103515245u + 12345u;
		size_t idlen = 1 + (seed >> 16) % 8;
		size_t n = 4 + idlen + 8;
		memcpy(buf, "/v1/", 4);
		for (size_t i = 4; i < 4 + idlen; i++) {
			seed = seed * 1103515245u + 12345u;
			buf[i] = alphabet[(seed >> 16) % sizeof alphabet];
		}
		memcpy(buf + 4 + idlen, "/capture", 8);
		/* Sometimes damage one byte anywhere. */
		seed = seed * 1103515245u + 12345u;
		if ((seed >> 16) % 4 == 0) {
			seed = seed * 1103515245u + 12345u;
			size_t at = (seed >> 16) % n;
			buf[at] = alphabet[(seed >> 8) % sizeof alphabet];
		}
		bool got = pathtpl_match(t, buf, n);
		assert_int_equal(got, ref_match_capture(buf, n));
		matched += got;
		if (!got && n >= 13 && memcmp(buf, "/v1/", 4) == 0 &&
		    memchr(buf + 4, '/', idlen) == NULL &&
		    memcmp(buf + 4 + idlen, "/capture", 8) == 0)
			dots_refused++;
		/* The wildcard template agrees with its own simple rule. */
		bool any_dot = false;
		for (size_t i = 1, st = 1; i <= n; i++) {
			if (i == n || buf[i] == '/') {
				any_dot |= ref_is_dot(buf + st, i - st);
				st = i + 1;
			}
		}
		bool want_r = n >= 3 && memcmp(buf, "/v1", 3) == 0 &&
			      (n == 3 || buf[3] == '/') && !any_dot;
		assert_int_equal(pathtpl_match(r, buf, n), want_r);
	}
	assert_true(matched > 1000);
	assert_true(dots_refused > 100);
	pathtpl_free(t);
	pathtpl_free(r);
}

/* A long path is matched in one pass; this would take visibly long with
 * anything quadratic and must not touch the stack in proportion. */
static void test_long_path(void **state)
{
	size_t n = 4 * 1024 * 1024;
	char *p = malloc(n);

	(void)state;
	assert_non_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (i % 2 == 0) ? '/' : 'a';
	pathtpl *t = compile_ok("/a/*");
	assert_true(pathtpl_match(t, p, n));
	pathtpl *lit = compile_ok("/a/a");
	assert_false(pathtpl_match(lit, p, n));
	pathtpl_free(t);
	pathtpl_free(lit);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_normalize),
		cmocka_unit_test(test_spellings_of_one_path_match_one_route),
		cmocka_unit_test(test_literal),
		cmocka_unit_test(test_root_and_trailing_slash),
		cmocka_unit_test(test_param),
		cmocka_unit_test(test_rest),
		cmocka_unit_test(test_dot_segments_never_match),
		cmocka_unit_test(test_literal_chars),
		cmocka_unit_test(test_bytes_in_path),
		cmocka_unit_test(test_bad_templates),
		cmocka_unit_test(test_error_buffer_is_bounded),
		cmocka_unit_test(test_fuzz_against_reference),
		cmocka_unit_test(test_long_path),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
