/* Route path templates: literal segments, "{name}" matches exactly one
 * non-empty segment, a trailing "/ *" (written without the space) matches the rest (zero or more further
 * segments: "/hooks/ *" matches "/hooks", "/hooks/", "/hooks/a/b").
 * Matching is on the raw (still percent-encoded) path, without the query,
 * case-sensitive. Pure, no I/O. */
#ifndef IDEMPROXY_PATHTPL_H
#define IDEMPROXY_PATHTPL_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

typedef struct pathtpl pathtpl;

/* Returns NULL and writes a reason into err on a malformed template (must
 * start with '/', "{}" empty or unclosed braces, '*' anywhere but a trailing
 * "/ *", characters not allowed in a path). */
pathtpl *pathtpl_compile(const char *pattern, char *err, size_t errlen) IP_WUR;
bool pathtpl_match(const pathtpl *t, const char *path, size_t len);
void pathtpl_free(pathtpl *t);

#endif
