/* RFC 9457 problem+json bodies for the errors the proxy makes itself. */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include <stddef.h>

#include "util.h"

#define PROBLEM_CONTENT_TYPE "application/problem+json"

/* Title for a known code ("Idempotency-Key missing", ...); a generic one for
 * an unknown code. */
const char *problem_title(const char *code);

/* Appends {"type","title","status","detail","code"} to out. type is
 * "urn:idemproxy:problem:<code>". detail may be NULL (then the title is used).
 * request_id, when not NULL, is added as "request_id". */
void problem_render(growbuf *out, int status, const char *code,
		    const char *detail, const char *request_id);

/* RFC 9457 extension members of one answer; NULL / 0 members are left
 * out. */
typedef struct problem_ext {
	const char *operation_state; /* not_executed, in_progress, ... */
	const char *client_action;   /* retry_same_key, do_not_retry, ... */
	int original_status;         /* a tombstone's stored final status */
} problem_ext;

/* problem_render with the members of ext (NULL: none). */
void problem_render_ext(growbuf *out, int status, const char *code,
			const char *detail, const char *request_id,
			const problem_ext *ext);

#endif
