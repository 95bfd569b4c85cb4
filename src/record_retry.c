#include "record_retry.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "trace_ctx.h"

/* Backoff between tries of one record: short at first (a restarting
 * database is usually back within a second), capped so that a record is
 * still tried several times within a lease of a few seconds. */
#define BACKOFF_FIRST_MS 50.0
#define BACKOFF_MAX_MS 1000.0

typedef struct pending {
	struct pending *next;
	char *request_id, *tenant, *operation, *key;
	char trace_id[TRACE_ID_HEX + 1]; /* "-" when none */
	uint8_t owner[STORE_TOKEN_LEN];
	bool complete;
	int status;
	char *headers, *body, *seal_key;
	size_t headers_len, body_len;
	bool replayable;
	double lease_end_ms;
	double next_ms;
	double backoff_ms;
	int tries;
} pending;

struct record_retry {
	store *st;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pending *head;
	int count;
	bool stopping;
	double stop_deadline_ms;
};

static char *copy_bytes(const char *p, size_t n)
{
	char *out = xmalloc(n + 1);
	if (n)
		memcpy(out, p, n);
	out[n] = '\0';
	return out;
}

static void pending_free(pending *p)
{
	free(p->request_id);
	free(p->tenant);
	free(p->operation);
	free(p->key);
	free(p->headers);
	free(p->body);
	free(p->seal_key);
	free(p);
}

static const char *what_of(const pending *p)
{
	return p->complete ? "complete" : "release";
}

static void give_up(const pending *p, const char *why)
{
	metrics_event("record_failed");
	log_error("could not record the outcome; the record stays processing "
		  "and the lease rules apply",
		  "request_id=%s trace_id=%s route=%s key=%s write=%s tries=%d "
		  "%s",
		  p->request_id, p->trace_id, p->operation, p->key, what_of(p),
		  p->tries, why);
}

/* One try. True when p is settled (written or fenced) and can go. */
static bool try_one(record_retry *rr, pending *p, char *err, size_t errlen)
{
	record_key k = {p->tenant, p->operation, p->key, p->owner, true};
	bool fenced = false;
	int rc = p->complete
			 ? store_complete(rr->st, &k, p->status, p->headers,
					  p->headers_len,
					  p->replayable ? p->body : NULL,
					  p->replayable ? p->body_len : 0,
					  p->replayable, p->seal_key, &fenced,
					  err, errlen)
			 : store_release(rr->st, &k, &fenced, err, errlen);
	p->tries++;
	if (rc)
		return false;
	if (fenced) {
		metrics_event("record_fenced");
		log_warn("attempt lost its lease to another attempt; outcome "
			 "not recorded",
			 "request_id=%s trace_id=%s route=%s key=%s",
			 p->request_id, p->trace_id, p->operation, p->key);
		return true;
	}
	metrics_event("record_retried");
	log_info("outcome recorded after the store came back",
		 "request_id=%s trace_id=%s route=%s key=%s write=%s tries=%d",
		 p->request_id, p->trace_id, p->operation, p->key, what_of(p),
		 p->tries);
	return true;
}

/* Called with the lock held: the first record due, unlinked, or NULL and
 * *wait_ms set to how long until one is due. */
static pending *take_due(record_retry *rr, double now, double *wait_ms)
{
	pending **best = NULL;
	for (pending **pp = &rr->head; *pp; pp = &(*pp)->next)
		if (!best || (*pp)->next_ms < (*best)->next_ms)
			best = pp;
	*wait_ms = -1;
	if (!best)
		return NULL;
	if ((*best)->next_ms > now) {
		*wait_ms = (*best)->next_ms - now;
		return NULL;
	}
	pending *p = *best;
	*best = p->next;
	p->next = NULL;
	return p;
}

static void wait_for(record_retry *rr, double ms)
{
	if (ms < 0) {
		pthread_cond_wait(&rr->cv, &rr->mu);
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	long long ns = ts.tv_nsec + (long long)(ms * 1e6);
	ts.tv_sec += (time_t)(ns / 1000000000LL);
	ts.tv_nsec = (long)(ns % 1000000000LL);
	pthread_cond_timedwait(&rr->cv, &rr->mu, &ts);
}

/* Called with the lock held, when stopping and the grace has ended. */
static void give_up_all(record_retry *rr)
{
	while (rr->head) {
		pending *p = rr->head;
		rr->head = p->next;
		rr->count--;
		give_up(p, "shutdown_grace ended");
		pending_free(p);
	}
}

static void *retry_main(void *arg)
{
	record_retry *rr = arg;
	char err[256];
	pthread_mutex_lock(&rr->mu);
	for (;;) {
		double now = mono_ms();
		if (rr->stopping &&
		    (!rr->head || now >= rr->stop_deadline_ms)) {
			give_up_all(rr);
			break;
		}
		double wait_ms;
		pending *p = take_due(rr, now, &wait_ms);
		if (!p) {
			if (rr->stopping) {
				double left = rr->stop_deadline_ms - now;
				if (wait_ms < 0 || left < wait_ms)
					wait_ms = left;
			}
			wait_for(rr, wait_ms);
			continue;
		}
		pthread_mutex_unlock(&rr->mu);
		err[0] = '\0';
		bool done = try_one(rr, p, err, sizeof err);
		now = mono_ms();
		if (!done && now >= p->lease_end_ms) {
			give_up(p, err);
			done = true;
		}
		if (!done) {
			p->next_ms = now + p->backoff_ms;
			if (p->next_ms > p->lease_end_ms)
				p->next_ms = p->lease_end_ms;
			p->backoff_ms *= 2;
			if (p->backoff_ms > BACKOFF_MAX_MS)
				p->backoff_ms = BACKOFF_MAX_MS;
		}
		pthread_mutex_lock(&rr->mu);
		if (done) {
			rr->count--;
			pending_free(p);
		} else {
			p->next = rr->head;
			rr->head = p;
		}
	}
	pthread_mutex_unlock(&rr->mu);
	return NULL;
}

record_retry *record_retry_start(const char *db_url,
				 int64_t statement_timeout_ms,
				 const wake_key *wk)
{
	record_retry *rr = xcalloc(1, sizeof *rr);
	rr->st = store_new(db_url, statement_timeout_ms);
	store_set_wake_key(rr->st, wk);
	pthread_mutex_init(&rr->mu, NULL);
	/* Its waits are parts of a lease, counted on mono_ms's clock: a step
	 * of the wall clock must not stretch one past the lease's end. */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&rr->cv, &ca);
	pthread_condattr_destroy(&ca);
	ALWAYS_ASSERT(pthread_create(&rr->thread, NULL, retry_main, rr) == 0);
	pthread_setname_np(rr->thread, "ip-retry");
	return rr;
}

void record_retry_add(record_retry *rr, const record_retry_item *it)
{
	pending *p = xcalloc(1, sizeof *p);
	p->request_id = xstrdup(it->request_id ? it->request_id : "");
	snprintf(p->trace_id, sizeof p->trace_id, "%s",
		 it->trace_id && it->trace_id[0] ? it->trace_id : "-");
	p->tenant = xstrdup(it->key->tenant);
	p->operation = xstrdup(it->key->operation);
	p->key = xstrdup(it->key->key);
	memcpy(p->owner, it->key->owner, STORE_TOKEN_LEN);
	p->complete = it->complete;
	p->status = it->status;
	p->headers = copy_bytes(it->headers, it->headers_len);
	p->headers_len = it->headers_len;
	p->replayable = it->replayable;
	p->seal_key = it->seal_key ? xstrdup(it->seal_key) : NULL;
	if (it->replayable) {
		p->body = copy_bytes(it->body, it->body_len);
		p->body_len = it->body_len;
	}
	p->lease_end_ms = it->lease_end_ms;
	p->backoff_ms = BACKOFF_FIRST_MS;
	p->next_ms = mono_ms() + BACKOFF_FIRST_MS;
	pthread_mutex_lock(&rr->mu);
	p->next = rr->head;
	rr->head = p;
	rr->count++;
	pthread_cond_signal(&rr->cv);
	pthread_mutex_unlock(&rr->mu);
}

int record_retry_pending(record_retry *rr)
{
	pthread_mutex_lock(&rr->mu);
	int n = rr->count;
	pthread_mutex_unlock(&rr->mu);
	return n;
}

void record_retry_stop(record_retry *rr, double deadline_ms)
{
	if (!rr)
		return;
	pthread_mutex_lock(&rr->mu);
	rr->stopping = true;
	rr->stop_deadline_ms = deadline_ms;
	pthread_cond_signal(&rr->cv);
	pthread_mutex_unlock(&rr->mu);
	pthread_join(rr->thread, NULL);
	store_free(rr->st);
	pthread_mutex_destroy(&rr->mu);
	pthread_cond_destroy(&rr->cv);
	free(rr);
}
