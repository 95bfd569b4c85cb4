#include "http_front.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cors.h"
#include "fiber.h"
#include "http_head.h"
#include "listen_addr.h"
#include "log.h"
#include "metrics.h"
#include "problem.h"
#include "reply.h"

/* What a connection is waiting for, for the request deadlines: its request
 * head (from the moment it is ready for a request: accepted, or the
 * previous answer sent), or the rest of its body. MHD's own timeout is an
 * idle timeout, which a client that trickles one byte at a time resets
 * forever. */
enum phase { PH_HEAD, PH_BODY, PH_NONE };

/* One per client connection (MHD's socket context), on the front end's
 * list while MHD holds the socket open: MHD calls the CLOSED notification,
 * which unlinks it under the lock, before it closes the fd, so the
 * watchdog never touches an fd that may have been reused. */
typedef struct conn_slot {
	struct conn_slot *prev, *next;
	int fd;
	enum phase phase;     /* under f->mu */
	double deadline_ms;   /* under f->mu */
	atomic_bool expired;  /* the watchdog answered 408 and shut it */
} conn_slot;

struct http_front {
	struct MHD_Daemon *d;
	front_opts o;
	atomic_int in_flight;     /* with a worker (suspended) */
	atomic_int open_requests; /* head read, answer not yet sent */
	atomic_bool draining;
	atomic_ulong next_id;
	char id_prefix[17];

	pthread_mutex_t mu;
	pthread_cond_t cv;
	conn_slot *slots;
	bool watch_stop;
	bool watch_started;
	pthread_t watchdog;
	growbuf timeout_answer; /* a whole 408 response, written by the watchdog */
	config *timeout_cfg;    /* what it was rendered with (a reference) */
	bool on_sched;         /* o.sched runs the daemon (start succeeded) */
};

/* How often the watchdog looks at the deadlines: their resolution. */
#define FRONT_WATCH_TICK_MS 100

/* Header lines one request may carry; more is an attack, not an API call. */
#define FRONT_MAX_HEADERS 256

enum stage { ST_HEADERS, ST_BODY, ST_WAITING, ST_DONE, ST_ANSWERED };

typedef struct req_ctx {
	http_front *f;
	struct MHD_Connection *conn;
	conn_slot *slot;
	char *raw_target;
	job *j;
	atomic_int stage;
	bool counted; /* in f->open_requests */
	bool too_large;
	bool bad_header;
	bool bad_key;
	bool folded;
	size_t header_bytes;
	size_t header_count;
} req_ctx;

/* ---- request deadlines ------------------------------------------------ */

/* Called with f->mu held. */
static void slot_arm(conn_slot *s, enum phase ph, int64_t ms)
{
	s->phase = ph;
	s->deadline_ms = mono_ms() + (double)ms;
}

/* Moves the connection to its next phase; false when the watchdog already
 * answered it (the caller then drops the connection without a word: the
 * 408 is on its way). Nothing is written by MHD for this connection while
 * it is in PH_HEAD or PH_BODY, so the watchdog's 408 never interleaves with
 * an answer of ours. */
static bool slot_enter(http_front *f, conn_slot *s, enum phase ph, int64_t ms)
{
	if (!s)
		return true;
	pthread_mutex_lock(&f->mu);
	bool ok = !atomic_load(&s->expired);
	if (ok)
		slot_arm(s, ph, ms);
	pthread_mutex_unlock(&f->mu);
	return ok;
}

static void slot_expire(http_front *f, conn_slot *s)
{
	atomic_store(&s->expired, true);
	/* Best effort: the socket is idle in our direction, so the small
	 * answer fits its send buffer. The shutdown makes MHD see the end of
	 * the stream and close the connection itself. */
	ssize_t n = send(s->fd, f->timeout_answer.data, f->timeout_answer.len,
			 MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)n;
	shutdown(s->fd, SHUT_RDWR);
	metrics_event("request_timeout");
	log_info("request deadline passed; answered 408 and closed",
		 "waiting_for=%s", s->phase == PH_HEAD ? "head" : "body");
}

static void render_timeout_answer(growbuf *out, const config *cfg)
{
	problem_links links = {cfg->problem_type_base, cfg->problem_doc_url};
	growbuf body = {0}, link = {0};
	problem_render(&body, &links, 408, "request_timeout",
		       "the request head or body did not arrive within "
		       "request_head_timeout or request_body_timeout",
		       NULL, (problem_facts){0});
	growbuf_printf(out,
		       "HTTP/1.1 408 Request Timeout\r\n"
		       "Connection: close\r\n"
		       "Content-Type: " PROBLEM_CONTENT_TYPE "\r\n"
		       "Content-Length: %zu\r\n",
		       body.len);
	/* The URL was checked at load: URI characters only. */
	if (problem_link_header(&links, &link))
		growbuf_printf(out, "Link: %s\r\n", link.data);
	growbuf_puts(out, "\r\n");
	growbuf_append(out, body.data, body.len);
	growbuf_free(&body);
	growbuf_free(&link);
}

/* The watchdog's 408 is rendered again when the configuration in force
 * is another one (its type and Link follow a reload). The reference held
 * keeps a compared address from being reused. Called with f->mu held. */
static void timeout_answer_follow(http_front *f)
{
	config *cfg = f->o.get_config(f->o.arg);
	if (cfg == f->timeout_cfg) {
		config_unref(cfg);
		return;
	}
	config_unref(f->timeout_cfg);
	f->timeout_cfg = cfg;
	growbuf_reset(&f->timeout_answer);
	render_timeout_answer(&f->timeout_answer, cfg);
}

static void *watchdog_main(void *arg)
{
	http_front *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->watch_stop) {
		timeout_answer_follow(f);
		double now = mono_ms();
		for (conn_slot *s = f->slots; s; s = s->next)
			if (s->phase != PH_NONE && !atomic_load(&s->expired) &&
			    now >= s->deadline_ms)
				slot_expire(f, s);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += FRONT_WATCH_TICK_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&f->cv, &f->mu, &ts);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

static int64_t current_head_timeout(http_front *f)
{
	config *cfg = f->o.get_config(f->o.arg);
	int64_t ms = cfg->request_head_timeout_ms;
	config_unref(cfg);
	return ms;
}

static void on_connection(void *cls, struct MHD_Connection *conn,
			  void **socket_ctx,
			  enum MHD_ConnectionNotificationCode code)
{
	http_front *f = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
			conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (!ci)
			return;
		conn_slot *s = xcalloc(1, sizeof *s);
		s->fd = ci->connect_fd;
		atomic_init(&s->expired, false);
		int64_t head_ms = current_head_timeout(f);
		pthread_mutex_lock(&f->mu);
		slot_arm(s, PH_HEAD, head_ms);
		s->next = f->slots;
		if (f->slots)
			f->slots->prev = s;
		f->slots = s;
		pthread_mutex_unlock(&f->mu);
		*socket_ctx = s;
		return;
	}
	conn_slot *s = *socket_ctx;
	if (!s)
		return;
	pthread_mutex_lock(&f->mu);
	if (s->prev)
		s->prev->next = s->next;
	else
		f->slots = s->next;
	if (s->next)
		s->next->prev = s->prev;
	pthread_mutex_unlock(&f->mu);
	free(s);
	*socket_ctx = NULL;
}

/* MHD hands the handler a decoded path without the query; the raw request
 * target comes through here, and what we return becomes the request's
 * context pointer. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	req_ctx *c = xcalloc(1, sizeof *c);
	c->f = cls;
	c->conn = conn;
	c->raw_target = xstrdup(uri ? uri : "");
	atomic_init(&c->stage, ST_HEADERS);
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	c->slot = ci ? ci->socket_context : NULL;
	return c;
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind,
				      const char *key, size_t key_size,
				      const char *value, size_t value_size)
{
	req_ctx *c = cls;
	if (!value || !http_head_on_own_line(key, key_size, value,
					     (size_t)c->j->cfg->max_header_size))
		c->folded = true;
	/* A control byte (bare CR, LF, NUL...) in a header would reach the
	 * upstream, whose parser may split the line differently from ours:
	 * refuse the request instead. */
	if (!http_head_name_ok(key, key_size) ||
	    (value && !http_head_value_ok(value, value_size))) {
		if (str_caseeq(key, "Idempotency-Key"))
			c->bad_key = true;
		else
			c->bad_header = true;
	}
	c->header_bytes += key_size + value_size + 4;
	c->header_count++;
	header_list_add(&c->j->req_headers, key, key_size, value ? value : "",
			value ? value_size : 0);
	return MHD_YES;
}

static job *start_job(req_ctx *c, const char *method, const char *version)
{
	http_front *f = c->f;
	config *cfg = f->o.get_config(f->o.arg);
	job *j = job_new(cfg);
	config_unref(cfg);
	j->method = xstrdup(method);
	j->version = xstrdup(version ? version : "");
	j->target = c->raw_target;
	c->raw_target = NULL;
	const char *q = strchr(j->target, '?');
	j->path_len = q ? (size_t)(q - j->target) : strlen(j->target);
	c->j = j;
	MHD_get_connection_values_n(c->conn, MHD_HEADER_KIND, collect_header,
				    c);
	listen_addr_peer(c->conn, j->client_ip, sizeof j->client_ip);
	/* A waiting request watches its socket for a hang-up (waiters.h). */
	const union MHD_ConnectionInfo *fd =
		MHD_get_connection_info(c->conn,
					MHD_CONNECTION_INFO_CONNECTION_FD);
	j->client_fd = fd ? fd->connect_fd : -1;
	const char *rid = header_list_get(&j->req_headers, "X-Request-Id");
	if (rid && http_head_request_id_ok(rid, sizeof j->request_id))
		snprintf(j->request_id, sizeof j->request_id, "%s", rid);
	else
		snprintf(j->request_id, sizeof j->request_id, "%s%08lx",
			 f->id_prefix,
			 (unsigned long)atomic_fetch_add(&f->next_id, 1));
	(void)trace_ctx_of_headers(&j->req_headers, j->trace_id);
	return j;
}

static enum MHD_Result send_job_response(struct MHD_Connection *conn,
					 job *j)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		j->resp_body.len, j->resp_body.data, MHD_RESPMEM_MUST_FREE);
	if (!r)
		return MHD_NO;
	j->resp_body.data = NULL; /* now MHD's */
	j->resp_body.len = j->resp_body.cap = 0;
	/* Here, the one place every answer passes, and not in the record: a
	 * replay of a record stored before (or by another version) gets the
	 * same list as a first answer, and the record keeps the upstream's
	 * own headers. */
	cors_expose_own(j->method, &j->req_headers, &j->resp_headers);
	for (size_t i = 0; i < j->resp_headers.n; i++) {
		const http_header *h = &j->resp_headers.v[i];
		/* MHD refuses headers it manages itself; that is fine. */
		(void)MHD_add_response_header(r, h->name, h->value);
	}
	int status = j->status >= 100 && j->status <= 999 ? j->status : 502;
	enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	return rc;
}

/* Runs on a worker (fiber). */
static void on_job_done(job *j)
{
	req_ctx *c = j->front_ctx;
	http_front *f = c->f; /* c may be gone once the connection resumes */
	atomic_store(&c->stage, ST_DONE);
	MHD_resume_connection(c->conn);
	/* without a thread of its own the daemon learns of it when run */
	fiber_sched_poke_source(f->o.sched);
	/* Only now: a drain that sees no request in flight may stop the
	 * daemon, and MHD_stop_daemon aborts on a connection still
	 * suspended (it does resume those already marked for resuming). */
	atomic_fetch_sub(&f->in_flight, 1);
}

/* A rejection the event thread answers itself (413, 503 overloaded);
 * with close, the connection is closed after the answer: for requests
 * whose framing or header block we do not trust, and during a drain. */
static enum MHD_Result answer(req_ctx *c, int status, const char *code,
			      const char *outcome, const char *detail,
			      int64_t retry_after_s, bool close)
{
	job *j = c->j;
	if (!slot_enter(c->f, c->slot, PH_NONE, 0))
		return MHD_NO;
	j->outcome = outcome;
	reply_problem(j, status, code, detail, retry_after_s);
	if (close)
		header_list_add(&j->resp_headers, "Connection", 10, "close", 5);
	reply_account(j);
	atomic_store(&c->stage, ST_ANSWERED);
	return send_job_response(c->conn, j);
}

static enum MHD_Result answer_now(req_ctx *c, int status, const char *code,
				  const char *outcome, const char *detail,
				  int64_t retry_after_s)
{
	return answer(c, status, code, outcome, detail, retry_after_s, false);
}

static enum MHD_Result answer_close(req_ctx *c, int status, const char *code,
				    const char *outcome, const char *detail,
				    int64_t retry_after_s)
{
	return answer(c, status, code, outcome, detail, retry_after_s, true);
}

#define SHUTTING_DOWN_DETAIL                                                   \
	"the proxy is shutting down; retry on a new connection"

/* What the request line and header block must satisfy before anything
 * else looks at the request (http_head.h); NULL when they do. */
static const char *head_problem(req_ctx *c, const char *method)
{
	header_list *h = &c->j->req_headers;
	http_head head = {
		.method = method,
		.target = c->j->target,
		.version = c->j->version,
		.folded = c->folded,
		.hosts = header_list_count(h, "Host"),
		.te = header_list_count(h, "Transfer-Encoding"),
		.te_value = header_list_get(h, "Transfer-Encoding"),
	};
	return http_head_problem(&head);
}

/* The head's size and its framing, once it passed the checks on its
 * bytes. */
static enum MHD_Result on_head_sizes(req_ctx *c, const char *method)
{
	size_t head = strlen(c->j->target) + strlen(method) + 16 +
		      c->header_bytes;
	if (head > (size_t)c->j->cfg->max_header_size ||
	    c->header_count > FRONT_MAX_HEADERS)
		return answer_now(c, 431, "request_too_large", "rejected",
				  "the request line and headers are "
				  "larger than max_header_size, or "
				  "there are too many header lines",
				  0);
	header_list *h = &c->j->req_headers;
	if (!http_head_framing_ok(header_list_count(h, "Content-Length"),
				  header_list_count(h, "Transfer-Encoding")))
		return answer_now(c, 400, "bad_request", "rejected",
				  "conflicting message framing "
				  "(Content-Length)",
				  0);
	const char *cl = header_list_get(h, "Content-Length");
	if (cl && strtoull(cl, NULL, 10) >
			  (unsigned long long)c->j->cfg->max_request_body) {
		c->too_large = true;
		return answer_now(c, 413, "request_too_large", "rejected",
				  "the request body is larger than "
				  "max_request_body",
				  0);
	}
	return MHD_YES;
}

/* The head has arrived: start the job, then refuse what must not reach a
 * worker, before any of the body is read. */
static enum MHD_Result on_head(req_ctx *c, const char *method,
			       const char *version)
{
	http_front *f = c->f;
	c->j = start_job(c, method, version);
	atomic_store(&c->stage, ST_BODY);
	c->counted = true;
	atomic_fetch_add(&f->open_requests, 1);
	if (!slot_enter(f, c->slot, PH_BODY,
			c->j->cfg->request_body_timeout_ms))
		return MHD_NO;
	const char *why = head_problem(c, method);
	if (why)
		return answer_close(c, 400, "bad_request", "rejected", why, 0);
	if (atomic_load(&f->draining))
		return answer_close(c, 503, "shutting_down", "rejected",
				    SHUTTING_DOWN_DETAIL, 1);
	if (c->bad_key && !c->bad_header)
		return answer_now(c, 400, "idempotency_key_invalid",
				  "key_invalid",
				  "the key contains a control character", 0);
	if (c->bad_header)
		return answer_now(c, 400, "bad_request", "rejected",
				  "a request header contains a control "
				  "character",
				  0);
	return on_head_sizes(c, method);
}

/* A piece of the body. Chunked uploads come without Content-Length: the
 * limit is enforced while accumulating. */
static enum MHD_Result on_upload(req_ctx *c, const char *upload,
				 size_t *upload_size)
{
	size_t max = (size_t)c->j->cfg->max_request_body;
	if (!c->too_large && c->j->body.len + *upload_size > max) {
		c->too_large = true;
		growbuf_free(&c->j->body);
	}
	if (!c->too_large)
		growbuf_append(&c->j->body, upload, *upload_size);
	*upload_size = 0;
	return MHD_YES;
}

/* The worker queue was full: answered here, and the connection resumed
 * at once. */
static void refuse_overloaded(req_ctx *c)
{
	http_front *f = c->f;
	job *j = c->j;
	atomic_fetch_sub(&f->in_flight, 1);
	j->outcome = "rejected";
	metrics_event("overloaded");
	reply_problem(j, 503, "overloaded",
		      "too many requests are waiting; retry shortly", 1);
	reply_account(j);
	atomic_store(&c->stage, ST_DONE);
	MHD_resume_connection(c->conn);
	fiber_sched_poke_source(f->o.sched);
}

/* The whole body has arrived: the fast path answers on this thread, or
 * the connection is suspended and the job goes to a worker. */
static enum MHD_Result on_body_done(req_ctx *c)
{
	http_front *f = c->f;
	if (c->too_large)
		return answer_now(c, 413, "request_too_large", "rejected",
				  "the request body is larger than "
				  "max_request_body",
				  0);
	job *j = c->j;
	/* Counted before the drain flag is read (both seq_cst): either
	 * this request sees the drain and is not started, or the drain
	 * sees it in flight and waits for it. */
	atomic_fetch_add(&f->in_flight, 1);
	if (atomic_load(&f->draining)) {
		atomic_fetch_sub(&f->in_flight, 1);
		return answer_close(c, 503, "shutting_down", "rejected",
				    SHUTTING_DOWN_DETAIL, 1);
	}
	if (!slot_enter(f, c->slot, PH_NONE, 0)) {
		atomic_fetch_sub(&f->in_flight, 1);
		return MHD_NO;
	}
	if (f->o.fast && f->o.fast(f->o.fast_arg, j)) {
		atomic_fetch_sub(&f->in_flight, 1);
		atomic_store(&c->stage, ST_ANSWERED);
		return send_job_response(c->conn, j);
	}
	j->done = on_job_done;
	j->front_ctx = c;
	atomic_store(&c->stage, ST_WAITING);
	/* Suspend before the job can finish, so the resume always follows
	 * the suspend. */
	MHD_suspend_connection(c->conn);
	if (!f->o.submit(f->o.arg, j))
		refuse_overloaded(c);
	return MHD_YES;
}

/* libmicrohttpd calls this once the head is read, once per piece of the
 * body, once after the body, and again after the connection is resumed
 * (the worker is done). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **ctxp)
{
	req_ctx *c = *ctxp;
	if (!c) /* no URI callback ran: should not happen */
		return MHD_NO;
	int st = atomic_load(&c->stage);
	if (st == ST_HEADERS)
		return on_head(c, method, version);
	if (c->slot && atomic_load(&c->slot->expired))
		return MHD_NO; /* answered 408 by the watchdog */
	if (st == ST_BODY && *upload_size)
		return on_upload(c, upload, upload_size);
	if (st == ST_BODY)
		return on_body_done(c);
	if (st == ST_DONE) {
		atomic_store(&c->stage, ST_ANSWERED);
		return send_job_response(conn, c->j);
	}
	/* ST_WAITING (spurious call) or already answered. */
	*upload_size = 0;
	return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **ctxp,
			 enum MHD_RequestTerminationCode toe)
{
	req_ctx *c = *ctxp;
	if (!c)
		return;
	/* A job still with a worker is never freed here: suspended
	 * connections are not closed. */
	ALWAYS_ASSERT(atomic_load(&c->stage) != ST_WAITING);
	http_front *f = cls;
	/* The connection is ready for its next request: its head deadline
	 * starts now (with the configuration this request ran under). */
	if (c->slot)
		(void)slot_enter(f, c->slot, PH_HEAD,
				 c->j ? c->j->cfg->request_head_timeout_ms
				      : current_head_timeout(f));
	if (c->counted)
		atomic_fetch_sub(&f->open_requests, 1);
	job_free(c->j);
	free(c->raw_target);
	free(c);
	*ctxp = NULL;
}

static void front_free(http_front *f)
{
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	growbuf_free(&f->timeout_answer);
	config_unref(f->timeout_cfg);
	free(f);
}

/* On a scheduler: one pass of the daemon's event loop, without waiting. */
static void run_daemon(void *arg)
{
	http_front *f = arg;
	MHD_run(f->d);
}

static int64_t daemon_timeout(void *arg)
{
	http_front *f = arg;
	MHD_UNSIGNED_LONG_LONG ms;
	if (MHD_get_timeout(f->d, &ms) != MHD_YES)
		return -1;
	return ms > INT32_MAX ? INT32_MAX : (int64_t)ms;
}

/* libmicrohttpd's own messages (MHD_USE_ERROR_LOG) would go to stderr
 * with fprintf, on the serving thread: through the log's buffer instead,
 * so a reader that stops reading cannot block the loop (log.h). */
__attribute__((format(printf, 2, 0))) static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	log_warn("libmicrohttpd", "%s", msg);
}

/* The front end's state, before its daemon. */
static http_front *front_new(const front_opts *o)
{
	http_front *f = xcalloc(1, sizeof *f);
	f->o = *o;
	uint8_t rnd[8];
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		memset(rnd, 0, sizeof rnd);
	hex_encode(rnd, 4, f->id_prefix);
	pthread_mutex_init(&f->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cv, &ca);
	pthread_condattr_destroy(&ca);
	return f;
}

/* The daemon has no thread of its own: the scheduler runs it
 * (run_daemon) when its epoll set is ready. */
static struct MHD_Daemon *start_daemon(http_front *f,
				       struct sockaddr_storage *ss, bool v6)
{
	const front_opts *o = &f->o;
	unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
			 MHD_USE_ITC | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	return MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, f, MHD_OPTION_SOCK_ADDR,
		(struct sockaddr *)ss, MHD_OPTION_URI_LOG_CALLBACK, on_uri, f,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, f,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, f,
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, f,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		(unsigned)o->max_connections_per_ip,
		/* Room for max_header_size and the read buffer: our own check
		 * answers 431 as problem+json before MHD's would. */
		MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		(size_t)(2 * o->max_header_size + 16384),
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
		MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
		/* Not 1: at level 1 libmicrohttpd 0.9.75 answers a request
		 * without Host itself, with its status line and headers
		 * written twice (the error queued while parsing the headers
		 * is built again when its state machine, which overwrote the
		 * state, reaches START_REPLY). head_problem checks Host and
		 * spaces in the target itself. */
		MHD_OPTION_STRICT_FOR_CLIENT, (int)0,
		MHD_OPTION_END);
}

http_front *http_front_start(const front_opts *o, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	bool v6;
	if (listen_addr_parse(o->listen, &ss, &v6, err, errlen))
		return NULL;
	http_front *f = front_new(o);
	f->d = start_daemon(f, &ss, v6);
	if (!f->d) {
		snprintf(err, errlen, "cannot listen on %s (in use?)",
			 o->listen);
		front_free(f);
		return NULL;
	}
	if (pthread_create(&f->watchdog, NULL, watchdog_main, f)) {
		snprintf(err, errlen, "cannot start the deadline watchdog");
		MHD_stop_daemon(f->d);
		front_free(f);
		return NULL;
	}
	pthread_setname_np(f->watchdog, "ip-deadlines");
	f->watch_started = true;
	const union MHD_DaemonInfo *di =
		MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_EPOLL_FD);
	if (!di) {
		snprintf(err, errlen, "libmicrohttpd has no epoll set");
		http_front_stop(f);
		return NULL;
	}
	fiber_source src = {di->epoll_fd, run_daemon, daemon_timeout, f};
	fiber_sched_set_source(o->sched, &src);
	f->on_sched = true;
	return f;
}

static void quiesce(void *arg)
{
	http_front *f = arg;
	MHD_socket s = MHD_quiesce_daemon(f->d);
	if (s != MHD_INVALID_SOCKET)
		close(s);
}

void http_front_quiesce(http_front *f)
{
	/* Only the scheduler's thread touches the daemon. */
	fiber_sched_call(f->o.sched, quiesce, f);
}

int http_front_in_flight(http_front *f)
{
	return atomic_load(&f->in_flight);
}

int http_front_drain(http_front *f, int64_t grace_ms)
{
	atomic_store(&f->draining, true);
	http_front_quiesce(f);
	double deadline = mono_ms() + (double)grace_ms;
	while (atomic_load(&f->open_requests) > 0 && mono_ms() < deadline) {
		struct timespec ts = {0, 10 * 1000000L};
		nanosleep(&ts, NULL);
	}
	return atomic_load(&f->in_flight);
}

void http_front_stop(http_front *f)
{
	if (!f)
		return;
	if (f->watch_started) {
		pthread_mutex_lock(&f->mu);
		f->watch_stop = true;
		pthread_cond_signal(&f->cv);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->watchdog, NULL);
	}
	if (f->on_sched)
		fiber_sched_set_source(f->o.sched, NULL);
	MHD_stop_daemon(f->d);
	front_free(f);
}
