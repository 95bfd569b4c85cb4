#include "log.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

/* Set again on reload while other threads log: atomic, relaxed (a line
 * logged at the old level or format during a reload is fine). */
static _Atomic int g_level = LOG_INFO;
static atomic_bool g_json = true;

static const char *level_names[] = {"error", "warn", "info", "debug"};

void log_setup(enum log_level level, bool json)
{
	atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
	atomic_store_explicit(&g_json, json, memory_order_relaxed);
}

bool log_enabled(enum log_level level)
{
	return (int)level <=
	       atomic_load_explicit(&g_level, memory_order_relaxed);
}

static void timestamp(char *out, size_t n)
{
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + k, n - k, ".%03dZ", (int)(tv.tv_usec / 1000));
}

/* One write(2)-sized fputs per line keeps lines from different threads whole. */
static void emit(json_t *obj, const char *text)
{
	if (atomic_load_explicit(&g_json, memory_order_relaxed)) {
		char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER |
					   JSON_REAL_PRECISION(10));
		if (s) {
			size_t n = strlen(s);
			s[n] = '\n';
			fwrite(s, 1, n + 1, stderr);
			free(s);
		}
	} else {
		fputs(text, stderr);
	}
	fflush(stderr);
}

static void set_str(json_t *o, const char *k, const char *v);

/* Bytes that could end a line or confuse a terminal, as \xHH: a text line
 * stays one line whatever a value holds. */
static bool is_plain(unsigned char c)
{
	return c >= 0x20 && c < 0x7f;
}

static void put_hex(ip_buf *b, unsigned char c)
{
	ip_buf_printf(b, "\\x%02x", c);
}

static void put_escaped(ip_buf *b, const char *s)
{
	for (; *s; s++) {
		if (is_plain((unsigned char)*s))
			ip_buf_append(b, s, 1);
		else
			put_hex(b, (unsigned char)*s);
	}
}

void log_quote(ip_buf *b, const char *v)
{
	bool bare = v[0] != '\0' && strcmp(v, "-") != 0;
	for (const char *c = v; *c && bare; c++)
		bare = is_plain((unsigned char)*c) && !strchr(" \"\\=", *c);
	if (bare) {
		ip_buf_puts(b, v);
		return;
	}
	ip_buf_puts(b, "\"");
	for (const char *c = v; *c; c++) {
		unsigned char ch = (unsigned char)*c;
		if (ch == '"' || ch == '\\') {
			char e[2] = {'\\', (char)ch};
			ip_buf_append(b, e, 2);
		} else if (is_plain(ch)) {
			ip_buf_append(b, c, 1);
		} else {
			put_hex(b, ch);
		}
	}
	ip_buf_puts(b, "\"");
}

void log_field(ip_buf *b, const char *name, const char *v)
{
	ip_buf_printf(b, "%s%s=", b->len ? " " : "", name);
	if (v)
		log_quote(b, v);
	else
		ip_buf_puts(b, "-");
}

void log_event(enum log_level level, const char *msg, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char ts[40];
	timestamp(ts, sizeof ts);
	char fields[4096] = "";
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(fields, sizeof fields, fmt, ap);
		va_end(ap);
	}
	json_t *o = json_object();
	json_object_set_new(o, "time", json_string(ts));
	json_object_set_new(o, "level", json_string(level_names[level]));
	json_object_set_new(o, "msg", json_string(msg));
	if (fields[0])
		set_str(o, "detail", fields);
	ip_buf text = {0};
	ip_buf_printf(&text, "%s %-5s ", ts, level_names[level]);
	put_escaped(&text, msg);
	if (fields[0]) {
		ip_buf_puts(&text, " ");
		put_escaped(&text, fields);
	}
	ip_buf_puts(&text, "\n");
	emit(o, text.data);
	ip_buf_free(&text);
	json_decref(o);
}

/* Microsecond resolution is plenty in a log line. */
static double ms3(double ms)
{
	return (double)(int64_t)(ms * 1000.0 + 0.5) / 1000.0;
}

/* A value that is not UTF-8 (a path with a raw high byte) is logged with
 * its odd bytes as \xHH rather than dropped. */
static void set_str(json_t *o, const char *k, const char *v)
{
	if (!v) {
		json_object_set_new(o, k, json_null());
		return;
	}
	json_t *j = json_stringn(v, strlen(v));
	if (!j) {
		ip_buf e = {0};
		put_escaped(&e, v);
		j = json_stringn(e.data ? e.data : "", e.len);
		ip_buf_free(&e);
	}
	json_object_set_new(o, k, j);
}

void log_request_line(const log_request *r)
{
	if (!log_enabled(LOG_INFO))
		return;
	char ts[40];
	timestamp(ts, sizeof ts);
	json_t *o = json_object();
	json_object_set_new(o, "time", json_string(ts));
	json_object_set_new(o, "level", json_string("info"));
	json_object_set_new(o, "msg", json_string("request"));
	set_str(o, "request_id", r->request_id);
	set_str(o, "route", r->route);
	set_str(o, "method", r->method);
	set_str(o, "path", r->path);
	set_str(o, "tenant", r->tenant);
	set_str(o, "key", r->key);
	set_str(o, "outcome", r->outcome);
	json_object_set_new(o, "status", json_integer(r->status));
	json_object_set_new(o, "attempt", json_integer(r->attempt));
	json_object_set_new(o, "upstream_ms", json_real(ms3(r->upstream_ms)));
	json_object_set_new(o, "store_ms", json_real(ms3(r->store_ms)));
	json_object_set_new(o, "total_ms", json_real(ms3(r->total_ms)));
	ip_buf text = {0};
	if (!atomic_load_explicit(&g_json, memory_order_relaxed)) {
		/* Client-chosen values are quoted: a key cannot add fields. */
		ip_buf f = {0};
		log_field(&f, "id", r->request_id);
		log_field(&f, "route", r->route);
		log_field(&f, "method", r->method);
		log_field(&f, "path", r->path);
		log_field(&f, "tenant", r->tenant);
		log_field(&f, "key", r->key);
		log_field(&f, "outcome", r->outcome);
		ip_buf_printf(&text,
			      "%s info  request %s status=%d attempt=%d "
			      "upstream_ms=%.2f store_ms=%.2f total_ms=%.2f\n",
			      ts, f.data, r->status, r->attempt,
			      r->upstream_ms, r->store_ms, r->total_ms);
		ip_buf_free(&f);
	}
	emit(o, text.data);
	ip_buf_free(&text);
	json_decref(o);
}
