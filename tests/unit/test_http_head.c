#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "http_head.h"

static void test_method(void **state)
{
	(void)state;
	assert_true(http_head_method_ok("POST"));
	assert_true(http_head_method_ok("PATCH"));
	assert_true(http_head_method_ok("M-SEARCH"));
	assert_true(http_head_method_ok("X_1!#$%&'*+.^`|~"));
	/* Lower case would be upper-cased by some upstreams and run as
	 * the method the proxy did not protect. */
	assert_false(http_head_method_ok("post"));
	assert_false(http_head_method_ok("Post"));
	assert_false(http_head_method_ok(""));
	assert_false(http_head_method_ok("PO ST"));
	assert_false(http_head_method_ok("POST\t"));
	assert_false(http_head_method_ok("PO\x7fST"));
	assert_false(http_head_method_ok("P\xc3\x89ST"));
	for (const char *p = "\"(),/:;<=>?@[\\]{}"; *p; p++) {
		char m[4] = {'P', *p, 'T', 0};
		assert_false(http_head_method_ok(m));
	}
}

static void test_origin_form(void **state)
{
	(void)state;
	assert_true(http_head_origin_form("/"));
	assert_true(http_head_origin_form("/v1/charges?x=1&y=%2F"));
	assert_true(http_head_origin_form("/a-._~!$&'()*+,;=:@/?"));
	assert_true(http_head_origin_form("/%aF%00"));
	/* Other forms (RFC 9112 3.2.2-3.2.4). */
	assert_false(http_head_origin_form(""));
	assert_false(http_head_origin_form("*"));
	assert_false(http_head_origin_form("http://h/v1/charges"));
	assert_false(http_head_origin_form("h:443"));
	/* A fragment: curl drops it, so the upstream would run a request
	 * other than the one claimed. */
	assert_false(http_head_origin_form("/v1/charges#x"));
	assert_false(http_head_origin_form("/a b"));
	assert_false(http_head_origin_form("/a\"b"));
	assert_false(http_head_origin_form("/a{b}"));
	assert_false(http_head_origin_form("/\xc3\xa9"));
	assert_false(http_head_origin_form("/a\\b"));
	/* '%' needs two hex digits, also at the very end. */
	assert_false(http_head_origin_form("/%"));
	assert_false(http_head_origin_form("/%4"));
	assert_false(http_head_origin_form("/%4g"));
	assert_false(http_head_origin_form("/%g4"));
}

static void test_header_bytes(void **state)
{
	(void)state;
	assert_true(http_head_name_ok("Idempotency-Key", 15));
	assert_true(http_head_name_ok("x!#$%&'*+-.^_`|~", 16));
	assert_false(http_head_name_ok("", 0));
	assert_false(http_head_name_ok("X-Tenant-Id d", 13));
	assert_false(http_head_name_ok("X:Y", 3));
	assert_false(http_head_name_ok("X\"Y", 3));
	assert_false(http_head_name_ok("X\tY", 3));
	/* The length, not a NUL, ends the name. */
	assert_false(http_head_name_ok("Ab\0c", 4));
	assert_true(http_head_name_ok("Ab\0c", 2));

	assert_true(http_head_value_ok("", 0));
	assert_true(http_head_value_ok("a b\tc", 5));
	assert_true(http_head_value_ok("caf\xc3\xa9", 5)); /* obs-text */
	assert_true(http_head_value_ok("~\x80\xff", 3));
	assert_false(http_head_value_ok("a\rb", 3));
	assert_false(http_head_value_ok("a\nb", 3));
	assert_false(http_head_value_ok("a\0b", 3));
	assert_false(http_head_value_ok("a\x7f", 2));
	assert_false(http_head_value_ok("\x1f", 1));
}

static void test_on_own_line(void **state)
{
	(void)state;
	/* As libmicrohttpd leaves a line: the colon overwritten by NUL. */
	char line[] = "X-Tenant-Id\0 \t acme";
	const char *value = line + 15;
	assert_true(http_head_on_own_line(line, 11, value, 16));
	assert_true(http_head_on_own_line(line, 11, value, 3));
	assert_false(http_head_on_own_line(line, 11, value, 2)); /* gap */
	assert_true(http_head_on_own_line(line, 11, line + 12, 0));
	/* A folded name ends elsewhere: no NUL after it. */
	assert_false(http_head_on_own_line(line, 10, value, 16));
	/* The value before its name, or on top of it. */
	assert_false(http_head_on_own_line(value, 4, line, 1000));
	assert_false(http_head_on_own_line(line, 11, line + 11, 16));
	/* Something other than SP/HTAB between name and value. */
	char other[] = "X\0 x y";
	assert_false(http_head_on_own_line(other, 1, other + 5, 16));
	assert_true(http_head_on_own_line(other, 1, other + 3, 16));
}

static void test_request_id(void **state)
{
	(void)state;
	assert_true(http_head_request_id_ok("abc-123", 8));
	assert_false(http_head_request_id_ok("abc-1234", 8)); /* no room */
	assert_false(http_head_request_id_ok(NULL, 8));
	assert_false(http_head_request_id_ok("", 8));
	assert_false(http_head_request_id_ok("a b", 8));
	assert_false(http_head_request_id_ok("a\x7f", 8));
	assert_false(http_head_request_id_ok("\xc3\xa9", 8));
}

static http_head good(void)
{
	return (http_head){.method = "POST",
			   .target = "/v1/charges",
			   .version = "HTTP/1.1",
			   .hosts = 1};
}

static void test_problem(void **state)
{
	(void)state;
	http_head h = good();
	assert_null(http_head_problem(&h));

	h.method = "post";
	assert_non_null(strstr(http_head_problem(&h), "upper case"));
	h = good();
	h.target = "/a#b";
	assert_non_null(strstr(http_head_problem(&h), "origin-form"));
	h = good();
	h.folded = true;
	assert_non_null(strstr(http_head_problem(&h), "obs-fold"));

	h = good();
	h.hosts = 0;
	assert_non_null(strstr(http_head_problem(&h), "Host"));
	h.hosts = 2;
	assert_non_null(strstr(http_head_problem(&h), "Host"));
	h.version = "HTTP/1.0";
	assert_non_null(strstr(http_head_problem(&h), "Host"));
	h.hosts = 0; /* HTTP/1.0 may go without */
	assert_null(http_head_problem(&h));

	h = good();
	h.te = 1;
	h.te_value = "Chunked";
	assert_null(http_head_problem(&h));
	h.te_value = "gzip, chunked";
	assert_non_null(strstr(http_head_problem(&h), "chunked"));
	h.te_value = "chunked";
	h.te = 2;
	assert_non_null(strstr(http_head_problem(&h), "chunked"));
	h.te = 1;
	h.version = "HTTP/1.0"; /* no transfer codings before 1.1 */
	h.hosts = 0;
	assert_non_null(strstr(http_head_problem(&h), "chunked"));
}

static void test_framing(void **state)
{
	(void)state;
	assert_true(http_head_framing_ok(0, 0));
	assert_true(http_head_framing_ok(1, 0));
	assert_true(http_head_framing_ok(0, 1));
	assert_false(http_head_framing_ok(2, 0));
	assert_false(http_head_framing_ok(1, 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_method),
		cmocka_unit_test(test_origin_form),
		cmocka_unit_test(test_header_bytes),
		cmocka_unit_test(test_on_own_line),
		cmocka_unit_test(test_request_id),
		cmocka_unit_test(test_problem),
		cmocka_unit_test(test_framing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
