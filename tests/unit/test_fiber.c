#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fiber.h"

/* Fibers that each echo bytes through their own socket pair: N fibers wait
 * on N sockets at once, a thread writes to them in reverse order, and every
 * fiber must see its own byte and answer it. */
#define N_FIBERS 64

typedef struct echo {
	int fd;       /* the fiber's end */
	int rounds;
	atomic_int done;
	bool on_fiber;
	int timeouts;
} echo;

static void echo_main(void *arg)
{
	echo *e = arg;
	e->on_fiber = fiber_current() != NULL;
	for (int r = 0; r < e->rounds; r++) {
		int got = fiber_wait_fd(e->fd, FIBER_IN, ip_now_ms() + 10000);
		if (!(got & FIBER_IN)) {
			e->timeouts++;
			continue;
		}
		char c;
		assert_int_equal(read(e->fd, &c, 1), 1);
		c++;
		assert_int_equal(write(e->fd, &c, 1), 1);
	}
	atomic_store(&e->done, 1);
}

static void test_many_fibers_wait_on_their_own_sockets(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	static echo e[N_FIBERS];
	int peer[N_FIBERS];
	for (int i = 0; i < N_FIBERS; i++) {
		int sv[2];
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		e[i] = (echo){.fd = sv[0], .rounds = 20};
		peer[i] = sv[1];
		fiber_spawn(s, echo_main, &e[i]);
	}
	for (int r = 0; r < 20; r++) {
		for (int i = N_FIBERS - 1; i >= 0; i--) {
			char c = (char)(i + r);
			assert_int_equal(write(peer[i], &c, 1), 1);
		}
		for (int i = 0; i < N_FIBERS; i++) {
			char c;
			assert_int_equal(read(peer[i], &c, 1), 1);
			assert_int_equal(c, (char)(i + r + 1));
		}
	}
	fiber_sched_join(s);
	for (int i = 0; i < N_FIBERS; i++) {
		assert_true(atomic_load(&e[i].done));
		assert_true(e[i].on_fiber);
		assert_int_equal(e[i].timeouts, 0);
		close(e[i].fd);
		close(peer[i]);
	}
}

typedef struct timed {
	int fd;
	double asked_ms, waited_ms;
	int got;
} timed;

static void timed_main(void *arg)
{
	timed *t = arg;
	double t0 = ip_now_ms();
	t->got = fiber_wait_fd(t->fd, FIBER_IN, t0 + t->asked_ms);
	t->waited_ms = ip_now_ms() - t0;
}

/* A wait with nothing to read ends at its deadline, with 0; the others'
 * deadlines do not move it. */
static void test_a_wait_ends_at_its_deadline(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	int sv[3][2];
	timed t[3] = {{.asked_ms = 30}, {.asked_ms = 120}, {.asked_ms = 60}};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
		t[i].fd = sv[i][0];
		fiber_spawn(s, timed_main, &t[i]);
	}
	fiber_sched_join(s);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(t[i].got, 0);
		assert_true(t[i].waited_ms >= t[i].asked_ms - 1);
		assert_true(t[i].waited_ms < t[i].asked_ms + 1000);
		close(sv[i][0]);
		close(sv[i][1]);
	}
}

/* A parked fiber wakes on fiber_wake from another thread; a wake that
 * comes before the park is kept. */
typedef struct parker {
	_Atomic(fiber *) self;
	atomic_int parks_done;
	int rounds;
} parker;

static void parker_main(void *arg)
{
	parker *p = arg;
	atomic_store(&p->self, fiber_current());
	for (int i = 0; i < p->rounds; i++) {
		fiber_park();
		atomic_fetch_add(&p->parks_done, 1);
	}
}

static void test_park_and_wake_across_threads(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	parker p = {.rounds = 2000};
	fiber_spawn(s, parker_main, &p);
	while (!atomic_load(&p.self))
		usleep(100);
	fiber *f = atomic_load(&p.self);
	for (int i = 0; i < p.rounds; i++) {
		fiber_wake(f);
		/* every other round, wait until it has been taken: the next
		 * wake then finds it parked, or about to be */
		if (i % 2)
			while (atomic_load(&p.parks_done) <= i)
				usleep(10);
		else
			while (atomic_load(&p.parks_done) <= i)
				;
	}
	fiber_sched_join(s);
	assert_int_equal(atomic_load(&p.parks_done), p.rounds);
}

/* Code that waits the same way off a fiber: fiber_current() is NULL on a
 * plain thread. */
static void test_fiber_current_is_null_on_a_thread(void **state)
{
	(void)state;
	assert_null(fiber_current());
}

static void recurse_main(void *arg)
{
	/* 32 KiB of locals on a 256 KiB stack: a stack that was set up
	 * wrong faults here */
	volatile char big[32768];
	for (size_t i = 0; i < sizeof big; i += 512)
		big[i] = (char)i;
	*(int *)arg = big[512] == (char)512 ? 1 : 2;
	fiber_yield();
}

static void test_a_fiber_has_its_stack(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(256 * 1024);
	int ok[8] = {0};
	for (int i = 0; i < 8; i++)
		fiber_spawn(s, recurse_main, &ok[i]);
	fiber_sched_join(s);
	for (int i = 0; i < 8; i++)
		assert_int_equal(ok[i], 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_fibers_wait_on_their_own_sockets),
		cmocka_unit_test(test_a_wait_ends_at_its_deadline),
		cmocka_unit_test(test_park_and_wake_across_threads),
		cmocka_unit_test(test_fiber_current_is_null_on_a_thread),
		cmocka_unit_test(test_a_fiber_has_its_stack),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
