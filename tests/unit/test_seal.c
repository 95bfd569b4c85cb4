#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "seal.h"

/* Base64 of 32 bytes each: 0x00.., 0x01.. (not secret: test keys). */
#define K_A "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
#define K_B "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="

static const uint8_t H1[SEAL_HASH_LEN] = {1};
static const uint8_t H2[SEAL_HASH_LEN] = {2};

static seal_keyring *parse(const char *text, char *err)
{
	return seal_keyring_parse(text, strlen(text), "keys", err, 256);
}

static seal_scope scope(void)
{
	seal_scope s = {"t1", "create_payment", "order-1", H1, 201, true};
	return s;
}

static void test_parse_ok(void **state)
{
	char err[256] = "";
	seal_keyring *k = parse("# keys\n\nold " K_A "\r\n"
				"  active =  new  \n"
				"new\t" K_B "\n",
				err);
	assert_non_null(k);
	assert_string_equal(seal_keyring_active(k), "new");
	assert_int_equal(seal_keyring_count(k), 2);
	assert_string_equal(seal_keyring_id(k, 0), "old");
	assert_true(seal_keyring_has(k, "old"));
	assert_false(seal_keyring_has(k, "ol"));
	seal_keyring_free(k);
}

static void expect_error(const char *text, const char *want)
{
	char err[256] = "";
	seal_keyring *k = parse(text, err);
	if (k)
		fail_msg("accepted: %s", text);
	if (!strstr(err, want))
		fail_msg("error \"%s\" lacks \"%s\"", err, want);
	/* Key material never appears in an error. */
	assert_null(strstr(err, "AAAAAAAA"));
	assert_null(strstr(err, "AQEBAQEB"));
}

static void test_parse_errors(void **state)
{
	expect_error("", "keys: no keys");
	expect_error("k1 " K_A "\n", "no \"active = ID\"");
	expect_error("active = k2\nk1 " K_A "\n", "keys:1: active key \"k2\"");
	expect_error("active = k1\nk1 " K_A "\nk1 " K_B "\n",
		     "keys:3: key \"k1\" is listed twice");
	expect_error("active = k1\nactive = k1\nk1 " K_A "\n",
		     "keys:2: a second \"active\"");
	expect_error("active = k1\nk1 AAAA\n", "keys:2: key \"k1\": expected");
	/* 31 bytes, and 33: not a 256-bit key */
	expect_error("active = k1\nk1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n",
		     "keys:2:");
	expect_error("active = k1\nk1 " K_A "AAAA\n", "keys:2:");
	/* nonzero trailing bits: not the canonical encoding */
	expect_error("active = k1\nk1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=\n",
		     "keys:2:");
	expect_error("active = k1\nk1 " K_A " extra\n", "keys:2:");
	expect_error("active = k1\nk1\n", "keys:2:");
	expect_error("active = k1\nbad/id " K_A "\n", "keys:2: a key id");
	expect_error("active k1\nk1 " K_A "\n", "keys:1: expected \"active = ID\"");
	expect_error("active = k1 k2\nk1 " K_A "\n", "keys:1: active:");
	expect_error("active = k1\nk1 " K_A "\n"
		     "0123456789012345678901234567890123 " K_B "\n",
		     "keys:3: a key id");
}

static void test_seal_open_round_trip(void **state)
{
	char err[256];
	seal_keyring *k = parse("active = a\na " K_A "\n", err);
	assert_non_null(k);
	seal_scope s = scope();
	growbuf sealed = {0}, plain = {0}, again = {0};
	const char msg[] = "{\"id\": \"p_1\", \"card\": \"4242\"}";
	seal_seal(k, &s, SEAL_BODY, msg, sizeof msg - 1, &sealed);
	assert_true(seal_is_sealed(sealed.data, sealed.len));
	assert_null(memmem(sealed.data, sealed.len, "4242", 4));
	char id[SEAL_ID_MAX + 1];
	assert_int_equal(seal_blob_key_id(sealed.data, sealed.len, id), 0);
	assert_string_equal(id, "a");
	assert_int_equal(seal_open(k, &s, SEAL_BODY, sealed.data, sealed.len,
				   &plain, err, sizeof err),
			 0);
	assert_int_equal(plain.len, sizeof msg - 1);
	assert_memory_equal(plain.data, msg, plain.len);
	/* A fresh nonce every time: the same plaintext seals differently. */
	seal_seal(k, &s, SEAL_BODY, msg, sizeof msg - 1, &again);
	assert_int_equal(again.len, sealed.len);
	assert_true(memcmp(again.data, sealed.data, sealed.len) != 0);
	/* Empty plaintext too. */
	seal_seal(k, &s, SEAL_HEADERS, "", 0, &sealed);
	assert_int_equal(seal_open(k, &s, SEAL_HEADERS, sealed.data,
				   sealed.len, &plain, err, sizeof err),
			 0);
	assert_int_equal(plain.len, 0);
	growbuf_free(&sealed);
	growbuf_free(&plain);
	growbuf_free(&again);
	seal_keyring_free(k);
}

static void expect_no_open(const seal_keyring *k, const seal_scope *s,
			   enum seal_field f, const growbuf *b,
			   const char *want)
{
	char err[256] = "";
	growbuf out = {0};
	assert_int_equal(
		seal_open(k, s, f, b->data, b->len, &out, err, sizeof err), -1);
	assert_int_equal(out.len, 0);
	if (!strstr(err, want))
		fail_msg("error \"%s\" lacks \"%s\"", err, want);
	growbuf_free(&out);
}

static void test_binding(void **state)
{
	char err[256];
	seal_keyring *k = parse("active = a\na " K_A "\n", err);
	seal_scope s = scope();
	growbuf b = {0};
	seal_seal(k, &s, SEAL_BODY, "secret", 6, &b);
	const char *auth = "does not authenticate";

	seal_scope o = s;
	o.tenant = "t2";
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	o = s;
	o.operation = "refund";
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	o = s;
	o.key = "order-2";
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	o = s;
	o.hash = H2;
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	o = s;
	o.status = 200;
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	o = s;
	o.has_body = false;
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	/* The boundaries between fields count: "t1"+"x" is not "t"+"1x". */
	o = s;
	o.tenant = "t";
	o.operation = "1create_payment";
	expect_no_open(k, &o, SEAL_BODY, &b, auth);
	/* Headers and body are not interchangeable. */
	expect_no_open(k, &s, SEAL_HEADERS, &b, auth);

	/* Every flipped byte after the header is caught. */
	for (size_t i = 4; i < b.len; i++) {
		b.data[i] ^= 0x01;
		expect_no_open(k, &s, SEAL_BODY, &b, auth);
		b.data[i] ^= 0x01;
	}
	/* A truncated blob is malformed. */
	growbuf t = {0};
	growbuf_append(&t, b.data, 10);
	expect_no_open(k, &s, SEAL_BODY, &t, "malformed");
	growbuf_free(&t);
	growbuf_free(&b);
	seal_keyring_free(k);
}

static void test_rotation(void **state)
{
	char err[256];
	seal_keyring *old = parse("active = a\na " K_A "\n", err);
	seal_keyring *both = parse("active = b\na " K_A "\nb " K_B "\n", err);
	seal_keyring *only_b = parse("active = b\nb " K_B "\n", err);
	seal_scope s = scope();
	growbuf b = {0}, out = {0};
	seal_seal(old, &s, SEAL_BODY, "x", 1, &b);
	/* An old key still opens what it sealed. */
	assert_int_equal(seal_open(both, &s, SEAL_BODY, b.data, b.len, &out,
				   err, sizeof err),
			 0);
	expect_no_open(only_b, &s, SEAL_BODY, &b,
		       "sealed under key \"a\", which the key file does not "
		       "hold");
	expect_no_open(NULL, &s, SEAL_BODY, &b, "not configured");
	/* New records go under the active key. */
	seal_seal(both, &s, SEAL_BODY, "x", 1, &b);
	char id[SEAL_ID_MAX + 1];
	assert_int_equal(seal_blob_key_id(b.data, b.len, id), 0);
	assert_string_equal(id, "b");
	/* A relabelled blob (key id rewritten) does not open. */
	b.data[3] = 'a';
	expect_no_open(both, &s, SEAL_BODY, &b, "does not authenticate");
	growbuf_free(&b);
	growbuf_free(&out);
	seal_keyring_free(old);
	seal_keyring_free(both);
	seal_keyring_free(only_b);
}

static void test_plain_headers_are_not_sealed(void **state)
{
	assert_false(seal_is_sealed("Content-Type: a/b\r\n", 19));
	assert_false(seal_is_sealed("", 0));
	assert_false(seal_is_sealed(NULL, 0));
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
}

static void test_load_checks_mode(void **state)
{
	char dir[] = "/tmp/test_seal_XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[64];
	snprintf(path, sizeof path, "%s/keys", dir);
	char err[256] = "";
	write_file(path, "active = a\na " K_A "\n", 0600);
	seal_keyring *k = seal_keyring_load(path, err, sizeof err);
	assert_non_null(k);
	seal_keyring_free(k);
	static const mode_t bad[] = {0644, 0640, 0604, 0660, 0602, 0620};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		assert_int_equal(chmod(path, bad[i]), 0);
		assert_null(seal_keyring_load(path, err, sizeof err));
		assert_non_null(strstr(err, "accessible by group or others"));
	}
	assert_null(seal_keyring_load(dir, err, sizeof err));
	assert_non_null(strstr(err, "not a regular file"));
	unlink(path);
	assert_null(seal_keyring_load(path, err, sizeof err));
	assert_non_null(strstr(err, "cannot read"));
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ok),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_seal_open_round_trip),
		cmocka_unit_test(test_binding),
		cmocka_unit_test(test_rotation),
		cmocka_unit_test(test_plain_headers_are_not_sealed),
		cmocka_unit_test(test_load_checks_mode),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
