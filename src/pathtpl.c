/* Route path templates.
 *
 * A template is compiled into a list of segments; matching walks the
 * normalised path once, segment by segment, so it is linear in the path
 * length and needs no allocation. Paths are bytes, not strings: a NUL
 * inside len is just another byte.
 *
 * Matching is on the normalised path (pathtpl_normalize), so that every
 * spelling the upstream may read as one path is governed by one route:
 * percent-encoded unreserved characters are decoded and other escapes get
 * upper-case hex (RFC 3986 6.2.2.1-2), a trailing slash is dropped. What
 * cannot be given one meaning is refused instead: dot segments ("." and
 * "..", also written %2e), which the upstream may resolve into a path
 * governed by another route; empty segments ("//"), which some servers
 * merge; an encoded '/' (%2F), which servers that decode before routing
 * read as a separator; and a '%' not followed by two hex digits. */
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

static bool is_unreserved(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
	       c == '~';
}

static int hex_value(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return c - 'A' + 10;
}

static const char WHY_PCT[] =
	"a '%' in the path must be followed by two hex digits";
static const char WHY_SLASH[] =
	"an encoded '/' (%2F) in the path is ambiguous";
static const char WHY_DOT[] = "'.' and '..' segments are not allowed";
static const char WHY_EMPTY[] = "empty segment (\"//\") in path";

/* Ends the segment out[seg..*o): refuses dot segments, and an empty one
 * unless it is the last (a trailing slash, dropped unless it is all). */
static int end_segment(char *out, size_t seg, size_t *o, bool last,
		       const char **why)
{
	size_t n = *o - seg;
	if (n == 0) {
		if (!last) {
			*why = WHY_EMPTY;
			return -1;
		}
		if (*o > 1)
			(*o)--;
		return 0;
	}
	if ((n == 1 && out[seg] == '.') ||
	    (n == 2 && out[seg] == '.' && out[seg + 1] == '.')) {
		*why = WHY_DOT;
		return -1;
	}
	if (!last)
		out[(*o)++] = '/';
	return 0;
}

int pathtpl_normalize(const char *path, size_t len, char *out,
		      size_t *out_len, const char **why)
{
	static const char hex[] = "0123456789ABCDEF";
	const char *dummy;

	if (why == NULL)
		why = &dummy;
	if (len == 0 || path[0] != '/') {
		memcpy(out, path, len);
		*out_len = len;
		return 0;
	}
	size_t o = 0, seg = 1;
	out[o++] = '/';
	for (size_t i = 1;; i++) {
		if (i == len || path[i] == '/') {
			if (end_segment(out, seg, &o, i == len, why) < 0)
				return -1;
			if (i == len)
				break;
			seg = o;
			continue;
		}
		unsigned char c = (unsigned char)path[i];
		if (c != '%') {
			out[o++] = (char)c;
			continue;
		}
		if (i + 2 >= len || !is_hex((unsigned char)path[i + 1]) ||
		    !is_hex((unsigned char)path[i + 2])) {
			*why = WHY_PCT;
			return -1;
		}
		int hi = hex_value((unsigned char)path[i + 1]);
		int lo = hex_value((unsigned char)path[i + 2]);
		unsigned char b = (unsigned char)(hi * 16 + lo);
		i += 2;
		if (b == '/') {
			*why = WHY_SLASH;
			return -1;
		}
		if (is_unreserved(b)) {
			out[o++] = (char)b;
			continue;
		}
		out[o++] = '%';
		out[o++] = hex[hi];
		out[o++] = hex[lo];
	}
	*out_len = o;
	return 0;
}

/* Validates pattern segment by segment; records them when t is not NULL. */
static int add_segments(pathtpl *t, const char *p, const char *end,
			char *err, size_t errlen)
{
	for (;;) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		const char *seg_end = slash ? slash : end;
		if (add_segment(t, p, (size_t)(seg_end - p), slash != NULL, err,
				errlen) < 0)
			return -1;
		if (!slash)
			return 0;
		p = slash + 1;
	}
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
	/* The template as written is checked first, so errors name what the
	 * operator wrote; it is then matched in its normalised form, like
	 * the paths it is matched against. */
	if (add_segments(NULL, pattern + 1, pattern + plen, err, errlen) < 0)
		return NULL;
	char *norm = xmalloc(plen + 1);
	size_t nlen;
	const char *why;
	if (pathtpl_normalize(pattern, plen, norm, &nlen, &why) < 0) {
		snprintf(err, errlen, "%s", why);
		free(norm);
		return NULL;
	}
	norm[nlen] = '\0';
	t = xcalloc(1, sizeof *t);
	t->pattern = norm;
	/* One segment per '/', which is an upper bound. */
	size_t slashes = 0;
	for (size_t i = 0; i < nlen; i++)
		slashes += norm[i] == '/';
	t->segs = xcalloc(slashes, sizeof *t->segs);
	if (add_segments(t, norm + 1, norm + nlen, err, errlen) < 0)
		ALWAYS_ASSERT(!"a normalised valid template is valid");
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
