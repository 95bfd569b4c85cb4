/* The request fingerprint (SPEC 3.2 step 3) and canonical JSON. Pure. */
#ifndef IDEMPROXY_FINGERPRINT_H
#define IDEMPROXY_FINGERPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jsonptr.h"
#include "util.h"

#define FP_LEN 32

/* Canonical form of a JSON text: object keys sorted (by UTF-8 bytes),
 * insignificant whitespace removed, duplicate keys rejected. Appends to out
 * and returns 0, or returns -1 (out untouched) if the text is not valid JSON
 * or nests deeper than the parser allows. Never recurses without bound. */
int fp_canon_json(const char *in, size_t len, growbuf *out) MUST_CHECK;

/* "application/json; charset=utf-8" -> "application/json" (lower-cased,
 * parameters and whitespace removed) into out (size outlen). */
void fp_media_type(const char *content_type, char *out, size_t outlen);

/* True for application/json and any type/subtype+json. */
bool fp_is_json_media_type(const char *media_type);

typedef struct fp_input {
	const char *method;
	const char *route;       /* route name (the operation) */
	const char *raw_target;  /* raw path and query as received */
	const char *content_type; /* raw header value or NULL */
	size_t n_headers;        /* fingerprint_headers, in configured order */
	const char *const *header_names;
	const char *const *header_values; /* NULL entry = header absent */
	const char *body;
	size_t body_len;
	/* fingerprint_ignore: values left out of a JSON body; or
	 * fingerprint_only: the values that make the payload, in this order.
	 * At most one of the two is non-empty. */
	jsonptr *const *ignore;
	size_t n_ignore;
	jsonptr *const *only;
	size_t n_only;
} fp_input;

/* SHA-256 over an unambiguous (length-prefixed) encoding of the fields;
 * JSON bodies are canonicalised first, and hashed raw if they fail to parse
 * (then ignore and only do not apply: the whole body counts). Thread-safe. */
void fp_compute(const fp_input *in, uint8_t out[FP_LEN]);

/* The fields fp_compute hashes, as sent (the body not canonicalised, the
 * content type whole, the ignore and only pointers as written),
 * length-prefixed into out: two inputs with the same raw form have the same
 * fingerprint, which a byte comparison tells without parsing the body. Not
 * the other way round: another spelling of the same JSON has another raw
 * form. False (out not usable) when it would exceed max bytes. */
bool fp_raw_form(const fp_input *in, size_t max, growbuf *out);

#endif
