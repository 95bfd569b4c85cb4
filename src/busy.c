#include "busy.h"

#include <sched.h>
#include <stdatomic.h>

#include "metrics.h"
#include "util.h"

static atomic_llong budget_ms;
static atomic_int with_workers;
static atomic_ullong spent_us;

void busy_set_budget_ms(int64_t ms)
{
	atomic_store(&budget_ms, (long long)(ms > 0 ? ms : 0));
}

void busy_request_begin(void)
{
	atomic_fetch_add(&with_workers, 1);
}

void busy_request_end(void)
{
	atomic_fetch_sub(&with_workers, 1);
}

bool busy_spin(double *deadline_ms)
{
	long long b = atomic_load_explicit(&budget_ms, memory_order_relaxed);
	if (b <= 0 ||
	    atomic_load_explicit(&with_workers, memory_order_relaxed) > 1)
		return false;
	*deadline_ms = mono_ms() + (double)b;
	return true;
}

void busy_relax(void)
{
	sched_yield();
}

void busy_account(double started_ms, double deadline_ms)
{
	double end = mono_ms();
	if (end > deadline_ms)
		end = deadline_ms;
	double us = (end - started_ms) * 1000.0;
	if (us > 0)
		atomic_fetch_add_explicit(&spent_us, (unsigned long long)us,
					  memory_order_relaxed);
}

double busy_seconds_total(void)
{
	return (double)atomic_load(&spent_us) / 1e6;
}

static double read_busy(void *arg) { return busy_seconds_total(); }

void busy_publish(void)
{
	metrics_reading_bind(
		metrics_reading_add("idemproxy_busy_poll_seconds_total",
				    "counter",
				    "Time threads spent polling instead of "
				    "sleeping (busy_poll).",
				    "", read_busy),
		NULL);
}
