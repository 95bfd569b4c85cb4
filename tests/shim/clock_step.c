/* A wall clock stepped away from the kernel's, preloaded into the proxy by
 * tests:
 *
 *   LD_PRELOAD=build/clock_step.so
 *   IDEMPROXY_SHIM_CLOCK_STEP_S=3600     clock_gettime(CLOCK_REALTIME)
 *                                        reads this many seconds ahead
 *                                        (negative: behind)
 *
 * A deadline computed from that clock and handed to a wait that measures
 * the kernel's realtime clock (pthread_cond_timedwait on a condition
 * variable of the default clock) then ends as it would had the clock been
 * stepped by as much just after the deadline was computed: the step NTP,
 * an operator or a resumed virtual machine makes. libfaketime cannot show
 * this, since it moves those waits' deadlines with the clock.
 * gettimeofday and time are left alone. The real clock is read by a system
 * call: no dlsym, no allocation (jemalloc reads the clock while it starts).
 * No state but the environment. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_gettime(clockid_t clk, struct timespec *ts)
{
	long rc = syscall(SYS_clock_gettime, clk, ts);
	if (rc == 0 &&
	    (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
		const char *s = getenv("IDEMPROXY_SHIM_CLOCK_STEP_S");
		ts->tv_sec += s ? atol(s) : 0;
	}
	return (int)rc;
}
