#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "fiber.h"
#include "offload.h"

/* A job that lasts until another fiber of the same scheduler has run: it
 * can end only if the scheduler's thread is free while it runs. It gives
 * up after 10 s so that a regression fails instead of hanging. */
typedef struct shared {
	atomic_int other_ran;
	int order[2], n;
	pthread_t sched_thread, job_thread;
	bool saw_other;
	bool helped;
} shared;

static void long_job(void *arg)
{
	shared *s = arg;
	s->job_thread = pthread_self();
	for (int i = 0; i < 10000 && !atomic_load(&s->other_ran); i++)
		nanosleep(&(struct timespec){0, 1000000}, NULL);
	s->saw_other = atomic_load(&s->other_ran);
}

static void heavy_main(void *arg)
{
	shared *s = arg;
	s->sched_thread = pthread_self();
	s->helped = offload_run(long_job, s);
	s->order[s->n++] = 1;
}

static void other_main(void *arg)
{
	shared *s = arg;
	fiber_yield(); /* let the heavy fiber hand its job over first */
	s->order[s->n++] = 2;
	atomic_store(&s->other_ran, 1);
}

static void test_a_fiber_waits_for_its_job_while_others_run(void **state)
{
	(void)state;
	static shared s;
	unsigned long before = offload_jobs();
	fiber_sched *sc = fiber_sched_start(64 * 1024);
	fiber_spawn(sc, heavy_main, &s);
	fiber_spawn(sc, other_main, &s);
	fiber_sched_join(sc);
	assert_true(s.helped);
	assert_true(s.saw_other);
	assert_int_equal(s.n, 2);
	assert_int_equal(s.order[0], 2); /* the other fiber finished first */
	assert_int_equal(s.order[1], 1);
	assert_false(pthread_equal(s.job_thread, s.sched_thread));
	assert_int_equal(offload_jobs() - before, 1);
}

static void note_thread(void *arg)
{
	*(pthread_t *)arg = pthread_self();
}

/* A plain thread holds up no one else and does the work itself. */
static void test_on_a_plain_thread_the_job_runs_in_place(void **state)
{
	(void)state;
	pthread_t t;
	unsigned long before = offload_jobs();
	assert_false(offload_run(note_thread, &t));
	assert_true(pthread_equal(t, pthread_self()));
	assert_int_equal(offload_jobs(), before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_fiber_waits_for_its_job_while_others_run),
		cmocka_unit_test(test_on_a_plain_thread_the_job_runs_in_place),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
