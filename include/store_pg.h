/* The PostgreSQL store. One `store` is one connection, owned by one thread;
 * statements are prepared at connect and the connection is re-made (and
 * re-prepared) after it breaks. This header has the connection and the
 * statements on one record; the batch statements are in store_pg_many.h,
 * the reaper's in store_pg_reap.h, the schema's in store_pg_schema.h. */
#ifndef IDEMPROXY_STORE_PG_H
#define IDEMPROXY_STORE_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"
#include "seal_tally.h"
#include "wake.h"

#define STORE_TOKEN_LEN 16
/* A W3C trace id's bytes (trace_ctx.h: TRACE_ID_LEN). */
#define STORE_TRACE_LEN 16

typedef struct store store;

/* Does not connect yet; the first call (or store_ensure) does. */
store *store_new(const char *url, int64_t statement_timeout_ms);
void store_free(store *s);

/* The statement_timeout from the next call on (a reload may change it); a
 * SET is sent only when it differs from the one in force. */
void store_set_statement_timeout(store *s, int64_t ms);
/* An absolute deadline (mono_ms's clock; 0: none) that every wait for
 * the store's answer keeps, besides its own (pg_link_wait_ms), until it is
 * set again. */
void store_set_deadline(store *s, double deadline_ms);
/* The records are distributed by Citus (database.distributed = "citus"):
 * the reaper's batches then run per shard, and a claim is the delegated
 * idem_claim call alone (no insert first). Before the first call. */
void store_set_distributed(store *s, bool citus);

/* This connection sends complete_many (store_batch.h) and nothing else:
 * its settings leave the join one plan, an index lookup per element,
 * whatever the table's size. Before the first call. */
void store_set_many(store *s);

/* Connects (and prepares) if not connected. 0 or -1 with err. */
int store_ensure(store *s, char *err, size_t errlen) MUST_CHECK;

/* After a call that failed: true when it failed because the database could
 * not be reached (no connection could be made, or the connection broke),
 * false for an error on a working connection (an SQL error, a statement
 * timeout, a serialization failure). */
bool store_outage(const store *s);

/* A fresh random owner token (a version 4 UUID) for one attempt. */
void store_new_token(uint8_t out[STORE_TOKEN_LEN]);

enum claim_decision {
	CLAIM_FORWARD,    /* new record: this attempt owns the key */
	CLAIM_TAKEOVER,   /* released / dead lease taken over */
	CLAIM_REPLAY,
	CLAIM_IN_FLIGHT,
	CLAIM_HELD,       /* outcome unknown, on_unknown = hold */
	CLAIM_MISMATCH,
	CLAIM_EXPIRED,    /* a tombstone: the response is gone, the key kept */
};

typedef struct claim_req {
	const char *tenant;
	const char *operation;
	const char *key;
	const uint8_t *hash; /* 32 bytes */
	int64_t lease_ms;
	int64_t ttl_ms;
	int64_t retain_ms; /* >= ttl_ms: how long the key is kept */
	bool hold_on_unknown;
	/* STORE_TOKEN_LEN bytes, from store_new_token: the attempt's owner
	 * token if the claim gives it the key. A claim repeated with the same
	 * token that finds the key processing under it carries on as that
	 * attempt (same decision, same attempt number). */
	const uint8_t *owner;
	/* STORE_TRACE_LEN bytes: the trace id of the request's valid
	 * traceparent, stored with a new record; NULL: none (SQL NULL). */
	const uint8_t *trace_id;
} claim_req;

typedef struct claim_result {
	enum claim_decision decision;
	uint8_t owner[STORE_TOKEN_LEN]; /* FORWARD / TAKEOVER */
	int attempt;
	int64_t lease_left_ms;          /* IN_FLIGHT; FORWARD and TAKEOVER:
					   this attempt's lease */
	int64_t expires_in_ms;          /* FORWARD, TAKEOVER, REPLAY: until the
					   response expires; EXPIRED: until
					   the key does */
	/* mono_ms() just before the statement that gave this answer was
	 * sent: lease_left_ms and expires_in_ms count from here, never later
	 * than the database's now(). A claim repeated after a lost answer
	 * counts from the repeat, not from the first try. */
	double asked_ms;
	/* REPLAY: pointers into res, valid until claim_result_clear;
	 * EXPIRED: status alone (the stored final status) */
	int status;
	const char *headers;
	size_t headers_len;
	const char *body;
	size_t body_len;
	bool replayable;
	void *res;                      /* the PGresult */
} claim_result;

/* One round trip. 0, or -1 on a store failure (err filled). */
int store_claim(store *s, const claim_req *req, claim_result *out, char *err,
		size_t errlen) MUST_CHECK;
void claim_result_clear(claim_result *r);
/* The claim for a key known to exist (an insert of it found it): idem_claim
 * alone. As store_claim otherwise. */
int store_claim_existing(store *s, const claim_req *req, claim_result *out,
			 char *err, size_t errlen) MUST_CHECK;
/* What idem_claim answers for a key its attempt inserted: forward, attempt
 * 1, the whole lease, the response living max(ttl, lease) (the key may
 * live longer: retain_ms; the replay cache must not trust that). */
void store_claim_fresh(const claim_req *req, claim_result *out);


typedef struct record_key {
	const char *tenant;
	const char *operation;
	const char *key;
	const uint8_t *owner; /* STORE_TOKEN_LEN bytes */
	/* An earlier try of this very write may have committed (its
	 * connection broke before the answer): finding the record already in
	 * the state the write sets, under this owner, is success. */
	bool repeat;
} record_key;

/* Records a response (headers: raw "Name: value\r\n" bytes, stored as
 * bytea; or headers and body sealed under the key seal_key names, NULL
 * when they are in the clear). *fenced is set when the attempt no longer owns the key (its lease
 * was taken over): nothing was written. When the connection in hand turns
 * out to be broken, the write is sent once more at once on a fresh one
 * (fenced by the owner token, so that is safe). */
int store_complete(store *s, const record_key *k, int status,
		   const char *headers, size_t headers_len, const char *body,
		   size_t body_len, bool replayable, const char *seal_key,
		   bool *fenced, char *err, size_t errlen) MUST_CHECK;
typedef struct complete_req {
	const record_key *k;
	int status;
	const char *headers;
	size_t headers_len;
	const char *body; /* NULL: none stored */
	size_t body_len;
	bool replayable;
	const char *seal_key;
} complete_req;
/* store_complete, its arguments in one place. */
int store_complete_req(store *s, const complete_req *q, bool *fenced,
		       char *err, size_t errlen) MUST_CHECK;
/* After a complete that may have committed on a connection that broke,
 * and a repeat that wrote nothing: is the record completed under k's
 * owner? *fenced when not. */
int store_settle(store *s, const record_key *k, bool *fenced, char *err,
		 size_t errlen) MUST_CHECK;
/* Wakes other instances' waiters for k's record (after its write
 * committed, and only when a waiter marked it). */
void store_notify_waiters(store *s, const record_key *k);

/* Frees the key for a retry (state released). */
int store_release(store *s, const record_key *k, bool *fenced, char *err,
		  size_t errlen) MUST_CHECK;

/* The channel the instances LISTEN on for waiters' wake-ups; the payload
 * is the record's wake scope (wake.h). A complete or release that finds
 * the record marked by a waiter notifies it once the write committed. */
#define STORE_WAIT_CHANNEL "idemproxy_wait"

/* A waiter marks the record it waits for, so that recording it notifies.
 * *marked false: the key is no longer in flight (claim again now);
 * otherwise *lease_left_ms is what remains of the attempt's lease. */
int store_wait_mark(store *s, const char *tenant, const char *operation,
		    const char *key, bool *marked, int64_t *lease_left_ms,
		    char *err, size_t errlen) MUST_CHECK;

/* Recording a record a waiter marked sends a NOTIFY named with wk (which
 * must outlive s); without one, no NOTIFY is sent. */
void store_set_wake_key(store *s, const wake_key *wk);
/* Adds add[0..nadd) to the stored seal counts (idemproxy_seal_counts,
 * migration 011) and returns every key id's total in out (at most max;
 * *nout of them), in one statement. nadd may be 0: it only reads. */
int store_seal_counts(store *s, const seal_tally_entry *add, size_t nadd,
		      seal_tally_entry *out, size_t max, size_t *nout,
		      char *err, size_t errlen) MUST_CHECK;

#endif
