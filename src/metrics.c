#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* Counters and histograms are kept per thread: each thread writes only its
 * own shard, without a lock (relaxed atomics, so a scrape reads whole
 * values), and /metrics sums the shards under the lock that guards their
 * list. The few series a thread cannot fit in its shard, and the gauges,
 * go to the process-wide table under that lock. */
#define MAX_SERIES 4096
#define SHARD_SERIES 256

typedef struct series {
	const char *family;  /* static string */
	char labels[160];    /* rendered: route="x",outcome="y" */
	uint64_t value;
} series;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static series table[MAX_SERIES];
static int nseries;

static const double buckets_s[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
				   0.005,  0.01,    0.025,  0.05,  0.1,
				   0.25,   0.5,     1,      2.5,   5,
				   10,     30};
#define NBUCKETS (sizeof buckets_s / sizeof buckets_s[0])

typedef struct histogram {
	const char *name;
	const char *help;
	uint64_t counts[NBUCKETS + 1];
	double sum;
	uint64_t count;
} histogram;

/* One thread's share: a series is its family and its label values (a
 * rendered set of labels is only built at scrape). */
typedef struct shard_series {
	const char *family;
	char a[64], b[64];
	_Atomic uint64_t value;
} shard_series;

typedef struct shard_hist {
	_Atomic uint64_t counts[NBUCKETS + 1];
	_Atomic uint64_t sum_ns;
} shard_hist;

enum { H_REQUEST, H_STORE, H_UPSTREAM, H_WAIT, N_HIST };

typedef struct shard {
	shard_series s[SHARD_SERIES];
	atomic_int n; /* published entries of s, release/acquire */
	shard_hist h[N_HIST];
	struct shard *next;
} shard;

static shard *shards; /* under mu; shards live as long as the process */
static __thread shard *my_shard_p;

static shard *my_shard(void)
{
	if (!my_shard_p) {
		shard *sh = xcalloc(1, sizeof *sh);
		pthread_mutex_lock(&mu);
		sh->next = shards;
		shards = sh;
		pthread_mutex_unlock(&mu);
		my_shard_p = sh;
	}
	return my_shard_p;
}

/* Only the owner writes: a load and a store, no locked instruction. */
static void bump(_Atomic uint64_t *v, uint64_t n)
{
	atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

static histogram h_request = {"idemproxy_request_duration_seconds",
			      "Time from a complete request to its answer.",
			      {0}, 0, 0};
static histogram h_store = {"idemproxy_store_duration_seconds",
			    "Time of one store call (claim, record).",
			    {0}, 0, 0};
static histogram h_upstream = {"idemproxy_upstream_duration_seconds",
			       "Time of one upstream exchange.",
			       {0}, 0, 0};

static histogram h_wait = {"idemproxy_wait_duration_seconds",
			   "Time a duplicate waited for the attempt in flight.",
			   {0}, 0, 0};

static int64_t g_processing;
static int g_waiters;
static double g_oldest_age;
static int64_t g_held;
static double g_oldest_held_age;
static int g_store_up;
static bool g_clock_measured;
static double g_clock_offset;
static struct {
	bool known;
	int standbys;
	bool counted;
	char commit[16];
} g_durability;
static uint64_t reaper_released, reaper_purged;
static uint64_t reaper_tombstoned, reaper_tombstones_purged;
static double reaper_last_success;
static uint64_t cache_entries, cache_bytes;
static struct {
	char id[METRICS_KEY_ID_MAX + 1];
	uint64_t n;
} seal_counts[METRICS_SEAL_KEYS_MAX];
static size_t n_seal_counts;
static uint64_t seal_active;
static int64_t seal_warn_at = INT64_C(2147483648);

/* Label values are route names (validated by the loader) and fixed words;
 * still, never let a quote or backslash break the exposition. */
static void label_copy(char *out, size_t n, const char *v)
{
	size_t k = 0;
	for (; v && *v && k + 1 < n; v++)
		if (*v != '"' && *v != '\\' && *v != '\n')
			out[k++] = *v;
	out[k] = '\0';
}

/* Called with mu held. */
static void add_locked(const char *family, const char *labels, uint64_t n)
{
	for (int i = 0; i < nseries; i++) {
		if (table[i].family == family &&
		    !strcmp(table[i].labels, labels)) {
			table[i].value += n;
			return;
		}
	}
	if (nseries < MAX_SERIES) {
		table[nseries].family = family;
		snprintf(table[nseries].labels, sizeof table[nseries].labels,
			 "%s", labels);
		table[nseries].value = n;
		nseries++;
	}
}

static void add(const char *family, const char *labels, uint64_t n)
{
	pthread_mutex_lock(&mu);
	add_locked(family, labels, n);
	pthread_mutex_unlock(&mu);
}

static const char F_REQUESTS[] = "idemproxy_requests_total";
static const char F_UPSTREAM[] = "idemproxy_upstream_responses_total";
static const char F_TAKEOVERS[] = "idemproxy_takeovers_total";
static const char F_TOMBSTONES[] = "idemproxy_tombstone_answers_total";
static const char F_EVENTS[] = "idemproxy_events_total";
static const char F_WAITS[] = "idemproxy_wait_outcomes_total";
static const char F_BATCHES[] = "idemproxy_store_batches_total";
static const char F_BATCHED[] = "idemproxy_store_batched_total";

void metrics_wait_outcome(const char *route, const char *outcome)
{
	char r[64], o[64], l[160];
	label_copy(r, sizeof r, route ? route : "");
	label_copy(o, sizeof o, outcome);
	snprintf(l, sizeof l, "route=\"%s\",outcome=\"%s\"", r, o);
	add(F_WAITS, l, 1);
}

struct metrics_reading {
	const char *family, *type, *help, *labels;
	metrics_read_fn read;
	void *arg;
	bool bound;
};

/* Under mu. */
static metrics_reading readings[METRICS_MAX_READINGS];
static int nreadings;

metrics_reading *metrics_reading_add(const char *family, const char *type,
				     const char *help, const char *labels,
				     metrics_read_fn read)
{
	pthread_mutex_lock(&mu);
	metrics_reading *r = NULL;
	if (nreadings < METRICS_MAX_READINGS) {
		r = &readings[nreadings++];
		*r = (metrics_reading){family, type, help, labels, read, NULL,
				       false};
	}
	pthread_mutex_unlock(&mu);
	return r;
}

void metrics_reading_bind(metrics_reading *r, void *arg)
{
	if (!r)
		return;
	pthread_mutex_lock(&mu);
	r->arg = arg;
	r->bound = true;
	pthread_mutex_unlock(&mu);
}

void metrics_reading_unbind(metrics_reading *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&mu);
	r->arg = NULL;
	r->bound = false;
	pthread_mutex_unlock(&mu);
}

bool metrics_read(const char *family, double *v)
{
	bool known = false;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nreadings; i++)
		if (!strcmp(readings[i].family, family)) {
			known = readings[i].bound;
			if (known)
				*v = readings[i].read(readings[i].arg);
			break;
		}
	pthread_mutex_unlock(&mu);
	return known;
}

void metrics_set_waiters(int n)
{
	pthread_mutex_lock(&mu);
	g_waiters = n;
	pthread_mutex_unlock(&mu);
}

/* The labels of a family's series from its values. */
static void render_labels(char *l, size_t n, const char *family,
			  const char *a, const char *b)
{
	if (family == F_REQUESTS)
		snprintf(l, n, "route=\"%s\",outcome=\"%s\"", a, b);
	else if (family == F_UPSTREAM)
		snprintf(l, n, "route=\"%s\",class=\"%s\"", a, b);
	else if (family == F_TAKEOVERS || family == F_TOMBSTONES)
		snprintf(l, n, "route=\"%s\"", a);
	else if (family == F_BATCHES || family == F_BATCHED)
		snprintf(l, n, "kind=\"%s\"", a);
	else
		snprintf(l, n, "event=\"%s\"", a);
}

/* Counts n in this thread's shard; a b of NULL is no second label. */
static void count_n(const char *family, const char *a_raw, const char *b_raw,
		    uint64_t by)
{
	char a[64], b[64];
	label_copy(a, sizeof a, a_raw ? a_raw : "");
	label_copy(b, sizeof b, b_raw ? b_raw : "");
	shard *sh = my_shard();
	int n = atomic_load_explicit(&sh->n, memory_order_relaxed);
	for (int i = 0; i < n; i++) {
		shard_series *x = &sh->s[i];
		if (x->family == family && !strcmp(x->a, a) &&
		    !strcmp(x->b, b)) {
			bump(&x->value, by);
			return;
		}
	}
	if (n < SHARD_SERIES) {
		shard_series *x = &sh->s[n];
		x->family = family;
		memcpy(x->a, a, sizeof a);
		memcpy(x->b, b, sizeof b);
		atomic_store_explicit(&x->value, by, memory_order_relaxed);
		atomic_store_explicit(&sh->n, n + 1, memory_order_release);
		return;
	}
	char l[160];
	render_labels(l, sizeof l, family, a, b);
	add(family, l, by);
}

static void count(const char *family, const char *a, const char *b)
{
	count_n(family, a, b, 1);
}

void metrics_store_batch(const char *kind, int n)
{
	count(F_BATCHES, kind, NULL);
	count_n(F_BATCHED, kind, NULL, (uint64_t)n);
}

/* Every request answered, whatever its route and outcome: the STATUS=
 * line reads it without the lock. */
static atomic_ullong g_answered;

void metrics_request(const char *route, const char *outcome)
{
	count(F_REQUESTS, route, outcome);
	atomic_fetch_add_explicit(&g_answered, 1, memory_order_relaxed);
}

uint64_t metrics_requests_answered(void)
{
	return atomic_load_explicit(&g_answered, memory_order_relaxed);
}

void metrics_upstream_response(const char *route, int status)
{
	static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx",
					      "5xx"};
	count(F_UPSTREAM, route,
	      status >= 100 && status < 600 ? classes[status / 100 - 1]
					    : "error");
}

void metrics_takeover(const char *route)
{
	count(F_TAKEOVERS, route, NULL);
}

void metrics_tombstone_answer(const char *route)
{
	count(F_TOMBSTONES, route, NULL);
}

/* The outcomes and the class the alert rules select by route. */
static const char *const alert_outcomes[] = {
	"in_flight", "mismatch", "store_unavailable", "upstream_unavailable",
	"outcome_unknown"};

void metrics_known_route(const char *route)
{
	char r[64], l[160];
	label_copy(r, sizeof r, route);
	pthread_mutex_lock(&mu);
	render_labels(l, sizeof l, F_TAKEOVERS, r, NULL);
	add_locked(F_TAKEOVERS, l, 0);
	for (size_t i = 0;
	     i < sizeof alert_outcomes / sizeof *alert_outcomes; i++) {
		render_labels(l, sizeof l, F_REQUESTS, r, alert_outcomes[i]);
		add_locked(F_REQUESTS, l, 0);
	}
	render_labels(l, sizeof l, F_UPSTREAM, r, "5xx");
	add_locked(F_UPSTREAM, l, 0);
	pthread_mutex_unlock(&mu);
}

void metrics_event(const char *name)
{
	count(F_EVENTS, name, NULL);
}

void metrics_reaper(int released, int purged)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	pthread_mutex_lock(&mu);
	reaper_released += (uint64_t)released;
	reaper_purged += (uint64_t)purged;
	reaper_last_success = (double)ts.tv_sec + ts.tv_nsec / 1e9;
	pthread_mutex_unlock(&mu);
}

void metrics_reaper_tombstones(int stripped, int purged)
{
	pthread_mutex_lock(&mu);
	reaper_tombstoned += (uint64_t)stripped;
	reaper_tombstones_purged += (uint64_t)purged;
	pthread_mutex_unlock(&mu);
}

void metrics_set_replay_cache(size_t entries, size_t bytes)
{
	pthread_mutex_lock(&mu);
	cache_entries = entries;
	cache_bytes = bytes;
	pthread_mutex_unlock(&mu);
}

void metrics_set_seal_counts(const metrics_key_count *e, size_t n,
			     uint64_t active, int64_t warn_at)
{
	pthread_mutex_lock(&mu);
	n_seal_counts = n < METRICS_SEAL_KEYS_MAX ? n : METRICS_SEAL_KEYS_MAX;
	for (size_t i = 0; i < n_seal_counts; i++) {
		snprintf(seal_counts[i].id, sizeof seal_counts[i].id, "%s",
			 e[i].id);
		seal_counts[i].n = e[i].n;
	}
	seal_active = active;
	seal_warn_at = warn_at;
	pthread_mutex_unlock(&mu);
}

static void observe(int which, double ms)
{
	double sec = ms / 1000.0;
	size_t i = 0;
	while (i < NBUCKETS && sec > buckets_s[i])
		i++;
	shard_hist *h = &my_shard()->h[which];
	bump(&h->counts[i], 1);
	bump(&h->sum_ns, ms > 0 ? (uint64_t)(ms * 1e6) : 0);
}

void metrics_observe_request_ms(double ms) { observe(H_REQUEST, ms); }
void metrics_observe_store_ms(double ms) { observe(H_STORE, ms); }
void metrics_observe_upstream_ms(double ms) { observe(H_UPSTREAM, ms); }
void metrics_observe_wait_ms(double ms) { observe(H_WAIT, ms); }

void metrics_set_processing(int64_t count, double oldest_age_s)
{
	pthread_mutex_lock(&mu);
	g_processing = count;
	g_oldest_age = oldest_age_s;
	pthread_mutex_unlock(&mu);
}

void metrics_set_held(int64_t count, double oldest_age_s)
{
	pthread_mutex_lock(&mu);
	g_held = count;
	g_oldest_held_age = oldest_age_s;
	pthread_mutex_unlock(&mu);
}

void metrics_set_clock_offset(double offset_s)
{
	pthread_mutex_lock(&mu);
	g_clock_measured = true;
	g_clock_offset = offset_s;
	pthread_mutex_unlock(&mu);
}

void metrics_set_store_up(bool up)
{
	pthread_mutex_lock(&mu);
	g_store_up = up ? 1 : 0;
	pthread_mutex_unlock(&mu);
}

bool metrics_store_is_up(void)
{
	pthread_mutex_lock(&mu);
	bool up = g_store_up != 0;
	pthread_mutex_unlock(&mu);
	return up;
}

void metrics_set_store_durability(int standbys, bool counted,
				  const char *synchronous_commit)
{
	pthread_mutex_lock(&mu);
	g_durability.known = true;
	g_durability.standbys = standbys;
	g_durability.counted = counted;
	label_copy(g_durability.commit, sizeof g_durability.commit,
		   synchronous_commit);
	pthread_mutex_unlock(&mu);
}

/* The process-wide table and every shard, summed (called with mu held). */
static series *merged(int *n)
{
	int cap = nseries + 64, k = nseries;
	series *v = xmalloc((size_t)cap * sizeof *v);
	memcpy(v, table, (size_t)nseries * sizeof *v);
	for (shard *sh = shards; sh; sh = sh->next) {
		int m = atomic_load_explicit(&sh->n, memory_order_acquire);
		for (int i = 0; i < m; i++) {
			const shard_series *x = &sh->s[i];
			char l[160];
			render_labels(l, sizeof l, x->family, x->a, x->b);
			uint64_t val = atomic_load_explicit(
				&x->value, memory_order_relaxed);
			int j = 0;
			while (j < k && !(v[j].family == x->family &&
					  !strcmp(v[j].labels, l)))
				j++;
			if (j == k) {
				if (k == cap) {
					cap *= 2;
					v = xrealloc(v, (size_t)cap * sizeof *v);
				}
				v[k].family = x->family;
				snprintf(v[k].labels, sizeof v[k].labels, "%s", l);
				v[k].value = 0;
				k++;
			}
			v[j].value += val;
		}
	}
	*n = k;
	return v;
}

static void render_family(growbuf *out, const series *v, int n,
			  const char *family, const char *help)
{
	growbuf_printf(out, "# HELP %s %s\n# TYPE %s counter\n", family, help,
		       family);
	for (int i = 0; i < n; i++)
		if (v[i].family == family)
			growbuf_printf(out, "%s{%s} %llu\n", family,
				       v[i].labels,
				       (unsigned long long)v[i].value);
}

/* A histogram's shards, summed (called with mu held); its count is the
 * sum of its buckets, so the two always agree. */
static histogram merged_hist(const histogram *h, int which)
{
	histogram m = {h->name, h->help, {0}, 0, 0};
	uint64_t ns = 0;
	for (shard *sh = shards; sh; sh = sh->next) {
		const shard_hist *x = &sh->h[which];
		for (size_t i = 0; i <= NBUCKETS; i++)
			m.counts[i] += atomic_load_explicit(
				&x->counts[i], memory_order_relaxed);
		ns += atomic_load_explicit(&x->sum_ns, memory_order_relaxed);
	}
	for (size_t i = 0; i <= NBUCKETS; i++)
		m.count += m.counts[i];
	m.sum = (double)ns / 1e9;
	return m;
}

static void render_histogram(growbuf *out, const histogram *h)
{
	growbuf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", h->name,
		       h->help, h->name);
	uint64_t cum = 0;
	for (size_t i = 0; i < NBUCKETS; i++) {
		cum += h->counts[i];
		growbuf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", h->name,
			       buckets_s[i], (unsigned long long)cum);
	}
	cum += h->counts[NBUCKETS];
	growbuf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", h->name,
		       (unsigned long long)cum);
	growbuf_printf(out, "%s_sum %.6f\n%s_count %llu\n", h->name, h->sum,
		       h->name, (unsigned long long)h->count);
}

static void render_scalar(growbuf *out, const char *name, const char *type,
			  const char *help, double v)
{
	if (isnan(v)) /* the exposition format's spelling */
		growbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s NaN\n",
			       name, help, name, type, name);
	else
		growbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n",
			       name, help, name, type, name, v);
}

/* Called with mu held. */
static void render_seals(growbuf *out)
{
	growbuf_printf(out, "# HELP idemproxy_seal_key_seals Seals made under "
			   "each store_encryption key id by every instance, "
			   "as stored (updated at each reaper pass).\n"
			   "# TYPE idemproxy_seal_key_seals gauge\n");
	for (size_t i = 0; i < n_seal_counts; i++) {
		char id[METRICS_KEY_ID_MAX + 1];
		label_copy(id, sizeof id, seal_counts[i].id);
		growbuf_printf(out, "idemproxy_seal_key_seals{key=\"%s\"} "
			       "%llu\n", id,
			       (unsigned long long)seal_counts[i].n);
	}
	render_scalar(out, "idemproxy_seal_active_key_seals", "gauge",
		      "Seals made under the active key (random 96-bit nonces: "
		      "safe for about 2^32; 0: sealing off).",
		      (double)seal_active);
	render_scalar(out, "idemproxy_seal_warn_seals", "gauge",
		      "store_encryption.warn_seals: rotate the key before "
		      "the active key's seals reach it.",
		      (double)seal_warn_at);
}

/* Events an alert counts with increase(): exported at 0 from the start,
 * since a counter that first appears at 1 shows no increase. */
static const char *const known_events[] = {
	"record_failed", "record_fenced", "forwarded_unprotected",
	"replay_cache_hit", "overloaded", "record_deferred", "record_retried",
	"upstream_connection_desync", "record_unreadable", "request_timeout",
	"store_batch_failed", "lease_expired", "store_wait_timeout",
	"store_batch_late", "outcome_unrecorded"};

/* Exports at 0 the series alerts count from the start (the known events,
 * both kinds of batch), so that their rates start at 0. With mu held. */
static void seed_known_locked(void)
{
	for (size_t i = 0; i < sizeof known_events / sizeof *known_events;
	     i++) {
		char l[160];
		render_labels(l, sizeof l, F_EVENTS, known_events[i], NULL);
		add_locked(F_EVENTS, l, 0);
	}
	static const char *const kinds[] = {"claim", "record"};
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
		char l[160];
		render_labels(l, sizeof l, F_BATCHES, kinds[i], NULL);
		add_locked(F_BATCHES, l, 0);
		add_locked(F_BATCHED, l, 0);
	}
}

/* The labelled counters and the histograms. With mu held. */
static void render_counters(growbuf *out)
{
	int n;
	series *v = merged(&n);
	render_family(out, v, n, F_REQUESTS, "Requests by route and outcome.");
	render_family(out, v, n, F_UPSTREAM,
		      "Upstream responses by route and status class.");
	render_family(out, v, n, F_TAKEOVERS,
		      "Keys taken over from a released or expired attempt.");
	render_family(out, v, n, F_TOMBSTONES,
		      "Retries refused because their key is a tombstone "
		      "(idempotency_key_expired).");
	render_family(out, v, n, F_EVENTS,
		      "Notable events (record_failed, record_fenced, ...).");
	render_family(out, v, n, F_WAITS,
		      "How waiting duplicates ended, by route and outcome.");
	render_family(out, v, n, F_BATCHES,
		      "Statements that claimed (kind claim) or recorded (kind "
		      "record) several first attempts at once.");
	render_family(out, v, n, F_BATCHED,
		      "First attempts those statements carried (divided by "
		      "idemproxy_store_batches_total: the mean batch).");
	free(v);
	histogram hs[N_HIST] = {merged_hist(&h_request, H_REQUEST),
				merged_hist(&h_store, H_STORE),
				merged_hist(&h_upstream, H_UPSTREAM),
				merged_hist(&h_wait, H_WAIT)};
	for (int i = 0; i < N_HIST; i++)
		render_histogram(out, &hs[i]);
}

/* The readings their owners added, in the order added. With mu held. */
static void render_readings(growbuf *out)
{
	for (int i = 0; i < nreadings; i++) {
		const metrics_reading *r = &readings[i];
		if (i == 0 || strcmp(readings[i - 1].family, r->family))
			growbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n",
				       r->family, r->help, r->family, r->type);
		double v = r->bound ? r->read(r->arg) : 0.0;
		if (r->labels[0])
			growbuf_printf(out, "%s{%s} %.15g\n", r->family,
				       r->labels, v);
		else
			growbuf_printf(out, "%s %.15g\n", r->family, v);
	}
}

/* The values set through metrics_set_* and metrics_reaper. With mu held. */
static void render_set_values(growbuf *out)
{
	render_scalar(out, "idemproxy_waiters", "gauge",
		      "Duplicates waiting for an attempt in flight.",
		      (double)g_waiters);
	render_scalar(out, "idemproxy_reaper_released_total", "counter",
		      "Processing records released by the reaper.",
		      (double)reaper_released);
	render_scalar(out, "idemproxy_reaper_purged_total", "counter",
		      "Expired records deleted by the reaper.",
		      (double)reaper_purged);
	render_scalar(out, "idemproxy_reaper_tombstoned_total", "counter",
		      "Completed records whose response the reaper deleted, "
		      "keeping the key until retain_key (tombstones).",
		      (double)reaper_tombstoned);
	render_scalar(out, "idemproxy_reaper_tombstones_purged_total",
		      "counter",
		      "Tombstones deleted by the reaper at retain_key (also "
		      "counted in idemproxy_reaper_purged_total).",
		      (double)reaper_tombstones_purged);
	render_scalar(out, "idemproxy_reaper_last_success_timestamp_seconds",
		      "gauge",
		      "Unix time the reaper last completed a pass (0: never).",
		      reaper_last_success);
	render_scalar(out, "idemproxy_processing_records", "gauge",
		      "Records in state processing.", (double)g_processing);
	render_scalar(out, "idemproxy_oldest_processing_age_seconds", "gauge",
		      "Age of the oldest processing attempt.", g_oldest_age);
	render_scalar(out, "idemproxy_held_records", "gauge",
		      "Processing records held for an operator (on_unknown "
		      "hold, lease ended); counted in "
		      "idemproxy_processing_records too.",
		      (double)g_held);
	render_scalar(out, "idemproxy_oldest_held_age_seconds", "gauge",
		      "Age of the oldest held attempt.", g_oldest_held_age);
	render_scalar(out, "idemproxy_store_up", "gauge",
		      "1 when the last store call succeeded.",
		      (double)g_store_up);
	/* NaN until the first pass measures it: no alert fires on it. */
	render_scalar(out, "idemproxy_store_clock_offset_seconds", "gauge",
		      "This instance's wall clock minus the database's "
		      "(at each reaper pass; NaN before the first).",
		      g_clock_measured ? g_clock_offset : NAN);
	render_scalar(out, "idemproxy_replay_cache_entries", "gauge",
		      "Responses held in the replay cache.",
		      (double)cache_entries);
	render_scalar(out, "idemproxy_replay_cache_bytes", "gauge",
		      "Bytes held in the replay cache.", (double)cache_bytes);
}

/* The synchronous_commit levels, one series each (1 on the one in force),
 * so that a level that changes leaves no stale series behind. */
static const char *const commit_levels[] = {"off", "local", "remote_write",
					    "on", "remote_apply"};

/* With mu held; nothing before the first check. */
static void render_durability(growbuf *out)
{
	if (!g_durability.known)
		return;
	render_scalar(out, "idemproxy_store_synchronous_standbys", "gauge",
		      "Synchronous standbys a commit of the store waits for "
		      "(0: a failover can lose acknowledged records).",
		      (double)g_durability.standbys);
	render_scalar(out, "idemproxy_store_synchronous_standbys_counted",
		      "gauge",
		      "1: standbys counted in pg_stat_replication; 0: taken "
		      "from synchronous_standby_names (the role cannot see "
		      "sync_state).",
		      g_durability.counted ? 1.0 : 0.0);
	growbuf_puts(out, "# HELP idemproxy_store_synchronous_commit The "
			  "store's synchronous_commit for the proxy's "
			  "sessions (1 on the level in force).\n"
			  "# TYPE idemproxy_store_synchronous_commit gauge\n");
	size_t n = sizeof commit_levels / sizeof *commit_levels;
	for (size_t i = 0; i < n; i++) {
		const char *l = commit_levels[i];
		growbuf_printf(out, "%s{level=\"%s\"} %d\n",
			       "idemproxy_store_synchronous_commit", l,
			       !strcmp(l, g_durability.commit));
	}
}

void metrics_render(growbuf *out)
{
	pthread_mutex_lock(&mu);
	seed_known_locked();
	render_counters(out);
	render_scalar(out, "idemproxy_log_lines_dropped_total", "counter",
		      "Log lines dropped because stderr was not read and the "
		      "log buffer was full.",
		      (double)log_lines_dropped());
	render_readings(out);
	render_set_values(out);
	render_durability(out);
	render_seals(out);
	pthread_mutex_unlock(&mu);
}
