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

	problem_render(&b, NULL, status, code, detail, request_id,
		       (problem_facts){0});
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
	assert_string_equal(str(j, "operation_state"), "not_executed");
	assert_string_equal(str(j, "client_action"), "fix_request");
	assert_int_equal(json_object_size(j), 8);
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
	assert_int_equal(json_object_size(j), 7);
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
	problem_render(&b, NULL, 404, "route_not_found", "no route", NULL,
		       (problem_facts){0});
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
		"credentials_invalid",
		"upstream_response_too_large",
		"idempotency_record_unreadable",
		"shutting_down",
		"request_timeout",
		"attempt_in_flight",
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

	/* A code not in the table claims nothing it cannot know. */
	assert_string_equal(str(j, "operation_state"), "unknown");
	assert_string_equal(str(j, "client_action"), "do_not_retry");
	json_decref(j);

	j = render(500, NULL, NULL, NULL);
	assert_string_equal(str(j, "code"), "internal_error");
	json_decref(j);
}

/* The call site's facts win over the code's defaults, each on its own. */
static void test_facts(void **state)
{
	(void)state;
	growbuf b = { 0 };
	problem_render(&b, NULL, 409, "idempotency_key_in_use", "held", NULL,
		       (problem_facts){ .state = PROBLEM_UNKNOWN,
					 .action = PROBLEM_DO_NOT_RETRY });
	json_t *j = json_loadb(b.data, b.len, 0, NULL);
	assert_non_null(j);
	assert_string_equal(str(j, "operation_state"), "unknown");
	assert_string_equal(str(j, "client_action"), "do_not_retry");
	json_decref(j);
	growbuf_free(&b);

	j = render(409, "idempotency_key_in_use", NULL, NULL);
	assert_string_equal(str(j, "operation_state"), "in_progress");
	assert_string_equal(str(j, "client_action"), "retry_same_key");
	assert_null(json_object_get(j, "original_status"));
	json_decref(j);

	/* A tombstone's answer names the stored final status. */
	problem_render(&b, NULL, 410, "idempotency_key_expired", NULL, NULL,
		       (problem_facts){ .original_status = 201 });
	j = json_loadb(b.data, b.len, 0, NULL);
	assert_non_null(j);
	assert_string_equal(str(j, "operation_state"), "completed");
	assert_string_equal(str(j, "client_action"), "do_not_retry");
	assert_int_equal(json_integer_value(json_object_get(j, "original_status")),
			 201);
	json_decref(j);
	growbuf_free(&b);

	problem_facts f = problem_facts_of(
		"upstream_outcome_unknown",
		(problem_facts){ .state = PROBLEM_STATE_OF_CODE,
				 .action = PROBLEM_RETRY_SAME_KEY });
	assert_int_equal(f.state, PROBLEM_UNKNOWN);
	assert_int_equal(f.action, PROBLEM_RETRY_SAME_KEY);
	f = problem_facts_of("idempotency_key_mismatch", (problem_facts){ 0 });
	assert_int_equal(f.state, PROBLEM_NOT_EXECUTED);
	assert_int_equal(f.action, PROBLEM_RETRY_NEW_KEY);
}

static void test_links(void **state)
{
	(void)state;
	problem_links l = { "https://docs.example.com/problems/",
			    "https://docs.example.com/problems" };
	growbuf b = { 0 }, link = { 0 };
	problem_render(&b, &l, 503, "overloaded", NULL, NULL,
		       (problem_facts){ 0 });
	json_t *j = json_loadb(b.data, b.len, 0, NULL);
	assert_non_null(j);
	assert_string_equal(str(j, "type"),
			    "https://docs.example.com/problems/overloaded");
	json_decref(j);
	assert_true(problem_link_header(&l, &link));
	assert_string_equal(link.data, "<https://docs.example.com/problems>; "
				       "rel=\"describedby\"");
	growbuf_free(&link);
	growbuf_free(&b);
	problem_links none = { NULL, "" };
	assert_false(problem_link_header(&none, &link));
	assert_false(problem_link_header(NULL, &link));
	assert_null(link.data);
}

static void test_uri_check(void **state)
{
	static const char *good[] = {
		"urn:idemproxy:problem:",
		"https://docs.example.com/problems/",
		"https://x.example/p?code=",
		"https://x.example/a%20b#",
		"tag:example.com,2026:problem:",
	};
	static const char *bad[] = {
		"",
		"docs.example.com/problems/",
		"/problems/",
		"1http://x/",
		"https://x/\"quoted\"",
		"https://x/a b",
		"https://x/<a>",
		"https://x/\r\nSet-Cookie: a=b",
		"https://x/\x01",
		"https://x/caf\xc3\xa9",
		"https://x/%zz",
		"https://x/%4",
		"https://x/back\\slash",
	};
	char why[256];

	(void)state;
	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
		if (!problem_uri_ok(good[i], why, sizeof why))
			fail_msg("%s refused: %s", good[i], why);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		why[0] = '\0';
		if (problem_uri_ok(bad[i], why, sizeof why))
			fail_msg("%s accepted", bad[i]);
		assert_true(strlen(why) > 0);
	}
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
		cmocka_unit_test(test_facts),
		cmocka_unit_test(test_links),
		cmocka_unit_test(test_uri_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
