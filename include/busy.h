/* Busy polling (the busy_poll setting): while the proxy has at most one
 * request with a worker, the workers' scheduler (fiber.h) polls its sockets
 * instead of sleeping in the kernel, for up to busy_poll per wait.
 *
 * Why: on a virtual machine an idle vCPU is halted, and waking a thread on it
 * costs tens of microseconds per hand-off; a first attempt has about ten of
 * them (client, worker, PostgreSQL twice, upstream). A thread that never
 * sleeps is never woken. Under load every CPU is busy anyway, and spinning
 * would only take CPU from PostgreSQL, so nothing spins while two or more
 * requests are with workers. Off (0) by default: it trades CPU for latency.
 *
 * Thread-safe: the budget is an atomic, set at start and on reload. */
#ifndef IDEMPROXY_BUSY_H
#define IDEMPROXY_BUSY_H

#include <stdbool.h>
#include <stdint.h>

void busy_set_budget_ms(int64_t ms);

/* Around the handling of one request by a worker. */
void busy_request_begin(void);
void busy_request_end(void);

/* Should the scheduler poll rather than sleep? Then *deadline_ms is when
 * to give up and sleep after all. */
bool busy_spin(double *deadline_ms);

/* One pass of a polling loop: lets any other runnable thread on this CPU
 * run first. */
void busy_relax(void);
/* Adds the time a polling loop that started at started_ms polled (until now,
 * or until its deadline if it slept after that) to the busy_poll metric. */
void busy_account(double started_ms, double deadline_ms);

/* Seconds spent busy polling since start (a counter). */
double busy_seconds_total(void);
/* Adds it to /metrics; once, at start. */
void busy_publish(void);

#endif
