/* Answers the proxy gives itself, and the one account of each request. */
#include "reply.h"

#include <stdio.h>
#include <string.h>

#include "contract.h"
#include "log.h"
#include "metrics.h"
#include "problem.h"

void reply_problem(job *j, int status, const char *code, const char *detail,
		   int64_t retry_after_s)
{
	reply_problem_state(j, status, code, detail, retry_after_s,
			    (problem_facts){0});
}

void reply_problem_state(job *j, int status, const char *code,
			 const char *detail, int64_t retry_after_s,
			 problem_facts f)
{
	problem_links links = {j->cfg->problem_type_base,
			       j->cfg->problem_doc_url};
	j->status = status;
	header_list_free(&j->resp_headers);
	growbuf_reset(&j->resp_body);
	problem_render(&j->resp_body, &links, status, code, detail,
		       j->request_id, f);
	header_list_add(&j->resp_headers, "Content-Type", 12,
			PROBLEM_CONTENT_TYPE, strlen(PROBLEM_CONTENT_TYPE));
	if (retry_after_s > 0) {
		char v[24];
		int n = snprintf(v, sizeof v, "%lld", (long long)retry_after_s);
		header_list_add(&j->resp_headers, "Retry-After", 11, v,
				(size_t)n);
	}
	growbuf link = {0};
	if (problem_link_header(&links, &link))
		header_list_add(&j->resp_headers, "Link", 4, link.data,
				link.len);
	growbuf_free(&link);
}

void reply_contract(job *j)
{
	if (strcmp(j->method, "GET") && strcmp(j->method, "HEAD")) {
		j->outcome = "rejected";
		reply_problem(j, 405, "method_not_allowed", "use GET", 0);
		header_list_add(&j->resp_headers, "Allow", 5, "GET, HEAD", 9);
		return;
	}
	j->status = 200;
	header_list_free(&j->resp_headers);
	growbuf_free(&j->resp_body);
	j->resp_body.data =
		contract_document(j->cfg, CONTRACT_OPENAPI, &j->resp_body.len);
	j->resp_body.cap = j->resp_body.len + 1;
	header_list_add(&j->resp_headers, "Content-Type", 12,
			CONTRACT_MEDIA_TYPE, strlen(CONTRACT_MEDIA_TYPE));
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
		.trace_id = j->trace_id[0] ? j->trace_id : NULL,
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
