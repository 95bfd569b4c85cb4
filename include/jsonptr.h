/* JSON pointers (RFC 6901): parsed once from the conf file, then evaluated
 * against a parsed document (jansson) or located in the raw text of one, so
 * that a number can be read by its exact text. Pure, no I/O. */
#ifndef IDEMPROXY_JSONPTR_H
#define IDEMPROXY_JSONPTR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "util.h"

/* More reference tokens than this are refused: nothing real nests deeper,
 * and it keeps a hostile conf file from costing anything. */
#define JSONPTR_MAX_TOKENS 64
#define JSONPTR_MAX_LEN 1024

typedef struct jsonptr {
	char *text;   /* as written */
	char **tok;   /* the reference tokens, ~0 and ~1 decoded */
	size_t n;
} jsonptr;

/* Parses "" (the whole document) or "/a/b~1c". On error returns NULL and
 * writes why (no NUL bytes, '/' first, '~' only as ~0 or ~1, bounds). */
jsonptr *jsonptr_parse(const char *s, size_t len, char *why,
		       size_t whylen) MUST_CHECK;
void jsonptr_free(jsonptr *p);

/* The value p names in doc (borrowed), or NULL. An array is indexed only by
 * 0 or a decimal without leading zeros; "-" names nothing. */
json_t *jsonptr_get(const jsonptr *p, json_t *doc);

/* Removes from doc every value one of ps names, each pointer read against
 * doc as it was before any removal (so "/a/0" and "/a/1" remove the first
 * two elements, not the first and the third). Pointers naming nothing, and
 * "" (which names doc itself), are ignored. */
void jsonptr_remove_all(jsonptr *const *ps, size_t n, json_t *doc);

enum jsonptr_found { JSONPTR_FOUND, JSONPTR_ABSENT, JSONPTR_MALFORMED };

/* Locates the value p names in the text of a JSON document, which should
 * already have been validated (duplicate member names refused: the first
 * one is taken here). On JSONPTR_FOUND sets *start and *vlen to the value's
 * text, without surrounding whitespace. Never reads outside text[0..len),
 * whatever the input. */
enum jsonptr_found jsonptr_locate(const jsonptr *p, const char *text,
				  size_t len, const char **start,
				  size_t *vlen);

/* Decodes the JSON string literal s[0..len) (quotes included) into out as
 * UTF-8. Returns 0, or -1 when it is not one well-formed literal or decodes
 * to a NUL. */
int jsonptr_string_value(const char *s, size_t len, growbuf *out) MUST_CHECK;

#endif
