/* The idempotency contract of a conf (contract.h): an OpenAPI 3.1 document
 * of the protected routes, and the same rules as plain JSON.
 *
 * Everything an operator merges into an API's own document is named with
 * the prefix "idemproxy_" (operationIds, components), so that a merge
 * cannot collide with the API's own names, and the names depend on the
 * route's name and method only, so that they stay stable across
 * releases and reloads. */
#include "contract.h"

#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "key_header.h"
#include "problem.h"
#include "version.h"

#define PFX "idemproxy_"
#define REF_SCHEMAS "#/components/schemas/"
#define REF_HEADERS "#/components/headers/"
#define REST_PARAM PFX "rest"

/* When a route can give a problem. */
enum cp_when {
	CP_ALWAYS,
	CP_KEY_REQUIRED, /* key = "required" */
	CP_TENANT_HEADER,
	CP_CREDENTIALS, /* tenant from Authorization or a JWT */
	CP_JWT,
	CP_RETAINED, /* retain_key beyond ttl: tombstones */
};

/* Every problem a request of a route can get, from the front end
 * (http_front.c), the plan (decide.c) and the request flow (proxy.c).
 * status 0: the route's mismatch_status. The integration test
 * test_contract.py checks this table against the codes those files pass
 * to reply_problem, reject, answer_now and problem_render. */
static const struct contract_problem {
	int status;
	const char *code;
	enum cp_when when;
} contract_problems[] = {
	{400, "bad_request", CP_ALWAYS},
	{400, "idempotency_key_missing", CP_KEY_REQUIRED},
	{400, "idempotency_key_invalid", CP_ALWAYS},
	{400, "tenant_missing", CP_TENANT_HEADER},
	{401, "credentials_missing", CP_CREDENTIALS},
	{401, "credentials_invalid", CP_JWT},
	{401, "tenant_missing", CP_JWT},
	{408, "request_timeout", CP_ALWAYS},
	{409, "idempotency_key_in_use", CP_ALWAYS},
	{409, "idempotency_response_not_replayable", CP_ALWAYS},
	{410, "idempotency_key_expired", CP_RETAINED},
	{422, "idempotency_operation_completed", CP_ALWAYS},
	{0, "idempotency_key_mismatch", CP_ALWAYS},
	{413, "request_too_large", CP_ALWAYS},
	{431, "request_too_large", CP_ALWAYS},
	{500, "idempotency_record_unreadable", CP_ALWAYS},
	{502, "upstream_unavailable", CP_ALWAYS},
	{502, "upstream_response_too_large", CP_ALWAYS},
	{503, "idempotency_store_unavailable", CP_ALWAYS},
	{503, "idempotency_lease_expired", CP_ALWAYS},
	{503, "idempotency_outcome_unrecorded", CP_ALWAYS},
	{503, "overloaded", CP_ALWAYS},
	{503, "shutting_down", CP_ALWAYS},
	{504, "upstream_outcome_unknown", CP_ALWAYS},
};

#define N_PROBLEMS (sizeof contract_problems / sizeof contract_problems[0])

static bool cp_applies(const route_cfg *r, enum cp_when w)
{
	switch (w) {
	case CP_ALWAYS:
		return true;
	case CP_KEY_REQUIRED:
		return r->key_required;
	case CP_TENANT_HEADER:
		return r->tenant_kind == TENANT_HEADER;
	case CP_CREDENTIALS:
		return r->tenant_kind == TENANT_AUTHORIZATION ||
		       r->tenant_kind == TENANT_JWT;
	case CP_JWT:
		return r->tenant_kind == TENANT_JWT;
	case CP_RETAINED:
		return r->retain_key_ms > r->ttl_ms;
	}
	return false;
}

static int cp_status(const route_cfg *r, const struct contract_problem *p)
{
	return p->status ? p->status : r->mismatch_status;
}

/* ---- small builders -------------------------------------------------- */

static void put(json_t *o, const char *k, json_t *v)
{
	ALWAYS_ASSERT(v != NULL && json_object_set_new(o, k, v) == 0);
}

static void add(json_t *a, json_t *v)
{
	ALWAYS_ASSERT(v != NULL && json_array_append_new(a, v) == 0);
}

static json_t *ref(const char *base, const char *name)
{
	char s[160];
	snprintf(s, sizeof s, "%s%s", base, name);
	return json_pack("{s:s}", "$ref", s);
}

static json_t *strings(const str_list *l)
{
	json_t *a = json_array();
	for (size_t i = 0; i < l->n; i++)
		add(a, json_string(l->v[i]));
	return a;
}

static json_t *pointers(jsonptr *const *ps, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		add(a, json_string(ps[i]->text));
	return a;
}

/* ---- the rules of a route (x-idempotency) ---------------------------- */

static json_t *tenant_rule(const route_cfg *r)
{
	switch (r->tenant_kind) {
	case TENANT_STATIC:
		return json_pack("{s:s,s:s}", "source", "static", "name",
				 r->tenant_arg);
	case TENANT_HEADER:
		return json_pack("{s:s,s:s}", "source", "header", "header",
				 r->tenant_arg);
	case TENANT_AUTHORIZATION:
		return json_pack("{s:s,s:s}", "source", "authorization",
				 "stored_as", "SHA-256 of the credential");
	case TENANT_JWT:
		return json_pack("{s:s,s:s,s:s,s:s}", "source", "jwt", "claim",
				 r->tenant_arg, "issuer", r->jwt->issuer,
				 "audience", r->jwt->audience);
	}
	return json_null();
}

static const char *part_source(enum key_part_source s)
{
	return s == KP_HEADER ? "header" : s == KP_QUERY ? "query" : "body";
}

static json_t *key_rule(const route_cfg *r)
{
	json_t *k = json_pack("{s:b}", "required", r->key_required);
	if (!r->key_required)
		put(k, "when_absent",
		    json_string("forwarded without idempotency protection"));
	if (r->key_from.bare) {
		put(k, "source", json_string("header"));
		put(k, "header", json_string("Idempotency-Key"));
		put(k, "syntax",
		    json_string("an RFC 9651 sf-string, or a bare token of "
				"visible ASCII without '\"' ',' ';' '\\'"));
		put(k, "max_length", json_integer(KEY_LEN_MAX));
		return k;
	}
	json_t *parts = json_array();
	for (size_t i = 0; i < r->key_from.n; i++) {
		const key_part *p = &r->key_from.v[i];
		add(parts,
		    json_pack("{s:s,s:s}", "in", part_source(p->source),
			      p->source == KP_BODY ? "pointer" : "name",
			      p->source == KP_BODY ? p->ptr->text : p->name));
	}
	put(k, "source", json_string("key_from"));
	put(k, "parts", parts);
	put(k, "joined_as",
	    json_string("each part as a netstring LEN:VALUE, "
			"in this order"));
	put(k, "part_max_length", json_integer(KEY_LEN_MAX));
	return k;
}

static json_t *fingerprint_rule(const route_cfg *r)
{
	json_t *covers =
		json_pack("[s,s,s,s,s]", "method", "operation",
			  "path and query as sent", "Content-Type", "body");
	for (size_t i = 0; i < r->fingerprint_headers.n; i++)
		add(covers, json_string(r->fingerprint_headers.v[i]));
	return json_pack("{s:o,s:s,s:o,s:o,s:i}", "covers", covers, "json_body",
			 "canonical: keys sorted, no whitespace", "ignore",
			 pointers(r->fp_ignore, r->n_fp_ignore), "only",
			 pointers(r->fp_only, r->n_fp_only), "mismatch_status",
			 r->mismatch_status);
}

static json_t *in_flight_rule(const route_cfg *r)
{
	json_t *o = json_pack(
		"{s:s,s:I,s:s,s:s}", "mode",
		r->in_flight_wait ? "wait" : "reject", "wait_max_ms",
		(json_int_t)r->wait_max_ms, "prefer",
		"Prefer: wait=N waits up to N seconds (at most wait_max), "
		"answered with Preference-Applied",
		"otherwise", "409 idempotency_key_in_use with Retry-After");
	put(o, "retry_after_ms", json_integer(r->retry_after_ms));
	return o;
}

static json_t *replay_rule(const route_cfg *r)
{
	return json_pack("{s:s,s:s,s:o,s:s}", "marker_header",
			 "Idempotent-Replayed", "marker_value", "true",
			 "headers", strings(&r->replay_headers), "body",
			 r->status_only ? "status_only" : "full");
}

static json_t *released_rule(const route_cfg *r)
{
	json_t *a = json_array();
	for (size_t i = 0; i < r->n_release_statuses; i++)
		add(a, json_integer(r->release_statuses[i]));
	return a;
}

static json_t *unknown_rule(const route_cfg *r)
{
	if (r->on_unknown_hold)
		return json_pack("{s:s,s:s}", "mode", "hold", "retry",
				 "409 idempotency_key_in_use until an "
				 "operator releases the key");
	return json_pack("{s:s,s:s}", "mode", "release_after_lease", "retry",
			 "409 idempotency_key_in_use until the lease ends, "
			 "then the retry executes");
}

static json_t *store_rule(const config *cfg)
{
	/* Only an outage is forwarded: an error from a working store is
	 * refused either way (proxy.c, store_down). */
	if (cfg->db_unavailable_forward)
		return json_pack("{s:s,s:s,s:s}", "mode", "forward", "outage",
				 "forwarded without idempotency protection",
				 "store_error",
				 "503 idempotency_store_unavailable");
	return json_pack("{s:s,s:i,s:s}", "mode", "reject", "status", 503,
			 "code", "idempotency_store_unavailable");
}

/* What a retry gets once the record's ttl has passed: the record is
 * purged at ttl, so its key executes as a new request. */
/* After ttl the response goes; with retain_key beyond it the key stays
 * (a tombstone) and a retry is refused, never forwarded, until
 * retain_key. */
static json_t *expiry_rule(const route_cfg *r)
{
	if (r->retain_key_ms <= r->ttl_ms)
		return json_pack("{s:I,s:s}", "ttl_ms", (json_int_t)r->ttl_ms,
				 "after_ttl", "executes_as_new");
	return json_pack("{s:I,s:I,s:{s:s,s:i,s:s,s:b},s:s}", "ttl_ms",
			 (json_int_t)r->ttl_ms, "retain_key_ms",
			 (json_int_t)r->retain_key_ms, "after_ttl", "answer",
			 "refused", "status", 410, "code",
			 "idempotency_key_expired", "forwarded", 0,
			 "after_retain_key", "executes_as_new");
}

static json_t *route_rules(const config *cfg, const route_cfg *r)
{
	json_t *o = json_pack("{s:s,s:s,s:o}", "operation", r->name,
			      "path_template", r->path, "methods",
			      strings(&r->methods));
	put(o, "scope",
	    json_pack("{s:o,s:s}", "tenant", tenant_rule(r), "operation",
		      r->name));
	put(o, "key", key_rule(r));
	put(o, "fingerprint", fingerprint_rule(r));
	put(o, "ttl_ms", json_integer(r->ttl_ms));
	put(o, "lease_ms", json_integer(r->lease_ms));
	put(o, "upstream_timeout_ms", json_integer(r->upstream_timeout_ms));
	put(o, "in_flight", in_flight_rule(r));
	put(o, "replay", replay_rule(r));
	put(o, "released_statuses", released_rule(r));
	put(o, "on_unknown", unknown_rule(r));
	put(o, "store_unreachable", store_rule(cfg));
	put(o, "expiry", expiry_rule(r));
	return o;
}

static json_t *summary(void)
{
	return json_pack("{s:s,s:s,s:s,s:s,s:s,s:{s:i,s:s},s:s}", "proxy",
			 "idemproxy", "version", idemproxy_version,
			 "specification", CONTRACT_DRAFT, "specification_url",
			 "https://datatracker.ietf.org/doc/" CONTRACT_DRAFT "/",
			 "durations", "milliseconds", "unmatched_paths",
			 "status", 404, "code", "route_not_found",
			 "other_methods",
			 "a route's other methods are forwarded without "
			 "idempotency protection");
}

/* ---- the OpenAPI document -------------------------------------------- */

static json_t *path_param(const char *name, size_t len, const char *desc)
{
	return json_pack("{s:s%,s:s,s:b,s:s,s:{s:s}}", "name", name, len, "in",
			 "path", "required", 1, "description", desc, "schema",
			 "type", "string");
}

/* The template as an OpenAPI path into out, its parameters into params:
 * "{id}" stays, a trailing "/ *" (without the space) becomes one
 * parameter, named REST_PARAM, for the rest of the path. */
static void oas_path(const char *tpl, growbuf *out, json_t *params)
{
	for (const char *s = tpl; *s;) {
		size_t n = strcspn(s + 1, "/") + 1;
		if (n == 2 && s[1] == '*') {
			growbuf_puts(out, "/{" REST_PARAM "}");
			add(params, path_param(REST_PARAM, strlen(REST_PARAM),
					       "the rest of the path: zero "
					       "or more segments"));
		} else {
			growbuf_append(out, s, n);
			if (s[1] == '{')
				add(params,
				    path_param(s + 2, n - 3, "a path segment"));
		}
		s += n;
	}
}

static json_t *header_param(const char *name, const char *in, bool required,
			    const char *desc)
{
	return json_pack("{s:s,s:s,s:b,s:s,s:{s:s,s:i}}", "name", name, "in",
			 in, "required", required, "description", desc,
			 "schema", "type", "string", "minLength", 1);
}

/* The request parameters the key comes from; body parts are in the
 * operation's x-idempotency only, since the body's schema is the API's. */
static json_t *key_params(const route_cfg *r)
{
	json_t *a = json_array();
	if (r->key_from.bare) {
		json_t *p = header_param(
			"Idempotency-Key", "header", r->key_required,
			"The idempotency key: an RFC 9651 sf-string or a bare "
			"token of visible ASCII (no '\"' ',' ';' '\\'), at "
			"most 255 characters.");
		add(a, p);
		return a;
	}
	for (size_t i = 0; i < r->key_from.n; i++) {
		const key_part *p = &r->key_from.v[i];
		if (p->source == KP_BODY)
			continue;
		add(a, header_param(p->name, part_source(p->source),
				    r->key_required,
				    "A part of the idempotency key "
				    "(x-idempotency.key.parts)."));
	}
	return a;
}

/* One response per status, its codes listed in the schema. */
static json_t *problem_response(int status, json_t *codes)
{
	growbuf d = {0};
	growbuf_puts(&d, "Problem:");
	for (size_t i = 0; i < json_array_size(codes); i++)
		growbuf_printf(&d, "%s %s", i ? "," : "",
			       json_string_value(json_array_get(codes, i)));
	json_t *body =
		json_pack("{s:[o,{s:{s:{s:i},s:{s:o}}}]}", "allOf",
			  ref(REF_SCHEMAS, PFX "Problem"), "properties",
			  "status", "const", status, "code", "enum", codes);
	json_t *resp =
		json_pack("{s:s,s:{s:{s:o}}}", "description", d.data, "content",
			  PROBLEM_CONTENT_TYPE, "schema", body);
	growbuf_free(&d);
	if (status == 409 || status == 503)
		put(resp, "headers",
		    json_pack("{s:o}", "Retry-After",
			      ref(REF_HEADERS, PFX "RetryAfter")));
	return resp;
}

/* The codes of route r answered with status, in table order. */
static json_t *codes_with(const route_cfg *r, int status)
{
	json_t *codes = json_array();
	for (size_t i = 0; i < N_PROBLEMS; i++) {
		const struct contract_problem *p = &contract_problems[i];
		if (cp_applies(r, p->when) && cp_status(r, p) == status)
			add(codes, json_string(p->code));
	}
	return codes;
}

/* The name of a problem response in components: its status and a hash
 * (FNV-1a) of its codes, so that two routes, or two documents merged into
 * one, share a name exactly when they share the content. */
static void response_name(int status, json_t *codes, char *out, size_t len)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < json_array_size(codes); i++) {
		const char *c = json_string_value(json_array_get(codes, i));
		for (const char *p = c;; p++) {
			h = (h ^ (uint8_t)*p) * 16777619u;
			if (!*p)
				break;
		}
	}
	snprintf(out, len, PFX "problem_%d_%08x", status, h);
}

/* The route's problem responses, ascending status, each a reference to a
 * response in responses (added there when new). */
static json_t *problem_responses(const route_cfg *r, json_t *responses)
{
	json_t *out = json_object();
	int last = 0;
	for (;;) {
		int next = 1000;
		for (size_t i = 0; i < N_PROBLEMS; i++) {
			int s = cp_status(r, &contract_problems[i]);
			if (s > last && s < next &&
			    cp_applies(r, contract_problems[i].when))
				next = s;
		}
		if (next == 1000)
			return out;
		char k[8], name[64];
		snprintf(k, sizeof k, "%d", next);
		json_t *codes = codes_with(r, next);
		response_name(next, codes, name, sizeof name);
		if (!json_object_get(responses, name))
			put(responses, name, problem_response(next, codes));
		else
			json_decref(codes);
		put(out, k, ref("#/components/responses/", name));
		last = next;
	}
}

static json_t *answer_response(void)
{
	return json_pack("{s:s,s:{s:o}}", "description",
			 "The upstream's answer: to the first attempt, or "
			 "its replay (marked Idempotent-Replayed: true)",
			 "headers", "Idempotent-Replayed",
			 ref(REF_HEADERS, PFX "IdempotentReplayed"));
}

static json_t *operation(const config *cfg, const route_cfg *r,
			 const char *method, json_t *comp_responses)
{
	char id[160];
	size_t n = (size_t)snprintf(id, sizeof id, PFX "%s_", r->name);
	for (const char *m = method; *m && n + 1 < sizeof id; m++)
		id[n++] = (char)tolower((unsigned char)*m);
	id[n] = '\0';
	json_t *responses = problem_responses(r, comp_responses);
	put(responses, "default", answer_response());
	json_t *op = json_pack("{s:s,s:s,s:o,s:o}", "operationId", id,
			       "summary", r->name, "parameters", key_params(r),
			       "responses", responses);
	if (r->tenant_kind == TENANT_JWT)
		put(op, "security", json_pack("[{s:[]}]", PFX "jwt"));
	put(op, "x-idempotency", route_rules(cfg, r));
	return op;
}

/* OpenAPI names eight methods; a route's other one (CONNECT, which the
 * conf accepts) goes into the extension x-idempotency-methods of the path
 * item. */
static bool oas_method(const char *m)
{
	static const char *const known[] = {"GET",    "PUT",     "POST",
					    "DELETE", "OPTIONS", "HEAD",
					    "PATCH",  "TRACE"};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (!strcmp(m, known[i]))
			return true;
	return false;
}

static void add_methods(const config *cfg, const route_cfg *r, json_t *item,
			json_t *responses)
{
	json_t *other = json_object();
	for (size_t i = 0; i < r->methods.n; i++) {
		const char *m = r->methods.v[i];
		if (!oas_method(m)) {
			put(other, m, operation(cfg, r, m, responses));
			continue;
		}
		char lower[8];
		size_t k;
		for (k = 0; m[k]; k++)
			lower[k] = (char)tolower((unsigned char)m[k]);
		lower[k] = '\0';
		put(item, lower, operation(cfg, r, m, responses));
	}
	if (json_object_size(other))
		put(item, "x-idempotency-methods", other);
	else
		json_decref(other);
}

/* The path with its parameters' names left out: two templates of one
 * shape match the same paths. */
static void path_shape(const char *path, growbuf *out)
{
	for (const char *c = path; *c; c++) {
		growbuf_append(out, c, 1);
		if (*c == '{')
			c += strcspn(c, "}") - 1;
	}
}

/* Has an earlier route a path of the same shape? The first matching route
 * wins, so routes[i] never applies and is left out. */
static bool shadowed(const config *cfg, size_t i)
{
	growbuf a = {0};
	path_shape(cfg->routes[i].path, &a);
	bool same = false;
	for (size_t j = 0; j < i && !same; j++) {
		growbuf b = {0};
		path_shape(cfg->routes[j].path, &b);
		same = strcmp(a.data, b.data) == 0;
		growbuf_free(&b);
	}
	growbuf_free(&a);
	return same;
}

static void add_path(const config *cfg, const route_cfg *r, json_t *paths,
		     json_t *responses)
{
	growbuf path = {0};
	json_t *params = json_array();
	oas_path(r->path, &path, params);
	json_t *item = json_object();
	if (json_array_size(params))
		put(item, "parameters", params);
	else
		json_decref(params);
	add_methods(cfg, r, item, responses);
	put(paths, path.data, item);
	growbuf_free(&path);
}

static json_t *problem_schema(const config *cfg)
{
	growbuf desc = {0};
	growbuf_puts(&desc, "RFC 9457 problem details; type is ");
	growbuf_puts(&desc, cfg->problem_type_base);
	growbuf_puts(&desc, "<code>");
	json_t *props = json_pack(
		"{s:{s:s,s:s},s:{s:s},s:{s:s,s:i,s:i},s:{s:s},s:{s:s},"
		"s:{s:s},s:o,s:o}",
		"type", "type", "string", "format", "uri-reference", "title",
		"type", "string", "status", "type", "integer", "minimum", 400,
		"maximum", 599, "detail", "type", "string", "code", "type",
		"string", "request_id", "type", "string", "operation_state",
		ref(REF_SCHEMAS, PFX "OperationState"), "client_action",
		ref(REF_SCHEMAS, PFX "ClientAction"));
	put(props, "original_status",
	    json_pack("{s:s,s:i,s:i,s:s}", "type", "integer", "minimum", 100,
		      "maximum", 599, "description",
		      "idempotency_key_expired: the status the operation "
		      "completed with"));
	json_t *schema = json_pack(
		"{s:s,s:s,s:[s,s,s,s,s,s,s],s:o}", "type", "object",
		"description", desc.data, "required", "type", "title", "status",
		"detail", "code", "operation_state", "client_action",
		"properties", props);
	growbuf_free(&desc);
	return schema;
}

static json_t *components(const config *cfg, json_t *responses)
{
	json_t *schemas = json_pack(
		"{s:o,s:{s:s,s:s,s:[s,s,s,s]},s:{s:s,s:s,s:[s,s,s,s]}}",
		PFX "Problem", problem_schema(cfg), PFX "OperationState", "type",
		"string", "description",
		"What the proxy knows of the operation", "enum", "not_executed",
		"in_progress", "unknown", "completed", PFX "ClientAction",
		"type", "string", "description",
		"What the client may do: retry_same_key (after Retry-After), "
		"retry_new_key (nothing was executed or recorded), fix_request "
		"or do_not_retry",
		"enum", "retry_same_key", "retry_new_key", "fix_request",
		"do_not_retry");
	json_t *headers = json_pack(
		"{s:{s:s,s:{s:s,s:[s]}},s:{s:s,s:{s:s,s:i}}}",
		PFX "IdempotentReplayed", "description",
		"Present on a replay of the stored answer", "schema", "type",
		"string", "enum", "true", PFX "RetryAfter", "description",
		"Seconds to wait before retrying with the same key", "schema",
		"type", "integer", "minimum", 0);
	json_t *c = json_pack("{s:o,s:o,s:o}", "schemas", schemas, "responses",
			      responses, "headers", headers);
	for (size_t i = 0; i < cfg->n_routes; i++)
		if (cfg->routes[i].tenant_kind == TENANT_JWT)
			put(c, "securitySchemes",
			    json_pack("{s:{s:s,s:s,s:s}}", PFX "jwt", "type",
				      "http", "scheme", "bearer",
				      "bearerFormat", "JWT"));
	return c;
}

static json_t *openapi(const config *cfg)
{
	json_t *paths = json_object(), *responses = json_object();
	for (size_t i = 0; i < cfg->n_routes; i++)
		if (!shadowed(cfg, i))
			add_path(cfg, &cfg->routes[i], paths, responses);
	return json_pack(
		"{s:s,s:{s:s,s:s,s:s},s:o,s:o,s:o}", "openapi", "3.1.0", "info",
		"title", "idemproxy idempotency contract", "version",
		idemproxy_version, "description",
		"The Idempotency-Key rules idemproxy enforces in front of "
		"this API, made from its conf. Merge paths and components "
		"into the API's own document: every name is prefixed "
		"idemproxy_.",
		"x-idempotency", summary(), "paths", paths, "components",
		components(cfg, responses));
}

static json_t *rules(const config *cfg)
{
	json_t *routes = json_array();
	for (size_t i = 0; i < cfg->n_routes; i++) {
		if (shadowed(cfg, i))
			continue;
		const route_cfg *r = &cfg->routes[i];
		json_t *o = route_rules(cfg, r);
		json_t *problems = json_array();
		for (size_t k = 0; k < N_PROBLEMS; k++)
			if (cp_applies(r, contract_problems[k].when))
				add(problems,
				    json_pack(
					    "{s:i,s:s}", "status",
					    cp_status(r, &contract_problems[k]),
					    "code", contract_problems[k].code));
		put(o, "problems", problems);
		add(routes, o);
	}
	return json_pack("{s:o,s:o}", "x-idempotency", summary(), "routes",
			 routes);
}

/* ---- the cache ------------------------------------------------------- */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	config *cfg; /* a reference: the pointer is never another's */
	char *doc;
	size_t len;
} cache[2];

static char *render(const config *cfg, enum contract_form form, size_t *len)
{
	json_t *doc = form == CONTRACT_OPENAPI ? openapi(cfg) : rules(cfg);
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(doc);
	ALWAYS_ASSERT(s != NULL);
	*len = strlen(s);
	char *out = xmalloc(*len + 2);
	memcpy(out, s, *len);
	out[(*len)++] = '\n';
	out[*len] = '\0';
	free(s);
	return out;
}

char *contract_document(config *cfg, enum contract_form form, size_t *len)
{
	pthread_mutex_lock(&cache_mu);
	if (cache[form].cfg != cfg) {
		config_unref(cache[form].cfg);
		free(cache[form].doc);
		cache[form].cfg = config_ref(cfg);
		cache[form].doc = render(cfg, form, &cache[form].len);
	}
	*len = cache[form].len;
	char *out = xmalloc(*len + 1);
	memcpy(out, cache[form].doc, *len + 1);
	pthread_mutex_unlock(&cache_mu);
	return out;
}
