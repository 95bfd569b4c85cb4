/* What systemd is told about the process: service.h. */
#include "service.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"
#include "util.h"

/* How often the STATUS= line is looked at; it is sent only when it
 * changed, so an idle process sends nothing. */
#define STATUS_EVERY_MS 1000.0

enum phase { PHASE_STARTING, PHASE_READY, PHASE_RELOADING, PHASE_STOPPING };
static const char *const phase_names[] = {"starting", "ready", "reloading",
					  "stopping"};

struct service {
	service_ops ops;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;   /* under mu */
	bool kicked; /* under mu: the STATUS= line may have changed */
	atomic_int phase;
	atomic_bool reload_failed;
	atomic_bool send_failed; /* logged once */
	/* Half the watchdog interval systemd asked for; 0: no watchdog. */
	double ping_every_ms;
	/* The notifier thread's own. */
	double next_ping, next_status;
	bool loop_late; /* the last keep-alive was withheld */
	char last[256]; /* the last STATUS= line sent */
};

static void send_state(service *s, const char *state)
{
	int r = sd_notify(0, state);
	if (r < 0 && !atomic_exchange(&s->send_failed, true))
		log_warn("cannot notify systemd; going on without it",
			 "error=\"%s\"", strerror(-r));
}

static void kick(service *s)
{
	pthread_mutex_lock(&s->mu);
	s->kicked = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* WATCHDOG=1 when its time has come and the serving loop is on time: a
 * loop later than the keep-alive period has not come round since the last
 * one, and systemd must see that. Logs when the loop falls behind and when
 * it is back; true when that changed. */
static bool watchdog_turn(service *s, double now)
{
	if (s->ping_every_ms <= 0 || now < s->next_ping)
		return false;
	s->next_ping = now + s->ping_every_ms;
	double lag = s->ops.loop_lag_ms(s->ops.arg);
	bool late = lag >= s->ping_every_ms;
	bool changed = late != s->loop_late;
	s->loop_late = late;
	if (changed && late)
		log_warn("serving loop stalled: withholding the systemd "
			 "watchdog keep-alive",
			 "lag_ms=%.0f keepalive_ms=%.0f", lag,
			 s->ping_every_ms);
	else if (changed)
		log_info("serving loop on time again: systemd watchdog "
			 "keep-alives resume",
			 NULL);
	if (!late)
		send_state(s, "WATCHDOG=1");
	return changed;
}

/* The loop's state is known only where the watchdog looks at it. */
static const char *loop_field(const service *s)
{
	if (s->ping_every_ms <= 0)
		return "";
	return s->loop_late ? " loop=stalled" : " loop=ok";
}

/* STATUS=PHASE requests=N in_flight=N store=up|down [loop=ok|stalled]
 * [reload=failed], sent when it differs from the last one sent. */
static void status_turn(service *s, double now, bool kicked)
{
	if (!kicked && now < s->next_status)
		return;
	s->next_status = now + STATUS_EVERY_MS;
	char counts[160], line[sizeof s->last];
	s->ops.counts(s->ops.arg, counts, sizeof counts);
	snprintf(line, sizeof line, "STATUS=%s %s%s%s",
		 phase_names[atomic_load(&s->phase)], counts, loop_field(s),
		 atomic_load(&s->reload_failed) ? " reload=failed" : "");
	if (!strcmp(line, s->last))
		return;
	memcpy(s->last, line, sizeof line);
	send_state(s, line);
}

/* Under mu: sleeps until the next turn is due, a kick or the stop. */
static void wait_turn(service *s)
{
	double due = s->next_status;
	if (s->ping_every_ms > 0 && s->next_ping < due)
		due = s->next_ping;
	double left = due - mono_ms();
	if (left <= 0)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t ns = (int64_t)ts.tv_nsec + (int64_t)(left * 1e6);
	ts.tv_sec += (time_t)(ns / 1000000000);
	ts.tv_nsec = (long)(ns % 1000000000);
	pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

static void *notify_main(void *arg)
{
	service *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		bool kicked = s->kicked;
		s->kicked = false;
		pthread_mutex_unlock(&s->mu);
		double now = mono_ms();
		if (watchdog_turn(s, now))
			kicked = true;
		status_turn(s, now, kicked);
		pthread_mutex_lock(&s->mu);
		if (!s->stop && !s->kicked)
			wait_turn(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* Half the interval systemd asked for, in ms; 0 when it asked for none
 * (or asked another process: WATCHDOG_PID). */
static double keepalive_ms(void)
{
	uint64_t usec = 0;
	int r = sd_watchdog_enabled(0, &usec);
	if (r < 0)
		log_warn("systemd watchdog settings unreadable; no watchdog",
			 "error=\"%s\"", strerror(-r));
	return r > 0 && usec > 0 ? (double)usec / 2000.0 : 0;
}

service *service_start(const service_ops *ops)
{
	const char *sock = getenv("NOTIFY_SOCKET");
	if (!sock || !*sock)
		return NULL;
	service *s = xcalloc(1, sizeof *s);
	s->ops = *ops;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	atomic_init(&s->phase, PHASE_STARTING);
	s->ping_every_ms = keepalive_ms();
	s->next_ping = s->next_status = mono_ms();
	log_info("notifying systemd",
		 "notify_socket=%s watchdog_keepalive_ms=%.0f", sock,
		 s->ping_every_ms);
	ALWAYS_ASSERT(pthread_create(&s->thread, NULL, notify_main, s) == 0);
	pthread_setname_np(s->thread, "ip-notify");
	return s;
}

void service_ready(service *s)
{
	if (!s)
		return;
	atomic_store(&s->phase, PHASE_READY);
	send_state(s, "READY=1");
	kick(s);
}

void service_reloading(service *s)
{
	if (!s)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	unsigned long long usec = (unsigned long long)ts.tv_sec * 1000000ULL +
				  (unsigned long long)ts.tv_nsec / 1000ULL;
	char msg[64];
	snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu", usec);
	atomic_store(&s->phase, PHASE_RELOADING);
	send_state(s, msg);
	kick(s);
}

void service_reloaded(service *s, bool ok)
{
	if (!s)
		return;
	atomic_store(&s->reload_failed, !ok);
	atomic_store(&s->phase, PHASE_READY);
	send_state(s, "READY=1");
	kick(s);
}

void service_stopping(service *s)
{
	if (!s)
		return;
	atomic_store(&s->phase, PHASE_STOPPING);
	send_state(s, "STOPPING=1");
	kick(s);
}

void service_stop(service *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
