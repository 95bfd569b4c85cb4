#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "admin_keys.h"

static const admin_list_pos POS = {{"2026-12-03T18:52:04.123456Z",
				    "header:acme", "create_payment",
				    "order 1001/x"}};

static void test_cursor_round_trip(void **state)
{
	(void)state;
	for (int newest = 0; newest < 2; newest++) {
		growbuf c = {0};
		admin_cursor_encode(newest, &POS, &c);
		assert_null(strpbrk(c.data, "+/=\n"));
		admin_list_pos back;
		char *buf = NULL;
		assert_int_equal(
			admin_cursor_decode(c.data, newest, &back, &buf), 0);
		for (int i = 0; i < 4; i++)
			assert_string_equal(back.v[i], POS.v[i]);
		free(buf);
		/* A cursor names its order. */
		assert_int_equal(
			admin_cursor_decode(c.data, !newest, &back, &buf), -1);
		growbuf_free(&c);
	}
}

static void test_cursor_refuses_what_it_did_not_make(void **state)
{
	(void)state;
	admin_list_pos p;
	char *buf = NULL;
	const char *bad[] = {
		"",
		"!!!!",
		"bg", /* "n" alone */
		/* "n\nyesterday\nt\no\nk" */
		"bgp5ZXN0ZXJkYXkKdApvCms",
		/* "n\n2026-12-03T18:52:04.123456Z\nt\no" (three parts) */
		"bgoyMDI2LTEyLTAzVDE4OjUyOjA0LjEyMzQ1NloKdApv",
		/* "n\n2026-12-03T18:52:04.123456Z\nt\n\nk" (an empty part) */
		"bgoyMDI2LTEyLTAzVDE4OjUyOjA0LjEyMzQ1NloKdAoKaw",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		assert_int_equal(admin_cursor_decode(bad[i], true, &p, &buf),
				 -1);
}

static int parse(admin_list_args *a, char *err, ...)
{
	admin_arg args[16];
	size_t n = 0;
	va_list ap;
	va_start(ap, err);
	for (const char *k; (k = va_arg(ap, const char *)) && n < 16; n++)
		args[n] = (admin_arg){k, va_arg(ap, const char *)};
	va_end(ap);
	return admin_list_parse(args, n, a, err, 256);
}

static void test_parameters_and_defaults(void **state)
{
	(void)state;
	admin_list_args a;
	char err[256];
	assert_int_equal(parse(&a, err, NULL), 0);
	assert_int_equal(a.req.state, ADMIN_LIST_ANY);
	assert_int_equal(a.req.limit, ADMIN_LIST_DEFAULT);
	assert_true(a.req.newest);
	assert_true(a.req.older_than_ms < 0);
	assert_null(a.req.after);
	admin_list_args_free(&a);

	assert_int_equal(parse(&a, err, "state", "held", "tenant", "acme",
			       "route", "capture", "older_than", "15m", "limit",
			       "1000", "order", "oldest", NULL),
			 0);
	assert_int_equal(a.req.state, ADMIN_LIST_HELD);
	assert_string_equal(a.req.tenant, "acme");
	assert_string_equal(a.req.operation, "capture");
	assert_int_equal(a.req.older_than_ms, 15 * 60 * 1000);
	assert_int_equal(a.req.limit, 1000);
	assert_false(a.req.newest);
	admin_list_args_free(&a);
}

static void test_bad_parameters_name_themselves(void **state)
{
	(void)state;
	admin_list_args a;
	char err[256];
	struct {
		const char *k, *v, *says;
	} bad[] = {
		{"state", "stuck", "state"}, {"limit", "0", "limit"},
		{"limit", "1001", "limit"},  {"limit", "1e3", "limit"},
		{"order", "up", "order"},    {"older_than", "5", "older_than"},
		{"tenant", "", "tenant"},    {"route", "a\tb", "route"},
		{"cursor", "x", "cursor"},   {"colour", "blue", "colour"},
		{"state", NULL, "state"},    {"limit", " 5", "limit"},
		{"limit", "+5", "limit"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		assert_int_equal(parse(&a, err, bad[i].k, bad[i].v, NULL), -1);
		assert_non_null(strstr(err, bad[i].says));
		admin_list_args_free(&a);
	}
	assert_int_equal(parse(&a, err, "limit", "5", "limit", "6", NULL), -1);
	assert_non_null(strstr(err, "more than once"));
	admin_list_args_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cursor_round_trip),
		cmocka_unit_test(test_cursor_refuses_what_it_did_not_make),
		cmocka_unit_test(test_parameters_and_defaults),
		cmocka_unit_test(test_bad_parameters_name_themselves),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
