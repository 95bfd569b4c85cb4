/* Level-filtered logging to stderr, as JSON lines or text. Every line goes
 * through a bounded buffer that one writer thread writes out, so no other
 * thread ever waits for stderr: info and debug lines (the per-request
 * lines among them) log_flush_interval after the first of them, or once
 * half the buffer is waiting; a warning or an error at once, after what is
 * buffered. When stderr is not read and the buffer is full, lines are
 * dropped and counted (log_lines_dropped), and a line says how many once
 * writing resumes. What is buffered at exit() or a return from main is
 * written (atexit), within LOG_FLUSH_DEADLINE_MS; call log_flush before
 * _exit. */
#ifndef IDEMPROXY_LOG_H
#define IDEMPROXY_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

#define LOG_FLUSH_MS_DEFAULT 100

/* The longest log_flush waits for a writer stuck on a reader that does
 * not read. */
#define LOG_FLUSH_DEADLINE_MS 2000

/* flush_ms 0: every line is handed to the writer at once. */
void log_setup(enum log_level level, bool json, int64_t flush_ms);
/* Writes what is buffered; returns when it is written, or after
 * LOG_FLUSH_DEADLINE_MS. */
void log_flush(void);
/* Lines dropped because the buffer was full, since the start. */
uint64_t log_lines_dropped(void);
bool log_enabled(enum log_level level);

/* A free-form event line: msg plus optional "k=v" pairs rendered as fields. */
void log_event(enum log_level level, const char *msg, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* in, with its line breaks folded into out (n bytes, always terminated):
 * libpq's messages span lines ("...refused\n\tIs the server...?\n"). A
 * run of blanks holding a line break becomes "; " (a space after a '.',
 * ':', ';', '?' or '!' that already ends a phrase), a run holding a tab
 * one space; a line break at the end of the text or of a quoted value
 * is dropped. log_event folds every line's fields this way. */
void log_fold_lines(char *out, size_t n, const char *in);

/* Appends v as a logfmt value: bare when it is visible ASCII without '"',
 * '\\', '=' or space (and not "-", which stands for no value), else in
 * double quotes with '"' and '\\' escaped and any other byte outside
 * 0x20-0x7e as \xHH. Log client-chosen values through this, so that they
 * cannot forge fields. */
void log_quote(growbuf *b, const char *v);
/* Appends " name=value" (no leading space when b is empty); NULL is "-". */
void log_field(growbuf *b, const char *name, const char *v);

#define log_error(...) log_event(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_event(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_event(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                         \
	do {                                                                   \
		if (log_enabled(LOG_DEBUG))                                    \
			log_event(LOG_DEBUG, __VA_ARGS__);                     \
	} while (0)

/* The one line per request (SPEC 5). Strings may be NULL. */
typedef struct log_request {
	const char *request_id;
	const char *route;
	const char *method;
	const char *path;
	const char *tenant;
	const char *key;
	const char *outcome;
	int status;
	int attempt;
	double upstream_ms;
	double store_ms;
	double total_ms;
	/* the valid traceparent's trace id (trace_ctx.h: hex by
	 * construction), or NULL; last, so positional initialisers of
	 * the fields above stay as they were */
	const char *trace_id;
} log_request;

void log_request_line(const log_request *r);
/* The request line's JSON object (no newline), with the time ts. */
void log_request_json(growbuf *b, const log_request *r, const char *ts);

#endif
