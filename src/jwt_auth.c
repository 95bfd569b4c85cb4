/* Bearer JWT verification.
 *
 * What the proxy decides itself, before any signature is checked, and why:
 * - the algorithm must be in the route's list: "none" never is (the loader
 *   refuses it), and a token cannot pick an algorithm the operator did not;
 * - each key is used with the one algorithm its type allows (RSA: RS256,
 *   EC P-256: ES256, OKP Ed25519: EdDSA, oct: HS256), so an RSA public key
 *   can never serve as an HMAC secret (the classic HS/RS confusion);
 * - a key's own "alg", when it has one, must be the token's exactly: José
 *   compares the two with strcmp() < 0 and so lets a header alg that sorts
 *   after the key's through;
 * - "crit" and "b64" are refused (no extension is understood), and keys are
 *   never taken from the token (jwk, jku, x5u, x5c are ignored);
 * - duplicate member names in the header or the claims are refused.
 * José's errors go nowhere: its default handler would print every bad
 * token's reason to stderr. */
#include "jwt_auth.h"

#include <errno.h>
#include <jansson.h>
#include <jose/b64.h>
#include <jose/cfg.h>
#include <jose/openssl.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JWT_RSA_MIN_BITS 2048
#define JWT_HMAC_MIN_BYTES 32
#define JWT_FILE_MAX (1 << 20)

/* Each key is parsed once, when the file is (re)loaded, into the object
 * OpenSSL verifies with; a token costs one signature check per key it is
 * tried against, and at most JWT_KIDLESS_TRIES of those without a kid. */
typedef struct jwt_key {
	char *kid;           /* or NULL */
	unsigned alg;        /* the one algorithm this key verifies */
	EVP_PKEY *pk;        /* RS256, ES256, EdDSA */
	unsigned char *hmac; /* HS256: the secret */
	size_t hmac_len;
} jwt_key;

struct jwt_keyset {
	jwt_key *v;
	size_t n;
	EVP_MD *sha256;
	atomic_ulong verifications;
};

static const struct {
	const char *name;
	unsigned bit;
} jwt_algs[] = {
	{"RS256", JWT_RS256},
	{"ES256", JWT_ES256},
	{"EdDSA", JWT_EDDSA},
	{"HS256", JWT_HS256},
};

unsigned jwt_alg_from_name(const char *name)
{
	for (size_t i = 0; name && i < sizeof jwt_algs / sizeof jwt_algs[0];
	     i++)
		if (strcmp(name, jwt_algs[i].name) == 0)
			return jwt_algs[i].bit;
	return 0;
}

__attribute__((format(printf, 3, 4))) static int
jwt_why(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return -1;
}

static void quiet(void *misc, const char *file, int line, uint64_t err,
		  const char *fmt, va_list ap)
{
	(void)misc, (void)file, (void)line, (void)err, (void)fmt, (void)ap;
}

static jose_cfg_t *quiet_cfg(void)
{
	jose_cfg_t *cfg = jose_cfg();
	ALWAYS_ASSERT(cfg != NULL);
	jose_cfg_set_err_func(cfg, quiet, NULL);
	return cfg;
}

/* ---- base64url ------------------------------------------------------- */

static bool is_b64url(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_'))
			return false;
	}
	return true;
}

/* Decodes into a fresh buffer (NUL-terminated); *out_len its length.
 * José's decoder looks one byte past the length it is given, so it gets a
 * NUL-terminated copy of the segment. */
static char *b64_decode(const char *s, size_t n, size_t *out_len)
{
	if (!is_b64url(s, n))
		return NULL;
	char *in = xstrndup(s, n);
	size_t cap = jose_b64_dec_buf(in, n, NULL, 0);
	char *out = cap == SIZE_MAX ? NULL : xmalloc(cap + 1);
	size_t len = out ? jose_b64_dec_buf(in, n, out, cap) : SIZE_MAX;
	free(in);
	if (len == SIZE_MAX || len > cap) {
		free(out);
		return NULL;
	}
	out[len] = '\0';
	*out_len = len;
	return out;
}

static json_t *b64_json_object(const char *s, size_t n)
{
	size_t len;
	char *raw = b64_decode(s, n, &len);
	if (!raw)
		return NULL;
	json_error_t jerr;
	json_t *o = json_loadb(raw, len, JSON_REJECT_DUPLICATES, &jerr);
	free(raw);
	if (o && !json_is_object(o)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ---- keys ------------------------------------------------------------ */

static void key_free(jwt_key *k)
{
	free(k->kid);
	EVP_PKEY_free(k->pk);
	if (k->hmac)
		OPENSSL_cleanse(k->hmac, k->hmac_len);
	free(k->hmac);
}

void jwt_keyset_free(jwt_keyset *ks)
{
	if (!ks)
		return;
	for (size_t i = 0; i < ks->n; i++)
		key_free(&ks->v[i]);
	free(ks->v);
	EVP_MD_free(ks->sha256);
	free(ks);
}

size_t jwt_keyset_count(const jwt_keyset *ks)
{
	return ks ? ks->n : 0;
}

unsigned long jwt_keyset_verifications(const jwt_keyset *ks)
{
	return ks ? atomic_load(&((jwt_keyset *)ks)->verifications) : 0;
}

/* Meant for signatures? "use" and "key_ops" are both optional. */
static bool for_verifying(const json_t *jwk)
{
	const json_t *use = json_object_get(jwk, "use");
	if (use && (!json_is_string(use) ||
		    strcmp(json_string_value(use), "sig") != 0))
		return false;
	const json_t *ops = json_object_get(jwk, "key_ops");
	if (!ops)
		return true;
	size_t i;
	const json_t *op;
	json_array_foreach(ops, i, op)
		if (json_is_string(op) &&
		    strcmp(json_string_value(op), "verify") == 0)
			return true;
	return false;
}

static const char *member_str(const json_t *o, const char *name)
{
	return json_string_value(json_object_get(o, name));
}

/* The algorithm of a key by its type, 0 for one not supported. */
static unsigned alg_of_type(const json_t *jwk)
{
	const char *kty = member_str(jwk, "kty"), *crv = member_str(jwk, "crv");
	if (!kty)
		return 0;
	if (strcmp(kty, "RSA") == 0)
		return JWT_RS256;
	if (strcmp(kty, "EC") == 0 && crv && strcmp(crv, "P-256") == 0)
		return JWT_ES256;
	if (strcmp(kty, "OKP") == 0 && crv && strcmp(crv, "Ed25519") == 0)
		return JWT_EDDSA;
	if (strcmp(kty, "oct") == 0)
		return JWT_HS256;
	return 0;
}

/* RSA keys are bounded above too: a token's verification runs on the
 * serving thread, and its cost grows with the square of the modulus. */
static int load_asymmetric(const json_t *jwk, jwt_key *out, char *why,
			   size_t whylen)
{
	jose_cfg_t *cfg = quiet_cfg();
	EVP_PKEY *pk = jose_openssl_jwk_to_EVP_PKEY(cfg, jwk);
	jose_cfg_decref(cfg);
	if (!pk)
		return jwt_why(why, whylen, "not a valid %s key",
			       out->alg == JWT_RS256 ? "RSA" : "EC P-256");
	int bits = EVP_PKEY_get_bits(pk);
	if (out->alg == JWT_RS256 &&
	    (bits < JWT_RSA_MIN_BITS || bits > JWT_RSA_MAX_BITS)) {
		EVP_PKEY_free(pk);
		return jwt_why(why, whylen,
			       "an RSA key of %d bits; %d to %d are accepted",
			       bits, JWT_RSA_MIN_BITS, JWT_RSA_MAX_BITS);
	}
	out->pk = pk;
	return 0;
}

static int load_secret(const json_t *jwk, jwt_key *out, char *why,
		       size_t whylen)
{
	const char *k = member_str(jwk, "k");
	size_t n;
	char *raw = k ? b64_decode(k, strlen(k), &n) : NULL;
	if (!raw)
		return jwt_why(why, whylen,
			       "an oct key needs \"k\", base64url-encoded");
	if (n < JWT_HMAC_MIN_BYTES) {
		OPENSSL_cleanse(raw, n);
		free(raw);
		return jwt_why(why, whylen,
			       "an HS256 secret of %zu bytes; at least %d are "
			       "needed",
			       n, JWT_HMAC_MIN_BYTES);
	}
	out->hmac = (unsigned char *)raw;
	out->hmac_len = n;
	return 0;
}

static EVP_PKEY *ed25519_key(const json_t *jwk)
{
	const char *x = member_str(jwk, "x");
	size_t n;
	char *raw = x ? b64_decode(x, strlen(x), &n) : NULL;
	EVP_PKEY *pk = NULL;
	if (raw && n == 32)
		pk = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL,
						 (unsigned char *)raw, n);
	free(raw);
	return pk;
}

/* 1: the key is kept, 0: left out (not for signatures, or a type not
 * supported), -1: malformed. */
static int load_key(const json_t *jwk, jwt_key *out, char *why,
		    size_t whylen)
{
	memset(out, 0, sizeof *out);
	if (!json_is_object(jwk))
		return jwt_why(why, whylen, "not a JSON object");
	if (!for_verifying(jwk))
		return 0;
	unsigned alg = alg_of_type(jwk);
	if (!alg)
		return 0;
	const json_t *ka = json_object_get(jwk, "alg");
	if (ka && jwt_alg_from_name(json_string_value(ka)) != alg)
		return 0;
	const json_t *kid = json_object_get(jwk, "kid");
	if (kid && !json_is_string(kid))
		return jwt_why(why, whylen, "\"kid\" must be a string");
	out->alg = alg;
	if (alg == JWT_EDDSA) {
		out->pk = ed25519_key(jwk);
		if (!out->pk)
			return jwt_why(why, whylen,
				       "an Ed25519 key needs \"x\", 32 bytes "
				       "base64url-encoded");
	} else if ((alg == JWT_HS256 ? load_secret(jwk, out, why, whylen)
				     : load_asymmetric(jwk, out, why,
						       whylen)) < 0) {
		return -1;
	}
	out->kid = kid ? xstrdup(json_string_value(kid)) : NULL;
	return 1;
}

jwt_keyset *jwt_keyset_parse(const char *text, size_t len, char *why,
			     size_t whylen)
{
	json_error_t jerr;
	json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!doc) {
		jwt_why(why, whylen, "not JSON: %s (line %d)", jerr.text,
			jerr.line);
		return NULL;
	}
	json_t *keys = json_object_get(doc, "keys");
	json_t *one = json_is_object(doc) && !keys && json_object_get(doc, "kty")
			      ? doc
			      : NULL;
	if (!one && !json_is_array(keys)) {
		json_decref(doc);
		jwt_why(why, whylen,
			"must be a JWK set {\"keys\": [...]} or one JWK");
		return NULL;
	}
	jwt_keyset *ks = xcalloc(1, sizeof *ks);
	ks->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	ALWAYS_ASSERT(ks->sha256 != NULL);
	size_t n = one ? 1 : json_array_size(keys);
	ks->v = xcalloc(n ? n : 1, sizeof *ks->v);
	for (size_t i = 0; i < n; i++) {
		char kwhy[160];
		int rc = load_key(one ? one : json_array_get(keys, i),
				  &ks->v[ks->n], kwhy, sizeof kwhy);
		if (rc < 0) {
			key_free(&ks->v[ks->n]);
			jwt_why(why, whylen, "key %zu: %s", i + 1, kwhy);
			json_decref(doc);
			jwt_keyset_free(ks);
			return NULL;
		}
		ks->n += (size_t)rc;
	}
	json_decref(doc);
	if (ks->n == 0) {
		jwt_why(why, whylen,
			"no key for RS256, ES256 (P-256), EdDSA (Ed25519) or "
			"HS256 signatures");
		jwt_keyset_free(ks);
		return NULL;
	}
	return ks;
}

jwt_keyset *jwt_keyset_load(const char *file, char *why, size_t whylen)
{
	FILE *f = fopen(file, "rb");
	if (!f) {
		jwt_why(why, whylen, "cannot read %s: %s", file,
			strerror(errno));
		return NULL;
	}
	growbuf b = {0};
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 &&
	       b.len <= JWT_FILE_MAX)
		growbuf_append(&b, chunk, n);
	bool err = ferror(f) != 0;
	fclose(f);
	jwt_keyset *ks = NULL;
	char pwhy[256];
	if (err)
		jwt_why(why, whylen, "cannot read %s", file);
	else if (b.len > JWT_FILE_MAX)
		jwt_why(why, whylen, "%s is larger than 1MiB", file);
	else if (!(ks = jwt_keyset_parse(b.data ? b.data : "", b.len, pwhy,
					 sizeof pwhy)))
		jwt_why(why, whylen, "%s: %s", file, pwhy);
	growbuf_free(&b);
	return ks;
}

void jwt_policy_free(jwt_policy *p)
{
	if (!p)
		return;
	jwt_keyset_free(p->keys);
	free(p->keys_file);
	free(p->issuer);
	free(p->audience);
	free(p);
}

/* ---- verification ---------------------------------------------------- */

typedef struct jwt_parts {
	const char *s[3];
	size_t n[3];
} jwt_parts;

static bool split(const char *t, size_t len, jwt_parts *p)
{
	size_t k = 0, start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && t[i] != '.')
			continue;
		if (k == 3)
			return false;
		p->s[k] = t + start;
		p->n[k] = i - start;
		if (p->n[k] == 0 || !is_b64url(p->s[k], p->n[k]))
			return false;
		k++;
		start = i + 1;
	}
	return k == 3;
}

/* JWS carries an ES256 signature as r || s, 32 bytes each; OpenSSL
 * verifies the DER form. */
static unsigned char *es256_der(const unsigned char *sig, size_t *len)
{
	ECDSA_SIG *es = ECDSA_SIG_new();
	BIGNUM *r = BN_bin2bn(sig, 32, NULL), *s = BN_bin2bn(sig + 32, 32, NULL);
	unsigned char *der = NULL;
	int n = -1;
	if (es && r && s && ECDSA_SIG_set0(es, r, s) == 1) {
		r = s = NULL; /* es owns them */
		n = i2d_ECDSA_SIG(es, &der);
	}
	BN_free(r);
	BN_free(s);
	ECDSA_SIG_free(es);
	if (n <= 0)
		return NULL;
	*len = (size_t)n;
	return der;
}

static bool verify_hmac(const jwt_keyset *ks, const jwt_key *k,
			const unsigned char *sig, size_t slen,
			const unsigned char *in, size_t inlen)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned mlen = 0;
	return slen == 32 &&
	       HMAC(ks->sha256, k->hmac, (int)k->hmac_len, in, inlen, mac,
		    &mlen) != NULL &&
	       mlen == 32 && CRYPTO_memcmp(mac, sig, 32) == 0;
}

static bool verify_pkey(const jwt_keyset *ks, const jwt_key *k,
			const unsigned char *sig, size_t slen,
			const unsigned char *in, size_t inlen)
{
	unsigned char *der = NULL;
	if (k->alg == JWT_ES256) {
		if (slen != 64 || !(der = es256_der(sig, &slen)))
			return false;
		sig = der;
	} else if (k->alg == JWT_EDDSA && slen != 64) {
		return false;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	ALWAYS_ASSERT(ctx != NULL);
	/* Ed25519 hashes by itself: no digest is named for it. */
	const EVP_MD *md = k->alg == JWT_EDDSA ? NULL : ks->sha256;
	bool ok = EVP_DigestVerifyInit(ctx, NULL, md, NULL, k->pk) == 1 &&
		  EVP_DigestVerify(ctx, sig, slen, in, inlen) == 1;
	EVP_MD_CTX_free(ctx);
	OPENSSL_free(der);
	if (!ok)
		ERR_clear_error(); /* a bad token's reasons are no one's error */
	return ok;
}

/* The signing input is header.payload exactly as sent. */
static bool verify_one(const jwt_keyset *ks, const jwt_key *k,
		       const jwt_parts *p)
{
	atomic_fetch_add(&((jwt_keyset *)ks)->verifications, 1);
	size_t slen;
	unsigned char *sig =
		(unsigned char *)b64_decode(p->s[2], p->n[2], &slen);
	if (!sig)
		return false;
	const unsigned char *in = (const unsigned char *)p->s[0];
	size_t inlen = p->n[0] + 1 + p->n[1];
	bool ok = k->alg == JWT_HS256
			  ? verify_hmac(ks, k, sig, slen, in, inlen)
			  : verify_pkey(ks, k, sig, slen, in, inlen);
	free(sig);
	return ok;
}

/* A token with a kid is checked against the keys with that kid; one
 * without, against the first JWT_KIDLESS_TRIES keys of its algorithm
 * only, so that a key file of many keys does not make every token without
 * a kid cost that many signature checks. */
static bool signed_by(const jwt_keyset *ks, unsigned alg, const char *kid,
		      const jwt_parts *p, bool *any_key)
{
	int tries = 0;
	for (size_t i = 0; i < ks->n; i++) {
		const jwt_key *k = &ks->v[i];
		if (k->alg != alg || (kid && (!k->kid || strcmp(kid, k->kid))))
			continue;
		if (!kid && tries++ == JWT_KIDLESS_TRIES)
			break;
		*any_key = true;
		if (verify_one(ks, k, p))
			return true;
	}
	return false;
}

static enum jwt_result bad(char *detail, size_t dlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static enum jwt_result bad(char *detail, size_t dlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, dlen, fmt, ap);
	va_end(ap);
	return JWT_INVALID;
}

/* The header: which algorithm, which key. */
static enum jwt_result check_header(const jwt_policy *pol, const jwt_parts *p,
				    unsigned *alg, char **kid, char *detail,
				    size_t dlen)
{
	json_t *h = b64_json_object(p->s[0], p->n[0]);
	if (!h)
		return bad(detail, dlen, "the token's header is not a JSON "
					 "object");
	const char *name = member_str(h, "alg");
	enum jwt_result r = JWT_OK;
	*alg = jwt_alg_from_name(name);
	if (!name)
		r = bad(detail, dlen, "the token's header has no \"alg\"");
	else if (!(pol->algs & *alg))
		r = bad(detail, dlen,
			"the token's algorithm \"%.20s\" is not accepted here",
			name);
	else if (json_object_get(h, "crit") || json_object_get(h, "b64"))
		r = bad(detail, dlen,
			"the token's header names an extension (crit, b64) "
			"that is not supported");
	else if (json_object_get(h, "kid") &&
		 !json_is_string(json_object_get(h, "kid")))
		r = bad(detail, dlen, "the token's \"kid\" is not a string");
	const char *k = member_str(h, "kid");
	*kid = r == JWT_OK && k ? xstrdup(k) : NULL;
	json_decref(h);
	return r;
}

static bool audience_has(const json_t *aud, const char *want)
{
	if (json_is_string(aud))
		return strcmp(json_string_value(aud), want) == 0;
	size_t i;
	const json_t *a;
	json_array_foreach(aud, i, a)
		if (json_is_string(a) && strcmp(json_string_value(a), want) == 0)
			return true;
	return false;
}

static enum jwt_result check_claims(const jwt_policy *pol, const json_t *c,
				    int64_t now_ms, char *detail, size_t dlen)
{
	double now = (double)now_ms, leeway = (double)pol->leeway_ms;
	const json_t *exp = json_object_get(c, "exp");
	const json_t *nbf = json_object_get(c, "nbf");
	if (!json_is_number(exp))
		return bad(detail, dlen, "the token has no \"exp\"");
	if (now > json_number_value(exp) * 1000.0 + leeway)
		return bad(detail, dlen, "the token has expired");
	if (nbf && !json_is_number(nbf))
		return bad(detail, dlen, "the token's \"nbf\" is not a number");
	if (nbf && now + leeway < json_number_value(nbf) * 1000.0)
		return bad(detail, dlen, "the token is not valid yet (nbf)");
	const char *iss = member_str(c, "iss");
	if (!iss || strcmp(iss, pol->issuer) != 0)
		return bad(detail, dlen, "the token's issuer is not accepted");
	if (!audience_has(json_object_get(c, "aud"), pol->audience))
		return bad(detail, dlen,
			   "the token is not meant for this audience");
	return JWT_OK;
}

static enum jwt_result read_claim(const json_t *c, const char *claim,
				  char *value, size_t cap, char *detail,
				  size_t dlen)
{
	const json_t *v = json_object_get(c, claim);
	if (!v || json_is_null(v)) {
		snprintf(detail, dlen, "the token has no \"%.64s\" claim",
			 claim);
		return JWT_NO_CLAIM;
	}
	if (json_is_integer(v)) {
		snprintf(value, cap, "%" JSON_INTEGER_FORMAT,
			 json_integer_value(v));
		return JWT_OK;
	}
	const char *s = json_string_value(v);
	size_t n = s ? json_string_length(v) : 0;
	bool ok = s && n >= 1 && n <= 255 && n < cap;
	for (size_t i = 0; ok && i < n; i++)
		ok = (unsigned char)s[i] >= 0x21 && (unsigned char)s[i] <= 0x7e;
	if (!ok)
		return bad(detail, dlen,
			   "the token's \"%.64s\" claim must be a string of "
			   "1-255 visible ASCII characters or an integer",
			   claim);
	memcpy(value, s, n + 1);
	return JWT_OK;
}

enum jwt_result jwt_verify(const jwt_policy *pol, const char *token,
			   size_t len, int64_t now_ms, const char *claim,
			   char *value, size_t cap, char *detail, size_t dlen)
{
	jwt_parts p;
	value[0] = '\0';
	if (len > JWT_TOKEN_MAX)
		return bad(detail, dlen, "the token is longer than 8KiB");
	if (!split(token, len, &p))
		return bad(detail, dlen,
			   "the token is not a signed JWT (three base64url "
			   "parts separated by '.')");
	unsigned alg = 0;
	char *kid = NULL;
	enum jwt_result r = check_header(pol, &p, &alg, &kid, detail, dlen);
	if (r != JWT_OK)
		return r;
	bool any_key = false;
	bool ok = signed_by(pol->keys, alg, kid, &p, &any_key);
	free(kid);
	if (!ok)
		return bad(detail, dlen,
			   any_key ? "the token's signature does not verify"
				   : "no key of this route can verify the "
				     "token (kid or algorithm)");
	json_t *c = b64_json_object(p.s[1], p.n[1]);
	if (!c)
		return bad(detail, dlen,
			   "the token's claims are not a JSON object");
	r = check_claims(pol, c, now_ms, detail, dlen);
	if (r == JWT_OK)
		r = read_claim(c, claim, value, cap, detail, dlen);
	json_decref(c);
	return r;
}
