/* The checks a request head must pass before anything else looks at it,
 * so that no parser between the client and the upstream can read the
 * request differently from the proxy (request smuggling): the method, the
 * target, each header line's bytes and place, Host and Transfer-Encoding.
 * Pure functions of their arguments, no I/O. */
#ifndef IDEMPROXY_HTTP_HEAD_H
#define IDEMPROXY_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>

/* The method is a token without lower-case letters: methods are
 * case-sensitive (RFC 9110 9.1) but many frameworks upper-case them, so
 * "post" would be forwarded unprotected and run as a POST. */
bool http_head_method_ok(const char *m);

/* The target is origin-form (RFC 9112 3.2.1): a path from '/' with an
 * optional query, only bytes RFC 3986 allows there, '%' only before two
 * hex digits, no fragment. */
bool http_head_origin_form(const char *t);

/* A header name: 1 or more tchar (RFC 9110 5.6.2). */
bool http_head_name_ok(const char *p, size_t n);
/* A header value: visible ASCII, SP, HTAB and obs-text, no control byte. */
bool http_head_value_ok(const char *p, size_t n);

/* Did value follow its own name on the same line, in libmicrohttpd's
 * read buffer (the name, a NUL where the colon was, at most max_gap bytes
 * of SP/HTAB, the value)? False for an obs-fold continuation, which
 * libmicrohttpd glues onto the name elsewhere in its memory pool. */
bool http_head_on_own_line(const char *key, size_t key_size,
			   const char *value, size_t max_gap);

/* A client's X-Request-Id, if it is one we may log and echo: 1 to max - 1
 * bytes of visible ASCII. */
bool http_head_request_id_ok(const char *v, size_t max);

/* What the whole head showed, for http_head_problem. */
typedef struct http_head {
	const char *method;
	const char *target;
	const char *version;  /* "HTTP/1.0", "HTTP/1.1" */
	bool folded;          /* a header line failed http_head_on_own_line */
	size_t hosts;         /* Host header lines */
	size_t te;            /* Transfer-Encoding header lines */
	const char *te_value; /* the first one's value, NULL if none */
} http_head;

/* Why the head is refused (one sentence for the client), or NULL. */
const char *http_head_problem(const http_head *h);

/* Two Content-Length lines, or a length beside a transfer coding, is how
 * requests are smuggled past one parser to another: false then. */
bool http_head_framing_ok(size_t content_lengths, size_t te);

#endif
