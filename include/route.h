/* A route of the conf, and what a request asks of it at run time: which
 * route a path is for, whether it takes a method, whether a status
 * releases the key, how much of a lease stays free. The conf loader
 * (config_route.c) fills route_cfg; nothing here reads the conf file, so
 * planning a request (decide.c) descends to this without climbing back
 * into the loader. */
#ifndef IDEMPROXY_ROUTE_H
#define IDEMPROXY_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jsonptr.h"
#include "jwt_auth.h"
#include "key_from.h"
#include "pathtpl.h"
#include "util.h"

enum tenant_kind {
	TENANT_STATIC,
	TENANT_HEADER,
	TENANT_AUTHORIZATION,
	TENANT_JWT,
};

/* A jwt route's issuer, escaped by pct_escape, is at most this long: it
 * is part of every stored tenant of the route. */
#define ROUTE_JWT_ISSUER_MAX 255

typedef struct str_list {
	char **v;
	size_t n;
} str_list;

typedef struct route_cfg {
	char *name;        /* the operation */
	char *path;        /* the template as written */
	pathtpl *tpl;
	char *upstream;    /* base URL, without a trailing '/' */
	int line;          /* line of the route in the conf file */

	str_list methods;  /* upper-case */
	bool key_required;
	enum tenant_kind tenant_kind;
	char *tenant_arg;  /* NAME for static:/header:, CLAIM for jwt:, NULL for
			    * authorization */
	jwt_policy *jwt;   /* the jwt group; NULL when not set */
	key_from_cfg key_from;
	int64_t ttl_ms;
	/* >= ttl_ms: how long a completed key is kept; from ttl on its
	 * response is gone and a retry is refused (a tombstone) */
	int64_t retain_key_ms;
	int64_t lease_ms;
	int64_t upstream_timeout_ms;
	int64_t retry_after_ms;
	int mismatch_status; /* 409 or 422 */
	int *release_statuses;
	size_t n_release_statuses;
	bool on_unknown_hold;  /* false = release_after_lease */
	str_list replay_headers;
	str_list fingerprint_headers;
	bool status_only;  /* store_body = "status_only": no body stored */
	/* At most one of the two is non-empty. */
	jsonptr **fp_ignore;
	size_t n_fp_ignore;
	jsonptr **fp_only;
	size_t n_fp_only;
	bool in_flight_wait; /* in_flight = "wait": duplicates wait */
	int64_t wait_max_ms; /* longest a duplicate waits; <= lease_ms */
} route_cfg;

/* First of the n routes whose template matches the path (no query),
 * normalised by pathtpl_normalize, or NULL. */
const route_cfg *route_match(const route_cfg *routes, size_t n,
			     const char *path, size_t len);

bool route_has_method(const route_cfg *r, const char *method);
bool route_releases_status(const route_cfg *r, int status);

/* The part of an attempt's lease kept free after its upstream call: a
 * tenth of the lease, at least 100 ms, at most 2 s. An attempt sends only
 * with upstream_timeout plus this much of its lease left. */
#define ROUTE_LEASE_MARGIN_MIN_MS 100
#define ROUTE_LEASE_MARGIN_MAX_MS 2000
int64_t route_lease_margin_ms(const route_cfg *r);

#endif
