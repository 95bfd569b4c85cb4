#include "replay_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "siphash.h"

#include "metrics.h"

#define NBUCKETS 16384u /* power of two */

typedef struct entry {
	struct entry *next;        /* bucket chain */
	struct entry *older, *newer; /* insertion order, for eviction */
	uint64_t hv;
	size_t id_len;             /* tenant \0 operation \0 key */
	uint8_t hash[FP_LEN];
	int status;
	double expires_ms;
	size_t headers_len, body_len;
	bool has_raw;
	uint64_t raw_digest[2];    /* raw_digest() of the raw form */
	size_t size;
	char data[];               /* id, then headers, then body */
} entry;

/* Keys are chosen by clients and the chains are walked on the event thread
 * under the mutex: the bucket comes from a hash keyed with a secret drawn at
 * creation, so no one can aim keys at one chain.
 *
 * gen[b] counts the forgets of bucket b. A worker reads it before it asks
 * the store, and its put is dropped when a forget came in between: what the
 * store said may already be deleted. Per bucket, so a forget costs other
 * keys nothing but a rare missed put. */
struct replay_cache {
	pthread_mutex_t mu;
	uint8_t hash_key[SIPHASH_KEY_LEN];
	/* Two more keys of the same kind: a raw form is kept as its two
	 * keyed hashes (128 bits), not whole, so a client that cannot know
	 * the keys cannot make another request that passes for it. */
	uint8_t raw_key[2][SIPHASH_KEY_LEN];
	size_t max_bytes, bytes, count;
	entry *buckets[NBUCKETS];
	uint64_t gen[NBUCKETS];
	entry *oldest, *newest;
};

/* The record id as one byte string: tenant \0 operation \0 key. */
static size_t id_build(const replay_key *k, char *out, size_t cap)
{
	size_t a = strlen(k->tenant), b = strlen(k->operation),
	       c = strlen(k->key);
	size_t n = a + b + c + 2;
	if (n > cap)
		return 0;
	memcpy(out, k->tenant, a);
	out[a] = '\0';
	memcpy(out + a + 1, k->operation, b);
	out[a + 1 + b] = '\0';
	memcpy(out + a + b + 2, k->key, c);
	return n;
}

static uint64_t id_hash(const replay_cache *c, const char *id, size_t n)
{
	return siphash24(c->hash_key, id, n);
}

static size_t bucket_of(uint64_t hv)
{
	return (size_t)(hv & (NBUCKETS - 1));
}

replay_cache *replay_cache_new(size_t max_bytes)
{
	replay_cache *c = xcalloc(1, sizeof *c);
	pthread_mutex_init(&c->mu, NULL);
	c->max_bytes = max_bytes;
	ALWAYS_ASSERT(getrandom(c->hash_key, sizeof c->hash_key, 0) ==
		      (ssize_t)sizeof c->hash_key);
	ALWAYS_ASSERT(getrandom(c->raw_key, sizeof c->raw_key, 0) ==
		      (ssize_t)sizeof c->raw_key);
	return c;
}

void replay_cache_free(replay_cache *c)
{
	if (!c)
		return;
	entry *e = c->oldest;
	while (e) {
		entry *n = e->newer;
		free(e);
		e = n;
	}
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static entry **find_slot(replay_cache *c, uint64_t hv, const char *id,
			 size_t n)
{
	entry **p = &c->buckets[bucket_of(hv)];
	for (; *p; p = &(*p)->next)
		if ((*p)->hv == hv && (*p)->id_len == n &&
		    !memcmp((*p)->data, id, n))
			return p;
	return p;
}

/* Unlinks *slot from its chain and the age list, and frees it. */
static void drop(replay_cache *c, entry **slot)
{
	entry *e = *slot;
	*slot = e->next;
	if (e->older)
		e->older->newer = e->newer;
	else
		c->oldest = e->newer;
	if (e->newer)
		e->newer->older = e->older;
	else
		c->newest = e->older;
	c->bytes -= e->size;
	c->count--;
	metrics_set_replay_cache(c->count, c->bytes);
	free(e);
}

static void drop_entry(replay_cache *c, entry *e)
{
	entry **slot = find_slot(c, e->hv, e->data, e->id_len);
	ALWAYS_ASSERT(*slot == e);
	drop(c, slot);
}

/* Drops the oldest entries while they are expired or while room is needed
 * for `need` more bytes. Deadlines are set at insertion as now + at most the
 * cache ttl, so the oldest entries are the first to expire: dropping them
 * here keeps the cache at what the last ttl's worth of traffic needs, not
 * at its byte bound. */
static void evict(replay_cache *c, size_t need, double now)
{
	while (c->oldest && (c->oldest->expires_ms <= now ||
			     c->bytes + need > c->max_bytes))
		drop_entry(c, c->oldest);
}

/* A raw form's two keyed hashes. */
static void raw_digest(replay_cache *c, const char *raw, size_t len,
		       uint64_t out[2])
{
	out[0] = siphash24(c->raw_key[0], raw, len);
	out[1] = siphash24(c->raw_key[1], raw, len);
}

void replay_cache_put(replay_cache *c, const replay_key *k,
		      const replay_entry *r, double expires_ms, uint64_t gen)
{
	char id[3 * 256 + 8];
	size_t n = id_build(k, id, sizeof id);
	if (!n)
		return;
	size_t size = sizeof(entry) + n + r->headers_len + r->body_len;
	pthread_mutex_lock(&c->mu);
	bool fits = size <= c->max_bytes;
	pthread_mutex_unlock(&c->mu);
	if (!fits)
		return;
	entry *e = xmalloc(size);
	memset(e, 0, sizeof *e);
	e->hv = id_hash(c, id, n);
	e->id_len = n;
	memcpy(e->hash, r->hash, FP_LEN);
	e->status = r->status;
	e->expires_ms = expires_ms;
	e->headers_len = r->headers_len;
	e->body_len = r->body_len;
	e->size = size;
	memcpy(e->data, id, n);
	if (r->headers_len)
		memcpy(e->data + n, r->headers, r->headers_len);
	if (r->body_len)
		memcpy(e->data + n + r->headers_len, r->body, r->body_len);
	if (r->raw) {
		e->has_raw = true;
		raw_digest(c, r->raw, r->raw_len, e->raw_digest);
	}

	double now = mono_ms();
	pthread_mutex_lock(&c->mu);
	/* A forget since the caller read gen, or a resize since the check
	 * above: the entry must not go in. */
	if (c->gen[bucket_of(e->hv)] != gen || size > c->max_bytes) {
		pthread_mutex_unlock(&c->mu);
		free(e);
		return;
	}
	entry **slot = find_slot(c, e->hv, id, n);
	if (*slot)
		drop(c, slot);
	evict(c, size, now);
	slot = find_slot(c, e->hv, id, n);
	*slot = e;
	e->older = c->newest;
	if (c->newest)
		c->newest->newer = e;
	else
		c->oldest = e;
	c->newest = e;
	c->bytes += size;
	c->count++;
	metrics_set_replay_cache(c->count, c->bytes);
	pthread_mutex_unlock(&c->mu);
}

enum match { BY_FP, BY_RAW, ANY };

/* k's unexpired entry, if it matches h as `by` says: copied out. */
static bool lookup(replay_cache *c, const replay_key *k, enum match by,
		   const void *h, double now_ms, int *status,
		   growbuf *headers, growbuf *body)
{
	char id[3 * 256 + 8];
	size_t n = id_build(k, id, sizeof id);
	if (!n)
		return false;
	uint64_t hv = id_hash(c, id, n);
	bool hit = false;
	pthread_mutex_lock(&c->mu);
	entry **slot = find_slot(c, hv, id, n);
	entry *e = *slot;
	if (e && e->expires_ms <= now_ms) {
		drop(c, slot);
		e = NULL;
	}
	bool match = e && (by == ANY ||
			   (by == BY_FP && !memcmp(e->hash, h, FP_LEN)) ||
			   (by == BY_RAW && e->has_raw &&
			    !memcmp(e->raw_digest, h, sizeof e->raw_digest)));
	if (match && by == ANY) {
		hit = true;
	} else if (match) {
		*status = e->status;
		growbuf_append(headers, e->data + n, e->headers_len);
		growbuf_append(body, e->data + n + e->headers_len,
			       e->body_len);
		hit = true;
	}
	pthread_mutex_unlock(&c->mu);
	return hit;
}

bool replay_cache_get(replay_cache *c, const replay_key *k,
		      const uint8_t hash[FP_LEN], double now_ms, int *status,
		      growbuf *headers, growbuf *body)
{
	return lookup(c, k, BY_FP, hash, now_ms, status, headers, body);
}

bool replay_cache_get_raw(replay_cache *c, const replay_key *k,
			  const char *raw, size_t raw_len, double now_ms,
			  int *status, growbuf *headers, growbuf *body)
{
	uint64_t d[2];
	raw_digest(c, raw, raw_len, d);
	return lookup(c, k, BY_RAW, d, now_ms, status, headers, body);
}

bool replay_cache_has(replay_cache *c, const replay_key *k, double now_ms)
{
	return lookup(c, k, ANY, NULL, now_ms, NULL, NULL, NULL);
}

void replay_cache_forget(replay_cache *c, const replay_key *k)
{
	char id[3 * 256 + 8];
	size_t n = id_build(k, id, sizeof id);
	if (!n)
		return;
	uint64_t hv = id_hash(c, id, n);
	pthread_mutex_lock(&c->mu);
	c->gen[bucket_of(hv)]++;
	entry **slot = find_slot(c, hv, id, n);
	if (*slot)
		drop(c, slot);
	pthread_mutex_unlock(&c->mu);
}

uint64_t replay_cache_generation(replay_cache *c, const replay_key *k)
{
	char id[3 * 256 + 8];
	size_t n = id_build(k, id, sizeof id);
	if (!n)
		return 0;
	size_t b = bucket_of(id_hash(c, id, n));
	pthread_mutex_lock(&c->mu);
	uint64_t g = c->gen[b];
	pthread_mutex_unlock(&c->mu);
	return g;
}

void replay_cache_resize(replay_cache *c, size_t max_bytes)
{
	pthread_mutex_lock(&c->mu);
	c->max_bytes = max_bytes;
	evict(c, 0, mono_ms());
	pthread_mutex_unlock(&c->mu);
}

bool replay_cache_enabled(replay_cache *c)
{
	pthread_mutex_lock(&c->mu);
	bool on = c->max_bytes > 0;
	pthread_mutex_unlock(&c->mu);
	return on;
}

size_t replay_cache_bucket(replay_cache *c, const replay_key *k)
{
	char id[3 * 256 + 8];
	size_t n = id_build(k, id, sizeof id);
	return n ? bucket_of(id_hash(c, id, n)) : 0;
}

void replay_cache_stats(replay_cache *c, size_t *entries, size_t *bytes)
{
	pthread_mutex_lock(&c->mu);
	*entries = c->count;
	*bytes = c->bytes;
	pthread_mutex_unlock(&c->mu);
}
