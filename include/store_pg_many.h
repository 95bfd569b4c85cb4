/* The store's batch statements: many attempts in one statement and one
 * commit, as store_batch.h sends them. */
#ifndef IDEMPROXY_STORE_PG_MANY_H
#define IDEMPROXY_STORE_PG_MANY_H

#include "store_pg.h"

/* Most attempts one *_many statement carries. */
#define STORE_MANY_MAX 256

/* The first step of store_claim for n attempts (1..STORE_MANY_MAX) in one
 * statement and one commit, on a plain store: inserted[i] says attempt i's
 * key was new and is now its own (store_claim_fresh); otherwise the key
 * exists (store_claim_existing decides). Once more on a fresh connection
 * when the one in hand turned out to be broken. 0, or -1 on a store failure
 * (err filled, store_outage tells which kind): nothing is known then, and
 * any of the inserts may have committed (a claim repeated with the same
 * owner token carries on as that attempt). */
int store_claim_new_many(store *s, const claim_req *const *reqs, int n,
			 bool *inserted, char *err, size_t errlen) MUST_CHECK;

/* n completes (1..STORE_MANY_MAX) in one statement and one commit, without
 * repeat handling or NOTIFY: updated[i] says attempt i's record was
 * written, marked[i] that a waiter had marked it. Not updated: fenced, or,
 * when *resent (the statement went out once more on a fresh connection
 * after the first broke, and may have committed), to be settled with
 * store_settle. 0, or -1 (err; nothing is known, any may have
 * committed). */
int store_complete_many(store *s, const complete_req *const *reqs, int n,
			bool *updated, bool *marked, bool *resent, char *err,
			size_t errlen) MUST_CHECK;

#endif
