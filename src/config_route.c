/* The routes of the conf: the converters only a route's settings use
 * (methods, headers, statuses, tenant, key_from, fingerprint pointers,
 * jwt, name, path, upstream), loading the `routes` list against the
 * per-route tables of config.c, the rules between a route's settings, and
 * the summary --check prints. What a request asks of its route at run
 * time is in route.c. */
#include "config.h"
#include "config_table.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"

static bool cfg_any_string(const char *v)
{
	(void)v;
	return true;
}

static bool cfg_is_known_method(const char *m)
{
	static const char *const known[] = {"GET",     "HEAD",    "POST",
					    "PUT",     "DELETE",  "CONNECT",
					    "OPTIONS", "TRACE",   "PATCH"};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (strcmp(m, known[i]) == 0)
			return true;
	return false;
}

static bool cfg_is_method(const char *m)
{
	char up[16];
	size_t n = strlen(m);
	if (!cfg_is_token(m) || n >= sizeof up)
		return false;
	for (size_t i = 0; i <= n; i++)
		up[i] = (char)toupper((unsigned char)m[i]);
	return cfg_is_known_method(up);
}

int cfg_conv_methods(const cfg_opt *o, const config_setting_t *s, void *base,
		     char *why, size_t whylen)
{
	str_list l;
	if (cfg_strings(s, &l, "HTTP method", cfg_is_method, why, whylen) < 0)
		return -1;
	if (l.n == 0) {
		cfg_list_free(&l);
		return cfg_why(why, whylen,
			       "must name at least one method (an empty list "
			       "would leave the route unprotected)");
	}
	for (size_t i = 0; i < l.n; i++)
		for (char *p = l.v[i]; *p; p++)
			*p = (char)toupper((unsigned char)*p);
	*CFG_DST(o, base, str_list) = l;
	return 0;
}

int cfg_conv_headers(const cfg_opt *o, const config_setting_t *s, void *base,
		     char *why, size_t whylen)
{
	return cfg_strings(s, CFG_DST(o, base, str_list), "header name",
			   cfg_is_token, why, whylen);
}

/* A replayed Set-Cookie would hand one client's session to another, and a
 * replayed Date would lie about when the response was made. */
int cfg_conv_replay_headers(const cfg_opt *o, const config_setting_t *s,
			    void *base, char *why, size_t whylen)
{
	str_list l;
	if (cfg_strings(s, &l, "header name", cfg_is_token, why, whylen) < 0)
		return -1;
	for (size_t i = 0; i < l.n; i++) {
		if (str_caseeq(l.v[i], "Set-Cookie") ||
		    str_caseeq(l.v[i], "Date")) {
			cfg_why(why, whylen,
				"\"%s\" is never replayed; remove it", l.v[i]);
			cfg_list_free(&l);
			return -1;
		}
	}
	*CFG_DST(o, base, str_list) = l;
	return 0;
}

int cfg_conv_statuses(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen)
{
	if (!cfg_is_seq(s))
		return cfg_why(why, whylen,
			       "must be a list of HTTP statuses, not %s",
			       cfg_type_name(s));
	int n = config_setting_length(s);
	int *v = xcalloc((size_t)n + 1, sizeof(int));
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		long long st = cfg_is_int(e) ? config_setting_get_int64(e) : -1;
		if (st < o->min || st > o->max) {
			free(v);
			if (!cfg_is_int(e))
				return cfg_why(why, whylen,
					       "element %d must be an integer",
					       i + 1);
			return cfg_why(why, whylen,
				       "%lld is not an HTTP status "
				       "%" PRId64 "..%" PRId64,
				       st, o->min, o->max);
		}
		v[i] = (int)st;
	}
	*CFG_DST(o, base, int *) = v;
	*CFG_AUX(o, base, size_t) = (size_t)n;
	return 0;
}

int cfg_conv_tenant(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	enum tenant_kind kind;
	const char *arg = NULL;
	if (strcmp(v, "authorization") == 0) {
		kind = TENANT_AUTHORIZATION;
	} else if (strncmp(v, "static:", 7) == 0) {
		kind = TENANT_STATIC;
		arg = v + 7;
		for (const char *p = arg; *p; p++)
			if (*p < 0x21 || *p > 0x7e)
				return cfg_why(why, whylen,
					       "static tenant \"%s\" must be "
					       "visible ASCII",
					       arg);
		/* Stored tenants from headers and credentials have a
		 * "source:" prefix; a static name must not look like one. */
		if (strchr(arg, ':'))
			return cfg_why(why, whylen,
				       "static tenant \"%s\" may not contain "
				       "':'",
				       arg);
	} else if (strncmp(v, "header:", 7) == 0) {
		kind = TENANT_HEADER;
		arg = v + 7;
		if (*arg && !cfg_is_token(arg))
			return cfg_why(why, whylen,
				       "\"%s\" is not a valid header name",
				       arg);
		if (str_caseeq(arg, "Authorization"))
			return cfg_why(why, whylen,
				       "use tenant = \"authorization\", which "
				       "hashes the credential instead of "
				       "storing it");
	} else if (strncmp(v, "jwt:", 4) == 0) {
		kind = TENANT_JWT;
		arg = v + 4;
		for (const char *p = arg; *p; p++)
			if (*p < 0x21 || *p > 0x7e)
				return cfg_why(why, whylen,
					       "claim \"%s\" must be visible "
					       "ASCII",
					       arg);
	} else {
		return cfg_why(why, whylen,
			       "\"%s\" must be \"static:NAME\", "
			       "\"header:NAME\", \"authorization\" or "
			       "\"jwt:CLAIM\"",
			       v);
	}
	if (arg && !*arg)
		return cfg_why(why, whylen, "\"%s\" needs a NAME after ':'", v);
	*CFG_DST(o, base, enum tenant_kind) = kind;
	*CFG_AUX(o, base, char *) = arg ? xstrdup(arg) : NULL;
	return 0;
}

/* key_from's parts: a list, or one part as a string (the common case of a
 * key in one header, key_from = "header:PayPal-Request-Id"). */
static int key_from_strings(const config_setting_t *s, str_list *l, char *why,
			    size_t whylen)
{
	const char *one = config_setting_get_string(s);
	if (one) {
		*l = (str_list){xcalloc(2, sizeof(char *)), 1};
		l->v[0] = xstrdup(one);
		return 0;
	}
	if (!cfg_is_seq(s))
		return cfg_why(why, whylen,
			       "must be a list of key parts or one key part "
			       "string, not %s",
			       cfg_type_name(s));
	return cfg_strings(s, l, "key part", cfg_any_string, why, whylen);
}

/* key_from: where the key comes from, in order. */
int cfg_conv_key_from(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen)
{
	str_list l;
	if (key_from_strings(s, &l, why, whylen) < 0)
		return -1;
	key_from_cfg kp = {0};
	int rc = l.n ? 0
		     : cfg_why(why, whylen,
			       "must name at least one part, such as "
			       "\"header:Idempotency-Key\"");
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		key_part part;
		rc = key_from_parse_part(l.v[i], &part, why, whylen);
		if (rc == 0)
			rc = key_from_add(&kp, &part, why, whylen);
	}
	cfg_list_free(&l);
	if (rc < 0) {
		key_from_free(&kp);
		return -1;
	}
	*CFG_DST(o, base, key_from_cfg) = kp;
	return 0;
}

static void cfg_pointers_free(jsonptr **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		jsonptr_free(v[i]);
	free(v);
}

/* fingerprint_ignore and fingerprint_only: JSON pointers into the body. */
int cfg_conv_pointers(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen)
{
	str_list l;
	if (cfg_strings(s, &l, "JSON pointer", cfg_any_string, why, whylen) <
	    0)
		return -1;
	jsonptr **v = xcalloc(l.n + 1, sizeof *v);
	size_t n = 0;
	int rc = 0;
	for (; rc == 0 && n < l.n; n++) {
		char pwhy[128];
		if (!l.v[n][0])
			rc = cfg_why(why, whylen,
				     "\"\" is the whole body; name the "
				     "members, as in \"/sent_at\"");
		else if (!(v[n] = jsonptr_parse(l.v[n], strlen(l.v[n]), pwhy,
						sizeof pwhy)))
			rc = cfg_why(why, whylen, "\"%s\": %s", l.v[n], pwhy);
	}
	cfg_list_free(&l);
	if (rc < 0) {
		cfg_pointers_free(v, n);
		return -1;
	}
	*CFG_DST(o, base, jsonptr **) = v;
	*CFG_AUX(o, base, size_t) = n;
	return 0;
}

/* A relative keys file is found next to the conf file that names it, so a
 * service does not depend on its working directory. */
static char *cfg_path_near(const config_setting_t *s, const char *path)
{
	const char *conf = config_setting_source_file(s);
	const char *slash = conf ? strrchr(conf, '/') : NULL;
	if (path[0] == '/' || !slash)
		return xstrdup(path);
	growbuf b = {0};
	growbuf_printf(&b, "%.*s/%s", (int)(slash - conf), conf, path);
	return b.data;
}

static int cfg_jwt_string(const config_setting_t *g, const char *name,
			  char **out, char *why, size_t whylen)
{
	const config_setting_t *m = config_setting_get_member(g, name);
	if (!m)
		return cfg_why(why, whylen, "missing required setting \"%s\"",
			       name);
	const char *v = config_setting_get_string(m);
	if (!v || !*v)
		return cfg_why(why, whylen, "%s: must be a non-empty string",
			       name);
	*out = xstrdup(v);
	return 0;
}

static int cfg_jwt_algorithms(const config_setting_t *g, unsigned *out,
			      char *why, size_t whylen)
{
	const config_setting_t *m = config_setting_get_member(g, "algorithms");
	if (!m)
		return cfg_why(why, whylen,
			       "missing required setting \"algorithms\" (for "
			       "example [\"RS256\"])");
	str_list l;
	if (cfg_strings(m, &l, "algorithm", cfg_any_string, why, whylen) < 0)
		return -1;
	unsigned algs = 0;
	int rc = l.n ? 0
		     : cfg_why(why, whylen,
			       "algorithms: name at least one algorithm");
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		unsigned a = jwt_alg_from_name(l.v[i]);
		if (str_caseeq(l.v[i], "none"))
			rc = cfg_why(why, whylen,
				     "algorithms: \"%s\" would accept "
				     "unsigned tokens; it is never allowed",
				     l.v[i]);
		else if (!a)
			rc = cfg_why(why, whylen,
				     "algorithms: \"%s\" must be \"RS256\", "
				     "\"ES256\", \"EdDSA\" or \"HS256\"",
				     l.v[i]);
		algs |= a;
	}
	cfg_list_free(&l);
	*out = algs;
	return rc;
}

static int cfg_jwt_fields(const config_setting_t *g, jwt_policy *p,
			  char *why, size_t whylen)
{
	static const char *const known[] = {"keys", "issuer", "audience",
					    "algorithms", "leeway"};
	for (int i = 0; i < config_setting_length(g); i++) {
		const char *name =
			config_setting_name(config_setting_get_elem(g, (unsigned)i));
		bool ok = false;
		for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
			ok = ok || strcmp(name, known[k]) == 0;
		if (!ok)
			return cfg_why(why, whylen, "unknown setting \"%s\"",
				       name);
	}
	char *file = NULL;
	if (cfg_jwt_string(g, "keys", &file, why, whylen) < 0 ||
	    cfg_jwt_string(g, "issuer", &p->issuer, why, whylen) < 0 ||
	    cfg_jwt_string(g, "audience", &p->audience, why, whylen) < 0 ||
	    cfg_jwt_algorithms(g, &p->algs, why, whylen) < 0) {
		free(file);
		return -1;
	}
	p->keys_file = cfg_path_near(g, file);
	free(file);
	const config_setting_t *lw = config_setting_get_member(g, "leeway");
	const char *lv = lw ? config_setting_get_string(lw) : "30s";
	if (!lv || parse_duration_ms(lv, &p->leeway_ms) < 0 ||
	    p->leeway_ms > 5 * CFG_MS_MINUTE)
		return cfg_why(why, whylen,
			       "leeway: must be a duration of at most 5m, such "
			       "as \"30s\"");
	char kwhy[CFG_WHY];
	p->keys = jwt_keyset_load(p->keys_file, kwhy, sizeof kwhy);
	if (!p->keys)
		return cfg_why(why, whylen, "keys: %s", kwhy);
	return 0;
}

/* jwt = { keys = "FILE"; issuer = ...; audience = ...; algorithms = [...];
 * leeway = "30s"; }: an empty group means no JWT verification. The key
 * file is read here, so a reload (SIGHUP) reads it again, and a key file
 * that does not load keeps the configuration in force. */
int cfg_conv_jwt(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen)
{
	if (!config_setting_is_group(s))
		return cfg_why(why, whylen, "must be a group { keys = ...; }, "
				       "not %s",
			       cfg_type_name(s));
	if (config_setting_length(s) == 0) {
		*CFG_DST(o, base, jwt_policy *) = NULL;
		return 0;
	}
	jwt_policy *p = xcalloc(1, sizeof *p);
	if (cfg_jwt_fields(s, p, why, whylen) < 0) {
		jwt_policy_free(p);
		return -1;
	}
	*CFG_DST(o, base, jwt_policy *) = p;
	return 0;
}

/* Names are the operation in the store and a metrics label value. */
int cfg_conv_route_name(const cfg_opt *o, const config_setting_t *s, void *base,
			char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	size_t n = strlen(v);
	if (n == 0 || n > CFG_ROUTE_NAME_MAX || !cfg_span_is(v, n, "_.-"))
		return cfg_why(why, whylen,
			       "\"%s\" must be 1..%d characters of "
			       "A-Z a-z 0-9 _ . -",
			       v, CFG_ROUTE_NAME_MAX);
	*CFG_DST(o, base, char *) = xstrdup(v);
	return 0;
}

int cfg_conv_path(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	char perr[200];
	pathtpl *t = pathtpl_compile(v, perr, sizeof perr);
	if (!t)
		return cfg_why(why, whylen, "\"%s\": %s", v, perr);
	*CFG_DST(o, base, char *) = xstrdup(v);
	*CFG_AUX(o, base, pathtpl *) = t;
	return 0;
}

int cfg_conv_upstream(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	return cfg_check_upstream(config_setting_get_string(s),
				  CFG_DST(o, base, char *), why, whylen);
}

/* ---- routes ---------------------------------------------------------- */

void cfg_route_free(route_cfg *r)
{
	free(r->name);
	free(r->path);
	pathtpl_free(r->tpl);
	free(r->upstream);
	cfg_list_free(&r->methods);
	free(r->tenant_arg);
	free(r->release_statuses);
	cfg_list_free(&r->replay_headers);
	cfg_list_free(&r->fingerprint_headers);
	key_from_free(&r->key_from);
	cfg_pointers_free(r->fp_ignore, r->n_fp_ignore);
	cfg_pointers_free(r->fp_only, r->n_fp_only);
	jwt_policy_free(r->jwt);
}

/* The line to blame for a rule between two settings: the route's own
 * setting if it has one, else the defaults', else the route. */
static const config_setting_t *cfg_blame(const config_setting_t *route,
					 const config_setting_t *defaults,
					 const char *a, const char *b)
{
	const config_setting_t *s = cfg_member(route, a);
	if (!s)
		s = cfg_member(route, b);
	if (!s)
		s = cfg_member(defaults, a);
	if (!s)
		s = cfg_member(defaults, b);
	return s ? s : route;
}

/* An attempt sends only with this much of its lease left (proxy.c): a
 * lease that cannot hold it would refuse every request. */
static int cfg_route_lease_rule(cfg_ctx *x, const route_cfg *r,
				const config_setting_t *g,
				const config_setting_t *defaults)
{
	char a[32], b[32], c[32];
	int64_t margin = route_lease_margin_ms(r);
	if (r->lease_ms > r->upstream_timeout_ms + margin)
		return 0;
	cfg_fmt_ms(r->lease_ms, a, sizeof a);
	cfg_fmt_ms(r->upstream_timeout_ms, b, sizeof b);
	cfg_fmt_ms(margin, c, sizeof c);
	return cfg_fail(x, cfg_blame(g, defaults, "lease", "upstream_timeout"),
			"route \"%s\": lease (%s) must be longer than "
			"upstream_timeout (%s) plus the lease margin "
			"(%s: a tenth of the lease, at least 100ms, at "
			"most 2s), since an attempt is sent only while "
			"that much of its lease is left",
			r->name, a, b, c);
}

/* Settings that exclude or need one another: the fingerprint's pointers,
 * a jwt tenant and its group. */
static int cfg_route_pair_rules(cfg_ctx *x, const route_cfg *r,
				const config_setting_t *g,
				const config_setting_t *defaults)
{
	if (r->n_fp_ignore && r->n_fp_only)
		return cfg_fail(x,
				cfg_blame(g, defaults, "fingerprint_only",
					  "fingerprint_ignore"),
				"route \"%s\": set fingerprint_ignore or "
				"fingerprint_only, not both",
				r->name);
	if (r->tenant_kind == TENANT_JWT && !r->jwt)
		return cfg_fail(x, cfg_blame(g, defaults, "tenant", "jwt"),
				"route \"%s\": tenant \"jwt:%s\" needs a jwt "
				"= { keys = \"FILE\"; issuer = ...; audience "
				"= ...; algorithms = [...]; } group",
				r->name, r->tenant_arg);
	if (r->tenant_kind == TENANT_JWT &&
	    pct_escape(r->jwt->issuer, NULL, 0) > ROUTE_JWT_ISSUER_MAX)
		return cfg_fail(x, cfg_blame(g, defaults, "jwt", "jwt"),
				"route \"%s\": jwt.issuer is too long: the "
				"stored tenant holds it in at most %d "
				"characters, with '%%', ':' and bytes outside "
				"visible ASCII written as %%XX",
				r->name, ROUTE_JWT_ISSUER_MAX);
	return 0;
}

/* A wait never outlasts the attempt it waits for: a wait_max set longer
 * than the lease is an error, the default follows a shorter lease. */
static int cfg_route_wait_rule(cfg_ctx *x, route_cfg *r,
			       const config_setting_t *g,
			       const config_setting_t *defaults)
{
	if (r->wait_max_ms <= r->lease_ms)
		return 0;
	const config_setting_t *set = cfg_member(g, "wait_max");
	if (!set)
		set = cfg_member(defaults, "wait_max");
	if (!set) {
		r->wait_max_ms = r->lease_ms;
		return 0;
	}
	char a[32], b[32];
	cfg_fmt_ms(r->wait_max_ms, a, sizeof a);
	cfg_fmt_ms(r->lease_ms, b, sizeof b);
	return cfg_fail(x, set,
			"route \"%s\": wait_max (%s) must not be longer than "
			"lease (%s)",
			r->name, a, b);
}

static int cfg_route_ttl_rule(cfg_ctx *x, const route_cfg *r,
			      const config_setting_t *g,
			      const config_setting_t *defaults)
{
	if (r->ttl_ms > r->lease_ms)
		return 0;
	char a[32], b[32];
	cfg_fmt_ms(r->ttl_ms, a, sizeof a);
	cfg_fmt_ms(r->lease_ms, b, sizeof b);
	return cfg_fail(x, cfg_blame(g, defaults, "ttl", "lease"),
			"route \"%s\": ttl (%s) must be longer than lease (%s)",
			r->name, a, b);
}

/* A key is kept at least as long as its response: an unset retain_key
 * follows ttl (no tombstones, as before it existed); a shorter one set in
 * the route or in defaults is an error. */
static int cfg_route_retain_rule(cfg_ctx *x, route_cfg *r,
				 const config_setting_t *g,
				 const config_setting_t *defaults)
{
	if (r->retain_key_ms >= r->ttl_ms)
		return 0;
	const config_setting_t *set = cfg_member(g, "retain_key");
	if (!set)
		set = cfg_member(defaults, "retain_key");
	if (!set) {
		r->retain_key_ms = r->ttl_ms;
		return 0;
	}
	char a[32], b[32];
	cfg_fmt_ms(r->retain_key_ms, a, sizeof a);
	cfg_fmt_ms(r->ttl_ms, b, sizeof b);
	return cfg_fail(x, cfg_blame(g, defaults, "retain_key", "ttl"),
			"route \"%s\": retain_key (%s) must not be shorter "
			"than ttl (%s)",
			r->name, a, b);
}

/* The rules between a route's settings, in the order they were checked
 * when they were one function: the first broken one is reported. */
static int cfg_route_rules(cfg_ctx *x, route_cfg *r,
			   const config_setting_t *g,
			   const config_setting_t *defaults)
{
	if (cfg_route_lease_rule(x, r, g, defaults) < 0 ||
	    cfg_route_pair_rules(x, r, g, defaults) < 0 ||
	    cfg_route_wait_rule(x, r, g, defaults) < 0 ||
	    cfg_route_ttl_rule(x, r, g, defaults) < 0 ||
	    cfg_route_retain_rule(x, r, g, defaults) < 0)
		return -1;
	return 0;
}

static int cfg_load_route(cfg_ctx *x, const config_setting_t *g, size_t idx,
			  const config_setting_t *defaults, route_cfg *r)
{
	char prefix[CFG_ROUTE_NAME_MAX + 32];
	snprintf(prefix, sizeof prefix, "routes[%zu]: ", idx + 1);
	if (!config_setting_is_group(g))
		return cfg_fail(x, g,
				"%smust be a group { name = ...; path = ...; "
				"upstream = ...; }, not %s",
				prefix, cfg_type_name(g));
	r->line = (int)config_setting_source_line(g);
	/* The name first (it leads cfg_route_only), so every later message
	 * can say which route it is about. */
	if (cfg_apply(x, NULL, cfg_route_only, 1, g, NULL, r, prefix) < 0)
		return -1;
	snprintf(prefix, sizeof prefix, "route \"%s\": ", r->name);
	if (cfg_check_known(x, g, cfg_route, cfg_route_n, true, prefix) <
	    0)
		return -1;
	if (cfg_apply(x, NULL, cfg_route_only + 1, cfg_route_only_n - 1,
		      g, NULL, r, prefix) < 0)
		return -1;
	if (cfg_apply(x, "route", cfg_route, cfg_route_n, g, defaults, r,
		      prefix) < 0)
		return -1;
	return cfg_route_rules(x, r, g, defaults);
}

/* The defaults group on its own, so a bad value there is reported as the
 * defaults' fault rather than as the first route's. */
int cfg_check_defaults(cfg_ctx *x, const config_setting_t *d)
{
	if (!d)
		return 0;
	if (cfg_want_group(x, d, "defaults") < 0 ||
	    cfg_check_known(x, d, cfg_route, cfg_route_n, false,
			    "defaults: ") < 0)
		return -1;
	route_cfg scratch = {0};
	int rc = cfg_apply(x, "route", cfg_route, cfg_route_n, d, NULL,
			   &scratch, "defaults: ");
	cfg_route_free(&scratch);
	return rc;
}

int cfg_load_routes(cfg_ctx *x, config *c, const config_setting_t *root,
		    const config_setting_t *defaults)
{
	const config_setting_t *rs = cfg_member(root, "routes");
	if (!rs)
		return cfg_fail(x, NULL,
				"no routes: add routes = ( { name = ...; "
				"path = ...; upstream = ...; } )");
	if (!cfg_is_seq(rs))
		return cfg_fail(x, rs, "routes: must be a list ( { ... }, ... ), "
				       "not %s",
				cfg_type_name(rs));
	size_t n = (size_t)config_setting_length(rs);
	if (n == 0)
		return cfg_fail(x, rs, "routes: the list is empty");
	c->routes = xcalloc(n, sizeof *c->routes);
	c->n_routes = n;
	for (size_t i = 0; i < n; i++) {
		const config_setting_t *g =
			config_setting_get_elem(rs, (unsigned)i);
		route_cfg *r = &c->routes[i];
		if (cfg_load_route(x, g, i, defaults, r) < 0)
			return -1;
		for (size_t j = 0; j < i; j++) {
			if (strcmp(c->routes[j].name, r->name) != 0)
				continue;
			return cfg_fail(x, cfg_member(g, "name"),
					"route \"%s\": duplicate name (first "
					"used at line %d)",
					r->name, c->routes[j].line);
		}
	}
	return 0;
}

static void cfg_tenant_text(const route_cfg *r, char *buf, size_t n)
{
	switch (r->tenant_kind) {
	case TENANT_STATIC:
		snprintf(buf, n, "static:%s", r->tenant_arg);
		break;
	case TENANT_HEADER:
		snprintf(buf, n, "header:%s", r->tenant_arg);
		break;
	case TENANT_AUTHORIZATION:
		snprintf(buf, n, "authorization");
		break;
	case TENANT_JWT:
		snprintf(buf, n, "jwt:%s", r->tenant_arg);
		break;
	}
}

void config_print_routes(const config *c, FILE *out)
{
	int wname = 0, wpath = 0;
	for (size_t i = 0; i < c->n_routes; i++) {
		int ln = (int)strlen(c->routes[i].name);
		int lp = (int)strlen(c->routes[i].path);
		wname = ln > wname ? ln : wname;
		wpath = lp > wpath ? lp : wpath;
	}
	for (size_t i = 0; i < c->n_routes; i++) {
		const route_cfg *r = &c->routes[i];
		growbuf m = {0};
		for (size_t j = 0; j < r->methods.n; j++)
			growbuf_printf(&m, "%s%s", j ? "," : "",
				       r->methods.v[j]);
		char tenant[300], ttl[32], lease[32];
		cfg_tenant_text(r, tenant, sizeof tenant);
		cfg_fmt_ms(r->ttl_ms, ttl, sizeof ttl);
		cfg_fmt_ms(r->lease_ms, lease, sizeof lease);
		growbuf from = {0};
		for (size_t j = 0; !r->key_from.bare && j < r->key_from.n; j++)
			growbuf_printf(&from, "%s%s", j ? "," : " key_from=",
				       r->key_from.v[j].spec);
		fprintf(out,
			"%-*s  %-*s  -> %s  methods=%s key=%s%s tenant=%s "
			"ttl=%s lease=%s\n",
			wname, r->name, wpath, r->path, r->upstream, m.data,
			r->key_required ? "required" : "optional",
			from.data ? from.data : "", tenant, ttl, lease);
		growbuf_free(&from);
		growbuf_free(&m);
	}
}
