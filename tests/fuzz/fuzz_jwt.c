/* Fuzz target for the JWT parser and the JWKS loader.
 *
 * The first byte picks the mode. Mode 0: the rest is a token, verified
 * against a fixed key set (an HS256 secret and an Ed25519 key) that
 * accepts every algorithm; nothing may crash, and a token the fuzzer
 * cannot sign must never verify (a forged HS256 MAC or Ed25519 signature
 * is out of its reach), so JWT_OK is a failure. Mode 1: the rest is a JWKS
 * document; loading must either give a set with at least one key or say
 * why not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jwt_auth.h"

static const char KEYS[] =
	"{\"keys\":["
	"{\"kty\":\"oct\",\"kid\":\"h\","
	"\"k\":\"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY\"},"
	"{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"kid\":\"e\","
	"\"x\":\"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo\"}]}";

static jwt_policy pol;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char why[256];
	pol.keys = jwt_keyset_parse(KEYS, strlen(KEYS), why, sizeof why);
	ALWAYS_ASSERT(pol.keys != NULL);
	pol.issuer = "i";
	pol.audience = "a";
	pol.algs = JWT_RS256 | JWT_ES256 | JWT_EDDSA | JWT_HS256;
	pol.leeway_ms = 30000;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	size_t n = size - 1;
	/* An exact-size copy plus the NUL a header value has. */
	char *in = xmalloc(n + 1);
	memcpy(in, data + 1, n);
	in[n] = '\0';
	char why[256] = "";
	if (data[0] & 1) {
		jwt_keyset *ks = jwt_keyset_parse(in, n, why, sizeof why);
		ALWAYS_ASSERT(ks ? jwt_keyset_count(ks) > 0 : why[0] != '\0');
		jwt_keyset_free(ks);
	} else {
		char value[256];
		enum jwt_result r = jwt_verify(&pol, in, n, INT64_C(1700000000000),
					       "sub", value, sizeof value, why,
					       sizeof why);
		ALWAYS_ASSERT(r != JWT_OK);
		ALWAYS_ASSERT(why[0] != '\0');
	}
	free(in);
	return 0;
}
