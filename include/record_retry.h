/* Records the outcome of an attempt in the background when the worker could
 * not (the store was down, even after one reconnect), so that a known outcome
 * is not forgotten while the attempt's lease lasts. The proxy hands it
 * releases only: a completed answer is written by its worker while its
 * client waits, since no client may get an answer its key will not replay
 * (doc/design.md "When things fail"). One thread with its own
 * store connection; it retries each pending record with backoff until it is
 * written, fenced, or its lease ends. Every write is fenced by the owner
 * token, so trying again is always safe. */
#ifndef IDEMPROXY_RECORD_RETRY_H
#define IDEMPROXY_RECORD_RETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store_pg.h"

typedef struct record_retry record_retry;

/* One pending write, in its stored form (sealed when encryption is on, so
 * plaintext does not wait here); everything is copied. */
typedef struct record_retry_item {
	const char *request_id;
	const char *trace_id;  /* "" or NULL when none */
	const record_key *key;
	bool complete;         /* complete (else release) */
	int status;
	const char *headers;
	size_t headers_len;
	const char *body;
	size_t body_len;
	bool replayable;
	const char *seal_key;  /* headers and body are sealed under it; NULL:
				  in the clear */
	double lease_end_ms;   /* mono_ms() clock: give up after this */
} record_retry_item;

/* wk names the NOTIFY a retried record sends to its waiters. */
record_retry *record_retry_start(const char *db_url,
				 int64_t statement_timeout_ms,
				 const wake_key *wk);
void record_retry_add(record_retry *rr, const record_retry_item *it);
/* Pending writes, for the shutdown log. */
int record_retry_pending(record_retry *rr);
/* Keeps retrying until nothing is pending or deadline_ms (mono_ms()
 * clock) has passed, gives up what is left (logged and counted), then stops
 * the thread and frees rr. */
void record_retry_stop(record_retry *rr, double deadline_ms);

#endif
