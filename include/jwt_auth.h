/* Bearer JWTs the proxy verifies itself, for `tenant = "jwt:CLAIM"`.
 *
 * Keys are read with José (latchset's JOSE library, on jansson and
 * OpenSSL) once per (re)load, into OpenSSL's key objects; signatures
 * (RS256, ES256, EdDSA, HS256) are checked with OpenSSL directly. Which algorithm may be used, and with
 * which key, is decided here and never by the token: only the route's
 * `algorithms`, each key used only with the one algorithm its type allows.
 * Verification is a pure function of the key set, the policy, the token and
 * the time; only jwt_keyset_load reads a file. */
#ifndef IDEMPROXY_JWT_AUTH_H
#define IDEMPROXY_JWT_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum jwt_alg {
	JWT_RS256 = 1,
	JWT_ES256 = 2,
	JWT_EDDSA = 4,
	JWT_HS256 = 8,
};

/* Longer tokens are refused before anything is decoded. */
#define JWT_TOKEN_MAX 8192
/* The largest RSA key a key file may hold: a verification runs on the
 * serving thread (91 us at 4096 bits on the benchmark machine, and the
 * cost grows with the square of the modulus). */
#define JWT_RSA_MAX_BITS 4096
/* A token without "kid" is tried against at most this many keys of its
 * algorithm, in the file's order (a rotation's previous, current and next
 * key); give keys and tokens a kid when there are more. */
#define JWT_KIDLESS_TRIES 3

/* The bit of an algorithm name, or 0 for one not supported ("none",
 * "RS512", ...). */
unsigned jwt_alg_from_name(const char *name);

typedef struct jwt_keyset jwt_keyset;

/* A JWKS document ({"keys": [...]}) or a single JWK. Keys meant for
 * encryption ("use": "enc", or key_ops without "verify"), and key types
 * not supported, are left out; a supported key that is malformed (an RSA
 * key under 2048 or over 4096 bits, an HMAC secret under 32 bytes, a point not on its
 * curve) is an error, and so is a set with no usable key. */
jwt_keyset *jwt_keyset_parse(const char *text, size_t len, char *why,
			     size_t whylen) MUST_CHECK;
/* Reads FILE and parses it. */
jwt_keyset *jwt_keyset_load(const char *file, char *why,
			    size_t whylen) MUST_CHECK;
void jwt_keyset_free(jwt_keyset *ks);
size_t jwt_keyset_count(const jwt_keyset *ks);
/* How many signature checks the set has made (each key a token was tried
 * against counts one). */
unsigned long jwt_keyset_verifications(const jwt_keyset *ks);

typedef struct jwt_policy {
	jwt_keyset *keys;
	char *keys_file;
	char *issuer;      /* the iss every token must carry */
	char *audience;    /* one of the token's aud */
	unsigned algs;     /* enum jwt_alg bits */
	int64_t leeway_ms; /* clock skew allowed on exp and nbf */
} jwt_policy;

void jwt_policy_free(jwt_policy *p);

enum jwt_result {
	JWT_OK,
	JWT_INVALID,  /* malformed, bad signature, or claims refused */
	JWT_NO_CLAIM, /* valid, but without the claim asked for */
};

/* Verifies token (the credentials after "Bearer ") at now_ms (Unix time in
 * ms) and reads claim: a string of 1-255 visible ASCII characters, or an
 * integer (in decimal), into value (cap bytes). exp is required; nbf, when
 * present, is checked; iss and aud must be the policy's. detail says why
 * (never quoting the token). */
enum jwt_result jwt_verify(const jwt_policy *pol, const char *token,
			   size_t len, int64_t now_ms, const char *claim,
			   char *value, size_t cap, char *detail,
			   size_t dlen);

#endif
