/* The admin listener. A thread per connection, so that /healthz and
 * /metrics answer even while a /readyz or /admin call waits on a database
 * that hangs; those share the one store connection under a mutex. */
#include "admin.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "admin_keys.h"
#include "admin_resolve.h"
#include "contract.h"
#include "decide.h"
#include "listen_addr.h"
#include "log.h"
#include "metrics.h"
#include "problem.h"
#include "seal.h"
#include "store_admin.h"
#include "store_pg_schema.h"

#define KEYS_PREFIX "/admin/keys/"
#define CONTRACT_PATH "/admin/contract"
#define CONTRACT_RULES_PATH "/admin/contract/rules"
#define JSON_TYPE "application/json"

struct admin {
	struct MHD_Daemon *d;
	/* Not the whole admin_opts: its strings belong to the configuration
	 * the process started with, which a reload frees. */
	config *(*get_config)(void *arg);
	void *arg;
	void (*forget)(void *arg, const char *tenant, const char *operation,
		       const char *key);
	void *forget_arg;
	store_admin *st;
	pthread_mutex_t mu;
	atomic_bool loop_stalled; /* as the last /readyz saw it */
};

/* Per request: the raw target (MHD's url argument is already
 * percent-decoded, which would turn a key's %2F into a separator). */
typedef struct admin_req {
	char *raw;
	bool started;
	growbuf body;   /* the request body (resolve), bounded */
	bool body_over; /* it was larger than the bound: not kept */
} admin_req;

/* A client-chosen path, made safe for a log line: printable ASCII only,
 * bounded. */
static void loggable(const char *s, char *out, size_t n)
{
	size_t k = 0;
	for (; s && *s && k + 1 < n; s++) {
		unsigned char c = (unsigned char)*s;
		out[k++] = (c > 0x20 && c < 0x7f && c != '"' && c != '\\')
				   ? (char)c
				   : '?';
	}
	out[k] = '\0';
}

static enum MHD_Result reply(struct MHD_Connection *conn, int status,
			     const char *type, growbuf *body,
			     const char *extra_name, const char *extra_value)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		body->len, body->data, MHD_RESPMEM_MUST_FREE);
	body->data = NULL;
	body->len = body->cap = 0;
	MHD_add_response_header(r, "Content-Type", type);
	MHD_add_response_header(r, "Cache-Control", "no-store");
	if (extra_name)
		MHD_add_response_header(r, extra_name, extra_value);
	enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	return rc;
}

/* A problem answer of the admin listener, with the problem settings of
 * the configuration in force; extra_name (when not NULL) is one more
 * header. doc is the body, as problem_render made it or extended. */
static enum MHD_Result problem_reply(admin *a, struct MHD_Connection *conn,
				     int status, growbuf *body,
				     const char *extra_name,
				     const char *extra_value)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		body->len, body->data, MHD_RESPMEM_MUST_FREE);
	body->data = NULL;
	body->len = body->cap = 0;
	MHD_add_response_header(r, "Content-Type", PROBLEM_CONTENT_TYPE);
	MHD_add_response_header(r, "Cache-Control", "no-store");
	if (extra_name)
		MHD_add_response_header(r, extra_name, extra_value);
	config *cfg = a->get_config(a->arg);
	problem_links links = {cfg->problem_type_base, cfg->problem_doc_url};
	growbuf link = {0};
	if (problem_link_header(&links, &link))
		MHD_add_response_header(r, "Link", link.data);
	config_unref(cfg);
	growbuf_free(&link);
	enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	return rc;
}

/* The body of an admin problem, into b. */
static void problem_body(admin *a, growbuf *b, int status, const char *code,
			 const char *detail, problem_facts f)
{
	config *cfg = a->get_config(a->arg);
	problem_links links = {cfg->problem_type_base, cfg->problem_doc_url};
	problem_render(b, &links, status, code, detail, NULL, f);
	config_unref(cfg);
}

static enum MHD_Result problem_as(admin *a, struct MHD_Connection *conn,
				  int status, const char *code,
				  const char *detail, problem_facts f,
				  const char *extra_name,
				  const char *extra_value)
{
	growbuf b = {0};
	problem_body(a, &b, status, code, detail, f);
	return problem_reply(a, conn, status, &b, extra_name, extra_value);
}

static enum MHD_Result problem_with(admin *a, struct MHD_Connection *conn,
				    int status, const char *code,
				    const char *detail, const char *extra_name,
				    const char *extra_value)
{
	return problem_as(a, conn, status, code, detail, (problem_facts){0},
			  extra_name, extra_value);
}

static enum MHD_Result problem(admin *a, struct MHD_Connection *conn,
			       int status, const char *code, const char *detail)
{
	return problem_with(a, conn, status, code, detail, NULL, NULL);
}

static enum MHD_Result reply_json(struct MHD_Connection *conn, int status,
				  json_t *doc)
{
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(doc);
	growbuf b = {0};
	if (s) {
		growbuf_puts(&b, s);
		growbuf_puts(&b, "\n");
		free(s);
	}
	return reply(conn, status, JSON_TYPE, &b, NULL, NULL);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int admin_decode_segment(const char *s, size_t n, char *out)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '%') {
			if (i + 2 >= n)
				return -1;
			int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
			if (hi < 0 || lo < 0)
				return -1;
			c = (unsigned char)(hi * 16 + lo);
			i += 2;
		}
		/* Tenants, operations and keys are printable ASCII (a quoted
		 * key may hold a space); nothing else can name a record. */
		if (c < 0x20 || c > 0x7e)
			return -1;
		out[k++] = (char)c;
	}
	out[k] = '\0';
	return k ? 0 : -1;
}

bool admin_token_ok(const char *header, const char *token)
{
	if (!header || !token || !token[0])
		return false;
	if (!str_ncaseeq(header, "Bearer", 6) ||
	    (header[6] != ' ' && header[6] != '\t'))
		return false;
	const char *p = header + 6;
	while (*p == ' ' || *p == '\t')
		p++;
	size_t n = strlen(p);
	while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
		n--;
	/* Comparing digests in constant time hides the token's length as
	 * well as its bytes. */
	unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
	SHA256((const unsigned char *)p, n, a);
	SHA256((const unsigned char *)token, strlen(token), b);
	return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

/* NULL stays null; jansson refuses bytes that are not UTF-8, so such a
 * value is shown with '?' in their place rather than dropped. */
static json_t *jstr(const char *s)
{
	if (!s)
		return json_null();
	json_t *j = json_string(s);
	if (j)
		return j;
	char *copy = xstrdup(s);
	for (char *p = copy; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	j = json_string(copy);
	free(copy);
	return j ? j : json_null();
}

/* Header bytes are stored as the upstream sent them. Valid UTF-8 (nearly
 * every header) is a JSON string; anything else (obs-text such as a Latin-1
 * byte) is {"base64": "<the exact bytes>"}, so the output stays valid JSON
 * and loses nothing. */
static json_t *jbytes(const char *s)
{
	size_t n = strlen(s);
	json_t *j = json_stringn(s, n);
	if (j)
		return j;
	char *b64 = xmalloc(4 * ((n + 2) / 3) + 1);
	EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)s, (int)n);
	j = json_pack("{s:s}", "base64", b64);
	free(b64);
	return j ? j : json_null();
}

/* Sealed headers are shown as they are stored (see sealed_with). */
static json_t *sealed_json(const char *blob, size_t len)
{
	char *b64 = xmalloc(4 * ((len + 2) / 3) + 1);
	EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)blob,
			(int)len);
	json_t *j = json_pack("{s:s}", "sealed", b64);
	free(b64);
	return j ? j : json_null();
}

static json_t *headers_json(const char *lines, size_t len)
{
	if (seal_is_sealed(lines, len))
		return sealed_json(lines, len);
	json_t *arr = json_array();
	if (!lines)
		return arr;
	header_list h = {0};
	decide_decode_replay_headers(lines, len, &h);
	for (size_t i = 0; i < h.n; i++) {
		json_t *pair = json_array();
		json_array_append_new(pair, jbytes(h.v[i].name));
		json_array_append_new(pair, jbytes(h.v[i].value));
		json_array_append_new(arr, pair);
	}
	header_list_free(&h);
	return arr;
}

static json_t *record_json(const admin_record *r)
{
	json_t *o = json_object();
	json_object_set_new(o, "tenant", jstr(r->tenant));
	json_object_set_new(o, "operation", jstr(r->operation));
	json_object_set_new(o, "key", jstr(r->key));
	json_object_set_new(o, "state", jstr(r->state));
	json_object_set_new(o, "attempt", json_integer(r->attempt));
	json_object_set_new(o, "request_hash", jstr(r->request_hash_hex));
	json_object_set_new(o, "owner_token", jstr(r->owner_token));
	json_object_set_new(o, "lease_until", jstr(r->lease_until));
	json_object_set_new(o, "created_at", jstr(r->created_at));
	json_object_set_new(o, "updated_at", jstr(r->updated_at));
	json_object_set_new(o, "expires_at", jstr(r->expires_at));
	json_object_set_new(o, "expired", json_boolean(r->expired));
	json_object_set_new(o, "hold_on_unknown",
			    json_boolean(r->hold_on_unknown));
	json_object_set_new(o, "response_status",
			    r->has_status ? json_integer(r->response_status)
					  : json_null());
	json_object_set_new(
		o, "response_headers",
		headers_json(r->response_headers, r->response_headers_len));
	json_object_set_new(o, "response_body", jstr(r->response_body_b64));
	json_object_set_new(o, "replayable",
			    r->replayable < 0 ? json_null()
					      : json_boolean(r->replayable));
	json_object_set_new(o, "trace_id", jstr(r->trace_id));
	/* The admin API does not open sealed records: whoever holds the admin
	 * token sees what a reader of the table sees, and no more. */
	char kid[SEAL_ID_MAX + 1];
	bool sealed = seal_blob_key_id(r->response_headers,
				       r->response_headers_len, kid) == 0;
	json_object_set_new(o, "sealed_with",
			    sealed ? json_string(kid) : json_null());
	json_object_set_new(o, "response_expires_at",
			    jstr(r->response_expires_at));
	json_object_set_new(o, "tombstone", json_boolean(r->tombstone));
	return o;
}

/* tenant, operation, key, percent-decoded; each NUL-terminated. */
typedef struct key_path {
	char *part[3];
} key_path;

static void key_path_free(key_path *k)
{
	for (int i = 0; i < 3; i++)
		free(k->part[i]);
}

/* 0 ok; -1 not of the form tenant/operation/key (404); -2 a segment that
 * does not decode to a possible name (400). */
static int parse_key_path(const char *rest, key_path *k)
{
	memset(k, 0, sizeof *k);
	const char *p = rest;
	for (int i = 0; i < 3; i++) {
		const char *slash = strchr(p, '/');
		if ((i < 2) != (slash != NULL))
			return -1;
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (n == 0)
			return -1;
		k->part[i] = xmalloc(n + 1);
		if (admin_decode_segment(p, n, k->part[i]))
			return -2;
		p = slash ? slash + 1 : p + n;
	}
	return 0;
}

/* The audit fields of an action. The tenant, operation and key are the
 * caller's decoded path segments: quoted, so they cannot forge fields. */
static void action_fields(growbuf *b, const char *who, const char *method,
			  const key_path *k)
{
	log_field(b, "remote", who);
	log_field(b, "method", method);
	log_field(b, "tenant", k->part[0]);
	log_field(b, "operation", k->part[1]);
	log_field(b, "key", k->part[2]);
}

static void log_action(const char *who, const char *method, const key_path *k,
		       const char *result)
{
	growbuf b = {0};
	action_fields(&b, who, method, k);
	log_field(&b, "result", result);
	log_info("admin action", "%s", b.data);
	growbuf_free(&b);
}

/* The store connection is shared by the listener's threads; its
 * statement_timeout follows the configuration in force. */
static void lock_store(admin *a)
{
	pthread_mutex_lock(&a->mu);
	config *cfg = a->get_config(a->arg);
	store_admin_set_statement_timeout(a->st, cfg->statement_timeout_ms);
	config_unref(cfg);
}

static enum MHD_Result store_failed(admin *a, struct MHD_Connection *conn,
				    const char *who, const char *method,
				    const key_path *k, const char *err)
{
	growbuf b = {0};
	action_fields(&b, who, method, k);
	log_field(&b, "error", err);
	log_warn("admin action failed", "%s", b.data);
	growbuf_free(&b);
	if (strcmp(method, "DELETE"))
		return problem_with(a, conn, 503,
				    "idempotency_store_unavailable",
				    "the idempotency store cannot be reached; "
				    "retry later",
				    "Retry-After", "1");
	/* The connection may have broken after the DELETE reached the
	 * server, and a second one after a release that did commit would
	 * purge the record: a person reads it first. */
	return problem_as(a, conn, 503, "idempotency_store_unavailable",
			  "the idempotency store cannot be reached; the DELETE "
			  "may or may not have taken effect: read the record "
			  "(GET) before sending it again",
			  (problem_facts){.state = PROBLEM_UNKNOWN,
					  .action = PROBLEM_DO_NOT_RETRY},
			  NULL, NULL);
}

static enum MHD_Result key_get(admin *a, struct MHD_Connection *conn,
			       const char *who, const char *method,
			       const key_path *k)
{
	admin_record rec;
	bool found = false;
	char err[512];
	lock_store(a);
	int rc = store_admin_get(a->st, k->part[0], k->part[1], k->part[2],
				 &rec, &found, err, sizeof err);
	pthread_mutex_unlock(&a->mu);
	if (rc)
		return store_failed(a, conn, who, method, k, err);
	if (!found) {
		log_action(who, method, k, "not_found");
		return problem(a, conn, 404, "not_found",
			       "no record for this tenant, operation and key");
	}
	json_t *doc = record_json(&rec);
	store_admin_record_clear(&rec);
	log_action(who, method, k, "found");
	return reply_json(conn, 200, doc);
}

/* 409 for an attempt whose lease is alive, with when it ends: releasing it
 * would let a retry be sent upstream while it may still be sending. */
static enum MHD_Result refuse_in_flight(admin *a, struct MHD_Connection *conn,
					const char *lease_until)
{
	char detail[256];
	snprintf(detail, sizeof detail,
		 "the attempt holding this key is in flight and its lease ends "
		 "at %s; releasing it now would let a retry run beside it. "
		 "Wait for the lease to end, or add ?force=true",
		 lease_until);
	growbuf b = {0};
	problem_body(a, &b, 409, "attempt_in_flight", detail,
		     (problem_facts){0});
	json_t *doc = json_loadb(b.data, b.len, 0, NULL);
	growbuf_free(&b);
	ALWAYS_ASSERT(doc != NULL);
	json_object_set_new(doc, "lease_until", jstr(lease_until));
	char *text = json_dumps(doc, JSON_INDENT(2));
	json_decref(doc);
	growbuf_append(&b, text, strlen(text));
	growbuf_append(&b, "\n", 1);
	free(text);
	return problem_reply(a, conn, 409, &b, NULL, NULL);
}

/* ?force=true: 1; absent: 0; anything else: -1. */
static int force_arg(struct MHD_Connection *conn)
{
	const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND,
						    "force");
	if (!v)
		return 0;
	return !strcmp(v, "true") ? 1 : !strcmp(v, "false") ? 0 : -1;
}

static enum MHD_Result key_delete(admin *a, struct MHD_Connection *conn,
				  const char *who, const key_path *k)
{
	int force = force_arg(conn);
	if (force < 0)
		return problem(a, conn, 400, "bad_request",
			       "force must be true or false");
	admin_delete_result res;
	char err[512];
	lock_store(a);
	int rc = store_admin_delete(a->st, k->part[0], k->part[1], k->part[2],
				    force, &res, err, sizeof err);
	pthread_mutex_unlock(&a->mu);
	if (rc)
		return store_failed(a, conn, who, "DELETE", k, err);
	if (res.action == ADMIN_DEL_ABSENT) {
		log_action(who, "DELETE", k, "not_found");
		return problem(a, conn, 404, "not_found",
			       "no record for this tenant, operation and key");
	}
	if (res.action == ADMIN_DEL_IN_FLIGHT) {
		log_action(who, "DELETE", k, "refused_in_flight");
		return refuse_in_flight(a, conn, res.lease_until);
	}
	if (a->forget)
		a->forget(a->forget_arg, k->part[0], k->part[1], k->part[2]);
	const char *done =
		res.action == ADMIN_DEL_RELEASED ? "released" : "purged";
	log_action(who, "DELETE", k,
		   force && res.action == ADMIN_DEL_RELEASED ? "released_forced"
							     : done);
	json_t *o = json_object();
	json_object_set_new(o, "tenant", jstr(k->part[0]));
	json_object_set_new(o, "operation", jstr(k->part[1]));
	json_object_set_new(o, "key", jstr(k->part[2]));
	json_object_set_new(o, "action", json_string(done));
	json_object_set_new(o, "previous_state", jstr(res.previous_state));
	return reply_json(conn, 200, o);
}

/* Is the request allowed into /admin? Answers it (and returns false) when
 * not. The token is read from the configuration in force right now. */
static bool admin_gate(admin *a, struct MHD_Connection *conn, const char *who,
		       const char *method, const char *path,
		       enum MHD_Result *answer)
{
	config *cfg = a->get_config(a->arg);
	bool disabled = !cfg->admin_token[0];
	bool ok = !disabled && admin_token_ok(MHD_lookup_connection_value(
						      conn, MHD_HEADER_KIND,
						      "Authorization"),
					      cfg->admin_token);
	config_unref(cfg);
	if (ok)
		return true;
	char shown[200], verb[24];
	loggable(path, shown, sizeof shown);
	loggable(method, verb, sizeof verb);
	method = verb;
	growbuf f = {0};
	log_field(&f, "remote", who);
	log_field(&f, "method", method);
	log_field(&f, "path", shown);
	log_field(&f, "result", disabled ? "disabled" : "unauthorized");
	if (disabled)
		log_info("admin request refused", "%s", f.data);
	else
		log_warn("admin request refused", "%s", f.data);
	growbuf_free(&f);
	if (disabled) {
		*answer = problem(a, conn, 404, "not_found",
				  "the admin API is disabled (admin_token is "
				  "empty)");
		return false;
	}
	*answer = problem_with(a, conn, 401, "admin_unauthorized",
			       "send Authorization: Bearer <admin_token>",
			       MHD_HTTP_HEADER_WWW_AUTHENTICATE,
			       "Bearer realm=\"idemproxy-admin\"");
	return false;
}

/* The contract of the configuration in force (contract.h): it follows a
 * reload like every other read of the configuration here. */
static enum MHD_Result contract_get(admin *a, struct MHD_Connection *conn,
				    const char *method, const char *path)
{
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return problem_with(a, conn, 405, "method_not_allowed",
				    "use GET", MHD_HTTP_HEADER_ALLOW,
				    "GET, HEAD");
	config *cfg = a->get_config(a->arg);
	growbuf b = {0};
	b.data = contract_document(
		cfg,
		strcmp(path, CONTRACT_PATH) ? CONTRACT_RULES : CONTRACT_OPENAPI,
		&b.len);
	b.cap = b.len + 1;
	config_unref(cfg);
	return reply(conn, 200, CONTRACT_MEDIA_TYPE, &b, NULL, NULL);
}

static enum MHD_Result send_answer(admin *a, struct MHD_Connection *conn,
				   admin_answer *ans)
{
	if (ans->type && !strcmp(ans->type, PROBLEM_CONTENT_TYPE))
		return problem_reply(a, conn, ans->status, &ans->body,
				     ans->extra_name, ans->extra_value);
	return reply(conn, ans->status, ans->type, &ans->body, ans->extra_name,
		     ans->extra_value);
}

/* An answer whose problems follow the problem settings in force. */
static admin_answer answer_for(const config *cfg)
{
	return (admin_answer){
		.links = {cfg->problem_type_base, cfg->problem_doc_url}};
}

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind,
			       const char *name, const char *value)
{
	growbuf *args = cls;
	if (args->len / sizeof(admin_arg) >= 64)
		return MHD_NO;
	admin_arg one = {name, value};
	growbuf_append(args, &one, sizeof one);
	return MHD_YES;
}

/* GET /admin/keys?state=&tenant=&route=&older_than=&limit=&order=&cursor= */
static enum MHD_Result keys_list(admin *a, struct MHD_Connection *conn,
				 const char *who, const char *method)
{
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return problem_with(a, conn, 405, "method_not_allowed",
				    "use GET", MHD_HTTP_HEADER_ALLOW,
				    "GET, HEAD");
	growbuf args = {0};
	MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &args);
	config *cfg = a->get_config(a->arg);
	admin_answer ans = answer_for(cfg);
	lock_store(a);
	admin_keys_list(a->st, who, (const admin_arg *)args.data,
			args.len / sizeof(admin_arg), &ans);
	pthread_mutex_unlock(&a->mu);
	growbuf_free(&args);
	enum MHD_Result rc = send_answer(a, conn, &ans);
	config_unref(cfg);
	return rc;
}

#define RESOLVE_SUFFIX "/resolve"
#define RESOLVE_USE \
	"use /admin/keys/{tenant}/{operation}/{key}/resolve, each segment " \
	"percent-encoded printable ASCII"

/* /admin/keys/{tenant}/{operation}/{key}/resolve: a key's '/' is sent as
 * %2F, so the suffix cannot be part of it. */
static bool resolve_path(const char *path)
{
	size_t n = strlen(path), plen = strlen(KEYS_PREFIX);
	size_t sl = strlen(RESOLVE_SUFFIX);
	return n > plen + sl && !strncmp(path, KEYS_PREFIX, plen) &&
	       !strcmp(path + n - sl, RESOLVE_SUFFIX);
}

static enum MHD_Result keys_resolve(admin *a, struct MHD_Connection *conn,
				    const char *who, const char *method,
				    const char *path, admin_req *rq)
{
	if (strcmp(method, "POST"))
		return problem_with(a, conn, 405, "method_not_allowed",
				    "use POST", MHD_HTTP_HEADER_ALLOW, "POST");
	size_t plen = strlen(KEYS_PREFIX);
	char *rest = xstrndup(path + plen,
			      strlen(path) - plen - strlen(RESOLVE_SUFFIX));
	key_path k;
	int pr = parse_key_path(rest, &k);
	free(rest);
	enum MHD_Result answer;
	if (pr == -1)
		answer = problem(a, conn, 404, "not_found", RESOLVE_USE);
	else if (pr)
		answer = problem(a, conn, 400, "bad_request", RESOLVE_USE);
	else if (rq->body_over) {
		log_action(who, "POST", &k, "too_large");
		metrics_event("admin_resolve_refused");
		answer = problem(a, conn, 413, "request_too_large",
				 "the request body is larger than a stored "
				 "response may be (max_stored_response)");
	} else {
		const char *const part[3] = {k.part[0], k.part[1], k.part[2]};
		config *cfg = a->get_config(a->arg);
		admin_answer ans = answer_for(cfg);
		lock_store(a);
		admin_keys_resolve(a->st, cfg, who, part,
				   rq->body.data ? rq->body.data : "",
				   rq->body.len, &ans);
		pthread_mutex_unlock(&a->mu);
		answer = send_answer(a, conn, &ans);
		config_unref(cfg);
	}
	key_path_free(&k);
	return answer;
}

static enum MHD_Result handle_admin(admin *a, struct MHD_Connection *conn,
				    const char *method, const char *path,
				    admin_req *rq)
{
	char who[64];
	listen_addr_peer(conn, who, sizeof who);
	enum MHD_Result answer = MHD_NO;
	if (!admin_gate(a, conn, who, method, path, &answer))
		return answer;
	if (!strcmp(path, CONTRACT_PATH) || !strcmp(path, CONTRACT_RULES_PATH))
		return contract_get(a, conn, method, path);
	if (!strcmp(path, "/admin/keys"))
		return keys_list(a, conn, who, method);
	if (resolve_path(path))
		return keys_resolve(a, conn, who, method, path, rq);
	size_t plen = strlen(KEYS_PREFIX);
	key_path k;
	memset(&k, 0, sizeof k);
	int pr = strncmp(path, KEYS_PREFIX, plen)
			 ? -1
			 : parse_key_path(path + plen, &k);
	if (pr == -1) {
		key_path_free(&k);
		return problem(a, conn, 404, "not_found",
			       "no such admin endpoint; use "
			       "/admin/keys/{tenant}/{operation}/{key}");
	}
	if (strcmp(method, "GET") && strcmp(method, "HEAD") &&
	    strcmp(method, "DELETE")) {
		key_path_free(&k);
		return problem_with(a, conn, 405, "method_not_allowed",
				    "use GET or DELETE", MHD_HTTP_HEADER_ALLOW,
				    "GET, HEAD, DELETE");
	}
	if (pr == -2) {
		key_path_free(&k);
		return problem(a, conn, 400, "bad_request",
			       "a path segment is not a valid percent-encoded "
			       "name of printable ASCII");
	}
	answer = strcmp(method, "DELETE") ? key_get(a, conn, who, method, &k)
					  : key_delete(a, conn, who, &k);
	key_path_free(&k);
	return answer;
}

static enum MHD_Result get_only(admin *a, struct MHD_Connection *conn,
				const char *method)
{
	return problem_with(a, conn, 405, "method_not_allowed", "use GET",
			    MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
}

/* A serving loop later than loop_stall_max (a blocking call, long CPU
 * work, a stopped thread) answers no client: not ready. Logged when it
 * begins and ends, not at every probe. */
static bool loop_stalled(admin *a, char *err, size_t errlen)
{
	double lag_s;
	if (!metrics_read("idemproxy_loop_lag_seconds", &lag_s))
		return false;
	double lag = lag_s * 1000.0;
	config *cfg = a->get_config(a->arg);
	int64_t max = cfg->loop_stall_max_ms;
	config_unref(cfg);
	bool stalled = lag > (double)max;
	if (atomic_exchange(&a->loop_stalled, stalled) != stalled) {
		if (stalled)
			log_warn("serving loop stalled: not ready",
				 "lag_ms=%.0f loop_stall_max_ms=%lld", lag,
				 (long long)max);
		else
			log_info("serving loop running again: ready", NULL);
	}
	if (stalled)
		snprintf(err, errlen,
			 "serving loop stalled for %.3f s (loop_stall_max "
			 "%lld ms)",
			 lag / 1000.0, (long long)max);
	return stalled;
}

static enum MHD_Result handle_ready(admin *a, struct MHD_Connection *conn)
{
	char err[512];
	if (loop_stalled(a, err, sizeof err)) {
		growbuf b = {0};
		growbuf_printf(&b, "not ready: %s\n", err);
		return reply(conn, 503, "text/plain", &b, NULL, NULL);
	}
	lock_store(a);
	int rc = store_admin_ready(a->st, store_expected_version(), err,
				   sizeof err);
	pthread_mutex_unlock(&a->mu);
	growbuf b = {0};
	if (rc == 0) {
		growbuf_puts(&b, "ready\n");
		return reply(conn, 200, "text/plain", &b, NULL, NULL);
	}
	growbuf_printf(&b, "not ready: %s\n", err);
	return reply(conn, 503, "text/plain", &b, NULL, NULL);
}

/* Only resolve takes a body: kept up to the bound of the configuration in
 * force, and dropped (refused later) beyond it. */
static void keep_body(admin *a, admin_req *rq, const char *data, size_t n)
{
	if (rq->body_over)
		return;
	config *cfg = a->get_config(a->arg);
	size_t max = admin_resolve_max_request(cfg->max_stored_response);
	config_unref(cfg);
	if (rq->body.len + n > max) {
		rq->body_over = true;
		growbuf_free(&rq->body);
		return;
	}
	growbuf_append(&rq->body, data, n);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **ctxp)
{
	admin *a = cls;
	admin_req *rq = *ctxp;
	if (!rq) /* no URI callback ran: should not happen */
		return MHD_NO;
	if (!rq->started) {
		rq->started = true;
		return MHD_YES;
	}
	if (*upload_size) {
		keep_body(a, rq, upload, *upload_size);
		*upload_size = 0;
		return MHD_YES;
	}
	/* The raw path, without the query. */
	char *q = strchr(rq->raw, '?');
	if (q)
		*q = '\0';
	const char *path = rq->raw;
	if (!strcmp(path, "/admin") || !strncmp(path, "/admin/", 7))
		return handle_admin(a, conn, method, path, rq);
	bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
	bool known = !strcmp(path, "/healthz") || !strcmp(path, "/readyz") ||
		     !strcmp(path, "/metrics");
	if (!known)
		return problem(a, conn, 404, "not_found",
			       "no such admin endpoint");
	if (!get)
		return get_only(a, conn, method);
	growbuf b = {0};
	if (!strcmp(path, "/healthz")) {
		growbuf_puts(&b, "ok\n");
		return reply(conn, 200, "text/plain", &b, NULL, NULL);
	}
	if (!strcmp(path, "/readyz"))
		return handle_ready(a, conn);
	metrics_render(&b);
	return reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", &b,
		     NULL, NULL);
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	admin_req *rq = xcalloc(1, sizeof *rq);
	rq->raw = xstrdup(uri ? uri : "");
	return rq;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **ctxp,
			 enum MHD_RequestTerminationCode toe)
{
	admin_req *rq = *ctxp;
	if (!rq)
		return;
	free(rq->raw);
	growbuf_free(&rq->body);
	free(rq);
	*ctxp = NULL;
}

admin *admin_start(const admin_opts *o, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	bool v6;
	if (listen_addr_parse(o->listen, &ss, &v6, err, errlen))
		return NULL;
	admin *a = xcalloc(1, sizeof *a);
	a->get_config = o->get_config;
	a->arg = o->arg;
	a->forget = o->forget;
	a->forget_arg = o->forget_arg;
	a->st = store_admin_new(o->db_url, o->statement_timeout_ms);
	pthread_mutex_init(&a->mu, NULL);
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
			 MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
			 MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	a->d = MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, a, MHD_OPTION_SOCK_ADDR,
		(struct sockaddr *)&ss, MHD_OPTION_URI_LOG_CALLBACK, on_uri, a,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
	if (!a->d) {
		snprintf(err, errlen, "cannot listen on %s (in use?)",
			 o->listen);
		store_admin_free(a->st);
		pthread_mutex_destroy(&a->mu);
		free(a);
		return NULL;
	}
	return a;
}

void admin_stop(admin *a)
{
	if (!a)
		return;
	MHD_stop_daemon(a->d);
	store_admin_free(a->st);
	pthread_mutex_destroy(&a->mu);
	free(a);
}
