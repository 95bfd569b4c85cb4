#include "job.h"

#include <stdlib.h>
#include <string.h>

job *job_new(config *cfg)
{
	job *j = xcalloc(1, sizeof *j);
	j->cfg = config_ref(cfg);
	j->t_start_ms = mono_ms();
	j->client_fd = -1;
	j->wait_applied_s = -1;
	return j;
}

void job_free(job *j)
{
	if (!j)
		return;
	config_unref(j->cfg);
	free(j->method);
	free(j->target);
	free(j->version);
	header_list_free(&j->req_headers);
	growbuf_free(&j->body);
	header_list_free(&j->resp_headers);
	growbuf_free(&j->resp_body);
	free(j->tenant);
	free(j->key);
	free(j->plan);
	free(j);
}

const char *job_trace_id(const job *j)
{
	return j->trace_id[0] ? j->trace_id : "-";
}
