#include "worker.h"

#include <pthread.h>
#include <stdlib.h>

#include "busy.h"
#include "fiber.h"
#include "metrics.h"

/* The workers are fibers on one scheduler thread (fiber.h). Idle workers
 * park on a stack: the one that went idle last is woken first. At low load
 * the same few workers do all the work, with warm database backends; under
 * load every worker is busy anyway.
 *
 * A request for an idle worker is handed to it directly (slot->item) and
 * the worker woken after the pool's lock is released, so it starts on the
 * request without taking the lock again. Busy polling is the scheduler's
 * (busy.h). The lock stays: the waiters' thread submits too, and metrics
 * read the counts from the admin thread. */
typedef struct slot {
	fiber *f;   /* the worker's fiber */
	void *item; /* handed over by submit, NULL to stop */
} slot;

struct worker_pool {
	pthread_mutex_t mu;
	void **ring;
	int cap, head, active; /* cap: slots in ring, at least bound */
	int bound;             /* queue_size: more waiting -> refused */
	int count;
	bool stopping;
	fiber_sched *sched;
	slot *slots;
	slot **idle;  /* stack of idle slots, most recent on top */
	int nidle;
	worker_ops ops;
	int next_index;
};

/* The next request for the calling worker, NULL when the pool stops: from
 * the queue, or else handed over while it is parked. Called with the lock
 * held, returns without it. */
static void *next_item(worker_pool *p, slot *me)
{
	for (;;) {
		if (p->count > 0) {
			void *item = p->ring[p->head];
			p->head = (p->head + 1) % p->cap;
			p->count--;
			p->active++;
			pthread_mutex_unlock(&p->mu);
			return item;
		}
		if (p->stopping) {
			pthread_mutex_unlock(&p->mu);
			return NULL; /* and the queue is drained */
		}
		p->idle[p->nidle++] = me;
		me->item = NULL;
		pthread_mutex_unlock(&p->mu);
		fiber_park();
		/* submit popped this slot and counted the item active; stop
		 * popped it too, and hands over none. */
		if (me->item)
			return me->item;
		pthread_mutex_lock(&p->mu);
	}
}

static void worker_run(worker_pool *p)
{
	pthread_mutex_lock(&p->mu);
	int index = p->next_index++;
	slot *me = &p->slots[index];
	me->f = fiber_current();
	pthread_mutex_unlock(&p->mu);
	void *ctx = p->ops.init(p->ops.arg, index);

	pthread_mutex_lock(&p->mu);
	void *item;
	while ((item = next_item(p, me))) {
		busy_request_begin();
		p->ops.handle(ctx, item);
		busy_request_end();

		pthread_mutex_lock(&p->mu);
		p->active--;
	}
	p->ops.fini(ctx);
}

static void worker_fiber(void *arg)
{
	worker_run(arg);
}

/* The scheduler polls while at most one request is with a worker: that
 * one's fiber waits for its store or its upstream (busy.h). */
static fiber_poll_hooks poll_hooks = {busy_spin, busy_relax, busy_account};

worker_pool *worker_pool_start(int workers, int queue_size,
			       const worker_ops *ops, size_t stack)
{
	worker_pool *p = xcalloc(1, sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	p->cap = queue_size > 0 ? queue_size : 1;
	p->bound = p->cap;
	p->ring = xcalloc((size_t)p->cap, sizeof *p->ring);
	p->ops = *ops;
	p->slots = xcalloc((size_t)workers, sizeof *p->slots);
	p->idle = xcalloc((size_t)workers, sizeof *p->idle);
	p->sched = fiber_sched_start(stack);
	fiber_sched_set_poll(p->sched, &poll_hooks);
	for (int i = 0; i < workers; i++)
		fiber_spawn(p->sched, worker_fiber, p);
	return p;
}

bool worker_pool_submit(worker_pool *p, void *item)
{
	pthread_mutex_lock(&p->mu);
	/* The queue only holds what no worker has picked up yet: with every
	 * worker busy, cap more requests may wait, then we shed load. */
	if (p->stopping || p->count >= p->bound) {
		pthread_mutex_unlock(&p->mu);
		return false;
	}
	/* The idle worker on top of the stack gets it directly. */
	slot *s = NULL;
	if (p->nidle > 0) {
		s = p->idle[--p->nidle];
		s->item = item;
		p->active++;
	} else {
		p->ring[(p->head + p->count) % p->cap] = item;
		p->count++;
	}
	pthread_mutex_unlock(&p->mu);
	if (s)
		fiber_wake(s->f);
	return true;
}

void worker_pool_set_queue_size(worker_pool *p, int queue_size)
{
	int bound = queue_size > 0 ? queue_size : 1;
	pthread_mutex_lock(&p->mu);
	/* Items already waiting stay: the ring keeps room for them, and a
	 * lower bound only refuses new ones until the queue drains below it. */
	int cap = bound > p->count ? bound : p->count;
	if (cap != p->cap) {
		void **ring = xcalloc((size_t)cap, sizeof *ring);
		for (int i = 0; i < p->count; i++)
			ring[i] = p->ring[(p->head + i) % p->cap];
		free(p->ring);
		p->ring = ring;
		p->cap = cap;
		p->head = 0;
	}
	p->bound = bound;
	pthread_mutex_unlock(&p->mu);
}

void worker_pool_counts(worker_pool *p, int *queued, int *active)
{
	pthread_mutex_lock(&p->mu);
	*queued = p->count;
	*active = p->active;
	pthread_mutex_unlock(&p->mu);
}

int worker_pool_busy(worker_pool *p)
{
	int queued, active;
	worker_pool_counts(p, &queued, &active);
	return queued + active;
}

void worker_pool_stop(worker_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	while (p->nidle > 0) {
		slot *s = p->idle[--p->nidle];
		fiber_wake(s->f);
	}
	pthread_mutex_unlock(&p->mu);
	fiber_sched_join(p->sched);
	free(p->slots);
	free(p->idle);
	free(p->ring);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

fiber_sched *worker_pool_sched(worker_pool *p)
{
	return p->sched;
}

static double read_queued(void *arg)
{
	int queued, active;
	worker_pool_counts(arg, &queued, &active);
	return queued;
}

static double read_active(void *arg)
{
	int queued, active;
	worker_pool_counts(arg, &queued, &active);
	return active;
}

void worker_pool_publish(worker_pool *p)
{
	static metrics_reading *queued, *busy;
	if (!queued) {
		queued = metrics_reading_add(
			"idemproxy_requests_queued", "gauge",
			"Requests accepted and waiting for a worker (at most "
			"queue_size; more are answered 503 overloaded).",
			"", read_queued);
		busy = metrics_reading_add(
			"idemproxy_workers_busy", "gauge",
			"Workers handling a request (at most workers).", "",
			read_active);
	}
	if (p) {
		metrics_reading_bind(queued, p);
		metrics_reading_bind(busy, p);
	} else {
		metrics_reading_unbind(queued);
		metrics_reading_unbind(busy);
	}
}
