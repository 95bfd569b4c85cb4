/* The name a waited-for record goes by outside the proxy: a keyed hash of
 * its tenant, operation and key, so a NOTIFY payload (visible to every
 * session that LISTENs, and in the server's logs) neither reveals a key nor
 * lets a listener confirm a guessed one. Pure. */
#ifndef IDEMPROXY_WAKE_H
#define IDEMPROXY_WAKE_H

#include <stddef.h>
#include <stdint.h>

#define WAKE_SCOPE_LEN 16
#define WAKE_SCOPE_HEX (2 * WAKE_SCOPE_LEN)
#define WAKE_KEY_MIN 32
#define WAKE_KEY_MAX 64

/* The secret every instance shares (idemproxy_secrets, migration 011):
 * the HMAC key as stored, 32 to 64 bytes. */
typedef struct wake_key {
	uint8_t k[WAKE_KEY_MAX];
	size_t len;
} wake_key;

/* The first 16 bytes of HMAC-SHA256(key, "idemproxy-wait" NUL tenant NUL
 * operation NUL key): none of the three holds a NUL, so the split is
 * unambiguous. */
void wake_scope(const wake_key *wk, const char *tenant,
		const char *operation, const char *key,
		uint8_t out[WAKE_SCOPE_LEN]);
/* The same, in lower-case hex (the NOTIFY payload). */
void wake_scope_hex(const wake_key *wk, const char *tenant,
		    const char *operation, const char *key,
		    char out[WAKE_SCOPE_HEX + 1]);
/* A payload back to bytes; -1 if it is not one. */
int wake_scope_parse(const char *hex, uint8_t out[WAKE_SCOPE_LEN]);

#endif
