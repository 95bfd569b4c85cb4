/* Fuzz target for key_header_parse (SPEC 3.1).
 *
 * Besides "never crash", checks what key_header.h promises about a key that was
 * accepted: 1..255 bytes of visible ASCII or SP, NUL-terminated, the same
 * answer every time, and the one spelling equivalence the spec allows
 * ("abc" == abc): the key written back as an sf-string, or bare where a
 * bare token can carry it, parses to the same key. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "key_header.h"

static bool bare_can_carry(const char *k, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (k[i] == ' ' || k[i] == '"' || k[i] == ',' || k[i] == ';' ||
		    k[i] == '\\')
			return false;
	return true;
}

/* The sf-string spelling of key k: quotes, with '"' and '\' escaped. */
static size_t quote_key(const char *k, size_t n, char *out)
{
	size_t o = 0;

	out[o++] = '"';
	for (size_t i = 0; i < n; i++) {
		if (k[i] == '"' || k[i] == '\\')
			out[o++] = '\\';
		out[o++] = k[i];
	}
	out[o++] = '"';
	return o;
}

/* Parses v and requires the same key as want. */
static void assert_parses_to(const char *v, size_t len, const char *want,
			     size_t want_len)
{
	char *key = xmalloc(KEY_LEN_MAX + 1);
	size_t n = 0;
	const char *why = NULL;

	ALWAYS_ASSERT(key_header_parse(v, len, key, &n, &why) == 0);
	ALWAYS_ASSERT(n == want_len && memcmp(key, want, n) == 0);
	free(key);
}

static void check_accepted(const char *in, size_t len, const char *key,
			   size_t n)
{
	ALWAYS_ASSERT(n >= 1 && n <= KEY_LEN_MAX);
	ALWAYS_ASSERT(key[n] == '\0');
	for (size_t i = 0; i < n; i++)
		ALWAYS_ASSERT(key[i] >= 0x20 && key[i] <= 0x7e);

	/* A key that did not come quoted is the trimmed input itself. */
	size_t s = 0;
	while (s < len && (in[s] == ' ' || in[s] == '\t'))
		s++;
	ALWAYS_ASSERT(s < len);
	if (in[s] != '"') {
		ALWAYS_ASSERT(bare_can_carry(key, n));
		ALWAYS_ASSERT(memcmp(in + s, key, n) == 0);
	}

	char *quoted = xmalloc(2 * KEY_LEN_MAX + 2);
	size_t qn = quote_key(key, n, quoted);
	assert_parses_to(quoted, qn, key, n);
	free(quoted);
	if (bare_can_carry(key, n))
		assert_parses_to(key, n, key, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Exactly sized copies, so a read or write one past either end is
	 * caught by the address sanitizer. */
	char *in = xmalloc(size ? size : 1);
	char *key = xmalloc(KEY_LEN_MAX + 1);
	char *again = xmalloc(KEY_LEN_MAX + 1);
	size_t n = 0, n2 = 0;
	const char *why = NULL, *why2 = NULL;

	memcpy(in, data, size);
	int rc = key_header_parse(in, size, key, &n, &why);
	int rc2 = key_header_parse(in, size, again, &n2, &why2);
	ALWAYS_ASSERT(rc == 0 || rc == -1);
	ALWAYS_ASSERT(rc == rc2);
	/* A NULL reason pointer is allowed and must not change the answer. */
	ALWAYS_ASSERT(key_header_parse(in, size, again, &n2, NULL) == rc);
	if (rc == 0) {
		ALWAYS_ASSERT(n == n2 && memcmp(key, again, n + 1) == 0);
		check_accepted(in, size, key, n);
	} else {
		ALWAYS_ASSERT(why != NULL && why[0] != '\0');
		ALWAYS_ASSERT(why == why2);
	}
	free(again);
	free(key);
	free(in);
	return 0;
}
