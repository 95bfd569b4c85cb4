/* POST /admin/keys/{tenant}/{operation}/{key}/resolve (admin_resolve.h). */
#include "admin_resolve.h"

#include <ctype.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"
#include "http_msg.h"
#include "log.h"
#include "metrics.h"
#include "route.h"
#include "seal.h"
#include "seal_tally.h"

#define HEADER_NAME_MAX 256
#define HEADER_VALUE_MAX 8192
#define HEADERS_MAX 100

/* What the operator sent, validated. */
typedef struct resolve_in {
	int attempt; /* > 0; 0 when fenced by owner_token */
	char owner_token[40];
	bool executed;    /* "executed, no answer to give" */
	const char *kind; /* "response" or "executed" once valid; NULL */
	int status;
	header_list headers;
	growbuf body;
	int http_status; /* of the refusal, when one */
	const char *code;
	char why[256];
} resolve_in;

size_t admin_resolve_max_request(int64_t max_stored)
{
	return (size_t)max_stored / 3 * 4 + 64 * 1024;
}

static int refuse(resolve_in *in, int status, const char *code, const char *fmt,
		  ...) __attribute__((format(printf, 4, 5)));

static int refuse(resolve_in *in, int status, const char *code, const char *fmt,
		  ...)
{
	in->http_status = status;
	in->code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(in->why, sizeof in->why, fmt, ap);
	va_end(ap);
	return -1;
}

/* RFC 9110 5.1 token characters. */
static bool tchar(unsigned char c)
{
	return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* RFC 9110 5.5: VCHAR, obs-text, SP and HTAB inside; none at either
 * end. */
static bool field_value(const char *v)
{
	size_t n = strlen(v);
	if (n > HEADER_VALUE_MAX)
		return false;
	if (n && (v[0] == ' ' || v[0] == '\t' || v[n - 1] == ' ' ||
		  v[n - 1] == '\t'))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return false;
	}
	return true;
}

/* Fields about one connection (RFC 9110 7.6.1), and the message's own
 * framing, which the proxy writes itself when it replays. */
static const char *const hop_by_hop[] = {
	"Connection",        "Keep-Alive", "Proxy-Connection", "TE", "Trailer",
	"Transfer-Encoding", "Upgrade",    "Content-Length",   NULL};

static int one_header(resolve_in *in, const char *name, json_t *v)
{
	size_t n = strlen(name);
	bool token = n > 0 && n <= HEADER_NAME_MAX;
	for (size_t i = 0; token && i < n; i++)
		token = tchar((unsigned char)name[i]);
	if (!token)
		return refuse(in, 400, "resolve_header_invalid",
			      "header name %.64s is not an RFC 9110 token",
			      name);
	for (int i = 0; hop_by_hop[i]; i++)
		if (str_caseeq(name, hop_by_hop[i]))
			return refuse(in, 400, "resolve_header_hop_by_hop",
				      "%s is about one connection or the "
				      "framing; it is not stored",
				      hop_by_hop[i]);
	if (!json_is_string(v) || !field_value(json_string_value(v)))
		return refuse(in, 400, "resolve_header_invalid",
			      "the value of %.64s must be a string of visible "
			      "characters, spaces and tabs (none at either "
			      "end), at most 8192 bytes",
			      name);
	const char *s = json_string_value(v);
	header_list_add(&in->headers, name, n, s, strlen(s));
	return 0;
}

static int parse_headers(resolve_in *in, json_t *h)
{
	if (!h)
		return 0;
	if (!json_is_object(h) || json_object_size(h) > HEADERS_MAX)
		return refuse(in, 400, "resolve_invalid",
			      "response.headers must be an object of at most "
			      "100 names, each with a string value");
	const char *name;
	json_t *v;
	json_object_foreach(h, name, v)
	{
		if (one_header(in, name, v))
			return -1;
	}
	return 0;
}

static int decode_b64(resolve_in *in, const char *s)
{
	size_t n = strlen(s);
	if (n % 4)
		return refuse(in, 400, "resolve_invalid",
			      "response.body_base64 is not padded base64");
	growbuf_reserve(&in->body, n / 4 * 3 + 1);
	int got = EVP_DecodeBlock((unsigned char *)in->body.data,
				  (const unsigned char *)s, (int)n);
	if (got < 0)
		return refuse(in, 400, "resolve_invalid",
			      "response.body_base64 is not base64");
	size_t pad =
		n && s[n - 1] == '=' ? (n > 1 && s[n - 2] == '=' ? 2 : 1) : 0;
	in->body.len = (size_t)got - pad;
	in->body.data[in->body.len] = '\0';
	return 0;
}

static int parse_body(resolve_in *in, json_t *body, json_t *b64,
		      int64_t max_stored)
{
	if (body && b64)
		return refuse(in, 400, "resolve_invalid",
			      "give response.body or response.body_base64, "
			      "not both");
	if ((body && !json_is_string(body)) || (b64 && !json_is_string(b64)))
		return refuse(in, 400, "resolve_invalid",
			      "response.body and response.body_base64 are "
			      "strings");
	if (body)
		growbuf_append(&in->body, json_string_value(body),
			       json_string_length(body));
	else if (b64 && decode_b64(in, json_string_value(b64)))
		return -1;
	if ((int64_t)in->body.len > max_stored) {
		char lim[32];
		snprintf(lim, sizeof lim, "%lld", (long long)max_stored);
		return refuse(in, 413, "request_too_large",
			      "the body is larger than max_stored_response "
			      "(%s bytes)",
			      lim);
	}
	return 0;
}

static int parse_response(resolve_in *in, json_t *r, int64_t max_stored)
{
	json_t *status = json_object_get(r, "status");
	json_t *body = json_object_get(r, "body");
	json_t *b64 = json_object_get(r, "body_base64");
	json_t *headers = json_object_get(r, "headers");
	size_t known = (status != NULL) + (body != NULL) + (b64 != NULL) +
		       (headers != NULL);
	if (!json_is_object(r) || json_object_size(r) != known)
		return refuse(in, 400, "resolve_invalid",
			      "response is an object of status, headers, "
			      "body or body_base64");
	if (!json_is_integer(status) || json_integer_value(status) < 200 ||
	    json_integer_value(status) > 599)
		return refuse(in, 400, "resolve_invalid",
			      "response.status must be a final status, an "
			      "integer from 200 to 599");
	in->status = (int)json_integer_value(status);
	return parse_headers(in, headers) ||
	       parse_body(in, body, b64, max_stored);
}

/* 8-4-4-4-12 hex digits, into lower case. */
static bool uuid_form(const char *s, char out[40])
{
	if (strlen(s) != 36)
		return false;
	for (int i = 0; i < 36; i++) {
		bool dash = i == 8 || i == 13 || i == 18 || i == 23;
		if (dash ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
			return false;
		out[i] = (char)tolower((unsigned char)s[i]);
	}
	out[36] = '\0';
	return true;
}

static int parse_fence(resolve_in *in, json_t *attempt, json_t *owner)
{
	if ((attempt != NULL) == (owner != NULL))
		return refuse(in, 400, "resolve_invalid",
			      "give the attempt you looked at: attempt (its "
			      "number) or owner_token, one of them");
	if (attempt) {
		json_int_t n = json_is_integer(attempt)
				       ? json_integer_value(attempt)
				       : 0;
		if (n < 1 || n > 2147483647)
			return refuse(in, 400, "resolve_invalid",
				      "attempt must be a positive integer");
		in->attempt = (int)n;
		return 0;
	}
	if (!json_is_string(owner) ||
	    !uuid_form(json_string_value(owner), in->owner_token))
		return refuse(in, 400, "resolve_invalid",
			      "owner_token must be a UUID as the record "
			      "shows it");
	return 0;
}

static int parse_request(resolve_in *in, const char *body, size_t len,
			 int64_t max_stored)
{
	json_error_t je;
	json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return refuse(in, 400, "resolve_invalid",
			      "the body must be a JSON object: %s",
			      doc ? "not an object" : je.text);
	}
	json_t *attempt = json_object_get(doc, "attempt");
	json_t *owner = json_object_get(doc, "owner_token");
	json_t *resp = json_object_get(doc, "response");
	json_t *outcome = json_object_get(doc, "outcome");
	size_t known = (attempt != NULL) + (owner != NULL) + (resp != NULL) +
		       (outcome != NULL);
	int rc = -1;
	if (json_object_size(doc) != known)
		refuse(in, 400, "resolve_invalid",
		       "the members are attempt or owner_token, and response "
		       "or outcome");
	else if (parse_fence(in, attempt, owner))
		;
	else if ((resp != NULL) == (outcome != NULL))
		refuse(in, 400, "resolve_invalid",
		       "give response (what the upstream answered) or "
		       "\"outcome\": \"executed\", one of them");
	else if (outcome && (!json_is_string(outcome) ||
			     strcmp(json_string_value(outcome), "executed")))
		refuse(in, 400, "resolve_invalid",
		       "outcome can only be \"executed\"");
	else
		rc = resp ? parse_response(in, resp, max_stored) : 0;
	in->executed = outcome != NULL;
	in->kind = rc ? NULL : outcome ? "executed" : "response";
	json_decref(doc);
	return rc;
}

/* ---- What is stored -------------------------------------------------- */

static const route_cfg *route_named(const config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->n_routes; i++)
		if (!strcmp(cfg->routes[i].name, name))
			return &cfg->routes[i];
	return NULL;
}

/* The headers as the proxy would have stored the upstream's (the route's
 * replay_headers, never Set-Cookie or Date), and the names left out. */
static void stored_headers(const route_cfg *r, const header_list *h,
			   growbuf *out, json_t *dropped)
{
	for (size_t i = 0; i < h->n; i++) {
		header_list one = {.v = &h->v[i], .n = 1, .cap = 1};
		size_t before = out->len;
		decide_encode_replay_headers(r, &one, out);
		if (out->len == before)
			json_array_append_new(dropped,
					      json_string(h->v[i].name));
	}
}

/* The stored form of a response: the headers and body, sealed under the
 * active key when store_encryption is on (bound to the record's scope,
 * request hash and status, as the proxy seals), else as they are. */
typedef struct stored {
	growbuf h, b;
	const char *seal_key;
} stored;

static void make_stored(const config *cfg, const char *const part[3],
			const admin_pending *p, const route_cfg *r,
			resolve_in *in, stored *out, json_t *dropped)
{
	growbuf plain = {0};
	stored_headers(r, &in->headers, &plain, dropped);
	growbuf_puts(&plain, ""); /* never NULL */
	bool body = !r->status_only;
	if (!cfg->seal) {
		out->h = plain;
		if (body)
			growbuf_append(&out->b,
				       in->body.data ? in->body.data : "",
				       in->body.len);
		return;
	}
	seal_scope sc = {part[0],         part[1],    part[2],
			 p->request_hash, in->status, body};
	seal_seal(cfg->seal, &sc, SEAL_HEADERS, plain.data, plain.len, &out->h);
	if (body)
		seal_seal(cfg->seal, &sc, SEAL_BODY,
			  in->body.data ? in->body.data : "", in->body.len,
			  &out->b);
	out->seal_key = seal_keyring_active(cfg->seal);
	seal_tally_add(out->seal_key, body ? 2 : 1);
	growbuf_free(&plain);
}

/* ---- The audit line and the answer ----------------------------------- */

static void audit(const char *who, const char *const part[3],
		  const resolve_in *in, const char *result)
{
	growbuf b = {0};
	char n[16], st[16];
	snprintf(n, sizeof n, "%d", in->attempt);
	snprintf(st, sizeof st, "%d", in->status);
	log_field(&b, "remote", who);
	log_field(&b, "method", "POST");
	log_field(&b, "action", "resolve");
	log_field(&b, "tenant", part[0]);
	log_field(&b, "operation", part[1]);
	log_field(&b, "key", part[2]);
	if (in->attempt > 0)
		log_field(&b, "attempt", n);
	else if (in->owner_token[0])
		log_field(&b, "owner_token", in->owner_token);
	log_field(&b, "outcome", in->kind);
	if (in->kind && !in->executed)
		log_field(&b, "status", st);
	log_field(&b, "result", result);
	if (in->code)
		log_field(&b, "reason", in->why);
	log_info("admin action", "%s", b.data);
	growbuf_free(&b);
	metrics_event(strcmp(result, "resolved") ? "admin_resolve_refused"
		      : in->executed             ? "admin_resolved_executed"
						 : "admin_resolved_response");
}

/* Why the record cannot be settled as asked; NULL when it can. */
static const char *not_settleable(resolve_in *in, const admin_pending *p,
				  const char *current)
{
	if (!p->found) {
		refuse(in, 404, "not_found",
		       "no live record for this tenant, operation and key");
		return "not_found";
	}
	if (strcmp(p->state, "processing")) {
		refuse(in, 409, "resolve_not_pending",
		       "the record is %s: only an attempt whose outcome is "
		       "unknown (processing, lease ended) can be settled",
		       p->state);
		return "not_pending";
	}
	bool same = in->attempt > 0 ? p->attempt == in->attempt
				    : !strcmp(p->owner_token, in->owner_token);
	if (!same) {
		refuse(in, 409, "resolve_attempt_stale",
		       "the record is at another attempt now (%s); read it "
		       "again and decide on that one",
		       current);
		return "stale";
	}
	if (p->lease_alive) {
		refuse(in, 409, "attempt_in_flight",
		       "the attempt is in flight (its lease is alive); it "
		       "records its own outcome");
		return "in_flight";
	}
	return NULL;
}

static void current_of(const admin_pending *p, char *out, size_t n)
{
	snprintf(out, n, "attempt %d, owner_token %s", p->attempt,
		 p->owner_token);
}

static json_t *done_json(const char *const part[3], const resolve_in *in,
			 const admin_pending *p, json_t *dropped)
{
	json_t *o = json_object();
	json_object_set_new(o, "tenant", json_string(part[0]));
	json_object_set_new(o, "operation", json_string(part[1]));
	json_object_set_new(o, "key", json_string(part[2]));
	json_object_set_new(o, "attempt", json_integer(p->attempt));
	json_object_set_new(o, "state", json_string("completed"));
	json_object_set_new(
		o, "outcome",
		json_string(in->executed ? "executed" : "response"));
	if (!in->executed) {
		json_object_set_new(o, "status", json_integer(in->status));
		json_object_set_new(o, "headers_not_stored", dropped);
	} else {
		json_decref(dropped);
	}
	return o;
}

static void refused(const char *who, const char *const part[3], resolve_in *in,
		    const char *result, admin_answer *out)
{
	audit(who, part, in, result);
	admin_answer_problem(out, in->http_status, in->code, in->why);
}

static void store_failed(const char *who, const char *err, admin_answer *out)
{
	metrics_event("admin_resolve_failed");
	admin_answer_store_failed(out, who, "resolve", err);
}

/* The write, once the record was read and found as the operator saw it. */
static void resolve_write(store_admin *st, const config *cfg, const char *who,
			  const char *const part[3], resolve_in *in,
			  const admin_pending *p, const route_cfg *r,
			  admin_answer *out)
{
	stored sd = {0};
	json_t *dropped = json_array();
	if (!in->executed)
		make_stored(cfg, part, p, r, in, &sd, dropped);
	admin_resolve_req q = {
		.tenant = part[0],
		.operation = part[1],
		.key = part[2],
		.attempt = in->attempt,
		.owner_token = in->owner_token,
		.status = in->executed ? 0 : in->status,
		.headers = sd.h.data,
		.headers_len = sd.h.len,
		.body = sd.b.data,
		.body_len = sd.b.len,
		.seal_key = sd.seal_key,
		.request_hash = (const char *)p->request_hash,
	};
	enum admin_resolve_end end;
	admin_pending now;
	char err[512], cur[96];
	int rc = store_admin_resolve(st, &q, &end, &now, err, sizeof err);
	growbuf_free(&sd.h);
	growbuf_free(&sd.b);
	if (rc || end != ADMIN_RES_DONE)
		json_decref(dropped);
	if (rc) {
		store_failed(who, err, out);
		return;
	}
	if (end != ADMIN_RES_DONE) {
		current_of(&now, cur, sizeof cur);
		const char *why = not_settleable(in, &now, cur);
		if (!why) {
			refuse(in, 409, "resolve_attempt_stale",
			       "the record changed while it was being settled; "
			       "read it again");
			why = "stale";
		}
		refused(who, part, in, why, out);
		return;
	}
	audit(who, part, in, "resolved");
	admin_answer_json(out, 200, done_json(part, in, p, dropped));
}

static bool released_status(const route_cfg *r, int status)
{
	for (size_t i = 0; i < r->n_release_statuses; i++)
		if (r->release_statuses[i] == status)
			return true;
	return false;
}

static void resolve_checked(store_admin *st, const config *cfg, const char *who,
			    const char *const part[3], resolve_in *in,
			    admin_answer *out)
{
	const route_cfg *r = in->executed ? NULL : route_named(cfg, part[1]);
	if (!in->executed && !r) {
		refuse(in, 409, "resolve_route_unknown",
		       "no route named %.64s in the configuration in force "
		       "(its replay_headers decide what is stored): record "
		       "\"outcome\": \"executed\", or release the key",
		       part[1]);
		refused(who, part, in, "route_unknown", out);
		return;
	}
	if (r && released_status(r, in->status)) {
		refuse(in, 400, "resolve_invalid",
		       "status %d is in the route's release_statuses: on that "
		       "answer the proxy releases the key (nothing was done); "
		       "release it with DELETE instead",
		       in->status);
		refused(who, part, in, "invalid", out);
		return;
	}
	admin_pending p;
	char err[512], cur[96];
	if (store_admin_pending(st, part[0], part[1], part[2], &p, err,
				sizeof err)) {
		store_failed(who, err, out);
		return;
	}
	current_of(&p, cur, sizeof cur);
	const char *why = not_settleable(in, &p, cur);
	if (why) {
		refused(who, part, in, why, out);
		return;
	}
	resolve_write(st, cfg, who, part, in, &p, r, out);
}

void admin_keys_resolve(store_admin *st, const config *cfg, const char *who,
			const char *const part[3], const char *body, size_t len,
			admin_answer *out)
{
	resolve_in in;
	memset(&in, 0, sizeof in);
	if (parse_request(&in, body, len, cfg->max_stored_response))
		refused(who, part, &in, "invalid", out);
	else
		resolve_checked(st, cfg, who, part, &in, out);
	header_list_free(&in.headers);
	growbuf_free(&in.body);
}
