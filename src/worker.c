#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "busy.h"
#include "fiber.h"

/* Idle workers wait on their own semaphore, on a stack: the one that went
 * idle last is woken first. At low load the same few threads do all the
 * work, with warm caches and warm database backends; under load every
 * thread is busy anyway.
 *
 * A request for an idle worker is handed to it directly (slot->item) and
 * its semaphore posted after the pool's lock is released: the woken thread
 * starts on the request without taking the lock again, so it never wakes
 * only to sleep on the lock its waker still holds (a condition variable
 * signalled under the lock costs that second sleep and wake-up whenever
 * the waker is still inside).
 *
 * With busy polling on (busy.h), a worker that finds nothing to do while no
 * other request is with a worker polls the queue for a while before it
 * sleeps: at most one such spinner at a time, and the first request queued
 * meanwhile is left to it, without a wake-up.
 *
 * Fibers (worker_pool_start_fibers): the workers are fibers on one
 * scheduler thread (fiber.h) instead of threads; an idle one parks instead
 * of waiting on its semaphore, and busy polling is the scheduler's. */
typedef struct slot {
	sem_t wake;
	fiber *f;   /* in fiber mode, the worker's fiber */
	void *item; /* handed over by submit, NULL to stop */
} slot;

struct worker_pool {
	pthread_mutex_t mu;
	void **ring;
	int cap, head, active; /* cap: slots in ring, at least bound */
	int bound;             /* queue_size: more waiting -> refused */
	atomic_int count;     /* read without the lock by the spinner */
	atomic_bool stopping;
	bool spinner;         /* a worker polls the queue */
	int nthreads;
	pthread_t *threads;
	fiber_sched *sched; /* fiber mode */
	slot *slots;
	slot **idle;  /* stack of idle slots, most recent on top */
	int nidle;
	worker_ops ops;
	int next_index;
};

/* Called and returns with the lock held. */
static void spin_for_work(worker_pool *p)
{
	double deadline;
	if (p->sched || p->spinner || !busy_spin_idle(&deadline))
		return;
	p->spinner = true;
	pthread_mutex_unlock(&p->mu);
	double t0 = ip_now_ms();
	while (atomic_load(&p->count) == 0 && !atomic_load(&p->stopping) &&
	       ip_now_ms() < deadline)
		busy_relax();
	busy_account(t0, deadline);
	pthread_mutex_lock(&p->mu);
	p->spinner = false;
}

static void sem_wait_all(sem_t *sem)
{
	while (sem_wait(sem) && errno == EINTR)
		;
}

/* The next request for the calling worker, NULL when the pool stops: from
 * the queue, or else handed over while it sleeps. Called with the lock held,
 * returns without it. */
static void *next_item(worker_pool *p, slot *me)
{
	for (;;) {
		if (p->count == 0 && !p->stopping)
			spin_for_work(p);
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
		if (p->sched)
			fiber_park();
		else
			sem_wait_all(&me->wake);
		/* submit popped this slot and counted the item active; stop
		 * popped it too, and posts none. */
		if (me->item)
			return me->item;
		pthread_mutex_lock(&p->mu);
	}
}

static void wake_slot(worker_pool *p, slot *s)
{
	if (p->sched)
		fiber_wake(s->f);
	else
		sem_post(&s->wake);
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

static void *worker_thread(void *arg)
{
	worker_run(arg);
	return NULL;
}

static void worker_fiber(void *arg)
{
	worker_run(arg);
}

/* The scheduler polls while at most one request is with a worker: that
 * one's fiber waits for its store or its upstream, as a worker thread
 * would poll its socket (busy.h). */
static fiber_poll_hooks poll_hooks = {busy_spin, busy_relax, busy_account};

static worker_pool *pool_new(int threads, int queue_size,
			     const worker_ops *ops)
{
	worker_pool *p = xcalloc(1, sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	p->cap = queue_size > 0 ? queue_size : 1;
	p->bound = p->cap;
	p->ring = xcalloc((size_t)p->cap, sizeof *p->ring);
	p->ops = *ops;
	p->nthreads = threads;
	p->threads = xcalloc((size_t)threads, sizeof *p->threads);
	p->slots = xcalloc((size_t)threads, sizeof *p->slots);
	p->idle = xcalloc((size_t)threads, sizeof *p->idle);
	for (int i = 0; i < threads; i++)
		IP_ASSERT(sem_init(&p->slots[i].wake, 0, 0) == 0);
	return p;
}

worker_pool *worker_pool_start(int threads, int queue_size,
			       const worker_ops *ops)
{
	worker_pool *p = pool_new(threads, queue_size, ops);
	for (int i = 0; i < threads; i++) {
		IP_ASSERT(pthread_create(&p->threads[i], NULL, worker_thread,
					 p) == 0);
		pthread_setname_np(p->threads[i], "ip-worker");
	}
	return p;
}

worker_pool *worker_pool_start_fibers(int workers, int queue_size,
				      const worker_ops *ops, size_t stack)
{
	worker_pool *p = pool_new(workers, queue_size, ops);
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
	/* A spinner takes the first waiting request itself; otherwise the
	 * idle worker on top of the stack gets it directly. */
	slot *s = NULL;
	if (p->nidle > 0 && (!p->spinner || p->count > 0)) {
		s = p->idle[--p->nidle];
		s->item = item;
		p->active++;
	} else {
		p->ring[(p->head + p->count) % p->cap] = item;
		p->count++;
	}
	pthread_mutex_unlock(&p->mu);
	if (s)
		wake_slot(p, s);
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
		wake_slot(p, s);
	}
	pthread_mutex_unlock(&p->mu);
	if (p->sched)
		fiber_sched_join(p->sched);
	else
		for (int i = 0; i < p->nthreads; i++)
			pthread_join(p->threads[i], NULL);
	for (int i = 0; i < p->nthreads; i++)
		sem_destroy(&p->slots[i].wake);
	free(p->slots);
	free(p->idle);
	free(p->threads);
	free(p->ring);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

fiber_sched *worker_pool_sched(worker_pool *p)
{
	return p->sched;
}
