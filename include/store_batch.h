/* First attempts of many requests, claimed and recorded together: each
 * kind of write (the claim of a fresh key, the record of an answer) goes
 * out as one statement and one commit for every request that wants it
 * while the previous one of that kind is with the database.
 *
 * Why: on this kind of machine PostgreSQL's CPU per first attempt is
 * mostly its per-statement and per-commit cost (the backend's wake-ups,
 * the WAL flush), not the rows; one statement for eight attempts costs it
 * about a third of eight statements (README, Performance). Nothing waits
 * for a batch to fill: a request alone goes out at once, and under load
 * the requests that arrive during one round trip make the next batch.
 *
 * Each kind has its own connection, driven by a fiber of the workers'
 * scheduler (fiber.h), so only fiber workers on a plain store use it;
 * everything else, and whatever a batch cannot settle, goes through the
 * worker's own store connection exactly as without batching: repeats (a
 * key that exists), answers larger than a batch takes, a batch the
 * database refused (each then tries alone, so one bad element cannot fail
 * the others), and every call while the batch connection is down. Every
 * call returns what the same store_pg call on the worker's own connection
 * would.
 *
 * No call waits long behind a stuck statement: a queued call has a
 * deadline (a claim the store-wait deadline, pg_link_wait_ms; a record
 * also half of the lease it has left), and once a lane's statement has
 * been out longer than 8 times the lane's moving average round trip (at
 * least database.batch_stall), the calls queued behind it and every new
 * one leave the lane: claims go alone, records to the background
 * retrier. */
#ifndef IDEMPROXY_STORE_BATCH_H
#define IDEMPROXY_STORE_BATCH_H

#include <stdint.h>

#include "store_pg.h"

struct fiber_sched;
typedef struct store_batch store_batch;

/* No connection yet: each is made by the first batch of its kind, under
 * this statement_timeout (then each batch's own). */
store_batch *store_batch_new(const char *url, int64_t statement_timeout_ms);
/* Starts the fibers on s; until then every call goes through own. */
void store_batch_start(store_batch *b, struct fiber_sched *s);
/* From then on every call goes through own; the batches in flight and
 * those waiting are finished first, then the fibers end (fiber_sched_join
 * waits for them). */
void store_batch_stop(store_batch *b);
/* After the scheduler was joined. */
void store_batch_free(store_batch *b);

/* Calls waiting for the statement of their kind in flight (any thread). */
void store_batch_queued(store_batch *b, int *claims, int *records);
/* Shows b's queues in /metrics; NULL first adds the gauges (at 0), and
 * later stops showing them: call it so before b is freed. From the main
 * thread. */
void store_batch_publish(store_batch *b);

/* How a worker calls it: its own store, the most attempts one statement
 * may carry (database.batch; <= 1: none, each alone) and the
 * statement_timeout for the batch's statement. */
typedef struct store_batch_use {
	store_batch *b; /* NULL: none */
	store *own;
	int max;
	int64_t statement_timeout_ms;
	int64_t stall_ms;    /* database.batch_stall */
	double lease_end_ms; /* a record's: its attempt's lease end */
} store_batch_use;

/* store_claim(own, ...), the insert of a fresh key batched. */
int store_batch_claim(const store_batch_use *u, const claim_req *req,
		      claim_result *out, char *err, size_t errlen) MUST_CHECK;
/* store_complete_req(own, ...), batched. A record that cannot be written
 * in its lane by its deadline (the store-wait deadline, or half of the
 * lease it had left when it queued, whichever comes first) fails without
 * waiting any longer, for the background retrier (record_retry.h). */
int store_batch_complete(const store_batch_use *u, const complete_req *q,
			 bool *fenced, char *err, size_t errlen) MUST_CHECK;

#endif
