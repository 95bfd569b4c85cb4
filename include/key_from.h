/* Where a route's idempotency key comes from (`key_from`): a list of parts,
 * each a request header, a query parameter or a value in the JSON body,
 * joined into one key that no other list of values can make. Pure, no I/O. */
#ifndef IDEMPROXY_KEY_FROM_H
#define IDEMPROXY_KEY_FROM_H

#include <stdbool.h>
#include <stddef.h>

#include "key_header.h"
#include "jsonptr.h"
#include "util.h"

#define KEY_FROM_MAX_PARTS 8
/* The joined key: up to KEY_FROM_MAX_PARTS parts of at most KEY_LEN_MAX
 * characters each, with their length prefixes, fits; longer joined keys are
 * refused. */
#define KEY_FROM_KEY_MAX 1024

struct header_list;

enum key_part_source { KP_HEADER, KP_QUERY, KP_BODY };

typedef struct key_part {
	enum key_part_source source;
	char *spec;        /* as written: "header:X-Delivery-Id" */
	char *name;        /* header or query parameter name */
	jsonptr *ptr;      /* body: */
	bool is_key_header; /* the Idempotency-Key header: parsed as SPEC 3.1 */
} key_part;

typedef struct key_from_cfg {
	key_part *v;
	size_t n;
	/* Just the Idempotency-Key header: the key is the header's key as it
	 * always was, so records made before key_from existed still match. */
	bool bare;
	bool needs_body;
} key_from_cfg;

/* Parses one "header:NAME", "query:NAME" or "body:/json/pointer" into out.
 * On error writes why and returns -1. */
int key_from_parse_part(const char *spec, key_part *out, char *why,
			size_t whylen) MUST_CHECK;
/* Adds a parsed part (taking it over); refuses a duplicate or a ninth. */
int key_from_add(key_from_cfg *kp, key_part *part, char *why,
		 size_t whylen) MUST_CHECK;
void key_from_free(key_from_cfg *kp);

/* Is header name one of the parts? */
bool key_from_uses_header(const key_from_cfg *kp, const char *name);

typedef struct key_from_request {
	const struct header_list *headers;
	const char *query;       /* after '?', or NULL */
	size_t query_len;
	const char *content_type; /* raw header value or NULL */
	const char *body;
	size_t body_len;
} key_from_request;

enum key_from_result {
	KEY_FROM_OK,
	KEY_FROM_NONE,    /* not one part is present */
	KEY_FROM_MISSING, /* a part is absent, or its body is not JSON */
	KEY_FROM_INVALID, /* a part is there but cannot be a key */
};

typedef struct key_from_key {
	char key[KEY_FROM_KEY_MAX + 1];
	/* The Idempotency-Key header's key when it is a part, else "". */
	char header_key[KEY_LEN_MAX + 1];
	char detail[200];     /* why, for MISSING and INVALID */
} key_from_key;

/* The key of a request: with kp->bare the Idempotency-Key header's key,
 * otherwise each part's value as a netstring ("LEN:VALUE,") in list order,
 * so ["a", "bc"] and ["ab", "c"] are "1:a,2:bc," and "2:ab,1:c,". */
enum key_from_result key_from_key_of(const key_from_cfg *kp,
				     const key_from_request *rq,
				     key_from_key *out);

#endif
