/* Fibers: many straight-line tasks on one thread, each with its own stack,
 * switching only where they wait for a socket or a timer. One scheduler
 * thread runs them; when none can run it sleeps in one epoll_wait for all
 * of them, so that under load one wake-up serves several waits.
 *
 * Why: on this kind of machine a thread that sleeps in poll(2) and is woken
 * on another CPU costs tens of microseconds of CPU (tests/bench/programs/wake_cost.c);
 * a worker thread per request pays that at each of its waits (claim,
 * upstream, record), a fiber only when the whole scheduler has nothing to
 * do.
 *
 * Code that may run on a fiber or on a plain thread asks fiber_current():
 * on a plain thread it blocks as before (poll), on a fiber it waits through
 * the scheduler. Nothing may block the thread inside a fiber for long (no
 * blocking socket call, no sleep, no lock held across a wait). */
#ifndef IDEMPROXY_FIBER_H
#define IDEMPROXY_FIBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct fiber fiber;
typedef struct fiber_sched fiber_sched;

#define FIBER_IN 1
#define FIBER_OUT 2

/* The stack of each worker fiber, and the guard (PROT_NONE) below every
 * fiber's stack: larger than any one frame, so an overflow faults in its
 * own guard, also in code built without -fstack-clash-protection. */
#define FIBER_STACK_BYTES ((size_t)1 << 20)
#define FIBER_GUARD_BYTES ((size_t)64 << 10)

/* A scheduler and its thread, started at once; fibers are added with
 * fiber_spawn, each with a stack of stack_size bytes (and a guard). */
fiber_sched *fiber_sched_start(size_t stack_size);
/* Starts fn(arg) on a new fiber of s. Thread-safe. */
void fiber_spawn(fiber_sched *s, void (*fn)(void *), void *arg);
/* Waits until every fiber has returned, then stops the thread. */
void fiber_sched_join(fiber_sched *s);

/* The calling fiber, or NULL on a plain thread. */
fiber *fiber_current(void);

/* The calling fiber's stack, [*lo, *hi), without its guard below; false
 * on a plain thread. */
bool fiber_stack_bounds(char **lo, char **hi);

/* On a fiber: waits until fd is ready for `events` (FIBER_IN, FIBER_OUT),
 * or until deadline_ms (mono_ms's clock; < 0: none). Returns the events
 * that are ready (errors and hang-ups count as both), 0 at the deadline.
 * Several fds: the same, for any of them; ready[i] gets fd i's events. */
int fiber_wait_fd(int fd, int events, double deadline_ms);
int fiber_wait_fds(int n, const int *fds, const int *events, int *ready,
		   double deadline_ms);

/* Parks the calling fiber until fiber_wake (from any thread). A wake that
 * comes before the park is not lost. */
void fiber_park(void);
void fiber_wake(fiber *f);

/* Lets the other runnable fibers run first. */
void fiber_yield(void);

/* Busy polling for the scheduler (busy_poll): when no fiber can run and
 * ok() says so, the scheduler polls its sockets (calling relax() between
 * looks) instead of sleeping, until the deadline ok() set, then reports the
 * time with done(). */
typedef struct fiber_poll_hooks {
	bool (*ok)(double *deadline_ms);
	void (*relax)(void);
	void (*done)(double started_ms, double deadline_ms);
} fiber_poll_hooks;
void fiber_sched_set_poll(fiber_sched *s, fiber_poll_hooks *hooks);

/* The heartbeat: how late the scheduler's loop is, in ms (0 while it is
 * running or sleeping as planned). The loop sleeps at most FIBER_BEAT_MS at
 * a time, so a thread stopped anywhere (a blocking call, long CPU work, a
 * debugger) shows here within that. From any thread. */
#define FIBER_BEAT_MS 250
double fiber_sched_lag_ms(fiber_sched *s);

/* Runs fn(arg) on the scheduler's thread, between fibers, and returns when
 * it has. From the scheduler's own thread (outside a fiber) it runs at
 * once. */
void fiber_sched_call(fiber_sched *s, void (*fn)(void *), void *arg);

/* Another event loop the scheduler runs on its thread (libmicrohttpd's):
 * run(arg) is called when fd is readable, or when timeout_ms(arg) (< 0:
 * none, asked before each sleep) has passed, never inside a fiber. NULL
 * removes it; either returns once the scheduler has taken it. */
typedef struct fiber_source {
	int fd;
	void (*run)(void *arg);
	int64_t (*timeout_ms)(void *arg);
	void *arg;
} fiber_source;
void fiber_sched_set_source(fiber_sched *s, const fiber_source *src);
/* From any thread: run the source at the next turn of the loop, whatever
 * its fd says (libmicrohttpd without a thread of its own has no channel to
 * say that a connection was resumed). */
void fiber_sched_poke_source(fiber_sched *s);

#endif
