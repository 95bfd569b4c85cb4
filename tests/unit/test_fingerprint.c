#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"

/* ---- canonical JSON ---- */

static char *canon(const char *in)
{
	growbuf b = { 0 };
	if (fp_canon_json(in, strlen(in), &b) != 0) {
		growbuf_free(&b);
		return NULL;
	}
	return b.data ? b.data : xstrdup("");
}

static void canon_is(const char *in, const char *expect)
{
	char *got = canon(in);
	if (got == NULL)
		fail_msg("canon(%s) failed", in);
	assert_string_equal(got, expect);
	free(got);
}

static void canon_fails(const char *in)
{
	growbuf b = { 0 };
	growbuf_puts(&b, "keep");
	assert_int_equal(fp_canon_json(in, strlen(in), &b), -1);
	/* out untouched on failure */
	assert_int_equal(b.len, 4);
	assert_string_equal(b.data, "keep");
	growbuf_free(&b);
}

static void test_canon_sorts_and_compacts(void **state)
{
	(void)state;
	canon_is("{\"b\":2,\"a\":1}", "{\"a\":1,\"b\":2}");
	canon_is("{\"a\":1, \"b\":2}", "{\"a\":1,\"b\":2}");
	canon_is(" \n\t{ \"z\" : [ 1 , 2 , { \"y\" : null , \"x\" : true } ] }\r\n",
		 "{\"z\":[1,2,{\"x\":true,\"y\":null}]}");
	canon_is("[3,1,2]", "[3,1,2]");	/* arrays keep their order */
	canon_is("{}", "{}");
	canon_is("[]", "[]");
	/* keys sort by bytes: upper case before lower, UTF-8 last */
	canon_is("{\"b\":1,\"B\":2,\"\xc3\xa9\":3,\"a\":4}",
		 "{\"B\":2,\"a\":4,\"b\":1,\"\xc3\xa9\":3}");
	canon_is("{\"ab\":1,\"a\":2}", "{\"a\":2,\"ab\":1}");
}

static void test_canon_scalars_and_strings(void **state)
{
	(void)state;
	canon_is("42", "42");
	canon_is(" \"x\" ", "\"x\"");
	canon_is("true", "true");
	canon_is("null", "null");
	canon_is("-0", "0");
	canon_is("1.5", "1.5");
	canon_is("1.50", "1.5");
	canon_is("15e-1", "1.5");
	canon_is("\"\\u00e9\"", "\"\xc3\xa9\"");
	canon_is("\"\xc3\xa9\"", "\"\xc3\xa9\"");
	canon_is("\"a\\/b\"", "\"a/b\"");
	canon_is("\"q\\\"\\\\\\n\\u0001\"", "\"q\\\"\\\\\\n\\u0001\"");
	canon_is("9223372036854775807", "9223372036854775807");
}

static void test_canon_rejects(void **state)
{
	(void)state;
	canon_fails("");
	canon_fails("   ");
	canon_fails("{bad");
	canon_fails("{\"a\":1,}");
	canon_fails("[1,2");
	canon_fails("{\"a\":1}{");
	canon_fails("{\"a\":1} x");
	canon_fails("{'a':1}");
	canon_fails("{\"a\":1,\"a\":2}");	/* duplicate keys */
	canon_fails("\"\\u0000\"");
	canon_fails("\"\xff\"");		/* invalid UTF-8 */
	canon_fails("NaN");
	canon_fails("1e999");
	canon_fails("99999999999999999999");	/* beyond int64 */
	assert_int_equal(fp_canon_json("[1]\0", 4, &(growbuf){ 0 }), -1);
}

/* Numbers that a double cannot hold exactly are not canonicalised, so two
 * amounts that differ only past the 15th digit never compare equal. */
static void test_canon_refuses_lossy_numbers(void **state)
{
	(void)state;
	canon_fails("0.1000000000000000001");
	canon_fails("{\"amount\":12345678901234567.5}");
	canon_fails("[1.0000000000000001]");
	canon_fails("1e-400");
	canon_fails("1e301");
	canon_fails("[\"ok\", 2.00000000000000000001]");
	canon_is("123456789012345.0", "123456789012345.0");
	canon_is("0.000000000000000000001", "1e-21");
	canon_is("0.1", "0.1");
	canon_is("[0.10, 1e-1, 0.01e1]", "[0.1,0.1,0.1]");
	canon_is("123.456789012345", "123.456789012345");
	canon_is("-2.5E+3", "-2500.0");
	canon_is("1e-300", "1e-300");
	canon_is("1e300", "1e300");
	canon_is("1E+300", "1e300");
	canon_is("0e999999", "0.0");
	canon_is("0.0000", "0.0");
	canon_is("100.000000000000000000000", "100.0");
	/* digits inside strings do not count */
	canon_is("{\"n\":\"0.1000000000000000001\"}",
		 "{\"n\":\"0.1000000000000000001\"}");
	canon_is("{\"s\":\"\\\"1.00000000000000000001\"}",
		 "{\"s\":\"\\\"1.00000000000000000001\"}");
}

/* Property: every spelling of a number with at most 15 significant digits
 * canonicalises to one text, and neighbouring values never merge. */
static void test_canon_numbers_property(void **state)
{
	uint64_t seed = 42;
	char t1[64], t2[64], t3[64], t4[64];

	(void)state;
	for (int i = 0; i < 20000; i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		long long mant = (long long)((seed >> 11) % 999999999999999ULL) + 1;
		int e = (int)((seed >> 3) % 560) - 280;
		snprintf(t1, sizeof t1, "%llde%d", mant, e);
		snprintf(t2, sizeof t2, "%lld000E%d", mant, e - 3);
		snprintf(t3, sizeof t3, "%lld.0e%+d", mant, e);
		snprintf(t4, sizeof t4, "%llde%d", mant + 1, e);
		char *c1 = canon(t1), *c2 = canon(t2), *c3 = canon(t3);
		char *c4 = canon(t4);
		assert_non_null(c1);
		assert_non_null(c2);
		assert_non_null(c3);
		assert_non_null(c4);
		assert_string_equal(c1, c2);
		assert_string_equal(c1, c3);
		assert_string_not_equal(c1, c4);
		free(c1);
		free(c2);
		free(c3);
		free(c4);
	}
}

static void test_canon_deep_nesting(void **state)
{
	size_t depth = 100000;
	char *deep = malloc(2 * depth + 1);

	(void)state;
	assert_non_null(deep);
	memset(deep, '[', depth);
	memset(deep + depth, ']', depth);
	deep[2 * depth] = '\0';
	canon_fails(deep);

	/* Deep objects too: {"a":{"a":... */
	growbuf obj = { 0 };
	for (size_t i = 0; i < depth; i++)
		growbuf_puts(&obj, "{\"a\":");
	growbuf_puts(&obj, "1");
	for (size_t i = 0; i < depth; i++)
		growbuf_puts(&obj, "}");
	canon_fails(obj.data);

	/* Unclosed deep nesting fails the same way. */
	deep[depth] = '\0';
	canon_fails(deep);

	/* Moderate nesting still works. */
	memset(deep, '[', 100);
	memset(deep + 100, ']', 100);
	deep[200] = '\0';
	char *c = canon(deep);
	assert_non_null(c);
	assert_string_equal(c, deep);
	free(c);
	growbuf_free(&obj);
	free(deep);
}

static void test_canon_appends(void **state)
{
	growbuf b = { 0 };

	(void)state;
	growbuf_puts(&b, "pre:");
	assert_int_equal(fp_canon_json("{\"b\":1,\"a\":2}", 13, &b), 0);
	assert_string_equal(b.data, "pre:{\"a\":2,\"b\":1}");
	/* len is honoured: the tail beyond it is not part of the text */
	assert_int_equal(fp_canon_json("[1]garbage", 3, &b), 0);
	assert_string_equal(b.data, "pre:{\"a\":2,\"b\":1}[1]");
	growbuf_free(&b);
}

/* ---- media types ---- */

static void mt_is(const char *ct, const char *expect)
{
	char out[64];
	memset(out, 'X', sizeof out);
	fp_media_type(ct, out, sizeof out);
	assert_string_equal(out, expect);
}

static void test_media_type(void **state)
{
	char small[5];

	(void)state;
	mt_is("application/json", "application/json");
	mt_is("application/JSON; charset=utf-8", "application/json");
	mt_is("  Application/Json  ;charset=UTF-8", "application/json");
	mt_is("text/plain;a=1;b=2", "text/plain");
	mt_is("", "");
	mt_is(";charset=utf-8", "");
	mt_is(NULL, "");
	fp_media_type("application/json", small, sizeof small);
	assert_string_equal(small, "appl");
	fp_media_type("x", NULL, 0);	/* tolerated */

	assert_true(fp_is_json_media_type("application/json"));
	assert_true(fp_is_json_media_type("APPLICATION/JSON"));
	assert_true(fp_is_json_media_type("application/vnd.api+json"));
	assert_true(fp_is_json_media_type("application/problem+json"));
	assert_true(fp_is_json_media_type("text/x+json"));
	assert_false(fp_is_json_media_type("text/plain"));
	assert_false(fp_is_json_media_type("text/json"));
	assert_false(fp_is_json_media_type("application/json5"));
	assert_false(fp_is_json_media_type("application/jsonx"));
	assert_false(fp_is_json_media_type("application/x-json"));
	assert_false(fp_is_json_media_type("application/+json"));
	assert_false(fp_is_json_media_type("+json"));
	assert_false(fp_is_json_media_type("/x+json"));
	assert_false(fp_is_json_media_type("application/json; charset=utf-8"));
	assert_false(fp_is_json_media_type(""));
	assert_false(fp_is_json_media_type(NULL));
}

/* ---- fp_compute ---- */

static fp_input base(void)
{
	return (fp_input){
		.method = "POST",
		.route = "create_payment",
		.raw_target = "/v1/payments?x=1",
		.content_type = "application/json",
		.body = "{\"a\":1, \"b\":2}",
		.body_len = strlen("{\"a\":1, \"b\":2}"),
	};
}

static void fp(const fp_input *in, uint8_t out[FP_LEN])
{
	memset(out, 0, FP_LEN);
	fp_compute(in, out);
}

static void with_body(fp_input *in, const char *body)
{
	in->body = body;
	in->body_len = strlen(body);
}

static void assert_same(const fp_input *a, const fp_input *b)
{
	uint8_t x[FP_LEN], y[FP_LEN];
	fp(a, x);
	fp(b, y);
	assert_memory_equal(x, y, FP_LEN);
}

static void assert_differ(const fp_input *a, const fp_input *b)
{
	uint8_t x[FP_LEN], y[FP_LEN];
	fp(a, x);
	fp(b, y);
	assert_memory_not_equal(x, y, FP_LEN);
}

static jsonptr *ptr(const char *s)
{
	char why[128];
	jsonptr *p = jsonptr_parse(s, strlen(s), why, sizeof why);
	assert_non_null(p);
	return p;
}

/* fingerprint_ignore: a difference in an ignored value is no difference;
 * one in a kept value is; key order and whitespace still never matter. */
static void test_fp_ignore(void **state)
{
	(void)state;
	jsonptr *ign[] = {ptr("/sent_at"), ptr("/meta/trace"), ptr("/nope")};
	fp_input a = base(), b = base();
	a.ignore = b.ignore = ign;
	a.n_ignore = b.n_ignore = 3;
	with_body(&a, "{\"amount\":5,\"sent_at\":\"10:00\","
		      "\"meta\":{\"trace\":1,\"x\":2}}");
	with_body(&b, "{ \"meta\" : {\"x\":2, \"trace\":9},"
		      " \"sent_at\":\"10:05\", \"amount\" : 5 }");
	assert_same(&a, &b);
	/* An ignored value with more digits than a double keeps. */
	with_body(&b, "{\"amount\":5,\"sent_at\":1717171717.1234567891,"
		      "\"meta\":{\"trace\":1,\"x\":2}}");
	assert_same(&a, &b);
	with_body(&b, "{\"amount\":6,\"sent_at\":\"10:00\","
		      "\"meta\":{\"trace\":1,\"x\":2}}");
	assert_differ(&a, &b);
	/* Absent and ignored are the same payload. */
	with_body(&b, "{\"amount\":5,\"meta\":{\"x\":2}}");
	assert_same(&a, &b);
	/* Not the same as the whole body without an ignore list. */
	fp_input c = a;
	c.n_ignore = 0;
	with_body(&c, "{\"amount\":5,\"meta\":{\"x\":2}}");
	assert_differ(&a, &c);
	/* A kept number beyond 15 digits: the body is hashed whole. */
	with_body(&a, "{\"amount\":1.0000000000000001,\"sent_at\":1}");
	with_body(&b, "{\"amount\":1.0000000000000001,\"sent_at\":2}");
	assert_differ(&a, &b);
	for (size_t i = 0; i < 3; i++)
		jsonptr_free(ign[i]);
}

static void raw_is_same(const fp_input *a, const fp_input *b, bool same)
{
	growbuf x = {0}, y = {0};
	assert_true(fp_raw_form(a, 1 << 20, &x));
	assert_true(fp_raw_form(b, 1 << 20, &y));
	assert_int_equal(same, x.len == y.len && !memcmp(x.data, y.data, x.len));
	growbuf_free(&x);
	growbuf_free(&y);
}

/* The raw form: equal for a request sent again byte for byte (and then
 * the fingerprint is equal too), different for another spelling of the
 * same JSON (which the fingerprint still equates), for any field, for
 * another ignore or only list, and when it would not fit. */
static void test_fp_raw_form(void **state)
{
	(void)state;
	fp_input a = base(), b = base();
	raw_is_same(&a, &b, true);
	assert_same(&a, &b);

	with_body(&b, "{\"b\":2,\"a\":1}");
	assert_same(&a, &b);
	raw_is_same(&a, &b, false);

	b = base();
	b.raw_target = "/v1/payments?x=2";
	raw_is_same(&a, &b, false);
	b = base();
	b.route = "other";
	raw_is_same(&a, &b, false);
	b = base();
	b.content_type = NULL;
	raw_is_same(&a, &b, false);
	/* A field's bytes cannot slide into the next one. */
	fp_input c = base(), d = base();
	c.method = "POS";
	c.route = "Tcreate_payment";
	d.method = "POST";
	d.route = "create_payment";
	raw_is_same(&c, &d, false);

	jsonptr *ign[] = {ptr("/a")}, *ign2[] = {ptr("/b")};
	b = base();
	b.ignore = ign;
	b.n_ignore = 1;
	raw_is_same(&a, &b, false);
	c = base();
	c.ignore = ign2;
	c.n_ignore = 1;
	raw_is_same(&b, &c, false);
	c = base();
	c.only = ign;
	c.n_only = 1;
	raw_is_same(&b, &c, false);

	growbuf x = {0};
	assert_false(fp_raw_form(&a, a.body_len, &x));
	assert_true(fp_raw_form(&a, 4096, &x));
	assert_false(fp_raw_form(&a, x.len - 1, &x));
	growbuf_free(&x);
	jsonptr_free(ign[0]);
	jsonptr_free(ign2[0]);
}

/* fingerprint_only: only the named values make the payload. */
static void test_fp_only(void **state)
{
	(void)state;
	jsonptr *only[] = {ptr("/amount"), ptr("/currency")};
	fp_input a = base(), b = base();
	a.only = b.only = only;
	a.n_only = b.n_only = 2;
	with_body(&a, "{\"amount\":{\"v\":1,\"u\":2},\"currency\":\"EUR\","
		      "\"note\":\"a\"}");
	with_body(&b, "{\"note\":\"b\",\"currency\":\"EUR\","
		      "\"amount\":{\"u\":2, \"v\":1}}");
	assert_same(&a, &b);
	with_body(&b, "{\"currency\":\"USD\",\"amount\":{\"u\":2,\"v\":1}}");
	assert_differ(&a, &b);
	/* Absent differs from present, and the values keep their places. */
	with_body(&a, "{\"amount\":\"EUR\"}");
	with_body(&b, "{\"currency\":\"EUR\"}");
	assert_differ(&a, &b);
	/* Not JSON: the whole body counts. */
	with_body(&a, "amount=1&note=a");
	with_body(&b, "amount=1&note=b");
	assert_differ(&a, &b);
	jsonptr_free(only[0]);
	jsonptr_free(only[1]);
}

static void test_fp_deterministic(void **state)
{
	fp_input a = base();
	uint8_t x[FP_LEN], zero[FP_LEN] = { 0 };

	(void)state;
	fp(&a, x);
	assert_memory_not_equal(x, zero, FP_LEN);
	assert_same(&a, &a);
}

static void test_fp_json_canonical(void **state)
{
	fp_input a = base(), b = base();

	(void)state;
	with_body(&b, "{\"b\":2,\"a\":1}");
	assert_same(&a, &b);
	with_body(&b, "\n{ \"b\" : 2 ,\n \"a\" : 1 }\n");
	assert_same(&a, &b);
	with_body(&b, "{\"a\":1,\"b\":3}");
	assert_differ(&a, &b);
	with_body(&b, "{\"a\":1,\"b\":\"2\"}");
	assert_differ(&a, &b);
	with_body(&b, "{\"a\":1}");
	assert_differ(&a, &b);

	/* Media type parameters and case do not matter. */
	b = base();
	b.content_type = "Application/JSON; charset=utf-8";
	with_body(&b, "{\"b\":2,\"a\":1}");
	assert_same(&a, &b);

	/* +json types are canonicalised too. */
	a.content_type = "application/vnd.api+json";
	b.content_type = "application/vnd.api+json";
	assert_same(&a, &b);
}

static void test_fp_invalid_json_hashed_raw(void **state)
{
	fp_input a = base(), b = base();

	(void)state;
	with_body(&a, "{bad");
	with_body(&b, "{bad ");
	assert_differ(&a, &b);
	with_body(&b, "{bad");
	assert_same(&a, &b);
	/* Duplicate keys are not canonicalised: order and spacing count. */
	with_body(&a, "{\"a\":1,\"a\":2}");
	with_body(&b, "{\"a\":1, \"a\":2}");
	assert_differ(&a, &b);
	/* Lossy numbers are hashed raw as well. */
	with_body(&a, "{\"x\":0.10000000000000000001}");
	with_body(&b, "{\"x\":0.10000000000000000002}");
	assert_differ(&a, &b);
	with_body(&b, "{\"x\":0.1}");
	assert_differ(&a, &b);
}

static void test_fp_non_json_not_canonicalised(void **state)
{
	fp_input a = base(), b = base();

	(void)state;
	a.content_type = b.content_type = "text/plain";
	with_body(&b, "{\"b\":2,\"a\":1}");
	assert_differ(&a, &b);
	with_body(&b, "{\"a\":1,\"b\":2}");
	assert_differ(&a, &b);	/* whitespace matters */
	with_body(&b, "{\"a\":1, \"b\":2}");
	assert_same(&a, &b);

	a.content_type = b.content_type = NULL;
	assert_same(&a, &b);
	with_body(&b, "{\"a\":1,\"b\":2}");
	assert_differ(&a, &b);
}

static void test_fp_each_field_counts(void **state)
{
	fp_input a = base(), b;

	(void)state;
	b = base(); b.method = "PATCH"; assert_differ(&a, &b);
	b = base(); b.method = "post"; assert_differ(&a, &b);
	b = base(); b.route = "capture"; assert_differ(&a, &b);
	b = base(); b.raw_target = "/v1/payments?x=2"; assert_differ(&a, &b);
	b = base(); b.raw_target = "/v1/payments"; assert_differ(&a, &b);
	b = base(); b.raw_target = "/v1/payments?x=1&"; assert_differ(&a, &b);
	b = base(); b.content_type = "application/vnd.api+json";
	assert_differ(&a, &b);
	b = base(); b.content_type = "text/plain"; assert_differ(&a, &b);
	b = base(); b.content_type = NULL; assert_differ(&a, &b);
	b = base(); with_body(&b, ""); assert_differ(&a, &b);
}

static void test_fp_field_boundaries(void **state)
{
	fp_input a = base(), b = base();

	(void)state;
	a.content_type = b.content_type = "text/plain";
	a.raw_target = "/ab";
	with_body(&a, "c");
	b.raw_target = "/a";
	with_body(&b, "bc");
	assert_differ(&a, &b);

	a = base(); b = base();
	a.method = "POS"; a.route = "Tx";
	b.method = "POST"; b.route = "x";
	assert_differ(&a, &b);

	a = base(); b = base();
	a.route = "r/"; a.raw_target = "x";
	b.route = "r"; b.raw_target = "/x";
	assert_differ(&a, &b);

	/* Body length is honoured, including NUL bytes inside it. */
	a = base(); b = base();
	a.content_type = b.content_type = "application/octet-stream";
	a.body = "ab\0cd"; a.body_len = 5;
	b.body = "ab\0ce"; b.body_len = 5;
	assert_differ(&a, &b);
	b.body = "ab\0cdEXTRA";
	assert_same(&a, &b);
	b.body_len = 2;
	assert_differ(&a, &b);

	/* A NULL body and an empty one are the same payload. */
	a.body = NULL; a.body_len = 0;
	b.body = ""; b.body_len = 0;
	assert_same(&a, &b);
}

static void test_fp_headers(void **state)
{
	const char *names[] = { "X-Account", "X-Currency" };
	const char *lower_names[] = { "x-account", "x-currency" };
	const char *v1[] = { "acct_1", "EUR" };
	const char *v2[] = { "acct_1", "USD" };
	const char *v_empty[] = { "acct_1", "" };
	const char *v_absent[] = { "acct_1", NULL };
	const char *v_swap1[] = { "acct_1EUR", "" };
	const char *v_swap2[] = { "acct_", "1EUR" };
	const char *other_names[] = { "X-Account", "X-Other" };
	fp_input a = base(), b = base();

	(void)state;
	a.n_headers = b.n_headers = 2;
	a.header_names = names;
	b.header_names = lower_names;
	a.header_values = b.header_values = v1;
	assert_same(&a, &b);	/* header names are case-insensitive */

	b.header_values = v2;
	assert_differ(&a, &b);

	a.header_values = v_empty;
	b.header_values = v_absent;
	assert_differ(&a, &b);	/* empty is not absent */

	a.header_values = v_swap1;
	b.header_values = v_swap2;
	assert_differ(&a, &b);

	a.header_values = b.header_values = v1;
	b.header_names = other_names;
	assert_differ(&a, &b);

	/* No headers configured vs one configured but absent differ. */
	a = base(); b = base();
	b.n_headers = 1;
	b.header_names = names;
	b.header_values = v_absent + 1;
	assert_differ(&a, &b);

	/* Header values are case-sensitive. */
	const char *lc[] = { "acct_1", "eur" };
	a = base(); b = base();
	a.n_headers = b.n_headers = 2;
	a.header_names = b.header_names = names;
	a.header_values = v1;
	b.header_values = lc;
	assert_differ(&a, &b);
}

static void assert_hex(const fp_input *in, const char *expect)
{
	uint8_t x[FP_LEN];
	char hex[2 * FP_LEN + 1];

	fp(in, x);
	hex_encode(x, FP_LEN, hex);
	assert_string_equal(hex, expect);
}

/* Pins the encoding against an independent computation (Python hashlib
 * over the documented layout: each field as a 64-bit big-endian length and
 * its bytes; header count; per header the lower-cased name, then 0x00 for
 * absent or 0x01 and the value; body marker 0x02 raw / 0x03 canonical and
 * the body). A change here changes every stored fingerprint, which makes
 * in-flight retries look like mismatches, so it must be deliberate. */
static void test_fp_known_answer(void **state)
{
	fp_input a = base();

	(void)state;
	assert_hex(&a, "b52b9537f6ddff0e77df0d9dc32ea3e14de8c635ae1ebe4a"
		       "542397e8f66d44ec");

	const char *names[] = { "X-Account", "X-Currency" };
	const char *values[] = { "acct_1", NULL };
	fp_input b = {
		.method = "PATCH",
		.route = "r",
		.raw_target = "/t",
		.content_type = " Text/Plain ; charset=utf-8",
		.n_headers = 2,
		.header_names = names,
		.header_values = values,
		.body = "hi",
		.body_len = 2,
	};
	assert_hex(&b, "d693fa2443022e7286386c2a0015a696f370fbbf39fc5bf9"
		       "84801f99701a679d");
}

struct thread_arg {
	uint8_t expect[FP_LEN];
	int bad;
};

static void *hash_many(void *p)
{
	struct thread_arg *arg = p;
	fp_input a = base();
	uint8_t x[FP_LEN];

	for (int i = 0; i < 2000; i++) {
		fp_compute(&a, x);
		if (memcmp(x, arg->expect, FP_LEN) != 0)
			arg->bad++;
	}
	return NULL;
}

static void test_fp_threads(void **state)
{
	pthread_t th[4];
	struct thread_arg args[4];
	fp_input a = base();

	(void)state;
	for (int i = 0; i < 4; i++) {
		fp(&a, args[i].expect);
		args[i].bad = 0;
		assert_int_equal(pthread_create(&th[i], NULL, hash_many, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(args[i].bad, 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_canon_sorts_and_compacts),
		cmocka_unit_test(test_canon_scalars_and_strings),
		cmocka_unit_test(test_canon_rejects),
		cmocka_unit_test(test_canon_refuses_lossy_numbers),
		cmocka_unit_test(test_canon_numbers_property),
		cmocka_unit_test(test_canon_deep_nesting),
		cmocka_unit_test(test_canon_appends),
		cmocka_unit_test(test_media_type),
		cmocka_unit_test(test_fp_deterministic),
		cmocka_unit_test(test_fp_raw_form),
		cmocka_unit_test(test_fp_json_canonical),
		cmocka_unit_test(test_fp_invalid_json_hashed_raw),
		cmocka_unit_test(test_fp_non_json_not_canonicalised),
		cmocka_unit_test(test_fp_each_field_counts),
		cmocka_unit_test(test_fp_field_boundaries),
		cmocka_unit_test(test_fp_headers),
		cmocka_unit_test(test_fp_known_answer),
		cmocka_unit_test(test_fp_threads),
		cmocka_unit_test(test_fp_ignore),
		cmocka_unit_test(test_fp_only),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
