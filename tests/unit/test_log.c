#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "log.h"

static void quoted_is(const char *v, const char *want)
{
	ip_buf b = {0};
	log_quote(&b, v);
	assert_string_equal(b.data, want);
	ip_buf_free(&b);
}

static void test_quote(void **state)
{
	(void)state;
	quoted_is("abc", "abc");
	quoted_is("/v1/payments?x", "/v1/payments?x");
	quoted_is("", "\"\"");
	quoted_is("-", "\"-\"");
	quoted_is("a b", "\"a b\"");
	quoted_is("k=v", "\"k=v\"");
	quoted_is("x outcome=replayed", "\"x outcome=replayed\"");
	quoted_is("a\"b", "\"a\\\"b\"");
	quoted_is("a\\b", "\"a\\\\b\"");
	quoted_is("a\nb\rc\td", "\"a\\x0ab\\x0dc\\x09d\"");
	quoted_is("caf\xc3\xa9\x7f", "\"caf\\xc3\\xa9\\x7f\"");
}

static void test_field(void **state)
{
	ip_buf b = {0};

	(void)state;
	log_field(&b, "a", "1");
	log_field(&b, "b", NULL);
	log_field(&b, "c", "x y");
	assert_string_equal(b.data, "a=1 b=- c=\"x y\"");
	ip_buf_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quote),
		cmocka_unit_test(test_field),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
