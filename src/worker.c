#include "worker.h"

#include <pthread.h>
#include <stdlib.h>

struct worker_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	void **ring;
	int cap, head, count, active;
	bool stopping;
	int nthreads;
	pthread_t *threads;
	worker_ops ops;
	int next_index;
};

static void *worker_main(void *arg)
{
	worker_pool *p = arg;
	pthread_mutex_lock(&p->mu);
	int index = p->next_index++;
	pthread_mutex_unlock(&p->mu);
	void *ctx = p->ops.init(p->ops.arg, index);
	for (;;) {
		pthread_mutex_lock(&p->mu);
		while (p->count == 0 && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->count == 0) {
			pthread_mutex_unlock(&p->mu);
			break;
		}
		void *item = p->ring[p->head];
		p->head = (p->head + 1) % p->cap;
		p->count--;
		p->active++;
		pthread_mutex_unlock(&p->mu);

		p->ops.handle(ctx, item);

		pthread_mutex_lock(&p->mu);
		p->active--;
		pthread_mutex_unlock(&p->mu);
	}
	p->ops.fini(ctx);
	return NULL;
}

worker_pool *worker_pool_start(int threads, int queue_size,
			       const worker_ops *ops)
{
	worker_pool *p = xcalloc(1, sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->cap = queue_size > 0 ? queue_size : 1;
	p->ring = xcalloc((size_t)p->cap, sizeof *p->ring);
	p->ops = *ops;
	p->nthreads = threads;
	p->threads = xcalloc((size_t)threads, sizeof *p->threads);
	for (int i = 0; i < threads; i++)
		IP_ASSERT(pthread_create(&p->threads[i], NULL, worker_main,
					 p) == 0);
	return p;
}

bool worker_pool_submit(worker_pool *p, void *item)
{
	pthread_mutex_lock(&p->mu);
	/* The queue only holds what no worker has picked up yet: with every
	 * worker busy, cap more requests may wait, then we shed load. */
	if (p->stopping || p->count == p->cap) {
		pthread_mutex_unlock(&p->mu);
		return false;
	}
	p->ring[(p->head + p->count) % p->cap] = item;
	p->count++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return true;
}

int worker_pool_busy(worker_pool *p)
{
	pthread_mutex_lock(&p->mu);
	int n = p->count + p->active;
	pthread_mutex_unlock(&p->mu);
	return n;
}

void worker_pool_stop(worker_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	free(p->ring);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}
