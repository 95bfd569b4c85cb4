/* What systemd is told about the process (sd_notify(3), Type=notify):
 * READY=1 once it serves, RELOADING=1 and READY=1 around a reload,
 * STOPPING=1 when the drain begins, a STATUS= line for `systemctl status`,
 * and WATCHDOG=1 while the serving loop is alive. Without NOTIFY_SOCKET in
 * the environment nothing is sent and nothing fails.
 *
 * Every message is sent from a thread of this module or from the main
 * thread, never from the serving loop: libsystemd's sd_notify sends on a
 * blocking socket (sendmsg with MSG_NOSIGNAL only), so a notify socket whose
 * queue is full (systemd busy) would stop the thread that sends. The loop
 * only shows it is alive, by its heartbeat (fiber_sched_lag_ms); WATCHDOG=1
 * is sent only while that heartbeat is on time, so a frozen loop stops the
 * keep-alives and systemd restarts the process. That one loop runs the
 * front end, every worker fiber and the batch lanes: its heartbeat is the
 * liveness of everything that serves clients. The main thread's own
 * messages (ready, reload, stop) may wait on a full queue; it serves no
 * client. */
#ifndef IDEMPROXY_SERVICE_H
#define IDEMPROXY_SERVICE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct service service;

typedef struct service_ops {
	/* The counts of the STATUS= line ("requests=N in_flight=N
	 * store=up"), written into buf. Called from the notifier thread:
	 * reads atomics, takes no lock the serving loop holds for long. */
	void (*counts)(void *arg, char *buf, size_t len);
	/* How late the serving loop is, in ms (0 while on time). */
	double (*loop_lag_ms)(void *arg);
	void *arg;
} service_ops;

/* Starts the notifier thread when NOTIFY_SOCKET is set (NULL otherwise:
 * every call below then does nothing). The watchdog is on when systemd
 * asked for it (WATCHDOG_USEC, and WATCHDOG_PID if set is this process):
 * WATCHDOG=1 every half of its interval while the loop's lag is below
 * that half. Logs what it found. */
service *service_start(const service_ops *ops);
/* READY=1: the listeners accept, the loop runs, the store answered. */
void service_ready(service *s);
/* RELOADING=1 with MONOTONIC_USEC (what Type=notify-reload expects),
 * before the conf is read again. */
void service_reloading(service *s);
/* READY=1 after a reload; a failed one shows in STATUS= until the next
 * good one (the old configuration stays in force). */
void service_reloaded(service *s, bool ok);
/* STOPPING=1: the drain begins. */
void service_stopping(service *s);
/* Stops the notifier thread (before what ops reads goes away). */
void service_stop(service *s);

#endif
