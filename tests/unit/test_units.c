#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "units.h"

static int64_t dur(const char *s)
{
	int64_t v = -12345;
	assert_int_equal(parse_duration_ms(s, &v), 0);
	return v;
}

static void dur_bad(const char *s)
{
	int64_t v = -12345;
	assert_int_equal(parse_duration_ms(s, &v), -1);
	/* A failed parse leaves the output alone. */
	assert_int_equal(v, -12345);
}

static int64_t size(const char *s)
{
	int64_t v = -12345;
	assert_int_equal(parse_size(s, &v), 0);
	return v;
}

static void size_bad(const char *s)
{
	int64_t v = -12345;
	assert_int_equal(parse_size(s, &v), -1);
	assert_int_equal(v, -12345);
}

static void test_duration_units(void **state)
{
	(void)state;
	assert_int_equal(dur("250ms"), 250);
	assert_int_equal(dur("30s"), 30000);
	assert_int_equal(dur("5m"), 300000);
	assert_int_equal(dur("24h"), 86400000);
	assert_int_equal(dur("7d"), 604800000);
	assert_int_equal(dur("1ms"), 1);
	assert_int_equal(dur("0s"), 0);
	assert_int_equal(dur("0ms"), 0);
	assert_int_equal(dur("007s"), 7000);
}

static void test_duration_limits(void **state)
{
	(void)state;
	assert_int_equal(dur("9223372036854775807ms"), INT64_MAX);
	dur_bad("9223372036854775808ms");
	dur_bad("99999999999999999999999999ms");
	/* INT64_MAX / 1000 = 9223372036854775 (rounded down) */
	assert_int_equal(dur("9223372036854775s"), 9223372036854775000LL);
	dur_bad("9223372036854776s");
	assert_int_equal(dur("106751991167d"), 106751991167LL * 86400000LL);
	dur_bad("106751991168d");
}

static void test_duration_rejects(void **state)
{
	(void)state;
	dur_bad("");
	dur_bad("s");
	dur_bad("ms");
	dur_bad("30");		/* no unit: ambiguous */
	dur_bad("-5s");
	dur_bad("+5s");
	dur_bad("1.5s");
	dur_bad(".5s");
	dur_bad("5 s");
	dur_bad(" 5s");
	dur_bad("5s ");
	dur_bad("5\ts");
	dur_bad("5S");
	dur_bad("5MS");
	dur_bad("5sec");
	dur_bad("5w");
	dur_bad("5y");
	dur_bad("5us");
	dur_bad("5ss");
	dur_bad("5s5");
	dur_bad("1h30m");
	dur_bad("0x10s");
	dur_bad("1e3ms");
	dur_bad("５s");		/* fullwidth digit */
	dur_bad(NULL);
}

static void test_size_units(void **state)
{
	(void)state;
	assert_int_equal(size("512KiB"), 512 * 1024);
	assert_int_equal(size("1MiB"), 1048576);
	assert_int_equal(size("2GiB"), 2147483648LL);
	assert_int_equal(size("100B"), 100);
	assert_int_equal(size("1024"), 1024);
	assert_int_equal(size("0"), 0);
	assert_int_equal(size("0B"), 0);
	assert_int_equal(size("1KB"), 1000);
	assert_int_equal(size("3MB"), 3000000);
	assert_int_equal(size("2GB"), 2000000000LL);
}

static void test_size_limits(void **state)
{
	(void)state;
	assert_int_equal(size("9223372036854775807"), INT64_MAX);
	assert_int_equal(size("9223372036854775807B"), INT64_MAX);
	size_bad("9223372036854775808");
	assert_int_equal(size("8589934591GiB"), 8589934591LL << 30);
	size_bad("8589934592GiB");
	size_bad("9223372036854775807KiB");
	size_bad("99999999999999999999999999");
}

static void test_size_rejects(void **state)
{
	(void)state;
	size_bad("");
	size_bad("B");
	size_bad("KiB");
	size_bad("-1");
	size_bad("-1MiB");
	size_bad("+1");
	size_bad("1.5MiB");
	size_bad("1 MiB");
	size_bad(" 1MiB");
	size_bad("1MiB ");
	size_bad("1mib");
	size_bad("1kib");
	size_bad("1Kib");
	size_bad("1K");
	size_bad("1M");
	size_bad("1KIB");
	size_bad("1TiB");
	size_bad("1b");
	size_bad("1MiBB");
	size_bad("1s");
	size_bad(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_duration_units),
		cmocka_unit_test(test_duration_limits),
		cmocka_unit_test(test_duration_rejects),
		cmocka_unit_test(test_size_units),
		cmocka_unit_test(test_size_limits),
		cmocka_unit_test(test_size_rejects),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
