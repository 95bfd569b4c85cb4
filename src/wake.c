#include "wake.h"

#include <openssl/evp.h>
#include <string.h>

#include "util.h"

void wake_scope(const char *tenant, const char *operation, const char *key,
		uint8_t out[WAKE_SCOPE_LEN])
{
	static const char tag[] = "idemproxy-wait";
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	IP_ASSERT(ctx);
	IP_ASSERT(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
	const char *parts[4] = {tag, tenant, operation, key};
	for (int i = 0; i < 4; i++)
		IP_ASSERT(EVP_DigestUpdate(ctx, parts[i],
					   strlen(parts[i]) + (i < 3)) == 1);
	uint8_t md[EVP_MAX_MD_SIZE];
	unsigned n = 0;
	IP_ASSERT(EVP_DigestFinal_ex(ctx, md, &n) == 1 && n >= WAKE_SCOPE_LEN);
	EVP_MD_CTX_free(ctx);
	memcpy(out, md, WAKE_SCOPE_LEN);
}

void wake_scope_hex(const char *tenant, const char *operation,
		    const char *key, char out[WAKE_SCOPE_HEX + 1])
{
	uint8_t b[WAKE_SCOPE_LEN];
	wake_scope(tenant, operation, key, b);
	ip_hex(b, WAKE_SCOPE_LEN, out);
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
