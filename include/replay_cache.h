/* An in-process cache of completed, replayable responses, so that a replay
 * need not reach the database. Sound with several instances because a
 * completed record never changes: it only expires (entries never outlive
 * the record's expires_at) or is deleted by an operator (another instance
 * may replay a deleted key from its cache for at most the cache's ttl).
 * Bounded in bytes (the bound can change while it runs); the oldest entries
 * go first. Buckets come from a hash keyed at random per cache. Thread-safe. */
#ifndef IDEMPROXY_REPLAY_CACHE_H
#define IDEMPROXY_REPLAY_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fingerprint.h"
#include "util.h"

typedef struct replay_cache replay_cache;

typedef struct replay_key {
	const char *tenant;
	const char *operation;
	const char *key;
} replay_key;

typedef struct replay_entry {
	const uint8_t *hash; /* FP_LEN bytes */
	/* fp_raw_form of a request with this fingerprint (kept as two
	 * hashes under keys drawn at random per cache); NULL: none (the entry
	 * is found by its fingerprint only) */
	const char *raw;
	size_t raw_len;
	int status;
	const char *headers; /* the stored "Name: value\r\n" form */
	size_t headers_len;
	const char *body;
	size_t body_len;
} replay_entry;

replay_cache *replay_cache_new(size_t max_bytes);
void replay_cache_free(replay_cache *c);

/* A new bound: evicts the oldest entries down to it. 0 empties the cache
 * and stores nothing until it grows again. */
void replay_cache_resize(replay_cache *c, size_t max_bytes);
/* False while the bound is 0: lookups would only miss. */
bool replay_cache_enabled(replay_cache *c);

/* The forget generation of k: read it before asking the store about k, and
 * hand it to replay_cache_put. */
uint64_t replay_cache_generation(replay_cache *c, const replay_key *k);

/* Remembers a completed response until expires_ms (mono_ms() clock);
 * replaces an earlier entry for the same key. Not stored: an entry larger
 * than the whole cache, or one whose key was forgotten since gen was read
 * (an operator deleted the record while the caller was reading it). */
void replay_cache_put(replay_cache *c, const replay_key *k,
		      const replay_entry *e, double expires_ms, uint64_t gen);

/* A hit needs the same key, the same fingerprint and an unexpired entry:
 * then status, headers and body are copied out and true is returned. */
bool replay_cache_get(replay_cache *c, const replay_key *k,
		      const uint8_t hash[FP_LEN], double now_ms, int *status,
		      growbuf *headers, growbuf *body);

/* The same, matching the raw form the entry was put with: a retry sent
 * byte for byte as the request the entry came from, found without
 * canonicalising its body. A miss says nothing about the fingerprint. */
bool replay_cache_get_raw(replay_cache *c, const replay_key *k,
			  const char *raw, size_t raw_len, double now_ms,
			  int *status, growbuf *headers, growbuf *body);
/* Whether k has an unexpired entry (whatever its fingerprint). */
bool replay_cache_has(replay_cache *c, const replay_key *k, double now_ms);

/* Drops k's entry, and any put of k whose generation was read before. */
void replay_cache_forget(replay_cache *c, const replay_key *k);

/* Entries and bytes held, for tests and metrics. */
void replay_cache_stats(replay_cache *c, size_t *entries, size_t *bytes);

/* The bucket k falls in, for tests of the keyed hash. */
size_t replay_cache_bucket(replay_cache *c, const replay_key *k);

#endif
