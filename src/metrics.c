#include "metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "busy.h"

/* Labelled counters live in a small open table keyed by family and labels;
 * the set of routes is small and stable, so a linear scan under one mutex is
 * cheap next to a database round trip. */
#define MAX_SERIES 4096

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
static int g_store_up;
static uint64_t reaper_released, reaper_purged;
static double reaper_last_success;
static uint64_t cache_entries, cache_bytes;

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
static const char F_EVENTS[] = "idemproxy_events_total";
static const char F_WAITS[] = "idemproxy_wait_outcomes_total";

void metrics_wait_outcome(const char *route, const char *outcome)
{
	char r[64], o[64], l[160];
	label_copy(r, sizeof r, route ? route : "");
	label_copy(o, sizeof o, outcome);
	snprintf(l, sizeof l, "route=\"%s\",outcome=\"%s\"", r, o);
	add(F_WAITS, l, 1);
}

void metrics_set_waiters(int n)
{
	pthread_mutex_lock(&mu);
	g_waiters = n;
	pthread_mutex_unlock(&mu);
}

void metrics_request(const char *route, const char *outcome)
{
	char r[64], o[64], l[160];
	label_copy(r, sizeof r, route ? route : "");
	label_copy(o, sizeof o, outcome);
	snprintf(l, sizeof l, "route=\"%s\",outcome=\"%s\"", r, o);
	add(F_REQUESTS, l, 1);
}

void metrics_upstream_response(const char *route, int status)
{
	char r[64], l[160];
	label_copy(r, sizeof r, route ? route : "");
	if (status >= 100 && status < 600)
		snprintf(l, sizeof l, "route=\"%s\",class=\"%dxx\"", r,
			 status / 100);
	else
		snprintf(l, sizeof l, "route=\"%s\",class=\"error\"", r);
	add(F_UPSTREAM, l, 1);
}

void metrics_takeover(const char *route)
{
	char r[64], l[160];
	label_copy(r, sizeof r, route ? route : "");
	snprintf(l, sizeof l, "route=\"%s\"", r);
	add(F_TAKEOVERS, l, 1);
}

void metrics_event(const char *name)
{
	char e[64], l[160];
	label_copy(e, sizeof e, name);
	snprintf(l, sizeof l, "event=\"%s\"", e);
	add(F_EVENTS, l, 1);
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

void metrics_set_replay_cache(size_t entries, size_t bytes)
{
	pthread_mutex_lock(&mu);
	cache_entries = entries;
	cache_bytes = bytes;
	pthread_mutex_unlock(&mu);
}

static void observe(histogram *h, double ms)
{
	double s = ms / 1000.0;
	pthread_mutex_lock(&mu);
	size_t i = 0;
	while (i < NBUCKETS && s > buckets_s[i])
		i++;
	h->counts[i]++;
	h->sum += s;
	h->count++;
	pthread_mutex_unlock(&mu);
}

void metrics_observe_request_ms(double ms) { observe(&h_request, ms); }
void metrics_observe_store_ms(double ms) { observe(&h_store, ms); }
void metrics_observe_upstream_ms(double ms) { observe(&h_upstream, ms); }
void metrics_observe_wait_ms(double ms) { observe(&h_wait, ms); }

void metrics_set_processing(int64_t count, double oldest_age_s)
{
	pthread_mutex_lock(&mu);
	g_processing = count;
	g_oldest_age = oldest_age_s;
	pthread_mutex_unlock(&mu);
}

void metrics_set_store_up(bool up)
{
	pthread_mutex_lock(&mu);
	g_store_up = up ? 1 : 0;
	pthread_mutex_unlock(&mu);
}

static void render_family(ip_buf *out, const char *family, const char *help)
{
	ip_buf_printf(out, "# HELP %s %s\n# TYPE %s counter\n", family, help,
		      family);
	for (int i = 0; i < nseries; i++)
		if (table[i].family == family)
			ip_buf_printf(out, "%s{%s} %llu\n", family,
				      table[i].labels,
				      (unsigned long long)table[i].value);
}

static void render_histogram(ip_buf *out, const histogram *h)
{
	ip_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", h->name,
		      h->help, h->name);
	uint64_t cum = 0;
	for (size_t i = 0; i < NBUCKETS; i++) {
		cum += h->counts[i];
		ip_buf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", h->name,
			      buckets_s[i], (unsigned long long)cum);
	}
	cum += h->counts[NBUCKETS];
	ip_buf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", h->name,
		      (unsigned long long)cum);
	ip_buf_printf(out, "%s_sum %.6f\n%s_count %llu\n", h->name, h->sum,
		      h->name, (unsigned long long)h->count);
}

static void render_scalar(ip_buf *out, const char *name, const char *type,
			  const char *help, double v)
{
	ip_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", name, help,
		      name, type, name, v);
}

/* Events an alert counts with increase(): exported at 0 from the start,
 * since a counter that first appears at 1 shows no increase. */
static const char *const known_events[] = {
	"record_failed", "record_fenced", "forwarded_unprotected",
	"replay_cache_hit", "overloaded", "record_deferred", "record_retried",
	"upstream_connection_desync", "record_unreadable"};

void metrics_render(ip_buf *out)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < sizeof known_events / sizeof *known_events;
	     i++) {
		char l[160];
		snprintf(l, sizeof l, "event=\"%s\"", known_events[i]);
		add_locked(F_EVENTS, l, 0);
	}
	render_family(out, F_REQUESTS, "Requests by route and outcome.");
	render_family(out, F_UPSTREAM,
		      "Upstream responses by route and status class.");
	render_family(out, F_TAKEOVERS,
		      "Keys taken over from a released or expired attempt.");
	render_family(out, F_EVENTS,
		      "Notable events (record_failed, record_fenced, ...).");
	render_histogram(out, &h_request);
	render_histogram(out, &h_store);
	render_histogram(out, &h_upstream);
	render_family(out, F_WAITS,
		      "How waiting duplicates ended, by route and outcome.");
	render_histogram(out, &h_wait);
	render_scalar(out, "idemproxy_waiters", "gauge",
		      "Duplicates waiting for an attempt in flight.",
		      (double)g_waiters);
	render_scalar(out, "idemproxy_reaper_released_total", "counter",
		      "Processing records released by the reaper.",
		      (double)reaper_released);
	render_scalar(out, "idemproxy_reaper_purged_total", "counter",
		      "Expired records deleted by the reaper.",
		      (double)reaper_purged);
	render_scalar(out, "idemproxy_reaper_last_success_timestamp_seconds",
		      "gauge",
		      "Unix time the reaper last completed a pass (0: never).",
		      reaper_last_success);
	render_scalar(out, "idemproxy_processing_records", "gauge",
		      "Records in state processing.", (double)g_processing);
	render_scalar(out, "idemproxy_oldest_processing_age_seconds", "gauge",
		      "Age of the oldest processing attempt.", g_oldest_age);
	render_scalar(out, "idemproxy_store_up", "gauge",
		      "1 when the last store call succeeded.",
		      (double)g_store_up);
	render_scalar(out, "idemproxy_replay_cache_entries", "gauge",
		      "Responses held in the replay cache.",
		      (double)cache_entries);
	render_scalar(out, "idemproxy_replay_cache_bytes", "gauge",
		      "Bytes held in the replay cache.", (double)cache_bytes);
	render_scalar(out, "idemproxy_busy_poll_seconds_total", "counter",
		      "Time threads spent polling instead of sleeping "
		      "(busy_poll).",
		      busy_seconds_total());
	pthread_mutex_unlock(&mu);
}
