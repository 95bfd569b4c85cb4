#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cors.h"

#define EXPOSE "Access-Control-Expose-Headers"

static void add(header_list *h, const char *n, const char *v)
{
	header_list_add(h, n, strlen(n), v, strlen(v));
}

/* The one Access-Control-Expose-Headers value after the merge. */
static const char *exposed(const header_list *h)
{
	assert_true(header_list_count(h, EXPOSE) <= 1);
	return header_list_get(h, EXPOSE);
}

static void test_no_cors_no_change(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&resp, "Content-Type", "application/json");
	add(&resp, "Idempotent-Replayed", "true");
	cors_expose_own("POST", &req, &resp);
	assert_int_equal(resp.n, 2);
	assert_null(header_list_get(&resp, EXPOSE));
	header_list_free(&resp);
}

static void test_adds_own_names(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&resp, "Access-Control-Allow-Origin", "https://shop.example");
	cors_expose_own("POST", &req, &resp);
	assert_string_equal(exposed(&resp),
			    "Idempotent-Replayed, Preference-Applied");
	header_list_free(&resp);
}

static void test_merges_without_duplicates(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&resp, "access-control-allow-origin", "*");
	add(&resp, EXPOSE, " X-Charge-Id ,idempotent-replayed");
	add(&resp, "access-control-expose-headers", "Location, x-charge-id,");
	cors_expose_own("POST", &req, &resp);
	assert_string_equal(exposed(&resp), "X-Charge-Id, idempotent-replayed, "
					    "Location, Preference-Applied");
	header_list_free(&resp);
}

static void test_complete_list_untouched(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&resp, "Access-Control-Allow-Origin", "*");
	add(&resp, EXPOSE, "preference-applied,IDEMPOTENT-REPLAYED");
	cors_expose_own("POST", &req, &resp);
	assert_string_equal(exposed(&resp),
			    "preference-applied,IDEMPOTENT-REPLAYED");
	header_list_free(&resp);
}

/* Fetch: "*" exposes every header, except to a credentialed request. */
static void test_wildcard(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&resp, "Access-Control-Allow-Origin", "https://shop.example");
	add(&resp, EXPOSE, "*");
	cors_expose_own("POST", &req, &resp);
	assert_string_equal(exposed(&resp), "*");
	add(&resp, "Access-Control-Allow-Credentials", "true");
	cors_expose_own("POST", &req, &resp);
	assert_string_equal(exposed(&resp),
			    "*, Idempotent-Replayed, Preference-Applied");
	header_list_free(&resp);
}

static void test_preflight_untouched(void **state)
{
	(void)state;
	header_list req = {0}, resp = {0};
	add(&req, "Origin", "https://shop.example");
	add(&req, "Access-Control-Request-Method", "POST");
	add(&resp, "Access-Control-Allow-Origin", "https://shop.example");
	assert_true(cors_is_preflight("OPTIONS", &req));
	assert_false(cors_is_preflight("POST", &req));
	cors_expose_own("OPTIONS", &req, &resp);
	assert_null(header_list_get(&resp, EXPOSE));
	/* an OPTIONS request that is not a preflight is an answer to read */
	header_list plain = {0};
	assert_false(cors_is_preflight("OPTIONS", &plain));
	cors_expose_own("OPTIONS", &plain, &resp);
	assert_non_null(header_list_get(&resp, EXPOSE));
	header_list_free(&req);
	header_list_free(&resp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_cors_no_change),
		cmocka_unit_test(test_adds_own_names),
		cmocka_unit_test(test_merges_without_duplicates),
		cmocka_unit_test(test_complete_list_untouched),
		cmocka_unit_test(test_wildcard),
		cmocka_unit_test(test_preflight_untouched),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
