/* Sealing stored responses. The key file is parsed here rather than by
 * libconfig: libconfig copies every string into its own heap and frees it
 * without wiping, which would leave key material in freed memory; and a
 * one-line-per-key format is what `openssl rand -base64 32` and `>>` make,
 * so a rotation is one appended line and one edited line. */
#include "seal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEAL_MAGIC 0x00
#define SEAL_VERSION 0x01
#define SEAL_NONCE_LEN 12
#define SEAL_TAG_LEN 16
#define SEAL_FILE_MAX (64 * 1024)
#define SEAL_AD_LABEL "idemproxy/seal/1"

typedef struct seal_key {
	char id[SEAL_ID_MAX + 1];
	uint8_t key[SEAL_KEY_LEN];
} seal_key;

struct seal_keyring {
	seal_key keys[SEAL_MAX_KEYS];
	size_t n;
	size_t active;
	EVP_CIPHER *cipher; /* fetched once; shared by threads */
};

/* ---- the key file ---------------------------------------------------- */

__attribute__((format(printf, 6, 7))) static seal_keyring *
kr_fail(seal_keyring *k, const char *file, unsigned line, char *err,
	size_t errlen, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (line)
		snprintf(err, errlen, "%s:%u: %s", file, line, msg);
	else
		snprintf(err, errlen, "%s: %s", file, msg);
	seal_keyring_free(k);
	return NULL;
}

static bool is_id_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static bool valid_id(const char *s, size_t n)
{
	if (n == 0 || n > SEAL_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!is_id_char(s[i]))
			return false;
	return true;
}

static int b64_val(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/* Strict standard base64 of exactly SEAL_KEY_LEN bytes (44 characters,
 * one '=' of padding). */
static int b64_key(const char *s, size_t n, uint8_t out[SEAL_KEY_LEN])
{
	if (n != 44 || s[43] != '=')
		return -1;
	uint32_t acc = 0;
	int bits = 0;
	size_t o = 0;
	for (size_t i = 0; i < 43; i++) {
		int v = b64_val(s[i]);
		if (v < 0)
			return -1;
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (o < SEAL_KEY_LEN)
				out[o] = (uint8_t)(acc >> bits);
			o++;
		}
	}
	/* 43 characters carry 258 bits: the last 2 must be zero. */
	bool ok = o == SEAL_KEY_LEN && (acc & ((1u << bits) - 1)) == 0;
	acc = 0;
	return ok ? 0 : -1;
}

static const char *skip_ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	return p;
}

static const char *word_end(const char *p, const char *e)
{
	while (p < e && *p != ' ' && *p != '\t' && *p != '=')
		p++;
	return p;
}

static int find_id(const seal_keyring *k, const char *id, size_t n)
{
	for (size_t i = 0; i < k->n; i++)
		if (strlen(k->keys[i].id) == n && !memcmp(k->keys[i].id, id, n))
			return (int)i;
	return -1;
}

typedef struct kr_parse {
	seal_keyring *k;
	const char *file;
	char *err;
	size_t errlen;
	char active[SEAL_ID_MAX + 1];
	unsigned active_line;
} kr_parse;

/* "active = ID" (p..e without the line end). */
static int parse_active(kr_parse *x, unsigned line, const char *p,
			const char *e)
{
	p = skip_ws(p, e);
	if (p == e || *p != '=') {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"expected \"active = ID\"");
		return -1;
	}
	p = skip_ws(p + 1, e);
	const char *ie = word_end(p, e);
	if (!valid_id(p, (size_t)(ie - p)) || skip_ws(ie, e) != e) {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"active: a key id is 1..%d characters of A-Z a-z 0-9 "
			"_ . -",
			SEAL_ID_MAX);
		return -1;
	}
	if (x->active_line) {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"a second \"active\" line (the first is line %u)",
			x->active_line);
		return -1;
	}
	memcpy(x->active, p, (size_t)(ie - p));
	x->active[ie - p] = '\0';
	x->active_line = line;
	return 0;
}

/* "ID BASE64KEY". */
static int parse_key(kr_parse *x, unsigned line, const char *p,
		     const char *ie, const char *e)
{
	size_t idn = (size_t)(ie - p);
	if (!valid_id(p, idn)) {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"a key id is 1..%d characters of A-Z a-z 0-9 _ . -",
			SEAL_ID_MAX);
		return -1;
	}
	seal_keyring *k = x->k;
	char id[SEAL_ID_MAX + 1];
	memcpy(id, p, idn);
	id[idn] = '\0';
	if (find_id(k, p, idn) >= 0) {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"key \"%s\" is listed twice", id);
		return -1;
	}
	if (k->n == SEAL_MAX_KEYS) {
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"more than %d keys", SEAL_MAX_KEYS);
		return -1;
	}
	const char *kp = skip_ws(ie, e);
	const char *ke = kp;
	while (ke < e && *ke != ' ' && *ke != '\t')
		ke++;
	seal_key *dst = &k->keys[k->n];
	if (kp == ie || skip_ws(ke, e) != e ||
	    b64_key(kp, (size_t)(ke - kp), dst->key) < 0) {
		OPENSSL_cleanse(dst->key, sizeof dst->key);
		kr_fail(NULL, x->file, line, x->err, x->errlen,
			"key \"%s\": expected a 256-bit key in base64 (44 "
			"characters, e.g. from `openssl rand -base64 32`)",
			id);
		return -1;
	}
	memcpy(dst->id, id, idn + 1);
	k->n++;
	return 0;
}

static int parse_line(kr_parse *x, unsigned line, const char *p,
		      const char *e)
{
	if (e > p && e[-1] == '\r')
		e--;
	p = skip_ws(p, e);
	if (p == e || *p == '#')
		return 0;
	const char *ie = word_end(p, e);
	if ((size_t)(ie - p) == 6 && !memcmp(p, "active", 6))
		return parse_active(x, line, ie, e);
	return parse_key(x, line, p, ie, e);
}

seal_keyring *seal_keyring_parse(const char *text, size_t len,
				 const char *file, char *err, size_t errlen)
{
	seal_keyring *k = xcalloc(1, sizeof *k);
	kr_parse x = {.k = k, .file = file, .err = err, .errlen = errlen};
	const char *p = text, *end = text + len;
	unsigned line = 0;
	while (p < end) {
		line++;
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end;
		if (memchr(p, '\0', (size_t)(e - p)))
			return kr_fail(k, file, line, err, errlen,
				       "a NUL byte");
		if (parse_line(&x, line, p, e) < 0) {
			seal_keyring_free(k);
			return NULL;
		}
		p = nl ? nl + 1 : end;
	}
	if (k->n == 0)
		return kr_fail(k, file, 0, err, errlen,
			       "no keys (add a line \"ID BASE64KEY\")");
	if (!x.active_line)
		return kr_fail(k, file, 0, err, errlen,
			       "no \"active = ID\" line naming the key that "
			       "seals new records");
	int a = find_id(k, x.active, strlen(x.active));
	if (a < 0)
		return kr_fail(k, file, x.active_line, err, errlen,
			       "active key \"%s\" is not listed", x.active);
	k->active = (size_t)a;
	k->cipher = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
	ALWAYS_ASSERT(k->cipher);
	return k;
}

seal_keyring *seal_keyring_load(const char *file, char *err, size_t errlen)
{
	/* O_NONBLOCK: a FIFO named here must not hang a reload. */
	int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return kr_fail(NULL, file, 0, err, errlen, "cannot read: %s",
			       strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return kr_fail(NULL, file, 0, err, errlen,
			       "not a regular file");
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		close(fd);
		return kr_fail(NULL, file, 0, err, errlen,
			       "key file is accessible by group or others "
			       "(mode %04o); run chmod 600 on it",
			       (unsigned)(st.st_mode & 07777));
	}
	if (st.st_size > SEAL_FILE_MAX) {
		close(fd);
		return kr_fail(NULL, file, 0, err, errlen,
			       "larger than %d bytes", SEAL_FILE_MAX);
	}
	char *buf = xmalloc(SEAL_FILE_MAX + 1);
	size_t n = 0;
	for (;;) {
		ssize_t r = read(fd, buf + n, SEAL_FILE_MAX + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0 || (n += (size_t)r) > SEAL_FILE_MAX)
			break;
	}
	close(fd);
	seal_keyring *k =
		n > SEAL_FILE_MAX
			? kr_fail(NULL, file, 0, err, errlen, "too large")
			: seal_keyring_parse(buf, n, file, err, errlen);
	OPENSSL_cleanse(buf, SEAL_FILE_MAX + 1);
	free(buf);
	return k;
}

void seal_keyring_free(seal_keyring *k)
{
	if (!k)
		return;
	EVP_CIPHER_free(k->cipher);
	OPENSSL_cleanse(k, sizeof *k);
	free(k);
}

const char *seal_keyring_active(const seal_keyring *k)
{
	return k->keys[k->active].id;
}

size_t seal_keyring_count(const seal_keyring *k)
{
	return k->n;
}

const char *seal_keyring_id(const seal_keyring *k, size_t i)
{
	return i < k->n ? k->keys[i].id : NULL;
}

bool seal_keyring_has(const seal_keyring *k, const char *id)
{
	return k && find_id(k, id, strlen(id)) >= 0;
}

/* ---- sealing --------------------------------------------------------- */

static void put_u32(growbuf *b, uint32_t v)
{
	uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16),
			(uint8_t)(v >> 8), (uint8_t)v};
	growbuf_append(b, x, 4);
}

static void put_lp(growbuf *b, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	put_u32(b, (uint32_t)n);
	growbuf_append(b, s ? s : "", n);
}

/* Every field length-prefixed, so no two scopes make the same bytes. The
 * blob's own header (version and key id) is in it too. */
static void build_ad(const seal_scope *s, enum seal_field f,
		     const uint8_t *head, size_t head_len, growbuf *ad)
{
	growbuf_reset(ad);
	growbuf_append(ad, SEAL_AD_LABEL, sizeof SEAL_AD_LABEL);
	uint8_t fb[2] = {(uint8_t)f, s->has_body ? 1 : 0};
	growbuf_append(ad, fb, 2);
	put_u32(ad, (uint32_t)s->status);
	put_lp(ad, s->tenant);
	put_lp(ad, s->operation);
	put_lp(ad, s->key);
	growbuf_append(ad, s->hash, SEAL_HASH_LEN);
	growbuf_append(ad, head, head_len);
}

bool seal_is_sealed(const char *blob, size_t len)
{
	return blob && len >= 2 && (uint8_t)blob[0] == SEAL_MAGIC;
}

/* The length of the blob's header (magic, version, id length, id), or 0. */
static size_t blob_head(const char *blob, size_t len)
{
	if (!seal_is_sealed(blob, len) || len < 3 ||
	    (uint8_t)blob[1] != SEAL_VERSION)
		return 0;
	size_t idn = (uint8_t)blob[2];
	size_t head = 3 + idn;
	if (!valid_id(blob + 3, idn) ||
	    len < head + SEAL_NONCE_LEN + SEAL_TAG_LEN)
		return 0;
	return head;
}

int seal_blob_key_id(const char *blob, size_t len, char *id)
{
	size_t head = blob_head(blob, len);
	if (!head)
		return -1;
	memcpy(id, blob + 3, head - 3);
	id[head - 3] = '\0';
	return 0;
}

void seal_seal(const seal_keyring *k, const seal_scope *s,
	       enum seal_field f, const char *pt, size_t n, growbuf *out)
{
	const seal_key *key = &k->keys[k->active];
	size_t idn = strlen(key->id);
	growbuf_reset(out);
	growbuf_reserve(out, 3 + idn + SEAL_NONCE_LEN + n + SEAL_TAG_LEN);
	uint8_t head[3] = {SEAL_MAGIC, SEAL_VERSION, (uint8_t)idn};
	growbuf_append(out, head, 3);
	growbuf_append(out, key->id, idn);
	size_t head_len = out->len;
	uint8_t nonce[SEAL_NONCE_LEN];
	ALWAYS_ASSERT(RAND_bytes(nonce, sizeof nonce) == 1);
	growbuf_append(out, nonce, sizeof nonce);

	growbuf ad = {0};
	build_ad(s, f, (const uint8_t *)out->data, head_len, &ad);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	ALWAYS_ASSERT(c);
	int len = 0;
	uint8_t *dst = (uint8_t *)out->data + out->len;
	ALWAYS_ASSERT(EVP_EncryptInit_ex2(c, k->cipher, key->key, nonce, NULL));
	ALWAYS_ASSERT(EVP_EncryptUpdate(c, NULL, &len, (const uint8_t *)ad.data,
					(int)ad.len));
	size_t done = 0;
	if (n) {
		ALWAYS_ASSERT(EVP_EncryptUpdate(c, dst, &len,
						(const uint8_t *)pt, (int)n));
		done = (size_t)len;
	}
	ALWAYS_ASSERT(EVP_EncryptFinal_ex(c, dst + done, &len));
	done += (size_t)len;
	ALWAYS_ASSERT(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG,
					  SEAL_TAG_LEN, dst + done));
	out->len += done + SEAL_TAG_LEN;
	out->data[out->len] = '\0';
	EVP_CIPHER_CTX_free(c);
	growbuf_free(&ad);
}

/* The key a blob names, into id: its index in k, or -1 with the reason
 * in err. */
static int open_key(const seal_keyring *k, enum seal_field f,
		    const char *blob, size_t n, size_t *head,
		    char id[SEAL_ID_MAX + 1], char *err, size_t errlen)
{
	*head = blob_head(blob, n);
	if (!*head) {
		snprintf(err, errlen, "malformed sealed %s",
			 f == SEAL_HEADERS ? "headers" : "body");
		return -1;
	}
	memcpy(id, blob + 3, *head - 3);
	id[*head - 3] = '\0';
	int ki = k ? find_id(k, id, *head - 3) : -1;
	if (ki < 0)
		snprintf(err, errlen,
			 "sealed under key \"%s\", which the key file does "
			 "not hold%s",
			 id, k ? "" : " (store_encryption is not configured)");
	return ki;
}

/* Decrypts and authenticates the blob after its head under key into out;
 * false when it does not authenticate (out then holds nothing). */
static bool open_blob(const uint8_t *key, const EVP_CIPHER *cipher,
		      const seal_scope *s, enum seal_field f,
		      const uint8_t *blob, size_t n, size_t head, growbuf *out)
{
	const uint8_t *nonce = blob + head;
	const uint8_t *ct = nonce + SEAL_NONCE_LEN;
	size_t ct_len = n - head - SEAL_NONCE_LEN - SEAL_TAG_LEN;
	const uint8_t *tag = ct + ct_len;

	growbuf ad = {0};
	build_ad(s, f, blob, head, &ad);
	growbuf_reserve(out, ct_len + 16);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	ALWAYS_ASSERT(c);
	int len = 0;
	uint8_t *dst = (uint8_t *)out->data;
	bool ok = EVP_DecryptInit_ex2(c, cipher, key, nonce, NULL) &&
		  EVP_DecryptUpdate(c, NULL, &len, (const uint8_t *)ad.data,
				    (int)ad.len);
	size_t done = 0;
	if (ok && ct_len) {
		ok = EVP_DecryptUpdate(c, dst, &len, ct, (int)ct_len);
		done = (size_t)len;
	}
	ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, SEAL_TAG_LEN,
				       (void *)tag);
	ok = ok && EVP_DecryptFinal_ex(c, dst + done, &len) > 0;
	EVP_CIPHER_CTX_free(c);
	growbuf_free(&ad);
	if (!ok) {
		/* Nothing of an unauthenticated plaintext is handed out. */
		OPENSSL_cleanse(out->data, ct_len);
		growbuf_reset(out);
		return false;
	}
	out->len = done + (size_t)len;
	out->data[out->len] = '\0';
	return true;
}

int seal_open(const seal_keyring *k, const seal_scope *s, enum seal_field f,
	      const char *blob, size_t n, growbuf *out, char *err,
	      size_t errlen)
{
	growbuf_reset(out);
	size_t head;
	char id[SEAL_ID_MAX + 1];
	int ki = open_key(k, f, blob, n, &head, id, err, errlen);
	if (ki < 0)
		return -1;
	if (!open_blob(k->keys[ki].key, k->cipher, s, f,
		       (const uint8_t *)blob, n, head, out)) {
		snprintf(err, errlen,
			 "sealed %s under key \"%s\" does not authenticate "
			 "(altered, or copied from another record)",
			 f == SEAL_HEADERS ? "headers" : "body", id);
		return -1;
	}
	return 0;
}
