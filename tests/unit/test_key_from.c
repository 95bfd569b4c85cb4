#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "http_msg.h"
#include "jsonptr.h"
#include "key_from.h"

/* ---- JSON pointers --------------------------------------------------- */

static jsonptr *ptr(const char *s)
{
	char why[128];
	jsonptr *p = jsonptr_parse(s, strlen(s), why, sizeof why);
	if (!p)
		fail_msg("\"%s\": %s", s, why);
	return p;
}

static void ptr_refused(const char *s, const char *needle)
{
	char why[128] = "";
	jsonptr *p = jsonptr_parse(s, strlen(s), why, sizeof why);
	if (p) {
		jsonptr_free(p);
		fail_msg("\"%s\" parsed", s);
	}
	if (!strstr(why, needle))
		fail_msg("\"%s\": got \"%s\", expected \"%s\"", s, why, needle);
}

static void test_pointer_parse(void **state)
{
	(void)state;
	jsonptr *p = ptr("");
	assert_int_equal(p->n, 0);
	jsonptr_free(p);
	p = ptr("/a~1b/~0c/");
	assert_int_equal(p->n, 3);
	assert_string_equal(p->tok[0], "a/b");
	assert_string_equal(p->tok[1], "~c");
	assert_string_equal(p->tok[2], "");
	jsonptr_free(p);
	ptr_refused("a/b", "start with '/'");
	ptr_refused("/a~2", "'~' must be followed by 0 or 1");
	ptr_refused("/a~", "'~' must be followed by 0 or 1");
	assert_null(jsonptr_parse("/a\0b", 4, (char[64]){0}, 64));
}

/* The text of the value p names in doc, or NULL when absent. */
static char *located(const char *p, const char *doc)
{
	jsonptr *jp = ptr(p);
	const char *v;
	size_t n;
	enum jsonptr_found f = jsonptr_locate(jp, doc, strlen(doc), &v, &n);
	jsonptr_free(jp);
	assert_int_not_equal(f, JSONPTR_MALFORMED);
	return f == JSONPTR_FOUND ? xstrndup(v, n) : NULL;
}

static void located_is(const char *p, const char *doc, const char *want)
{
	char *got = located(p, doc);
	if (!want) {
		if (got)
			fail_msg("%s in %s: got %s, expected nothing", p, doc,
				 got);
		return;
	}
	if (!got)
		fail_msg("%s in %s: nothing, expected %s", p, doc, want);
	assert_string_equal(got, want);
	free(got);
}

static void test_pointer_locate(void **state)
{
	(void)state;
	const char *doc = " { \"a\" : { \"b\" : [ 10 , 1.50 , {\"c\":\"x\"} ] },"
			  " \"n\": -0.0e+0, \"a/b\": 1, \"m~n\": 2, \"\": 3,"
			  " \"es\\u0063\": \"q\\\"r\" } ";
	located_is("/a/b/1", doc, "1.50");
	located_is("/a/b/0", doc, "10");
	located_is("/a/b/2/c", doc, "\"x\"");
	located_is("/a/b/2", doc, "{\"c\":\"x\"}");
	located_is("/n", doc, "-0.0e+0");
	located_is("/a~1b", doc, "1");
	located_is("/m~0n", doc, "2");
	located_is("/", doc, "3");
	located_is("/esc", doc, "\"q\\\"r\"");
	located_is("", "  7 ", "7");
	located_is("/a/b/3", doc, NULL);
	located_is("/a/b/-", doc, NULL);
	located_is("/a/b/01", doc, NULL);
	located_is("/a/x", doc, NULL);
	located_is("/n/x", doc, NULL);
	located_is("/zz", doc, NULL);
	located_is("/0", "[]", NULL);
	located_is("/a", "{}", NULL);
}

/* Pointers are read against the document before anything goes. */
static void test_pointer_remove_all(void **state)
{
	(void)state;
	json_error_t e;
	json_t *doc = json_loads("{\"a\":[1,2,3],\"b\":{\"c\":1,\"d\":2},"
				 "\"e\":true}",
				 0, &e);
	jsonptr *ps[] = {ptr("/a/0"), ptr("/a/1"), ptr("/b"), ptr("/b/c"),
			 ptr("/nothing"), ptr("")};
	jsonptr_remove_all(ps, 6, doc);
	char *s = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
	assert_string_equal(s, "{\"a\":[3],\"e\":true}");
	free(s);
	json_decref(doc);
	for (size_t i = 0; i < 6; i++)
		jsonptr_free(ps[i]);
}

static void test_string_value(void **state)
{
	(void)state;
	growbuf b = {0};
	const char *lit = "\"a\\u0062\\/\\uD83D\\uDE00\"";
	assert_int_equal(jsonptr_string_value(lit, strlen(lit), &b), 0);
	assert_string_equal(b.data, "ab/\xf0\x9f\x98\x80");
	growbuf_reset(&b);
	assert_int_equal(jsonptr_string_value("\"\\u0000\"", 8, &b), -1);
	assert_int_equal(jsonptr_string_value("\"\\uDE00\"", 8, &b), -1);
	assert_int_equal(jsonptr_string_value("\"a", 2, &b), -1);
	growbuf_free(&b);
}

/* ---- key parts ------------------------------------------------------- */

static key_from_cfg parts(const char *first, ...)
{
	key_from_cfg kp = {0};
	va_list ap;
	va_start(ap, first);
	for (const char *s = first; s; s = va_arg(ap, const char *)) {
		key_part p;
		char why[200];
		if (key_from_parse_part(s, &p, why, sizeof why) < 0 ||
		    key_from_add(&kp, &p, why, sizeof why) < 0)
			fail_msg("%s: %s", s, why);
	}
	va_end(ap);
	return kp;
}

typedef struct req {
	header_list h;
	key_from_request r;
} req;

static void req_init(req *q, const char *query, const char *body,
		     const char *ct)
{
	memset(q, 0, sizeof *q);
	q->r.headers = &q->h;
	q->r.query = query;
	q->r.query_len = query ? strlen(query) : 0;
	q->r.body = body;
	q->r.body_len = body ? strlen(body) : 0;
	q->r.content_type = ct;
}

static void hdr(req *q, const char *n, const char *v)
{
	header_list_add(&q->h, n, strlen(n), v, strlen(v));
}

static enum key_from_result key_of(const key_from_cfg *kp, req *q,
				   key_from_key *k)
{
	enum key_from_result r = key_from_key_of(kp, &q->r, k);
	return r;
}

#define JSON_CT "application/json"

static void test_each_part_alone(void **state)
{
	(void)state;
	key_from_key k;
	req q;

	key_from_cfg kp = parts("header:X-Delivery-Id", NULL);
	req_init(&q, NULL, NULL, NULL);
	hdr(&q, "x-delivery-id", "d-1");
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "3:d-1,");
	assert_string_equal(k.header_key, "");
	header_list_free(&q.h);
	key_from_free(&kp);

	kp = parts("query:event", NULL);
	req_init(&q, "a=1&event=ev%5F1+x&b", NULL, NULL);
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "6:ev_1 x,");
	key_from_free(&kp);

	kp = parts("body:/event/id", NULL);
	req_init(&q, NULL, "{\"event\": {\"id\": \"evt_9\"}}", JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "5:evt_9,");
	req_init(&q, NULL, "{\"event\": {\"id\": 1.50}}",
		 "application/vnd.x+json; charset=utf-8");
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "4:1.50,");
	req_init(&q, NULL, "{\"event\": {\"id\": 123456789012345678901234}}",
		 JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "24:123456789012345678901234,");
	key_from_free(&kp);
}

/* The default list keeps the key what the header says, in either spelling. */
static void test_bare_idempotency_key(void **state)
{
	(void)state;
	key_from_key k;
	req q;
	key_from_cfg kp = parts("header:Idempotency-Key", NULL);
	assert_true(kp.bare);
	req_init(&q, NULL, NULL, NULL);
	hdr(&q, "Idempotency-Key", "\"order-1\"");
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "order-1");
	assert_string_equal(k.header_key, "order-1");
	hdr(&q, "Idempotency-Key", "order-1");
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_INVALID);
	assert_string_equal(k.detail, "send exactly one Idempotency-Key header");
	header_list_free(&q.h);
	req_init(&q, NULL, NULL, NULL);
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_NONE);
	key_from_free(&kp);
}

static void test_combined_parts(void **state)
{
	(void)state;
	key_from_key k;
	req q;
	key_from_cfg kp = parts("header:Idempotency-Key", "body:/order_id",
				"body:/status", "query:v", NULL);
	assert_false(kp.bare);
	req_init(&q, "v=2", "{\"status\":\"paid\",\"order_id\":42}", JSON_CT);
	hdr(&q, "Idempotency-Key", "\"a b\"");
	assert_int_equal(key_of(&kp, &q, &k), KEY_FROM_OK);
	assert_string_equal(k.key, "3:a b,2:42,4:paid,1:2,");
	assert_string_equal(k.header_key, "a b");
	header_list_free(&q.h);
	key_from_free(&kp);
}

/* ["a", "bc"] and ["ab", "c"] are different keys. */
static void test_no_two_lists_make_one_key(void **state)
{
	(void)state;
	key_from_key k1, k2;
	req q;
	key_from_cfg kp = parts("body:/x", "body:/y", NULL);
	req_init(&q, NULL, "{\"x\":\"a\",\"y\":\"bc\"}", JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k1), KEY_FROM_OK);
	req_init(&q, NULL, "{\"x\":\"ab\",\"y\":\"c\"}", JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k2), KEY_FROM_OK);
	assert_string_not_equal(k1.key, k2.key);
	/* A value that spells a netstring cannot shift the boundary. */
	req_init(&q, NULL, "{\"x\":\"a,1:b\",\"y\":\"c\"}", JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k1), KEY_FROM_OK);
	req_init(&q, NULL, "{\"x\":\"a\",\"y\":\"b,1:c\"}", JSON_CT);
	assert_int_equal(key_of(&kp, &q, &k2), KEY_FROM_OK);
	assert_string_not_equal(k1.key, k2.key);
	key_from_free(&kp);
}

static void expect(const key_from_cfg *kp, req *q, enum key_from_result want,
		   const char *needle)
{
	key_from_key k;
	enum key_from_result got = key_of(kp, q, &k);
	if (got != want || !strstr(k.detail, needle))
		fail_msg("got %d \"%s\", expected %d \"...%s...\"", got,
			 k.detail, want, needle);
}

static void test_missing_and_invalid_parts(void **state)
{
	(void)state;
	req q;
	key_from_cfg kp = parts("header:X-D", "body:/id", NULL);
	req_init(&q, NULL, "{\"id\":\"1\"}", JSON_CT);
	expect(&kp, &q, KEY_FROM_MISSING, "header:X-D is missing");
	req_init(&q, NULL, "{\"other\":1}", JSON_CT);
	hdr(&q, "X-D", "1");
	expect(&kp, &q, KEY_FROM_MISSING, "body:/id is not in the body");
	q.r.body = "not json";
	q.r.body_len = 8;
	expect(&kp, &q, KEY_FROM_MISSING, "not valid JSON");
	q.r.body = "{\"id\":1,\"id\":2}";
	q.r.body_len = strlen(q.r.body);
	expect(&kp, &q, KEY_FROM_MISSING, "not valid JSON");
	/* A NUL is never JSON text (jansson skips one after a number, the
	 * walker does not: the two must not disagree on what the body is). */
	static const char with_nul[] = "{\"x\":0\0,\"id\":\"1\"}";
	q.r.body = with_nul;
	q.r.body_len = sizeof with_nul - 1;
	expect(&kp, &q, KEY_FROM_MISSING, "not valid JSON");
	q.r.body = "{\"id\":\"1\"}";
	q.r.body_len = strlen(q.r.body);
	q.r.content_type = "text/plain";
	expect(&kp, &q, KEY_FROM_MISSING, "needs a JSON body");
	q.r.content_type = JSON_CT;
	static const struct {
		const char *body, *needle;
	} bad[] = {
		{"{\"id\":{}}", "is an object"},
		{"{\"id\":[1]}", "is an array"},
		{"{\"id\":null}", "is null"},
		{"{\"id\":true}", "is a boolean"},
		{"{\"id\":\"\"}", "is empty"},
		{"{\"id\":\"caf\\u00e9\"}", "non-ASCII"},
		{"{\"id\":\"a\\nb\"}", "control character"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		q.r.body = bad[i].body;
		q.r.body_len = strlen(bad[i].body);
		expect(&kp, &q, KEY_FROM_INVALID, bad[i].needle);
	}
	char big[400];
	snprintf(big, sizeof big, "{\"id\":\"%0300d\"}", 0);
	q.r.body = big;
	q.r.body_len = strlen(big);
	expect(&kp, &q, KEY_FROM_INVALID, "longer than 255");
	hdr(&q, "x-d", "2");
	expect(&kp, &q, KEY_FROM_INVALID, "header:X-D is sent more than once");
	header_list_free(&q.h);
	key_from_free(&kp);

	kp = parts("query:k", NULL);
	req_init(&q, "k=1&k=2", NULL, NULL);
	expect(&kp, &q, KEY_FROM_INVALID, "more than once");
	req_init(&q, "k=%zz", NULL, NULL);
	expect(&kp, &q, KEY_FROM_INVALID, "%-escape");
	req_init(&q, "k=", NULL, NULL);
	expect(&kp, &q, KEY_FROM_INVALID, "is empty");
	req_init(&q, "kk=1", NULL, NULL);
	expect(&kp, &q, KEY_FROM_NONE, "query:k is missing");
	key_from_free(&kp);
}

/* Only a request without any part at all may pass an optional key by. */
static void test_none_only_when_no_part_is_there(void **state)
{
	(void)state;
	req q;
	key_from_cfg kp = parts("header:X-D", "query:k", NULL);
	req_init(&q, "k=1", NULL, NULL);
	expect(&kp, &q, KEY_FROM_MISSING, "header:X-D is missing");
	req_init(&q, "", NULL, NULL);
	expect(&kp, &q, KEY_FROM_NONE, "");
	key_from_free(&kp);
}

static void test_part_specs(void **state)
{
	(void)state;
	key_part p;
	char why[200];
	assert_int_equal(key_from_parse_part("cookie:x", &p, why, sizeof why),
			 -1);
	assert_non_null(strstr(why, "must be \"header:NAME\""));
	assert_int_equal(key_from_parse_part("header:a b", &p, why, sizeof why),
			 -1);
	assert_int_equal(key_from_parse_part("query:", &p, why, sizeof why),
			 -1);
	assert_int_equal(key_from_parse_part("body:x", &p, why, sizeof why),
			 -1);
	assert_non_null(strstr(why, "bad JSON pointer"));
	key_from_cfg kp = parts("header:A", NULL);
	assert_int_equal(key_from_parse_part("header:a", &p, why, sizeof why),
			 0);
	assert_int_equal(key_from_add(&kp, &p, why, sizeof why), -1);
	assert_non_null(strstr(why, "listed twice"));
	assert_true(key_from_uses_header(&kp, "a"));
	assert_false(key_from_uses_header(&kp, "b"));
	key_from_free(&kp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pointer_parse),
		cmocka_unit_test(test_pointer_locate),
		cmocka_unit_test(test_pointer_remove_all),
		cmocka_unit_test(test_string_value),
		cmocka_unit_test(test_each_part_alone),
		cmocka_unit_test(test_bare_idempotency_key),
		cmocka_unit_test(test_combined_parts),
		cmocka_unit_test(test_no_two_lists_make_one_key),
		cmocka_unit_test(test_missing_and_invalid_parts),
		cmocka_unit_test(test_none_only_when_no_part_is_there),
		cmocka_unit_test(test_part_specs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
