/* RFC 9457 problem+json bodies for the errors the proxy makes itself. */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

#define PROBLEM_CONTENT_TYPE "application/problem+json"
#define PROBLEM_TYPE_BASE_DEFAULT "urn:idemproxy:problem:"

/* What the proxy knows of the operation the answer is about (the member
 * "operation_state"): for the public listener the request's effect at the
 * upstream under its key, for the admin listener the admin action. */
enum problem_state {
	PROBLEM_STATE_OF_CODE = 0, /* the code's default (the table) */
	PROBLEM_NOT_EXECUTED,
	PROBLEM_IN_PROGRESS,
	PROBLEM_UNKNOWN,
	PROBLEM_COMPLETED,
};

/* What the client may do (the member "client_action"). */
enum problem_action {
	PROBLEM_ACTION_OF_CODE = 0, /* the code's default (the table) */
	PROBLEM_RETRY_SAME_KEY,     /* after Retry-After, if given */
	PROBLEM_RETRY_NEW_KEY,      /* nothing ran or is recorded for it */
	PROBLEM_FIX_REQUEST,        /* the request itself is wrong */
	PROBLEM_DO_NOT_RETRY,       /* finished, or for a person to settle */
};

/* A call site that knows more than the code's default says so here;
 * zero values take the default. */
typedef struct problem_facts {
	enum problem_state state;
	enum problem_action action;
	int original_status; /* > 0: a tombstone's stored final status */
} problem_facts;

/* Where a problem points: type_base + code is its "type" (NULL:
 * PROBLEM_TYPE_BASE_DEFAULT); doc_url, when not NULL or empty, is the
 * target of a Link: <doc_url>; rel="describedby" header. The conf's
 * problem_type_base and problem_doc_url. */
typedef struct problem_links {
	const char *type_base;
	const char *doc_url;
} problem_links;

/* Title for a known code ("Idempotency-Key missing", ...); a generic one for
 * an unknown code. */
const char *problem_title(const char *code);

/* The names written in the body ("not_executed", "retry_same_key"). */
const char *problem_state_name(enum problem_state s);
const char *problem_action_name(enum problem_action a);

/* The facts a problem with this code states: f's where set, else the
 * code's defaults (unknown and do_not_retry for a code not in the table:
 * the claim that can never mislead). */
problem_facts problem_facts_of(const char *code, problem_facts f);

/* Appends {"type","title","status","detail","code","operation_state",
 * "client_action"} to out. detail may be NULL (then the title is used).
 * request_id, when not NULL, is added as "request_id". links may be NULL
 * (the default type base). */
void problem_render(growbuf *out, const problem_links *links, int status,
		    const char *code, const char *detail,
		    const char *request_id, problem_facts f);

/* The value of the Link header a problem answer carries, into out; false
 * (out untouched) when no documentation URL is set. */
bool problem_link_header(const problem_links *links, growbuf *out);

/* Is s an absolute URI (RFC 3986: a scheme, then only URI characters,
 * every '%' followed by two hex digits)? Nothing else may go into a type
 * or a Link header: no space, quote, angle bracket or control byte. On
 * false the reason is in why. */
bool problem_uri_ok(const char *s, char *why, size_t whylen);
#endif
