#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "problem.h"

/* Renders, checks that the result is one JSON object with no raw control
 * bytes, and returns it parsed. */
static json_t *render(int status, const char *code, const char *detail,
		      const char *request_id)
{
	growbuf b = { 0 };
	json_error_t err;

	problem_render(&b, status, code, detail, request_id);
	assert_non_null(b.data);
	assert_int_equal(strlen(b.data), b.len);
	for (size_t i = 0; i < b.len; i++)
		assert_true((unsigned char)b.data[i] >= 0x20);
	json_t *j = json_loadb(b.data, b.len, JSON_REJECT_DUPLICATES, &err);
	if (j == NULL)
		fail_msg("not JSON (%s): %s", err.text, b.data);
	assert_true(json_is_object(j));
	growbuf_free(&b);
	return j;
}

static const char *str(json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);
	if (!json_is_string(v))
		fail_msg("field %s missing or not a string", key);
	return json_string_value(v);
}

static void test_fields(void **state)
{
	(void)state;
	json_t *j = render(400, "idempotency_key_missing",
			   "send an Idempotency-Key header", "req-1");
	assert_string_equal(str(j, "type"),
			    "urn:idemproxy:problem:idempotency_key_missing");
	assert_string_equal(str(j, "title"),
			    problem_title("idempotency_key_missing"));
	assert_string_equal(str(j, "detail"), "send an Idempotency-Key header");
	assert_string_equal(str(j, "code"), "idempotency_key_missing");
	assert_string_equal(str(j, "request_id"), "req-1");
	json_t *st = json_object_get(j, "status");
	assert_true(json_is_integer(st));
	assert_int_equal(json_integer_value(st), 400);
	assert_int_equal(json_object_size(j), 6);
	json_decref(j);
}

static void test_optional_fields(void **state)
{
	(void)state;
	json_t *j = render(503, "overloaded", NULL, NULL);
	assert_null(json_object_get(j, "request_id"));
	/* No detail: the title stands in, so the field is always present. */
	assert_string_equal(str(j, "detail"), problem_title("overloaded"));
	assert_int_equal(json_integer_value(json_object_get(j, "status")), 503);
	assert_int_equal(json_object_size(j), 5);
	json_decref(j);
}

static void test_status_follows_argument(void **state)
{
	(void)state;
	json_t *j = render(422, "idempotency_key_mismatch", "x", NULL);
	assert_int_equal(json_integer_value(json_object_get(j, "status")), 422);
	json_decref(j);
	j = render(431, "request_too_large", "headers too large", NULL);
	assert_int_equal(json_integer_value(json_object_get(j, "status")), 431);
	assert_string_equal(str(j, "code"), "request_too_large");
	json_decref(j);
}

static void test_escaping(void **state)
{
	const char *nasty = "a \"quoted\" \\ back\nslash\r\t\x01\x1f end}";

	(void)state;
	json_t *j = render(400, "idempotency_key_invalid", nasty,
			   "id\"with\nnewline");
	assert_string_equal(str(j, "detail"), nasty);
	assert_string_equal(str(j, "request_id"), "id\"with\nnewline");
	assert_string_equal(str(j, "code"), "idempotency_key_invalid");
	json_decref(j);

	/* Valid UTF-8 passes through unchanged. */
	j = render(400, "bad_request", "caf\xc3\xa9 \xe2\x82\xac", NULL);
	assert_string_equal(str(j, "detail"), "caf\xc3\xa9 \xe2\x82\xac");
	json_decref(j);
}

static void test_invalid_utf8_is_replaced(void **state)
{
	(void)state;
	json_t *j = render(400, "bad_request", "bad \xff\xfe byte", "r\xc3");
	assert_string_equal(str(j, "detail"), "bad ?? byte");
	assert_string_equal(str(j, "request_id"), "r?");
	json_decref(j);
}

static void test_appends(void **state)
{
	growbuf b = { 0 };

	(void)state;
	growbuf_puts(&b, "PREFIX");
	problem_render(&b, 404, "route_not_found", "no route", NULL);
	assert_memory_equal(b.data, "PREFIX{", 7);
	assert_int_equal(b.data[b.len - 1], '}');
	growbuf_free(&b);
}

static void test_titles(void **state)
{
	static const char *codes[] = {
		"idempotency_key_missing",
		"idempotency_key_invalid",
		"tenant_missing",
		"bad_request",
		"credentials_missing",
		"route_not_found",
		"idempotency_key_in_use",
		"idempotency_key_mismatch",
		"idempotency_response_not_replayable",
		"request_too_large",
		"upstream_unavailable",
		"idempotency_store_unavailable",
		"idempotency_lease_expired",
		"idempotency_outcome_unrecorded",
		"overloaded",
		"upstream_outcome_unknown",
		"admin_unauthorized",
		"not_found",
		"method_not_allowed",
		"internal_error",
	};
	const size_t n = sizeof codes / sizeof codes[0];
	const char *generic = problem_title("no_such_code");

	(void)state;
	assert_non_null(generic);
	assert_string_equal(problem_title(NULL), generic);
	assert_string_equal(problem_title(""), generic);
	for (size_t i = 0; i < n; i++) {
		const char *t = problem_title(codes[i]);
		assert_non_null(t);
		assert_true(strlen(t) > 0);
		if (strcmp(t, generic) == 0)
			fail_msg("code %s has no title of its own", codes[i]);
		/* Titles are distinct, so a log reader can tell them apart. */
		for (size_t k = 0; k < i; k++)
			assert_string_not_equal(t, problem_title(codes[k]));
	}
	assert_string_equal(problem_title("idempotency_key_missing"),
			    "Idempotency-Key header missing");
}

static void test_unknown_code(void **state)
{
	(void)state;
	json_t *j = render(500, "weird\"code", NULL, NULL);
	assert_string_equal(str(j, "code"), "weird\"code");
	assert_string_equal(str(j, "type"), "urn:idemproxy:problem:weird\"code");
	assert_string_equal(str(j, "title"), problem_title("weird\"code"));
	json_decref(j);

	j = render(500, NULL, NULL, NULL);
	assert_string_equal(str(j, "code"), "internal_error");
	json_decref(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fields),
		cmocka_unit_test(test_optional_fields),
		cmocka_unit_test(test_status_follows_argument),
		cmocka_unit_test(test_escaping),
		cmocka_unit_test(test_invalid_utf8_is_replaced),
		cmocka_unit_test(test_appends),
		cmocka_unit_test(test_titles),
		cmocka_unit_test(test_unknown_code),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
