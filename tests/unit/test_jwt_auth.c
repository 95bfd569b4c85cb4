#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <jose/b64.h>
#include <jose/jwk.h>
#include <jose/jws.h>
#include <jose/openssl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "jwt_auth.h"

#define NOW_MS INT64_C(1700000000000)
#define NOW_S (NOW_MS / 1000)
#define ISS "https://issuer.example"
#define AUD "payments"

/* Private and public forms of one key each, made once. */
static json_t *rsa_priv, *rsa_pub, *ec_priv, *ec_pub, *hs_key;
static EVP_PKEY *ed_priv;
static json_t *ed_pub;

static char *b64(const void *p, size_t n)
{
	json_t *s = jose_b64_enc(p, n);
	char *out = xstrdup(json_string_value(s));
	json_decref(s);
	return out;
}

static json_t *public_of(const json_t *priv)
{
	json_t *pub = json_deep_copy(priv);
	assert_true(jose_jwk_pub(NULL, pub));
	return pub;
}

static int setup(void **state)
{
	(void)state;
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
	rsa_priv = jose_openssl_jwk_from_EVP_PKEY(NULL, k);
	EVP_PKEY_free(k);
	json_object_set_new(rsa_priv, "kid", json_string("rsa-1"));
	rsa_pub = public_of(rsa_priv);
	k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
	ec_priv = jose_openssl_jwk_from_EVP_PKEY(NULL, k);
	EVP_PKEY_free(k);
	ec_pub = public_of(ec_priv);
	hs_key = json_pack("{s:s,s:o}", "kty", "oct", "k",
			   jose_b64_enc("0123456789abcdef0123456789abcdef",
					32));
	ed_priv = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	unsigned char raw[32];
	size_t rl = sizeof raw;
	assert_int_equal(EVP_PKEY_get_raw_public_key(ed_priv, raw, &rl), 1);
	char *x = b64(raw, rl);
	ed_pub = json_pack("{s:s,s:s,s:s}", "kty", "OKP", "crv", "Ed25519",
			   "x", x);
	free(x);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	json_decref(rsa_priv);
	json_decref(rsa_pub);
	json_decref(ec_priv);
	json_decref(ec_pub);
	json_decref(hs_key);
	json_decref(ed_pub);
	EVP_PKEY_free(ed_priv);
	return 0;
}

static char *compact(const char *hdr_b64, const char *pay_b64,
		     const char *sig_b64)
{
	growbuf b = {0};
	growbuf_printf(&b, "%s.%s.%s", hdr_b64, pay_b64, sig_b64);
	return b.data;
}

static char *b64_json(const json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	char *out = b64(s, strlen(s));
	free(s);
	return out;
}

/* b64_json of a new reference, which it drops. */
static char *b64_json_new(json_t *j)
{
	char *out = b64_json(j);
	json_decref(j);
	return out;
}

/* A token over claims with header hdr, signed by José with jwk. */
static char *sign_jose(json_t *hdr, json_t *claims, const json_t *jwk)
{
	char *pay = b64_json(claims);
	json_t *jws = json_pack("{s:s}", "payload", pay);
	json_t *sig = json_pack("{s:O}", "protected", hdr);
	assert_true(jose_jws_sig(NULL, jws, sig, jwk));
	char *t = compact(json_string_value(json_object_get(jws, "protected")),
			  pay,
			  json_string_value(json_object_get(jws, "signature")));
	json_decref(sig);
	json_decref(jws);
	free(pay);
	json_decref(hdr);
	json_decref(claims);
	return t;
}

static char *sign_ed25519(json_t *hdr, json_t *claims)
{
	char *h = b64_json(hdr), *p = b64_json(claims);
	growbuf in = {0};
	growbuf_printf(&in, "%s.%s", h, p);
	unsigned char sig[64];
	size_t sl = sizeof sig;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, ed_priv), 1);
	assert_int_equal(EVP_DigestSign(ctx, sig, &sl,
					(unsigned char *)in.data, in.len),
			 1);
	EVP_MD_CTX_free(ctx);
	char *s = b64(sig, sl);
	char *t = compact(h, p, s);
	free(h);
	free(p);
	free(s);
	growbuf_free(&in);
	json_decref(hdr);
	json_decref(claims);
	return t;
}

/* HS256 by hand with any secret: what an attacker can compute. */
static char *sign_hmac(json_t *hdr, json_t *claims, const void *secret,
		       size_t n)
{
	char *h = b64_json(hdr), *p = b64_json(claims);
	growbuf in = {0};
	growbuf_printf(&in, "%s.%s", h, p);
	unsigned char mac[32];
	unsigned int ml = sizeof mac;
	HMAC(EVP_sha256(), secret, (int)n, (unsigned char *)in.data, in.len,
	     mac, &ml);
	char *s = b64(mac, ml);
	char *t = compact(h, p, s);
	free(h);
	free(p);
	free(s);
	growbuf_free(&in);
	json_decref(hdr);
	json_decref(claims);
	return t;
}

static json_t *claims(int64_t exp_off)
{
	return json_pack("{s:s,s:s,s:I,s:s}", "iss", ISS, "aud", AUD, "exp",
			 (json_int_t)(NOW_S + exp_off), "org", "acme");
}

static json_t *hdr(const char *alg)
{
	return json_pack("{s:s,s:s}", "alg", alg, "typ", "JWT");
}

static jwt_policy *policy(unsigned algs, const json_t *k1, const json_t *k2)
{
	json_t *set = json_pack("{s:[]}", "keys");
	json_array_append(json_object_get(set, "keys"), (json_t *)k1);
	if (k2)
		json_array_append(json_object_get(set, "keys"), (json_t *)k2);
	char *text = json_dumps(set, 0);
	json_decref(set);
	char why[256];
	jwt_policy *p = xcalloc(1, sizeof *p);
	p->keys = jwt_keyset_parse(text, strlen(text), why, sizeof why);
	free(text);
	if (!p->keys)
		fail_msg("%s", why);
	p->issuer = xstrdup(ISS);
	p->audience = xstrdup(AUD);
	p->algs = algs;
	p->leeway_ms = 30000;
	return p;
}

#define ALL (JWT_RS256 | JWT_ES256 | JWT_EDDSA | JWT_HS256)

static enum jwt_result verify(const jwt_policy *p, char *token,
			      char *value, char *detail)
{
	enum jwt_result r = jwt_verify(p, token, strlen(token), NOW_MS, "org",
				       value, 256, detail, 160);
	free(token);
	return r;
}

static void ok(const jwt_policy *p, char *token)
{
	char v[256], d[160] = "";
	if (verify(p, token, v, d) != JWT_OK)
		fail_msg("refused: %s", d);
	assert_string_equal(v, "acme");
}

static void refused(const jwt_policy *p, char *token, const char *needle)
{
	char v[256], d[160] = "";
	enum jwt_result r = verify(p, token, v, d);
	if (r != JWT_INVALID || !strstr(d, needle))
		fail_msg("got %d \"%s\", expected invalid \"...%s...\"", r, d,
			 needle);
}

static void test_each_algorithm_verifies(void **state)
{
	(void)state;
	jwt_policy *p = policy(ALL, rsa_pub, ec_pub);
	ok(p, sign_jose(hdr("RS256"), claims(60), rsa_priv));
	ok(p, sign_jose(hdr("ES256"), claims(60), ec_priv));
	jwt_policy_free(p);
	p = policy(ALL, hs_key, ed_pub);
	ok(p, sign_jose(hdr("HS256"), claims(60), hs_key));
	ok(p, sign_ed25519(hdr("EdDSA"), claims(60)));
	jwt_policy_free(p);
}

static void test_claims_are_checked(void **state)
{
	(void)state;
	jwt_policy *p = policy(ALL, rsa_pub, NULL);
	refused(p, sign_jose(hdr("RS256"), claims(-31), rsa_priv), "expired");
	ok(p, sign_jose(hdr("RS256"), claims(-29), rsa_priv)); /* leeway */
	json_t *c = claims(60);
	json_object_del(c, "exp");
	refused(p, sign_jose(hdr("RS256"), c, rsa_priv), "no \"exp\"");
	c = claims(60);
	json_object_set_new(c, "nbf", json_integer(NOW_S + 31));
	refused(p, sign_jose(hdr("RS256"), c, rsa_priv), "not valid yet");
	c = claims(60);
	json_object_set_new(c, "iss", json_string("https://evil.example"));
	refused(p, sign_jose(hdr("RS256"), c, rsa_priv), "issuer");
	c = claims(60);
	json_object_set_new(c, "aud", json_string("other"));
	refused(p, sign_jose(hdr("RS256"), c, rsa_priv), "audience");
	c = claims(60);
	json_object_set_new(c, "aud", json_pack("[s,s]", "other", AUD));
	ok(p, sign_jose(hdr("RS256"), c, rsa_priv));

	char v[256], d[160];
	c = claims(60);
	json_object_del(c, "org");
	assert_int_equal(verify(p, sign_jose(hdr("RS256"), c, rsa_priv), v, d),
			 JWT_NO_CLAIM);
	c = claims(60);
	json_object_set_new(c, "org", json_integer(42));
	assert_int_equal(verify(p, sign_jose(hdr("RS256"), c, rsa_priv), v, d),
			 JWT_OK);
	assert_string_equal(v, "42");
	c = claims(60);
	json_object_set_new(c, "org", json_pack("{}"));
	refused(p, sign_jose(hdr("RS256"), c, rsa_priv), "claim must be");
	jwt_policy_free(p);
}

static void test_bad_signature_and_shapes(void **state)
{
	(void)state;
	jwt_policy *p = policy(ALL, rsa_pub, NULL);
	char *t = sign_jose(hdr("RS256"), claims(60), rsa_priv);
	t[strlen(t) - 5] = t[strlen(t) - 5] == 'A' ? 'B' : 'A';
	refused(p, t, "signature does not verify");
	/* The claims changed under a valid signature. */
	t = sign_jose(hdr("RS256"), claims(60), rsa_priv);
	char *other = sign_jose(hdr("RS256"), claims(6000), rsa_priv);
	char *dot1 = strchr(t, '.'), *dot2 = strchr(dot1 + 1, '.');
	char *odot1 = strchr(other, '.'), *odot2 = strchr(odot1 + 1, '.');
	growbuf b = {0};
	growbuf_printf(&b, "%.*s%.*s%s", (int)(dot1 - t), t,
		       (int)(odot2 - odot1), odot1, dot2);
	free(t);
	free(other);
	refused(p, b.data, "signature does not verify");
	refused(p, xstrdup("a.b"), "not a signed JWT");
	refused(p, xstrdup("a.b.c.d"), "not a signed JWT");
	refused(p, xstrdup("a=.b.c"), "not a signed JWT");
	refused(p, xstrdup("bm90IGpzb24.e30.c2ln"), "header is not");
	/* Signed by a key this route does not have. */
	jwt_policy *q = policy(ALL, ec_pub, NULL);
	refused(q, sign_jose(hdr("RS256"), claims(60), rsa_priv),
		"no key of this route");
	jwt_policy_free(q);
	jwt_policy_free(p);
}

/* alg=none, with or without a signature, is never accepted; nor is an
 * algorithm the route did not list. */
static void test_alg_none_and_unlisted(void **state)
{
	(void)state;
	jwt_policy *p = policy(ALL, rsa_pub, hs_key);
	char *h = b64_json_new(hdr("none")), *c = b64_json_new(claims(60));
	refused(p, compact(h, c, ""), "not a signed JWT");
	refused(p, compact(h, c, "c2ln"), "algorithm \"none\" is not accepted");
	free(h);
	free(c);
	assert_int_equal(jwt_alg_from_name("none"), 0);
	jwt_policy_free(p);
	p = policy(JWT_ES256, rsa_pub, ec_pub);
	refused(p, sign_jose(hdr("RS256"), claims(60), rsa_priv),
		"\"RS256\" is not accepted");
	jwt_policy_free(p);
}

/* The classic confusion: HS256 "signed" with the RSA public key as the
 * secret, against a route that accepts both algorithms. */
static void test_hs_rs_confusion(void **state)
{
	(void)state;
	jwt_policy *p = policy(JWT_RS256 | JWT_HS256, rsa_pub, NULL);
	char *pub = json_dumps(rsa_pub, JSON_COMPACT);
	const char *n = json_string_value(json_object_get(rsa_pub, "n"));
	refused(p, sign_hmac(hdr("HS256"), claims(60), pub, strlen(pub)),
		"no key of this route");
	refused(p, sign_hmac(hdr("HS256"), claims(60), n, strlen(n)),
		"no key of this route");
	/* With a kid naming the RSA key, too. */
	json_t *h = hdr("HS256");
	json_object_set_new(h, "kid", json_string("rsa-1"));
	refused(p, sign_hmac(h, claims(60), pub, strlen(pub)),
		"no key of this route");
	free(pub);
	jwt_policy_free(p);
}

static void quiet(void *misc, const char *file, int line, uint64_t err,
		  const char *fmt, va_list ap)
{
	(void)misc, (void)file, (void)line, (void)err, (void)fmt, (void)ap;
}

/* What José does on its own, and why the proxy checks first. */
static void test_jose_alone(void **state)
{
	(void)state;
	/* No "none" algorithm: an unsigned token never verifies. */
	char *h = b64_json_new(hdr("none")), *c = b64_json_new(claims(60));
	json_t *jws = json_pack("{s:s,s:s,s:s}", "protected", h, "payload", c,
				"signature", "");
	jose_cfg_t *cfg = jose_cfg();
	jose_cfg_set_err_func(cfg, quiet, NULL);
	assert_false(jose_jws_ver(cfg, jws, NULL, rsa_pub, false));
	json_decref(jws);
	free(h);
	free(c);
	/* A key pinned to RS256 ("alg" in the JWK) still verifies a token
	 * whose header says RS512: José compares with strcmp() < 0 only.
	 * The proxy refuses RS512 before José is asked. */
	json_t *pinned = json_deep_copy(rsa_priv);
	json_object_set_new(pinned, "alg", json_string("RS256"));
	json_t *hd = hdr("RS512");
	char *pay = b64_json_new(claims(60));
	jws = json_pack("{s:s}", "payload", pay);
	json_t *sig = json_pack("{s:O}", "protected", hd);
	json_t *plain = json_deep_copy(rsa_priv);
	assert_true(jose_jws_sig(NULL, jws, sig, plain));
	json_t *pinned_pub = public_of(pinned);
	assert_true(jose_jws_ver(cfg, jws, NULL, pinned_pub, false));
	jwt_policy *p = policy(ALL, pinned_pub, NULL);
	char *t = compact(json_string_value(json_object_get(jws, "protected")),
			  pay,
			  json_string_value(json_object_get(jws, "signature")));
	refused(p, t, "\"RS512\" is not accepted");
	jwt_policy_free(p);
	json_decref(pinned_pub);
	json_decref(plain);
	json_decref(sig);
	json_decref(hd);
	json_decref(jws);
	json_decref(pinned);
	free(pay);
	jose_cfg_decref(cfg);
}

static void keyset_refused(const char *text, const char *needle)
{
	char why[256] = "";
	jwt_keyset *ks = jwt_keyset_parse(text, strlen(text), why, sizeof why);
	if (ks) {
		jwt_keyset_free(ks);
		fail_msg("%s loaded", text);
	}
	if (!strstr(why, needle))
		fail_msg("got \"%s\", expected \"%s\"", why, needle);
}

static void test_keyset_loading(void **state)
{
	(void)state;
	keyset_refused("[", "not JSON");
	keyset_refused("{\"keys\": 1}", "must be a JWK set");
	keyset_refused("{\"keys\": []}", "no key for");
	keyset_refused("{\"keys\": [{\"kty\":\"oct\",\"k\":\"c2hvcnQ\"}]}",
		       "at least 32");
	keyset_refused("{\"keys\": [{\"kty\":\"OKP\",\"crv\":\"Ed25519\","
		       "\"x\":\"AAAA\"}]}",
		       "32 bytes");
	EVP_PKEY *small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
	json_t *sj = jose_openssl_jwk_from_EVP_PKEY(NULL, small);
	EVP_PKEY_free(small);
	json_t *set = json_pack("{s:[O]}", "keys", sj);
	char *text = json_dumps(set, 0);
	keyset_refused(text, "1024 bits");
	free(text);
	json_decref(set);
	json_decref(sj);
	/* Above 4096 bits, too: each verification would cost the serving
	 * thread several times a 4096-bit one. */
	EVP_PKEY *big = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)4608);
	sj = jose_openssl_jwk_from_EVP_PKEY(NULL, big);
	EVP_PKEY_free(big);
	for (const char **m = (const char *[]){"d", "p", "q", "dp", "dq",
						"qi", NULL};
	     *m; m++)
		json_object_del(sj, *m); /* the public key */
	set = json_pack("{s:[O]}", "keys", sj);
	text = json_dumps(set, 0);
	keyset_refused(text, "an RSA key of 4608 bits; 2048 to 4096 are accepted");
	free(text);
	json_decref(set);
	json_decref(sj);
	/* Encryption keys and unsupported types are left out. */
	json_t *enc = json_deep_copy(ec_pub);
	json_object_set_new(enc, "use", json_string("enc"));
	set = json_pack("{s:[O,{s:s,s:s},O]}", "keys", enc, "kty", "EC", "crv",
			"P-521", rsa_pub);
	text = json_dumps(set, 0);
	char why[256];
	jwt_keyset *ks = jwt_keyset_parse(text, strlen(text), why, sizeof why);
	assert_non_null(ks);
	assert_int_equal(jwt_keyset_count(ks), 1);
	jwt_keyset_free(ks);
	free(text);
	json_decref(set);
	json_decref(enc);
}

/* A token whose kid names one key is checked against that key only. */
static void test_kid_selects(void **state)
{
	(void)state;
	jwt_policy *p = policy(ALL, rsa_pub, ec_pub);
	json_t *h = hdr("RS256");
	json_object_set_new(h, "kid", json_string("rsa-1"));
	json_t *k = json_deep_copy(rsa_priv);
	ok(p, sign_jose(h, claims(60), k));
	h = hdr("RS256");
	json_object_set_new(h, "kid", json_string("rsa-2"));
	refused(p, sign_jose(h, claims(60), k), "no key of this route");
	h = hdr("RS256");
	json_object_set_new(h, "crit", json_pack("[s]", "exp"));
	refused(p, sign_jose(h, claims(60), k), "extension");
	json_decref(k);
	jwt_policy_free(p);
}

/* A token without kid is tried against a few keys of its algorithm only
 * (JWT_KIDLESS_TRIES), not against every key of the file: each costs a
 * signature check on the serving thread. */
static void test_a_token_without_kid_tries_few_keys(void **state)
{
	(void)state;
	enum { NKEYS = 8 };
	char secret[NKEYS][40];
	json_t *set = json_pack("{s:[]}", "keys");
	for (int i = 0; i < NKEYS; i++) {
		snprintf(secret[i], sizeof secret[i],
			 "secret-%d-0123456789abcdef0123456789", i);
		char *k = b64(secret[i], strlen(secret[i]));
		json_array_append_new(json_object_get(set, "keys"),
				      json_pack("{s:s,s:s}", "kty", "oct",
						"k", k));
		free(k);
	}
	char *text = json_dumps(set, 0);
	json_decref(set);
	char why[256];
	jwt_policy *p = xcalloc(1, sizeof *p);
	p->keys = jwt_keyset_parse(text, strlen(text), why, sizeof why);
	free(text);
	assert_non_null(p->keys);
	p->issuer = xstrdup(ISS);
	p->audience = xstrdup(AUD);
	p->algs = JWT_HS256;
	p->leeway_ms = 30000;
	/* The first keys verify without a kid. */
	ok(p, sign_hmac(hdr("HS256"), claims(60), secret[0],
			strlen(secret[0])));
	ok(p, sign_hmac(hdr("HS256"), claims(60), secret[JWT_KIDLESS_TRIES - 1],
			strlen(secret[JWT_KIDLESS_TRIES - 1])));
	/* A forged token costs JWT_KIDLESS_TRIES checks, not NKEYS. */
	unsigned long before = jwt_keyset_verifications(p->keys);
	refused(p, sign_hmac(hdr("HS256"), claims(60), "forged-0123456789abcdef0123456789", 33),
		"signature does not verify");
	assert_int_equal(jwt_keyset_verifications(p->keys) - before,
			 JWT_KIDLESS_TRIES);
	/* The last key is past the bound: its tokens need a kid. */
	refused(p, sign_hmac(hdr("HS256"), claims(60), secret[NKEYS - 1],
			     strlen(secret[NKEYS - 1])),
		"signature does not verify");
	jwt_policy_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_each_algorithm_verifies),
		cmocka_unit_test(test_claims_are_checked),
		cmocka_unit_test(test_bad_signature_and_shapes),
		cmocka_unit_test(test_alg_none_and_unlisted),
		cmocka_unit_test(test_hs_rs_confusion),
		cmocka_unit_test(test_jose_alone),
		cmocka_unit_test(test_keyset_loading),
		cmocka_unit_test(test_kid_selects),
		cmocka_unit_test(test_a_token_without_kid_tries_few_keys),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
