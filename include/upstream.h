/* Sending one attempt upstream with libcurl. One `upstream` (a reused easy
 * handle, keeping keep-alive connections) per worker, used on its fiber
 * (fiber.h). */
#ifndef IDEMPROXY_UPSTREAM_H
#define IDEMPROXY_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "util.h"

/* Call once, before any thread starts. */
int upstream_global_init(void) MUST_CHECK;

typedef struct upstream upstream;

upstream *upstream_new(void);
void upstream_free(upstream *u);

enum upstream_outcome {
	UP_RESPONSE,  /* a response arrived (complete, or too_large) */
	UP_NOT_SENT,  /* no connection could be made: nothing was sent */
	UP_UNKNOWN,   /* sent, but no complete response: outcome unknown */
};

typedef struct upstream_req {
	const char *method;
	const char *base;        /* route upstream base URL */
	const char *target;      /* raw path and query */
	const header_list *headers; /* end-to-end headers to send */
	const char *body;
	size_t body_len;
	int64_t timeout_ms;
	/* When > 0: the call ends by then whatever timeout_ms says (ms on
	 * mono_ms's clock), fresh connection after a stale one included. */
	double deadline_ms;
	int64_t max_response;    /* a larger body is not held: too_large */
} upstream_req;

typedef struct upstream_resp {
	enum upstream_outcome outcome;
	int status;
	header_list headers;     /* without hop-by-hop and framing headers,
				  * those named in Connection, and trailers */
	growbuf body;
	/* The body went past max_response: the transfer was cut (and its
	 * connection closed), the status is known, the body is empty. */
	bool too_large;
	char error[256];
	double ms;
} upstream_resp;

/* Never sends the attempt twice: libcurl's silent resend on a reused
 * connection is refused, and reported as an unknown outcome. Never writes it
 * to a connection with unread input (it goes on a fresh connection instead),
 * and never keeps a connection with bytes left after its response. */
void upstream_send(upstream *u, const upstream_req *req, upstream_resp *out);
void upstream_resp_free(upstream_resp *r);

/* True for headers that describe one connection, not the message
 * (RFC 9110 7.6.1), plus the framing headers the proxy sets itself. */
bool upstream_is_hop_header(const char *name);

#endif
