#include "waiters.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"

/* Parked jobs live on one list: max_waiters bounds it (a thousand or so),
 * and the thread walks it anyway for the deadlines and the sockets, so a
 * wake-up's walk costs no more than the thread's own. A job that parks
 * again goes to the back, so under a storm of wake-ups every waiter gets
 * its turn to claim. */
typedef struct waiter {
	job *j;
	uint8_t scope[WAKE_SCOPE_LEN];
	double recheck_ms;
	uint64_t seq;
	bool read_closed; /* the client shut down its sending side */
	struct waiter *prev, *next;
} waiter;

/* The most recent wake-ups, so that a job parking after a wake-up it could
 * not yet receive (it was marking its record) claims again at once. */
#define RECENT 256

/* Waiting places taken per tenant: buckets of a small chained table,
 * entries made at the first admit and freed when the last one leaves. */
#define TENANT_BUCKETS 256

typedef struct tenant_slot {
	struct tenant_slot *next;
	int n;
	char name[];
} tenant_slot;

/* A submit refused by a full queue is tried again after this long. */
#define RESUBMIT_MS 20.0

struct waiters {
	pthread_mutex_t mu;
	waiter *head, *tail;
	int parked;
	/* Re-claims in the workers' queue or with a worker: a wake-up makes
	 * every waiter of a key due at once (a repeated or forged NOTIFY, a
	 * listener reconnect: all of them), and at most this many go back at
	 * a time, so fresh requests always find room. */
	int reclaim_max, reclaiming;
	atomic_int waiting; /* admitted: parked or claiming again */
	atomic_int max;
	int max_per_tenant; /* 0: half of max */
	tenant_slot *tenants[TENANT_BUCKETS];
	bool draining, stopping;
	uint64_t gen;
	struct {
		bool all;
		uint8_t scope[WAKE_SCOPE_LEN];
	} recent[RECENT];
	uint64_t next_seq;
	int efd;
	pthread_t th;
	waiters_ops ops;
};

static double dmin(double a, double b)
{
	return a < b ? a : b;
}

static void poke(waiters *w)
{
	uint64_t one = 1;
	ssize_t n = write(w->efd, &one, sizeof one);
	(void)n; /* a full counter already wakes the thread */
}

static void unlink_waiter(waiters *w, waiter *x)
{
	if (x->prev)
		x->prev->next = x->next;
	else
		w->head = x->next;
	if (x->next)
		x->next->prev = x->prev;
	else
		w->tail = x->prev;
	x->prev = x->next = NULL;
	w->parked--;
}

static void link_waiter(waiters *w, waiter *x)
{
	x->next = NULL;
	x->prev = w->tail;
	if (w->tail)
		w->tail->next = x;
	else
		w->head = x;
	w->tail = x;
	w->parked++;
}

/* With the lock held: a re-claim came back (parked again, or left). */
static bool reclaim_done(waiters *w, job *j)
{
	if (!j->wait_reclaiming)
		return false;
	j->wait_reclaiming = false;
	w->reclaiming--;
	return true;
}

static const char *end_name(enum waiters_end why)
{
	switch (why) {
	case WAITERS_TIMED_OUT:
		return "timed_out";
	case WAITERS_CLIENT_GONE:
		return "client_gone";
	case WAITERS_SHUTDOWN:
		break;
	}
	return "shutdown";
}

/* Called without the lock. */
static void finish(waiters *w, waiter *x, enum waiters_end why)
{
	job *j = x->j;
	free(x);
	waiters_leave(w, j, end_name(why));
	w->ops.answer(w->ops.arg, j, why);
}

/* x holds one of the re-claim places (collect took it). */
static void resubmit(waiters *w, waiter *x)
{
	job *j = x->j;
	pthread_mutex_lock(&w->mu);
	bool draining = w->draining;
	/* Set before the submit: a worker may park it again at once. */
	j->wait_reclaiming = !draining;
	if (draining)
		w->reclaiming--;
	pthread_mutex_unlock(&w->mu);
	if (draining) {
		finish(w, x, WAITERS_SHUTDOWN);
		return;
	}
	if (w->ops.submit(w->ops.arg, j)) {
		free(x);
		return;
	}
	pthread_mutex_lock(&w->mu);
	reclaim_done(w, j);
	draining = w->draining;
	if (!draining) {
		x->recheck_ms = mono_ms() + RESUBMIT_MS;
		link_waiter(w, x);
	}
	pthread_mutex_unlock(&w->mu);
	if (draining)
		finish(w, x, WAITERS_SHUTDOWN);
}

typedef struct scratch {
	struct pollfd *pfd;
	uint64_t *seq;
	size_t cap;
} scratch;

/* With the lock held: moves due and expired waiters to the two lists,
 * fills the poll set, and returns when the next deadline comes. */
static double collect(waiters *w, scratch *s, size_t *nfds, waiter **due,
		      waiter **expired)
{
	double now = mono_ms(), next = now + 1000.0;
	waiter *x = w->head, *nx;
	for (; x; x = nx) {
		nx = x->next;
		bool over = x->j->wait_until_ms <= now;
		bool ready = x->recheck_ms <= now;
		if (over || (ready && w->reclaiming < w->reclaim_max)) {
			unlink_waiter(w, x);
			if (!over)
				w->reclaiming++;
			x->next = over ? *expired : *due;
			*(over ? expired : due) = x;
			continue;
		}
		/* A due waiter without a place is taken when one frees
		 * (the thread is poked then). */
		next = dmin(next, x->j->wait_until_ms);
		if (!ready)
			next = dmin(next, x->recheck_ms);
	}
	if (s->cap < (size_t)w->parked + 1) {
		s->cap = (size_t)w->parked + 64;
		s->pfd = xrealloc(s->pfd, s->cap * sizeof *s->pfd);
		s->seq = xrealloc(s->seq, s->cap * sizeof *s->seq);
	}
	size_t n = 0;
	for (x = w->head; x; x = x->next) {
		if (x->j->client_fd < 0)
			continue;
		/* Not POLLIN: a pipelined next request is no hang-up. Once
		 * the client has half-closed, only a reset or an error
		 * (always reported) says it is gone. */
		short ev = x->read_closed ? 0 : POLLRDHUP;
		s->pfd[n] = (struct pollfd){x->j->client_fd, ev, 0};
		s->seq[n++] = x->seq;
	}
	s->pfd[n] = (struct pollfd){w->efd, POLLIN, 0};
	*nfds = n;
	return next;
}

/* With the lock held: the waiters whose clients hung up. A FIN alone
 * (POLLRDHUP) is not one: a client that shut down its sending side after
 * the request (shutdown(SHUT_WR)) still reads its answer, and TCP cannot
 * tell it from one that closed (that one is found when its answer is
 * written, at the latest at wait_max). A reset or an error is. */
static waiter *hung_up(waiters *w, const scratch *s, size_t n)
{
	waiter *gone = NULL;
	for (size_t i = 0; i < n; i++) {
		short ev = s->pfd[i].revents;
		if (!(ev & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
			continue;
		for (waiter *x = w->head; x; x = x->next) {
			if (x->seq != s->seq[i])
				continue;
			if (!(ev & (POLLHUP | POLLERR | POLLNVAL))) {
				x->read_closed = true;
				break;
			}
			unlink_waiter(w, x);
			x->next = gone;
			gone = x;
			break;
		}
	}
	return gone;
}

static void *waiters_main(void *arg)
{
	waiters *w = arg;
	scratch s = {0};
	pthread_mutex_lock(&w->mu);
	while (!w->stopping) {
		waiter *due = NULL, *expired = NULL, *nx;
		size_t n = 0;
		double next = collect(w, &s, &n, &due, &expired);
		pthread_mutex_unlock(&w->mu);
		for (waiter *x = expired; x; x = nx) {
			nx = x->next;
			finish(w, x, WAITERS_TIMED_OUT);
		}
		for (waiter *x = due; x; x = nx) {
			nx = x->next;
			resubmit(w, x);
		}
		if (due || expired) {
			pthread_mutex_lock(&w->mu);
			continue;
		}
		double left = next - mono_ms() + 1.0; /* round up */
		int timeout = left < 0 ? 0 : left > 1000 ? 1000 : (int)left;
		int rc = poll(s.pfd, n + 1, timeout);
		if (rc > 0 && (s.pfd[n].revents & POLLIN)) {
			uint64_t v;
			ssize_t r = read(w->efd, &v, sizeof v);
			(void)r;
		}
		pthread_mutex_lock(&w->mu);
		if (rc <= 0)
			continue;
		waiter *gone = hung_up(w, &s, n);
		pthread_mutex_unlock(&w->mu);
		for (waiter *x = gone; x; x = nx) {
			nx = x->next;
			finish(w, x, WAITERS_CLIENT_GONE);
		}
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
	free(s.pfd);
	free(s.seq);
	return NULL;
}

waiters *waiters_start(int max_waiters, int max_per_tenant, int max_reclaims,
			const waiters_ops *ops)
{
	waiters *w = xcalloc(1, sizeof *w);
	w->reclaim_max = max_reclaims > 0 ? max_reclaims : 1;
	pthread_mutex_init(&w->mu, NULL);
	atomic_init(&w->waiting, 0);
	atomic_init(&w->max, max_waiters);
	w->max_per_tenant = max_per_tenant;
	w->ops = *ops;
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ALWAYS_ASSERT(w->efd >= 0);
	ALWAYS_ASSERT(pthread_create(&w->th, NULL, waiters_main, w) == 0);
	pthread_setname_np(w->th, "ip-waiters");
	metrics_set_waiters(0);
	return w;
}

void waiters_set_max(waiters *w, int max_waiters, int max_per_tenant)
{
	pthread_mutex_lock(&w->mu);
	atomic_store(&w->max, max_waiters);
	w->max_per_tenant = max_per_tenant;
	pthread_mutex_unlock(&w->mu);
}

/* With the lock held. */
static int per_tenant(const waiters *w)
{
	if (w->max_per_tenant > 0)
		return w->max_per_tenant;
	int half = (atomic_load(&w->max) + 1) / 2;
	return half > 0 ? half : 1;
}

static tenant_slot **tenant_bucket(waiters *w, const char *tenant)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (const char *c = tenant; *c; c++)
		h = (h ^ (uint8_t)*c) * 16777619u;
	return &w->tenants[h % TENANT_BUCKETS];
}

/* With the lock held: the tenant's entry, made if it has none. */
static tenant_slot *tenant_get(waiters *w, const char *tenant)
{
	tenant_slot **b = tenant_bucket(w, tenant);
	for (tenant_slot *t = *b; t; t = t->next)
		if (!strcmp(t->name, tenant))
			return t;
	size_t n = strlen(tenant);
	tenant_slot *t = xcalloc(1, sizeof *t + n + 1);
	memcpy(t->name, tenant, n + 1);
	t->next = *b;
	*b = t;
	return t;
}

/* With the lock held: frees the entry once nobody of the tenant waits. */
static void tenant_put(waiters *w, tenant_slot *t)
{
	if (t->n > 0)
		return;
	for (tenant_slot **p = tenant_bucket(w, t->name); *p; p = &(*p)->next)
		if (*p == t) {
			*p = t->next;
			free(t);
			return;
		}
}

/* With the lock held: NULL when admitted, else the outcome to count. */
static const char *admit_locked(waiters *w, job *j, const char *tenant)
{
	if (w->draining)
		return "shutdown";
	int n = atomic_load(&w->waiting);
	if (n >= atomic_load(&w->max))
		return "rejected_full";
	tenant_slot *t = tenant_get(w, tenant);
	if (t->n >= per_tenant(w)) {
		tenant_put(w, t);
		return "rejected_tenant_full";
	}
	atomic_store(&w->waiting, n + 1);
	t->n++;
	j->wait_slot = t;
	metrics_set_waiters(n + 1);
	return NULL;
}

bool waiters_admit(waiters *w, job *j, const char *tenant)
{
	pthread_mutex_lock(&w->mu);
	const char *why = admit_locked(w, j, tenant);
	int max = atomic_load(&w->max), per = per_tenant(w);
	pthread_mutex_unlock(&w->mu);
	if (!why)
		return true;
	metrics_wait_outcome(j->route_name, why);
	log_info("duplicate not held: too many waiting",
		 "request_id=%s trace_id=%s "
		 "route=%s outcome=%s max_waiters=%d "
		 "max_waiters_per_tenant=%d",
		 j->request_id, job_trace_id(j), j->route_name, why, max, per);
	return false;
}

void waiters_leave(waiters *w, job *j, const char *outcome)
{
	pthread_mutex_lock(&w->mu);
	bool freed = reclaim_done(w, j);
	tenant_slot *t = j->wait_slot;
	j->wait_slot = NULL;
	if (t) {
		t->n--;
		tenant_put(w, t);
	}
	int n = atomic_fetch_sub(&w->waiting, 1) - 1;
	pthread_mutex_unlock(&w->mu);
	if (freed)
		poke(w);
	metrics_set_waiters(n);
	double waited = mono_ms() - j->wait_since_ms;
	metrics_observe_wait_ms(waited);
	metrics_wait_outcome(j->route_name, outcome);
	log_info("duplicate done waiting",
		 "request_id=%s trace_id=%s route=%s outcome=%s "
		 "waited_ms=%.1f",
		 j->request_id, job_trace_id(j), j->route_name, outcome,
		 waited);
}

uint64_t waiters_generation(waiters *w)
{
	pthread_mutex_lock(&w->mu);
	uint64_t g = w->gen;
	pthread_mutex_unlock(&w->mu);
	return g;
}

/* With the lock held. */
static bool woken_since(const waiters *w, const uint8_t *scope, uint64_t gen)
{
	if (w->gen - gen >= RECENT)
		return true;
	for (uint64_t g = gen + 1; g <= w->gen; g++) {
		const __typeof__(w->recent[0]) *r = &w->recent[g % RECENT];
		if (r->all || !memcmp(r->scope, scope, WAKE_SCOPE_LEN))
			return true;
	}
	return false;
}

bool waiters_park(waiters *w, job *j, const uint8_t scope[WAKE_SCOPE_LEN],
		  double recheck_ms, uint64_t generation)
{
	pthread_mutex_lock(&w->mu);
	reclaim_done(w, j);
	if (w->draining) {
		pthread_mutex_unlock(&w->mu);
		poke(w);
		return false;
	}
	waiter *x = xcalloc(1, sizeof *x);
	x->j = j;
	memcpy(x->scope, scope, WAKE_SCOPE_LEN);
	x->recheck_ms = woken_since(w, scope, generation) ? 0 : recheck_ms;
	x->seq = ++w->next_seq;
	link_waiter(w, x);
	pthread_mutex_unlock(&w->mu);
	poke(w);
	return true;
}

static void wake(waiters *w, const uint8_t *scope)
{
	bool any = false;
	pthread_mutex_lock(&w->mu);
	w->gen++;
	w->recent[w->gen % RECENT].all = scope == NULL;
	if (scope)
		memcpy(w->recent[w->gen % RECENT].scope, scope, WAKE_SCOPE_LEN);
	for (waiter *x = w->head; x; x = x->next) {
		if (scope && memcmp(x->scope, scope, WAKE_SCOPE_LEN))
			continue;
		x->recheck_ms = 0;
		any = true;
	}
	pthread_mutex_unlock(&w->mu);
	if (any)
		poke(w);
}

void waiters_wake(waiters *w, const uint8_t scope[WAKE_SCOPE_LEN])
{
	wake(w, scope);
}

void waiters_wake_all(waiters *w)
{
	wake(w, NULL);
}

bool waiters_any(waiters *w)
{
	return atomic_load(&w->waiting) > 0;
}

int waiters_count(waiters *w)
{
	return atomic_load(&w->waiting);
}

static waiter *take_all(waiters *w)
{
	waiter *all = w->head;
	w->head = w->tail = NULL;
	w->parked = 0;
	return all;
}

void waiters_drain(waiters *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->draining = true;
	waiter *all = take_all(w);
	pthread_mutex_unlock(&w->mu);
	for (waiter *x = all, *nx; x; x = nx) {
		nx = x->next;
		finish(w, x, WAITERS_SHUTDOWN);
	}
}

void waiters_stop(waiters *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stopping = true;
	w->draining = true;
	pthread_mutex_unlock(&w->mu);
	poke(w);
	pthread_join(w->th, NULL);
	/* drain answered them all before the front end stopped */
	ALWAYS_ASSERT(w->head == NULL);
	close(w->efd);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
