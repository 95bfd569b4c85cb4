/* Answers the proxy gives itself, and the one account of each request. */
#include "reply.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "problem.h"

void reply_problem(job *j, int status, const char *code, const char *detail,
		   int64_t retry_after_s)
{
	reply_problem_ext(j, status, code, detail, retry_after_s, NULL);
}

void reply_problem_ext(job *j, int status, const char *code, const char *detail,
		       int64_t retry_after_s, const problem_ext *ext)
{
	j->status = status;
	header_list_free(&j->resp_headers);
	growbuf_reset(&j->resp_body);
	problem_render_ext(&j->resp_body, status, code, detail, j->request_id,
			   ext);
	header_list_add(&j->resp_headers, "Content-Type", 12,
			PROBLEM_CONTENT_TYPE, strlen(PROBLEM_CONTENT_TYPE));
	if (retry_after_s > 0) {
		char v[24];
		int n = snprintf(v, sizeof v, "%lld", (long long)retry_after_s);
		header_list_add(&j->resp_headers, "Retry-After", 11, v,
				(size_t)n);
	}
}

void reply_account(job *j)
{
	double total = mono_ms() - j->t_start_ms;
	metrics_request(j->route_name, j->outcome ? j->outcome : "rejected");
	metrics_observe_request_ms(total);
	char path[512];
	size_t n = j->path_len < sizeof path - 1 ? j->path_len
						 : sizeof path - 1;
	memcpy(path, j->target ? j->target : "", j->target ? n : 0);
	path[j->target ? n : 0] = '\0';
	log_request r = {
		.request_id = j->request_id,
		.route = j->route_name,
		.method = j->method,
		.path = path,
		.tenant = j->tenant,
		.key = j->key,
		.outcome = j->outcome,
		.status = j->status,
		.attempt = j->attempt,
		.upstream_ms = j->upstream_ms,
		.store_ms = j->store_ms,
		.total_ms = total,
	};
	log_request_line(&r);
}
