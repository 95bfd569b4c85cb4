/* The client-facing HTTP server (libmicrohttpd): one event thread reads whole
 * requests, hands each to the worker pool as a job, and writes the answer
 * when the worker is done. It never blocks on the store or the upstream. */
#ifndef IDEMPROXY_HTTP_FRONT_H
#define IDEMPROXY_HTTP_FRONT_H

#include <stdbool.h>

#include "config.h"
#include "job.h"
#include "util.h"

typedef struct front_opts {
	const char *listen;
	int max_connections;
	int max_connections_per_ip;
	int64_t max_header_size; /* sizes the connection memory; the limits
				    themselves come from each request's config */
	config *(*get_config)(void *arg); /* returns a new reference */
	bool (*submit)(void *arg, job *j); /* false: queue full */
	void *arg;
	/* Tried on the event thread before submit: true when it answered
	 * the job itself (response filled, request accounted). May be NULL. */
	bool (*fast)(void *arg, job *j);
	void *fast_arg;
	/* libmicrohttpd runs on this scheduler's thread (the workers'
	 * fibers, fiber.h): one event loop for the clients, the store and
	 * the upstream. */
	struct fiber_sched *sched;
} front_opts;

typedef struct http_front http_front;

http_front *http_front_start(const front_opts *o, char *err,
			     size_t errlen) MUST_CHECK;
/* Stops accepting new connections; requests already read still finish. */
void http_front_quiesce(http_front *f);
/* Requests handed to workers and not yet answered. */
int http_front_in_flight(http_front *f);
/* Shutdown: stops accepting, answers every request that arrives on an open
 * connection from now on with 503 shutting_down and Connection: close (never
 * started), and waits up to grace_ms until every request already started has
 * been answered. Returns how many are still with workers (0: the daemon can
 * be stopped; otherwise stopping it would abort, see MHD_stop_daemon). */
int http_front_drain(http_front *f, int64_t grace_ms);
void http_front_stop(http_front *f);

#endif
