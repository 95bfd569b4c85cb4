/* Route path templates: literal segments, "{name}" matches exactly one
 * non-empty segment, a trailing "/ *" (written without the space) matches the rest (zero or more further
 * segments: "/hooks/ *" matches "/hooks", "/hooks/", "/hooks/a/b").
 * Templates and paths are matched in their normalised form (see
 * pathtpl_normalize), without the query, case-sensitive. Pure, no I/O. */
#ifndef IDEMPROXY_PATHTPL_H
#define IDEMPROXY_PATHTPL_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

typedef struct pathtpl pathtpl;

/* Returns NULL and writes a reason into err on a malformed template (must
 * start with '/', "{}" empty or unclosed braces, '*' anywhere but a trailing
 * "/ *", characters not allowed in a path). */
pathtpl *pathtpl_compile(const char *pattern, char *err,
			 size_t errlen) MUST_CHECK;
/* The form a path is matched in: percent-encoded unreserved characters
 * (ALPHA DIGIT - . _ ~) decoded, other escapes with upper-case hex (RFC 3986
 * 6.2.2.1-2), and a trailing slash dropped ("/" stays "/"). Writes it into
 * out (len bytes are enough: it is never longer) and its length into
 * *out_len. Returns -1 and sets *why (a static reason) for a path that has
 * no single meaning: a dot segment ("." "..", also as %2e), an empty segment
 * ("//"), an encoded '/' (%2F), or a '%' without two hex digits. A path that
 * does not start with '/' is copied as it is (it matches no template). */
int pathtpl_normalize(const char *path, size_t len, char *out,
		      size_t *out_len, const char **why) MUST_CHECK;
/* path must be normalised. */
bool pathtpl_match(const pathtpl *t, const char *path, size_t len);
void pathtpl_free(pathtpl *t);

#endif
