/* RFC 9457 problem+json bodies for the errors the proxy makes itself.
 *
 * Bodies go through jansson rather than printf so that a detail or request
 * id that carries quotes, newlines or control bytes (some come from the
 * client) can never break the JSON. */
#include "problem.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define PROBLEM_TYPE_PREFIX "urn:idemproxy:problem:"

struct problem_def {
	const char *code;
	const char *title;
};

static const struct problem_def problems[] = {
	{ "idempotency_key_missing", "Idempotency-Key header missing" },
	{ "idempotency_key_invalid", "Idempotency-Key header invalid" },
	{ "tenant_missing", "Tenant missing" },
	{ "bad_request", "Bad request" },
	{ "credentials_missing", "Credentials missing" },
	{ "route_not_found", "No route for this path" },
	{ "idempotency_key_in_use",
	  "A request with this Idempotency-Key is still in progress" },
	{ "idempotency_key_mismatch",
	  "Idempotency-Key reused with a different request" },
	{ "idempotency_key_expired",
	  "Idempotency-Key expired: the request was completed" },
	{ "idempotency_response_not_replayable",
	  "The response for this Idempotency-Key cannot be replayed" },
	{ "request_too_large", "Request too large" },
	{ "upstream_unavailable", "Upstream unavailable" },
	{ "idempotency_store_unavailable", "Idempotency store unavailable" },
	{ "idempotency_lease_expired",
	  "Idempotency-Key lease too short to send the request" },
	{ "idempotency_outcome_unrecorded",
	  "Upstream answer could not be recorded" },
	{ "overloaded", "Proxy overloaded" },
	{ "shutting_down", "Proxy shutting down" },
	{ "request_timeout", "Request not received in time" },
	{ "upstream_outcome_unknown", "Upstream outcome unknown" },
	{ "admin_unauthorized", "Unauthorized" },
	{ "attempt_in_flight",
	  "The attempt holding this key is still in flight" },
	{ "not_found", "Not found" },
	{ "method_not_allowed", "Method not allowed" },
	{ "internal_error", "Internal error" },
};

#define GENERIC_TITLE "Error"

const char *problem_title(const char *code)
{
	if (code == NULL)
		return GENERIC_TITLE;
	for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++)
		if (strcmp(problems[i].code, code) == 0)
			return problems[i].title;
	return GENERIC_TITLE;
}

/* jansson refuses strings that are not UTF-8; a client-supplied value may
 * not be, so fall back to replacing every non-ASCII byte with '?'. */
static json_t *safe_string(const char *s)
{
	json_t *j = json_string(s);

	if (j != NULL)
		return j;
	char *copy = xstrdup(s);
	for (char *p = copy; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	j = json_string(copy);
	free(copy);
	ALWAYS_ASSERT(j != NULL);
	return j;
}

static void set_str(json_t *obj, const char *key, const char *value)
{
	ALWAYS_ASSERT(json_object_set_new(obj, key, safe_string(value)) == 0);
}

static int append_cb(const char *data, size_t size, void *arg)
{
	growbuf_append(arg, data, size);
	return 0;
}

static void set_ext(json_t *obj, const problem_ext *ext)
{
	if (ext == NULL)
		return;
	if (ext->operation_state != NULL)
		set_str(obj, "operation_state", ext->operation_state);
	if (ext->client_action != NULL)
		set_str(obj, "client_action", ext->client_action);
	if (ext->original_status > 0)
		ALWAYS_ASSERT(json_object_set_new(
				      obj, "original_status",
				      json_integer(ext->original_status)) == 0);
}

void problem_render(growbuf *out, int status, const char *code,
		    const char *detail, const char *request_id)
{
	problem_render_ext(out, status, code, detail, request_id, NULL);
}

void problem_render_ext(growbuf *out, int status, const char *code,
			const char *detail, const char *request_id,
			const problem_ext *ext)
{
	const char *c = code ? code : "internal_error";
	const char *title = problem_title(c);
	growbuf type = { 0 };
	json_t *obj = json_object();

	ALWAYS_ASSERT(obj != NULL);
	growbuf_puts(&type, PROBLEM_TYPE_PREFIX);
	growbuf_puts(&type, c);
	set_str(obj, "type", type.data);
	set_str(obj, "title", title);
	ALWAYS_ASSERT(json_object_set_new(obj, "status", json_integer(status)) == 0);
	set_str(obj, "detail", detail ? detail : title);
	set_str(obj, "code", c);
	if (request_id != NULL)
		set_str(obj, "request_id", request_id);
	set_ext(obj, ext);
	ALWAYS_ASSERT(json_dump_callback(obj, append_cb, out, JSON_COMPACT |
					 JSON_PRESERVE_ORDER) == 0);
	json_decref(obj);
	growbuf_free(&type);
}
