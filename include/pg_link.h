/* One PostgreSQL connection owned by one thread: connect with sane
 * defaults (timeouts, keepalives, statement_timeout), notice when it broke,
 * reconnect on next use, and log only the transitions (lost / back). Shared
 * by the store (workers, reaper) and the admin API's queries. */
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
} pg_link;

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
		    size_t errlen) IP_WUR;

/* After a failed call: PQstatus only changes after a failed read or write,
 * so drop a connection that broke. True if it was dropped. */
bool pg_link_drop_if_broken(pg_link *l);

/* After a PQsend* call (sent: whether it returned 1): its results, the
 * last one returned as PQexec would. On a fiber the answer is awaited
 * through the scheduler (fiber.h), on a plain thread as PQexec does.
 * NULL when nothing was sent. Connections made on a fiber are in
 * nonblocking mode. */
PGresult *pg_link_result(PGconn *c, bool sent);
/* PQexec, the same way. */
PGresult *pg_link_exec(PGconn *c, const char *sql);

/* Server notices (NOTICE, WARNING) are not printed on stderr. */
void pg_link_quiet(PGconn *c);

/* "what: message" with libpq's newlines folded, into err. */
void pg_link_err(char *err, size_t errlen, const char *what,
		 const char *pgmsg);

#endif
