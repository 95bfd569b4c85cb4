/* A request's answer when the proxy gives it itself (a problem+json), and
 * its account (the request log line and the request metrics). Below both
 * the front end and the request flow (proxy.c), which each answer some
 * requests themselves. */
#ifndef IDEMPROXY_REPLY_H
#define IDEMPROXY_REPLY_H

#include <stdint.h>

#include "job.h"
#include "problem.h"

/* Fills j's response with a problem+json answer (the front end's own
 * answers and the request flow's). retry_after_s <= 0: no Retry-After. */
void reply_problem(job *j, int status, const char *code, const char *detail,
		   int64_t retry_after_s);
/* The same, for a call site that knows more of the operation than the
 * code's default says (problem.h): f's state and action go in the body. */
void reply_problem_state(job *j, int status, const char *code,
			 const char *detail, int64_t retry_after_s,
			 problem_facts f);

/* Fills j's response with the contract (contract.h) of its configuration:
 * 200 to GET and HEAD, 405 (outcome "rejected") to other methods. */
void reply_contract(job *j);

/* Logs the request line and counts it; call once per request, last. */
void reply_account(job *j);

#endif
