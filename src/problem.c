/* RFC 9457 problem+json bodies for the errors the proxy makes itself.
 *
 * Bodies go through jansson rather than printf so that a detail or request
 * id that carries quotes, newlines or control bytes (some come from the
 * client) can never break the JSON. */
#include "problem.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NE PROBLEM_NOT_EXECUTED
#define IP PROBLEM_IN_PROGRESS
#define UN PROBLEM_UNKNOWN
#define CO PROBLEM_COMPLETED
#define SAME PROBLEM_RETRY_SAME_KEY
#define NEW PROBLEM_RETRY_NEW_KEY
#define FIX PROBLEM_FIX_REQUEST
#define STOP PROBLEM_DO_NOT_RETRY

/* Every code the proxy gives, with what it states by default; a call site
 * that knows more (a held key, a waiting duplicate, on_unknown) passes its
 * own facts. doc/problems.md documents each row, and test_problem_registry
 * checks that the two and the call sites agree. */
struct problem_def {
	const char *code;
	const char *title;
	enum problem_state state;
	enum problem_action action;
};

static const struct problem_def problems[] = {
	{ "idempotency_key_missing", "Idempotency-Key header missing", NE, FIX },
	{ "idempotency_key_invalid", "Idempotency-Key header invalid", NE, FIX },
	{ "tenant_missing", "Tenant missing", NE, FIX },
	{ "bad_request", "Bad request", NE, FIX },
	{ "credentials_missing", "Credentials missing", NE, FIX },
	{ "credentials_invalid", "Credentials invalid", NE, FIX },
	{ "route_not_found", "No route for this path", NE, FIX },
	{ "idempotency_key_in_use",
	  "A request with this Idempotency-Key is still in progress", IP,
	  SAME },
	{ "idempotency_key_mismatch",
	  "Idempotency-Key reused with a different request", NE, NEW },
	{ "idempotency_key_expired",
	  "Idempotency-Key expired: the request was completed", CO, STOP },
	{ "idempotency_response_not_replayable",
	  "The response for this Idempotency-Key cannot be replayed", CO,
	  STOP },
	{ "idempotency_record_unreadable",
	  "The response stored for this Idempotency-Key cannot be read", CO,
	  STOP },
	{ "request_too_large", "Request too large", NE, FIX },
	{ "upstream_unavailable", "Upstream unavailable", NE, SAME },
	{ "upstream_response_too_large", "Upstream response too large", CO,
	  STOP },
	{ "idempotency_store_unavailable", "Idempotency store unavailable", NE,
	  SAME },
	{ "idempotency_lease_expired",
	  "Idempotency-Key lease too short to send the request", NE, SAME },
	{ "idempotency_outcome_unrecorded",
	  "Upstream answer could not be recorded", CO, STOP },
	{ "overloaded", "Proxy overloaded", NE, SAME },
	{ "shutting_down", "Proxy shutting down", NE, SAME },
	{ "request_timeout", "Request not received in time", NE, SAME },
	{ "upstream_outcome_unknown", "Upstream outcome unknown", UN, STOP },
	{ "admin_unauthorized", "Unauthorized", NE, FIX },
	{ "attempt_in_flight",
	  "The attempt holding this key is still in flight", NE, SAME },
	{ "not_found", "Not found", NE, FIX },
	{ "method_not_allowed", "Method not allowed", NE, FIX },
	/* Only for a call that names no code (none does). */
	{ "internal_error", "Internal error", UN, STOP },
	{ "idempotency_operation_completed",
	  "The operation for this Idempotency-Key was completed", CO, STOP },
	/* The admin listener's own: the state is the admin action's. */
	{ "invalid_parameter", "Invalid query parameter", NE, FIX },
	{ "resolve_invalid", "Invalid resolve request", NE, FIX },
	{ "resolve_header_invalid", "Invalid response header", NE, FIX },
	{ "resolve_header_hop_by_hop", "Hop-by-hop response header", NE, FIX },
	{ "resolve_attempt_stale",
	  "The record is no longer at the attempt given", NE, FIX },
	{ "resolve_not_pending", "The record has no outcome to settle", NE,
	  STOP },
	{ "resolve_route_unknown", "No route for this operation", NE, FIX },
};

#define GENERIC_TITLE "Error"

static const struct problem_def *find(const char *code)
{
	if (code == NULL)
		return NULL;
	for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++)
		if (strcmp(problems[i].code, code) == 0)
			return &problems[i];
	return NULL;
}

const char *problem_title(const char *code)
{
	const struct problem_def *d = find(code);
	return d ? d->title : GENERIC_TITLE;
}

const char *problem_state_name(enum problem_state s)
{
	switch (s) {
	case PROBLEM_NOT_EXECUTED:
		return "not_executed";
	case PROBLEM_IN_PROGRESS:
		return "in_progress";
	case PROBLEM_COMPLETED:
		return "completed";
	case PROBLEM_UNKNOWN:
	case PROBLEM_STATE_OF_CODE:
		break;
	}
	return "unknown";
}

const char *problem_action_name(enum problem_action a)
{
	switch (a) {
	case PROBLEM_RETRY_SAME_KEY:
		return "retry_same_key";
	case PROBLEM_RETRY_NEW_KEY:
		return "retry_new_key";
	case PROBLEM_FIX_REQUEST:
		return "fix_request";
	case PROBLEM_DO_NOT_RETRY:
	case PROBLEM_ACTION_OF_CODE:
		break;
	}
	return "do_not_retry";
}

problem_facts problem_facts_of(const char *code, problem_facts f)
{
	const struct problem_def *d = find(code);
	if (f.state == PROBLEM_STATE_OF_CODE)
		f.state = d ? d->state : PROBLEM_UNKNOWN;
	if (f.action == PROBLEM_ACTION_OF_CODE)
		f.action = d ? d->action : PROBLEM_DO_NOT_RETRY;
	return f;
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

void problem_render(growbuf *out, const problem_links *links, int status,
		    const char *code, const char *detail,
		    const char *request_id, problem_facts f)
{
	const char *c = code ? code : "internal_error";
	const char *title = problem_title(c);
	const char *base = links && links->type_base ? links->type_base
						     : PROBLEM_TYPE_BASE_DEFAULT;
	problem_facts facts = problem_facts_of(c, f);
	growbuf type = { 0 };
	json_t *obj = json_object();

	ALWAYS_ASSERT(obj != NULL);
	growbuf_puts(&type, base);
	growbuf_puts(&type, c);
	set_str(obj, "type", type.data);
	set_str(obj, "title", title);
	ALWAYS_ASSERT(json_object_set_new(obj, "status", json_integer(status)) == 0);
	set_str(obj, "detail", detail ? detail : title);
	set_str(obj, "code", c);
	set_str(obj, "operation_state", problem_state_name(facts.state));
	set_str(obj, "client_action", problem_action_name(facts.action));
	if (request_id != NULL)
		set_str(obj, "request_id", request_id);
	if (facts.original_status > 0)
		ALWAYS_ASSERT(json_object_set_new(
				      obj, "original_status",
				      json_integer(facts.original_status)) == 0);
	ALWAYS_ASSERT(json_dump_callback(obj, append_cb, out, JSON_COMPACT |
					 JSON_PRESERVE_ORDER) == 0);
	json_decref(obj);
	growbuf_free(&type);
}

bool problem_link_header(const problem_links *links, growbuf *out)
{
	if (!links || !links->doc_url || !*links->doc_url)
		return false;
	growbuf_printf(out, "<%s>; rel=\"describedby\"", links->doc_url);
	return true;
}

/* RFC 3986: unreserved, gen-delims and sub-delims; '%' is checked apart. */
static bool uri_char(unsigned char c)
{
	return isalnum(c) || (c && strchr("-._~:/?#[]@!$&'()*+,;=", c));
}

bool problem_uri_ok(const char *s, char *why, size_t whylen)
{
	size_t i = 0;
	while (isalpha((unsigned char)s[i]) ||
	       (i > 0 && (isdigit((unsigned char)s[i]) || s[i] == '+' ||
			  s[i] == '-' || s[i] == '.')))
		i++;
	if (i == 0 || s[i] != ':') {
		snprintf(why, whylen,
			 "must be an absolute URI beginning with a scheme "
			 "(\"https:\", \"urn:\")");
		return false;
	}
	for (; s[i]; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '%' && isxdigit((unsigned char)s[i + 1]) &&
		    isxdigit((unsigned char)s[i + 2]))
			continue;
		if (c != '%' && uri_char(c))
			continue;
		snprintf(why, whylen,
			 "byte %zu (0x%02x) may not appear in a URI: no space, "
			 "quote, angle bracket, backslash or control byte, "
			 "and '%%' only before two hex digits",
			 i + 1, c);
		return false;
	}
	return true;
}
