/* The conf loader's generic converters: what a settings-table row names to
 * turn one setting into a value (strings, numbers, durations, sizes,
 * choices, listen addresses), with the checks and messages they share.
 * Each writes the reason of a bad value into why, without file, line or
 * setting name: the table walk (config.c) adds those. */
#include "config.h"
#include "config_table.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problem.h"
#include "units.h"

/* ---- errors ---------------------------------------------------------- */

/* Settings without a line of their own report the nearest enclosing group's. */
__attribute__((format(printf, 3, 4))) int
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

__attribute__((format(printf, 3, 4))) int
cfg_why(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return -1;
}

/* ---- formatting ------------------------------------------------------ */

void cfg_fmt_ms(int64_t ms, char *buf, size_t n)
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
bool cfg_is_token(const char *s)
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

bool cfg_span_is(const char *s, size_t n, const char *allowed)
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
int cfg_check_upstream(const char *url, char **out, char *why, size_t whylen)
{
	const char *scheme = NULL;
	if (str_ncaseeq(url, "http://", 7))
		scheme = "http://";
	else if (str_ncaseeq(url, "https://", 8))
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

const char *cfg_type_name(const config_setting_t *s)
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

bool cfg_is_int(const config_setting_t *s)
{
	int t = config_setting_type(s);
	return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
}

bool cfg_is_seq(const config_setting_t *s)
{
	int t = config_setting_type(s);
	return t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST;
}

int cfg_want_string(const config_setting_t *s, const char *what, char *why,
		    size_t whylen)
{
	if (config_setting_type(s) == CONFIG_TYPE_STRING)
		return 0;
	return cfg_why(why, whylen, "must be %s, not %s", what,
		       cfg_type_name(s));
}

int cfg_conv_string(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, char *) = xstrdup(config_setting_get_string(s));
	return 0;
}

/* An absolute URI of at most o->max bytes (empty allowed when o->min is
 * 0): it goes into problem bodies and a Link header as it is. */
int cfg_conv_uri(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen)
{
	if (cfg_want_string(s, "a string", why, whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	size_t n = strlen(v);
	if (n == 0 && o->min == 0) {
		*CFG_DST(o, base, char *) = xstrdup(v);
		return 0;
	}
	if (n < (size_t)o->min || n > (size_t)o->max)
		return cfg_why(why, whylen, "must be %lld to %lld bytes long",
			       (long long)(o->min ? o->min : 1),
			       (long long)o->max);
	if (!problem_uri_ok(v, why, whylen))
		return -1;
	*CFG_DST(o, base, char *) = xstrdup(v);
	return 0;
}

/* An integer setting within the option's bounds, into *v. */
static int int_in_range(const cfg_opt *o, const config_setting_t *s,
			long long *v, char *why, size_t whylen)
{
	if (!cfg_is_int(s))
		return cfg_why(why, whylen, "must be an integer, not %s",
			       cfg_type_name(s));
	*v = config_setting_get_int64(s);
	if (*v < o->min || *v > o->max)
		return cfg_why(why, whylen,
			       "%lld is out of range %" PRId64 "..%" PRId64, *v,
			       o->min, o->max);
	return 0;
}

int cfg_conv_int(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen)
{
	long long v = 0;
	if (int_in_range(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, int) = (int)v;
	return 0;
}

int cfg_conv_int64(const cfg_opt *o, const config_setting_t *s, void *base,
		   char *why, size_t whylen)
{
	long long v = 0;
	if (int_in_range(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, int64_t) = (int64_t)v;
	return 0;
}

int cfg_conv_duration(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen)
{
	if (cfg_want_string(s, "a duration string such as \"30s\"", why,
			    whylen) < 0)
		return -1;
	const char *v = config_setting_get_string(s);
	int64_t ms;
	if (parse_duration_ms(v, &ms) < 0)
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

int cfg_conv_size(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen)
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
		if (parse_size(v, &b) < 0)
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
	growbuf b = {0};
	for (const cfg_choice *c = o->choices; c->name; c++)
		growbuf_printf(&b, "%s%s%s%s",
			       c == o->choices ? "" : c[1].name ? ", " : " or ",
			       quote, c->name, quote);
	cfg_why(why, whylen, "must be %s", b.data);
	growbuf_free(&b);
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

int cfg_conv_enum(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen)
{
	int v;
	if (cfg_choose(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, int) = v;
	return 0;
}

int cfg_conv_flag(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen)
{
	int v;
	if (cfg_choose(o, s, &v, why, whylen) < 0)
		return -1;
	*CFG_DST(o, base, bool) = v != 0;
	return 0;
}

/* An integer from a fixed set (mismatch_status). */
int cfg_conv_int_choice(const cfg_opt *o, const config_setting_t *s, void *base,
			char *why, size_t whylen)
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

int cfg_conv_listen(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen)
{
	return cfg_listen(o, s, base, false, why, whylen);
}

/* "" switches the listener off. */
int cfg_conv_listen_or_off(const cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen)
{
	return cfg_listen(o, s, base, true, why, whylen);
}

void cfg_list_free(str_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* A list or array of strings, each checked by ok(); bad elements are
 * reported by value. */
int cfg_strings(const config_setting_t *s, str_list *out, const char *what,
		bool (*ok)(const char *), char *why, size_t whylen)
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
