/* The admin listener: /healthz, /readyz, /metrics and the admin API
 * (/admin/keys/{tenant}/{operation}/{key}). Its own libmicrohttpd daemon
 * with one thread, which owns one store connection (store_admin). */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "util.h"

typedef struct admin admin;

/* listen and db_url are used by admin_start only (the URL is copied). */
typedef struct admin_opts {
	const char *listen;
	const char *db_url;
	int64_t statement_timeout_ms;
	/* The configuration in force, as a new reference. The admin token is
	 * read from it on every request, so a reload can change it. */
	config *(*get_config)(void *arg);
	void *arg;
	/* Called after a record was released or purged, so this process
	 * forgets anything it cached about the key. May be NULL. */
	void (*forget)(void *arg, const char *tenant, const char *operation,
		       const char *key);
	void *forget_arg;
} admin_opts;

admin *admin_start(const admin_opts *o, char *err, size_t errlen) MUST_CHECK;
void admin_stop(admin *a);

/* Percent-decodes one path segment of n bytes into out (n + 1 bytes).
 * -1 on a malformed escape, or when the result holds a byte no record key
 * can hold (outside visible ASCII and space), or is empty. */
int admin_decode_segment(const char *s, size_t n, char *out) MUST_CHECK;

/* Is header (an Authorization value) "Bearer <token>"? Compares in
 * constant time; an empty token never matches. */
bool admin_token_ok(const char *header, const char *token);

#endif
