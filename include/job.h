/* One client request on its way through the proxy: what the front end read,
 * and the response a worker builds for it. The front end fills the request
 * part and hands the job over; exactly one worker fills the response part and
 * calls done(); the front end then owns it again and frees it. */
#ifndef IDEMPROXY_JOB_H
#define IDEMPROXY_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "http_msg.h"
#include "trace_ctx.h"
#include "util.h"

typedef struct job {
	config *cfg;           /* a reference, taken when the request arrived */

	/* request */
	char *method;
	char *target;          /* raw path and query, exactly as received */
	size_t path_len;       /* length of the path part of target */
	char *version;         /* "HTTP/1.1" */
	header_list req_headers;
	growbuf body;
	char client_ip[64];
	char request_id[64];
	/* the valid traceparent's trace id (trace_ctx.h), "" when none;
	 * hex by construction, so it is logged as it is */
	char trace_id[TRACE_ID_HEX + 1];
	double t_start_ms;

	/* what the proxy decided about it, once planned (decide.h) */
	struct request_plan *plan;
	uint8_t fp[32];
	bool has_fp;

	/* response */
	int status;
	header_list resp_headers;
	growbuf resp_body;

	/* the per-request log line */
	const char *route_name;
	const char *outcome;
	char *tenant;
	char *key;
	int attempt;
	double upstream_ms;
	double store_ms;

	/* waiting for an attempt in flight (waiters.h) */
	int client_fd;         /* the connection's socket, -1 if unknown */
	bool wait_planned;     /* wait_ms and wait_applied_s are set */
	int64_t wait_ms;       /* how long it may wait; 0: it does not */
	int64_t wait_applied_s; /* Preference-Applied: wait=N; -1: none */
	double wait_since_ms;  /* when it started waiting; 0: never */
	double wait_until_ms;  /* when its wait ends */
	void *wait_slot;       /* its tenant's waiting places (waiters.c) */
	bool wait_reclaiming;  /* sent back to claim again, not yet back */

	/* completion, set by the front end */
	void (*done)(struct job *j);
	void *front_ctx;
} job;

job *job_new(config *cfg);
/* trace_id for a log line: "-" when the request has none. */
const char *job_trace_id(const job *j);
void job_free(job *j);

#endif
