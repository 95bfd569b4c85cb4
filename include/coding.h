/* Content codings (RFC 9110 8.4, 12.5.3): which codings a request accepts,
 * what the upstream is asked for, and decoding a stored body for a retry
 * that cannot read its coding. The proxy decodes gzip (x-gzip) and deflate
 * with zlib; identity is no coding. */
#ifndef IDEMPROXY_CODING_H
#define IDEMPROXY_CODING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "util.h"

/* The response's Content-Encoding values, joined with ", " into out; false
 * when there is none (or only identity). */
bool coding_of(const header_list *resp, growbuf *out);

/* Does a request with these headers accept every coding in the list ce?
 * Without an Accept-Encoding header only identity is taken as accepted:
 * a client that says nothing may not be able to decode anything. */
bool coding_accepted(const header_list *req, const char *ce);

/* The Accept-Encoding to send upstream for a protected request: the
 * client's elements naming codings the proxy can decode ("*" and others are
 * dropped; "identity" when nothing is left). False: the client sent none,
 * send none. */
bool coding_upstream_accept(const header_list *req, growbuf *out);

/* Decodes in (coded with the list ce, applied in order) into out, at most
 * max bytes. -1 with a reason: a coding the proxy cannot decode, corrupt
 * data, or more than max bytes. */
int coding_decode(const char *ce, const char *in, size_t len, int64_t max,
		  growbuf *out, char *err, size_t errlen) MUST_CHECK;

/* After decoding: no Content-Encoding, and a strong ETag made weak (the
 * decoded body is another representation of the same resource). */
void coding_mark_decoded(header_list *resp);

#endif
