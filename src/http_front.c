#include "http_front.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "proxy.h"

struct http_front {
	struct MHD_Daemon *d;
	front_opts o;
	atomic_int in_flight;
	atomic_ulong next_id;
	char id_prefix[17];
};

/* Header lines one request may carry; more is an attack, not an API call. */
#define FRONT_MAX_HEADERS 256

enum stage { ST_HEADERS, ST_BODY, ST_WAITING, ST_DONE, ST_ANSWERED };

typedef struct req_ctx {
	http_front *f;
	struct MHD_Connection *conn;
	char *raw_target;
	job *j;
	atomic_int stage;
	bool too_large;
	bool bad_header;
	bool bad_key;
	size_t header_bytes;
	size_t header_count;
} req_ctx;

int http_parse_listen(const char *listen, struct sockaddr_storage *ss,
		      bool *v6, char *err, size_t errlen)
{
	char host[256], port[16];
	int portnum;
	if (config_split_listen(listen, host, sizeof host, &portnum, err,
				errlen))
		return -1;
	snprintf(port, sizeof port, "%d", portnum);
	size_t hl = strlen(host);
	struct addrinfo hints = {0}, *res = NULL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	int rc = getaddrinfo(hl ? host : NULL, port, &hints, &res);
	if (rc || !res) {
		snprintf(err, errlen, "listen address %s: %s", listen,
			 gai_strerror(rc));
		return -1;
	}
	memset(ss, 0, sizeof *ss);
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*v6 = res->ai_family == AF_INET6;
	freeaddrinfo(res);
	return 0;
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
	return c;
}

/* RFC 9110 5.6.2 tchar. */
static bool is_tchar(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch >= '0' && ch <= '9') || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* A name must be a token (no space, quote, colon: libmicrohttpd glues an
 * obs-fold continuation into the name, and an upstream would split such a
 * name differently from us). A value may hold visible ASCII, SP, HTAB and
 * obs-text, but no control byte. */
static bool header_bytes_ok(const char *p, size_t n, bool is_value)
{
	if (!is_value && n == 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)p[i];
		if (!is_value) {
			if (!is_tchar(ch))
				return false;
			continue;
		}
		if (ch == '\t')
			continue;
		if (ch < 0x20 || ch == 0x7f)
			return false;
	}
	return true;
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind,
				      const char *key, size_t key_size,
				      const char *value, size_t value_size)
{
	req_ctx *c = cls;
	/* A control byte (bare CR, LF, NUL...) in a header would reach the
	 * upstream, whose parser may split the line differently from ours:
	 * refuse the request instead. */
	if (!header_bytes_ok(key, key_size, false) ||
	    (value && !header_bytes_ok(value, value_size, true))) {
		if (ip_strcaseeq(key, "Idempotency-Key"))
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

static bool valid_request_id(const char *v)
{
	size_t n = v ? strlen(v) : 0;
	if (n == 0 || n >= sizeof ((job *)0)->request_id)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
			return false;
	return true;
}

void http_client_ip(struct MHD_Connection *conn, char *out, size_t n)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	snprintf(out, n, "unknown");
	if (!ci || !ci->client_addr)
		return;
	const struct sockaddr *sa = ci->client_addr;
	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr,
			  out, (socklen_t)n);
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6,
			  &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
			  (socklen_t)n);
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
	http_client_ip(c->conn, j->client_ip, sizeof j->client_ip);
	/* A waiting request watches its socket for a hang-up (waiters.h). */
	const union MHD_ConnectionInfo *fd =
		MHD_get_connection_info(c->conn,
					MHD_CONNECTION_INFO_CONNECTION_FD);
	j->client_fd = fd ? fd->connect_fd : -1;
	const char *rid = header_list_get(&j->req_headers, "X-Request-Id");
	if (valid_request_id(rid))
		snprintf(j->request_id, sizeof j->request_id, "%s", rid);
	else
		snprintf(j->request_id, sizeof j->request_id, "%s%08lx",
			 f->id_prefix,
			 (unsigned long)atomic_fetch_add(&f->next_id, 1));
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

/* Runs on a worker thread. */
static void on_job_done(job *j)
{
	req_ctx *c = j->front_ctx;
	atomic_store(&c->stage, ST_DONE);
	atomic_fetch_sub(&c->f->in_flight, 1);
	MHD_resume_connection(c->conn);
}

/* A rejection the event thread answers itself (413, 503 overloaded). */
static enum MHD_Result answer_now(req_ctx *c, int status, const char *code,
				  const char *outcome, const char *detail,
				  int64_t retry_after_s)
{
	job *j = c->j;
	j->outcome = outcome;
	proxy_problem(j, status, code, detail, retry_after_s);
	proxy_account(j);
	atomic_store(&c->stage, ST_ANSWERED);
	return send_job_response(c->conn, j);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **ctxp)
{
	http_front *f = cls;
	req_ctx *c = *ctxp;
	if (!c) /* no URI callback ran: should not happen */
		return MHD_NO;
	int st = atomic_load(&c->stage);

	if (st == ST_HEADERS) {
		c->j = start_job(c, method, version);
		atomic_store(&c->stage, ST_BODY);
		if (c->bad_key && !c->bad_header)
			return answer_now(c, 400, "idempotency_key_invalid",
					  "key_invalid",
					  "the key contains a control character",
					  0);
		if (c->bad_header)
			return answer_now(c, 400, "bad_request", "rejected",
					  "a request header contains a control "
					  "character",
					  0);
		size_t head = strlen(c->j->target) + strlen(method) + 16 +
			      c->header_bytes;
		if (head > (size_t)c->j->cfg->max_header_size ||
		    c->header_count > FRONT_MAX_HEADERS)
			return answer_now(c, 431, "request_too_large",
					  "rejected",
					  "the request line and headers are "
					  "larger than max_header_size, or "
					  "there are too many header lines",
					  0);
		/* Two lengths, or a length beside chunked framing, is how
		 * requests are smuggled past one parser to another. */
		header_list *h = &c->j->req_headers;
		if (header_list_count(h, "Content-Length") > 1 ||
		    (header_list_count(h, "Content-Length") &&
		     header_list_count(h, "Transfer-Encoding")))
			return answer_now(c, 400, "bad_request", "rejected",
					  "conflicting message framing "
					  "(Content-Length)",
					  0);
		const char *cl = header_list_get(h, "Content-Length");
		if (cl && strtoull(cl, NULL, 10) >
				  (unsigned long long)c->j->cfg->max_request_body) {
			c->too_large = true;
			return answer_now(c, 413, "request_too_large",
					  "rejected",
					  "the request body is larger than "
					  "max_request_body",
					  0);
		}
		return MHD_YES;
	}
	if (st == ST_BODY && *upload_size) {
		/* Chunked uploads come without Content-Length: enforce the
		 * limit while accumulating. */
		if (!c->too_large &&
		    c->j->body.len + *upload_size >
			    (size_t)c->j->cfg->max_request_body) {
			c->too_large = true;
			ip_buf_free(&c->j->body);
		}
		if (!c->too_large)
			ip_buf_append(&c->j->body, upload, *upload_size);
		*upload_size = 0;
		return MHD_YES;
	}
	if (st == ST_BODY) {
		if (c->too_large)
			return answer_now(c, 413, "request_too_large",
					  "rejected",
					  "the request body is larger than "
					  "max_request_body",
					  0);
		job *j = c->j;
		if (f->o.fast && f->o.fast(f->o.fast_arg, j)) {
			atomic_store(&c->stage, ST_ANSWERED);
			return send_job_response(conn, j);
		}
		j->done = on_job_done;
		j->front_ctx = c;
		atomic_store(&c->stage, ST_WAITING);
		atomic_fetch_add(&f->in_flight, 1);
		/* Suspend before the job can finish, so the resume always
		 * follows the suspend. */
		MHD_suspend_connection(conn);
		if (!f->o.submit(f->o.arg, j)) {
			atomic_fetch_sub(&f->in_flight, 1);
			j->outcome = "rejected";
			metrics_event("overloaded");
			proxy_problem(j, 503, "overloaded",
				      "too many requests are waiting; retry "
				      "shortly",
				      1);
			proxy_account(j);
			atomic_store(&c->stage, ST_DONE);
			MHD_resume_connection(conn);
		}
		return MHD_YES;
	}
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
	IP_ASSERT(atomic_load(&c->stage) != ST_WAITING);
	job_free(c->j);
	free(c->raw_target);
	free(c);
	*ctxp = NULL;
}

http_front *http_front_start(const front_opts *o, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	bool v6;
	if (http_parse_listen(o->listen, &ss, &v6, err, errlen))
		return NULL;
	http_front *f = xcalloc(1, sizeof *f);
	f->o = *o;
	uint8_t rnd[8];
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		memset(rnd, 0, sizeof rnd);
	ip_hex(rnd, 4, f->id_prefix);
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD |
			 MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC |
			 MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	f->d = MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, f, MHD_OPTION_SOCK_ADDR,
		(struct sockaddr *)&ss, MHD_OPTION_URI_LOG_CALLBACK, on_uri, f,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, f,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		(unsigned)o->max_connections_per_ip,
		/* Room for max_header_size and the read buffer: our own check
		 * answers 431 as problem+json before MHD's would. */
		MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		(size_t)(2 * o->max_header_size + 16384),
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
		MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
		MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
		MHD_OPTION_END);
	if (!f->d) {
		snprintf(err, errlen, "cannot listen on %s (in use?)",
			 o->listen);
		free(f);
		return NULL;
	}
	return f;
}

void http_front_quiesce(http_front *f)
{
	MHD_socket s = MHD_quiesce_daemon(f->d);
	if (s != MHD_INVALID_SOCKET)
		close(s);
}

int http_front_in_flight(http_front *f)
{
	return atomic_load(&f->in_flight);
}

void http_front_stop(http_front *f)
{
	if (!f)
		return;
	MHD_stop_daemon(f->d);
	free(f);
}
