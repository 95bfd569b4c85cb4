#include "proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coding.h"
#include "decide.h"
#include "fiber.h"
#include "fingerprint.h"
#include "log.h"
#include "metrics.h"
#include "offload.h"
#include "problem.h"
#include "record_retry.h"
#include "replay_cache.h"
#include "reply.h"
#include "seal.h"
#include "seal_tally.h"
#include "store_batch.h"
#include "store_pg.h"
#include "upstream.h"
#include "waiters.h"
#include "wake.h"

/* Largest body whose fingerprint the event thread computes itself. */
#define FAST_PATH_MAX_BODY (64 * 1024)

typedef struct proxy_worker {
	int index;
	replay_cache *cache;
	record_retry *retry;
	waiters *waiters; /* NULL: duplicates never wait */
	const wake_key *wake;
	/* For the replay cache, about the job in hand: the forget generation
	 * of its key, read before its claim, and its record's expiry as the
	 * claim saw it (an upstream call may come between the two). */
	uint64_t cache_gen;
	double cache_expires_ms;
	store *st;
	struct store_batch *batch; /* NULL: none (threads, Citus) */
	upstream *up;
	growbuf scratch;
	growbuf sealed_h, sealed_b; /* a response as stored, when sealed */
	growbuf plain_h, plain_b;   /* a sealed record, opened */
	growbuf raw;                /* a request's raw form, for the cache */
} proxy_worker;

void *proxy_worker_init(void *arg, int index)
{
	const proxy_shared *sh = arg;
	proxy_worker *w = xcalloc(1, sizeof *w);
	w->index = index;
	w->cache = sh->cache;
	w->retry = sh->retry;
	w->waiters = sh->waiters;
	w->st = store_new(sh->db_url, sh->statement_timeout_ms);
	store_set_distributed(w->st, sh->citus);
	store_set_wake_key(w->st, sh->wake);
	w->wake = sh->wake;
	w->batch = sh->batch;
	w->up = upstream_new();
	char err[256];
	/* Connect now so the first request does not pay for it; a failure is
	 * retried on first use. */
	if (store_ensure(w->st, err, sizeof err))
		log_warn("store connect failed", "worker=%d %s", index, err);
	return w;
}

void proxy_worker_fini(void *ctx)
{
	proxy_worker *w = ctx;
	store_free(w->st);
	upstream_free(w->up);
	growbuf_free(&w->scratch);
	growbuf_free(&w->sealed_h);
	growbuf_free(&w->sealed_b);
	growbuf_free(&w->plain_h);
	growbuf_free(&w->plain_b);
	growbuf_free(&w->raw);
	free(w);
}

/* Is name listed in the request's Connection header(s)? */
static bool named_in_connection(const header_list *h, const char *name)
{
	size_t nlen = strlen(name);
	for (size_t i = 0; i < h->n; i++) {
		if (!str_caseeq(h->v[i].name, "Connection"))
			continue;
		const char *p = h->v[i].value;
		while (*p) {
			while (*p == ' ' || *p == '\t' || *p == ',')
				p++;
			const char *s = p;
			while (*p && *p != ',')
				p++;
			const char *e = p;
			while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
				e--;
			if ((size_t)(e - s) == nlen &&
			    str_ncaseeq(s, name, nlen))
				return true;
		}
	}
	return false;
}

/* The headers the decision was made on: the key and its parts, the
 * tenant's header and the credential. A client cannot make them hop-by-hop
 * by naming them in Connection: the upstream must see what was claimed. */
static bool is_identity_header(const job *j, const char *name)
{
	if (str_caseeq(name, "Idempotency-Key") ||
	    str_caseeq(name, "Authorization"))
		return true;
	const route_cfg *r = j->plan ? j->plan->route : NULL;
	return r && ((r->tenant_kind == TENANT_HEADER &&
		      str_caseeq(name, r->tenant_arg)) ||
		     key_from_uses_header(&r->key_from, name));
}

static void build_upstream_headers(const job *j, header_list *out)
{
	const header_list *in = &j->req_headers;
	const char *xff = NULL, *host = header_list_get(in, "Host");
	bool has_proto = false, has_fwd_host = false, has_rid = false;
	/* A protected answer may be replayed to a retry that cannot read its
	 * coding: ask only for codings the proxy can decode. */
	bool claimed = j->plan && j->plan->action == PLAN_CLAIM;
	for (size_t i = 0; i < in->n; i++) {
		const http_header *h = &in->v[i];
		if (upstream_is_hop_header(h->name) ||
		    str_caseeq(h->name, "Host") ||
		    str_caseeq(h->name, "Expect") ||
		    (!is_identity_header(j, h->name) &&
		     named_in_connection(in, h->name)))
			continue;
		if (str_caseeq(h->name, "X-Forwarded-For")) {
			xff = h->value;
			continue;
		}
		if (claimed && str_caseeq(h->name, "Accept-Encoding"))
			continue;
		/* Every attempt carries the key as it was claimed, in one
		 * spelling, whatever spelling this attempt's client used. */
		if (claimed && j->plan->key_header[0] &&
		    str_caseeq(h->name, "Idempotency-Key")) {
			const char *k = j->plan->key_header;
			header_list_add(out, h->name, strlen(h->name), k,
					strlen(k));
			continue;
		}
		if (str_caseeq(h->name, "X-Forwarded-Proto"))
			has_proto = true;
		if (str_caseeq(h->name, "X-Forwarded-Host"))
			has_fwd_host = true;
		if (str_caseeq(h->name, "X-Request-Id"))
			has_rid = true;
		header_list_add(out, h->name, strlen(h->name), h->value,
				strlen(h->value));
	}
	growbuf v = {0};
	if (xff)
		growbuf_printf(&v, "%s, %s", xff, j->client_ip);
	else
		growbuf_puts(&v, j->client_ip);
	header_list_add(out, "X-Forwarded-For", 15, v.data, v.len);
	if (!has_proto)
		header_list_add(out, "X-Forwarded-Proto", 17, "http", 4);
	if (!has_fwd_host && host)
		header_list_add(out, "X-Forwarded-Host", 16, host,
				strlen(host));
	if (!has_rid)
		header_list_add(out, "X-Request-Id", 12, j->request_id,
				strlen(j->request_id));
	if (claimed && coding_upstream_accept(in, &v))
		header_list_add(out, "Accept-Encoding", 15, v.data, v.len);
	growbuf_free(&v);
}

/* Responses above max_stored_response still pass through; beyond this hard
 * bound the proxy will not hold a body in memory. */
static int64_t response_cap(const config *cfg)
{
	int64_t cap = cfg->max_stored_response * 16;
	return cap < cfg->max_response ? cfg->max_response : cap;
}

/* deadline_ms > 0: the call ends by then (an owned attempt's lease end,
 * less the margin). */
static void send_upstream(proxy_worker *w, job *j, const route_cfg *r,
			  double deadline_ms, upstream_resp *resp)
{
	header_list hdrs = {0};
	build_upstream_headers(j, &hdrs);
	int64_t cap = response_cap(j->cfg);
	upstream_req req = {
		.method = j->method,
		.base = r->upstream,
		.target = j->target,
		.headers = &hdrs,
		.body = j->body.data,
		.body_len = j->body.len,
		.timeout_ms = r->upstream_timeout_ms,
		.deadline_ms = deadline_ms,
		.max_response = cap,
	};
	upstream_send(w->up, &req, resp);
	header_list_free(&hdrs);
	j->upstream_ms += resp->ms;
	metrics_observe_upstream_ms(resp->ms);
	metrics_upstream_response(
		r->name, resp->outcome == UP_RESPONSE ? resp->status : 0);
}

/* Hands the upstream's response to the client as it is. */
static void pass_response(job *j, upstream_resp *resp)
{
	j->status = resp->status;
	header_list_free(&j->resp_headers);
	j->resp_headers = resp->headers;
	memset(&resp->headers, 0, sizeof resp->headers);
	growbuf_free(&j->resp_body);
	j->resp_body = resp->body;
	memset(&resp->body, 0, sizeof resp->body);
}

/* The status is known but the body was not held (beyond max_response). */
static void response_too_large(job *j, const upstream_resp *resp)
{
	char d[320];
	snprintf(d, sizeof d,
		 "the upstream answered %d with a body too large to pass on "
		 "(%s)",
		 resp->status, resp->error);
	reply_problem(j, 502, "upstream_response_too_large", d, 0);
}

static void forward_unprotected(proxy_worker *w, job *j, const route_cfg *r)
{
	upstream_resp resp;
	send_upstream(w, j, r, 0, &resp);
	if (resp.outcome == UP_RESPONSE && resp.too_large)
		response_too_large(j, &resp);
	else if (resp.outcome == UP_RESPONSE)
		pass_response(j, &resp);
	else if (resp.outcome == UP_NOT_SENT)
		reply_problem(j, 502, "upstream_unavailable", resp.error, 0);
	else
		reply_problem(j, 504, "upstream_outcome_unknown", resp.error,
			      decide_retry_after_s(r->retry_after_ms));
	upstream_resp_free(&resp);
}

/* A request's raw form (fp_raw_form) is kept in a cache entry only up to
 * this size: larger ones are found by their fingerprint. */
#define RAW_FORM_MAX 4096

/* Bodies from this size have their canonical JSON made by a helper thread
 * (offload.h) when on a fiber, and never by the front end's fast path.
 * Parsing, sorting and dumping runs at 5-8 MB/s for a body of many small
 * objects (0.9 ms for 7.5KB, 167 ms for 880KB here): below 8KiB it costs
 * the serving thread about a millisecond, less than handing it over is
 * worth; max_request_body (1MiB by default) would cost far more. */
#define FP_OFFLOAD_MIN (8 * 1024)

typedef struct fp_job {
	const fp_input *in;
	uint8_t *fp;
} fp_job;

static void fp_job_run(void *arg)
{
	fp_job *f = arg;
	fp_compute(f->in, f->fp);
}

/* The fingerprint of j's request into fp, or (fp NULL) its raw form into
 * raw; false when the raw form is larger than RAW_FORM_MAX. */
static bool fingerprint_of(const job *j, const route_cfg *r, uint8_t fp[FP_LEN],
			   growbuf *raw)
{
	size_t n = r->fingerprint_headers.n;
	const char *one[1];
	const char **values = n <= 1 ? one : xcalloc(n, sizeof *values);
	for (size_t i = 0; i < n; i++)
		values[i] = header_list_get(&j->req_headers,
					    r->fingerprint_headers.v[i]);
	fp_input in = {
		.method = j->method,
		.route = r->name,
		.raw_target = j->target,
		.content_type =
			header_list_get(&j->req_headers, "Content-Type"),
		.n_headers = n,
		.header_names = (const char *const *)r->fingerprint_headers.v,
		.header_values = values,
		.body = j->body.data ? j->body.data : "",
		.body_len = j->body.len,
		.ignore = r->fp_ignore,
		.n_ignore = r->n_fp_ignore,
		.only = r->fp_only,
		.n_only = r->n_fp_only,
	};
	bool ok = true;
	fp_job fj = {&in, fp};
	if (fp && in.body_len >= FP_OFFLOAD_MIN)
		(void)offload_run(fp_job_run, &fj);
	else if (fp)
		fp_compute(&in, fp);
	else
		ok = fp_raw_form(&in, RAW_FORM_MAX, raw);
	if (values != one)
		free(values);
	return ok;
}

static void compute_fingerprint(const job *j, const route_cfg *r,
				uint8_t out[FP_LEN])
{
	(void)fingerprint_of(j, r, out, NULL);
}

typedef struct decode_job {
	const char *ce, *in;
	size_t len;
	int64_t max;
	growbuf *out;
	char err[160];
	int rc;
} decode_job;

static void decode_job_run(void *arg)
{
	decode_job *d = arg;
	d->rc = coding_decode(d->ce, d->in, d->len, d->max, d->out, d->err,
			      sizeof d->err);
}

/* The stored coding goes with the body whatever replay_headers says; a
 * retry that does not accept it gets the body decoded, by a helper thread
 * (a few KiB of gzip can decode to max_response, hundreds of ms). What
 * cannot be decoded is replayed as stored, labelled with its coding. */
static void replay_body(job *j, const char *body, size_t body_len)
{
	growbuf ce = {0};
	growbuf_reset(&j->resp_body);
	if (coding_of(&j->resp_headers, &ce) &&
	    !coding_accepted(&j->req_headers, ce.data)) {
		decode_job d = {.ce = ce.data,
				.in = body,
				.len = body_len,
				.max = response_cap(j->cfg),
				.out = &j->resp_body};
		(void)offload_run(decode_job_run, &d);
		if (d.rc == 0) {
			coding_mark_decoded(&j->resp_headers);
			growbuf_free(&ce);
			return;
		}
		log_warn("stored response not decoded; replayed in its coding",
			 "request_id=%s trace_id=%s coding=%s %s",
			 j->request_id, job_trace_id(j), ce.data, d.err);
	}
	growbuf_free(&ce);
	growbuf_append(&j->resp_body, body, body_len);
}

/* Would this replay decode its body? Not work for the event thread. */
static bool replay_decodes(const job *j, const char *headers,
			   size_t headers_len)
{
	header_list h = {0};
	growbuf ce = {0};
	decide_decode_replay_headers(headers, headers_len, &h);
	bool r = coding_of(&h, &ce) &&
		 !coding_accepted(&j->req_headers, ce.data);
	growbuf_free(&ce);
	header_list_free(&h);
	return r;
}

static void respond_replay(job *j, int status, const char *headers,
			   size_t headers_len, const char *body,
			   size_t body_len)
{
	j->outcome = "replayed";
	j->status = status;
	header_list_free(&j->resp_headers);
	decide_decode_replay_headers(headers, headers_len, &j->resp_headers);
	header_list_add(&j->resp_headers, "Idempotent-Replayed", 19, "true", 4);
	replay_body(j, body, body_len);
}

/* How long this process may trust a completed record from its cache: at
 * most the cache ttl from now, and never past the record's expiry. */
static double cache_deadline(const job *j, double record_expires_ms)
{
	double ttl_end = mono_ms() + (double)j->cfg->replay_cache_ttl_ms;
	return record_expires_ms < ttl_end ? record_expires_ms : ttl_end;
}

static void cache_put(proxy_worker *w, const job *j, const request_plan *p,
		      int status, const char *headers, size_t headers_len,
		      const char *body, size_t body_len)
{
	if (!w->cache || j->cfg->replay_cache_ttl_ms <= 0)
		return;
	replay_key k = {p->tenant, p->route->name, p->key};
	/* Retries are mostly this request again, byte for byte: the fast
	 * path then finds the entry by the request's raw form, without
	 * parsing the body. */
	bool raw = fingerprint_of(j, p->route, NULL, &w->raw);
	replay_entry e = {.hash = j->fp,
			  .raw = raw ? w->raw.data : NULL,
			  .raw_len = raw ? w->raw.len : 0,
			  .status = status,
			  .headers = headers,
			  .headers_len = headers_len,
			  .body = body,
			  .body_len = body_len};
	replay_cache_put(w->cache, &k, &e,
			 cache_deadline(j, w->cache_expires_ms), w->cache_gen);
}

/* What a sealed record is bound to; has_body as when it was sealed. */
static seal_scope scope_of(const job *j, const request_plan *p, int status,
			   bool has_body)
{
	seal_scope sc = {p->tenant, p->route->name, p->key,
			 j->fp,     status,         has_body};
	return sc;
}

/* Opens a sealed record into plain_h and plain_b. A sealed body is never
 * empty, so an empty one means none was stored. */
static int open_record(proxy_worker *w, const job *j, const request_plan *p,
		       const claim_result *c, char *err, size_t errlen)
{
	seal_scope sc = scope_of(j, p, c->status, c->body_len > 0);
	growbuf_reset(&w->plain_b);
	if (seal_open(j->cfg->seal, &sc, SEAL_HEADERS, c->headers,
		      c->headers_len, &w->plain_h, err, errlen) < 0)
		return -1;
	if (c->body_len == 0)
		return 0;
	return seal_open(j->cfg->seal, &sc, SEAL_BODY, c->body, c->body_len,
			 &w->plain_b, err, errlen);
}

/* A record that does not open is never replayed, and nothing is forwarded
 * in its place: the key's one upstream effect has happened already. */
static void respond_unreadable(job *j, const request_plan *p, const char *why)
{
	j->outcome = "record_unreadable";
	metrics_event("record_unreadable");
	log_error("stored record cannot be read; not replayed",
		  "request_id=%s trace_id=%s route=%s key=%s %s", j->request_id,
		  job_trace_id(j), p->route->name, p->key, why);
	reply_problem(j, 500, "idempotency_record_unreadable",
		      "the response stored for this key cannot be read; it is "
		      "not replayed and the request was not forwarded again",
		      0);
}

/* A record an operator settled as "executed, no answer to give"
 * (POST /admin/keys/.../resolve): completed with status 0 and nothing
 * stored. The operation happened once; there is nothing to replay and
 * nothing may be sent again. */
#define COMPLETED_DETAIL \
	"the operation for this key was completed (settled by an operator); " \
	"its response was not recorded and it must not be sent again"

static void respond_completed(job *j)
{
	j->outcome = "operation_completed";
	reply_problem(j, 422, "idempotency_operation_completed",
		      COMPLETED_DETAIL, 0);
}

static void replay(proxy_worker *w, job *j, const request_plan *p,
		   const claim_result *c)
{
	if (!c->replayable && c->status == 0) {
		respond_completed(j);
		return;
	}
	if (!c->replayable) {
		j->outcome = "not_replayable";
		reply_problem(j, 409, "idempotency_response_not_replayable",
			      "the first response to this key was too large "
			      "to store; it cannot be replayed",
			      0);
		return;
	}
	const char *h = c->headers, *b = c->body;
	size_t hl = c->headers_len, bl = c->body_len;
	if (seal_is_sealed(h, hl)) {
		char err[256];
		if (open_record(w, j, p, c, err, sizeof err) < 0) {
			respond_unreadable(j, p, err);
			return;
		}
		h = w->plain_h.data;
		hl = w->plain_h.len;
		b = w->plain_b.data ? w->plain_b.data : "";
		bl = w->plain_b.len;
	}
	respond_replay(j, c->status, h, hl, b, bl);
	cache_put(w, j, p, c->status, h, hl, b, bl);
}

/* A response as it goes to the store: sealed under the active key when
 * store_encryption is on. body is NULL when none is stored. */
typedef struct stored_form {
	const char *headers;
	size_t headers_len;
	const char *body;
	size_t body_len;
	const char *seal_key;
} stored_form;

static void make_stored(proxy_worker *w, const job *j, const request_plan *p,
			int status, const growbuf *plain_h, const char *body,
			size_t body_len, stored_form *out)
{
	const seal_keyring *k = j->cfg->seal;
	*out = (stored_form){plain_h->data ? plain_h->data : "", plain_h->len,
			     body, body_len, NULL};
	if (!k)
		return;
	seal_scope sc = scope_of(j, p, status, body != NULL);
	seal_seal(k, &sc, SEAL_HEADERS, out->headers, out->headers_len,
		  &w->sealed_h);
	out->headers = w->sealed_h.data;
	out->headers_len = w->sealed_h.len;
	if (body) {
		seal_seal(k, &sc, SEAL_BODY, body, body_len, &w->sealed_b);
		out->body = w->sealed_b.data;
		out->body_len = w->sealed_b.len;
	}
	out->seal_key = seal_keyring_active(k);
	/* Each seal drew a nonce: counted against the key's budget. */
	seal_tally_add(out->seal_key, body ? 2 : 1);
}

/* How this job's claim and record may be batched with other workers'. */
static store_batch_use batch_use(proxy_worker *w, const job *j)
{
	store_batch_use u = {w->batch,
			     w->st,
			     j->cfg->db_batch,
			     j->cfg->statement_timeout_ms,
			     j->cfg->db_batch_stall_ms,
			     0};
	return u;
}

/* A release the worker could not make (the store failed, even after one
 * reconnect) goes to the background retrier, which keeps trying until the
 * attempt's lease ends; the client is answered now (a released key
 * replays nothing). A complete never comes here: see record_again. */
static void defer_record(proxy_worker *w, const job *j, const record_key *k,
			 enum decide_record what, int status,
			 const stored_form *sf, bool replayable,
			 double lease_end_ms, const char *err)
{
	bool complete = what == REC_COMPLETE;
	record_retry_item it = {
		.request_id = j->request_id,
		.trace_id = j->trace_id,
		.key = k,
		.complete = complete,
		.status = complete ? status : 0,
		.headers = complete ? sf->headers : NULL,
		.headers_len = complete ? sf->headers_len : 0,
		.body = complete ? sf->body : NULL,
		.body_len = complete ? sf->body_len : 0,
		.replayable = replayable,
		.seal_key = complete ? sf->seal_key : NULL,
		.lease_end_ms = lease_end_ms,
	};
	metrics_event("record_deferred");
	log_warn("could not record the outcome; retrying in the background "
		 "until the lease ends",
		 "request_id=%s trace_id=%s route=%s key=%s %s", j->request_id,
		 job_trace_id(j), k->operation, j->key, err);
	record_retry_add(w->retry, &it);
}

/* What a record's write stored, for what follows it. */
typedef struct record_done {
	stored_form sf;
	bool replayable;
	bool keep_body; /* the body is stored (and cached) */
	bool fenced;
} record_done;

/* The write itself: a release, or the answer completed (through the
 * batch when there is one). 0, or -1 with err. */
static int record_write(proxy_worker *w, job *j, const request_plan *p,
			const record_key *k, enum decide_record what,
			const upstream_resp *resp, double lease_end_ms,
			record_done *o, char *err, size_t errlen)
{
	const route_cfg *r = p->route;
	growbuf *h = &w->scratch;
	growbuf_reset(h);
	/* status_only keeps no body, so any size replays. */
	o->keep_body = !r->status_only;
	if (what == REC_RELEASE)
		return store_release(w->st, k, &o->fenced, err, errlen);
	o->replayable = r->status_only || (!resp->too_large &&
					   (int64_t)resp->body.len <=
						   j->cfg->max_stored_response);
	o->keep_body = o->keep_body && o->replayable;
	decide_encode_replay_headers(r, &resp->headers, h);
	make_stored(w, j, p, resp->status, h,
		    o->keep_body ? (resp->body.data ? resp->body.data : "")
				 : NULL,
		    o->keep_body ? resp->body.len : 0, &o->sf);
	complete_req q = {
		k,          resp->status,   o->sf.headers, o->sf.headers_len,
		o->sf.body, o->sf.body_len, o->replayable, o->sf.seal_key};
	store_batch_use u = batch_use(w, j);
	u.lease_end_ms = lease_end_ms;
	return store_batch_complete(&u, &q, &o->fenced, err, errlen);
}

/* How a record's write ended; only a written answer goes to the client. */
enum record_end { RECORD_WRITTEN, RECORD_UNRECORDED, RECORD_FENCED };

/* Backoff between the worker's own tries of a record that failed. */
#define RECORD_AGAIN_FIRST_MS 50.0
#define RECORD_AGAIN_MAX_MS 1000.0

/* The answer's record failed: the worker writes it again itself, with
 * backoff, while the client waits, until the lease less its margin (then
 * another attempt may take the key over). Each try is a repeat (an earlier
 * one may have committed) and keeps the store-wait deadline and that end.
 * 0 when written (*fenced: by another attempt), -1 with err. */
static int record_again(proxy_worker *w, const job *j, const request_plan *p,
			const record_key *k, int status, const record_done *o,
			double lease_end_ms, bool *fenced, char *err,
			size_t errlen)
{
	double until = lease_end_ms - (double)route_lease_margin_ms(p->route);
	record_key rk = *k;
	rk.repeat = true;
	complete_req q = {
		&rk,        status,         o->sf.headers, o->sf.headers_len,
		o->sf.body, o->sf.body_len, o->replayable, o->sf.seal_key};
	double backoff = RECORD_AGAIN_FIRST_MS;
	for (int tries = 1;; tries++) {
		double next = mono_ms() + backoff;
		if (next >= until)
			return -1;
		/* On the worker's fiber: the serving loop goes on meanwhile. */
		(void)fiber_wait_fds(0, NULL, NULL, NULL, next);
		store_set_deadline(w->st, until);
		int rc = store_complete_req(w->st, &q, fenced, err, errlen);
		store_set_deadline(w->st, 0);
		if (rc == 0) {
			metrics_event("record_retried");
			log_info("outcome recorded after the store came back",
				 "request_id=%s trace_id=%s route=%s key=%s "
				 "tries=%d",
				 j->request_id, job_trace_id(j), p->route->name,
				 p->key, tries);
			return 0;
		}
		backoff = backoff * 2 > RECORD_AGAIN_MAX_MS
				  ? RECORD_AGAIN_MAX_MS
				  : backoff * 2;
	}
}

/* A write that failed for good (or a release handed to the retrier). */
static void record_lost(proxy_worker *w, const job *j, const request_plan *p,
			const record_key *k, enum decide_record what,
			const record_done *o, double lease_end_ms,
			const char *err)
{
	if (what == REC_RELEASE && w->retry && mono_ms() < lease_end_ms) {
		defer_record(w, j, k, what, 0, &o->sf, false, lease_end_ms,
			     err);
		return;
	}
	metrics_event("record_failed");
	log_error("could not record the outcome; the record stays "
		  "processing until its lease ends",
		  "request_id=%s trace_id=%s route=%s key=%s write=%s %s",
		  j->request_id, job_trace_id(j), p->route->name, j->key,
		  what == REC_COMPLETE ? "complete" : "release", err);
}

/* After the write: a failed release goes to the retrier while the lease
 * lasts (a failed complete was retried by record()), a fenced write is
 * logged, a replayable answer is cached, and this instance's waiters are
 * woken. */
static enum record_end
record_settled(proxy_worker *w, job *j, const request_plan *p,
	       const record_key *k, enum decide_record what,
	       const upstream_resp *resp, double lease_end_ms,
	       const record_done *o, int rc, const char *err)
{
	const route_cfg *r = p->route;
	if (rc) {
		record_lost(w, j, p, k, what, o, lease_end_ms, err);
		return RECORD_UNRECORDED;
	}
	if (o->fenced) {
		metrics_event("record_fenced");
		log_warn("attempt lost its lease to another attempt; outcome "
			 "not recorded",
			 "request_id=%s trace_id=%s route=%s key=%s",
			 j->request_id, job_trace_id(j), r->name, j->key);
		return RECORD_FENCED;
	}
	if (what == REC_COMPLETE && o->replayable)
		cache_put(w, j, p, resp->status, w->scratch.data,
			  w->scratch.len, o->keep_body ? resp->body.data : "",
			  o->keep_body ? resp->body.len : 0);
	/* Waiters on this instance are woken here, without the round trip
	 * through the database's NOTIFY. */
	if (w->waiters && waiters_any(w->waiters)) {
		uint8_t scope[WAKE_SCOPE_LEN];
		wake_scope(w->wake, p->tenant, r->name, p->key, scope);
		waiters_wake(w->waiters, scope);
	}
	return RECORD_WRITTEN;
}

/* Records the outcome of the attempt this worker owns. A complete that
 * fails is written again by the worker while the lease allows (the client
 * waits: it never gets an answer whose record is not written); a release
 * that fails goes to the background retrier. Until a record is written it
 * stays processing and the lease rules decide what a retry gets. */
static enum record_end record(proxy_worker *w, job *j, const request_plan *p,
			      const claim_result *c, const record_key *k,
			      enum decide_record what,
			      const upstream_resp *resp, double lease_end_ms)
{
	if (what == REC_LEAVE)
		return RECORD_WRITTEN;
	char err[256];
	record_done o = {0};
	double t0 = mono_ms();
	int rc = record_write(w, j, p, k, what, resp, lease_end_ms, &o, err,
			      sizeof err);
	metrics_set_store_up(rc == 0 || !store_outage(w->st));
	if (rc && what == REC_COMPLETE) {
		log_warn("could not record the outcome; trying again while "
			 "the client waits",
			 "request_id=%s trace_id=%s route=%s key=%s %s",
			 j->request_id, job_trace_id(j), p->route->name, j->key,
			 err);
		rc = record_again(w, j, p, k, resp->status, &o, lease_end_ms,
				  &o.fenced, err, sizeof err);
		metrics_set_store_up(rc == 0 || !store_outage(w->st));
	}
	double ms = mono_ms() - t0;
	j->store_ms += ms;
	metrics_observe_store_ms(ms);
	return record_settled(w, j, p, k, what, resp, lease_end_ms, &o, rc,
			      err);
}

/* The upstream answered but its record is not written (the store stayed
 * away until the lease's end, less its margin) or another attempt owns the
 * key: the client must not get an answer the key will not replay. */
static void outcome_unrecorded(job *j, const route_cfg *r, enum record_end end)
{
	j->outcome = "outcome_unrecorded";
	metrics_event("outcome_unrecorded");
	reply_problem(
		j, 503, "idempotency_outcome_unrecorded",
		end == RECORD_FENCED
			? "the upstream was called and answered, but another "
			  "attempt took the key over before the answer was "
			  "recorded; a retry with the same key gets that "
			  "attempt's outcome"
			: "the upstream was called and answered, but the "
			  "answer could not be recorded within the key's "
			  "lease; "
			  "a retry with the same key is held (on_unknown hold) "
			  "or executed again after the lease "
			  "(release_after_lease)",
		decide_retry_after_s(r->lease_ms));
}

/* The request was sent and no complete answer came back: the record stays
 * processing. With on_unknown = hold a retry with the same key can never
 * run it again (it waits for the lease, then is held for an operator);
 * with release_after_lease a retry after the lease runs it again, so the
 * client is told to find out first, never to retry. */
static void outcome_unknown(job *j, const route_cfg *r)
{
	bool hold = r->on_unknown_hold;
	reply_problem_state(
		j, 504, "upstream_outcome_unknown",
		hold ? "the request was sent upstream but no complete answer "
		       "came back; a retry with the same key is never sent "
		       "again (on_unknown hold): it waits for the lease, "
		       "then is held until an operator settles the key"
		     : "the request was sent upstream but no complete answer "
		       "came back; after the lease a retry with the same key "
		       "is executed again (on_unknown release_after_lease): "
		       "find out whether it took effect before retrying",
		decide_retry_after_s(r->lease_ms),
		(problem_facts){.state = PROBLEM_UNKNOWN,
				.action = hold ? PROBLEM_RETRY_SAME_KEY
					       : PROBLEM_DO_NOT_RETRY});
}

/* Too little of the attempt's lease is left for the whole upstream call:
 * nothing is sent, the key is released (fenced by the attempt's token) so
 * that a retry goes at once, and the client is told to retry. */
static void lease_too_short(proxy_worker *w, job *j, const request_plan *p,
			    const claim_result *c, const record_key *k,
			    double lease_end_ms, double left_ms)
{
	const route_cfg *r = p->route;
	upstream_resp none = {0};
	record(w, j, p, c, k, REC_RELEASE, &none, lease_end_ms);
	metrics_event("lease_expired");
	log_warn(
		"too little of the attempt's lease left to send; released, "
		"nothing sent",
		"request_id=%s trace_id=%s route=%s key=%s lease_left_ms=%.0f "
		"needed_ms=%lld",
		j->request_id, job_trace_id(j), r->name, p->key, left_ms,
		(long long)(r->upstream_timeout_ms + route_lease_margin_ms(r)));
	j->outcome = "lease_expired";
	reply_problem(j, 503, "idempotency_lease_expired",
		      "the key was claimed too late to finish the upstream "
		      "call within its lease; nothing was sent and the key "
		      "was released: retry with the same key",
		      decide_retry_after_s(r->retry_after_ms));
}

static void forward_owned(proxy_worker *w, job *j, const route_cfg *r,
			  const request_plan *p, const claim_result *c,
			  double lease_end_ms)
{
	record_key k = {p->tenant, r->name, p->key, c->owner, false};
	/* Checked right before the send: whatever stalled since the claim
	 * was sent (the store's answer, a worker's wait) is counted. The
	 * call (connect included) must end a margin before the lease does,
	 * when another attempt may take the key over. */
	int64_t margin = route_lease_margin_ms(r);
	double left = lease_end_ms - mono_ms();
	if (left < (double)(r->upstream_timeout_ms + margin)) {
		lease_too_short(w, j, p, c, &k, lease_end_ms, left);
		return;
	}
	upstream_resp resp;
	send_upstream(w, j, r, lease_end_ms - (double)margin, &resp);
	bool got = resp.outcome == UP_RESPONSE;
	enum decide_record what = decide_record_for(
		r, got, resp.outcome != UP_NOT_SENT, resp.status);
	enum record_end end = record(w, j, p, c, &k, what, &resp, lease_end_ms);
	if (got && what == REC_COMPLETE && end != RECORD_WRITTEN) {
		outcome_unrecorded(j, r, end);
	} else if (got && resp.too_large) {
		j->outcome = "forwarded";
		response_too_large(j, &resp);
	} else if (got) {
		j->outcome = "forwarded";
		pass_response(j, &resp);
	} else if (resp.outcome == UP_NOT_SENT) {
		j->outcome = "upstream_unavailable";
		reply_problem(j, 502, "upstream_unavailable", resp.error, 0);
	} else {
		j->outcome = "outcome_unknown";
		log_warn("upstream outcome unknown",
			 "request_id=%s trace_id=%s key=%s %s", j->request_id,
			 job_trace_id(j), p->key, resp.error);
		outcome_unknown(j, r);
	}
	upstream_resp_free(&resp);
}

/* The claim failed. Only an outage (no connection could be made, or it
 * broke) may be forwarded unprotected with unavailable = "forward"; an error
 * from a working database (contention, a statement timeout, any SQL error)
 * is always refused: the store is there and said no. */
static void store_down(proxy_worker *w, job *j, const route_cfg *r,
		       const char *err)
{
	bool outage = store_outage(w->st);
	metrics_set_store_up(!outage);
	if (outage)
		log_debug("store unavailable", "request_id=%s trace_id=%s %s",
			  j->request_id, job_trace_id(j), err);
	else
		log_warn("store error", "request_id=%s trace_id=%s %s",
			 j->request_id, job_trace_id(j), err);
	if (outage && j->cfg->db_unavailable_forward) {
		metrics_event("forwarded_unprotected");
		forward_unprotected(w, j, r);
		j->outcome = "store_unavailable";
		return;
	}
	j->outcome = "store_unavailable";
	reply_problem(j, 503, "idempotency_store_unavailable",
		      "the idempotency store cannot be reached; retry later "
		      "with the same key",
		      decide_retry_after_s(r->retry_after_ms));
}

/* The claim of a waiting duplicate failed: it is answered 503, never
 * forwarded unprotected (the attempt it waits for is in flight) and never
 * left hanging. What is known of the key: in flight if its claim said so
 * just now, nothing sure once it was woken (the record changed: it may
 * have completed). Either way a retry with the same key cannot run it
 * twice. */
static void store_refuse(proxy_worker *w, job *j, const route_cfg *r,
			 const char *err, bool woken)
{
	metrics_set_store_up(!store_outage(w->st));
	log_warn("store error while waiting", "request_id=%s trace_id=%s %s",
		 j->request_id, job_trace_id(j), err);
	j->outcome = "store_unavailable";
	reply_problem_state(
		j, 503, "idempotency_store_unavailable",
		"the idempotency store cannot be reached while an "
		"earlier request with this key is in flight or "
		"just ended; retry later with the same key",
		decide_retry_after_s(r->retry_after_ms),
		(problem_facts){.state = woken ? PROBLEM_UNKNOWN
					       : PROBLEM_IN_PROGRESS,
				.action = PROBLEM_RETRY_SAME_KEY});
}

/* Once per request: may it wait, and for how long. */
static void plan_wait(job *j, const route_cfg *r)
{
	if (j->wait_planned)
		return;
	j->wait_ms = decide_wait_ms(r, &j->req_headers, &j->wait_applied_s);
	j->wait_planned = true;
}

static void add_preference_applied(job *j)
{
	if (j->wait_applied_s < 0)
		return;
	char v[32];
	int n = snprintf(v, sizeof v, "wait=%lld",
			 (long long)j->wait_applied_s);
	header_list_add(&j->resp_headers, "Preference-Applied", 18, v,
			(size_t)n);
}

/* The job stops waiting (if it was). */
static void leave_wait(proxy_worker *w, job *j, const char *outcome)
{
	if (j->wait_since_ms <= 0)
		return;
	waiters_leave(w->waiters, j, outcome);
	j->wait_since_ms = 0;
	j->wait_ms = 0; /* never admitted again */
}

enum wait_step { WAIT_PARKED, WAIT_NOT, WAIT_ANSWERED };

/* The key is in flight: park the job until the original's record changes
 * (or its lease ends, or wait_max passes). The record is marked first, so
 * that recording it sends a wake-up; a mark that finds the record changed
 * already parks the job due at once (it claims again). */
static enum wait_step wait_in_flight(proxy_worker *w, job *j,
				     const route_cfg *r, const request_plan *p)
{
	if (!w->waiters || j->wait_ms <= 0)
		return WAIT_NOT;
	double now = mono_ms();
	if (j->wait_since_ms <= 0) {
		if (!waiters_admit(w->waiters, j, p->tenant))
			return WAIT_NOT;
		j->wait_since_ms = now;
		j->wait_until_ms = now + (double)j->wait_ms;
	}
	if (now >= j->wait_until_ms) {
		leave_wait(w, j, "timed_out");
		return WAIT_NOT;
	}
	uint64_t gen = waiters_generation(w->waiters);
	bool marked;
	int64_t left;
	char err[256];
	double t0 = mono_ms();
	int rc = store_wait_mark(w->st, p->tenant, r->name, p->key, &marked,
				 &left, err, sizeof err);
	double ms = mono_ms() - t0;
	j->store_ms += ms;
	metrics_observe_store_ms(ms);
	if (rc) {
		leave_wait(w, j, "store_unavailable");
		store_refuse(w, j, r, err, false);
		return WAIT_ANSWERED;
	}
	uint8_t scope[WAKE_SCOPE_LEN];
	wake_scope(w->wake, p->tenant, r->name, p->key, scope);
	/* Just past the lease's end, the claim may take the key over. */
	double recheck = marked ? t0 + (double)left + 1.0 : 0;
	if (!waiters_park(w->waiters, j, scope, recheck, gen)) {
		leave_wait(w, j, "shutdown");
		return WAIT_NOT;
	}
	return WAIT_PARKED;
}

/* Answers a waiter that stops waiting without a claim (waiters_ops). */
void proxy_wait_answer(void *arg, job *j, enum waiters_end why)
{
	const route_cfg *r = j->plan->route;
	j->outcome = why == WAITERS_CLIENT_GONE ? "client_gone" : "in_flight";
	reply_problem(j, 409, "idempotency_key_in_use",
		      why == WAITERS_SHUTDOWN
			      ? "an earlier request with this key is still "
				"being processed and this instance is "
				"stopping; retry after the delay"
			      : "an earlier request with this key is still "
				"being processed (waited wait_max for it); "
				"retry after the delay",
		      decide_retry_after_s(r->retry_after_ms));
	add_preference_applied(j);
	reply_account(j);
	j->done(j);
}

/* The claim's statement for the job's key, timed. 0, or -1 with err. */
static int claim_key(proxy_worker *w, job *j, const route_cfg *r,
		     const request_plan *p, claim_result *c, char *err,
		     size_t errlen)
{
	if (!j->has_fp)
		compute_fingerprint(j, r, j->fp);
	j->has_fp = true;
	uint8_t owner[STORE_TOKEN_LEN];
	store_new_token(owner);
	_Static_assert(TRACE_ID_LEN == STORE_TRACE_LEN, "a trace id's bytes");
	uint8_t trace[TRACE_ID_LEN];
	if (j->trace_id[0])
		trace_ctx_id_bytes(j->trace_id, trace);
	claim_req req = {
		.tenant = p->tenant,
		.operation = r->name,
		.key = p->key,
		.hash = j->fp,
		.lease_ms = r->lease_ms,
		.ttl_ms = r->ttl_ms,
		.retain_ms = r->retain_key_ms,
		.hold_on_unknown = r->on_unknown_hold,
		.owner = owner,
		.trace_id = j->trace_id[0] ? trace : NULL,
	};
	if (w->cache) {
		/* Before the store: an operator's forget from now on
		 * invalidates whatever this claim returns. */
		replay_key rk = {p->tenant, r->name, p->key};
		w->cache_gen = replay_cache_generation(w->cache, &rk);
	}
	double t0 = mono_ms();
	store_batch_use u = batch_use(w, j);
	int rc = store_batch_claim(&u, &req, c, err, errlen);
	double ms = mono_ms() - t0;
	j->store_ms += ms;
	metrics_observe_store_ms(ms);
	return rc;
}

/* CLAIM_FORWARD, CLAIM_TAKEOVER: this attempt owns the key. */
static void claimed_forward(proxy_worker *w, job *j, const route_cfg *r,
			    const request_plan *p, const claim_result *c)
{
	if (c->decision == CLAIM_TAKEOVER)
		metrics_takeover(r->name);
	leave_wait(w, j, "took_over");
	/* The lease counted from before the statement that granted it was
	 * sent (a repeat after a lost answer counts from the repeat): never
	 * later than the database's. */
	forward_owned(w, j, r, p, c, c->asked_ms + (double)c->lease_left_ms);
}

/* CLAIM_IN_FLIGHT: wait for the original, or answer 409. True when the
 * job was parked to wait. */
static bool claimed_in_flight(proxy_worker *w, job *j, const route_cfg *r,
			      const request_plan *p)
{
	plan_wait(j, r);
	switch (wait_in_flight(w, j, r, p)) {
	case WAIT_PARKED:
		return true;
	case WAIT_ANSWERED:
		return false;
	case WAIT_NOT:
		break;
	}
	j->outcome = "in_flight";
	reply_problem(j, 409, "idempotency_key_in_use",
		      "an earlier request with this key is still being "
		      "processed; retry after the delay",
		      decide_retry_after_s(r->retry_after_ms));
	return false;
}

/* CLAIM_HELD: the outcome of an attempt is unknown and held. */
static void claimed_held(proxy_worker *w, job *j, const route_cfg *r)
{
	leave_wait(w, j, "held");
	j->outcome = "in_flight";
	reply_problem_state(j, 409, "idempotency_key_in_use",
			    "the outcome of an earlier attempt with this key "
			    "is unknown and the key is held until an "
			    "operator releases it",
			    decide_retry_after_s(r->retry_after_ms),
			    (problem_facts){.state = PROBLEM_UNKNOWN,
					    .action = PROBLEM_DO_NOT_RETRY});
}

/* CLAIM_MISMATCH: the key was used with another payload. */
static void claimed_mismatch(proxy_worker *w, job *j, const route_cfg *r)
{
	leave_wait(w, j, "mismatch");
	j->outcome = "mismatch";
	reply_problem(j, r->mismatch_status, "idempotency_key_mismatch",
		      "this key was already used with a different request "
		      "payload",
		      0);
}

/* CLAIM_EXPIRED: a tombstone. The request was completed, its response is
 * gone and the key is kept until retain_key: a retry is refused, never
 * executed again. 410, which retrying clients do not repeat. */
static void claimed_expired(proxy_worker *w, job *j, const route_cfg *r,
			    const claim_result *c)
{
	leave_wait(w, j, "expired");
	j->outcome = "expired";
	metrics_tombstone_answer(r->name);
	reply_problem_state(j, 410, "idempotency_key_expired",
			    "a request with this key was completed; its "
			    "response is no longer kept and it is not "
			    "executed again",
			    0, (problem_facts){.original_status = c->status});
}

/* True when the job was parked to wait (the worker leaves it alone). */
static bool handle_claimed(proxy_worker *w, job *j, const route_cfg *r,
			   const request_plan *p)
{
	claim_result c;
	char err[256];
	int rc = claim_key(w, j, r, p, &c, err, sizeof err);
	if (rc && j->wait_since_ms > 0) {
		leave_wait(w, j, "store_unavailable");
		store_refuse(w, j, r, err, true);
		return false;
	}
	if (rc) {
		store_down(w, j, r, err);
		return false;
	}
	/* From before the answering statement was sent: never later than
	 * the store's. */
	w->cache_expires_ms = c.asked_ms + (double)c.expires_in_ms;
	metrics_set_store_up(true);
	j->attempt = c.attempt;
	bool parked = false;
	switch (c.decision) {
	case CLAIM_TAKEOVER:
	case CLAIM_FORWARD:
		claimed_forward(w, j, r, p, &c);
		break;
	case CLAIM_REPLAY:
		replay(w, j, p, &c);
		leave_wait(w, j, "replayed");
		break;
	case CLAIM_IN_FLIGHT:
		parked = claimed_in_flight(w, j, r, p);
		break;
	case CLAIM_HELD:
		claimed_held(w, j, r);
		break;
	case CLAIM_MISMATCH:
		claimed_mismatch(w, j, r);
		break;
	case CLAIM_EXPIRED:
		claimed_expired(w, j, r, &c);
		break;
	}
	claim_result_clear(&c);
	return parked;
}

/* Steps 1-2 of the decision, made once per request. */
static const request_plan *plan_job(job *j)
{
	if (!j->plan) {
		j->plan = xmalloc(sizeof *j->plan);
		decide_request rq = {
			.method = j->method,
			.target = j->target,
			.path_len = j->path_len,
			.headers = &j->req_headers,
			.body = j->body.data ? j->body.data : "",
			.body_len = j->body.len,
			.now_ms = wall_ms(),
		};
		decide_plan(j->cfg, &rq, j->plan);
		j->route_name = j->plan->route ? j->plan->route->name : NULL;
		if (j->plan->action == PLAN_CLAIM) {
			j->key = xstrdup(j->plan->key);
			j->tenant = xstrdup(j->plan->tenant);
		}
	}
	return j->plan;
}

/* The plans the event thread answers itself: a rejection, the contract. */
static bool answer_from_plan(job *j, const request_plan *p)
{
	if (p->action != PLAN_REJECT && p->action != PLAN_CONTRACT)
		return false;
	j->outcome = p->outcome;
	if (p->action == PLAN_REJECT)
		reply_problem(j, p->status, p->code, p->detail, 0);
	else
		reply_contract(j);
	reply_account(j);
	return true;
}

bool proxy_fast_path(void *arg, job *j)
{
	const proxy_shared *sh = arg;
	/* Planning reads a body: key parts, and it is also where a large
	 * one would stall every connection on the event thread. */
	if (j->body.len > FAST_PATH_MAX_BODY)
		return false;
	const request_plan *p = plan_job(j);
	if (answer_from_plan(j, p))
		return true;
	/* Canonicalising a large JSON body would stall every connection on
	 * the event thread: leave those to a worker. */
	if (p->action != PLAN_CLAIM || !sh->cache ||
	    !replay_cache_enabled(sh->cache))
		return false;
	replay_key k = {p->tenant, p->route->name, p->key};
	int status;
	growbuf h = {0}, b = {0};
	bool hit = false;
	double now = mono_ms();
	/* A retry sent as its first attempt was is found by its raw form
	 * (no canonical JSON on the event thread); another spelling of the
	 * same payload by its fingerprint, which a worker needs anyway when
	 * there is no entry. */
	if (replay_cache_has(sh->cache, &k, now)) {
		growbuf raw = {0};
		if (fingerprint_of(j, p->route, NULL, &raw))
			hit = replay_cache_get_raw(sh->cache, &k, raw.data,
						   raw.len, now, &status, &h,
						   &b);
		growbuf_free(&raw);
	}
	if (!hit && j->body.len >= FP_OFFLOAD_MIN)
		return false; /* a worker makes it, with a helper thread */
	if (!hit) {
		compute_fingerprint(j, p->route, j->fp);
		j->has_fp = true;
		hit = replay_cache_get(sh->cache, &k, j->fp, now, &status, &h,
				       &b);
	}
	/* A body to decode is left to a worker, which replays it from the
	 * store the same way. */
	if (hit && replay_decodes(j, h.data ? h.data : "", h.len))
		hit = false;
	if (hit) {
		respond_replay(j, status, h.data ? h.data : "", h.len,
			       b.data ? b.data : "", b.len);
		plan_wait(j, p->route);
		add_preference_applied(j);
		metrics_event("replay_cache_hit");
		reply_account(j);
	}
	growbuf_free(&h);
	growbuf_free(&b);
	return hit;
}

void proxy_worker_handle(void *ctx, void *item)
{
	proxy_worker *w = ctx;
	job *j = item;
	store_set_statement_timeout(w->st, j->cfg->statement_timeout_ms);
	const request_plan *p = plan_job(j);
	const route_cfg *r = p->route;
	switch (p->action) {
	case PLAN_REJECT:
		j->outcome = p->outcome;
		reply_problem(j, p->status, p->code, p->detail, 0);
		break;
	case PLAN_CONTRACT:
		j->outcome = p->outcome;
		reply_contract(j);
		break;
	case PLAN_PASSTHROUGH:
		j->outcome = "passthrough";
		forward_unprotected(w, j, r);
		break;
	case PLAN_CLAIM:
		if (handle_claimed(w, j, r, p))
			return; /* parked: a wake-up brings it back */
		add_preference_applied(j);
		break;
	}
	reply_account(j);
	j->done(j);
}
