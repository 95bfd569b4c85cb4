/* One PostgreSQL connection owned by one thread: connect with sane
 * defaults (timeouts, keepalives, statement_timeout), notice when it broke,
 * reconnect on next use, and log only the transitions (lost / back). Shared
 * by the store (workers, reaper) and the admin API's queries.
 *
 * The links of a process also know of each other: the first connection
 * found lost makes every other link look at its own before its next use
 * (those already half-closed are shut at once), and a connection made to
 * another server than the last one (libpq's multi-host URL after a
 * failover) retires every connection still on the old one. The process
 * logs one `store connection lost` and one `store failover` (or `store
 * connection re-established`) per event, whatever the number of links. */
#ifndef IDEMPROXY_PG_LINK_H
#define IDEMPROXY_PG_LINK_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct pg_link {
	char *url;
	const char *app;   /* application_name, also the log label */
	int64_t statement_timeout_ms; /* wanted */
	int64_t timeout_set_ms;       /* in force on conn */
	PGconn *conn;
	bool down;         /* the last attempt to reach the database failed */
	double cap_ms;     /* no wait goes past this (mono_ms); 0: none */
	bool stalled;      /* the last wait hit its deadline: conn dropped */
	char why[64];      /* what the stall said */
	/* Set while conn is open (pg_link.c's registry of links): */
	struct pg_link *reg_prev, *reg_next;
	bool registered;
	bool swept;      /* shut by another link's sweep (under its lock) */
	int sock;        /* conn's socket */
	unsigned gen;    /* the registry's generation last looked at */
	char server[96]; /* host:port conn went to */
} pg_link;

/* What every store connection gets unless database.url sets it (the URL
 * comes last and wins): TCP keepalives after 10 s idle, every 5 s, 3
 * unanswered ones close the connection (a server gone silent, not only
 * one that closed, is found within 25 s even on an idle connection), and
 * data unacknowledged for 10 s closes it too (doc/operations.md#failover). */
#define PG_LINK_TCP_KEYS \
	"keepalives", "keepalives_idle", "keepalives_interval", \
		"keepalives_count", "tcp_user_timeout"
#define PG_LINK_TCP_VALS "1", "10", "5", "3", "10000"

void pg_link_init(pg_link *l, const char *url, const char *app,
		  int64_t statement_timeout_ms);
void pg_link_close(pg_link *l);

/* The statement_timeout for the next use: a reload may change it. The
 * owning thread calls this; the SET goes out on the next pg_link_connect
 * only if the value differs from the one in force. */
void pg_link_set_statement_timeout(pg_link *l, int64_t ms);

/* Connects if not connected, and brings statement_timeout up to date.
 * *fresh (may be NULL) tells whether a new connection was made (statements
 * must be prepared again). 0 or -1. */
int pg_link_connect(pg_link *l, bool *fresh, char *err,
		    size_t errlen) MUST_CHECK;

/* Closes the connection (the next pg_link_connect makes a new one). Every
 * close of l->conn goes through here or pg_link_close. */
void pg_link_drop(pg_link *l);

/* Adds idemproxy_store_failovers_total to /metrics (at start). */
void pg_link_publish(void);

/* After a failed call: PQstatus only changes after a failed read or write,
 * so drop a connection that broke. True if it was dropped (also when the
 * call's wait hit its deadline and dropped it). */
bool pg_link_drop_if_broken(pg_link *l);

/* How long any wait for the store's answer may last: statement_timeout
 * + max(1 s, statement_timeout / 2) (statement_timeout 0, as on the LISTEN
 * connection, counts as the default 2 s). The server's statement_timeout
 * does not fire when the network path or the server stalls; this does. */
int64_t pg_link_wait_ms(int64_t statement_timeout_ms);

/* An absolute deadline (mono_ms's clock; 0: none) that every wait of
 * the link's until the next call also keeps: a record bounded by its
 * lease. */
void pg_link_cap(pg_link *l, double deadline_ms);

/* After a PQsend* call on l->conn (sent: whether it returned 1): its
 * results, the last one returned as PQexec would. On a fiber the answer is
 * awaited through the scheduler (fiber.h), on a plain thread in poll(),
 * both until pg_link_wait_ms (and the cap): past it the connection is
 * closed (l->conn NULL, l->stalled set, pg_link_error says so) and NULL is
 * returned, as when nothing was sent. Every connection is nonblocking. */
PGresult *pg_link_result(pg_link *l, bool sent);
/* PQexec, the same way. */
PGresult *pg_link_exec(pg_link *l, const char *sql);
/* PQexecParams, the same way. */
PGresult *pg_link_exec_params(pg_link *l, const char *sql, int n,
			      const Oid *types, const char *const *vals,
			      const int *lens, const int *fmts,
			      int result_format);
/* Why the last call failed: the stall, or libpq's message. */
const char *pg_link_error(const pg_link *l);

/* Server notices (NOTICE, WARNING) are not printed on stderr. */
void pg_link_quiet(PGconn *c);

/* "what: message" with libpq's newlines folded, into err. */
void pg_link_err(char *err, size_t errlen, const char *what,
		 const char *pgmsg);

#endif
