#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "fiber.h"
#include "worker.h"

/* Items are indexes into a table of counters: each must be handled once. */
#define N_ITEMS 20000
static atomic_int handled[N_ITEMS];
static atomic_int handled_total;
static atomic_int gate_open; /* 0: handle() blocks until it is set */
static atomic_int in_handle;
static atomic_int most_in_handle;
static atomic_int finished_workers;

/* A worker waits through the scheduler, as a request does. */
static void pause_us(int us)
{
	fiber_wait_fds(0, NULL, NULL, NULL, mono_ms() + us / 1000.0);
}

static worker_pool *start(int workers, int queue, const worker_ops *o)
{
	return worker_pool_start(workers, queue, o, 64 * 1024);
}

static void *init(void *arg, int index)
{
	(void)arg;
	return (void *)(intptr_t)(index + 1);
}

static void handle(void *ctx, void *item)
{
	assert_true((intptr_t)ctx > 0);
	assert_non_null(fiber_current());
	int now = atomic_fetch_add(&in_handle, 1) + 1;
	int most = atomic_load(&most_in_handle);
	while (now > most &&
	       !atomic_compare_exchange_weak(&most_in_handle, &most, now))
		;
	while (!atomic_load(&gate_open))
		pause_us(200);
	if ((intptr_t)item % 16 == 0)
		pause_us(100); /* an item that waits, as a request does */
	atomic_fetch_add(&handled[(intptr_t)item - 1], 1);
	atomic_fetch_add(&handled_total, 1);
	atomic_fetch_sub(&in_handle, 1);
}

static void fini(void *ctx)
{
	(void)ctx;
	atomic_fetch_add(&finished_workers, 1);
}

static const worker_ops ops = {init, handle, fini, NULL};

static void reset(int open)
{
	for (int i = 0; i < N_ITEMS; i++)
		atomic_store(&handled[i], 0);
	atomic_store(&handled_total, 0);
	atomic_store(&gate_open, open);
	atomic_store(&in_handle, 0);
	atomic_store(&most_in_handle, 0);
	atomic_store(&finished_workers, 0);
}

typedef struct producer {
	worker_pool *p;
	int first, n;
} producer;

static void *produce(void *arg)
{
	producer *pr = arg;
	for (int i = pr->first; i < pr->first + pr->n; i++) {
		while (!worker_pool_submit(pr->p, (void *)(intptr_t)(i + 1)))
			usleep(50); /* full: retry, as a client would */
	}
	return NULL;
}

/* Four producer threads, eight workers, a small queue: every item is
 * handled exactly once, whether it was handed to an idle worker or queued;
 * items that wait let the others run meanwhile, on the one thread. */
static void test_every_item_once(void **state)
{
	(void)state;
	reset(1);
	worker_pool *p = start(8, 4, &ops);
	pthread_t t[4];
	producer pr[4];
	for (int i = 0; i < 4; i++) {
		pr[i] = (producer){p, i * (N_ITEMS / 4), N_ITEMS / 4};
		assert_int_equal(pthread_create(&t[i], NULL, produce, &pr[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	worker_pool_stop(p);
	assert_int_equal(atomic_load(&handled_total), N_ITEMS);
	for (int i = 0; i < N_ITEMS; i++)
		assert_int_equal(atomic_load(&handled[i]), 1);
	assert_int_equal(atomic_load(&finished_workers), 8);
	assert_true(atomic_load(&most_in_handle) > 1);
}

/* With every worker busy, queue_size more wait and the next is refused;
 * busy counts both; stop lets the queued ones finish. */
static void test_bound_busy_and_drain(void **state)
{
	(void)state;
	reset(0);
	worker_pool *p = start(2, 3, &ops);
	assert_true(worker_pool_submit(p, (void *)1));
	assert_true(worker_pool_submit(p, (void *)2));
	while (atomic_load(&in_handle) < 2)
		usleep(200);
	for (int i = 3; i <= 5; i++)
		assert_true(worker_pool_submit(p, (void *)(intptr_t)i));
	assert_false(worker_pool_submit(p, (void *)6));
	assert_int_equal(worker_pool_busy(p), 5);
	atomic_store(&gate_open, 1);
	worker_pool_stop(p);
	assert_int_equal(atomic_load(&handled_total), 5);
	for (int i = 0; i < 5; i++)
		assert_int_equal(atomic_load(&handled[i]), 1);
	assert_int_equal(atomic_load(&handled[5]), 0);
}

/* Workers that were idle all along stop at once. */
static void test_stop_idle(void **state)
{
	(void)state;
	reset(1);
	worker_pool *p = start(4, 8, &ops);
	usleep(20000); /* let them go idle */
	assert_int_equal(worker_pool_busy(p), 0);
	worker_pool_stop(p);
	assert_int_equal(atomic_load(&finished_workers), 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_item_once),
		cmocka_unit_test(test_bound_busy_and_drain),
		cmocka_unit_test(test_stop_idle),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
