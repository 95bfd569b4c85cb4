/* The name a waited-for record goes by outside the proxy: a hash of its
 * tenant, operation and key, so a NOTIFY payload (visible to every session
 * that LISTENs, and in the server's logs) never reveals a key. Pure. */
#ifndef IDEMPROXY_WAKE_H
#define IDEMPROXY_WAKE_H

#include <stdint.h>

#define WAKE_SCOPE_LEN 16
#define WAKE_SCOPE_HEX (2 * WAKE_SCOPE_LEN)

/* The first 16 bytes of SHA-256("idemproxy-wait" NUL tenant NUL operation
 * NUL key): none of the three holds a NUL, so the split is unambiguous. */
void wake_scope(const char *tenant, const char *operation, const char *key,
		uint8_t out[WAKE_SCOPE_LEN]);
/* The same, in lower-case hex (the NOTIFY payload). */
void wake_scope_hex(const char *tenant, const char *operation,
		    const char *key, char out[WAKE_SCOPE_HEX + 1]);
/* A payload back to bytes; -1 if it is not one. */
int wake_scope_parse(const char *hex, uint8_t out[WAKE_SCOPE_LEN]);

#endif
