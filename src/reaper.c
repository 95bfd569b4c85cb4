#include "reaper.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "seal.h"
#include "seal_tally.h"
#include "store_pg_durability.h"
#include "store_pg_reap.h"

/* The settings a reload may change; the thread reads them at each pass. */
typedef struct reaper_settings {
	int64_t interval_ms;
	int batch;
	int64_t statement_timeout_ms;
	char seal_active[SEAL_ID_MAX + 1]; /* "": sealing off */
	int64_t seal_warn;
	int64_t dur_interval_ms;
} reaper_settings;

struct reaper {
	store *st;
	reaper_settings set; /* under mu */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
	bool was_down;
	/* Where the walk of ended leases stands (reaper thread only): the
	 * last lease_until it walked (it starts at the beginning), and the
	 * held rows it passed that are still held (a tid[] as text). */
	char since[64];
	growbuf held;
	int64_t sweep_page; /* the sweep's next page (see store_sweep_leases) */
	char seal_warned[SEAL_ID_MAX + 1]; /* the key last warned of */
	bool clock_warned; /* the offset is beyond CLOCK_WARN_S (warned) */
	/* What the store offers for durability (durability.h) is checked
	 * when asked (start, reload: dur_why, under mu), when the
	 * connection was made again since the last check (server_id), and
	 * when dur_interval_ms has passed since the last one (dur_at,
	 * CLOCK_MONOTONIC): a standby can drop out at any moment. */
	const char *dur_why;
	const char *dur_retry; /* a check that failed (reaper thread) */
	struct timespec dur_at;
	char server_id[160];
	store_durability dur_last;
	bool dur_known;
};

/* Above this offset from the database's clock, a warning. Leases and
 * expiry never read this process's wall clock, so nothing is refused; what
 * does read it (JWT exp and nbf, log times, the reaper's timestamp metric)
 * is off by the offset. NTP keeps a healthy host within milliseconds, and
 * a leap smear moves a clock by at most half a second from an unsmeared
 * one: a second is a clock nobody keeps, and still far below a JWT
 * leeway. */
#define CLOCK_WARN_S 1.0

/* Runs one batch statement until a batch comes back less than full. */
static int drain(reaper *r, int batch,
		 int (*fn)(store *, int, int *, char *, size_t), int *total,
		 char *err, size_t errlen)
{
	*total = 0;
	for (;;) {
		int n = 0;
		if (fn(r->st, batch, &n, err, errlen))
			return -1;
		*total += n;
		if (n < batch)
			return 0;
	}
}

/* Walks the leases that ended since the last walk, a batch at a time. */
static int reap(reaper *r, int batch, int *total, char *err, size_t errlen)
{
	*total = 0;
	bool more = true;
	while (more) {
		int n = 0;
		if (store_reap_leases(r->st, batch, r->since, sizeof r->since,
				      &r->held, &n, &more, err, errlen))
			return -1;
		*total += n;
	}
	return 0;
}

/* The pages a pass sweeps: about a batch of rows' worth (a page holds a
 * few records to a few dozen). */
static int sweep_pages(int batch)
{
	return batch / 10 > 0 ? batch / 10 : 1;
}

_Static_assert(SEAL_ID_MAX <= METRICS_KEY_ID_MAX &&
		       SEAL_TALLY_MAX <= METRICS_SEAL_KEYS_MAX,
	       "the metrics keep every key id the store can name");

/* Moves this process's seal tally to the store, exports every key's
 * total, and warns (once per key) when the active key reaches warn_seals.
 * A tally that could not be written is kept for the next pass. */
static void seal_pass(reaper *r, const reaper_settings *set)
{
	seal_tally_entry add[SEAL_TALLY_MAX], all[SEAL_TALLY_MAX];
	size_t nadd = seal_tally_take(add), nall = 0;
	char err[256];
	if (store_seal_counts(r->st, add, nadd, all, SEAL_TALLY_MAX, &nall, err,
			      sizeof err)) {
		seal_tally_put_back(add, nadd);
		log_warn("reaper: seal counts not written; kept for the next "
			 "pass", "%s", err);
		return;
	}
	uint64_t active = 0;
	for (size_t i = 0; i < nall && set->seal_active[0]; i++)
		if (!strcmp(all[i].id, set->seal_active))
			active = all[i].n;
	metrics_key_count shown[SEAL_TALLY_MAX];
	for (size_t i = 0; i < nall; i++)
		shown[i] = (metrics_key_count){all[i].id, all[i].n};
	metrics_set_seal_counts(shown, nall, active, set->seal_warn);
	if (!set->seal_active[0] || active < (uint64_t)set->seal_warn ||
	    !strcmp(r->seal_warned, set->seal_active))
		return;
	log_warn("sealing key nears its nonce budget; make a new key active "
		 "(see Rotating keys)",
		 "key=%s seals=%llu warn_seals=%lld", set->seal_active,
		 (unsigned long long)active, (long long)set->seal_warn);
	snprintf(r->seal_warned, sizeof r->seal_warned, "%s",
		 set->seal_active);
}

/* The offset is exported at each pass; the log says when it goes beyond
 * CLOCK_WARN_S for sure (the reading's error taken off) and when it comes
 * back, not at every pass. */
static void clock_pass(reaper *r)
{
	double off = 0, error = 0;
	char err[256];
	if (store_clock_offset(r->st, &off, &error, err, sizeof err)) {
		log_warn("reaper: clock offset not measured", "%s", err);
		return;
	}
	metrics_set_clock_offset(off);
	if (!r->clock_warned && fabs(off) - error > CLOCK_WARN_S) {
		log_warn("clock differs from the database's",
			 "offset_s=%.3f error_s=%.3f bound_s=%.0f "
			 "(leases and expiry follow the database; JWT exp "
			 "and nbf, log times do not)",
			 off, error, CLOCK_WARN_S);
		r->clock_warned = true;
	} else if (r->clock_warned && fabs(off) + error <= CLOCK_WARN_S) {
		log_info("clock agrees with the database's again",
			 "offset_s=%.3f error_s=%.3f", off, error);
		r->clock_warned = false;
	}
}

/* Whether two store_server_id values name the same host:port. */
static bool same_server(const char *a, const char *b)
{
	const char *sa = strrchr(a, ' '), *sb = strrchr(b, ' ');
	size_t na = sa ? (size_t)(sa - a) : strlen(a);
	size_t nb = sb ? (size_t)(sb - b) : strlen(b);
	return na == nb && !strncmp(a, b, na);
}

static const char *take_dur_why(reaper *r)
{
	pthread_mutex_lock(&r->mu);
	const char *why = r->dur_why;
	r->dur_why = NULL;
	pthread_mutex_unlock(&r->mu);
	return why ? why : r->dur_retry;
}

static int64_t ms_since(struct timespec t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (int64_t)(now.tv_sec - t.tv_sec) * 1000 +
	       (now.tv_nsec - t.tv_nsec) / 1000000;
}

static const char *durability_why(reaper *r, const char *id, int64_t every)
{
	const char *why = take_dur_why(r);
	r->dur_retry = NULL;
	if (why)
		return why;
	if (strcmp(id, r->server_id))
		return same_server(id, r->server_id) ? "reconnect"
						     : "new_server";
	return ms_since(r->dur_at) >= every ? "periodic" : NULL;
}

/* A reconnect to the same server and a periodic check are logged only if
 * what the store offers changed; a check that fails is made again at the
 * next pass. */
static void durability_pass(reaper *r, int64_t every_ms)
{
	char id[sizeof r->server_id];
	store_server_id(r->st, id, sizeof id);
	const char *why = durability_why(r, id, every_ms);
	if (!why)
		return;
	clock_gettime(CLOCK_MONOTONIC, &r->dur_at);
	bool quiet = !strcmp(why, "reconnect") || !strcmp(why, "periodic");
	store_durability d;
	char err[256];
	if (store_read_durability(r->st, &d, err, sizeof err)) {
		log_warn("store durability not known; checked again at the "
			 "next reaper pass",
			 "why=%s %s", why, err);
		r->dur_retry = why;
		return;
	}
	/* The check itself may have reconnected (the connection had broken
	 * since the last one): a failover must not pass as periodic. */
	store_server_id(r->st, id, sizeof id);
	if (quiet && !same_server(id, r->server_id)) {
		why = "new_server";
		quiet = false;
	}
	snprintf(r->server_id, sizeof r->server_id, "%s", id);
	durability_report(&d, r->dur_known ? &r->dur_last : NULL, why, quiet);
	r->dur_last = d;
	r->dur_known = true;
}

static void pass(reaper *r, const reaper_settings *set)
{
	char err[256];
	store_set_statement_timeout(r->st, set->statement_timeout_ms);
	int released = 0, swept = 0, purged = 0, stripped = 0, tombs = 0;
	processing_figures fig = {0};
	if (reap(r, set->batch, &released, err, sizeof err) ||
	    store_sweep_leases(r->st, sweep_pages(set->batch), &r->sweep_page,
			       &r->held, &swept, err, sizeof err) ||
	    drain(r, set->batch, store_strip_tombstones, &stripped, err,
		  sizeof err) ||
	    drain(r, set->batch, store_purge_tombstones, &tombs, err,
		  sizeof err) ||
	    drain(r, set->batch, store_purge_expired, &purged, err,
		  sizeof err) ||
	    store_processing_stats(r->st, r->since, &r->held, &fig, err,
				   sizeof err)) {
		metrics_set_store_up(false);
		if (!r->was_down)
			log_error("reaper: store unavailable", "%s", err);
		r->was_down = true;
		return;
	}
	if (r->was_down)
		log_info("reaper: store reachable again", NULL);
	r->was_down = false;
	released += swept;
	metrics_set_store_up(true);
	purged += tombs;
	metrics_reaper(released, purged);
	metrics_reaper_tombstones(stripped, tombs);
	metrics_set_processing(fig.count, fig.oldest_age_s);
	metrics_set_held(fig.held, fig.oldest_held_age_s);
	clock_pass(r);
	seal_pass(r, set);
	durability_pass(r, set->dur_interval_ms);
	if (released || purged || stripped)
		log_info("reaper pass",
			 "released=%d purged=%d tombstoned=%d "
			 "tombstones_purged=%d processing=%lld",
			 released, purged, stripped, tombs, (long long)fig.count);
}

static struct timespec after_ms(struct timespec t, int64_t ms)
{
	t.tv_sec += ms / 1000;
	t.tv_nsec += (ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* Whether the periodic durability check is due before *ts, which then
 * becomes its time (with mu held). Not while the store is down: the pass
 * that finds it again checks on its new connection. */
static bool check_first(const reaper *r, struct timespec *ts)
{
	if (r->was_down)
		return false;
	int64_t left = r->set.dur_interval_ms - ms_since(r->dur_at);
	struct timespec now; /* the condition variable's clock */
	clock_gettime(CLOCK_MONOTONIC, &now);
	struct timespec at = after_ms(now, left > 0 ? left : 0);
	if (at.tv_sec > ts->tv_sec ||
	    (at.tv_sec == ts->tv_sec && at.tv_nsec >= ts->tv_nsec))
		return false;
	*ts = at;
	return true;
}

/* Between passes it sleeps for the interval; a reload wakes it so that a
 * new interval counts from the end of the last pass, not from the end of
 * the old interval, and checks the store's durability at once. A periodic
 * durability check due before the next pass is made on its own. */
static void *reaper_main(void *arg)
{
	reaper *r = arg;
	pthread_mutex_lock(&r->mu);
	while (!r->stopping) {
		reaper_settings set = r->set;
		pthread_mutex_unlock(&r->mu);
		pass(r, &set);
		pthread_mutex_lock(&r->mu);
		struct timespec done;
		clock_gettime(CLOCK_MONOTONIC, &done);
		while (!r->stopping) {
			if (r->dur_why) {
				int64_t every = r->set.dur_interval_ms;
				pthread_mutex_unlock(&r->mu);
				durability_pass(r, every);
				pthread_mutex_lock(&r->mu);
				continue;
			}
			struct timespec ts = after_ms(done, r->set.interval_ms);
			bool check = check_first(r, &ts);
			if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) !=
			    ETIMEDOUT)
				continue;
			if (!check)
				break;
			if (!r->dur_why)
				r->dur_why = "periodic";
		}
	}
	reaper_settings last = r->set;
	pthread_mutex_unlock(&r->mu);
	/* The front end has drained: count the last seals. */
	seal_pass(r, &last);
	return NULL;
}

static reaper_settings settings_of(const reaper_config *c)
{
	reaper_settings s = {
		.interval_ms = c->interval_ms > 0 ? c->interval_ms : 1000,
		.batch = c->batch > 0 ? c->batch : 1000,
		.statement_timeout_ms = c->statement_timeout_ms,
		.seal_warn = c->seal_warn > 0 ? c->seal_warn : 1,
		.dur_interval_ms = c->durability_interval_ms > 0
					   ? c->durability_interval_ms
					   : 30000,
	};
	snprintf(s.seal_active, sizeof s.seal_active, "%s",
		 c->seal_active ? c->seal_active : "");
	return s;
}

reaper *reaper_start(const char *db_url, const reaper_config *c,
		     bool distributed)
{
	reaper *r = xcalloc(1, sizeof *r);
	r->st = store_new(db_url, c->statement_timeout_ms);
	store_set_distributed(r->st, distributed);
	r->set = settings_of(c);
	snprintf(r->since, sizeof r->since, "-infinity");
	r->dur_why = "start";
	pthread_mutex_init(&r->mu, NULL);
	/* The interval is a duration: a step of the wall clock must not
	 * stretch or cut the wait. */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cv, &ca);
	pthread_condattr_destroy(&ca);
	ALWAYS_ASSERT(pthread_create(&r->thread, NULL, reaper_main, r) == 0);
	pthread_setname_np(r->thread, "ip-reaper");
	return r;
}

void reaper_configure(reaper *r, const reaper_config *c)
{
	pthread_mutex_lock(&r->mu);
	r->set = settings_of(c);
	r->dur_why = "reload";
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

void reaper_stop(reaper *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stopping = true;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->thread, NULL);
	store_free(r->st);
	growbuf_free(&r->held);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	free(r);
}
