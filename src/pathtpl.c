/* Route path templates.
 *
 * A template is compiled into a list of segments; matching walks the raw
 * path once, segment by segment, so it is linear in the path length and
 * needs no allocation. Paths are bytes, not strings: a NUL inside len is
 * just another byte.
 *
 * Dot segments ("." and "..", also percent-encoded as %2e) never match:
 * the upstream would normalise "/hooks/../v1/payments" into a path that is
 * governed by a different route, so forwarding it under the route that
 * matched textually would let a client pick its own idempotency rules.
 * Such a path matches no route and gets 404. */
#include "pathtpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct seg {
	const char *lit; /* points into pathtpl.pattern; NULL for {name} */
	size_t len;
};

struct pathtpl {
	char *pattern;
	struct seg *segs;
	size_t n;
	bool rest; /* ends in slash-star: any further segments */
};

static bool is_hex(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
	       (c >= 'A' && c <= 'F');
}

/* RFC 3986 pchar minus '*', '{' and '}', which have a meaning here. The
 * percent sign is checked separately (it must start a %HH triplet). */
static bool is_literal_char(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9'))
		return true;
	return c != '\0' && strchr("-._~!$&'()+,;=:@", c) != NULL;
}

static bool is_name_char(unsigned char c, bool first)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
		return true;
	return !first && c >= '0' && c <= '9';
}

/* "." or ".." with either dot possibly written as %2e / %2E. */
static bool is_dot_segment(const char *s, size_t len)
{
	int dots = 0;
	size_t i = 0;

	while (i < len) {
		if (s[i] == '.')
			i++;
		else if (i + 3 <= len && s[i] == '%' && s[i + 1] == '2' &&
			 (s[i + 2] == 'e' || s[i + 2] == 'E'))
			i += 3;
		else
			return false;
		if (++dots > 2)
			return false;
	}
	return dots > 0;
}

static int check_param(const char *s, size_t len, char *err, size_t errlen)
{
	const char *close = memchr(s, '}', len);

	if (close == NULL) {
		snprintf(err, errlen, "unclosed '{' in path");
		return -1;
	}
	if (close != s + len - 1) {
		snprintf(err, errlen, "'{name}' must be a whole path segment");
		return -1;
	}
	if (len == 2) {
		snprintf(err, errlen, "empty '{}' in path");
		return -1;
	}
	for (size_t i = 1; i < len - 1; i++) {
		if (!is_name_char((unsigned char)s[i], i == 1)) {
			snprintf(err, errlen,
				 "a '{name}' may contain only letters, digits "
				 "and '_', and not start with a digit");
			return -1;
		}
	}
	return 0;
}

static int check_literal(const char *s, size_t len, char *err, size_t errlen)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '%') {
			if (i + 2 >= len || !is_hex((unsigned char)s[i + 1]) ||
			    !is_hex((unsigned char)s[i + 2])) {
				snprintf(err, errlen,
					 "'%%' in path must be followed by two "
					 "hex digits");
				return -1;
			}
			i += 2;
			continue;
		}
		if (c == '*') {
			snprintf(err, errlen,
				 "'*' is only allowed as a trailing \"/*\"");
			return -1;
		}
		if (c == '{' || c == '}') {
			snprintf(err, errlen,
				 "'{name}' must be a whole path segment");
			return -1;
		}
		if (!is_literal_char(c)) {
			if (c >= 0x21 && c <= 0x7e)
				snprintf(err, errlen,
					 "character '%c' is not allowed in a "
					 "path",
					 c);
			else
				snprintf(err, errlen,
					 "byte 0x%02x is not allowed in a path",
					 c);
			return -1;
		}
	}
	if (is_dot_segment(s, len)) {
		snprintf(err, errlen, "'.' and '..' segments are not allowed");
		return -1;
	}
	return 0;
}

/* Validates one segment [s, s+len) that is followed by another segment
 * when more is true, and records it in t (when t is not NULL). */
static int add_segment(pathtpl *t, const char *s, size_t len, bool more,
		       char *err, size_t errlen)
{
	if (len == 1 && s[0] == '*') {
		if (more) {
			snprintf(err, errlen,
				 "'*' is only allowed as a trailing \"/*\"");
			return -1;
		}
		if (t)
			t->rest = true;
		return 0;
	}
	if (len == 0 && more) {
		snprintf(err, errlen, "empty segment (\"//\") in path");
		return -1;
	}
	if (len > 0 && s[0] == '{') {
		if (check_param(s, len, err, errlen) < 0)
			return -1;
		if (t)
			t->segs[t->n++] = (struct seg){ NULL, 0 };
		return 0;
	}
	if (check_literal(s, len, err, errlen) < 0)
		return -1;
	if (t)
		t->segs[t->n++] = (struct seg){ s, len };
	return 0;
}

pathtpl *pathtpl_compile(const char *pattern, char *err, size_t errlen)
{
	size_t plen;
	pathtpl *t;

	if (pattern == NULL || pattern[0] != '/') {
		snprintf(err, errlen, "path must start with '/'");
		return NULL;
	}
	plen = strlen(pattern);
	t = xcalloc(1, sizeof *t);
	t->pattern = xstrndup(pattern, plen);
	/* One segment per '/', which is an upper bound. */
	size_t slashes = 0;
	for (size_t i = 0; i < plen; i++)
		slashes += pattern[i] == '/';
	t->segs = xcalloc(slashes, sizeof *t->segs);

	const char *p = t->pattern + 1;
	const char *end = t->pattern + plen;
	for (;;) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		const char *seg_end = slash ? slash : end;
		if (add_segment(t, p, (size_t)(seg_end - p), slash != NULL, err,
				errlen) < 0) {
			pathtpl_free(t);
			return NULL;
		}
		if (!slash)
			break;
		p = slash + 1;
	}
	return t;
}

static bool seg_matches(const struct seg *sg, const char *s, size_t len)
{
	if (is_dot_segment(s, len))
		return false;
	if (sg->lit == NULL)
		return len > 0;
	return len == sg->len && memcmp(s, sg->lit, len) == 0;
}

static bool rest_is_clean(const char *p, const char *end)
{
	for (;;) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		const char *seg_end = slash ? slash : end;
		if (is_dot_segment(p, (size_t)(seg_end - p)))
			return false;
		if (!slash)
			return true;
		p = slash + 1;
	}
}

bool pathtpl_match(const pathtpl *t, const char *path, size_t len)
{
	if (t == NULL || path == NULL || len == 0 || path[0] != '/')
		return false;

	const char *p = path + 1;
	const char *end = path + len;
	for (size_t i = 0; i < t->n; i++) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		const char *seg_end = slash ? slash : end;
		if (!seg_matches(&t->segs[i], p, (size_t)(seg_end - p)))
			return false;
		if (!slash)
			/* The path ended: a match if the template did too, or
			 * if what is left of it is the optional rest. */
			return i + 1 == t->n;
		p = slash + 1;
	}
	/* Template consumed and the path goes on past another '/' (or the
	 * template is a bare slash-star with no segments at all). */
	if (!t->rest)
		return false;
	return rest_is_clean(p, end);
}

void pathtpl_free(pathtpl *t)
{
	if (t == NULL)
		return;
	free(t->segs);
	free(t->pattern);
	free(t);
}
