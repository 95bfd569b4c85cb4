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
/* The same, with the RFC 9457 extension members "operation_state"
 * (not_executed, in_progress, unknown, completed) and "client_action"
 * (retry_same_key, retry_new_key, fix_request, do_not_retry) when not
 * NULL. */
void problem_render_state(growbuf *out, int status, const char *code,
			  const char *detail, const char *request_id,
			  const char *operation_state,
			  const char *client_action);

#endif
