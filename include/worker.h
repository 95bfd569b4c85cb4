/* A fixed pool of workers fed by a bounded queue: fibers on one scheduler
 * thread (fiber.h). Generic: each worker gets its own context from init(),
 * and handle() does the work. */
#ifndef IDEMPROXY_WORKER_H
#define IDEMPROXY_WORKER_H

#include <stdbool.h>

#include "util.h"

typedef struct worker_pool worker_pool;

typedef struct worker_ops {
	void *(*init)(void *arg, int index);    /* per-worker context */
	void (*handle)(void *ctx, void *item);
	void (*fini)(void *ctx);
	void *arg;
} worker_ops;

/* Each worker has a stack of `stack` bytes: handle() must wait only
 * through fiber-aware calls (fiber_wait_fd), never block the thread. */
worker_pool *worker_pool_start(int workers, int queue_size,
			       const worker_ops *ops, size_t stack);
/* The workers' scheduler. */
struct fiber_sched *worker_pool_sched(worker_pool *p);
/* False (item not taken) when the queue is full or the pool is stopping. */
bool worker_pool_submit(worker_pool *p, void *item) MUST_CHECK;
/* A new bound for items waiting (a reload); what already waits stays. */
void worker_pool_set_queue_size(worker_pool *p, int queue_size);
/* Items queued or being handled. */
int worker_pool_busy(worker_pool *p);
/* Items waiting for a worker, and workers handling one. */
void worker_pool_counts(worker_pool *p, int *queued, int *active);
/* Shows p's queue and busy workers in /metrics; NULL first adds the
 * gauges (at 0), and later stops showing the pool: call it so before the
 * pool stops. From the main thread. */
void worker_pool_publish(worker_pool *p);
/* Lets the queued items finish, then joins the scheduler. */
void worker_pool_stop(worker_pool *p);

#endif
