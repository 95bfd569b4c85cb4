#include "store_batch.h"

#include "store_pg_many.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fiber.h"
#include "log.h"
#include "metrics.h"
#include "pg_link.h"

/* A record carrying more than this goes alone: a batch copies its arrays
 * into the statement and the plan. And a batch stops taking records at
 * BATCH_MAX_BYTES. */
#define ITEM_MAX_BYTES (64 * 1024)
#define BATCH_MAX_BYTES (1024 * 1024)
/* After a batch connection failed to reach the database, calls go alone
 * for this long (through the workers' own connections, which report the
 * outage as they always did) before a batch tries again. */
#define DOWN_MS 1000.0
/* A lane's statement out longer than STALL_FACTOR times the lane's moving
 * average round trip, and at least database.batch_stall, is stuck: nothing
 * more waits behind it. The floor keeps an ordinary slow commit (a
 * checkpoint, a busy disk) from sending calls alone; the factor keeps a
 * lane whose batches are large and slow from counting as stuck. */
#define STALL_FACTOR 8.0
/* While calls are queued, the lane's watcher looks at least this often. */
#define WATCH_TICK_MS 50.0

/* ITEM_LATE: past its deadline, or behind a stuck statement. */
enum item_end { ITEM_WAITING, ITEM_DONE, ITEM_ALONE, ITEM_LATE };
enum { LANE_CLAIM, LANE_RECORD, N_LANES };

/* One call waiting in a lane, on its fiber's stack. */
typedef struct item {
	struct item *next;
	fiber *f;
	enum item_end end;
	const claim_req *claim;  /* LANE_CLAIM */
	const complete_req *rec; /* LANE_RECORD */
	int max;
	int64_t timeout_ms;
	double deadline; /* leaves the queue then (mono_ms) */
	size_t bytes;
	bool hit;    /* inserted, or written */
	bool marked; /* written, and a waiter had marked it */
	bool resent; /* not written, and the batch went out twice */
} item;

/* One kind of statement: its connection, its fiber and its queue. Every
 * field is touched on the scheduler's thread only (the lane's fiber, the
 * workers' fibers, and store_batch_stop through fiber_sched_call). */
typedef struct lane {
	store_batch *b;
	int kind;
	store *st;
	fiber *f;
	fiber *watch;  /* ends queued calls' waits (lane_watch) */
	bool running;  /* calls may queue */
	bool stopping; /* finish what waits, then end */
	bool idle;     /* parked with nothing to do */
	bool watch_idle; /* the watcher is parked: nothing queued */
	bool watch_done;
	bool sending;  /* a statement of the lane's is with the database */
	double sent_at;    /* when it went out */
	double avg_ms;     /* moving average round trip of the lane's */
	double stall_ms;   /* database.batch_stall, as the last call saw it */
	int alone;     /* calls of this kind on their own connections now */
	item *head, *tail;
	atomic_int queued; /* in the queue: read by /metrics */
	double down_until;
	item *cur[STORE_MANY_MAX];
	const claim_req *claims[STORE_MANY_MAX];
	const complete_req *recs[STORE_MANY_MAX];
	bool hit[STORE_MANY_MAX], marked[STORE_MANY_MAX];
} lane;

struct store_batch {
	char *url;
	int64_t statement_timeout_ms; /* until the first call brings its own */
	fiber_sched *sched;
	lane lanes[N_LANES];
};

static const char *const lane_names[N_LANES] = {"claim", "record"};

store_batch *store_batch_new(const char *url, int64_t statement_timeout_ms)
{
	store_batch *b = xcalloc(1, sizeof *b);
	b->url = xstrdup(url);
	b->statement_timeout_ms = statement_timeout_ms;
	for (int i = 0; i < N_LANES; i++) {
		b->lanes[i].b = b;
		b->lanes[i].kind = i;
	}
	return b;
}

/* Same-key elements in one order in every batch: two batches that share
 * keys lock them in the same order, and so never deadlock each other. */
static int key_cmp(const char *t1, const char *o1, const char *k1,
		   const char *t2, const char *o2, const char *k2)
{
	int c = strcmp(t1, t2);
	if (!c)
		c = strcmp(o1, o2);
	return c ? c : strcmp(k1, k2);
}

static int item_cmp(const void *a, const void *b)
{
	const item *x = *(item *const *)a, *y = *(item *const *)b;
	if (x->claim)
		return key_cmp(x->claim->tenant, x->claim->operation,
			       x->claim->key, y->claim->tenant,
			       y->claim->operation, y->claim->key);
	return key_cmp(x->rec->k->tenant, x->rec->k->operation, x->rec->k->key,
		       y->rec->k->tenant, y->rec->k->operation, y->rec->k->key);
}

/* A queued call, already out of the queue, goes on without the lane. */
static void item_late(item *it)
{
	metrics_event("store_batch_late");
	it->end = ITEM_LATE;
	fiber_wake(it->f);
}

/* Takes what waits (up to the first one's max, and BATCH_MAX_BYTES) into
 * l->cur; returns how many. A call already past its deadline (the watcher
 * looks only every WATCH_TICK_MS) goes on without the lane. */
static int lane_take(lane *l)
{
	int max = l->head->max < STORE_MANY_MAX ? l->head->max
						: STORE_MANY_MAX;
	int n = 0;
	size_t bytes = 0;
	double now = mono_ms();
	while (l->head && n < max &&
	       (n == 0 || bytes + l->head->bytes <= BATCH_MAX_BYTES)) {
		item *it = l->head;
		l->head = it->next;
		if (!l->head)
			l->tail = NULL;
		atomic_fetch_sub_explicit(&l->queued, 1, memory_order_relaxed);
		if (now >= it->deadline) {
			item_late(it);
			continue;
		}
		l->cur[n++] = it;
		bytes += it->bytes;
	}
	return n;
}

/* The statement for l->cur[0..n). A record's statement is given up by its
 * earliest element's deadline, which leaves that record the rest of its
 * lease for the background retrier. */
static int lane_statement(lane *l, int n, bool *resent, char *err,
			  size_t errlen)
{
	qsort(l->cur, (size_t)n, sizeof *l->cur, item_cmp);
	double cap = 0;
	for (int i = 0; i < n; i++) {
		l->claims[i] = l->cur[i]->claim;
		l->recs[i] = l->cur[i]->rec;
		if (l->kind == LANE_RECORD && (cap == 0 || l->cur[i]->deadline < cap))
			cap = l->cur[i]->deadline;
	}
	store_set_statement_timeout(l->st, l->cur[0]->timeout_ms);
	store_set_deadline(l->st, cap);
	l->sending = true;
	l->sent_at = mono_ms();
	int rc = l->kind == LANE_CLAIM
			 ? store_claim_new_many(l->st, l->claims, n, l->hit,
						err, errlen)
			 : store_complete_many(l->st, l->recs, n, l->hit,
					       l->marked, resent, err, errlen);
	l->sending = false;
	double took = mono_ms() - l->sent_at;
	if (!rc)
		l->avg_ms = l->avg_ms > 0 ? l->avg_ms + (took - l->avg_ms) / 8
					  : took;
	return rc;
}

/* Sends what waits as one statement, and hands each call its answer. */
static void lane_send(lane *l)
{
	int n = lane_take(l);
	if (n == 0)
		return;
	int rc = -1;
	bool resent = false;
	char err[256] = "the database was unreachable a moment ago";
	if (mono_ms() >= l->down_until) {
		rc = lane_statement(l, n, &resent, err, sizeof err);
		if (rc && store_outage(l->st))
			l->down_until = mono_ms() + DOWN_MS;
	}
	if (rc) {
		/* Each call then goes alone through its worker's connection,
		 * which logs and counts the store's failure as it always did;
		 * and an element the database refused fails only its own
		 * request. */
		metrics_event("store_batch_failed");
		log_debug("store batch failed; its calls go alone",
			  "kind=%s n=%d %s", lane_names[l->kind], n, err);
	} else {
		metrics_store_batch(lane_names[l->kind], n);
	}
	for (int i = 0; i < n; i++) {
		item *it = l->cur[i];
		if (rc) {
			it->end = ITEM_ALONE;
		} else {
			it->end = ITEM_DONE;
			it->hit = l->hit[i];
			it->marked = l->kind == LANE_RECORD && l->marked[i];
			it->resent = resent;
		}
		fiber_wake(it->f);
	}
}

/* The lane's statement has been out well past a normal round trip. */
static bool lane_stalled(const lane *l, double now)
{
	if (!l->sending)
		return false;
	double limit = STALL_FACTOR * l->avg_ms;
	return now - l->sent_at > (limit > l->stall_ms ? limit : l->stall_ms);
}

/* Sends the queued calls that are past their deadline, or all of them
 * behind a stuck statement, on their way (ITEM_LATE). Returns when to
 * look again (-1: nothing queued). */
static double lane_expire(lane *l)
{
	double now = mono_ms(), next = -1;
	bool stalled = lane_stalled(l, now);
	int late = 0;
	item *prev = NULL;
	for (item *it = l->head, *nx; it; it = nx) {
		nx = it->next;
		if (!stalled && now < it->deadline) {
			if (next < 0 || it->deadline < next)
				next = it->deadline;
			prev = it;
			continue;
		}
		if (prev)
			prev->next = nx;
		else
			l->head = nx;
		if (l->tail == it)
			l->tail = prev;
		atomic_fetch_sub_explicit(&l->queued, 1, memory_order_relaxed);
		item_late(it);
		late++;
	}
	if (late)
		log_warn("calls left a store batch lane without waiting for "
			 "its statement", "kind=%s n=%d statement_out_ms=%.0f",
			 lane_names[l->kind], late,
			 l->sending ? now - l->sent_at : 0.0);
	if (l->head && (next < 0 || next > now + WATCH_TICK_MS))
		next = now + WATCH_TICK_MS;
	return next;
}

/* Ends queued calls' waits at their deadlines: the lane's own fiber is
 * inside the statement they wait for. */
static void lane_watch(void *arg)
{
	lane *l = arg;
	l->watch = fiber_current();
	for (;;) {
		while (!l->head && !l->stopping) {
			l->watch_idle = true;
			fiber_park();
		}
		l->watch_idle = false;
		if (!l->head)
			break;
		double next = lane_expire(l);
		if (next >= 0)
			(void)fiber_wait_fds(0, NULL, NULL, NULL, next);
	}
	l->watch_done = true;
}

static void lane_main(void *arg)
{
	lane *l = arg;
	l->f = fiber_current();
	l->st = store_new(l->b->url, l->b->statement_timeout_ms);
	/* complete_many's join wants a plan of its own each time */
	if (l->kind == LANE_RECORD)
		store_set_many(l->st);
	l->running = !l->stopping;
	/* The connection is made by the first batch: a proxy that never has
	 * two first attempts of a kind at once never opens it. */
	for (;;) {
		while (!l->head && !l->stopping) {
			l->idle = true;
			fiber_park();
		}
		l->idle = false;
		if (!l->head)
			break;
		lane_send(l);
	}
	l->running = false;
	store_free(l->st);
	l->st = NULL;
}

void store_batch_start(store_batch *b, fiber_sched *s)
{
	b->sched = s;
	for (int i = 0; i < N_LANES; i++) {
		fiber_spawn(s, lane_main, &b->lanes[i]);
		fiber_spawn(s, lane_watch, &b->lanes[i]);
	}
}

static void stop_lanes(void *arg)
{
	store_batch *b = arg;
	for (int i = 0; i < N_LANES; i++) {
		lane *l = &b->lanes[i];
		l->running = false;
		l->stopping = true;
		if (l->idle) {
			l->idle = false;
			fiber_wake(l->f);
		}
		if (l->watch_idle) {
			l->watch_idle = false;
			fiber_wake(l->watch);
		}
	}
}

void store_batch_stop(store_batch *b)
{
	if (b && b->sched)
		fiber_sched_call(b->sched, stop_lanes, b);
}

void store_batch_free(store_batch *b)
{
	if (!b)
		return;
	for (int i = 0; i < N_LANES; i++)
		store_free(b->lanes[i].st);
	free(b->url);
	free(b);
}

void store_batch_queued(store_batch *b, int *claims, int *records)
{
	*claims = atomic_load_explicit(&b->lanes[LANE_CLAIM].queued,
				       memory_order_relaxed);
	*records = atomic_load_explicit(&b->lanes[LANE_RECORD].queued,
					memory_order_relaxed);
}

/* The lane a call may queue in, or NULL: it goes alone. */
static lane *lane_for(const store_batch_use *u, int kind)
{
	if (!u->b || u->max <= 1 || !fiber_current())
		return NULL;
	lane *l = &u->b->lanes[kind];
	double now = mono_ms();
	l->stall_ms = (double)u->stall_ms;
	if (!l->running || now < l->down_until || lane_stalled(l, now))
		return NULL;
	return l;
}

/* Nothing of this kind is with the database: a call then goes alone, on
 * its worker's connection, as it would without batching. A request on its
 * own keeps its claim and its record on one warm backend (two lanes would
 * wake two), and a batch forms only from calls that would otherwise wait
 * for one another's commits. */
static bool lane_quiet(const lane *l)
{
	return !l->sending && !l->head && l->alone == 0;
}

static void lane_wait(lane *l, item *it)
{
	it->f = fiber_current();
	it->end = ITEM_WAITING;
	it->next = NULL;
	if (l->tail)
		l->tail->next = it;
	else
		l->head = it;
	l->tail = it;
	atomic_fetch_add_explicit(&l->queued, 1, memory_order_relaxed);
	if (l->idle) {
		l->idle = false;
		fiber_wake(l->f);
	}
	if (l->watch_idle) {
		l->watch_idle = false;
		fiber_wake(l->watch);
	}
	while (it->end == ITEM_WAITING)
		fiber_park();
}

int store_batch_claim(const store_batch_use *u, const claim_req *req,
		      claim_result *out, char *err, size_t errlen)
{
	lane *l = lane_for(u, LANE_CLAIM);
	if (!l)
		return store_claim(u->own, req, out, err, errlen);
	if (lane_quiet(l)) {
		l->alone++;
		int rc = store_claim(u->own, req, out, err, errlen);
		l->alone--;
		return rc;
	}
	/* The batch statement goes out after this: its lease counts from
	 * no later than the database's. */
	double asked = mono_ms();
	item it = {.claim = req,
		   .max = u->max,
		   .timeout_ms = u->statement_timeout_ms,
		   .deadline = mono_ms() +
			       (double)pg_link_wait_ms(u->statement_timeout_ms)};
	lane_wait(l, &it);
	if (it.end == ITEM_ALONE || it.end == ITEM_LATE)
		return store_claim(u->own, req, out, err, errlen);
	if (it.hit) {
		store_claim_fresh(req, out);
		out->asked_ms = asked;
		return 0;
	}
	/* The key exists: possibly this attempt's own, when the batch went
	 * out twice, which idem_claim recognises by the owner token. */
	return store_claim_existing(u->own, req, out, err, errlen);
}

/* A queued record's deadline: the store-wait deadline, or half of the
 * lease it has left, whichever comes first; the other half is the
 * background retrier's. */
static double record_deadline(const store_batch_use *u)
{
	double now = mono_ms();
	double d = now + (double)pg_link_wait_ms(u->statement_timeout_ms);
	if (u->lease_end_ms > 0 && now + (u->lease_end_ms - now) / 2 < d)
		d = now + (u->lease_end_ms - now) / 2;
	return d;
}

int store_batch_complete(const store_batch_use *u, const complete_req *q,
			 bool *fenced, char *err, size_t errlen)
{
	size_t bytes = q->headers_len + q->body_len;
	lane *l = lane_for(u, LANE_RECORD);
	if (!l || bytes > ITEM_MAX_BYTES || q->k->repeat)
		return store_complete_req(u->own, q, fenced, err, errlen);
	if (lane_quiet(l)) {
		l->alone++;
		int rc = store_complete_req(u->own, q, fenced, err, errlen);
		l->alone--;
		return rc;
	}
	item it = {.rec = q,
		   .max = u->max,
		   .timeout_ms = u->statement_timeout_ms,
		   .deadline = record_deadline(u),
		   .bytes = bytes};
	double t0 = mono_ms();
	lane_wait(l, &it);
	if (it.end == ITEM_LATE ||
	    (it.end == ITEM_ALONE && mono_ms() >= it.deadline)) {
		snprintf(err, errlen,
			 "record: no answer from the store's batch within "
			 "%.1fs", (mono_ms() - t0) / 1000.0);
		return -1;
	}
	if (it.end == ITEM_ALONE) {
		/* The batch may have committed before its connection broke:
		 * alone, it is a repeat (a write that finds its own record
		 * done is done). */
		record_key k = *q->k;
		k.repeat = true;
		complete_req again = *q;
		again.k = &k;
		return store_complete_req(u->own, &again, fenced, err, errlen);
	}
	*fenced = false;
	if (it.hit) {
		if (it.marked)
			store_notify_waiters(u->own, q->k);
		return 0;
	}
	if (!it.resent) {
		*fenced = true;
		return 0;
	}
	int rc = store_settle(u->own, q->k, fenced, err, errlen);
	/* A repeat cannot tell whether a waiter marked the record: it
	 * notifies. */
	if (!rc && !*fenced)
		store_notify_waiters(u->own, q->k);
	return rc;
}

static double read_claims(void *arg)
{
	int claims, records;
	store_batch_queued(arg, &claims, &records);
	return claims;
}

static double read_records(void *arg)
{
	int claims, records;
	store_batch_queued(arg, &claims, &records);
	return records;
}

void store_batch_publish(store_batch *b)
{
	static const char family[] = "idemproxy_store_batch_queued";
	static const char help[] =
		"First attempts waiting to be claimed or recorded with others "
		"(the statement of their kind is with the database).";
	static metrics_reading *claims, *records;
	if (!claims) {
		claims = metrics_reading_add(family, "gauge", help,
					     "kind=\"claim\"", read_claims);
		records = metrics_reading_add(family, "gauge", help,
					      "kind=\"record\"", read_records);
	}
	if (b) {
		metrics_reading_bind(claims, b);
		metrics_reading_bind(records, b);
	} else {
		metrics_reading_unbind(claims);
		metrics_reading_unbind(records);
	}
}
