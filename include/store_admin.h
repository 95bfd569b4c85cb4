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
	const char *trace_id;  /* hex: the trace of the first attempt (NULL:
				  none) */
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

/* ---- The key listing (GET /admin/keys) ------------------------------- */

/* A call walks at most this many records of the created_at index
 * (sql/014_admin_key_listing.sql) from its cursor, whatever its filters
 * match: its cost is bounded, and a page may come back short (even
 * empty) with a cursor to go on from. */
#define ADMIN_LIST_WALK 10000

enum admin_list_state {
	ADMIN_LIST_ANY,
	ADMIN_LIST_PROCESSING, /* processing, not held */
	ADMIN_LIST_HELD,       /* processing, on_unknown hold, lease ended */
	ADMIN_LIST_RELEASED,
	ADMIN_LIST_COMPLETED,
};

/* A place in the walk: created_at (RFC 3339, UTC, microseconds), tenant,
 * operation, key. */
typedef struct admin_list_pos {
	const char *v[4];
} admin_list_pos;

typedef struct admin_list_req {
	enum admin_list_state state;
	const char *tenant;          /* NULL: any */
	const char *operation;       /* NULL: any */
	int64_t older_than_ms;       /* < 0: any age */
	int limit;                   /* 1 .. ADMIN_LIST_WALK - 1 */
	bool newest;                 /* newest first (else oldest first) */
	const admin_list_pos *after; /* NULL: from the start */
} admin_list_req;

/* One record as listed: never its request or its response. Strings point
 * into the list's result. */
typedef struct admin_list_row {
	const char *tenant, *operation, *key;
	const char *state;      /* processing, held, released, completed */
	const char *created_at; /* RFC 3339, UTC */
	const char *age_s;      /* seconds since created_at, "12.345" */
	const char *outcome;    /* "2xx".."5xx", "executed", or NULL */
	int attempt;
	int64_t lease_left_ms; /* processing: what is left (0 when ended);
				  else -1 */
	bool hold_on_unknown;
	bool expired;
} admin_list_row;

typedef struct admin_list {
	admin_list_row *rows;
	size_t n;
	bool more;           /* next holds where the next page starts */
	admin_list_pos next; /* the last record this page covered */
	int walked;          /* records the walk read */
	void *res;
} admin_list;

/* The listing's statement for q into sql (a new buffer) and its
 * parameters into vals (older holds one of them); returns their count.
 * For the tests that EXPLAIN it. */
int store_admin_list_sql(const admin_list_req *q, growbuf *sql,
			 const char *vals[8], char older[24]);

/* 0, or -1 on a store failure (err filled). */
int store_admin_list(store_admin *s, const admin_list_req *q, admin_list *out,
		     char *err, size_t errlen) MUST_CHECK;
void store_admin_list_clear(admin_list *l);

/* ---- Settling a key (POST .../resolve) ------------------------------- */

typedef struct admin_resolve_req {
	const char *tenant, *operation, *key;
	int attempt;             /* > 0: the fence is this attempt number */
	const char *owner_token; /* else this owner token (uuid text) */
	/* The outcome, with status 0 for "executed, no answer to give". */
	int status;
	const char *headers; /* stored form ("Name: value\r\n" lines, maybe
				sealed); NULL with status 0 */
	size_t headers_len;
	const char *body; /* NULL: none */
	size_t body_len;
	const char *seal_key;     /* the key that sealed them, or NULL */
	const char *request_hash; /* the record's, as read: 32 bytes */
} admin_resolve_req;

enum admin_resolve_end {
	ADMIN_RES_DONE,       /* completed with the outcome given */
	ADMIN_RES_ABSENT,     /* no such record */
	ADMIN_RES_STALE,      /* another attempt holds the record now */
	ADMIN_RES_IN_FLIGHT,  /* the attempt's lease is alive */
	ADMIN_RES_NOT_PENDING /* completed or released: nothing to settle */
};

/* The record a resolve would settle: found, its state, attempt, owner,
 * whether its lease is alive, and its request hash (32 bytes), which a
 * sealed outcome is bound to. */
typedef struct admin_pending {
	bool found;
	char state[16];
	int attempt;
	char owner_token[40];
	bool lease_alive;
	uint8_t request_hash[32];
} admin_pending;

/* Reads what admin_pending shows. 0, or -1 on a store failure. */
int store_admin_pending(store_admin *s, const char *tenant,
			const char *operation, const char *key,
			admin_pending *out, char *err,
			size_t errlen) MUST_CHECK;

/* One UPDATE, fenced: it completes the record only while it is processing
 * at the attempt (or owner token) and request hash given, with its lease
 * ended. When it writes nothing, *end says why, as read right after.
 * 0, or -1 on a store failure (err filled). */
int store_admin_resolve(store_admin *s, const admin_resolve_req *q,
			enum admin_resolve_end *end, admin_pending *now,
			char *err, size_t errlen) MUST_CHECK;

#endif
