#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "key_header.h"

static char key[KEY_LEN_MAX + 1];
static size_t key_len;
static const char *why;

static int parse_n(const char *v, size_t n)
{
	memset(key, 'X', sizeof key);
	key_len = 9999;
	why = NULL;
	return key_header_parse(v, n, key, &key_len, &why);
}

static int parse(const char *v)
{
	return parse_n(v, strlen(v));
}

#define ok(v, expect)                                                          \
	do {                                                                   \
		assert_int_equal(parse(v), 0);                                 \
		assert_int_equal(key_len, strlen(expect));                     \
		assert_string_equal(key, expect);                              \
	} while (0)

#define bad(v, reason)                                                         \
	do {                                                                   \
		assert_int_equal(parse(v), -1);                                \
		assert_non_null(why);                                          \
		assert_non_null(strstr(why, reason));                          \
	} while (0)

#define bad_n(v, n, reason)                                                    \
	do {                                                                   \
		assert_int_equal(parse_n(v, n), -1);                           \
		assert_non_null(why);                                          \
		assert_non_null(strstr(why, reason));                          \
	} while (0)

static void test_bare(void **state)
{
	(void)state;
	ok("8e03978e-40d5", "8e03978e-40d5");
	ok("a", "a");
	ok("!#$%&'()*+-./:<=>?@[]^_`{|}~", "!#$%&'()*+-./:<=>?@[]^_`{|}~");
	ok("ABCxyz0189", "ABCxyz0189");
	ok("  abc\t ", "abc");
	ok("\tabc", "abc");
}

static void test_quoted(void **state)
{
	(void)state;
	ok("\"8e03978e-40d5\"", "8e03978e-40d5");
	ok("\"abc\"", "abc");
	ok("\"with space\"", "with space");
	ok("\" lead and trail \"", " lead and trail ");
	ok("\"a,b;c\"", "a,b;c");
	ok("\"q\\\"uote\"", "q\"uote");
	ok("\"back\\\\slash\"", "back\\slash");
	ok("\"\\\\\"", "\\");
	ok("\"\\\"\"", "\"");
	ok("  \"abc\"  ", "abc");
	ok("\"~\"", "~");
}

static void test_quoted_and_bare_are_the_same_key(void **state)
{
	char a[KEY_LEN_MAX + 1];
	size_t alen;

	(void)state;
	assert_int_equal(parse("\"k-123\""), 0);
	memcpy(a, key, sizeof a);
	alen = key_len;
	assert_int_equal(parse("k-123"), 0);
	assert_int_equal(alen, key_len);
	assert_memory_equal(a, key, key_len + 1);
}

static void test_parameters_ignored(void **state)
{
	(void)state;
	ok("\"abc\";a=1", "abc");
	ok("\"abc\";a", "abc");
	ok("\"abc\";a=1;b=?0", "abc");
	ok("\"abc\"; a=tok/en:x", "abc");
	ok("\"abc\";a=\"x,y;z\"", "abc");
	ok("\"abc\";a=\"esc\\\"aped\"", "abc");
	ok("\"abc\";a=:cHJldGVuZA==:", "abc");
	ok("\"abc\";*k=-1.5", "abc");
	ok("\"abc\";a=1  ", "abc");
	bad("\"abc\";", "parameters");
	bad("\"abc\";=1", "parameters");
	bad("\"abc\";a=", "parameters");
	bad("\"abc\";1a=2", "parameters");
	bad("\"abc\";a=\"open", "unterminated");
	bad("\"abc\";a=\"x\\y\"", "escape");
	bad("\"abc\";a=1, \"def\"", "list");
	bad("\"abc\";a=\"x\", \"def\"", "list");
	bad("\"abc\";a=1 junk", "unexpected");
	bad_n("\"abc\";a=1\x01", 10, "control");
	bad_n("\"abc\";a=\xc3\xa9", 10, "non-ASCII");
}

static void test_lengths(void **state)
{
	char v[600];

	(void)state;
	memset(v, 'k', KEY_LEN_MAX);
	v[KEY_LEN_MAX] = '\0';
	assert_int_equal(parse(v), 0);
	assert_int_equal(key_len, KEY_LEN_MAX);
	assert_int_equal(key[KEY_LEN_MAX], '\0');

	memset(v, 'k', KEY_LEN_MAX + 1);
	v[KEY_LEN_MAX + 1] = '\0';
	bad(v, "longer than 255");

	/* Quoted: 255 after unquoting, even though the wire form is longer. */
	v[0] = '"';
	for (int i = 0; i < KEY_LEN_MAX; i++) {
		v[1 + 2 * i] = '\\';
		v[2 + 2 * i] = '\\';
	}
	v[1 + 2 * KEY_LEN_MAX] = '"';
	v[2 + 2 * KEY_LEN_MAX] = '\0';
	assert_int_equal(parse(v), 0);
	assert_int_equal(key_len, KEY_LEN_MAX);
	assert_int_equal(key[0], '\\');
	assert_int_equal(key[KEY_LEN_MAX - 1], '\\');
	assert_int_equal(key[KEY_LEN_MAX], '\0');

	v[0] = '"';
	memset(v + 1, 'q', KEY_LEN_MAX + 1);
	v[KEY_LEN_MAX + 2] = '"';
	v[KEY_LEN_MAX + 3] = '\0';
	bad(v, "longer than 255");

	/* Long garbage must not overflow the output buffer. */
	memset(v, 'z', sizeof v - 1);
	v[sizeof v - 1] = '\0';
	bad(v, "longer than 255");
}

static void test_empty(void **state)
{
	(void)state;
	bad("", "empty");
	bad("   ", "empty");
	bad("\t \t", "empty");
	bad("\"\"", "empty");
	bad("\"\";a=1", "empty");
	bad(" \"\" ", "empty");
	assert_int_equal(key_header_parse(NULL, 0, key, &key_len, &why), -1);
	assert_int_equal(key_header_parse("abc", 0, key, &key_len, &why), -1);
	assert_non_null(strstr(why, "empty"));
}

static void test_lists(void **state)
{
	(void)state;
	bad("a,b", "list");
	bad("a, b", "list");
	bad("abc,", "list");
	bad(",abc", "list");
	bad("\"a\", \"b\"", "list");
	bad("\"a\",\"b\"", "list");
	bad("\"a\" ,", "list");
	bad(",", "list");
}

static void test_control_and_non_ascii(void **state)
{
	(void)state;
	bad_n("ab\0cd", 5, "control");
	bad_n("abc\0", 4, "control");
	bad_n("\0", 1, "control");
	bad_n("\"ab\0cd\"", 7, "control");
	bad_n("\"ab\\\0\"", 6, "control");
	bad("ab\x01" "cd", "control");
	bad("ab\x1f" "cd", "control");
	bad("ab\x7f" "cd", "control");
	bad("ab\r\ncd", "control");
	bad("abc\n", "control");
	bad("\"ab\tc\"", "control");
	bad("\"ab\nc\"", "control");
	bad("\"ab\x7f\"", "control");
	bad("caf\xc3\xa9", "non-ASCII");
	bad("\"caf\xc3\xa9\"", "non-ASCII");
	bad("\xff", "non-ASCII");
	bad("\x80", "non-ASCII");
	/* Content after the closing quote is checked too. */
	bad("\"abc\"\x01", "control");
}

static void test_bad_quoting(void **state)
{
	(void)state;
	bad("\"abc", "unterminated");
	bad("\"", "unterminated");
	bad("\"abc\\\"", "unterminated");
	bad("\"abc\\", "unterminated");
	bad("\"a\\bc\"", "escape");
	bad("\"a\\nc\"", "escape");
	bad("\"a\\'c\"", "escape");
	bad("\"a\\ c\"", "escape");
	bad("\"abc\"def", "unexpected");
	bad("\"abc\" def", "unexpected");
	bad("\"abc\"\"def\"", "unexpected");
	bad("\"abc\" ;a=1", "unexpected");
}

static void test_bare_forbidden_chars(void **state)
{
	(void)state;
	bad("ab\"c", "quoted string");
	bad("ab;c", "quoted string");
	bad("abc;a=1", "quoted string");
	bad("ab\\c", "quoted string");
	bad("ab c", "quoted string");
	bad("ab\tc", "control");
}

static void test_null_why_is_tolerated(void **state)
{
	(void)state;
	assert_int_equal(key_header_parse("a,b", 3, key, &key_len, NULL), -1);
	assert_int_equal(key_header_parse("ab", 2, key, &key_len, NULL), 0);
	assert_string_equal(key, "ab");
}

/* Every single byte value, alone and as the middle of a bare key: the
 * parser must never crash and must accept exactly the allowed set. */
static void test_every_byte(void **state)
{
	(void)state;
	for (int c = 0; c < 256; c++) {
		char v[3] = { 'a', (char)c, 'b' };
		int expect_ok = c >= 0x21 && c <= 0x7e && c != '"' &&
				c != ',' && c != ';' && c != '\\';
		assert_int_equal(parse_n(v, 3), expect_ok ? 0 : -1);
		if (expect_ok) {
			assert_int_equal(key_len, 3);
			assert_memory_equal(key, v, 3);
		} else {
			assert_non_null(why);
		}

		char q[5] = { '"', 'a', (char)c, 'b', '"' };
		int expect_q = c >= 0x20 && c <= 0x7e && c != '"' && c != '\\';
		assert_int_equal(parse_n(q, 5), expect_q ? 0 : -1);
	}
}

/* Random inputs over an alphabet rich in the interesting bytes: the parser
 * must never crash, and whatever it accepts must be a well-formed key that
 * reads the same when sent again in quoted form. */
static void test_fuzz_invariants(void **state)
{
	static const char alphabet[] = { 'a', 'Z', '0', '"', '\\', ',', ';',
					 '=', ' ', '\t', '\0', '\x01', '\x7f',
					 '\x80', '\xff', ':', '*', '?', '-' };
	uint32_t seed = 7;
	char v[300];
	int accepted = 0;

	(void)state;
	for (int iter = 0; iter < 300000; iter++) {
		seed = seed * 1103515245u + 12345u;
		size_t n = (seed >> 16) % sizeof v;
		if (iter % 2)
			n %= 12;
		for (size_t i = 0; i < n; i++) {
			seed = seed * 1103515245u + 12345u;
			v[i] = alphabet[(seed >> 16) % sizeof alphabet];
		}
		if (iter % 3 == 0 && n >= 2) {
			v[0] = '"';
		}
		if (parse_n(v, n) != 0) {
			assert_non_null(why);
			continue;
		}
		accepted++;
		assert_true(key_len >= 1 && key_len <= KEY_LEN_MAX);
		assert_int_equal(key[key_len], '\0');
		for (size_t i = 0; i < key_len; i++)
			assert_true(key[i] >= 0x20 && key[i] <= 0x7e);

		/* Round trip through the quoted form. */
		char q[2 * KEY_LEN_MAX + 3], first[KEY_LEN_MAX + 1];
		size_t qn = 0, first_len = key_len;
		memcpy(first, key, key_len + 1);
		q[qn++] = '"';
		for (size_t i = 0; i < first_len; i++) {
			if (first[i] == '"' || first[i] == '\\')
				q[qn++] = '\\';
			q[qn++] = first[i];
		}
		q[qn++] = '"';
		assert_int_equal(parse_n(q, qn), 0);
		assert_int_equal(key_len, first_len);
		assert_memory_equal(key, first, first_len);
	}
	assert_true(accepted > 1000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bare),
		cmocka_unit_test(test_quoted),
		cmocka_unit_test(test_quoted_and_bare_are_the_same_key),
		cmocka_unit_test(test_parameters_ignored),
		cmocka_unit_test(test_lengths),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_lists),
		cmocka_unit_test(test_control_and_non_ascii),
		cmocka_unit_test(test_bad_quoting),
		cmocka_unit_test(test_bare_forbidden_chars),
		cmocka_unit_test(test_null_why_is_tolerated),
		cmocka_unit_test(test_every_byte),
		cmocka_unit_test(test_fuzz_invariants),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
