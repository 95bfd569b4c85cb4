#include "http_head.h"

#include <stdint.h>
#include <string.h>

#include "util.h"

/* RFC 3986 unreserved, sub-delims, ':' '@' (pchar) and '/' '?': the bytes
 * an origin-form target (RFC 9112 3.2.1) may hold besides %HH. Everything
 * else ('#', spaces, quotes, braces, non-ASCII...) is a byte that some
 * parser between us and the upstream would treat differently: curl drops a
 * fragment, for one, so the request routed and claimed would not be the
 * one executed. */
static bool is_target_char(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch >= '0' && ch <= '9') ||
	       (ch && strchr("-._~!$&'()*+,;=:@/?", ch));
}

static bool is_hex(unsigned char ch)
{
	return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') ||
	       (ch >= 'A' && ch <= 'F');
}

bool http_head_origin_form(const char *t)
{
	if (t[0] != '/')
		return false; /* absolute-form, authority-form, asterisk-form */
	for (const unsigned char *p = (const unsigned char *)t; *p; p++) {
		if (*p == '%') {
			if (!is_hex(p[1]) || !is_hex(p[2]))
				return false;
			p += 2;
		} else if (!is_target_char(*p)) {
			return false;
		}
	}
	return true;
}

bool http_head_method_ok(const char *m)
{
	if (!*m)
		return false;
	for (const unsigned char *p = (const unsigned char *)m; *p; p++)
		if ((*p >= 'a' && *p <= 'z') || *p <= 0x20 || *p >= 0x7f ||
		    strchr("\"(),/:;<=>?@[\\]{}", *p))
			return false;
	return true;
}

/* RFC 9110 5.6.2 tchar. */
static bool is_tchar(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch >= '0' && ch <= '9') || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* A name must be a token (no space, quote, colon: libmicrohttpd glues an
 * obs-fold continuation into the name, and an upstream would split such a
 * name differently from us). */
bool http_head_name_ok(const char *p, size_t n)
{
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!is_tchar((unsigned char)p[i]))
			return false;
	return true;
}

/* A control byte (bare CR, LF, NUL...) in a header would reach the
 * upstream, whose parser may split the line differently from ours. */
bool http_head_value_ok(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)p[i];
		if (ch == '\t')
			continue;
		if (ch < 0x20 || ch == 0x7f)
			return false;
	}
	return true;
}

/* libmicrohttpd 0.9.75 parses a header line in place in its read buffer:
 * the name, the colon (overwritten with NUL), optional SP/HTAB, the value.
 * An obs-fold continuation line is glued onto the *name* (X-Tenant-I: V
 * followed by " d" arrives as X-Tenant-Id: V), and that name is moved to a
 * new block of the connection's memory pool, past the read buffer. So a
 * header whose value does not follow its own name on the same line was
 * folded: refuse it, as RFC 9112 5.2 allows. */
bool http_head_on_own_line(const char *key, size_t key_size,
			   const char *value, size_t max_gap)
{
	uintptr_t k = (uintptr_t)key, v = (uintptr_t)value;
	if (v < k + key_size + 1 || v - (k + key_size + 1) > max_gap)
		return false;
	if (key[key_size] != '\0')
		return false;
	for (const char *p = key + key_size + 1; p < value; p++)
		if (*p != ' ' && *p != '\t')
			return false;
	return true;
}

bool http_head_request_id_ok(const char *v, size_t max)
{
	size_t n = v ? strlen(v) : 0;
	if (n == 0 || n >= max)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
			return false;
	return true;
}

const char *http_head_problem(const http_head *h)
{
	if (!http_head_method_ok(h->method))
		return "the method must be a token in upper case (methods are "
		       "case-sensitive)";
	if (!http_head_origin_form(h->target))
		return "the request target must be origin-form: a path from "
		       "'/' with an optional query, only characters RFC 3986 "
		       "allows there (a '%' followed by two hex digits), no "
		       "fragment";
	if (h->folded)
		return "a header line is folded (obs-fold) or malformed";
	bool http11 = strcmp(h->version, "HTTP/1.0") != 0;
	if (h->hosts > 1 || (http11 && h->hosts == 0))
		return "an HTTP/1.1 request needs exactly one Host header";
	if (h->te && (h->te > 1 || !http11 || !h->te_value ||
		      !str_caseeq(h->te_value, "chunked")))
		return "the only transfer coding accepted is a single "
		       "\"chunked\"";
	return NULL;
}

bool http_head_framing_ok(size_t content_lengths, size_t te)
{
	return content_lengths <= 1 && !(content_lengths && te);
}
