#include "pg_link.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fiber.h"
#include "log.h"
#include "metrics.h"
#include "pg_resolve.h"

void pg_link_init(pg_link *l, const char *url, const char *app,
		  int64_t statement_timeout_ms)
{
	memset(l, 0, sizeof *l);
	l->url = xstrdup(url);
	l->app = app;
	l->statement_timeout_ms = statement_timeout_ms;
}

void pg_link_close(pg_link *l)
{
	pg_link_drop(l);
	free(l->url);
	l->url = NULL;
}

void pg_link_err(char *err, size_t errlen, const char *what,
		 const char *pgmsg)
{
	char msg[512];
	/* An error is often logged as a quoted value, which would show
	 * libpq's line breaks as \xHH: fold them here. */
	log_fold_lines(msg, sizeof msg, pgmsg ? pgmsg : "");
	snprintf(err, errlen, "%s: %s", what, msg);
}

/* --- the process's links, and its view of the store ------------------ */

/* Every link with an open connection, so that the first one found lost can
 * look at the others: their owners may be idle for minutes (the admin
 * listener, the record retrier, a quiet worker or batch lane) and would
 * keep a half-closed connection to a dead server until their next use.
 * A link joins once connected and leaves before its connection is closed;
 * the sweep touches a socket only under reg_mu, so never a closed one. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pg_link *reg_head;
static char reg_server[96]; /* the server of the last connection made */
static bool reg_lost;       /* a link lost the store; none connected since */
static atomic_uint reg_gen = 1; /* bumped by each loss and failover */
static atomic_uint_fast64_t reg_failovers;

static void reg_add_locked(pg_link *l)
{
	l->reg_prev = NULL;
	l->reg_next = reg_head;
	if (reg_head)
		reg_head->reg_prev = l;
	reg_head = l;
	l->registered = true;
	l->swept = false;
}

static void reg_remove_locked(pg_link *l)
{
	if (!l->registered)
		return;
	if (l->reg_prev)
		l->reg_prev->reg_next = l->reg_next;
	else
		reg_head = l->reg_next;
	if (l->reg_next)
		l->reg_next->reg_prev = l->reg_prev;
	l->registered = false;
}

/* The server closed its side (or the socket failed): nothing an idle
 * connection could still use. Data waiting (a NOTIFY) is not that. */
static bool hung_up(int sock)
{
	struct pollfd p = {.fd = sock, .events = POLLIN | POLLRDHUP};
	return poll(&p, 1, 0) > 0 &&
	       (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Shuts the sockets of the other links that hung_up says are dead, or all
 * of them not on server (NULL: none). The owner finds its connection
 * broken on its next look (pg_link_connect) and makes a new one quietly;
 * meanwhile the socket no longer holds on to the old server. */
static void sweep_locked(const pg_link *self, const char *server)
{
	for (pg_link *o = reg_head; o; o = o->reg_next) {
		if (o == self || o->swept)
			continue;
		if ((server && strcmp(o->server, server)) || hung_up(o->sock)) {
			shutdown(o->sock, SHUT_RDWR);
			o->swept = true;
		}
	}
}

void pg_link_drop(pg_link *l)
{
	if (!l->conn)
		return;
	pthread_mutex_lock(&reg_mu);
	reg_remove_locked(l);
	pthread_mutex_unlock(&reg_mu);
	PQfinish(l->conn);
	l->conn = NULL;
}

/* The link cannot reach the store. The process logs the first such link
 * of an event only (the others' lines are debug): a failover or restart
 * breaks every connection at once, which is one event, not one error per
 * connection. The first one also sweeps the others' dead connections. */
static void mark_down(pg_link *l, const char *why)
{
	if (l->down)
		return;
	l->down = true;
	pthread_mutex_lock(&reg_mu);
	bool first = !reg_lost && !l->swept;
	if (first) {
		reg_lost = true;
		atomic_fetch_add(&reg_gen, 1);
		sweep_locked(l, NULL);
	}
	pthread_mutex_unlock(&reg_mu);
	if (first)
		log_warn("store connection lost", "who=%s server=%s %s", l->app,
			 l->server[0] ? l->server : "-", why);
	else
		log_debug("store connection lost", "who=%s server=%s %s",
			  l->app, l->server[0] ? l->server : "-", why);
}

/* Once connected: the link joins the registry. A server other than the
 * last one is a failover (libpq went on to the next host of the URL):
 * logged once, counted, and every connection still on the old server is
 * retired, whether it noticed yet or not. */
static void mark_up(pg_link *l)
{
	snprintf(l->server, sizeof l->server, "%s:%s", PQhost(l->conn),
		 PQport(l->conn));
	l->sock = PQsocket(l->conn);
	char from[sizeof reg_server];
	from[0] = '\0';
	pthread_mutex_lock(&reg_mu);
	reg_add_locked(l);
	bool back = reg_lost;
	if (reg_server[0] && strcmp(reg_server, l->server)) {
		snprintf(from, sizeof from, "%s", reg_server);
		atomic_fetch_add(&reg_failovers, 1);
		atomic_fetch_add(&reg_gen, 1);
		sweep_locked(l, l->server);
	}
	snprintf(reg_server, sizeof reg_server, "%s", l->server);
	reg_lost = false;
	l->gen = atomic_load(&reg_gen);
	pthread_mutex_unlock(&reg_mu);
	if (from[0])
		log_warn("store failover", "from=%s to=%s who=%s", from,
			 l->server, l->app);
	else if (back)
		log_info("store connection re-established", "server=%s who=%s",
			 l->server, l->app);
	else if (l->down)
		log_debug("store connection re-established", "server=%s who=%s",
			  l->server, l->app);
	l->down = false;
}

/* Before a connection is used again after another link saw the store go
 * (or move): one that was swept, hung up, or is on a server the others
 * left is closed quietly, and pg_link_connect makes a new one. */
static void look_again(pg_link *l)
{
	unsigned gen = atomic_load(&reg_gen);
	if (!l->conn || l->gen == gen)
		return;
	l->gen = gen;
	pthread_mutex_lock(&reg_mu);
	bool stale = l->swept || (reg_server[0] && !reg_lost &&
				  strcmp(l->server, reg_server));
	pthread_mutex_unlock(&reg_mu);
	if (!stale && !hung_up(l->sock))
		return;
	log_debug("store connection retired", "who=%s server=%s", l->app,
		  l->server);
	pg_link_drop(l);
}

static double read_failovers(void *arg)
{
	return (double)atomic_load(&reg_failovers);
}

void pg_link_publish(void)
{
	metrics_reading_bind(
		metrics_reading_add("idemproxy_store_failovers_total",
				    "counter",
				    "Times this process's store connections "
				    "moved to another server (a failover "
				    "through a multi-host database.url).",
				    "", read_failovers),
		NULL);
}

static void quiet_notices(void *arg, const char *msg)
{
}

void pg_link_quiet(PGconn *c)
{
	PQsetNoticeProcessor(c, quiet_notices, NULL);
}

void pg_link_set_statement_timeout(pg_link *l, int64_t ms)
{
	l->statement_timeout_ms = ms;
}

/* --- waiting, with a deadline ------------------------------------------ */

int64_t pg_link_wait_ms(int64_t statement_timeout_ms)
{
	int64_t st = statement_timeout_ms > 0 ? statement_timeout_ms : 2000;
	return st + (st / 2 > 1000 ? st / 2 : 1000);
}

void pg_link_cap(pg_link *l, double deadline_ms)
{
	l->cap_ms = deadline_ms;
}

const char *pg_link_error(const pg_link *l)
{
	if (l->stalled)
		return l->why;
	return l->conn ? PQerrorMessage(l->conn) : "no connection";
}

/* Until sock is ready for ev, or the deadline: on a fiber through the
 * scheduler, on a plain thread in poll(). False at the deadline. */
static bool wait_sock(int sock, int ev, double deadline)
{
	if (fiber_current())
		return fiber_wait_fd(sock, ev, deadline) != 0;
	struct pollfd p = {.fd = sock,
			   .events = (short)((ev & FIBER_IN ? POLLIN : 0) |
					     (ev & FIBER_OUT ? POLLOUT : 0))};
	for (;;) {
		double left = deadline - mono_ms();
		if (left <= 0)
			return false;
		int n = poll(&p, 1, (int)left + 1);
		/* an error: libpq's next read or write reports it */
		if (n > 0 || (n < 0 && errno != EINTR))
			return true;
	}
}

/* The server's statement_timeout cannot fire when the path to it (or the
 * server itself) stalls: past our own deadline the connection is dropped
 * and the call fails as an outage. */
static PGresult *stalled(pg_link *l, double t0, PGresult *partial)
{
	PQclear(partial);
	snprintf(l->why, sizeof l->why, "no answer from the store within %.1fs",
		 (mono_ms() - t0) / 1000.0);
	metrics_event("store_wait_timeout");
	mark_down(l, l->why);
	pg_link_drop(l);
	l->stalled = true;
	return NULL;
}

PGresult *pg_link_result(pg_link *l, bool sent)
{
	l->stalled = false;
	if (!sent)
		return NULL;
	PGconn *c = l->conn;
	double t0 = mono_ms();
	double deadline = t0 + (double)pg_link_wait_ms(l->statement_timeout_ms);
	if (l->cap_ms > 0 && l->cap_ms < deadline)
		deadline = l->cap_ms;
	int sock = PQsocket(c);
	/* what the send left in libpq's buffer (nonblocking connections) */
	while (PQflush(c) > 0) {
		if (!wait_sock(sock, FIBER_IN | FIBER_OUT, deadline))
			return stalled(l, t0, NULL);
		if (!PQconsumeInput(c))
			break;
	}
	PGresult *last = NULL;
	for (;;) {
		while (PQisBusy(c) && PQstatus(c) == CONNECTION_OK) {
			if (!wait_sock(sock, FIBER_IN, deadline))
				return stalled(l, t0, last);
			if (!PQconsumeInput(c))
				break;
		}
		PGresult *r = PQgetResult(c);
		if (!r)
			break;
		PQclear(last);
		last = r;
	}
	return last;
}

PGresult *pg_link_exec(pg_link *l, const char *sql)
{
	return pg_link_result(l, PQsendQuery(l->conn, sql) == 1);
}

PGresult *pg_link_exec_params(pg_link *l, const char *sql, int n,
			      const Oid *types, const char *const *vals,
			      const int *lens, const int *fmts,
			      int result_format)
{
	return pg_link_result(l, PQsendQueryParams(l->conn, sql, n, types,
						   vals, lens, fmts,
						   result_format) == 1);
}

/* PQconnectdbParams, waiting through the scheduler on a fiber. libpq
 * ignores connect_timeout when polled: the deadline is ours, from the
 * connection's own setting. Its host names are looked up first, off the
 * serving thread (pg_resolve.h): PQconnectStartParams gets addresses. */
static PGconn *connect_params(const char *const *keys,
			      const char *const *vals, char *why,
			      size_t whylen)
{
	why[0] = '\0';
	if (!fiber_current())
		return PQconnectdbParams(keys, vals, 1);
	pg_resolved rs;
	if (pg_resolve_params(keys, vals, &rs, why, whylen))
		return NULL;
	PGconn *c = PQconnectStartParams(rs.keys, rs.vals, 1);
	pg_resolved_free(&rs);
	if (!c || PQstatus(c) == CONNECTION_BAD)
		return c;
	double deadline = -1;
	PQconninfoOption *opts = PQconninfo(c);
	for (PQconninfoOption *o = opts; o && o->keyword; o++)
		if (!strcmp(o->keyword, "connect_timeout") && o->val &&
		    atoi(o->val) > 0)
			deadline = mono_ms() + 1000.0 * atoi(o->val);
	PQconninfoFree(opts);
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;
	while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
		int ev = st == PGRES_POLLING_READING ? FIBER_IN : FIBER_OUT;
		if (!fiber_wait_fd(PQsocket(c), ev, deadline)) {
			/* libpq's own words for it */
			snprintf(why, whylen, "timeout expired");
			PQfinish(c);
			return NULL;
		}
		st = PQconnectPoll(c);
	}
	return c;
}

static int set_timeout(pg_link *l, char *err, size_t errlen)
{
	char sql[64];
	snprintf(sql, sizeof sql, "SET statement_timeout = %lld",
		 (long long)l->statement_timeout_ms);
	PGresult *r = pg_link_exec(l, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		pg_link_err(err, errlen, "set", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	l->timeout_set_ms = l->statement_timeout_ms;
	return 0;
}

int pg_link_connect(pg_link *l, bool *fresh, char *err, size_t errlen)
{
	if (fresh)
		*fresh = false;
	look_again(l);
	if (l->conn) {
		if (l->timeout_set_ms == l->statement_timeout_ms)
			return 0;
		if (set_timeout(l, err, errlen) == 0)
			return 0;
		pg_link_drop_if_broken(l);
		return -1;
	}
	/* Our defaults first; the expanded URL (last) overrides any of them. */
	const char *keys[] = {"connect_timeout", PG_LINK_TCP_KEYS,
			      "application_name", "dbname", NULL};
	const char *vals[] = {"3", PG_LINK_TCP_VALS, l->app, l->url, NULL};
	char why[320];
	PGconn *c = connect_params(keys, vals, why, sizeof why);
	if (!c || PQstatus(c) != CONNECTION_OK) {
		pg_link_err(err, errlen, "connect",
			    c ? PQerrorMessage(c)
			      : why[0] ? why : "out of memory");
		if (c)
			PQfinish(c);
		mark_down(l, err);
		return -1;
	}
	pg_link_quiet(c);
	/* Nonblocking on every thread: a send never waits past the
	 * deadline either (pg_link_result flushes what it left). */
	l->conn = c;
	if (PQsetnonblocking(c, 1))
		pg_link_err(err, errlen, "connect", PQerrorMessage(c));
	if (PQstatus(c) != CONNECTION_OK || !PQisnonblocking(c) ||
	    set_timeout(l, err, errlen)) {
		mark_down(l, err);
		pg_link_drop(l);
		return -1;
	}
	mark_up(l);
	if (fresh)
		*fresh = true;
	return 0;
}

bool pg_link_drop_if_broken(pg_link *l)
{
	if (!l->conn)
		return l->stalled;
	if (PQstatus(l->conn) == CONNECTION_OK)
		return false;
	mark_down(l, PQerrorMessage(l->conn));
	pg_link_drop(l);
	return true;
}
