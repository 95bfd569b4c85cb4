#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <zlib.h>

#include "coding.h"

static bool accepts(const char *accept_encoding, const char *ce)
{
	header_list h = {0};
	if (accept_encoding)
		header_list_add(&h, "Accept-Encoding", 15, accept_encoding,
				strlen(accept_encoding));
	bool r = coding_accepted(&h, ce);
	header_list_free(&h);
	return r;
}

static void test_accepted(void **state)
{
	assert_true(accepts("gzip", "gzip"));
	assert_true(accepts("GZIP;q=0.5", "gzip"));
	assert_true(accepts("x-gzip", "gzip"));
	assert_true(accepts("gzip", "x-gzip"));
	assert_true(accepts("br, *", "deflate"));
	assert_true(accepts("deflate, gzip", "gzip, deflate"));
	assert_false(accepts(NULL, "gzip"));
	assert_false(accepts("", "gzip"));
	assert_false(accepts("identity", "gzip"));
	assert_false(accepts("gzip;q=0", "gzip"));
	assert_false(accepts("gzip; q=0.000", "gzip"));
	assert_false(accepts("*;q=0, identity", "gzip"));
	assert_false(accepts("*, gzip;q=0", "gzip"));
	assert_false(accepts("gzip", "gzip, br"));
	assert_true(accepts("gzip;q=0.001", "gzip"));
	assert_true(accepts(NULL, "identity"));
}

static void upstream_accept(const char *in, const char *want)
{
	header_list h = {0};
	if (in)
		header_list_add(&h, "Accept-Encoding", 15, in, strlen(in));
	growbuf out = {0};
	bool sent = coding_upstream_accept(&h, &out);
	if (!want)
		assert_false(sent);
	else
		assert_string_equal(out.data, want);
	growbuf_free(&out);
	header_list_free(&h);
}

static void test_upstream_accept(void **state)
{
	upstream_accept(NULL, NULL);
	upstream_accept("br", "identity");
	upstream_accept("br, gzip;q=0.5 , zstd", "gzip;q=0.5");
	upstream_accept("deflate,*", "deflate");
	upstream_accept("identity;q=0, x-gzip", "identity;q=0, x-gzip");
}

static size_t squeeze(int wbits, const char *in, size_t len, char *out,
		      size_t cap)
{
	z_stream z;
	memset(&z, 0, sizeof z);
	assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, wbits, 8,
				      Z_DEFAULT_STRATEGY),
			 Z_OK);
	z.next_in = (Bytef *)in;
	z.avail_in = (uInt)len;
	z.next_out = (Bytef *)out;
	z.avail_out = (uInt)cap;
	assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
	size_t n = cap - z.avail_out;
	deflateEnd(&z);
	return n;
}

static const char text[] = "{\"id\": \"pay_1\", \"amount\": 100, "
			   "\"currency\": \"EUR\"}";

static void test_decode(void **state)
{
	char z[512], two[1024], err[160];
	growbuf out = {0};
	/* gzip, two members back to back */
	size_t n = squeeze(16 + MAX_WBITS, text, strlen(text), z, sizeof z);
	memcpy(two, z, n);
	memcpy(two + n, z, n);
	assert_int_equal(coding_decode("gzip", two, 2 * n, 1 << 20, &out, err,
				       sizeof err),
			 0);
	assert_int_equal(out.len, 2 * strlen(text));
	assert_memory_equal(out.data, text, strlen(text));
	/* deflate as the zlib format, and raw as some servers send it */
	for (int wbits = MAX_WBITS; wbits >= -MAX_WBITS; wbits -= 2 * MAX_WBITS) {
		n = squeeze(wbits, text, strlen(text), z, sizeof z);
		assert_int_equal(coding_decode("deflate", z, n, 1 << 20, &out,
					       err, sizeof err),
				 0);
		assert_int_equal(out.len, strlen(text));
	}
	/* a cap, corrupt and truncated data, unknown codings */
	n = squeeze(16 + MAX_WBITS, text, strlen(text), z, sizeof z);
	assert_int_equal(coding_decode("gzip", z, n, 10, &out, err, sizeof err),
			 -1);
	assert_non_null(strstr(err, "larger"));
	assert_int_equal(coding_decode("gzip", z, n / 2, 1 << 20, &out, err,
				       sizeof err),
			 -1);
	assert_int_equal(coding_decode("gzip", text, strlen(text), 1 << 20,
				       &out, err, sizeof err),
			 -1);
	assert_int_equal(coding_decode("br", z, n, 1 << 20, &out, err,
				       sizeof err),
			 -1);
	assert_non_null(strstr(err, "br"));
	growbuf_free(&out);
}

static void test_mark_decoded(void **state)
{
	header_list h = {0};
	header_list_add(&h, "Content-Type", 12, "text/plain", 10);
	header_list_add(&h, "Content-Encoding", 16, "gzip", 4);
	header_list_add(&h, "ETag", 4, "\"v1\"", 4);
	coding_mark_decoded(&h);
	assert_int_equal(h.n, 2);
	assert_null(header_list_get(&h, "Content-Encoding"));
	assert_string_equal(header_list_get(&h, "ETag"), "W/\"v1\"");
	header_list_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accepted),
		cmocka_unit_test(test_upstream_accept),
		cmocka_unit_test(test_decode),
		cmocka_unit_test(test_mark_decoded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
