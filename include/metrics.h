/* Process-wide counters, gauges and histograms, rendered in the Prometheus
 * text format. Thread-safe. */
#ifndef IDEMPROXY_METRICS_H
#define IDEMPROXY_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

void metrics_request(const char *route, const char *outcome);
void metrics_upstream_response(const char *route, int status);
void metrics_takeover(const char *route);
/* Exports route's series that alerts count (takeovers, the requests of
 * the outcomes alerts select, upstream 5xx) at 0 until their first event:
 * a counter that first appears at 1 shows no increase. Call for every
 * route at start and after each reload; series are never removed. */
void metrics_known_route(const char *route);
/* A named event without labels, e.g. "record_failed". */
void metrics_event(const char *name);
/* One statement of store_batch.h carried n first attempts (kind: "claim"
 * or "record"). */
void metrics_store_batch(const char *kind, int n);
/* A reaper pass completed: its counts, and now as its time. */
void metrics_reaper(int released, int purged);
/* Completed records the reaper turned into tombstones, and tombstones it
 * purged at retain_key. */
void metrics_reaper_tombstones(int stripped, int purged);
/* A retry answered idempotency_key_expired (a tombstone). */
void metrics_tombstone_answer(const char *route);
void metrics_observe_request_ms(double ms);
void metrics_observe_store_ms(double ms);
void metrics_observe_upstream_ms(double ms);
void metrics_set_processing(int64_t count, double oldest_age_s);
/* Of those, the held ones (on_unknown hold, lease ended). */
void metrics_set_held(int64_t count, double oldest_age_s);
void metrics_set_store_up(bool up);
/* What idemproxy_store_up shows: the last store call succeeded. */
bool metrics_store_is_up(void);
/* Requests answered since start (the sum of idemproxy_requests_total). */
uint64_t metrics_requests_answered(void);
/* This process's wall clock minus the database's (NaN until first
 * set). */
void metrics_set_clock_offset(double offset_s);
/* What the store offers (durability.h): the standbys a commit waits for,
 * whether they were counted in pg_stat_replication (or taken from
 * synchronous_standby_names), and synchronous_commit. Shown from the
 * first call on. */
void metrics_set_store_durability(int standbys, bool counted,
				  const char *synchronous_commit);
void metrics_set_replay_cache(size_t entries, size_t bytes);
/* Seals per key id as stored (every instance's), the active key's count
 * (0: sealing off) and store_encryption.warn_seals. At most
 * METRICS_SEAL_KEYS_MAX ids of at most METRICS_KEY_ID_MAX bytes are
 * kept (seal.h's bounds, which reaper.c checks at compile time). */
#define METRICS_SEAL_KEYS_MAX 128
#define METRICS_KEY_ID_MAX 32
typedef struct metrics_key_count {
	const char *id;
	uint64_t n;
} metrics_key_count;
void metrics_set_seal_counts(const metrics_key_count *e, size_t n,
			     uint64_t active, int64_t warn_at);

/* Waiting duplicates (waiters.h): how many wait now, how long one waited,
 * and how its wait ended (replayed, took_over, timed_out, rejected_full,
 * client_gone, ...). */
void metrics_set_waiters(int n);
void metrics_observe_wait_ms(double ms);
void metrics_wait_outcome(const char *route, const char *outcome);

/* A reading: a gauge or counter whose value its owner gives at each
 * scrape (a queue's length, a loop's lag), so that the metrics depend on
 * no module they report on; whoever owns a value adds its reading.
 * read is called with the metrics' lock held: it must not call into
 * metrics, nor wait for anything that does. */
#define METRICS_MAX_READINGS 32
typedef double (*metrics_read_fn)(void *arg);
typedef struct metrics_reading metrics_reading;

/* Adds the series family{labels} (labels "" for none; type "gauge" or
 * "counter"), unbound: it shows 0 until bound. Series are rendered in the
 * order added, help and type once per family, with its first series.
 * Strings must outlive the process. From one thread at start, before the
 * first scrape; NULL when METRICS_MAX_READINGS are taken. */
metrics_reading *metrics_reading_add(const char *family, const char *type,
				     const char *help, const char *labels,
				     metrics_read_fn read);
/* From now on the series shows read(arg) (arg may be NULL for a value of
 * the whole process). */
void metrics_reading_bind(metrics_reading *r, void *arg);
/* Back to 0. Waits for a scrape in progress, so that the arg bound
 * before is never read once this returns. NULL r: nothing. */
void metrics_reading_unbind(metrics_reading *r);
/* The first series of family, now: false when there is none or it is not
 * bound. */
bool metrics_read(const char *family, double *v);

void metrics_render(growbuf *out);

#endif
