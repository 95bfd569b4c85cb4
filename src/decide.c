#include "decide.h"

#include <ctype.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reject(request_plan *p, int status, const char *code,
		   const char *outcome, const char *detail)
{
	p->action = PLAN_REJECT;
	p->status = status;
	p->code = code;
	p->outcome = outcome;
	snprintf(p->detail, sizeof p->detail, "%s", detail);
}

static bool tenant_value_ok(const char *v)
{
	size_t n = strlen(v);
	if (n == 0 || n > PLAN_TENANT_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
			return false;
	return true;
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

void decide_canonical_credentials(const char *v, growbuf *out)
{
	const char *end = v + strlen(v);
	while (v < end && is_ows(*v))
		v++;
	while (end > v && is_ows(end[-1]))
		end--;
	const char *sp = v;
	while (sp < end && !is_ows(*sp))
		sp++;
	/* The scheme is case-insensitive (RFC 9110 11.1): spelled as the usual
	 * schemes are ("Bearer", "Basic"), so that the hash of a credential
	 * sent that way is the one stored before schemes were folded. */
	for (const char *c = v; c < sp; c++) {
		char ch = (char)(c == v ? toupper((unsigned char)*c)
					: tolower((unsigned char)*c));
		growbuf_append(out, &ch, 1);
	}
	while (sp < end && is_ows(*sp))
		sp++;
	if (sp < end) {
		growbuf_append(out, " ", 1);
		growbuf_append(out, sp, (size_t)(end - sp));
	}
}

/* The request's one Authorization header, canonical, into cred (empty
 * when there is none); false (rejected) when it sends more than one. */
static bool one_credential(const header_list *h, request_plan *p,
			   growbuf *cred)
{
	if (header_list_count(h, "Authorization") > 1) {
		reject(p, 400, "bad_request", "rejected",
		       "send exactly one Authorization header");
		return false;
	}
	const char *auth = header_list_get(h, "Authorization");
	if (auth)
		decide_canonical_credentials(auth, cred);
	return true;
}

/* A jwt: tenant is a claim of the bearer token, once the token is verified
 * against the route's keys, stored with the route's issuer (the token's
 * iss, which must be that one). The token itself is neither stored nor put
 * in any message. */
static bool plan_jwt_tenant(const route_cfg *r, const header_list *h,
			    int64_t now_ms, request_plan *p)
{
	growbuf cred = {0};
	if (!one_credential(h, p, &cred))
		return false;
	if (cred.len <= 7 || strncmp(cred.data, "Bearer ", 7) != 0) {
		growbuf_free(&cred);
		reject(p, 401, "credentials_missing", "rejected",
		       "this route needs an Authorization: Bearer JWT header");
		return false;
	}
	char value[PLAN_TENANT_MAX + 1], detail[160];
	enum jwt_result jr =
		jwt_verify(r->jwt, cred.data + 7, cred.len - 7, now_ms,
			   r->tenant_arg, value, sizeof value, detail,
			   sizeof detail);
	growbuf_free(&cred);
	if (jr == JWT_INVALID) {
		reject(p, 401, "credentials_invalid", "rejected", detail);
		return false;
	}
	if (jr == JWT_NO_CLAIM) {
		reject(p, 401, "tenant_missing", "rejected", detail);
		return false;
	}
	/* Scoped by the issuer: after the route's issuer changes, a subject
	 * of the new one is never the old one's namesake. */
	char iss[PLAN_JWT_ISSUER_MAX + 1];
	pct_escape(r->jwt->issuer, iss, sizeof iss);
	snprintf(p->tenant, sizeof p->tenant, "jwt:%s:%s", iss, value);
	return true;
}

/* Fills p->tenant, or rejects. Returns false on rejection. The tenant
 * names its source, so that a header value or a credential's hash can never
 * be read as a static tenant's records (or the other way round) after the
 * source of a route changes: static tenants are stored as their name, which
 * cannot contain ':', the others with a "header:" or "authorization:"
 * prefix. */
static bool plan_tenant(const route_cfg *r, const header_list *h,
			int64_t now_ms, request_plan *p)
{
	if (r->tenant_kind == TENANT_STATIC) {
		snprintf(p->tenant, sizeof p->tenant, "%s", r->tenant_arg);
		return true;
	}
	if (r->tenant_kind == TENANT_HEADER) {
		size_t n = header_list_count(h, r->tenant_arg);
		const char *v = header_list_get(h, r->tenant_arg);
		if (n == 0 || !v || !v[0]) {
			char d[160];
			snprintf(d, sizeof d, "the %s header is required",
				 r->tenant_arg);
			reject(p, 400, "tenant_missing", "rejected", d);
			return false;
		}
		if (n > 1 || !tenant_value_ok(v)) {
			char d[160];
			snprintf(d, sizeof d,
				 "the %s header must be one value of 1-255 "
				 "visible ASCII characters",
				 r->tenant_arg);
			reject(p, 400, "bad_request", "rejected", d);
			return false;
		}
		snprintf(p->tenant, sizeof p->tenant, "header:%s", v);
		return true;
	}
	if (r->tenant_kind == TENANT_JWT)
		return plan_jwt_tenant(r, h, now_ms, p);
	/* The upstream authenticates with every Authorization it gets: the
	 * tenant must come from the only one there is. */
	growbuf cred = {0};
	if (!one_credential(h, p, &cred))
		return false;
	if (cred.len == 0) {
		growbuf_free(&cred);
		reject(p, 401, "credentials_missing", "rejected",
		       "this route needs an Authorization header");
		return false;
	}
	/* Each credential is its own scope; only its hash is ever stored. */
	uint8_t md[SHA256_DIGEST_LENGTH];
	SHA256((const unsigned char *)cred.data, cred.len, md);
	growbuf_free(&cred);
	char hex[2 * SHA256_DIGEST_LENGTH + 1];
	hex_encode(md, sizeof md, hex);
	snprintf(p->tenant, sizeof p->tenant, "authorization:%s", hex);
	return true;
}

/* What key_header_parse accepts unquoted. */
static bool key_is_bare(const char *k)
{
	for (const char *c = k; *c; c++)
		if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f ||
		    strchr("\",;\\", *c))
			return false;
	return k[0] != '\0';
}

void decide_key_header(const char *key, char out[PLAN_KEY_HEADER_MAX + 1])
{
	size_t o = 0;
	if (key_is_bare(key)) {
		snprintf(out, PLAN_KEY_HEADER_MAX + 1, "%s", key);
		return;
	}
	out[o++] = '"';
	for (const char *c = key; *c && o + 2 < PLAN_KEY_HEADER_MAX; c++) {
		if (*c == '"' || *c == '\\')
			out[o++] = '\\';
		out[o++] = *c;
	}
	out[o++] = '"';
	out[o] = '\0';
}

/* Fills p->key (and p->key_header), or rejects, or passes an optional
 * key's request through. Returns true when the plan goes on. */
static bool plan_key(const route_cfg *r, const decide_request *rq,
		     request_plan *p)
{
	const char *q = rq->target + rq->path_len;
	key_from_request kr = {
		.headers = rq->headers,
		.query = *q == '?' ? q + 1 : NULL,
		.query_len = *q == '?' ? strlen(q + 1) : 0,
		.content_type = header_list_get(rq->headers, "Content-Type"),
		.body = rq->body,
		.body_len = rq->body_len,
	};
	key_from_key *k = xmalloc(sizeof *k);
	enum key_from_result res = key_from_key_of(&r->key_from, &kr, k);
	bool go = false;
	if (res == KEY_FROM_NONE && !r->key_required) {
		p->action = PLAN_PASSTHROUGH;
		p->outcome = "passthrough";
	} else if (res == KEY_FROM_NONE && r->key_from.bare) {
		reject(p, 400, "idempotency_key_missing", "key_missing",
		       "this operation needs an Idempotency-Key header");
	} else if (res == KEY_FROM_NONE || res == KEY_FROM_MISSING) {
		reject(p, 400, "idempotency_key_missing", "key_missing",
		       k->detail);
	} else if (res == KEY_FROM_INVALID) {
		reject(p, 400, "idempotency_key_invalid", "key_invalid",
		       k->detail);
	} else {
		snprintf(p->key, sizeof p->key, "%s", k->key);
		if (k->header_key[0])
			decide_key_header(k->header_key, p->key_header);
		go = true;
	}
	free(k);
	return go;
}

void decide_plan(const config *cfg, const decide_request *rq,
		 request_plan *p)
{
	memset(p, 0, sizeof *p);
	/* Routed on the normalised path, forwarded as sent: every spelling of
	 * a path is governed by the route of that path. */
	char *norm = xmalloc(rq->path_len + 1);
	size_t nlen;
	const char *pwhy;
	if (pathtpl_normalize(rq->target, rq->path_len, norm, &nlen, &pwhy) <
	    0) {
		free(norm);
		char d[160];
		snprintf(d, sizeof d, "the path is refused: %s", pwhy);
		reject(p, 400, "bad_request", "rejected", d);
		return;
	}
	/* No route has this path (config_load checks). */
	size_t clen = strlen(cfg->contract_path);
	bool contract = clen && nlen == clen &&
			memcmp(norm, cfg->contract_path, clen) == 0;
	const route_cfg *r =
		route_match(cfg->routes, cfg->n_routes, norm, nlen);
	free(norm);
	if (contract) {
		p->action = PLAN_CONTRACT;
		p->outcome = "contract";
		return;
	}
	p->route = r;
	if (!r) {
		reject(p, 404, "route_not_found", "rejected",
		       "no route matches this path");
		return;
	}
	if (!route_has_method(r, rq->method)) {
		p->action = PLAN_PASSTHROUGH;
		p->outcome = "passthrough";
		return;
	}
	if (!plan_key(r, rq, p))
		return;
	if (!plan_tenant(r, rq->headers, rq->now_ms, p))
		return;
	p->action = PLAN_CLAIM;
	p->outcome = NULL;
}

enum decide_record decide_record_for(const route_cfg *r, bool got_response,
				     bool sent, int status)
{
	if (!got_response)
		return sent ? REC_LEAVE : REC_RELEASE;
	return route_releases_status(r, status) ? REC_RELEASE : REC_COMPLETE;
}

int64_t decide_retry_after_s(int64_t ms)
{
	int64_t s = (ms + 999) / 1000;
	return s < 1 ? 1 : s;
}

/* A replay without the upstream's CORS headers is unreadable to the
 * browser that retried (fetch fails as a network error), so they go with
 * the record whatever replay_headers says. An Access-Control-Allow-Origin
 * that echoed the first request's origin stays that origin's: a retry from
 * another origin cannot read the replay. */
static bool is_cors_header(const char *name)
{
	return str_caseeq(name, "Access-Control-Allow-Origin") ||
	       str_caseeq(name, "Access-Control-Allow-Credentials") ||
	       str_caseeq(name, "Access-Control-Expose-Headers");
}

static bool is_replay_header(const route_cfg *r, const char *name)
{
	if (is_cors_header(name))
		return true;
	for (size_t i = 0; i < r->replay_headers.n; i++)
		if (str_caseeq(name, r->replay_headers.v[i]))
			return true;
	return false;
}

void decide_encode_replay_headers(const route_cfg *r, const header_list *h,
				  growbuf *out)
{
	for (size_t i = 0; i < h->n; i++) {
		const http_header *x = &h->v[i];
		/* Set-Cookie and Date are never replayed, whatever the conf
		 * says (the loader refuses them too); the content coding is
		 * part of the body and always goes with it. */
		if (str_caseeq(x->name, "Set-Cookie") ||
		    str_caseeq(x->name, "Date") ||
		    (!is_replay_header(r, x->name) &&
		     !str_caseeq(x->name, "Content-Encoding")))
			continue;
		if (strpbrk(x->value, "\r\n"))
			continue;
		growbuf_printf(out, "%s: %s\r\n", x->name, x->value);
	}
}

void decide_decode_replay_headers(const char *s, size_t len, header_list *out)
{
	const char *end = s + len;
	while (s < end) {
		const char *eol = memchr(s, '\n', (size_t)(end - s));
		const char *line_end = eol ? eol : end;
		const char *e = line_end;
		if (e > s && e[-1] == '\r')
			e--;
		const char *colon = memchr(s, ':', (size_t)(e - s));
		if (colon && colon > s) {
			const char *v = colon + 1;
			while (v < e && (*v == ' ' || *v == '\t'))
				v++;
			header_list_add(out, s, (size_t)(colon - s), v,
					(size_t)(e - v));
		}
		s = eol ? eol + 1 : end;
	}
}

/* The first wait= preference of the Prefer header(s): seconds, or -1. A
 * preference is `token [ "=" word ] *( ";" param )`, comma-separated; the
 * value may be quoted. */
static int64_t prefer_wait_s(const header_list *h)
{
	for (size_t i = 0; i < h->n; i++) {
		if (!str_caseeq(h->v[i].name, "Prefer"))
			continue;
		const char *p = h->v[i].value;
		while (*p) {
			while (*p == ' ' || *p == '\t' || *p == ',')
				p++;
			const char *name = p;
			while (*p && *p != '=' && *p != ',' && *p != ';' &&
			       *p != ' ' && *p != '\t')
				p++;
			bool is_wait = p - name == 4 &&
				       str_ncaseeq(name, "wait", 4);
			while (*p == ' ' || *p == '\t')
				p++;
			if (is_wait && *p == '=') {
				p++;
				while (*p == ' ' || *p == '\t')
					p++;
				bool q = *p == '"';
				p += q;
				int64_t v = 0;
				const char *d = p;
				while (*p >= '0' && *p <= '9') {
					if (v < 1000000000)
						v = v * 10 + (*p - '0');
					p++;
				}
				if (p > d && (!q || *p == '"'))
					return v;
				return -1;
			}
			/* skip the rest of this preference (quoted strings may
			 * hold commas) */
			bool quoted = false;
			while (*p && (quoted || *p != ',')) {
				if (*p == '"')
					quoted = !quoted;
				else if (*p == '\\' && quoted && p[1])
					p++;
				p++;
			}
		}
	}
	return -1;
}

int64_t decide_wait_ms(const route_cfg *r, const header_list *h,
		       int64_t *applied_s)
{
	int64_t asked = prefer_wait_s(h);
	*applied_s = -1;
	if (asked < 0)
		return r->in_flight_wait ? r->wait_max_ms : 0;
	int64_t ms = asked * 1000 < r->wait_max_ms ? asked * 1000
						   : r->wait_max_ms;
	*applied_s = (ms + 999) / 1000;
	return ms;
}
