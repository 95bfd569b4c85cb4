/* The conf file (libconfig syntax), validated as a whole into an immutable,
 * reference-counted snapshot. Config is data: see the settings tables in
 * src/config.c. */
#ifndef IDEMPROXY_CONFIG_H
#define IDEMPROXY_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config_reload.h"
#include "log.h"
#include "route.h"
#include "seal.h"
#include "util.h"

typedef struct config {
	atomic_int refs;
	char *file;
	char *listen;        /* "host:port" or "[v6]:port" */
	char *admin_listen;  /* "" = disabled */
	char *admin_token;   /* "" = /admin disabled */
	char *contract_path; /* the contract on the public listener; "" = not
				served there (contract.h) */
	int workers;
	int queue_size;      /* jobs waiting for a worker; full -> 503 overloaded */
	int max_connections; /* front-end connection limit */
	int max_connections_per_ip; /* 0 = no limit (e.g. behind a balancer) */
	int64_t max_header_size; /* request line + headers; larger -> 431 */
	int64_t max_request_body;
	int64_t max_stored_response;
	int64_t max_response; /* held in memory: at least 16 x the above */
	int64_t replay_cache_size;  /* bytes; 0 disables the replay cache */
	int64_t replay_cache_ttl_ms; /* longest a cached replay is trusted */
	int max_waiters;     /* duplicates waiting at once; beyond -> 409 */
	int max_waiters_per_tenant; /* of those, one tenant's; 0: half */
	int64_t shutdown_grace_ms;
	int64_t request_head_timeout_ms; /* from ready for a request to its
					    whole head; then 408 and close */
	int64_t request_body_timeout_ms; /* from the head to the whole body */
	int64_t busy_poll_ms; /* 0 = off; see busy.h */
	int64_t loop_stall_max_ms; /* serving loop late by more: not ready */
	enum log_level log_level;
	int64_t log_flush_ms; /* 0 = every line written at once; see log.h */
	bool log_json;
	char *problem_type_base; /* a problem's type is this + its code */
	char *problem_doc_url;   /* "" = no Link: rel="describedby" */

	char *db_url;
	int64_t statement_timeout_ms;
	bool db_unavailable_forward; /* false = reject (503) */
	bool db_citus; /* distributed = "citus": records distributed by tenant */
	int db_batch;  /* most first attempts per statement (store_batch.h) */
	int64_t db_batch_stall_ms; /* a batch out this long is stuck (floor) */

	int64_t reaper_interval_ms;
	int reaper_batch;
	int64_t reaper_durability_interval_ms; /* store durability re-read */

	char *seal_keys_file; /* store_encryption.keys; "" = off */
	seal_keyring *seal;   /* loaded with the conf; NULL = off */
	int64_t seal_warn_seals; /* warn when the active key has sealed this
				    many (its nonce budget is ~2^32) */

	route_cfg *routes;
	size_t n_routes;
} config;

/* Calls fn for every setting of every table, in table order. scope is
 * "" (top level), "database", "reaper", "route" (defaults and routes) or
 * "route-only". For tests and documentation. */
void config_each_setting(void (*fn)(void *arg, const char *scope,
				    const char *name,
				    enum config_reload rule),
			 void *arg);

/* Names the restart-only settings whose value in next differs from the one
 * in running ("workers,database.url"), in table order, into buf (cut short
 * to fit); returns how many differ. */
size_t config_restart_changes(const config *running, const config *next,
			      char *buf, size_t len);

/* Loads and validates FILE, then applies the IDEMPROXY_DATABASE_URL and
 * IDEMPROXY_LISTEN environment overrides. On error returns NULL and writes
 * "FILE:LINE: what is wrong" (or "FILE: what" when no line applies) into err.
 * The result has one reference. */
config *config_load(const char *file, char *err, size_t errlen) MUST_CHECK;

config *config_ref(config *c);
void config_unref(config *c);

/* The human-readable summary printed by --check: one line per route. */
void config_print_routes(const config *c, FILE *out);

/* Splits a listen address as validated by config_load ("host:port" or
 * "[v6]:port") into host (brackets removed) and port, for binding. */
int config_split_listen(const char *s, char *host, size_t hostlen, int *port,
			char *err, size_t errlen) MUST_CHECK;

#endif
