/* The request fingerprint and canonical JSON.
 *
 * The fingerprint decides whether a retry is "the same request", so two
 * different payloads must never share one: every field is length-prefixed,
 * optional fields carry a presence marker, and the body carries a marker
 * saying whether it was canonicalised. The leading version tag lets a later
 * encoding change without colliding with records written by this one. */
#include "fingerprint.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <string.h>

#define FP_VERSION_TAG "idemproxy-fp-v1"

/* A non-integer number survives the trip through a double without merging
 * with another value only if it has at most DBL_DIG (15) significant digits
 * and stays clear of overflow and subnormals. A document with any other
 * number is not canonicalised (it is hashed raw), so that e.g. amounts that
 * differ in the 18th digit are never taken for the same payload. */
#define FP_SAFE_DIGITS 15
#define FP_SAFE_EXP 300

/* Canonical form chosen: jansson's compact output with keys sorted by
 * strcmp (= by UTF-8 bytes), strings written as UTF-8 with only the escapes
 * JSON requires ("\u00e9" and "é" canonicalise alike), integers in decimal,
 * other numbers as %.15g (plus ".0" when that looks like an integer): with
 * at most 15 significant digits accepted, that prints back exactly the
 * value that was sent, so 1.50 and 15e-1 both become 1.5. Any top-level
 * value is allowed (RFC 8259). Duplicate keys and "\u0000" are refused, so
 * such bodies are hashed raw. */
#define FP_LOAD_FLAGS (JSON_DECODE_ANY | JSON_REJECT_DUPLICATES)
#define FP_DUMP_FLAGS                                                          \
	(JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY |                     \
	 JSON_REAL_PRECISION(FP_SAFE_DIGITS))

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Significant digits run from the first to the last non-zero digit. */
static void note_digit(char c, size_t *since_first, size_t *sig)
{
	(*since_first)++;
	if (c != '0')
		*sig = *since_first;
}

/* Scans one number token at s[*i] (already known to be valid JSON) and
 * reports whether it is exact once parsed. */
static bool number_is_exact(const char *s, size_t len, size_t *i)
{
	size_t p = *i, int_digits = 0, first_nz = 0, since_first = 0, sig = 0;
	long lead = 0; /* decimal exponent of the first significant digit */
	long exp = 0;
	bool seen = false, real = false, exp_neg = false;

	if (p < len && s[p] == '-')
		p++;
	for (; p < len && is_digit(s[p]); p++, int_digits++) {
		if (!seen && s[p] != '0') {
			seen = true;
			first_nz = int_digits;
		}
		if (seen)
			note_digit(s[p], &since_first, &sig);
	}
	if (seen)
		lead = (long)(int_digits - 1 - first_nz);
	if (p < len && s[p] == '.') {
		real = true;
		p++;
		for (long f = 1; p < len && is_digit(s[p]); p++, f++) {
			if (!seen && s[p] != '0') {
				seen = true;
				lead = -f;
			}
			if (seen)
				note_digit(s[p], &since_first, &sig);
		}
	}
	if (p < len && (s[p] == 'e' || s[p] == 'E')) {
		real = true;
		p++;
		if (p < len && (s[p] == '+' || s[p] == '-'))
			exp_neg = s[p++] == '-';
		for (; p < len && is_digit(s[p]); p++)
			if (exp < 100000)
				exp = exp * 10 + (s[p] - '0');
	}
	*i = p;
	/* Integers are parsed exactly into json_int_t, or refused; zero is
	 * zero whatever its exponent. */
	if (!real || !seen)
		return true;
	lead += exp_neg ? -exp : exp;
	return sig <= FP_SAFE_DIGITS && lead <= FP_SAFE_EXP &&
	       lead >= -FP_SAFE_EXP;
}

/* Walks a valid JSON text, skipping strings, and checks every number. */
static bool numbers_are_exact(const char *s, size_t len)
{
	size_t i = 0;

	while (i < len) {
		char c = s[i];
		if (c == '"') {
			for (i++; i < len && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			i++;
		} else if (c == '-' || is_digit(c)) {
			if (!number_is_exact(s, len, &i))
				return false;
		} else {
			i++;
		}
	}
	return true;
}

static int dump_to_buf(const char *data, size_t size, void *arg)
{
	growbuf_append(arg, data, size);
	return 0;
}

/* The document, if it canonicalises at all. */
static json_t *canon_load(const char *in, size_t len)
{
	json_error_t jerr;
	json_t *doc;

	if (in == NULL)
		return NULL;
	/* jansson's parser stops at JSON_PARSER_MAX_DEPTH (2048) nesting
	 * levels, so a hostile "[[[[..." fails here instead of recursing
	 * without bound; the dump below then only sees bounded depth. */
	doc = json_loadb(in, len, FP_LOAD_FLAGS, &jerr);
	if (doc == NULL)
		return NULL;
	if (!numbers_are_exact(in, len)) {
		json_decref(doc);
		return NULL;
	}
	return doc;
}

/* Appends the canonical form of a value; -1 (out untouched) on failure. */
static int canon_dump(const json_t *v, growbuf *out)
{
	size_t mark = out->len;
	if (json_dump_callback(v, dump_to_buf, out, FP_DUMP_FLAGS) == 0)
		return 0;
	out->len = mark;
	if (out->data)
		out->data[mark] = '\0';
	return -1;
}

int fp_canon_json(const char *in, size_t len, growbuf *out)
{
	if (out == NULL)
		return -1;
	json_t *doc = canon_load(in, len);
	if (doc == NULL)
		return -1;
	size_t mark = out->len;
	int rc = json_dump_callback(doc, dump_to_buf, out, FP_DUMP_FLAGS);
	json_decref(doc);
	if (rc != 0) {
		out->len = mark;
		if (out->data)
			out->data[mark] = '\0';
		return -1;
	}
	return 0;
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* The media type inside a Content-Type value: everything before the first
 * ';', without surrounding whitespace. Case is left to the caller. */
static void media_type_span(const char *ct, const char **start, size_t *len)
{
	const char *s = ct ? ct : "";
	const char *semi = strchr(s, ';');
	const char *e = semi ? semi : s + strlen(s);

	while (s < e && is_ows(*s))
		s++;
	while (e > s && is_ows(e[-1]))
		e--;
	*start = s;
	*len = (size_t)(e - s);
}

static char ascii_lower(char c)
{
	return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

void fp_media_type(const char *content_type, char *out, size_t outlen)
{
	const char *s;
	size_t n;

	if (out == NULL || outlen == 0)
		return;
	media_type_span(content_type, &s, &n);
	if (n > outlen - 1)
		n = outlen - 1;
	for (size_t i = 0; i < n; i++)
		out[i] = ascii_lower(s[i]);
	out[n] = '\0';
}

/* application/json, or any type/subtype+json; case-insensitive. */
static bool is_json_span(const char *s, size_t n)
{
	static const char app[] = "application/json";
	static const char suffix[] = "+json";
	const size_t al = sizeof app - 1, sl = sizeof suffix - 1;
	const char *slash = memchr(s, '/', n);

	if (n == al && str_ncaseeq(s, app, al))
		return true;
	if (slash == NULL || slash == s)
		return false;
	size_t sub = n - (size_t)(slash + 1 - s);
	return sub > sl && str_ncaseeq(s + n - sl, suffix, sl);
}

bool fp_is_json_media_type(const char *media_type)
{
	if (media_type == NULL)
		return false;
	return is_json_span(media_type, strlen(media_type));
}

/* ---- hashing ---- */

static EVP_MD *sha256;
static pthread_key_t ctx_key;
static pthread_once_t fp_once = PTHREAD_ONCE_INIT;

static void free_ctx(void *ctx)
{
	EVP_MD_CTX_free(ctx);
}

static void fp_init_once(void)
{
	sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	ALWAYS_ASSERT(sha256 != NULL);
	ALWAYS_ASSERT(pthread_key_create(&ctx_key, free_ctx) == 0);
}

/* One digest context per thread, reused across calls and freed when the
 * thread exits. */
static EVP_MD_CTX *thread_ctx(void)
{
	EVP_MD_CTX *ctx;

	ALWAYS_ASSERT(pthread_once(&fp_once, fp_init_once) == 0);
	ctx = pthread_getspecific(ctx_key);
	if (ctx == NULL) {
		ctx = EVP_MD_CTX_new();
		ALWAYS_ASSERT(ctx != NULL);
		ALWAYS_ASSERT(pthread_setspecific(ctx_key, ctx) == 0);
	}
	return ctx;
}

static void put_bytes(EVP_MD_CTX *ctx, const void *p, size_t n)
{
	if (n > 0)
		ALWAYS_ASSERT(EVP_DigestUpdate(ctx, p, n) == 1);
}

static void put_len(EVP_MD_CTX *ctx, uint64_t n)
{
	uint8_t be[8];

	for (int i = 7; i >= 0; i--) {
		be[i] = (uint8_t)(n & 0xff);
		n >>= 8;
	}
	put_bytes(ctx, be, sizeof be);
}

static void put_field(EVP_MD_CTX *ctx, const char *p, size_t n)
{
	put_len(ctx, n);
	put_bytes(ctx, p, n);
}

static void put_str(EVP_MD_CTX *ctx, const char *s)
{
	put_field(ctx, s ? s : "", s ? strlen(s) : 0);
}

/* Lower-cases through a small window so no allocation is needed. */
static void put_lower(EVP_MD_CTX *ctx, const char *s, size_t n)
{
	char win[64];

	put_len(ctx, n);
	while (n > 0) {
		size_t k = n < sizeof win ? n : sizeof win;
		for (size_t i = 0; i < k; i++)
			win[i] = ascii_lower(s[i]);
		put_bytes(ctx, win, k);
		s += k;
		n -= k;
	}
}

static void put_marker(EVP_MD_CTX *ctx, uint8_t m)
{
	put_bytes(ctx, &m, 1);
}

/* A body read through fingerprint_ignore or fingerprint_only has markers
 * of its own, so it never hashes like a whole body. */
enum {
	FP_ABSENT = 0,
	FP_PRESENT = 1,
	FP_BODY_RAW = 2,
	FP_BODY_CANON = 3,
	FP_BODY_IGNORING = 4,
	FP_BODY_ONLY = 5,
};

/* fingerprint_only: each pointer's value, canonical, or its absence. */
static void put_only(EVP_MD_CTX *ctx, const fp_input *in, json_t *doc)
{
	growbuf v = {0};
	put_marker(ctx, FP_BODY_ONLY);
	put_len(ctx, in->n_only);
	for (size_t i = 0; i < in->n_only; i++) {
		json_t *x = jsonptr_get(in->only[i], doc);
		growbuf_reset(&v);
		if (x == NULL || canon_dump(x, &v) < 0) {
			put_marker(ctx, FP_ABSENT);
			continue;
		}
		put_marker(ctx, FP_PRESENT);
		put_field(ctx, v.data, v.len);
	}
	growbuf_free(&v);
}

/* The number check of canon_load looks at the whole text; here only the
 * values that count may make a body hash whole. An ignored value is
 * blanked out of a copy of the text (its first byte a 0, the rest spaces:
 * the document keeps its shape), so an ignored timestamp with 16 digits
 * does not make a retry a mismatch. Spans inside an earlier one are
 * skipped (their ancestor is blanked already). */
static char *blank_ignored(const fp_input *in, const char *body, size_t len)
{
	char *copy = xmalloc(len + 1);
	memcpy(copy, body, len);
	copy[len] = '\0';
	size_t *start = xcalloc(in->n_ignore + 1, sizeof *start);
	size_t *end = xcalloc(in->n_ignore + 1, sizeof *end);
	size_t k = 0;
	for (size_t i = 0; i < in->n_ignore; i++) {
		const char *v;
		size_t n;
		if (in->ignore[i]->n == 0 ||
		    jsonptr_locate(in->ignore[i], body, len, &v, &n) !=
			    JSONPTR_FOUND || n == 0)
			continue;
		start[k] = (size_t)(v - body);
		end[k++] = (size_t)(v - body) + n;
	}
	for (size_t i = 0; i < k; i++) {
		bool inside = false;
		for (size_t j = 0; j < k; j++)
			inside = inside ||
				 (j != i && start[j] <= start[i] &&
				  end[i] <= end[j] &&
				  (start[j] < start[i] || end[i] < end[j] ||
				   j < i));
		if (inside)
			continue;
		copy[start[i]] = '0';
		memset(copy + start[i] + 1, ' ', end[i] - start[i] - 1);
	}
	free(start);
	free(end);
	return copy;
}

/* fingerprint_only: a selected value with an inexact number is not read. */
static bool only_exact(const fp_input *in, const char *body, size_t len)
{
	for (size_t i = 0; i < in->n_only; i++) {
		const char *v;
		size_t n;
		if (jsonptr_locate(in->only[i], body, len, &v, &n) ==
			    JSONPTR_FOUND &&
		    !numbers_are_exact(v, n))
			return false;
	}
	return true;
}

/* A JSON body seen through the route's ignore or only list. False when
 * the body does not canonicalise: it is then hashed whole. */
static bool put_selected(EVP_MD_CTX *ctx, const fp_input *in,
			 const char *body, size_t len)
{
	json_error_t jerr;
	json_t *doc = json_loadb(body, len, FP_LOAD_FLAGS, &jerr);
	if (doc == NULL)
		return false;
	if (in->n_only) {
		bool ok = only_exact(in, body, len);
		if (ok)
			put_only(ctx, in, doc);
		json_decref(doc);
		return ok;
	}
	json_decref(doc);
	char *copy = blank_ignored(in, body, len);
	doc = numbers_are_exact(copy, len) ? json_loadb(copy, len,
							 FP_LOAD_FLAGS, &jerr)
					   : NULL;
	free(copy);
	if (doc == NULL)
		return false;
	growbuf canon = {0};
	jsonptr_remove_all(in->ignore, in->n_ignore, doc);
	bool ok = canon_dump(doc, &canon) == 0;
	if (ok) {
		put_marker(ctx, FP_BODY_IGNORING);
		put_field(ctx, canon.data, canon.len);
	}
	growbuf_free(&canon);
	json_decref(doc);
	return ok;
}

static void put_body(EVP_MD_CTX *ctx, const fp_input *in, bool json)
{
	const char *body = in->body ? in->body : "";
	size_t len = in->body ? in->body_len : 0;

	if (json && (in->n_ignore || in->n_only) &&
	    put_selected(ctx, in, body, len))
		return;
	if (json) {
		growbuf canon = { 0 };
		if (fp_canon_json(body, len, &canon) == 0) {
			put_marker(ctx, FP_BODY_CANON);
			put_field(ctx, canon.data, canon.len);
			growbuf_free(&canon);
			return;
		}
		growbuf_free(&canon);
	}
	put_marker(ctx, FP_BODY_RAW);
	put_field(ctx, body, len);
}

/* What fp_compute and fp_compute_raw hash before the body. */
static void put_head(EVP_MD_CTX *ctx, const fp_input *in, const char **mt,
		     size_t *mtlen)
{
	ALWAYS_ASSERT(EVP_DigestInit_ex2(ctx, sha256, NULL) == 1);
	put_str(ctx, FP_VERSION_TAG);
	put_str(ctx, in->method);
	put_str(ctx, in->route);
	put_str(ctx, in->raw_target);
	media_type_span(in->content_type, mt, mtlen);
	put_lower(ctx, *mt, *mtlen);
	put_len(ctx, in->n_headers);
	for (size_t i = 0; i < in->n_headers; i++) {
		const char *name = in->header_names ? in->header_names[i] : NULL;
		const char *value =
			in->header_values ? in->header_values[i] : NULL;
		put_lower(ctx, name ? name : "", name ? strlen(name) : 0);
		if (value == NULL) {
			put_marker(ctx, FP_ABSENT);
		} else {
			put_marker(ctx, FP_PRESENT);
			put_str(ctx, value);
		}
	}
}

static void put_end(EVP_MD_CTX *ctx, uint8_t out[FP_LEN])
{
	unsigned int outlen = 0;
	ALWAYS_ASSERT(EVP_DigestFinal_ex(ctx, out, &outlen) == 1);
	ALWAYS_ASSERT(outlen == FP_LEN);
}

void fp_compute(const fp_input *in, uint8_t out[FP_LEN])
{
	EVP_MD_CTX *ctx = thread_ctx();
	const char *mt;
	size_t mtlen;
	put_head(ctx, in, &mt, &mtlen);
	put_body(ctx, in, is_json_span(mt, mtlen));
	put_end(ctx, out);
}

/* fp_raw_form's fields: a length (8 bytes, big-endian), then the bytes. */
static void raw_len(growbuf *out, uint64_t n)
{
	uint8_t be[8];
	for (int i = 7; i >= 0; i--) {
		be[i] = (uint8_t)(n & 0xff);
		n >>= 8;
	}
	growbuf_append(out, be, sizeof be);
}

static void raw_str(growbuf *out, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	raw_len(out, n);
	growbuf_append(out, s ? s : "", n);
}

/* A NULL string apart from an empty one. */
static void raw_opt(growbuf *out, const char *s)
{
	uint8_t m = s ? FP_PRESENT : FP_ABSENT;
	growbuf_append(out, &m, 1);
	raw_str(out, s);
}

static void raw_pointers(growbuf *out, jsonptr *const *p, size_t n)
{
	raw_len(out, n);
	for (size_t i = 0; i < n; i++)
		raw_str(out, p[i]->text);
}

bool fp_raw_form(const fp_input *in, size_t max, growbuf *out)
{
	growbuf_reset(out);
	size_t body_len = in->body ? in->body_len : 0;
	if (body_len > max)
		return false;
	raw_str(out, in->method);
	raw_str(out, in->route);
	raw_str(out, in->raw_target);
	raw_opt(out, in->content_type);
	raw_len(out, in->n_headers);
	for (size_t i = 0; i < in->n_headers; i++) {
		raw_str(out, in->header_names ? in->header_names[i] : NULL);
		raw_opt(out, in->header_values ? in->header_values[i] : NULL);
	}
	raw_pointers(out, in->ignore, in->n_ignore);
	raw_pointers(out, in->only, in->n_only);
	raw_len(out, body_len);
	growbuf_append(out, in->body ? in->body : "", body_len);
	return out->len <= max;
}
