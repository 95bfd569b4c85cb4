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

void log_event(enum log_level level, const char *msg, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char ts[40];
	timestamp(ts, sizeof ts);
	char fields[1024] = "";
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
		json_object_set_new(o, "detail", json_string(fields));
	ip_buf text = {0};
	ip_buf_printf(&text, "%s %-5s %s%s%s\n", ts, level_names[level], msg,
		      fields[0] ? " " : "", fields);
	emit(o, text.data);
	ip_buf_free(&text);
	json_decref(o);
}

/* Microsecond resolution is plenty in a log line. */
static double ms3(double ms)
{
	return (double)(int64_t)(ms * 1000.0 + 0.5) / 1000.0;
}

static void set_str(json_t *o, const char *k, const char *v)
{
	json_object_set_new(o, k, v ? json_stringn(v, strlen(v)) : json_null());
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
	if (!atomic_load_explicit(&g_json, memory_order_relaxed))
		ip_buf_printf(&text,
			      "%s info  request id=%s route=%s method=%s "
			      "path=%s tenant=%s key=%s outcome=%s status=%d "
			      "attempt=%d upstream_ms=%.2f store_ms=%.2f "
			      "total_ms=%.2f\n",
			      ts, r->request_id ? r->request_id : "-",
			      r->route ? r->route : "-",
			      r->method ? r->method : "-",
			      r->path ? r->path : "-",
			      r->tenant ? r->tenant : "-",
			      r->key ? r->key : "-",
			      r->outcome ? r->outcome : "-", r->status,
			      r->attempt, r->upstream_ms, r->store_ms,
			      r->total_ms);
	emit(o, text.data);
	ip_buf_free(&text);
	json_decref(o);
}
