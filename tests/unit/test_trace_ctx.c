#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "trace_ctx.h"

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define PID "00f067aa0ba902b7"

static void ok(const char *v)
{
	char out[TRACE_ID_HEX + 1];
	assert_true(trace_ctx_parse(v, out));
	assert_string_equal(out, TID);
}

static void bad(const char *v)
{
	char out[TRACE_ID_HEX + 1];
	memset(out, 'x', sizeof out);
	assert_false(trace_ctx_parse(v, out));
	assert_string_equal(out, "");
}

static void test_version_00(void **state)
{
	(void)state;
	ok("00-" TID "-" PID "-01");
	ok("00-" TID "-" PID "-00");
	ok("00-" TID "-" PID "-ff"); /* unknown flags are not ours to judge */
	bad(NULL);
	bad("");
	bad("00-" TID "-" PID "-01-"); /* 00 is exactly 55 long */
	bad("00-" TID "-" PID "-01 ");
	bad("00-" TID "-" PID "-1");
	bad("00-4BF92F3577B34DA6A3CE929D0E0E4736-" PID "-01"); /* HEXDIGLC */
	bad("00-" TID "-00F067AA0BA902B7-01");
	bad("00-" TID "-" PID "-0A");
	bad("0A-" TID "-" PID "-01");
	bad("00-00000000000000000000000000000000-" PID "-01");
	bad("00-" TID "-0000000000000000-01");
	bad("00-" TID "0-" PID "-0"); /* dashes in the wrong places */
	bad("00_" TID "-" PID "-01");
	bad("00-" TID "-" PID "_01");
	bad("00-4bf92f3577b34da6a3ce929d0e0e473g-" PID "-01");
	bad("00-4bf92f3577b34da6\x01"
	    "3ce929d0e0e4736-" PID "-01");
}

static void test_other_versions(void **state)
{
	(void)state;
	ok("01-" TID "-" PID "-01");
	ok("cc-" TID "-" PID "-01-what-comes-next");
	ok("fe-" TID "-" PID "-09");
	bad("ff-" TID "-" PID "-01");  /* forbidden */
	bad("cc-" TID "-" PID "-01x"); /* no dash after the flags */
	bad("cc-" TID "-" PID);        /* shorter than 55 */
	bad("cc-" TID "-" PID "-0");
	bad("cc-00000000000000000000000000000000-" PID "-01");
}

static void test_headers(void **state)
{
	(void)state;
	char out[TRACE_ID_HEX + 1];
	const char *good = "00-" TID "-" PID "-01";
	header_list h = {0};
	assert_false(trace_ctx_of_headers(&h, out));
	assert_string_equal(out, "");
	header_list_add(&h, "TraceParent", 11, good, strlen(good));
	assert_true(trace_ctx_of_headers(&h, out));
	assert_string_equal(out, TID);
	/* A second field makes the pair invalid, even with the same value. */
	header_list_add(&h, "traceparent", 11, good, strlen(good));
	assert_false(trace_ctx_of_headers(&h, out));
	assert_string_equal(out, "");
	header_list_free(&h);
}

static void test_id_bytes(void **state)
{
	(void)state;
	uint8_t b[TRACE_ID_LEN];
	trace_ctx_id_bytes(TID, b);
	const uint8_t want[TRACE_ID_LEN] = {0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3,
					    0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d,
					    0x0e, 0x0e, 0x47, 0x36};
	assert_memory_equal(b, want, TRACE_ID_LEN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_00),
		cmocka_unit_test(test_other_versions),
		cmocka_unit_test(test_headers),
		cmocka_unit_test(test_id_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
