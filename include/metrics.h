/* Process-wide counters, gauges and histograms, rendered in the Prometheus
 * text format. Thread-safe. */
#ifndef IDEMPROXY_METRICS_H
#define IDEMPROXY_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seal_tally.h"
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
void metrics_observe_request_ms(double ms);
void metrics_observe_store_ms(double ms);
void metrics_observe_upstream_ms(double ms);
void metrics_set_processing(int64_t count, double oldest_age_s);
void metrics_set_store_up(bool up);
void metrics_set_replay_cache(size_t entries, size_t bytes);
/* Seals per key id as stored (every instance's), the active key's count
 * (0: sealing off) and store_encryption.warn_seals. */
void metrics_set_seal_counts(const seal_tally_entry *e, size_t n,
			     uint64_t active, int64_t warn_at);

/* Waiting duplicates (waiters.h): how many wait now, how long one waited,
 * and how its wait ended (replayed, took_over, timed_out, rejected_full,
 * client_gone, ...). */
void metrics_set_waiters(int n);
void metrics_observe_wait_ms(double ms);
void metrics_wait_outcome(const char *route, const char *outcome);

/* The pool whose queue and busy workers the gauges show (NULL: none, set
 * before the pool stops). */
struct worker_pool;
void metrics_set_worker_pool(struct worker_pool *p);

/* The serving loop whose lag idemproxy_loop_lag_seconds shows (NULL:
 * none, set before the scheduler stops). metrics_loop_lag_ms gives that
 * lag to /readyz: false when there is no loop. */
struct fiber_sched;
void metrics_set_loop(struct fiber_sched *s);
bool metrics_loop_lag_ms(double *lag_ms);

/* The batches whose queues the gauges show (NULL: none, set before they
 * are freed). */
struct store_batch;
void metrics_set_store_batch(struct store_batch *b);

void metrics_render(ip_buf *out);

#endif
