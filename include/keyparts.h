/* Where a route's idempotency key comes from (`key_from`): a list of parts,
 * each a request header, a query parameter or a value in the JSON body,
 * joined into one key that no other list of values can make. Pure, no I/O. */
#ifndef IDEMPROXY_KEYPARTS_H
#define IDEMPROXY_KEYPARTS_H

#include <stdbool.h>
#include <stddef.h>

#include "idkey.h"
#include "jsonptr.h"
#include "util.h"

#define KEYPARTS_MAX 8
/* The joined key: up to KEYPARTS_MAX parts of at most IDKEY_MAX characters
 * each, with their length prefixes, fits; longer joined keys are refused. */
#define KEYPARTS_KEY_MAX 1024

struct header_list;

enum keypart_source { KP_HEADER, KP_QUERY, KP_BODY };

typedef struct keypart {
	enum keypart_source source;
	char *spec;        /* as written: "header:X-Delivery-Id" */
	char *name;        /* header or query parameter name */
	jsonptr *ptr;      /* body: */
	bool idkey;        /* the Idempotency-Key header: parsed as SPEC 3.1 */
} keypart;

typedef struct keyparts {
	keypart *v;
	size_t n;
	/* Just the Idempotency-Key header: the key is the header's key as it
	 * always was, so records made before key_from existed still match. */
	bool bare;
	bool needs_body;
} keyparts;

/* Parses one "header:NAME", "query:NAME" or "body:/json/pointer" into out.
 * On error writes why and returns -1. */
int keyparts_parse_part(const char *spec, keypart *out, char *why,
			size_t whylen) MUST_CHECK;
/* Adds a parsed part (taking it over); refuses a duplicate or a ninth. */
int keyparts_add(keyparts *kp, keypart *part, char *why,
		 size_t whylen) MUST_CHECK;
void keyparts_free(keyparts *kp);

/* Is header name one of the parts? */
bool keyparts_uses_header(const keyparts *kp, const char *name);

typedef struct keyparts_request {
	const struct header_list *headers;
	const char *query;       /* after '?', or NULL */
	size_t query_len;
	const char *content_type; /* raw header value or NULL */
	const char *body;
	size_t body_len;
} keyparts_request;

enum keyparts_result {
	KEYPARTS_OK,
	KEYPARTS_NONE,    /* not one part is present */
	KEYPARTS_MISSING, /* a part is absent, or its body is not JSON */
	KEYPARTS_INVALID, /* a part is there but cannot be a key */
};

typedef struct keyparts_key {
	char key[KEYPARTS_KEY_MAX + 1];
	/* The Idempotency-Key header's key when it is a part, else "". */
	char idkey[IDKEY_MAX + 1];
	char detail[200];     /* why, for MISSING and INVALID */
} keyparts_key;

/* The key of a request: with kp->bare the Idempotency-Key header's key,
 * otherwise each part's value as a netstring ("LEN:VALUE,") in list order,
 * so ["a", "bc"] and ["ab", "c"] are "1:a,2:bc," and "2:ab,1:c,". */
enum keyparts_result keyparts_key_of(const keyparts *kp,
				     const keyparts_request *rq,
				     keyparts_key *out);

#endif
