/* The conf file as data. Each scope (top level, database, reaper, the per-route
 * settings shared by `defaults` and the routes, the route-only settings) is a
 * table of settings: name, converter, default, bounds, destination, and what
 * a reload does with it. Loading walks the tables; nothing is read from the
 * file outside them.
 *
 * Defaults are written in conf-file syntax and parsed by libconfig like the
 * file itself, so they go through the same converters and bounds as what an
 * operator writes and can never bypass validation. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"

#define CFG_MS_SECOND INT64_C(1000)
#define CFG_MS_MINUTE (60 * CFG_MS_SECOND)
#define CFG_MS_HOUR (60 * CFG_MS_MINUTE)
#define CFG_MS_DAY (24 * CFG_MS_HOUR)
#define CFG_GIB (INT64_C(1) << 30)
#define CFG_ROUTE_NAME_MAX 128
#define CFG_WHY 256

typedef struct cfg_choice {
	const char *name;
	int value;
} cfg_choice;

struct cfg_opt;

/* Converts one setting into base + opt->off; on a bad value writes the reason
 * (without file, line or setting name) into why and returns -1. */
typedef int (*cfg_conv_fn)(const struct cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen);

typedef struct cfg_opt {
	const char *name;
	cfg_conv_fn conv;
	const char *def;  /* conf-file syntax; NULL = required */
	int64_t min, max; /* bounds of the value or of each element */
	size_t off;       /* destination in the scope's struct */
	size_t aux;       /* second destination (count, argument) if any */
	const cfg_choice *choices;
	enum config_reload reload; /* what a SIGHUP does with it */
} cfg_opt;

#define CFG_APPLY CONFIG_RELOAD_APPLY
#define CFG_RESTART CONFIG_RELOAD_RESTART

/* Where errors go, and what the values are converted from. */
typedef struct cfg_ctx {
	const char *file;
	char *err;
	size_t errlen;
	config_t builtin; /* the defaults of every table, parsed */
} cfg_ctx;

/* ---- errors ---------------------------------------------------------- */

/* Settings without a line of their own report the nearest enclosing group's. */
__attribute__((format(printf, 3, 4))) static int
cfg_fail(cfg_ctx *x, const config_setting_t *at, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);

	for (const config_setting_t *s = at; s; s = config_setting_parent(s)) {
		unsigned line = config_setting_source_line(s);
		if (line == 0)
			continue;
		const char *f = config_setting_source_file(s);
		snprintf(x->err, x->errlen, "%s:%u: %s", f ? f : x->file, line,
			 msg);
		return -1;
	}
	snprintf(x->err, x->errlen, "%s: %s", x->file, msg);
	return -1;
}

__attribute__((format(printf, 3, 4))) static int
cfg_why(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return -1;
}

/* ---- formatting ------------------------------------------------------ */

static void cfg_fmt_ms(int64_t ms, char *buf, size_t n)
{
	static const struct {
		int64_t ms;
		const char *unit;
	} units[] = {
		{CFG_MS_DAY, "d"},     {CFG_MS_HOUR, "h"}, {CFG_MS_MINUTE, "m"},
		{CFG_MS_SECOND, "s"},
	};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (ms != 0 && ms % units[i].ms == 0) {
			snprintf(buf, n, "%" PRId64 "%s", ms / units[i].ms,
				 units[i].unit);
			return;
		}
	}
	snprintf(buf, n, "%" PRId64 "ms", ms);
}

static void cfg_fmt_size(int64_t b, char *buf, size_t n)
{
	static const char *const units[] = {"GiB", "MiB", "KiB"};
	for (size_t i = 0; i < 3; i++) {
		int64_t unit = CFG_GIB >> (10 * i);
		if (b != 0 && b % unit == 0) {
			snprintf(buf, n, "%" PRId64 "%s", b / unit, units[i]);
			return;
		}
	}
	snprintf(buf, n, "%" PRId64 "B", b);
}

/* ---- small validators ------------------------------------------------ */

static bool cfg_is_tchar(unsigned char c)
{
	return isalnum(c) || (c != 0 && strchr("!#$%&'*+-.^_`|~", c));
}

/* An RFC 9110 token: header names and methods. */
static bool cfg_is_token(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!cfg_is_tchar((unsigned char)*s))
			return false;
	return true;
}

static int cfg_parse_port(const char *s, size_t n, int *port)
{
	if (n == 0 || n > 5)
		return -1;
	int v = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isdigit((unsigned char)s[i]))
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	if (v < 1 || v > 65535)
		return -1;
	*port = v;
	return 0;
}

static bool cfg_span_is(const char *s, size_t n, const char *allowed)
{
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr(allowed, s[i]))
			return false;
	return true;
}

/* "[v6]" or a name / IPv4 address, as it appears before ":port". */
static int cfg_check_host(const char *h, size_t n, char *why, size_t whylen)
{
	if (n == 0)
		return cfg_why(why, whylen, "missing host");
	if (h[0] == '[') {
		bool ok = n >= 4 && h[n - 1] == ']' && memchr(h, ':', n);
		for (size_t i = 1; ok && i < n - 1; i++)
			ok = isxdigit((unsigned char)h[i]) || h[i] == ':' ||
			     h[i] == '.';
		return ok ? 0 : cfg_why(why, whylen, "malformed IPv6 address");
	}
	if (memchr(h, ':', n))
		return cfg_why(why, whylen,
			       "an IPv6 address goes in brackets, as in "
			       "\"[::1]:8080\"");
	if (!cfg_span_is(h, n, ".-_"))
		return cfg_why(why, whylen, "malformed host");
	return 0;
}

int config_split_listen(const char *s, char *host, size_t hostlen, int *port,
			char *err, size_t errlen)
{
	const char *colon = strrchr(s, ':');
	if (!colon)
		return cfg_why(err, errlen,
			       "\"%s\" is not \"host:port\" or \"[v6]:port\"",
			       s);
	size_t hn = (size_t)(colon - s);
	if (cfg_check_host(s, hn, err, errlen) < 0)
		return -1;
	if (cfg_parse_port(colon + 1, strlen(colon + 1), port) < 0)
		return cfg_why(err, errlen, "port must be 1..65535");
	const char *h = s;
	if (s[0] == '[') {
		h++;
		hn -= 2;
	}
	if (hn >= hostlen)
		return cfg_why(err, errlen, "host too long");
	memcpy(host, h, hn);
	host[hn] = '\0';
	return 0;
}

/* http[s]://host[:port][/prefix], returned without trailing '/' and with a
 * lower-case scheme. */
static int cfg_check_upstream(const char *url, char **out, char *why,
			      size_t whylen)
{
	const char *scheme = NULL;
	if (ip_strncaseeq(url, "http://", 7))
		scheme = "http://";
	else if (ip_strncaseeq(url, "https://", 8))
		scheme = "https://";
	if (!scheme)
		return cfg_why(why, whylen,
			       "\"%s\" must start with http:// or https://",
			       url);
	const char *auth = url + strlen(scheme);
	size_t an = strcspn(auth, "/?#");
	const char *rest = auth + an;
	if (memchr(auth, '@', an))
		return cfg_why(why, whylen,
			       "\"%s\": credentials in the URL are not "
			       "supported",
			       url);
	if (strpbrk(rest, "?#"))
		return cfg_why(why, whylen,
			       "\"%s\": no query or fragment allowed, the "
			       "request's own are appended",
			       url);

	/* The port is after the last ':' unless that ':' is inside [v6]. */
	size_t hn = an;
	const char *colon = memrchr(auth, ':', an);
	if (colon && !memchr(colon, ']', (size_t)(auth + an - colon)))
		hn = (size_t)(colon - auth);
	char hwhy[128];
	if (cfg_check_host(auth, hn, hwhy, sizeof hwhy) < 0)
		return cfg_why(why, whylen, "\"%s\": %s", url, hwhy);
	int port;
	if (hn < an && cfg_parse_port(auth + hn + 1, an - hn - 1, &port) < 0)
		return cfg_why(why, whylen, "\"%s\": port must be 1..65535",
			       url);
	if (!cfg_span_is(rest, strlen(rest), "/-._~!$&'()*+,;=:@%"))
		return cfg_why(why, whylen,
			       "\"%s\": characters not allowed in a path", url);

	size_t n = strlen(url);
	while (n > (size_t)(rest - url) && url[n - 1] == '/')
		n--;
	char *u = xstrndup(url, n);
	for (size_t i = 0; i < strlen(scheme); i++)
		u[i] = (char)tolower((unsigned char)u[i]);
	*out = u;
	return 0;
}

/* ---- converters ------------------------------------------------------ */

#define CFG_DST(o, base, type) ((type *)((char *)(base) + (o)->off))
#define CFG_AUX(o, base, type) ((type *)((char *)(base) + (o)->aux))

static const char *cfg_type_name(const config_setting_t *s)
{
	switch (config_setting_type(s)) {
	case CONFIG_TYPE_GROUP:
		return "a group";
	case CONFIG_TYPE_INT:
	case CONFIG_TYPE_INT64:
		return "an integer";
	case CONFIG_TYPE_FLOAT:
		return "a float";
	case CONFIG_TYPE_STRING:
		return "a string";
	case CONFIG_TYPE_BOOL:
		return "a boolean";
	case CONFIG_TYPE_ARRAY:
		return "an array";
	case CONFIG_TYPE_LIST:
		return "a list";
	default:
		return "unknown";
	}
}

static bool cfg_is_int(const config_setting_t *s)
{
	int t = config_setting_type(s);
	return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
}

static bool cfg_is_seq(const config_setting_t *s)
{
	int t = config_setting_type(s);
	return t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST;
}

static int cfg_want_string(const config_setting_t *s, const char *what,
			   char *why, size_t whylen)
{
	if (config_setting_type(s) == CONFIG_TYPE_STRING)
		return 0;
	return cfg_why(why, whylen, "must be %s, not %s", what,
		       cfg_type_name(s));
}

static int cfg_conv_string(const cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, char *) = xstrdup(config_setting_get_string(s));
	return 0;
}

static int cfg_conv_int(const cfg_opt *o, const config_setting_t *s,
			void *base, char *why, size_t whylen)
{
	if (!cfg_is_int(s))
		return cfg_why(why, whylen, "must be an integer, not %s",
			       cfg_type_name(s));
	long long v = config_setting_get_int64(s);
	if (v < o->min || v > o->max)
		return cfg_why(why, whylen,
			       "%lld is out of range %" PRId64 "..%" PRId64, v,
			       o->min, o->max);
	*CFG_DST(o, base, int) = (int)v;
	return 0;
}

static int cfg_conv_int64(const cfg_opt *o, const config_setting_t *s,
			  void *base, char *why, size_t whylen)
{
	if (!cfg_is_int(s))
		return cfg_why(why, whylen, "must be an integer, not %s",
			       cfg_type_name(s));
	long long v = config_setting_get_int64(s);
	if (v < o->min || v > o->max)
		return cfg_why(why, whylen,
			       "%lld is out of range %" PRId64 "..%" PRId64, v,
			       o->min, o->max);
	*CFG_DST(o, base, int64_t) = (int64_t)v;
	return 0;
}

static int cfg_conv_duration(const cfg_opt *o, const config_setting_t *s,
			     void *base, char *why, size_t whylen)
{
	if (cfg_want_string(s, "a duration string such as \"30s\"", why,
			    whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	int64_t ms;
	if (ip_parse_duration_ms(v, &ms) < 0)
		return cfg_why(why, whylen,
			       "bad duration \"%s\" (use a number and a unit: "
			       "250ms, 30s, 5m, 24h, 7d)",
			       v);
	if (ms < o->min || ms > o->max) {
		char lo[32], hi[32];
		cfg_fmt_ms(o->min, lo, sizeof lo);
		cfg_fmt_ms(o->max, hi, sizeof hi);
		return cfg_why(why, whylen, "\"%s\" is out of range %s..%s", v,
			       lo, hi);
	}
	*CFG_DST(o, base, int64_t) = ms;
	return 0;
}

static int cfg_conv_size(const cfg_opt *o, const config_setting_t *s,
			 void *base, char *why, size_t whylen)
{
	int64_t b;
	char text[64];
	if (cfg_is_int(s)) {
		b = config_setting_get_int64(s);
		snprintf(text, sizeof text, "%" PRId64, b);
	} else {
		if (cfg_want_string(s, "a size such as \"1MiB\"", why,
				    whylen) < 0)
			return -1;
		const char *v = config_setting_get_string(s);
		if (ip_parse_size(v, &b) < 0)
			return cfg_why(why, whylen,
				       "bad size \"%s\" (use e.g. 512KiB, "
				       "1MiB, 2GiB)",
				       v);
		snprintf(text, sizeof text, "%s", v);
	}
	if (b < o->min || b > o->max) {
		char lo[32], hi[32];
		cfg_fmt_size(o->min, lo, sizeof lo);
		cfg_fmt_size(o->max, hi, sizeof hi);
		return cfg_why(why, whylen, "%s is out of range %s..%s", text,
			       lo, hi);
	}
	*CFG_DST(o, base, int64_t) = b;
	return 0;
}

/* "must be "a", "b" or "c"", each choice between quote marks. */
static int cfg_why_choices(const cfg_opt *o, const char *quote, char *why,
			   size_t whylen)
{
	ip_buf b = {0};
	for (const cfg_choice *c = o->choices; c->name; c++)
		ip_buf_printf(&b, "%s%s%s%s",
			      c == o->choices ? "" : c[1].name ? ", " : " or ",
			      quote, c->name, quote);
	cfg_why(why, whylen, "must be %s", b.data);
	ip_buf_free(&b);
	return -1;
}

static int cfg_choose(const cfg_opt *o, const config_setting_t *s, int *out,
		      char *why, size_t whylen)
{
	const char *v = config_setting_type(s) == CONFIG_TYPE_STRING
				? config_setting_get_string(s)
				: NULL;
	for (const cfg_choice *c = o->choices; v && c->name; c++) {
		if (strcmp(v, c->name) == 0) {
			*out = c->value;
			return 0;
		}
	}
	return cfg_why_choices(o, "\"", why, whylen);
}

static int cfg_conv_enum(const cfg_opt *o, const config_setting_t *s,
			 void *base, char *why, size_t whylen)
{
	int v;
	if (cfg_choose(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, int) = v;
	return 0;
}

static int cfg_conv_flag(const cfg_opt *o, const config_setting_t *s,
			 void *base, char *why, size_t whylen)
{
	int v;
	if (cfg_choose(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, bool) = v != 0;
	return 0;
}

/* An integer from a fixed set (mismatch_status). */
static int cfg_conv_int_choice(const cfg_opt *o, const config_setting_t *s,
			       void *base, char *why, size_t whylen)
{
	if (cfg_is_int(s)) {
		long long v = config_setting_get_int64(s);
		for (const cfg_choice *c = o->choices; c->name; c++) {
			if (v == c->value) {
				*CFG_DST(o, base, int) = c->value;
				return 0;
			}
		}
	}
	return cfg_why_choices(o, "", why, whylen);
}

static int cfg_listen(const cfg_opt *o, const config_setting_t *s,
		      void *base, bool may_be_off, char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string \"host:port\"", why, whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	char host[256];
	int port;
	if ((*v || !may_be_off) &&
	    config_split_listen(v, host, sizeof host, &port, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, char *) = xstrdup(v);
	return 0;
}

static int cfg_conv_listen(const cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen)
{
	return cfg_listen(o, s, base, false, why, whylen);
}

/* "" switches the listener off. */
static int cfg_conv_listen_or_off(const cfg_opt *o, const config_setting_t *s,
				  void *base, char *why, size_t whylen)
{
	return cfg_listen(o, s, base, true, why, whylen);
}

static void cfg_list_free(str_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* A list or array of strings, each checked by ok(); bad elements are
 * reported by value. */
static int cfg_strings(const config_setting_t *s, str_list *out,
		       const char *what, bool (*ok)(const char *), char *why,
		       size_t whylen)
{
	if (!cfg_is_seq(s))
		return cfg_why(why, whylen, "must be a list of %ss, not %s",
			       what, cfg_type_name(s));
	int n = config_setting_length(s);
	str_list l = {xcalloc((size_t)n + 1, sizeof(char *)), 0};
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *v = config_setting_get_string(e);
		if (!v || !ok(v)) {
			cfg_list_free(&l);
			if (!v)
				return cfg_why(why, whylen,
					       "element %d must be a %s string",
					       i + 1, what);
			return cfg_why(why, whylen, "\"%s\" is not a valid %s",
				       v, what);
		}
		l.v[l.n++] = xstrdup(v);
	}
	*out = l;
	return 0;
}

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

static int cfg_conv_methods(const cfg_opt *o, const config_setting_t *s,
			    void *base, char *why, size_t whylen)
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

static int cfg_conv_headers(const cfg_opt *o, const config_setting_t *s,
			    void *base, char *why, size_t whylen)
{
	return cfg_strings(s, CFG_DST(o, base, str_list), "header name",
			   cfg_is_token, why, whylen);
}

/* A replayed Set-Cookie would hand one client's session to another, and a
 * replayed Date would lie about when the response was made. */
static int cfg_conv_replay_headers(const cfg_opt *o, const config_setting_t *s,
				   void *base, char *why, size_t whylen)
{
	str_list l;
	if (cfg_strings(s, &l, "header name", cfg_is_token, why, whylen) < 0)
		return -1;
	for (size_t i = 0; i < l.n; i++) {
		if (ip_strcaseeq(l.v[i], "Set-Cookie") ||
		    ip_strcaseeq(l.v[i], "Date")) {
			cfg_why(why, whylen,
				"\"%s\" is never replayed; remove it", l.v[i]);
			cfg_list_free(&l);
			return -1;
		}
	}
	*CFG_DST(o, base, str_list) = l;
	return 0;
}

static int cfg_conv_statuses(const cfg_opt *o, const config_setting_t *s,
			     void *base, char *why, size_t whylen)
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

static int cfg_conv_tenant(const cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen)
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
		if (ip_strcaseeq(arg, "Authorization"))
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

/* key_from: where the key comes from, in order. */
static int cfg_conv_key_from(const cfg_opt *o, const config_setting_t *s,
			     void *base, char *why, size_t whylen)
{
	str_list l;
	if (cfg_strings(s, &l, "key part", cfg_any_string, why, whylen) < 0)
		return -1;
	keyparts kp = {0};
	int rc = l.n ? 0
		     : cfg_why(why, whylen,
			       "must name at least one part, such as "
			       "\"header:Idempotency-Key\"");
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		keypart part;
		rc = keyparts_parse_part(l.v[i], &part, why, whylen);
		if (rc == 0)
			rc = keyparts_add(&kp, &part, why, whylen);
	}
	cfg_list_free(&l);
	if (rc < 0) {
		keyparts_free(&kp);
		return -1;
	}
	*CFG_DST(o, base, keyparts) = kp;
	return 0;
}

static void cfg_pointers_free(jsonptr **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		jsonptr_free(v[i]);
	free(v);
}

/* fingerprint_ignore and fingerprint_only: JSON pointers into the body. */
static int cfg_conv_pointers(const cfg_opt *o, const config_setting_t *s,
			     void *base, char *why, size_t whylen)
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
	ip_buf b = {0};
	ip_buf_printf(&b, "%.*s/%s", (int)(slash - conf), conf, path);
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
		if (ip_strcaseeq(l.v[i], "none"))
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
	if (!lv || ip_parse_duration_ms(lv, &p->leeway_ms) < 0 ||
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
static int cfg_conv_jwt(const cfg_opt *o, const config_setting_t *s,
			void *base, char *why, size_t whylen)
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
static int cfg_conv_route_name(const cfg_opt *o, const config_setting_t *s,
			       void *base, char *why, size_t whylen)
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

static int cfg_conv_path(const cfg_opt *o, const config_setting_t *s,
			 void *base, char *why, size_t whylen)
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

static int cfg_conv_upstream(const cfg_opt *o, const config_setting_t *s,
			     void *base, char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	return cfg_check_upstream(config_setting_get_string(s),
				  CFG_DST(o, base, char *), why, whylen);
}

/* ---- the tables ------------------------------------------------------ */

static const cfg_choice cfg_log_levels[] = {
	{"error", LOG_ERROR}, {"warn", LOG_WARN}, {"info", LOG_INFO},
	{"debug", LOG_DEBUG}, {NULL, 0},
};
static const cfg_choice cfg_log_formats[] = {
	{"json", 1}, {"text", 0}, {NULL, 0}};
static const cfg_choice cfg_unavailable[] = {
	{"reject", 0}, {"forward", 1}, {NULL, 0}};
static const cfg_choice cfg_distributed[] = {
	{"none", 0}, {"citus", 1}, {NULL, 0}};
static const cfg_choice cfg_key_modes[] = {
	{"required", 1}, {"optional", 0}, {NULL, 0}};
static const cfg_choice cfg_on_unknown[] = {
	{"release_after_lease", 0}, {"hold", 1}, {NULL, 0}};
static const cfg_choice cfg_store_body[] = {
	{"full", 0}, {"status_only", 1}, {NULL, 0}};
static const cfg_choice cfg_in_flight[] = {
	{"reject", 0}, {"wait", 1}, {NULL, 0}};
static const cfg_choice cfg_mismatch[] = {
	{"409", 409}, {"422", 422}, {NULL, 0}};

/* Reload rules. Routes, and whatever is read from the request's own
 * configuration, apply to the next request. Restart-only: the listeners,
 * the thread count and database.url make threads and sockets at start;
 * max_connections and max_connections_per_ip are libmicrohttpd daemon
 * options; max_header_size sizes each connection's memory at start (a lower
 * value is enforced on the next request anyway, a higher one cannot be). */
#define C_(f) offsetof(config, f)
#define R_(f) offsetof(route_cfg, f)
#define CFG_N(t) (sizeof(t) / sizeof((t)[0]))

static const cfg_opt cfg_top[] = {
	{.name = "listen", .conv = cfg_conv_listen,
	 .def = "\"127.0.0.1:8080\"", .off = C_(listen), .reload = CFG_RESTART},
	{.name = "admin_listen", .conv = cfg_conv_listen_or_off,
	 .def = "\"127.0.0.1:8081\"", .off = C_(admin_listen),
	 .reload = CFG_RESTART},
	{.name = "admin_token", .conv = cfg_conv_string, .def = "\"\"",
	 .off = C_(admin_token), .reload = CFG_APPLY},
	{.name = "workers", .conv = cfg_conv_int, .def = "16", .min = 1,
	 .max = 1024, .off = C_(workers), .reload = CFG_RESTART},
	{.name = "queue_size", .conv = cfg_conv_int, .def = "1024", .min = 1,
	 .max = 1048576, .off = C_(queue_size), .reload = CFG_APPLY},
	{.name = "max_connections", .conv = cfg_conv_int, .def = "1024",
	 .min = 1, .max = 1048576, .off = C_(max_connections),
	 .reload = CFG_RESTART},
	{.name = "max_connections_per_ip", .conv = cfg_conv_int, .def = "0",
	 .min = 0, .max = 1048576, .off = C_(max_connections_per_ip),
	 .reload = CFG_RESTART},
	{.name = "max_header_size", .conv = cfg_conv_size,
	 .def = "\"32KiB\"", .min = 1024, .max = 1 << 20,
	 .off = C_(max_header_size), .reload = CFG_RESTART},
	{.name = "max_request_body", .conv = cfg_conv_size,
	 .def = "\"1MiB\"", .min = 1, .max = CFG_GIB,
	 .off = C_(max_request_body), .reload = CFG_APPLY},
	{.name = "max_stored_response", .conv = cfg_conv_size,
	 .def = "\"4MiB\"", .min = 1, .max = CFG_GIB,
	 .off = C_(max_stored_response), .reload = CFG_APPLY},
	{.name = "max_response", .conv = cfg_conv_size,
	 .def = "\"256MiB\"", .min = 1, .max = 16 * CFG_GIB,
	 .off = C_(max_response), .reload = CFG_APPLY},
	{.name = "replay_cache_size", .conv = cfg_conv_size,
	 .def = "\"64MiB\"", .min = 0, .max = 16 * CFG_GIB,
	 .off = C_(replay_cache_size), .reload = CFG_APPLY},
	{.name = "replay_cache_ttl", .conv = cfg_conv_duration,
	 .def = "\"10s\"", .min = 0, .max = CFG_MS_DAY,
	 .off = C_(replay_cache_ttl_ms), .reload = CFG_APPLY},
	{.name = "max_waiters", .conv = cfg_conv_int, .def = "1000",
	 .min = 0, .max = 1048576, .off = C_(max_waiters),
	 .reload = CFG_APPLY},
	/* 0: half of max_waiters, so that one tenant never takes them all. */
	{.name = "max_waiters_per_tenant", .conv = cfg_conv_int, .def = "0",
	 .min = 0, .max = 1048576, .off = C_(max_waiters_per_tenant),
	 .reload = CFG_APPLY},
	{.name = "shutdown_grace", .conv = cfg_conv_duration,
	 .def = "\"10s\"", .min = 0, .max = CFG_MS_HOUR,
	 .off = C_(shutdown_grace_ms), .reload = CFG_APPLY},
	/* Whole-request deadlines (MHD's 30 s timeout is an idle timeout that
	 * a trickling client resets with every byte). */
	{.name = "request_head_timeout", .conv = cfg_conv_duration,
	 .def = "\"60s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(request_head_timeout_ms), .reload = CFG_APPLY},
	{.name = "request_body_timeout", .conv = cfg_conv_duration,
	 .def = "\"300s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(request_body_timeout_ms), .reload = CFG_APPLY},
	{.name = "busy_poll", .conv = cfg_conv_duration, .def = "\"0ms\"",
	 .min = 0, .max = 100, .off = C_(busy_poll_ms), .reload = CFG_APPLY},
	/* How late the serving loop's heartbeat may be before /readyz fails
	 * (fiber.h: the loop beats at least every FIBER_BEAT_MS). */
	{.name = "loop_stall_max", .conv = cfg_conv_duration,
	 .def = "\"2s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(loop_stall_max_ms), .reload = CFG_APPLY},
	{.name = "log_level", .conv = cfg_conv_enum, .def = "\"info\"",
	 .off = C_(log_level), .choices = cfg_log_levels, .reload = CFG_APPLY},
	{.name = "log_format", .conv = cfg_conv_flag, .def = "\"json\"",
	 .off = C_(log_json), .choices = cfg_log_formats, .reload = CFG_APPLY},
	{.name = "log_flush_interval", .conv = cfg_conv_duration,
	 .def = "\"100ms\"", .min = 0, .max = 60000,
	 .off = C_(log_flush_ms), .reload = CFG_APPLY},
};

static const cfg_opt cfg_database[] = {
	{.name = "url", .conv = cfg_conv_string,
	 .def = "\"postgresql:///idemproxy\"", .off = C_(db_url),
	 .reload = CFG_RESTART},
	{.name = "statement_timeout", .conv = cfg_conv_duration,
	 .def = "\"2s\"", .min = 1, .max = CFG_MS_HOUR,
	 .off = C_(statement_timeout_ms), .reload = CFG_APPLY},
	{.name = "unavailable", .conv = cfg_conv_flag, .def = "\"reject\"",
	 .off = C_(db_unavailable_forward), .choices = cfg_unavailable,
	 .reload = CFG_APPLY},
	{.name = "distributed", .conv = cfg_conv_flag, .def = "\"none\"",
	 .off = C_(db_citus), .choices = cfg_distributed, .reload = CFG_RESTART},
	/* First attempts per claim or record statement (store_batch.h); 1:
	 * each alone. The ceiling is what one statement carries. */
	{.name = "batch", .conv = cfg_conv_int, .def = "64", .min = 1,
	 .max = 256, .off = C_(db_batch), .reload = CFG_APPLY},
	/* The least time a batch statement is out before calls stop waiting
	 * behind it (store_batch.h: or 8 times the lane's average round
	 * trip, if longer). */
	{.name = "batch_stall", .conv = cfg_conv_duration, .def = "\"250ms\"",
	 .min = 10, .max = CFG_MS_HOUR, .off = C_(db_batch_stall_ms),
	 .reload = CFG_APPLY},
};

/* A reaper faster than 100ms would only keep the database busy. */
static const cfg_opt cfg_reaper[] = {
	{.name = "interval", .conv = cfg_conv_duration, .def = "\"5s\"",
	 .min = 100, .max = CFG_MS_HOUR, .off = C_(reaper_interval_ms),
	 .reload = CFG_APPLY},
	{.name = "batch", .conv = cfg_conv_int, .def = "1000", .min = 1,
	 .max = 100000, .off = C_(reaper_batch), .reload = CFG_APPLY},
};

/* Settable in `defaults` and in each route. */
static const cfg_opt cfg_route[] = {
	{.name = "methods", .conv = cfg_conv_methods,
	 .def = "[\"POST\", \"PATCH\"]", .off = R_(methods),
	 .reload = CFG_APPLY},
	{.name = "key", .conv = cfg_conv_flag, .def = "\"required\"",
	 .off = R_(key_required), .choices = cfg_key_modes,
	 .reload = CFG_APPLY},
	{.name = "tenant", .conv = cfg_conv_tenant,
	 .def = "\"static:default\"", .off = R_(tenant_kind),
	 .aux = R_(tenant_arg), .reload = CFG_APPLY},
	{.name = "ttl", .conv = cfg_conv_duration, .def = "\"24h\"",
	 .min = CFG_MS_SECOND, .max = 3650 * CFG_MS_DAY, .off = R_(ttl_ms),
	 .reload = CFG_APPLY},
	{.name = "lease", .conv = cfg_conv_duration, .def = "\"30s\"",
	 .min = 1, .max = CFG_MS_DAY, .off = R_(lease_ms), .reload = CFG_APPLY},
	{.name = "upstream_timeout", .conv = cfg_conv_duration,
	 .def = "\"25s\"", .min = 1, .max = CFG_MS_DAY,
	 .off = R_(upstream_timeout_ms), .reload = CFG_APPLY},
	{.name = "retry_after", .conv = cfg_conv_duration, .def = "\"1s\"",
	 .min = 1, .max = CFG_MS_HOUR, .off = R_(retry_after_ms),
	 .reload = CFG_APPLY},
	{.name = "mismatch_status", .conv = cfg_conv_int_choice, .def = "409",
	 .off = R_(mismatch_status), .choices = cfg_mismatch,
	 .reload = CFG_APPLY},
	{.name = "release_statuses", .conv = cfg_conv_statuses,
	 .def = "[408, 425, 429, 500, 502, 503, 504]", .min = 100,
	 .max = 599, .off = R_(release_statuses),
	 .aux = R_(n_release_statuses), .reload = CFG_APPLY},
	{.name = "on_unknown", .conv = cfg_conv_flag,
	 .def = "\"release_after_lease\"", .off = R_(on_unknown_hold),
	 .choices = cfg_on_unknown, .reload = CFG_APPLY},
	{.name = "replay_headers", .conv = cfg_conv_replay_headers,
	 .def = "[\"Content-Type\", \"Content-Language\", \"Location\", "
		"\"ETag\", \"Last-Modified\", \"Link\", \"Cache-Control\"]",
	 .off = R_(replay_headers), .reload = CFG_APPLY},
	{.name = "fingerprint_headers", .conv = cfg_conv_headers, .def = "[]",
	 .off = R_(fingerprint_headers), .reload = CFG_APPLY},
	{.name = "store_body", .conv = cfg_conv_flag, .def = "\"full\"",
	 .off = R_(status_only), .choices = cfg_store_body, .reload = CFG_APPLY},
	{.name = "key_from", .conv = cfg_conv_key_from,
	 .def = "[\"header:Idempotency-Key\"]", .off = R_(key_from), .reload = CFG_APPLY},
	{.name = "fingerprint_ignore", .conv = cfg_conv_pointers, .def = "[]",
	 .off = R_(fp_ignore), .aux = R_(n_fp_ignore), .reload = CFG_APPLY},
	{.name = "fingerprint_only", .conv = cfg_conv_pointers, .def = "[]",
	 .off = R_(fp_only), .aux = R_(n_fp_only), .reload = CFG_APPLY},
	{.name = "jwt", .conv = cfg_conv_jwt, .def = "{}", .off = R_(jwt), .reload = CFG_APPLY},
	{.name = "in_flight", .conv = cfg_conv_flag, .def = "\"reject\"",
	 .off = R_(in_flight_wait), .choices = cfg_in_flight,
	 .reload = CFG_APPLY},
	{.name = "wait_max", .conv = cfg_conv_duration, .def = "\"10s\"",
	 .min = 1, .max = CFG_MS_DAY, .off = R_(wait_max_ms),
	 .reload = CFG_APPLY},
};

/* Only in a route, and required there (no default). */
static const cfg_opt cfg_route_only[] = {
	{.name = "name", .conv = cfg_conv_route_name, .off = R_(name),
	 .reload = CFG_APPLY},
	{.name = "path", .conv = cfg_conv_path, .off = R_(path),
	 .aux = R_(tpl), .reload = CFG_APPLY},
	{.name = "upstream", .conv = cfg_conv_upstream, .off = R_(upstream),
	 .reload = CFG_APPLY},
};

/* The key file is read (and its keys checked) with the conf, so a reload
 * with a bad key file keeps the old keys along with the old conf. */
static const cfg_opt cfg_seal[] = {
	{.name = "keys", .conv = cfg_conv_string, .def = "\"\"",
	 .off = C_(seal_keys_file), .reload = CFG_APPLY},
	/* Random 96-bit nonces are safe for about 2^32 seals per key: warn at
	 * half of that, leaving the other half for the rotation. */
	{.name = "warn_seals", .conv = cfg_conv_int64, .def = "2147483648L",
	 .min = 1, .max = INT64_C(4294967296), .off = C_(seal_warn_seals),
	 .reload = CFG_APPLY},
};

/* Top-level groups, handled by code rather than converters. */
static const char *const cfg_sections[] = {"database", "reaper", "defaults",
					   "routes", "store_encryption"};

/* The tables with defaults; a scope's name is also its group in the file
 * (but for top and route) and in the built-in defaults. */
enum cfg_scope_id { CFG_TOP, CFG_DATABASE, CFG_REAPER, CFG_ROUTE, CFG_SEAL };
static const struct cfg_scope {
	const char *name;
	const cfg_opt *opts;
	size_t n;
} cfg_scopes[] = {
	[CFG_TOP] = {"top", cfg_top, CFG_N(cfg_top)},
	[CFG_DATABASE] = {"database", cfg_database, CFG_N(cfg_database)},
	[CFG_REAPER] = {"reaper", cfg_reaper, CFG_N(cfg_reaper)},
	[CFG_ROUTE] = {"route", cfg_route, CFG_N(cfg_route)},
	[CFG_SEAL] = {"store_encryption", cfg_seal, CFG_N(cfg_seal)},
};

/* ---- reload rules ---------------------------------------------------- */

static const struct {
	const char *scope;
	const cfg_opt *opts;
	size_t n;
	bool per_route; /* into route_cfg, not config */
} cfg_all_tables[] = {
	{"", cfg_top, CFG_N(cfg_top), false},
	{"database", cfg_database, CFG_N(cfg_database), false},
	{"reaper", cfg_reaper, CFG_N(cfg_reaper), false},
	{"route", cfg_route, CFG_N(cfg_route), true},
	{"route-only", cfg_route_only, CFG_N(cfg_route_only), true},
	{"store_encryption", cfg_seal, CFG_N(cfg_seal), false},
};

void config_each_setting(void (*fn)(void *arg, const char *scope,
				    const char *name,
				    enum config_reload rule),
			 void *arg)
{
	for (size_t i = 0; i < CFG_N(cfg_all_tables); i++)
		for (size_t j = 0; j < cfg_all_tables[i].n; j++)
			fn(arg, cfg_all_tables[i].scope,
			   cfg_all_tables[i].opts[j].name,
			   cfg_all_tables[i].opts[j].reload);
}

#define CFG_VAL(o, base, type) (*(const type *)((const char *)(base) + (o)->off))

/* Restart-only settings are single values of the top-level scopes; a row of
 * another kind marked restart-only fails here, in the unit test. */
static bool cfg_same(const cfg_opt *o, const config *a, const config *b)
{
	if (o->conv == cfg_conv_string || o->conv == cfg_conv_listen ||
	    o->conv == cfg_conv_listen_or_off)
		return strcmp(CFG_VAL(o, a, char *), CFG_VAL(o, b, char *)) == 0;
	if (o->conv == cfg_conv_int || o->conv == cfg_conv_enum ||
	    o->conv == cfg_conv_int_choice)
		return CFG_VAL(o, a, int) == CFG_VAL(o, b, int);
	if (o->conv == cfg_conv_duration || o->conv == cfg_conv_size)
		return CFG_VAL(o, a, int64_t) == CFG_VAL(o, b, int64_t);
	IP_ASSERT(o->conv == cfg_conv_flag);
	return CFG_VAL(o, a, bool) == CFG_VAL(o, b, bool);
}

size_t config_restart_changes(const config *running, const config *next,
			      char *buf, size_t len)
{
	ip_buf names = {0};
	size_t n = 0;
	for (size_t i = 0; i < CFG_N(cfg_all_tables); i++) {
		/* Routes are replaced as a whole, on every reload. */
		if (cfg_all_tables[i].per_route)
			continue;
		for (size_t j = 0; j < cfg_all_tables[i].n; j++) {
			const cfg_opt *o = &cfg_all_tables[i].opts[j];
			if (o->reload != CFG_RESTART ||
			    cfg_same(o, running, next))
				continue;
			ip_buf_printf(&names, "%s%s%s%s", n ? "," : "",
				      cfg_all_tables[i].scope,
				      *cfg_all_tables[i].scope ? "." : "",
				      o->name);
			n++;
		}
	}
	snprintf(buf, len, "%s", names.data ? names.data : "");
	ip_buf_free(&names);
	return n;
}

/* ---- applying tables ------------------------------------------------- */

static const cfg_opt *cfg_find(const cfg_opt *opts, size_t n,
			       const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

static void cfg_builtin_load(config_t *lc)
{
	ip_buf b = {0};
	for (size_t i = 0; i < CFG_N(cfg_scopes); i++) {
		ip_buf_printf(&b, "%s = {\n", cfg_scopes[i].name);
		for (size_t j = 0; j < cfg_scopes[i].n; j++)
			ip_buf_printf(&b, "  %s = %s;\n",
				      cfg_scopes[i].opts[j].name,
				      cfg_scopes[i].opts[j].def);
		ip_buf_puts(&b, "};\n");
	}
	config_init(lc);
	IP_ASSERT(config_read_string(lc, b.data) == CONFIG_TRUE);
	ip_buf_free(&b);
}

static const config_setting_t *cfg_member(const config_setting_t *g,
					  const char *name)
{
	return g ? config_setting_get_member(g, name) : NULL;
}

static const config_setting_t *cfg_builtin(cfg_ctx *x, const char *scope,
					   const char *name)
{
	return cfg_member(cfg_member(config_root_setting(&x->builtin), scope),
			  name);
}

/* Every setting of opts into base, each from the first of: group, fallback
 * (the `defaults` group for a route), the built-in default. prefix names the
 * scope in messages ("database: ", "route \"x\": "). */
static int cfg_apply(cfg_ctx *x, const char *scope, const cfg_opt *opts,
		     size_t n, const config_setting_t *group,
		     const config_setting_t *fallback, void *base,
		     const char *prefix)
{
	for (size_t i = 0; i < n; i++) {
		const cfg_opt *o = &opts[i];
		const config_setting_t *s = cfg_member(group, o->name);
		if (!s)
			s = cfg_member(fallback, o->name);
		bool builtin = !s;
		if (builtin && !o->def)
			return cfg_fail(x, group,
					"%smissing required setting \"%s\"",
					prefix, o->name);
		if (builtin)
			s = cfg_builtin(x, scope, o->name);
		IP_ASSERT(s);
		char why[CFG_WHY];
		if (o->conv(o, s, base, why, sizeof why) == 0)
			continue;
		IP_ASSERT(!builtin);
		return cfg_fail(x, s, "%s%s: %s", prefix, o->name, why);
	}
	return 0;
}

/* Names the first setting of group that opts does not know. Route-only
 * settings are known only where route_only is true, and elsewhere get a hint. */
static int cfg_check_known(cfg_ctx *x, const config_setting_t *group,
			   const cfg_opt *opts, size_t n, bool route_only,
			   const char *prefix)
{
	for (int i = 0; i < config_setting_length(group); i++) {
		const config_setting_t *s =
			config_setting_get_elem(group, (unsigned)i);
		const char *name = config_setting_name(s);
		bool in_route_only =
			cfg_find(cfg_route_only, CFG_N(cfg_route_only), name);
		if (cfg_find(opts, n, name) || (route_only && in_route_only))
			continue;
		if (in_route_only)
			return cfg_fail(x, s,
					"%s\"%s\" can only be set in a route",
					prefix, name);
		return cfg_fail(x, s, "%sunknown setting \"%s\"", prefix, name);
	}
	return 0;
}

/* Top-level settings a release removed. A conf written for an earlier
 * release may still name one: the value that is now the only behaviour
 * passes silently, any other is refused with the reason rather than as an
 * unknown setting. */
static const struct {
	const char *name, *kept, *why;
} cfg_removed[] = {
	{"worker_model", "fibers",
	 "worker_model was removed: workers are fibers (delete the line)"},
};

static int cfg_check_removed(cfg_ctx *x, const config_setting_t *s,
			     bool *known)
{
	const char *name = config_setting_name(s);
	for (size_t i = 0; i < CFG_N(cfg_removed); i++) {
		if (strcmp(name, cfg_removed[i].name) != 0)
			continue;
		const char *v = config_setting_type(s) == CONFIG_TYPE_STRING
					? config_setting_get_string(s)
					: NULL;
		if (!v || strcmp(v, cfg_removed[i].kept) != 0)
			return cfg_fail(x, s, "%s", cfg_removed[i].why);
		*known = true;
	}
	return 0;
}

static int cfg_check_top_known(cfg_ctx *x, const config_setting_t *root)
{
	for (int i = 0; i < config_setting_length(root); i++) {
		const config_setting_t *s =
			config_setting_get_elem(root, (unsigned)i);
		const char *name = config_setting_name(s);
		bool known = cfg_find(cfg_top, CFG_N(cfg_top), name) != NULL;
		if (cfg_check_removed(x, s, &known) < 0)
			return -1;
		for (size_t j = 0; j < CFG_N(cfg_sections); j++)
			known = known || strcmp(name, cfg_sections[j]) == 0;
		if (!known)
			return cfg_fail(x, s, "unknown setting \"%s\"", name);
	}
	return 0;
}

/* An optional top-level group: absent is fine, anything but a group is not. */
static int cfg_want_group(cfg_ctx *x, const config_setting_t *g,
			  const char *name)
{
	if (!g || config_setting_is_group(g))
		return 0;
	return cfg_fail(x, g, "%s: must be a group { ... }, not %s", name,
			cfg_type_name(g));
}

/* database = { ... } or reaper = { ... } into c. */
static int cfg_load_section(cfg_ctx *x, const config_setting_t *root,
			    const struct cfg_scope *sc, config *c)
{
	const config_setting_t *g = cfg_member(root, sc->name);
	char prefix[64];
	snprintf(prefix, sizeof prefix, "%s: ", sc->name);
	if (cfg_want_group(x, g, sc->name) < 0)
		return -1;
	if (g && cfg_check_known(x, g, sc->opts, sc->n, false, prefix) < 0)
		return -1;
	return cfg_apply(x, sc->name, sc->opts, sc->n, g, NULL, c, prefix);
}

/* ---- routes ---------------------------------------------------------- */

static void cfg_route_free(route_cfg *r)
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
	keyparts_free(&r->key_from);
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

static int cfg_route_rules(cfg_ctx *x, route_cfg *r,
			   const config_setting_t *g,
			   const config_setting_t *defaults)
{
	char a[32], b[32], c[32];
	/* An attempt sends only with this much of its lease left (proxy.c):
	 * a lease that cannot hold it would refuse every request. */
	int64_t margin = route_lease_margin_ms(r);
	if (r->lease_ms <= r->upstream_timeout_ms + margin) {
		cfg_fmt_ms(r->lease_ms, a, sizeof a);
		cfg_fmt_ms(r->upstream_timeout_ms, b, sizeof b);
		cfg_fmt_ms(margin, c, sizeof c);
		return cfg_fail(x,
				cfg_blame(g, defaults, "lease",
					  "upstream_timeout"),
				"route \"%s\": lease (%s) must be longer than "
				"upstream_timeout (%s) plus the lease margin "
				"(%s: a tenth of the lease, at least 100ms, at "
				"most 2s), since an attempt is sent only while "
				"that much of its lease is left",
				r->name, a, b, c);
	}
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
	    ip_pct_escape(r->jwt->issuer, NULL, 0) > ROUTE_JWT_ISSUER_MAX)
		return cfg_fail(x, cfg_blame(g, defaults, "jwt", "jwt"),
				"route \"%s\": jwt.issuer is too long: the "
				"stored tenant holds it in at most %d "
				"characters, with '%%', ':' and bytes outside "
				"visible ASCII written as %%XX",
				r->name, ROUTE_JWT_ISSUER_MAX);
	if (r->wait_max_ms > r->lease_ms) {
		const config_setting_t *set = cfg_member(g, "wait_max");
		if (!set)
			set = cfg_member(defaults, "wait_max");
		/* A wait never outlasts the attempt it waits for; the
		 * default follows a shorter lease. */
		if (!set) {
			r->wait_max_ms = r->lease_ms;
		} else {
			cfg_fmt_ms(r->wait_max_ms, a, sizeof a);
			cfg_fmt_ms(r->lease_ms, b, sizeof b);
			return cfg_fail(x, set,
					"route \"%s\": wait_max (%s) must not "
					"be longer than lease (%s)",
					r->name, a, b);
		}
	}
	if (r->ttl_ms <= r->lease_ms) {
		cfg_fmt_ms(r->ttl_ms, a, sizeof a);
		cfg_fmt_ms(r->lease_ms, b, sizeof b);
		return cfg_fail(x, cfg_blame(g, defaults, "ttl", "lease"),
				"route \"%s\": ttl (%s) must be longer than "
				"lease (%s)",
				r->name, a, b);
	}
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
	if (cfg_check_known(x, g, cfg_route, CFG_N(cfg_route), true, prefix) <
	    0)
		return -1;
	if (cfg_apply(x, NULL, cfg_route_only + 1, CFG_N(cfg_route_only) - 1,
		      g, NULL, r, prefix) < 0)
		return -1;
	if (cfg_apply(x, "route", cfg_route, CFG_N(cfg_route), g, defaults, r,
		      prefix) < 0)
		return -1;
	return cfg_route_rules(x, r, g, defaults);
}

/* The defaults group on its own, so a bad value there is reported as the
 * defaults' fault rather than as the first route's. */
static int cfg_check_defaults(cfg_ctx *x, const config_setting_t *d)
{
	if (!d)
		return 0;
	if (cfg_want_group(x, d, "defaults") < 0 ||
	    cfg_check_known(x, d, cfg_route, CFG_N(cfg_route), false,
			    "defaults: ") < 0)
		return -1;
	route_cfg scratch = {0};
	int rc = cfg_apply(x, "route", cfg_route, CFG_N(cfg_route), d, NULL,
			   &scratch, "defaults: ");
	cfg_route_free(&scratch);
	return rc;
}

static int cfg_load_routes(cfg_ctx *x, config *c, const config_setting_t *root,
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

/* ---- the whole file -------------------------------------------------- */

static void cfg_free(config *c)
{
	free(c->file);
	free(c->listen);
	free(c->admin_listen);
	free(c->admin_token);
	free(c->db_url);
	free(c->seal_keys_file);
	seal_keyring_free(c->seal);
	for (size_t i = 0; i < c->n_routes; i++)
		cfg_route_free(&c->routes[i]);
	free(c->routes);
	free(c);
}

/* Containers set these instead of editing the file. An empty variable counts
 * as unset, the usual way to clear one in a compose file. */
static int cfg_env_overrides(cfg_ctx *x, config *c)
{
	const char *url = getenv("IDEMPROXY_DATABASE_URL");
	if (url && *url) {
		free(c->db_url);
		c->db_url = xstrdup(url);
	}
	const char *listen = getenv("IDEMPROXY_LISTEN");
	if (!listen || !*listen)
		return 0;
	char host[256], why[CFG_WHY];
	int port;
	if (config_split_listen(listen, host, sizeof host, &port, why,
				sizeof why) < 0) {
		snprintf(x->err, x->errlen, "IDEMPROXY_LISTEN: %s", why);
		return -1;
	}
	free(c->listen);
	c->listen = xstrdup(listen);
	return 0;
}

/* store_encryption.keys names the key file; its errors carry its own
 * FILE:LINE. */
static int cfg_load_keys(cfg_ctx *x, config *c, const config_setting_t *root)
{
	if (!*c->seal_keys_file)
		return 0;
	char why[512];
	c->seal = seal_keyring_load(c->seal_keys_file, why, sizeof why);
	if (c->seal)
		return 0;
	const config_setting_t *g = cfg_member(root, "store_encryption");
	return cfg_fail(x, cfg_member(g, "keys"), "store_encryption.keys: %s",
			why);
}

static int cfg_load_all(cfg_ctx *x, config *c, const config_setting_t *root)
{
	const config_setting_t *defaults = cfg_member(root, "defaults");
	if (cfg_check_top_known(x, root) < 0 ||
	    cfg_apply(x, "top", cfg_top, CFG_N(cfg_top), root, NULL, c, "") <
		    0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_DATABASE], c) < 0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_REAPER], c) < 0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_SEAL], c) < 0 ||
	    cfg_load_keys(x, c, root) < 0 ||
	    cfg_check_defaults(x, defaults) < 0 ||
	    cfg_load_routes(x, c, root, defaults) < 0 ||
	    cfg_env_overrides(x, c) < 0)
		return -1;
	if (*c->admin_listen && strcmp(c->admin_listen, c->listen) == 0)
		return cfg_fail(x, cfg_member(root, "admin_listen"),
				"admin_listen: \"%s\" is also listen",
				c->admin_listen);
	return 0;
}

config *config_load(const char *file, char *err, size_t errlen)
{
	cfg_ctx x = {.file = file, .err = err, .errlen = errlen};
	config_t lc;
	config_init(&lc);
	errno = 0;
	if (config_read_file(&lc, file) != CONFIG_TRUE) {
		/* libconfig keeps errno from the failed open or read; a
		 * directory opens fine and fails with errno still 0. */
		int e = errno;
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
			snprintf(err, errlen, "%s: cannot read: %s", file,
				 e ? strerror(e) : "not a regular file");
		else
			snprintf(err, errlen, "%s:%d: %s",
				 config_error_file(&lc) ? config_error_file(&lc)
							: file,
				 config_error_line(&lc), config_error_text(&lc));
		config_destroy(&lc);
		return NULL;
	}

	cfg_builtin_load(&x.builtin);
	config *c = xcalloc(1, sizeof *c);
	atomic_init(&c->refs, 1);
	c->file = xstrdup(file);
	int rc = cfg_load_all(&x, c, config_root_setting(&lc));
	config_destroy(&x.builtin);
	config_destroy(&lc);
	if (rc < 0) {
		cfg_free(c);
		return NULL;
	}
	return c;
}

config *config_ref(config *c)
{
	if (c)
		atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
	return c;
}

/* acq_rel so the thread that frees sees every other holder's last use. */
void config_unref(config *c)
{
	if (!c)
		return;
	int before =
		atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel);
	IP_ASSERT(before > 0);
	if (before == 1)
		cfg_free(c);
}

const route_cfg *config_match_route(const config *c, const char *path,
				    size_t len)
{
	for (size_t i = 0; i < c->n_routes; i++)
		if (pathtpl_match(c->routes[i].tpl, path, len))
			return &c->routes[i];
	return NULL;
}

bool route_has_method(const route_cfg *r, const char *method)
{
	for (size_t i = 0; i < r->methods.n; i++)
		if (strcmp(r->methods.v[i], method) == 0)
			return true;
	return false;
}

int64_t route_lease_margin_ms(const route_cfg *r)
{
	int64_t m = r->lease_ms / 10;
	if (m < ROUTE_LEASE_MARGIN_MIN_MS)
		m = ROUTE_LEASE_MARGIN_MIN_MS;
	return m > ROUTE_LEASE_MARGIN_MAX_MS ? ROUTE_LEASE_MARGIN_MAX_MS : m;
}

bool route_releases_status(const route_cfg *r, int status)
{
	for (size_t i = 0; i < r->n_release_statuses; i++)
		if (r->release_statuses[i] == status)
			return true;
	return false;
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
		ip_buf m = {0};
		for (size_t j = 0; j < r->methods.n; j++)
			ip_buf_printf(&m, "%s%s", j ? "," : "",
				      r->methods.v[j]);
		char tenant[300], ttl[32], lease[32];
		cfg_tenant_text(r, tenant, sizeof tenant);
		cfg_fmt_ms(r->ttl_ms, ttl, sizeof ttl);
		cfg_fmt_ms(r->lease_ms, lease, sizeof lease);
		ip_buf from = {0};
		for (size_t j = 0; !r->key_from.bare && j < r->key_from.n; j++)
			ip_buf_printf(&from, "%s%s", j ? "," : " key_from=",
				      r->key_from.v[j].spec);
		fprintf(out,
			"%-*s  %-*s  -> %s  methods=%s key=%s%s tenant=%s "
			"ttl=%s lease=%s\n",
			wname, r->name, wpath, r->path, r->upstream, m.data,
			r->key_required ? "required" : "optional",
			from.data ? from.data : "", tenant, ttl, lease);
		ip_buf_free(&from);
		ip_buf_free(&m);
	}
}
