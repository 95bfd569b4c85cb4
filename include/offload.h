/* Helper threads for CPU work that would hold up the serving thread: a
 * fiber hands a job over and waits for it on an eventfd, so that the loop
 * (libmicrohttpd's connections, the other workers, the batch lanes) goes
 * on meanwhile. Used for what one client can make long: decoding a stored
 * body for a retry that does not accept its coding, and the canonical
 * JSON of a large body (proxy.c says where and from which size).
 *
 * The job runs on another thread: it may touch only what it is given and
 * what is safe from any thread (jansson values of its own, zlib, the log).
 */
#ifndef IDEMPROXY_OFFLOAD_H
#define IDEMPROXY_OFFLOAD_H

#include <stdbool.h>

/* How many helper threads run jobs; more jobs wait in order. */
#define OFFLOAD_THREADS 2

/* Runs fn(arg) and returns once it has run. On a fiber: on a helper
 * thread (started at the first job) while the fiber waits; on a plain
 * thread, here, since that thread holds up no one else. Returns true
 * when a helper ran it. */
bool offload_run(void (*fn)(void *), void *arg);

/* Jobs run by helper threads since start, and jobs handed over and not
 * done yet (running or queued): for /metrics. */
unsigned long offload_jobs(void);
int offload_pending(void);
/* Adds those two to /metrics; once, at start. */
void offload_publish(void);

#endif
