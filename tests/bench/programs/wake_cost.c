/* What a wake-up costs on this machine: two threads hand one byte back and
 * forth over a pair of Unix sockets, each sleeping in read(2) until the
 * other writes, for a fixed time, twice:
 *
 *   any  the scheduler places the threads (as it places idemproxy's event
 *        thread, its workers and the processes they talk to);
 *   one  both threads pinned to the first CPU this process may use.
 *
 * Prints one line of key=value pairs for run.sh and report.py:
 *   any_cpu_us, one_cpu_us   CPU (user + system, getrusage) per wake-up
 *   any_wall_us, one_wall_us elapsed time per wake-up
 *   any_n, one_n             wake-ups counted (two per round trip)
 *
 * Every figure of CPU per request in the bench includes such wake-ups: a
 * request that makes a process or thread sleep and wake pays for it. On a
 * virtual machine that halts idle CPUs, waking a thread on another CPU can
 * cost far more than on a physical one; this is the figure to read the
 * rest against.
 *
 * Usage: wake_cost [SECONDS_EACH] (default 1). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int to_peer[2], to_main[2];
static volatile int stop_flag;

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double cpu_us(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void *peer(void *arg)
{
	(void)arg;
	char c;
	for (;;) {
		if (read(to_peer[1], &c, 1) != 1)
			die("read");
		if (c == 'q')
			return NULL;
		if (write(to_main[1], &c, 1) != 1)
			die("write");
	}
}

static void pin_self(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (sched_setaffinity(0, sizeof s, &s))
		die("sched_setaffinity");
}

/* One phase: round trips for `seconds`; pin < 0 leaves placement to the
 * scheduler. */
static void phase(const char *name, double seconds, int pin)
{
	cpu_set_t all;
	if (sched_getaffinity(0, sizeof all, &all))
		die("sched_getaffinity");
	if (pin >= 0)
		pin_self(pin);
	pthread_t t;
	if (pthread_create(&t, NULL, peer, NULL))
		die("pthread_create");
	char c = 'x';
	/* warm up: both threads have run and slept once */
	for (int i = 0; i < 100; i++)
		if (write(to_peer[0], &c, 1) != 1 || read(to_main[0], &c, 1) != 1)
			die("warm-up");
	double w0 = now_us(), c0 = cpu_us(), w1;
	long trips = 0;
	do {
		for (int i = 0; i < 100; i++, trips++)
			if (write(to_peer[0], &c, 1) != 1 ||
			    read(to_main[0], &c, 1) != 1)
				die("round trip");
		w1 = now_us();
	} while (w1 - w0 < seconds * 1e6);
	double c1 = cpu_us();
	c = 'q';
	if (write(to_peer[0], &c, 1) != 1)
		die("write");
	pthread_join(t, NULL);
	if (sched_setaffinity(0, sizeof all, &all))
		die("sched_setaffinity");
	long wakes = 2 * trips;
	printf("%s_cpu_us=%.1f %s_wall_us=%.1f %s_n=%ld ", name,
	       (c1 - c0) / (double)wakes, name, (w1 - w0) / (double)wakes,
	       name, wakes);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	if (seconds <= 0)
		seconds = 1.0;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, to_peer) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, to_main))
		die("socketpair");
	cpu_set_t s;
	if (sched_getaffinity(0, sizeof s, &s))
		die("sched_getaffinity");
	int first = 0;
	while (first < CPU_SETSIZE && !CPU_ISSET(first, &s))
		first++;
	phase("any", seconds, -1);
	phase("one", seconds, first);
	printf("cpus=%d\n", CPU_COUNT(&s));
	return 0;
}
