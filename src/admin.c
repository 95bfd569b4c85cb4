#include "admin.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "http_front.h"
#include "metrics.h"
#include "problem.h"

struct admin {
	struct MHD_Daemon *d;
	admin_opts o;
};

static enum MHD_Result reply(struct MHD_Connection *conn, int status,
			     const char *type, ip_buf *body)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		body->len, body->data, MHD_RESPMEM_MUST_FREE);
	body->data = NULL;
	body->len = body->cap = 0;
	MHD_add_response_header(r, "Content-Type", type);
	MHD_add_response_header(r, "Cache-Control", "no-store");
	enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result problem(struct MHD_Connection *conn, int status,
			       const char *code, const char *detail)
{
	ip_buf b = {0};
	problem_render(&b, status, code, detail, NULL);
	return reply(conn, status, PROBLEM_CONTENT_TYPE, &b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **ctxp)
{
	admin *a = cls;
	static int first_call_marker;
	if (*ctxp == NULL) {
		*ctxp = &first_call_marker;
		return MHD_YES;
	}
	if (*upload_size) {
		*upload_size = 0; /* no admin endpoint takes a body */
		return MHD_YES;
	}
	bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
	ip_buf b = {0};
	if (!strcmp(url, "/healthz")) {
		if (!get)
			return problem(conn, 405, "method_not_allowed",
				       "use GET");
		ip_buf_puts(&b, "ok\n");
		return reply(conn, 200, "text/plain", &b);
	}
	if (!strcmp(url, "/readyz")) {
		if (!get)
			return problem(conn, 405, "method_not_allowed",
				       "use GET");
		char err[256];
		if (a->o.ready(a->o.arg, err, sizeof err) == 0) {
			ip_buf_puts(&b, "ready\n");
			return reply(conn, 200, "text/plain", &b);
		}
		ip_buf_printf(&b, "not ready: %s\n", err);
		return reply(conn, 503, "text/plain", &b);
	}
	if (!strcmp(url, "/metrics")) {
		if (!get)
			return problem(conn, 405, "method_not_allowed",
				       "use GET");
		metrics_render(&b);
		return reply(conn, 200, "text/plain; version=0.0.4", &b);
	}
	return problem(conn, 404, "not_found", "no such admin endpoint");
}

admin *admin_start(const admin_opts *o, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	bool v6;
	if (http_parse_listen(o->listen, &ss, &v6, err, errlen))
		return NULL;
	admin *a = xcalloc(1, sizeof *a);
	a->o = *o;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
			 MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	a->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, a,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
				MHD_OPTION_END);
	if (!a->d) {
		snprintf(err, errlen, "cannot listen on %s (in use?)",
			 o->listen);
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
	free(a);
}
