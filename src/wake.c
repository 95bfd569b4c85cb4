#include "wake.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void wake_scope(const wake_key *wk, const char *tenant,
		const char *operation, const char *key,
		uint8_t out[WAKE_SCOPE_LEN])
{
	static const char tag[] = "idemproxy-wait";
	const char *parts[4] = {tag, tenant, operation, key};
	size_t lens[4], n = 0;
	for (int i = 0; i < 4; i++) {
		lens[i] = strlen(parts[i]) + (i < 3);
		n += lens[i];
	}
	/* Keys and tenants are bounded, but not by this file. */
	char stack[2048];
	char *msg = n <= sizeof stack ? stack : xmalloc(n);
	size_t o = 0;
	for (int i = 0; i < 4; i++) {
		memcpy(msg + o, parts[i], lens[i]); /* with its NUL */
		o += lens[i];
	}
	uint8_t md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	ALWAYS_ASSERT(wk->len >= WAKE_KEY_MIN && wk->len <= WAKE_KEY_MAX);
	ALWAYS_ASSERT(HMAC(EVP_sha256(), wk->k, (int)wk->len, (uint8_t *)msg, n,
			   md, &mdlen) != NULL &&
		      mdlen >= WAKE_SCOPE_LEN);
	if (msg != stack)
		free(msg);
	memcpy(out, md, WAKE_SCOPE_LEN);
}

void wake_scope_hex(const wake_key *wk, const char *tenant,
		    const char *operation, const char *key,
		    char out[WAKE_SCOPE_HEX + 1])
{
	uint8_t b[WAKE_SCOPE_LEN];
	wake_scope(wk, tenant, operation, key, b);
	hex_encode(b, WAKE_SCOPE_LEN, out);
}

static int nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int wake_scope_parse(const char *hex, uint8_t out[WAKE_SCOPE_LEN])
{
	if (!hex || strlen(hex) != WAKE_SCOPE_HEX)
		return -1;
	for (int i = 0; i < WAKE_SCOPE_LEN; i++) {
		int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}
