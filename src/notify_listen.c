#include "notify_listen.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "pg_link.h"
#include "store_pg.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

struct notify_listen {
	pg_link link;
	notify_listen_ops ops;
	int stop_pipe[2];
	pthread_t th;
};

/* Sleeps ms, or less when stopped; true when stopped. */
static bool pause_or_stop(notify_listen *n, int ms)
{
	struct pollfd p = {n->stop_pipe[0], POLLIN, 0};
	return poll(&p, 1, ms) > 0;
}

static int listen_now(notify_listen *n, char *err, size_t errlen)
{
	if (pg_link_connect(&n->link, NULL, err, errlen))
		return -1;
	PGresult *r = pg_link_exec(&n->link, "LISTEN " STORE_WAIT_CHANNEL);
	int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc) {
		pg_link_err(err, errlen, "listen",
			    r ? PQresultErrorMessage(r)
			      : pg_link_error(&n->link));
		if (n->link.conn)
			PQfinish(n->link.conn);
		n->link.conn = NULL;
	}
	PQclear(r);
	return rc;
}

static void deliver(notify_listen *n)
{
	PGnotify *m;
	while ((m = PQnotifies(n->link.conn))) {
		uint8_t scope[WAKE_SCOPE_LEN];
		if (wake_scope_parse(m->extra, scope) == 0)
			n->ops.wake(n->ops.arg, scope);
		PQfreemem(m);
	}
}

/* Until the connection breaks or a stop; true when stopped. */
static bool serve_connection(notify_listen *n)
{
	for (;;) {
		struct pollfd p[2] = {{PQsocket(n->link.conn), POLLIN, 0},
				      {n->stop_pipe[0], POLLIN, 0}};
		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			return true;
		if (!PQconsumeInput(n->link.conn)) {
			char err[256];
			pg_link_err(err, sizeof err, "listen",
				    PQerrorMessage(n->link.conn));
			/* pg_link logs the store's loss once for the
			 * process, not once per connection. */
			log_debug("wake-up listener lost its connection; "
				  "reconnecting",
				  "%s", err);
			if (!pg_link_drop_if_broken(&n->link))
				pg_link_drop(&n->link);
			return false;
		}
		deliver(n);
	}
}

static void *listen_main(void *arg)
{
	notify_listen *n = arg;
	int backoff = BACKOFF_MIN_MS;
	for (;;) {
		char err[256];
		if (listen_now(n, err, sizeof err)) {
			log_debug("wake-up listener cannot listen", "%s", err);
			if (pause_or_stop(n, backoff))
				break;
			backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
							       : backoff * 2;
			continue;
		}
		backoff = BACKOFF_MIN_MS;
		/* What was notified while no LISTEN was in force is lost. */
		n->ops.connected(n->ops.arg);
		if (serve_connection(n))
			break;
		if (pause_or_stop(n, BACKOFF_MIN_MS))
			break;
	}
	return NULL;
}

notify_listen *notify_listen_start(const char *db_url,
				   const notify_listen_ops *ops)
{
	notify_listen *n = xcalloc(1, sizeof *n);
	/* No statement runs on it but LISTEN: no statement_timeout needed. */
	pg_link_init(&n->link, db_url, "idemproxy-listen", 0);
	n->ops = *ops;
	ALWAYS_ASSERT(pipe(n->stop_pipe) == 0);
	ALWAYS_ASSERT(pthread_create(&n->th, NULL, listen_main, n) == 0);
	pthread_setname_np(n->th, "ip-listen");
	return n;
}

void notify_listen_stop(notify_listen *n)
{
	if (!n)
		return;
	ssize_t w = write(n->stop_pipe[1], "x", 1);
	(void)w;
	pthread_join(n->th, NULL);
	close(n->stop_pipe[0]);
	close(n->stop_pipe[1]);
	pg_link_close(&n->link);
	free(n);
}
