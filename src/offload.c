#include "offload.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fiber.h"
#include "metrics.h"
#include "util.h"

typedef struct offload_job {
	void (*fn)(void *);
	void *arg;
	int efd; /* written once the job has run */
	struct offload_job *next;
} offload_job;

/* One pool for the process, started at the first job, never stopped: a
 * helper idles in pthread_cond_wait, and a job still queued at exit
 * belongs to a fiber that is not going to be resumed anyway. */
static struct {
	pthread_once_t once;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	offload_job *head, *tail;
	atomic_ulong jobs;
	atomic_int pending;
} pool = {.once = PTHREAD_ONCE_INIT,
	  .mu = PTHREAD_MUTEX_INITIALIZER,
	  .cv = PTHREAD_COND_INITIALIZER};

static offload_job *take(void)
{
	pthread_mutex_lock(&pool.mu);
	while (!pool.head)
		pthread_cond_wait(&pool.cv, &pool.mu);
	offload_job *j = pool.head;
	pool.head = j->next;
	if (!pool.head)
		pool.tail = NULL;
	pthread_mutex_unlock(&pool.mu);
	return j;
}

static void *helper_main(void *arg)
{
	(void)arg;
	for (;;) {
		offload_job *j = take();
		int efd = j->efd; /* j lives on the fiber's stack: read first */
		j->fn(j->arg);
		atomic_fetch_add(&pool.jobs, 1);
		atomic_fetch_sub(&pool.pending, 1);
		uint64_t one = 1;
		/* The fiber may run, return and free j as soon as this lands. */
		ALWAYS_ASSERT(write(efd, &one, sizeof one) == sizeof one);
	}
	return NULL;
}

static void start_helpers(void)
{
	for (int i = 0; i < OFFLOAD_THREADS; i++) {
		pthread_t t;
		ALWAYS_ASSERT(pthread_create(&t, NULL, helper_main, NULL) == 0);
		pthread_detach(t);
	}
}

static void enqueue(offload_job *j)
{
	pthread_mutex_lock(&pool.mu);
	j->next = NULL;
	if (pool.tail)
		pool.tail->next = j;
	else
		pool.head = j;
	pool.tail = j;
	pthread_cond_signal(&pool.cv);
	pthread_mutex_unlock(&pool.mu);
}

bool offload_run(void (*fn)(void *), void *arg)
{
	int efd = fiber_current()
			  ? eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
			  : -1;
	if (efd < 0) {
		/* a plain thread, or no descriptor left: the work is done
		 * here rather than refused */
		fn(arg);
		return false;
	}
	pthread_once(&pool.once, start_helpers);
	offload_job j = {.fn = fn, .arg = arg, .efd = efd};
	atomic_fetch_add(&pool.pending, 1);
	enqueue(&j);
	uint64_t v;
	while (read(efd, &v, sizeof v) != sizeof v) {
		ALWAYS_ASSERT(errno == EAGAIN || errno == EINTR);
		(void)fiber_wait_fd(efd, FIBER_IN, -1);
	}
	close(efd);
	return true;
}

unsigned long offload_jobs(void)
{
	return atomic_load(&pool.jobs);
}

int offload_pending(void)
{
	return atomic_load(&pool.pending);
}

static double read_pending(void *arg) { return offload_pending(); }
static double read_jobs(void *arg) { return (double)offload_jobs(); }

void offload_publish(void)
{
	metrics_reading_bind(
		metrics_reading_add(
			"idemproxy_offload_pending", "gauge",
			"CPU work handed to helper threads and not done yet "
			"(decoding stored bodies, canonical JSON of large "
			"bodies).",
			"", read_pending),
		NULL);
	metrics_reading_bind(
		metrics_reading_add("idemproxy_offload_jobs_total", "counter",
				    "CPU work done by helper threads instead "
				    "of the serving thread.",
				    "", read_jobs),
		NULL);
}
