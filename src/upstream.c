#include "upstream.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fiber.h"
#include "log.h"
#include "metrics.h"

/* Idle upstream connections older than this are not reused: it must stay
 * below the upstream's own keep-alive timeout, or a request can be written to
 * a connection the upstream is closing (which then looks like an unknown
 * outcome, since we never resend). */
#define UPSTREAM_MAX_IDLE_S 2L
#define UPSTREAM_CONNECT_TIMEOUT_MS 3000L
/* Sockets one transfer has libcurl watch at once: its connection, a
 * resolver's, a second address being tried. */
#define UPSTREAM_MAX_WATCH 8

struct upstream {
	CURL *h;
	CURLM *m; /* owns the kept-alive connections */
	/* every socket libcurl has open for this handle, to look at the one a
	 * request is about to be written to */
	int *socks;
	/* their local and remote ports once looked up (-1: not yet): a
	 * connected socket's ports never change, and two system calls per
	 * request to look them up again were a tenth of a request's calls */
	int (*sock_ports)[2];
	size_t n_socks, cap_socks;
	/* per attempt */
	int sends;          /* requests written (libcurl's resend is refused) */
	bool late;          /* refused unsent: the call's time was up */
	bool resend_refused;
	bool stale;         /* refused a connection with unread bytes */
	bool framing_off;   /* bytes were left after the response */
	/* per response */
	bool headers_done;  /* the final response's header block has ended */
	growbuf conn_tokens; /* the response's Connection header values */
	upstream_resp *resp;
	int64_t max_response;
	double end_ms; /* the whole call ends by then (both rounds) */
	/* The request's header list and URL, built in buffers the handle
	 * keeps: no allocation per request once they are large enough. */
	struct curl_slist *hdr_nodes;
	size_t cap_nodes;
	growbuf hdr_text;
	growbuf url;
	/* On a fiber (fiber.h) the transfer is driven by libcurl's socket
	 * interface: the sockets it wants watched and its timer. */
	int wfd[UPSTREAM_MAX_WATCH], wev[UPSTREAM_MAX_WATCH], n_watch;
	long timer_ms; /* -1: none */
	double timer_at;
};

int upstream_global_init(void)
{
	return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void upstream_free(upstream *u)
{
	if (!u)
		return;
	/* Closes the kept-alive connections through on_close_socket. */
	curl_multi_cleanup(u->m);
	curl_easy_cleanup(u->h);
	growbuf_free(&u->conn_tokens);
	growbuf_free(&u->hdr_text);
	growbuf_free(&u->url);
	free(u->hdr_nodes);
	free(u->socks);
	free(u->sock_ports);
	free(u);
}

static const char *const hop_headers[] = {
	"Connection",	    "Keep-Alive", "Proxy-Connection", "TE",
	"Trailer",	    "Transfer-Encoding", "Upgrade", "Content-Length",
	"Proxy-Authenticate", "Proxy-Authorization",
};

static bool is_hop_header_n(const char *name, size_t n)
{
	for (size_t i = 0; i < sizeof hop_headers / sizeof hop_headers[0]; i++)
		if (strlen(hop_headers[i]) == n &&
		    str_ncaseeq(name, hop_headers[i], n))
			return true;
	return false;
}

bool upstream_is_hop_header(const char *name)
{
	return is_hop_header_n(name, strlen(name));
}

/* --- the sockets under the connections ------------------------------------ */

/* Every upstream socket closes abortively (RST, its queues dropped): a
 * plain close of a socket whose request the upstream has not acknowledged
 * leaves an orphan that the kernel retransmits until it gets through, so a
 * request given up on (timeout, lease deadline, shutdown) could still
 * arrive and execute after its lease ended. Set on every socket because
 * libcurl closes a connection itself (its own timeout) before the transfer
 * ends, and its close callback is told no reason. A connection closed idle
 * has nothing unacknowledged: the upstream only sees a reset instead of an
 * end of stream (a TLS close_notify may be cut off; HTTP/1.1 framing does
 * not rely on it), and the option costs one call per new connection. */
static int set_abortive_close(curl_socket_t fd)
{
	struct linger l = {.l_onoff = 1, .l_linger = 0};
	return setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

static int on_sockopt(void *p, curl_socket_t fd, curlsocktype purpose)
{
	upstream *u = p;
	if (set_abortive_close(fd) < 0) {
		/* Nothing was sent yet: the attempt ends as not sent. */
		log_warn("upstream socket: SO_LINGER failed; not sending",
			 "errno=%d", errno);
		return CURL_SOCKOPT_ERROR;
	}
	if (u->n_socks == u->cap_socks) {
		u->cap_socks = u->cap_socks ? 2 * u->cap_socks : 8;
		u->socks = xrealloc(u->socks, u->cap_socks * sizeof *u->socks);
		u->sock_ports = xrealloc(u->sock_ports,
					 u->cap_socks * sizeof *u->sock_ports);
	}
	u->sock_ports[u->n_socks][0] = u->sock_ports[u->n_socks][1] = -1;
	u->socks[u->n_socks++] = fd;
	return CURL_SOCKOPT_OK;
}

static int on_close_socket(void *p, curl_socket_t fd)
{
	upstream *u = p;
	for (size_t i = 0; i < u->n_socks; i++)
		if (u->socks[i] == fd) {
			u->n_socks--;
			u->socks[i] = u->socks[u->n_socks];
			memcpy(u->sock_ports[i], u->sock_ports[u->n_socks],
			       sizeof u->sock_ports[i]);
			break;
		}
	return close(fd);
}

static int sock_port(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)ss)->sin_port);
	if (ss->ss_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
	return -1;
}

/* The socket of the connection with these ports, or -1. */
static int find_socket(upstream *u, int port, int lport)
{
	for (size_t i = 0; i < u->n_socks; i++) {
		int fd = u->socks[i], *ports = u->sock_ports[i];
		if (ports[0] < 0) {
			struct sockaddr_storage a, b;
			socklen_t al = sizeof a, bl = sizeof b;
			if (getsockname(fd, (struct sockaddr *)&a, &al) ||
			    getpeername(fd, (struct sockaddr *)&b, &bl))
				continue; /* not connected (yet) */
			ports[0] = sock_port(&a);
			ports[1] = sock_port(&b);
		}
		if (ports[0] == lport && ports[1] == port)
			return fd;
	}
	return -1;
}

/* Is anything waiting to be read on fd (bytes, an end of stream, an error)?
 * Before a request is written nothing may be: whatever waits would be read
 * as the answer to it. With bytes_only, only bytes count (an upstream may
 * close an idle connection right after a response; libcurl notices that
 * itself before reusing it). */
static bool unread_input(int fd, bool bytes_only)
{
	char c;
	ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (bytes_only)
		return n > 0;
	return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK &&
			  errno != EINTR);
}

/* Called before the request is written on a connection. A second call after
 * a write in one transfer is libcurl resending the request on a fresh
 * connection after a reused one died: the first copy may have been
 * processed, so refuse. A connection with unread input (a late or
 * unsolicited response, a body longer than its Content-Length) is refused
 * before anything is written: the attempt is retried on a fresh connection.
 * A call whose time is up is refused too: the lease was checked before the
 * call, but a stall of this thread since (before libcurl started the
 * transfer, whose own timer then starts late) could carry the write past
 * the lease, when another attempt may hold the key. */
static int on_prereq(void *p, char *ip, char *lip, int port, int lport)
{
	upstream *u = p;
	if (mono_ms() >= u->end_ms) {
		u->late = true;
		return CURL_PREREQFUNC_ABORT;
	}
	if (u->sends > 0) {
		u->resend_refused = true;
		return CURL_PREREQFUNC_ABORT;
	}
	int fd = find_socket(u, port, lport);
	if (fd >= 0 && unread_input(fd, false)) {
		u->stale = true;
		return CURL_PREREQFUNC_ABORT;
	}
	u->sends++;
	return CURL_PREREQFUNC_OK;
}

/* --- the response --------------------------------------------------------- */

/* Is [name, name + n) listed in one of the Connection header values
 * collected in tokens (NUL-separated)? */
static bool in_tokens(const growbuf *tokens, const char *name, size_t n)
{
	const char *p = tokens->data, *end = p + tokens->len;
	while (p && p < end) {
		const char *e = memchr(p, ',', (size_t)(end - p));
		const char *s = p, *t = e ? e : end;
		while (s < t && (*s == ' ' || *s == '\t'))
			s++;
		while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
			t--;
		if ((size_t)(t - s) == n && str_ncaseeq(s, name, n))
			return true;
		p = e ? e + 1 : end;
	}
	return false;
}

/* RFC 9110 7.6.1: the headers the Connection header names describe the
 * connection, not the message. */
static void strip_connection_named(upstream *u)
{
	header_list *h = &u->resp->headers;
	if (!u->conn_tokens.len)
		return;
	size_t k = 0;
	for (size_t i = 0; i < h->n; i++) {
		if (in_tokens(&u->conn_tokens, h->v[i].name,
			      strlen(h->v[i].name))) {
			free(h->v[i].name);
			free(h->v[i].value);
			continue;
		}
		h->v[k++] = h->v[i];
	}
	h->n = k;
}

static size_t on_header(char *buf, size_t size, size_t n, void *p)
{
	upstream *u = p;
	size_t len = size * n;
	if (len >= 5 && !memcmp(buf, "HTTP/", 5)) {
		/* A new response (after 100 Continue, say): start over. */
		header_list_free(&u->resp->headers);
		growbuf_reset(&u->conn_tokens);
		u->headers_done = false;
		return len;
	}
	/* After the header block only trailers come (libcurl hands them to
	 * this callback too): they are never headers, never passed on, never
	 * stored. */
	if (u->headers_done)
		return len;
	const char *colon = memchr(buf, ':', len);
	if (!colon) {
		/* the blank line that ends the block (or garbage) */
		if (len <= 2) {
			u->headers_done = true;
			strip_connection_named(u);
		}
		return len;
	}
	size_t nlen = (size_t)(colon - buf);
	const char *v = colon + 1, *end = buf + len;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' ||
			   end[-1] == ' ' || end[-1] == '\t'))
		end--;
	if (nlen == 0)
		return len;
	if (nlen == 10 && str_ncaseeq(buf, "Connection", 10)) {
		if (u->conn_tokens.len)
			growbuf_puts(&u->conn_tokens, ",");
		growbuf_append(&u->conn_tokens, v, (size_t)(end - v));
		return len;
	}
	if (is_hop_header_n(buf, nlen) ||
	    (nlen == 4 && str_ncaseeq(buf, "Date", 4)))
		return len;
	header_list_add(&u->resp->headers, buf, nlen, v, (size_t)(end - v));
	return len;
}

static size_t on_body(char *buf, size_t size, size_t n, void *p)
{
	upstream *u = p;
	size_t len = size * n;
	if ((int64_t)(u->resp->body.len + len) > u->max_response) {
		u->resp->too_large = true;
		return 0; /* aborts the transfer (and closes the connection) */
	}
	growbuf_append(&u->resp->body, buf, len);
	return len;
}

static int on_watch(CURL *e, curl_socket_t fd, int what, void *p, void *sp)
{
	(void)e;
	(void)sp;
	upstream *u = p;
	int i = 0;
	while (i < u->n_watch && u->wfd[i] != fd)
		i++;
	if (what == CURL_POLL_REMOVE) {
		if (i < u->n_watch) {
			u->n_watch--;
			u->wfd[i] = u->wfd[u->n_watch];
			u->wev[i] = u->wev[u->n_watch];
		}
		return 0;
	}
	if (i == u->n_watch) {
		if (u->n_watch == UPSTREAM_MAX_WATCH)
			return -1; /* fails the transfer */
		u->n_watch++;
		u->wfd[i] = fd;
	}
	u->wev[i] = (what & CURL_POLL_IN ? FIBER_IN : 0) |
		    (what & CURL_POLL_OUT ? FIBER_OUT : 0);
	return 0;
}

static int on_timer(CURLM *m, long timeout_ms, void *p)
{
	(void)m;
	upstream *u = p;
	u->timer_ms = timeout_ms;
	u->timer_at = mono_ms();
	return 0;
}

static void new_multi(upstream *u)
{
	u->m = curl_multi_init();
	ALWAYS_ASSERT(u->m);
	u->n_watch = 0;
	u->timer_ms = -1;
	curl_multi_setopt(u->m, CURLMOPT_SOCKETFUNCTION, on_watch);
	curl_multi_setopt(u->m, CURLMOPT_SOCKETDATA, u);
	curl_multi_setopt(u->m, CURLMOPT_TIMERFUNCTION, on_timer);
	curl_multi_setopt(u->m, CURLMOPT_TIMERDATA, u);
}

upstream *upstream_new(void)
{
	upstream *u = xcalloc(1, sizeof *u);
	CURL *h = curl_easy_init();
	ALWAYS_ASSERT(h);
	u->h = h;
	new_multi(u);
	/* Set once: the handle is reused for every attempt of this worker
	 * (and keeps its keep-alive connections). */
	curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(h, CURLOPT_MAXAGE_CONN, UPSTREAM_MAX_IDLE_S);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	/* Never through a proxy taken from the environment (http_proxy...). */
	curl_easy_setopt(h, CURLOPT_PROXY, "");
	curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, on_prereq);
	curl_easy_setopt(h, CURLOPT_PREREQDATA, u);
	curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_sockopt);
	curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, u);
	curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
	curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, u);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, u);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
	curl_easy_setopt(h, CURLOPT_USERAGENT, NULL);
	return u;
}

/* The list libcurl reads (it never frees or changes it): nodes and text in
 * the handle's own buffers, reused by every request; the lines are joined
 * by hand (a printf per header cost more than the rest of the list). */
static struct curl_slist *build_headers(upstream *u, const upstream_req *req)
{
	static char no_type[] = "Content-Type:", no_expect[] = "Expect:";
	size_t n = req->headers->n + 2;
	if (n > u->cap_nodes) {
		u->cap_nodes = n + 8;
		u->hdr_nodes = xrealloc(u->hdr_nodes,
					u->cap_nodes * sizeof *u->hdr_nodes);
	}
	growbuf *t = &u->hdr_text;
	growbuf_reset(t);
	bool has_ct = false;
	size_t k = 0;
	/* Offsets first: the text buffer may move while it grows. */
	for (size_t i = 0; i < req->headers->n; i++, k++) {
		const http_header *h = &req->headers->v[i];
		if (str_caseeq(h->name, "Content-Type"))
			has_ct = true;
		u->hdr_nodes[k].data = (char *)(uintptr_t)t->len;
		growbuf_puts(t, h->name);
		if (h->value[0]) {
			growbuf_append(t, ": ", 2);
			growbuf_puts(t, h->value);
		} else {
			/* "Name;" is curl's way to send an empty header. */
			growbuf_append(t, ";", 1);
		}
		growbuf_append(t, "", 1); /* the line's NUL */
	}
	for (size_t i = 0; i < k; i++)
		u->hdr_nodes[i].data = t->data + (uintptr_t)u->hdr_nodes[i].data;
	/* Never add a body type the client did not send, nor wait for
	 * 100-continue. */
	if (!has_ct)
		u->hdr_nodes[k++].data = no_type;
	u->hdr_nodes[k++].data = no_expect;
	for (size_t i = 0; i < k; i++)
		u->hdr_nodes[i].next = i + 1 < k ? &u->hdr_nodes[i + 1] : NULL;
	return u->hdr_nodes;
}

static void set_method(CURL *h, const upstream_req *req)
{
	bool has_body = req->body_len > 0 || !strcmp(req->method, "POST") ||
			!strcmp(req->method, "PUT") ||
			!strcmp(req->method, "PATCH");
	/* Back to a plain GET first: the handle keeps the last request's
	 * method settings. */
	curl_easy_setopt(h, CURLOPT_NOBODY, 0L);
	curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
	if (!strcmp(req->method, "HEAD")) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (has_body) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDS,
				 req->body ? req->body : "");
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)req->body_len);
	}
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
}

/* Still attached after a complete response: the connection just used, if
 * it is kept. Bytes already waiting mean its framing was off. */
static void check_framing(upstream *u, CURLcode rc)
{
	curl_socket_t fd = CURL_SOCKET_BAD;
	if (rc == CURLE_OK &&
	    curl_easy_getinfo(u->h, CURLINFO_ACTIVESOCKET, &fd) == CURLE_OK &&
	    fd != CURL_SOCKET_BAD && unread_input(fd, true))
		u->framing_off = true;
}

/* The transfer, on the worker's fiber: libcurl's socket interface, its
 * sockets and timer awaited through the scheduler. */
static CURLcode perform(upstream *u)
{
	if (curl_multi_add_handle(u->m, u->h) != CURLM_OK)
		return CURLE_FAILED_INIT;
	CURLcode rc = CURLE_RECV_ERROR;
	int running = 1;
	bool ok = curl_multi_socket_action(u->m, CURL_SOCKET_TIMEOUT, 0,
					   &running) == CURLM_OK;
	while (ok && running) {
		int n = u->n_watch, fds[UPSTREAM_MAX_WATCH],
		    evs[UPSTREAM_MAX_WATCH], ready[UPSTREAM_MAX_WATCH];
		memcpy(fds, u->wfd, (size_t)n * sizeof *fds);
		memcpy(evs, u->wev, (size_t)n * sizeof *evs);
		/* as curl_multi_poll: never past libcurl's timer, and never
		 * more than a second without asking it */
		double deadline = mono_ms() + 1000.0;
		if (u->timer_ms >= 0 && u->timer_at + (double)u->timer_ms <
						deadline)
			deadline = u->timer_at + (double)u->timer_ms;
		int got = u->timer_ms == 0 ? 0
					    : fiber_wait_fds(n, fds, evs, ready,
							     deadline);
		if (!got) {
			u->timer_ms = -1;
			ok = curl_multi_socket_action(u->m, CURL_SOCKET_TIMEOUT,
						      0, &running) == CURLM_OK;
			continue;
		}
		for (int i = 0; ok && i < n; i++) {
			if (!ready[i])
				continue;
			int ev = (ready[i] & FIBER_IN ? CURL_CSELECT_IN : 0) |
				 (ready[i] & FIBER_OUT ? CURL_CSELECT_OUT : 0);
			ok = curl_multi_socket_action(u->m, fds[i], ev,
						      &running) == CURLM_OK;
		}
	}
	int left;
	CURLMsg *m = curl_multi_info_read(u->m, &left);
	if (m && m->msg == CURLMSG_DONE)
		rc = m->data.result;
	check_framing(u, rc);
	curl_multi_remove_handle(u->m, u->h);
	return rc;
}

/* libcurl has no call to close one kept-alive connection: a new multi
 * handle closes them all (each worker has a handful at most). */
static void drop_connections(upstream *u)
{
	curl_multi_cleanup(u->m);
	new_multi(u);
}

/* What is left of the call's time for a round; false when none is. The
 * connect timeout is the usual one, or what is left if less. */
static bool set_round_timeouts(upstream *u)
{
	double left = u->end_ms - mono_ms();
	if (left < 1)
		return false;
	long total = (long)left;
	long connect_ms = UPSTREAM_CONNECT_TIMEOUT_MS;
	curl_easy_setopt(u->h, CURLOPT_TIMEOUT_MS, total);
	curl_easy_setopt(u->h, CURLOPT_CONNECTTIMEOUT_MS,
			 total < connect_ms ? total : connect_ms);
	return true;
}

/* Sends the request; when libcurl picked a connection with unread input,
 * nothing was written: that connection is closed and the request goes once
 * more, on a fresh one, within what is left of the call's time. */
static CURLcode perform_attempt(upstream *u, const upstream_req *req)
{
	CURLcode rc = CURLE_OK;
	for (int round = 0; round < 2; round++) {
		if (!set_round_timeouts(u)) {
			rc = CURLE_OPERATION_TIMEDOUT;
			break;
		}
		u->stale = u->framing_off = false;
		header_list_free(&u->resp->headers);
		growbuf_reset(&u->resp->body);
		growbuf_reset(&u->conn_tokens);
		u->headers_done = false;
		rc = perform(u);
		if (u->stale || u->framing_off) {
			metrics_event("upstream_connection_desync");
			log_warn(u->stale ? "upstream connection had unread "
					    "input before a request; closed it"
					  : "upstream sent more than its "
					    "response; closed the connection",
				 "upstream=%s%s", req->base,
				 u->stale && round == 0
					 ? " retry=fresh_connection"
					 : "");
			drop_connections(u);
		}
		if (!u->stale || u->sends > 0)
			break;
	}
	return rc;
}

/* Why a call got no response, into out->error. */
static void describe_failure(const upstream *u, CURLcode rc,
			     upstream_resp *out)
{
	if (u->late)
		snprintf(out->error, sizeof out->error,
			 "the call's time ran out before the request "
			 "was written; not sent");
	else if (u->resend_refused)
		snprintf(out->error, sizeof out->error,
			 "connection lost after the request was sent; "
			 "not resending");
	else if (u->stale)
		snprintf(out->error, sizeof out->error,
			 "the upstream sent bytes before the request "
			 "was written; not sent");
	else
		snprintf(out->error, sizeof out->error, "%s",
			 curl_easy_strerror(rc));
}

void upstream_send(upstream *u, const upstream_req *req, upstream_resp *out)
{
	memset(out, 0, sizeof *out);
	CURL *h = u->h;
	u->sends = 0;
	u->resend_refused = false;
	u->late = false;
	u->resp = out;
	u->max_response = req->max_response;

	growbuf *url = &u->url;
	growbuf_reset(url);
	growbuf_puts(url, req->base);
	growbuf_puts(url, req->target);
	struct curl_slist *hdrs = build_headers(u, req);

	curl_easy_setopt(h, CURLOPT_URL, url->data);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	set_method(h, req);

	double t0 = mono_ms();
	u->end_ms = t0 + (double)req->timeout_ms;
	if (req->deadline_ms > 0 && req->deadline_ms < u->end_ms)
		u->end_ms = req->deadline_ms;
	CURLcode rc = perform_attempt(u, req);
	out->ms = mono_ms() - t0;

	long status = 0;
	if (rc == CURLE_OK || out->too_large) {
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		out->status = (int)status;
	}
	if (rc == CURLE_OK) {
		out->outcome = UP_RESPONSE;
	} else if (out->too_large && status >= 200) {
		/* The status is known, only the body is not held. */
		out->outcome = UP_RESPONSE;
		growbuf_free(&out->body);
		snprintf(out->error, sizeof out->error,
			 "response larger than %lld bytes",
			 (long long)req->max_response);
	} else {
		out->outcome = u->sends == 0 ? UP_NOT_SENT : UP_UNKNOWN;
		describe_failure(u, rc, out);
	}
	/* Nothing of this request may outlive it in the reused handle. */
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
	u->resp = NULL;
}

void upstream_resp_free(upstream_resp *r)
{
	header_list_free(&r->headers);
	growbuf_free(&r->body);
}
