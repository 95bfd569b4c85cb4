/* Host-name lookups for connections made on a fiber. libpq resolves `host`
 * with a blocking getaddrinfo inside PQconnectStartParams, which would
 * stop the serving thread (and every client with it) for as long as the
 * resolver takes. Here each name of the conninfo, libpq's multi-host form
 * included (host=a,b; postgresql://u@h1:p1,h2:p2/db), is looked up on a
 * thread of its own while the fiber waits on an eventfd; the connection
 * then gets the addresses as `hostaddr`, one entry per address, and keeps
 * the names in `host` (TLS verification, libpq's messages). Plain threads
 * need none of this: they let libpq resolve. */
#ifndef IDEMPROXY_PG_RESOLVE_H
#define IDEMPROXY_PG_RESOLVE_H

#include <stddef.h>

#include "util.h"

#define PG_RESOLVE_MAX_KEYS 24

typedef struct pg_resolved {
	/* keys/vals to connect with: the caller's, then host, hostaddr and
	 * port when the lookups changed them (later keys win in libpq). */
	const char *keys[PG_RESOLVE_MAX_KEYS + 4];
	const char *vals[PG_RESOLVE_MAX_KEYS + 4];
	char *host, *hostaddr, *port; /* owned; NULL when not set */
} pg_resolved;

/* keys and vals as for PQconnectStartParams with expand_dbname (the
 * conninfo or URL is the value of "dbname"; at most PG_RESOLVE_MAX_KEYS).
 * On a fiber, waits at most connect_timeout for the lookups. A name that
 * does not resolve is left out of the list, as libpq skips a host it
 * cannot resolve; -1 when none is left. */
int pg_resolve_params(const char *const *keys, const char *const *vals,
		      pg_resolved *out, char *err, size_t errlen) MUST_CHECK;
void pg_resolved_free(pg_resolved *r);

#endif
