/* The idempotency decision (SPEC 3.2, 3.4), without I/O: which route, whether
 * a request needs a claim, how a claim result and an upstream outcome turn
 * into a record and an answer. */
#ifndef IDEMPROXY_DECIDE_H
#define IDEMPROXY_DECIDE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "key_header.h"
#include "job.h"

enum plan_action {
	PLAN_REJECT,      /* answer with a problem; nothing is written */
	PLAN_PASSTHROUGH, /* forward without protection */
	PLAN_CLAIM,       /* claim the key, then forward / replay / refuse */
	PLAN_CONTRACT,    /* answer with the contract (contract_path) */
};

#define PLAN_TENANT_MAX 255
#define PLAN_JWT_ISSUER_MAX ROUTE_JWT_ISSUER_MAX
/* The stored tenant names its source: "NAME" for static:NAME (no ':'),
 * "header:VALUE", "authorization:HEX", "jwt:ISSUER:VALUE" (ISSUER escaped
 * by pct_escape, so the first ':' after it ends it). */
#define PLAN_TENANT_STORED_MAX (PLAN_TENANT_MAX + PLAN_JWT_ISSUER_MAX + 16)
/* A quoted key with every character escaped. */
#define PLAN_KEY_HEADER_MAX (2 * KEY_LEN_MAX + 2)

typedef struct request_plan {
	enum plan_action action;
	const route_cfg *route;   /* NULL when no route matched */
	/* PLAN_REJECT */
	int status;
	const char *code;
	const char *outcome;      /* the metrics outcome */
	char detail[240];
	/* PLAN_CLAIM */
	/* The record's key: the Idempotency-Key header's key, or the parts of
	 * key_from joined (key_from.h). */
	char key[KEY_FROM_KEY_MAX + 1];
	/* What the upstream gets as Idempotency-Key when that header is a key
	 * part; "" when it is not (the header, if any, is forwarded as sent). */
	char key_header[PLAN_KEY_HEADER_MAX + 1];
	char tenant[PLAN_TENANT_STORED_MAX + 1];
} request_plan;

typedef struct decide_request {
	const char *method;
	const char *target;     /* raw path and query, NUL-terminated */
	size_t path_len;        /* the path part of target */
	const header_list *headers;
	const char *body;       /* for body: key parts */
	size_t body_len;
	int64_t now_ms;         /* Unix time, for JWT exp and nbf */
} decide_request;

/* Steps 1-2 of SPEC 3.2: route, method, key and tenant. */
void decide_plan(const config *cfg, const decide_request *rq,
		 request_plan *out);

/* The one spelling of key forwarded upstream on every attempt, however the
 * client wrote it: the bare form when the key is a valid bare value, else an
 * sf-string with '"' and '\\' escaped. out holds PLAN_KEY_HEADER_MAX + 1. */
void decide_key_header(const char *key, char out[PLAN_KEY_HEADER_MAX + 1]);

/* The form of an Authorization value that names its tenant: surrounding
 * whitespace removed, the scheme case-folded (first letter upper case, the
 * rest lower: "bearer" and "BEARER" are "Bearer"), one space before the
 * credentials, which stay as they are (they are case-sensitive). Appended to
 * out; empty for a value that is only whitespace. */
void decide_canonical_credentials(const char *value, growbuf *out);

enum decide_record {
	REC_COMPLETE,     /* completed: replay later */
	REC_RELEASE,      /* released: a retry forwards again */
	REC_LEAVE,        /* outcome unknown: leave processing (lease rules) */
};

/* How an upstream outcome is recorded (SPEC 3.4). got_response false means
 * nothing was sent when sent is false, or the outcome is unknown. */
enum decide_record decide_record_for(const route_cfg *r, bool got_response,
				     bool sent, int status);

/* How long a duplicate that finds its key in flight may wait for the
 * original's answer (ms; 0: answered 409 at once): the route's wait_max on
 * an in_flight = "wait" route, or what the client asked for with
 * `Prefer: wait=N` (RFC 7240), on any route, capped by wait_max. *applied_s
 * is the N for `Preference-Applied: wait=N`, or -1 when the request asked
 * for no wait (or its wait= did not parse). */
int64_t decide_wait_ms(const route_cfg *r, const header_list *h,
		       int64_t *applied_s);

/* Retry-After seconds for a duration in ms: rounded up, at least 1. */
int64_t decide_retry_after_s(int64_t ms);

/* The stored form of the replayable headers: "Name: value\r\n" for each
 * response header named in the route's replay_headers. */
void decide_encode_replay_headers(const route_cfg *r, const header_list *h,
				  growbuf *out);
/* And back. Lines that do not parse are skipped. */
void decide_decode_replay_headers(const char *s, size_t len, header_list *out);

#endif
