#include "upstream.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "busy.h"

/* Idle upstream connections older than this are not reused: it must stay
 * below the upstream's own keep-alive timeout, or a request can be written to
 * a connection the upstream is closing (which then looks like an unknown
 * outcome, since we never resend). */
#define UPSTREAM_MAX_IDLE_S 2L
#define UPSTREAM_CONNECT_TIMEOUT_MS 3000L

struct upstream {
	CURL *h;
	CURLM *m; /* owns the kept-alive connections */
	/* per transfer */
	int prereq_calls;
	upstream_resp *resp;
	int64_t max_response;
	bool too_large;
};

int upstream_global_init(void)
{
	return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void upstream_free(upstream *u)
{
	if (!u)
		return;
	curl_multi_cleanup(u->m);
	curl_easy_cleanup(u->h);
	free(u);
}

static const char *const hop_headers[] = {
	"Connection",	    "Keep-Alive", "Proxy-Connection", "TE",
	"Trailer",	    "Transfer-Encoding", "Upgrade", "Content-Length",
	"Proxy-Authenticate", "Proxy-Authorization",
};

bool upstream_is_hop_header(const char *name)
{
	for (size_t i = 0; i < sizeof hop_headers / sizeof hop_headers[0]; i++)
		if (ip_strcaseeq(name, hop_headers[i]))
			return true;
	return false;
}

/* Called before the request is written on a connection. A second call in one
 * transfer is libcurl retrying the request on a fresh connection after a
 * reused one died: the first copy may have been processed, so refuse. */
static int on_prereq(void *p, char *ip, char *lip, int port, int lport)
{
	upstream *u = p;
	return ++u->prereq_calls > 1 ? CURL_PREREQFUNC_ABORT
				     : CURL_PREREQFUNC_OK;
}

static size_t on_header(char *buf, size_t size, size_t n, void *p)
{
	upstream *u = p;
	size_t len = size * n;
	if (len >= 5 && !memcmp(buf, "HTTP/", 5)) {
		/* A new response (after 100 Continue, say): start over. */
		header_list_free(&u->resp->headers);
		return len;
	}
	const char *colon = memchr(buf, ':', len);
	if (!colon)
		return len; /* the blank line, or garbage */
	size_t nlen = (size_t)(colon - buf);
	const char *v = colon + 1, *end = buf + len;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' ||
			   end[-1] == ' ' || end[-1] == '\t'))
		end--;
	char name[128];
	if (nlen == 0 || nlen >= sizeof name)
		return len;
	memcpy(name, buf, nlen);
	name[nlen] = '\0';
	if (upstream_is_hop_header(name) || ip_strcaseeq(name, "Date"))
		return len;
	header_list_add(&u->resp->headers, buf, nlen, v, (size_t)(end - v));
	return len;
}

static size_t on_body(char *buf, size_t size, size_t n, void *p)
{
	upstream *u = p;
	size_t len = size * n;
	if ((int64_t)(u->resp->body.len + len) > u->max_response) {
		u->too_large = true;
		return 0; /* aborts the transfer */
	}
	ip_buf_append(&u->resp->body, buf, len);
	return len;
}

upstream *upstream_new(void)
{
	upstream *u = xcalloc(1, sizeof *u);
	CURL *h = curl_easy_init();
	IP_ASSERT(h);
	u->h = h;
	u->m = curl_multi_init();
	IP_ASSERT(u->m);
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
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, u);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
	curl_easy_setopt(h, CURLOPT_USERAGENT, NULL);
	return u;
}

static struct curl_slist *build_headers(const upstream_req *req)
{
	struct curl_slist *l = NULL;
	ip_buf line = {0};
	bool has_ct = false;
	for (size_t i = 0; i < req->headers->n; i++) {
		const http_header *h = &req->headers->v[i];
		if (ip_strcaseeq(h->name, "Content-Type"))
			has_ct = true;
		ip_buf_reset(&line);
		ip_buf_printf(&line, "%s: %s", h->name, h->value);
		if (!h->value[0]) {
			/* "Name;" is curl's way to send an empty header. */
			ip_buf_reset(&line);
			ip_buf_printf(&line, "%s;", h->name);
		}
		l = curl_slist_append(l, line.data);
	}
	/* Never add a body type the client did not send, nor wait for
	 * 100-continue. */
	if (!has_ct)
		l = curl_slist_append(l, "Content-Type:");
	l = curl_slist_append(l, "Expect:");
	ip_buf_free(&line);
	return l;
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

/* curl_easy_perform, on the handle's own multi: with busy polling (busy.h)
 * the exchange is driven without sleeping until the budget is spent, then
 * by waiting in curl_multi_poll, which never waits past curl's own timers
 * (so the timeouts hold either way). */
static CURLcode perform(upstream *u)
{
	if (curl_multi_add_handle(u->m, u->h) != CURLM_OK)
		return CURLE_FAILED_INIT;
	double deadline, t0 = ip_now_ms();
	bool spin = busy_spin(&deadline);
	CURLcode rc = CURLE_RECV_ERROR;
	for (;;) {
		int running = 0;
		if (curl_multi_perform(u->m, &running) != CURLM_OK)
			break;
		if (!running) {
			int left;
			CURLMsg *m = curl_multi_info_read(u->m, &left);
			if (m && m->msg == CURLMSG_DONE)
				rc = m->data.result;
			break;
		}
		if (spin && ip_now_ms() < deadline) {
			busy_relax();
			continue;
		}
		if (curl_multi_poll(u->m, NULL, 0, 1000, NULL) != CURLM_OK)
			break;
	}
	if (spin)
		busy_account(t0, deadline);
	curl_multi_remove_handle(u->m, u->h);
	return rc;
}

void upstream_send(upstream *u, const upstream_req *req, upstream_resp *out)
{
	memset(out, 0, sizeof *out);
	CURL *h = u->h;
	u->prereq_calls = 0;
	u->resp = out;
	u->max_response = req->max_response;
	u->too_large = false;

	ip_buf url = {0};
	ip_buf_puts(&url, req->base);
	ip_buf_puts(&url, req->target);
	struct curl_slist *hdrs = build_headers(req);
	long connect_ms = UPSTREAM_CONNECT_TIMEOUT_MS;
	if (req->timeout_ms < connect_ms)
		connect_ms = (long)req->timeout_ms;

	curl_easy_setopt(h, CURLOPT_URL, url.data);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)req->timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
	set_method(h, req);

	double t0 = ip_now_ms();
	CURLcode rc = perform(u);
	out->ms = ip_now_ms() - t0;

	if (rc == CURLE_OK) {
		long status = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		out->outcome = UP_RESPONSE;
		out->status = (int)status;
	} else {
		out->outcome = u->prereq_calls == 0 ? UP_NOT_SENT : UP_UNKNOWN;
		if (u->prereq_calls > 1)
			snprintf(out->error, sizeof out->error,
				 "connection lost after the request was sent; "
				 "not resending");
		else if (u->too_large)
			snprintf(out->error, sizeof out->error,
				 "response larger than %lld bytes",
				 (long long)req->max_response);
		else
			snprintf(out->error, sizeof out->error, "%s",
				 curl_easy_strerror(rc));
	}
	/* Nothing of this request may outlive it in the reused handle. */
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
	curl_slist_free_all(hdrs);
	ip_buf_free(&url);
	u->resp = NULL;
}

void upstream_resp_free(upstream_resp *r)
{
	header_list_free(&r->headers);
	ip_buf_free(&r->body);
}
