/* Parsing of the Idempotency-Key header value (SPEC 3.1). Pure, no I/O. */
#ifndef IDEMPROXY_KEY_HEADER_H
#define IDEMPROXY_KEY_HEADER_H

#include <stddef.h>

#include "util.h"

#define KEY_LEN_MAX 255

/* Parses one header value. Accepted: an RFC 9651 sf-string ("...", with \"
 * and \\ escapes, optional ;parameters after it which are ignored), or a bare
 * token of visible ASCII 0x21-0x7E without '"' ',' ';' '\'. Optional
 * surrounding SP/HTAB (OWS) is ignored. Both forms name the same key:
 * "abc" and abc are equal. On success writes the unquoted key (NUL-terminated)
 * into out, its length into *out_len, returns 0. On failure returns -1 and
 * sets *why to a static human-readable reason. */
int key_header_parse(const char *value, size_t len, char out[KEY_LEN_MAX + 1],
		     size_t *out_len, const char **why) MUST_CHECK;

#endif
