/* Requests waiting for an attempt in flight (in_flight = "wait"). A waiter
 * holds no worker and no database connection: its job is parked here, its
 * connection stays suspended, and a wake-up for its record (the recording
 * worker on this instance, or a NOTIFY from another) sends it back to the
 * worker pool to claim again. One thread keeps the deadlines (wait_max, the
 * original's lease) and notices clients that hang up while they wait. */
#ifndef IDEMPROXY_WAITERS_H
#define IDEMPROXY_WAITERS_H

#include <stdbool.h>
#include <stdint.h>

#include "job.h"
#include "util.h"
#include "wake.h"

enum waiters_end {
	WAITERS_TIMED_OUT,   /* wait_max passed: 409 with Retry-After */
	WAITERS_CLIENT_GONE, /* the client hung up */
	WAITERS_SHUTDOWN,    /* the process is stopping: 409 */
};

typedef struct waiters_ops {
	/* Back to the worker pool to claim again; false: the queue is full
	 * (tried again shortly). */
	bool (*submit)(void *arg, job *j);
	/* Answers and finishes a job that stops waiting without a claim
	 * (fills the response, accounts it, calls done). */
	void (*answer)(void *arg, job *j, enum waiters_end why);
	void *arg;
} waiters_ops;

typedef struct waiters waiters;

/* max_per_tenant: places one tenant may take; 0: half of max_waiters.
 * max_reclaims: waiters sent back to claim again at once (the others that
 * are due wait for a place), so that a storm of wake-ups leaves room in
 * the workers' queue for fresh requests. */
waiters *waiters_start(int max_waiters, int max_per_tenant, int max_reclaims,
		       const waiters_ops *ops);
void waiters_set_max(waiters *w, int max_waiters, int max_per_tenant);

/* A job of tenant starts waiting: takes one of max_waiters places and one
 * of its tenant's (kept until waiters_leave, across its claims). False,
 * counted as rejected_full or rejected_tenant_full, when the pool or the
 * tenant's share is taken, or as shutdown when the process is stopping. */
bool waiters_admit(waiters *w, job *j, const char *tenant) MUST_CHECK;
/* The job stops waiting with outcome (replayed, took_over, timed_out, ...):
 * frees its place, observes its wait time, logs a line. */
void waiters_leave(waiters *w, job *j, const char *outcome);

/* Wake-ups counted so far; read it before marking the record, and pass it
 * to waiters_park, so a wake-up that comes between is not lost. */
uint64_t waiters_generation(waiters *w);
/* Parks an admitted job until a wake-up for scope, recheck_ms (the
 * original's lease end: its lease may be taken over) or its wait_until_ms.
 * False when the process is stopping (the job is the caller's again). */
bool waiters_park(waiters *w, job *j, const uint8_t scope[WAKE_SCOPE_LEN],
		  double recheck_ms, uint64_t generation) MUST_CHECK;

/* Every waiter for scope claims again. Cheap when nobody waits. */
void waiters_wake(waiters *w, const uint8_t scope[WAKE_SCOPE_LEN]);
bool waiters_any(waiters *w);
/* Every waiter claims again (after notifications may have been lost). */
void waiters_wake_all(waiters *w);
/* Waiting jobs now (parked or claiming again). */
int waiters_count(waiters *w);

/* Answers every parked waiter (WAITERS_SHUTDOWN) and refuses new ones:
 * before the front end stops, since a suspended connection must be
 * resumed first. */
void waiters_drain(waiters *w);
void waiters_stop(waiters *w);

#endif
