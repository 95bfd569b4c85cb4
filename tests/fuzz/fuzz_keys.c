/* Fuzz target for seal_keyring_parse (the store_encryption key file).
 *
 * Besides "never crash": an accepted file has 1..SEAL_MAX_KEYS keys with
 * valid ids and an active one among them, and a record sealed under it
 * opens again to the same bytes; a rejected one says FILE:LINE or FILE. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "seal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512] = "";
	seal_keyring *k =
		seal_keyring_parse((const char *)data, size, "keys", err,
				   sizeof err);
	if (!k) {
		ALWAYS_ASSERT(strncmp(err, "keys", 4) == 0);
		return 0;
	}
	size_t n = seal_keyring_count(k);
	ALWAYS_ASSERT(n >= 1 && n <= SEAL_MAX_KEYS);
	ALWAYS_ASSERT(seal_keyring_has(k, seal_keyring_active(k)));
	static const uint8_t hash[SEAL_HASH_LEN] = {7};
	seal_scope s = {"t", "op", "key", hash, 201, true};
	growbuf sealed = {0}, plain = {0};
	size_t m = size < 64 ? size : 64;
	seal_seal(k, &s, SEAL_BODY, (const char *)data, m, &sealed);
	ALWAYS_ASSERT(seal_open(k, &s, SEAL_BODY, sealed.data, sealed.len,
				&plain, err, sizeof err) == 0);
	ALWAYS_ASSERT(plain.len == m && memcmp(plain.data, data, m) == 0);
	growbuf_free(&sealed);
	growbuf_free(&plain);
	seal_keyring_free(k);
	return 0;
}
