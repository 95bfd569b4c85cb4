/* Fuzz target for canonical JSON and the fingerprint (SPEC 3.2 step 3).
 *
 * fp_canon_json must be idempotent: canonicalising its own output gives the
 * same bytes, or two retries of one payload could hash differently depending
 * on how the client spelled it. It appends on success and leaves the buffer
 * as it was on failure. fp_compute must never crash, must be deterministic,
 * must treat a JSON body and its canonical form as one payload, and must
 * hash a body of any other media type raw. The input is also fed to the
 * media-type helpers as a Content-Type value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"

#define PREFIX "prefix:"

static const char *const content_types[] = {
	"application/json",
	"Application/Problem+JSON; charset=utf-8",
	"text/plain",
	NULL,
};
#define N_TYPES (sizeof content_types / sizeof content_types[0])

static void fingerprint(const char *ct, const char *body, size_t len,
			const char *header, uint8_t out[FP_LEN])
{
	static const char *const names[] = { "X-Amount", "X-Absent" };
	const char *values[] = { header, NULL };
	fp_input in = {
		.method = "POST",
		.route = "create_payment",
		.raw_target = "/v1/payments?x=1",
		.content_type = ct,
		.n_headers = 2,
		.header_names = names,
		.header_values = values,
		.body = body,
		.body_len = len,
	};
	fp_compute(&in, out);
}

/* Returns the canonical form (owned by the caller) or NULL. */
static char *canon(const char *in, size_t len, size_t *out_len)
{
	growbuf b = { 0 };

	growbuf_puts(&b, PREFIX);
	int rc = fp_canon_json(in, len, &b);
	ALWAYS_ASSERT(rc == 0 || rc == -1);
	ALWAYS_ASSERT(b.len >= sizeof PREFIX - 1);
	ALWAYS_ASSERT(memcmp(b.data, PREFIX, sizeof PREFIX - 1) == 0);
	if (rc < 0) {
		ALWAYS_ASSERT(b.len == sizeof PREFIX - 1);
		ALWAYS_ASSERT(b.data[b.len] == '\0');
		growbuf_free(&b);
		return NULL;
	}
	*out_len = b.len - (sizeof PREFIX - 1);
	char *c = xmalloc(*out_len ? *out_len : 1);
	memcpy(c, b.data + sizeof PREFIX - 1, *out_len);
	growbuf_free(&b);
	return c;
}

static void check_canon_idempotent(const char *c, size_t n)
{
	size_t n2 = 0;
	char *c2 = canon(c, n, &n2);

	ALWAYS_ASSERT(c2 != NULL);
	ALWAYS_ASSERT(n2 == n && memcmp(c2, c, n) == 0);
	free(c2);
}

static void check_fingerprints(const char *body, size_t len, const char *hdr,
			       const char *c, size_t cn)
{
	uint8_t a[FP_LEN], b[FP_LEN];

	for (size_t i = 0; i < N_TYPES; i++) {
		const char *ct = content_types[i];
		fingerprint(ct, body, len, hdr, a);
		fingerprint(ct, body, len, hdr, b);
		ALWAYS_ASSERT(memcmp(a, b, FP_LEN) == 0);
		if (c == NULL)
			continue;
		char mt[64];
		fp_media_type(ct, mt, sizeof mt);
		bool json = fp_is_json_media_type(mt);
		fingerprint(ct, c, cn, hdr, b);
		if (json)
			ALWAYS_ASSERT(memcmp(a, b, FP_LEN) == 0);
		else if (cn != len || memcmp(c, body, len) != 0)
			ALWAYS_ASSERT(memcmp(a, b, FP_LEN) != 0);
	}
}

static void check_media_type(const char *s)
{
	char mt[16];

	memset(mt, 'Z', sizeof mt);
	fp_media_type(s, mt, sizeof mt);
	size_t n = strnlen(mt, sizeof mt);
	ALWAYS_ASSERT(n < sizeof mt);
	for (size_t i = 0; i < n; i++)
		ALWAYS_ASSERT(!(mt[i] >= 'A' && mt[i] <= 'Z'));
	(void)fp_is_json_media_type(mt);
	(void)fp_is_json_media_type(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *in = xmalloc(size ? size : 1);
	char *str = xmalloc(size + 1); /* the input as a C string */
	size_t cn = 0;

	memcpy(in, data, size);
	memcpy(str, data, size);
	str[size] = '\0';

	char *c = canon(in, size, &cn);
	if (c)
		check_canon_idempotent(c, cn);
	check_fingerprints(in, size, str, c, cn);
	check_media_type(str);

	free(c);
	free(str);
	free(in);
	return 0;
}
