#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void quoted_is(const char *v, const char *want)
{
	growbuf b = {0};
	log_quote(&b, v);
	assert_string_equal(b.data, want);
	growbuf_free(&b);
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
	growbuf b = {0};

	(void)state;
	log_field(&b, "a", "1");
	log_field(&b, "b", NULL);
	log_field(&b, "c", "x y");
	assert_string_equal(b.data, "a=1 b=- c=\"x y\"");
	growbuf_free(&b);
}

/* The reference: the request line as jansson made it before it was
 * written by hand (src/log.c: set_str, ms3, json_dumps with the same
 * flags). */
static void ref_escaped(growbuf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c < 0x7f)
			growbuf_append(b, s, 1);
		else
			growbuf_printf(b, "\\x%02x", c);
	}
}

static void ref_str(json_t *o, const char *k, const char *v)
{
	if (!v) {
		json_object_set_new(o, k, json_null());
		return;
	}
	json_t *j = json_stringn(v, strlen(v));
	if (!j) {
		growbuf e = {0};
		ref_escaped(&e, v);
		j = json_stringn(e.data ? e.data : "", e.len);
		growbuf_free(&e);
	}
	json_object_set_new(o, k, j);
}

static double ref_ms3(double ms)
{
	if (!(fabs(ms) < 9e15))
		return ms;
	return (double)(int64_t)(ms * 1000.0 + 0.5) / 1000.0;
}

static char *reference_line(const log_request *r, const char *ts)
{
	json_t *o = json_object();
	json_object_set_new(o, "time", json_string(ts));
	json_object_set_new(o, "level", json_string("info"));
	json_object_set_new(o, "msg", json_string("request"));
	ref_str(o, "request_id", r->request_id);
	ref_str(o, "trace_id", r->trace_id);
	ref_str(o, "route", r->route);
	ref_str(o, "method", r->method);
	ref_str(o, "path", r->path);
	ref_str(o, "tenant", r->tenant);
	ref_str(o, "key", r->key);
	ref_str(o, "outcome", r->outcome);
	json_object_set_new(o, "status", json_integer(r->status));
	json_object_set_new(o, "attempt", json_integer(r->attempt));
	json_object_set_new(o, "upstream_ms", json_real(ref_ms3(r->upstream_ms)));
	json_object_set_new(o, "store_ms", json_real(ref_ms3(r->store_ms)));
	json_object_set_new(o, "total_ms", json_real(ref_ms3(r->total_ms)));
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER |
				   JSON_REAL_PRECISION(10));
	json_decref(o);
	return s;
}

static void same_as_reference(const log_request *r)
{
	const char *ts = "2026-12-01T12:00:00.123Z";
	char *want = reference_line(r, ts);
	assert_non_null(want);
	growbuf got = {0};
	log_request_json(&got, r, ts);
	if (strcmp(got.data, want)) {
		fprintf(stderr, "want %s\ngot  %s\n", want, got.data);
		fail();
	}
	/* What the hand-made line says is what was logged. */
	json_error_t err;
	json_t *back = json_loads(got.data, 0, &err);
	assert_non_null(back);
	json_decref(back);
	growbuf_free(&got);
	free(want);
}

static void test_request_line_fixed(void **state)
{
	(void)state;
	log_request r = {"abc123", "create_payment", "POST", "/v1/payments",
			 "default", "k-1", "forwarded", 201, 1,
			 8.5071, 2.0, 11.4669, NULL};
	same_as_reference(&r);
	const char *odd[] = {
		"", "a\"b\\c/d", "\b\f\n\r\t\x01\x1f\x7f", "caf\xc3\xa9",
		"caf\xe9", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"\xf0\x9f\x92\xb3 card", "\xe2\x82", "\xff\xfe", "x\xc3",
		"\xe0\x9f\xbf", "\xf0\x8f\xbf\xbf", "\xef\xbf\xbf\\x41",
	};
	for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
		r.key = odd[i];
		r.path = odd[(i + 3) % (sizeof odd / sizeof odd[0])];
		r.tenant = i % 2 ? NULL : odd[i];
		r.trace_id = i % 3 ? NULL : "4bf92f3577b34da6a3ce929d0e0e4736";
		same_as_reference(&r);
	}
	double ms[] = {0, 0.0004, 0.0005, 1, 10, 123.456789, 1e9, 1.5e10,
		       123456789012.345, -3.25, 9.999999e15, 1e17, 1e300,
		       -1e300, NAN, INFINITY, -0.0, 9999999.999, 10000000.001, 0.001, 8.507};
	for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
		r.upstream_ms = ms[i];
		r.store_ms = -ms[i];
		r.total_ms = ms[i] / 7;
		r.status = (int)i * 1000 - 3000;
		r.attempt = -(int)i;
		same_as_reference(&r);
	}
}

/* Random fields: bytes of every kind, UTF-8 sequences whole and broken,
 * random magnitudes. */
static void test_request_line_random(void **state)
{
	(void)state;
	static const unsigned char pieces[][4] = {
		{'a'}, {'"'}, {'\\'}, {'/'}, {0x01}, {0x1f}, {0x7f}, {'\n'},
		{0xc3, 0xa9}, {0xe2, 0x82, 0xac}, {0xf0, 0x9f, 0x92, 0xb3},
		{0xc3}, {0xe2, 0x82}, {0x80}, {0xbf}, {0xc0, 0xaf}, {0xed, 0xbf, 0xbf},
		{0xf5, 0x80, 0x80, 0x80}, {0xfe}, {0xff},
	};
	static const size_t plen[] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 1, 2,
				      1, 1, 2, 3, 4, 1, 1};
	srand(12345);
	char buf[7][64];
	for (int round = 0; round < 20000; round++) {
		const char *f[7];
		for (int k = 0; k < 7; k++) {
			size_t n = 0;
			int parts = rand() % 8;
			for (int j = 0; j < parts; j++) {
				int p = rand() % 20;
				memcpy(buf[k] + n, pieces[p], plen[p]);
				n += plen[p];
			}
			buf[k][n] = '\0';
			f[k] = rand() % 10 == 0 ? NULL : buf[k];
		}
		double scale = 1e-6;
		for (int e = rand() % 24; e > 0; e--)
			scale *= 10;
		log_request r = {f[0], f[1], f[2], f[3], f[4], f[5], f[6],
				 rand() % 1000, rand() % 20,
				 (double)rand() / RAND_MAX * scale,
				 (double)rand() / RAND_MAX,
				 (double)rand() * scale,
				 rand() % 2 ? NULL
					    : "0af7651916cd43dd8448eb211c80319c"};
		same_as_reference(&r);
	}
}

static void folded_is(const char *in, const char *want)
{
	char out[256];
	log_fold_lines(out, sizeof out, in);
	assert_string_equal(out, want);
}

static void test_fold_lines(void **state)
{
	(void)state;
	folded_is("plain  two spaces", "plain  two spaces");
	folded_is("failed: Connection refused\n\tIs the server running?\n",
		  "failed: Connection refused; Is the server running?");
	folded_is("unexpectedly\n\tThis probably means the server\n\tbefore "
		  "it.\ninvalid socket\n",
		  "unexpectedly; This probably means the server; before it. "
		  "invalid socket");
	folded_is("error=\"refused\n\tIs it?\n\" who=w",
		  "error=\"refused; Is it?\" who=w");
	folded_is("a\r\nb", "a; b");
	folded_is("a \tb\t", "a b");
	folded_is("\n", "");
	char small[6];
	log_fold_lines(small, sizeof small, "ab\n\tcdef");
	assert_string_equal(small, "ab; c");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quote),
		cmocka_unit_test(test_fold_lines),
		cmocka_unit_test(test_field),
		cmocka_unit_test(test_request_line_fixed),
		cmocka_unit_test(test_request_line_random),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
