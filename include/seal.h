/* Stored responses sealed at rest: AES-256-GCM (OpenSSL EVP) under named
 * keys from a key file, with associated data that binds each sealed blob to
 * its record's scope and payload, so a blob copied to another record never
 * opens. Pure but for seal_keyring_load (reads the file) and the random
 * nonce. A keyring is immutable once loaded and may be shared by threads;
 * its key material is wiped (OPENSSL_cleanse) when it is freed.
 *
 * The key file: one "ID BASE64KEY" line per key (a 256-bit key, standard
 * base64 with padding: 44 characters), one "active = ID" line naming the
 * key that seals new records, blank lines and "#" comments. IDs are 1..32
 * characters of A-Z a-z 0-9 _ . -.
 *
 * A sealed blob: 0x00, version 0x01, the key id's length, the key id, a
 * 12-byte random nonce, the ciphertext, the 16-byte GCM tag. Stored headers
 * in the clear ("Name: value\r\n" lines) never begin with 0x00, so the first
 * byte tells a sealed record from one written without encryption. */
#ifndef IDEMPROXY_SEAL_H
#define IDEMPROXY_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define SEAL_KEY_LEN 32
#define SEAL_ID_MAX 32
#define SEAL_MAX_KEYS 64
#define SEAL_HASH_LEN 32

typedef struct seal_keyring seal_keyring;

/* Parses a key file's text. Errors are "FILE:LINE: what is wrong" (never
 * containing key material); NULL then. */
seal_keyring *seal_keyring_parse(const char *text, size_t len,
				 const char *file, char *err,
				 size_t errlen) MUST_CHECK;
/* Reads and parses FILE; refuses anything but a regular file, and a file
 * that group or others may read, write or execute. */
seal_keyring *seal_keyring_load(const char *file, char *err,
				size_t errlen) MUST_CHECK;
void seal_keyring_free(seal_keyring *k);

const char *seal_keyring_active(const seal_keyring *k);
size_t seal_keyring_count(const seal_keyring *k);
const char *seal_keyring_id(const seal_keyring *k, size_t i);
bool seal_keyring_has(const seal_keyring *k, const char *id);

/* What a sealed blob is bound to. */
typedef struct seal_scope {
	const char *tenant;
	const char *operation;
	const char *key;
	const uint8_t *hash; /* SEAL_HASH_LEN bytes: the request fingerprint */
	int status;          /* the stored response status */
	bool has_body;       /* a body is stored beside the headers */
} seal_scope;

enum seal_field { SEAL_HEADERS = 1, SEAL_BODY = 2 };

/* Does blob start like a sealed blob? */
bool seal_is_sealed(const char *blob, size_t len);

/* The key id a sealed blob names, into id (SEAL_ID_MAX + 1 bytes). -1 if
 * blob is not a well-formed sealed blob. */
int seal_blob_key_id(const char *blob, size_t len, char *id) MUST_CHECK;

/* Seals plaintext under the active key into out (replacing its content). */
void seal_seal(const seal_keyring *k, const seal_scope *s,
	       enum seal_field f, const char *pt, size_t n, growbuf *out);

/* Opens a sealed blob into out (replacing its content). -1 with the reason
 * in err (an unknown key id, a malformed blob, or an authentication
 * failure: altered, or bound to another record). k may be NULL. */
int seal_open(const seal_keyring *k, const seal_scope *s, enum seal_field f,
	      const char *blob, size_t n, growbuf *out, char *err,
	      size_t errlen) MUST_CHECK;

#endif
