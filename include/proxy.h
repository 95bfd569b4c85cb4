/* What a worker does with one request: plan, claim, forward, record, answer.
 * This is the one place where the decision (decide), the store (store_pg) and
 * the upstream (upstream) meet. */
#ifndef IDEMPROXY_PROXY_H
#define IDEMPROXY_PROXY_H

#include <stdbool.h>
#include <stdint.h>

#include "job.h"
#include "wake.h"

struct replay_cache;
struct record_retry;
struct waiters;
struct store_batch;

typedef struct proxy_shared {
	const char *db_url;
	int64_t statement_timeout_ms;
	bool citus; /* distributed store: the claim is idem_claim alone */
	struct replay_cache *cache; /* NULL: no replay cache */
	struct record_retry *retry; /* records the workers could not write */
	struct waiters *waiters;    /* duplicates waiting; NULL: none wait */
	/* first attempts claimed and recorded together (fiber workers on a
	 * plain store); NULL: each alone */
	struct store_batch *batch;
	const wake_key *wake; /* names what waiters wait for (wake.h) */
} proxy_shared;

/* Runs on the front end's event thread before a job is queued: answers at
 * once what needs neither the store nor the upstream (rejections, replays
 * found in the replay cache) and returns true; otherwise returns false and
 * the job goes to a worker (keeping the plan and fingerprint made here).
 * arg is a proxy_shared. */
bool proxy_fast_path(void *arg, job *j);

/* worker_ops callbacks: arg is a proxy_shared, items are jobs. */
void *proxy_worker_init(void *arg, int index);
void proxy_worker_handle(void *ctx, void *item);
void proxy_worker_fini(void *ctx);

/* waiters_ops.answer: arg unused. */
enum waiters_end;
void proxy_wait_answer(void *arg, job *j, enum waiters_end why);

#endif
