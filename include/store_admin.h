/* The admin API's own queries: readiness, reading one record, releasing or
 * purging it. One `store_admin` is one PostgreSQL connection used by the
 * admin listener's thread alone; it is made on first use and re-made after
 * it breaks. Administration is rare, so statements are not prepared. */
#ifndef IDEMPROXY_STORE_ADMIN_H
#define IDEMPROXY_STORE_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct store_admin store_admin;

/* Does not connect yet; the first call does. */
store_admin *store_admin_new(const char *url, int64_t statement_timeout_ms);
void store_admin_free(store_admin *s);
/* As store_set_statement_timeout. */
void store_admin_set_statement_timeout(store_admin *s, int64_t ms);

/* 0 when the database answers and its schema version is at least want;
 * else -1 with the reason in err. */
int store_admin_ready(store_admin *s, int want, char *err,
		      size_t errlen) MUST_CHECK;

/* A record as stored. Strings are NUL-terminated and NULL where the column
 * is NULL; times are RFC 3339 in UTC. They point into res and stay valid
 * until store_admin_record_clear. */
typedef struct admin_record {
	const char *tenant;
	const char *operation;
	const char *key;
	const char *state;
	int attempt;
	const char *request_hash_hex;
	const char *owner_token;
	const char *lease_until;
	const char *created_at;
	const char *updated_at;
	const char *expires_at;
	bool expired;          /* expires_at has passed (not purged yet) */
	bool hold_on_unknown;
	bool has_status;
	int response_status;
	char *response_headers;       /* "Name: value\r\n" lines, the bytes
					 stored (owned, NUL-terminated) */
	size_t response_headers_len;
	const char *response_body_b64;
	int replayable;        /* 1, 0, or -1 when not recorded */
	/* The end of the stored response (before expires_at when the key is
	 * kept longer: retain_key), and whether the record is a tombstone
	 * now: completed, its response past its end, its key kept. */
	const char *response_expires_at;
	bool tombstone;
	void *res;             /* the PGresult */
} admin_record;

/* *found is false when there is no such record. 0, or -1 on a store
 * failure (err filled). */
int store_admin_get(store_admin *s, const char *tenant, const char *operation,
		    const char *key, admin_record *out, bool *found, char *err,
		    size_t errlen) MUST_CHECK;
void store_admin_record_clear(admin_record *r);

enum admin_delete_action {
	ADMIN_DEL_ABSENT,    /* no such record */
	ADMIN_DEL_RELEASED,  /* was processing: now released */
	ADMIN_DEL_PURGED,    /* was completed or released: deleted */
	ADMIN_DEL_IN_FLIGHT, /* processing with a live lease: left as it is */
};

typedef struct admin_delete_result {
	enum admin_delete_action action;
	char previous_state[16]; /* the state the record had */
	char lease_until[40];    /* ADMIN_DEL_IN_FLIGHT: when the lease ends
				    (RFC 3339, UTC) */
} admin_delete_result;

/* Releases a processing record, deletes any other, atomically with respect
 * to concurrent attempts. A processing record whose lease is alive is
 * released only when force is set (else ADMIN_DEL_IN_FLIGHT, unchanged).
 * 0, or -1 on a store failure (err filled). */
int store_admin_delete(store_admin *s, const char *tenant,
		       const char *operation, const char *key, bool force,
		       admin_delete_result *out, char *err,
		       size_t errlen) MUST_CHECK;

#endif
