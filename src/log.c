#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Set again on reload while other threads log: atomic, relaxed (a line
 * logged at the old level or format during a reload is fine). */
static _Atomic int g_level = LOG_INFO;
static atomic_bool g_json = true;
static _Atomic int64_t g_flush_ms = LOG_FLUSH_MS_DEFAULT;

static const char *level_names[] = {"error", "warn", "info", "debug"};

/* The buffer, and the one thread that writes it (ip-log). Lines are
 * appended to `fill` under fill_mu, a memcpy; the writer swaps the halves
 * and writes the full one with no lock held, so only the writer ever
 * waits for stderr. A reader that stops reading (journald, a container
 * runtime, a full pipe) stops the writer alone: once `fill` is full too,
 * lines are dropped and counted, never waited for, so the serving loop
 * never blocks on a log line. The writer reports the count in a line of
 * its own once a write goes through again. Every write is of whole lines,
 * so lines from different threads never interleave. */
#define LOG_BUF_SIZE (256 * 1024)

static pthread_mutex_t fill_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fill_cv; /* the writer waits; monotonic */
static pthread_cond_t done_cv; /* log_flush waits; monotonic */
static char halves[2][LOG_BUF_SIZE];
static char *fill = halves[0];	/* under fill_mu */
static size_t fill_len;		/* under fill_mu */
static char *spare = halves[1]; /* the writer's */
static bool urgent;		/* under fill_mu: write without waiting */
static bool writing;		/* under fill_mu: a write is in progress */
static uint64_t writes_done;	/* under fill_mu */
static uint64_t flush_gave_up = UINT64_MAX; /* under fill_mu */
static uint64_t unreported;	/* under fill_mu: dropped, not yet said */
static _Atomic uint64_t dropped_total;
static pthread_once_t writer_once = PTHREAD_ONCE_INIT;
static atomic_bool writer_up;
/* Without a writer thread (it could not start) lines are written by the
 * thread that logs them, one at a time. */
static pthread_mutex_t direct_mu = PTHREAD_MUTEX_INITIALIZER;

/* A failed write (stderr closed, EPIPE) drops what it held: there is
 * nowhere else to put it. */
static void write_all(const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

uint64_t log_lines_dropped(void)
{
	return atomic_load_explicit(&dropped_total, memory_order_relaxed);
}

static void deadline_after(struct timespec *t, int64_t ms)
{
	t->tv_sec += ms / 1000;
	t->tv_nsec += (ms % 1000) * 1000000;
	if (t->tv_nsec >= 1000000000) {
		t->tv_sec++;
		t->tv_nsec -= 1000000000;
	}
}

/* With fill_mu held and a line waiting: returns log_flush_interval after
 * the first line came, or at once when something asks for it. */
static void wait_interval(void)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!urgent) {
		/* Read again after each wake: a reload may shorten it. */
		struct timespec until = t0;
		deadline_after(&until, atomic_load_explicit(
					       &g_flush_ms, memory_order_relaxed));
		if (pthread_cond_timedwait(&fill_cv, &fill_mu, &until) ==
		    ETIMEDOUT)
			return;
	}
}

/* Says how many lines were dropped since the last report, in the half
 * just emptied: after the lines written before the drops, before those
 * that come after (a line that is itself dropped is counted again). */
static void report_dropped(uint64_t n)
{
	if (n == 0)
		return;
	log_event(LOG_WARN, "log lines dropped",
		  "count=%llu reason=\"stderr was not read; the buffer was "
		  "full\"",
		  (unsigned long long)n);
}

static void *writer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fill_mu);
	for (;;) {
		while (fill_len == 0)
			pthread_cond_wait(&fill_cv, &fill_mu);
		wait_interval();
		char *out = fill;
		size_t n = fill_len;
		fill = spare;
		fill_len = 0;
		urgent = false;
		writing = true;
		uint64_t lost = unreported;
		unreported = 0;
		pthread_mutex_unlock(&fill_mu);
		report_dropped(lost);
		write_all(out, n);
		pthread_mutex_lock(&fill_mu);
		spare = out;
		writing = false;
		writes_done++;
		pthread_cond_broadcast(&done_cv);
	}
	return NULL;
}

/* Once, at the first line. The thread blocks every signal: a SIGTERM
 * delivered to it would kill the process without the drain. The lines
 * still buffered when the process exits are written by atexit, within
 * LOG_FLUSH_DEADLINE_MS. */
static void writer_start(void)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&fill_cv, &ca);
	pthread_cond_init(&done_cv, &ca);
	pthread_condattr_destroy(&ca);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	bool up = pthread_create(&t, NULL, writer_main, NULL) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!up)
		return; /* then every line is written by its own thread */
	pthread_setname_np(t, "ip-log");
	pthread_detach(t);
	atexit(log_flush);
	atomic_store(&writer_up, true);
}

/* A flush that found the writer stuck in one write does not wait again
 * for that same write (exit's atexit flush after main's). */
void log_flush(void)
{
	if (!atomic_load(&writer_up))
		return; /* nothing is buffered without the writer */
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	deadline_after(&until, LOG_FLUSH_DEADLINE_MS);
	pthread_mutex_lock(&fill_mu);
	if (writing && writes_done == flush_gave_up) {
		pthread_mutex_unlock(&fill_mu);
		return;
	}
	urgent = true;
	pthread_cond_signal(&fill_cv);
	while (fill_len > 0 || writing) {
		if (pthread_cond_timedwait(&done_cv, &fill_mu, &until) ==
		    ETIMEDOUT) {
			flush_gave_up = writes_done;
			break;
		}
	}
	pthread_mutex_unlock(&fill_mu);
}

/* A line to be written at once is written by its own thread while that
 * cannot block: nothing is buffered before it (fill_mu held, the writer
 * idle), it fits in one atomic pipe write, and stderr has room for it now
 * (a pipe with a free page, a file, a socket under a quarter full). Then
 * it is on stderr when the call returns, as a reader tailing the log
 * expects; otherwise it goes through the writer. */
static bool write_now_ok(size_t n)
{
	if (n > PIPE_BUF)
		return false;
	struct pollfd p = {.fd = STDERR_FILENO, .events = POLLOUT};
	return poll(&p, 1, 0) == 1;
}

/* Appends one whole line, or drops it when the buffer is full; `now`
 * (warnings, errors, no flush interval) wakes the writer at once, and so
 * does a buffer half full, so that a burst is written before it fills. */
static void put(const char *s, size_t n, bool now)
{
	pthread_once(&writer_once, writer_start);
	if (!atomic_load(&writer_up)) {
		pthread_mutex_lock(&direct_mu);
		write_all(s, n);
		pthread_mutex_unlock(&direct_mu);
		return;
	}
	if (atomic_load_explicit(&g_flush_ms, memory_order_relaxed) == 0)
		now = true;
	pthread_mutex_lock(&fill_mu);
	if (now && fill_len == 0 && !writing && write_now_ok(n)) {
		write_all(s, n);
		pthread_mutex_unlock(&fill_mu);
		return;
	}
	if (n > LOG_BUF_SIZE - fill_len) {
		unreported++;
		atomic_fetch_add_explicit(&dropped_total, 1,
					  memory_order_relaxed);
		pthread_mutex_unlock(&fill_mu);
		return;
	}
	bool first = fill_len == 0;
	memcpy(fill + fill_len, s, n);
	fill_len += n;
	if (now || fill_len >= LOG_BUF_SIZE / 2) {
		urgent = true;
		pthread_cond_signal(&fill_cv);
	} else if (first) {
		pthread_cond_signal(&fill_cv);
	}
	pthread_mutex_unlock(&fill_mu);
}

void log_setup(enum log_level level, bool json, int64_t flush_ms)
{
	atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
	atomic_store_explicit(&g_json, json, memory_order_relaxed);
	atomic_store_explicit(&g_flush_ms, flush_ms, memory_order_relaxed);
	if (atomic_load(&writer_up)) {
		/* A shorter interval applies to the lines already waiting. */
		pthread_mutex_lock(&fill_mu);
		urgent = urgent || flush_ms == 0;
		pthread_cond_signal(&fill_cv);
		pthread_mutex_unlock(&fill_mu);
	}
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

#define DUMP_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10))

/* Warnings and errors are written at once; the rest is buffered. A line
 * that fits is formatted on the stack (no allocation per line). */
static void emit(enum log_level level, json_t *obj, const char *text)
{
	bool now = level <= LOG_WARN;
	if (!atomic_load_explicit(&g_json, memory_order_relaxed)) {
		put(text, strlen(text), now);
		return;
	}
	char line[2048];
	size_t n = json_dumpb(obj, line, sizeof line - 1, DUMP_FLAGS);
	if (n == 0)
		return;
	if (n < sizeof line) {
		line[n] = '\n';
		put(line, n + 1, now);
		return;
	}
	char *big = xmalloc(n + 1);
	if (json_dumpb(obj, big, n, DUMP_FLAGS) == n) {
		big[n] = '\n';
		put(big, n + 1, now);
	}
	free(big);
}

static void set_str(json_t *o, const char *k, const char *v);

/* Bytes that could end a line or confuse a terminal, as \xHH: a text line
 * stays one line whatever a value holds. */
static bool is_plain(unsigned char c)
{
	return c >= 0x20 && c < 0x7f;
}

static void put_hex(growbuf *b, unsigned char c)
{
	growbuf_printf(b, "\\x%02x", c);
}

static void put_escaped(growbuf *b, const char *s)
{
	for (; *s; s++) {
		if (is_plain((unsigned char)*s))
			growbuf_append(b, s, 1);
		else
			put_hex(b, (unsigned char)*s);
	}
}

void log_quote(growbuf *b, const char *v)
{
	bool bare = v[0] != '\0' && strcmp(v, "-") != 0;
	for (const char *c = v; *c && bare; c++)
		bare = is_plain((unsigned char)*c) && !strchr(" \"\\=", *c);
	if (bare) {
		growbuf_puts(b, v);
		return;
	}
	growbuf_puts(b, "\"");
	for (const char *c = v; *c; c++) {
		unsigned char ch = (unsigned char)*c;
		if (ch == '"' || ch == '\\') {
			char e[2] = {'\\', (char)ch};
			growbuf_append(b, e, 2);
		} else if (is_plain(ch)) {
			growbuf_append(b, c, 1);
		} else {
			put_hex(b, ch);
		}
	}
	growbuf_puts(b, "\"");
}

void log_field(growbuf *b, const char *name, const char *v)
{
	growbuf_printf(b, "%s%s=", b->len ? " " : "", name);
	if (v)
		log_quote(b, v);
	else
		growbuf_puts(b, "-");
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* A line break that ends the text, or a quoted value in it, is dropped. */
static bool at_end(const char *q)
{
	return !*q || (*q == '"' && (!q[1] || q[1] == ' '));
}

/* What replaces the blanks [p, q) after out[0..k): NULL to keep them. */
static const char *fold_sep(const char *p, const char *q, const char *out,
			    size_t k)
{
	bool brk = false, tab = false;
	for (; p < q; p++) {
		brk = brk || *p == '\n' || *p == '\r';
		tab = tab || *p == '\t';
	}
	if ((brk || tab) && at_end(q))
		return "";
	if (!brk && !tab)
		return NULL;
	if (!brk || (k > 0 && strchr(".:;?!", out[k - 1])))
		return " ";
	return "; ";
}

void log_fold_lines(char *out, size_t n, const char *in)
{
	size_t k = 0;
	if (n == 0)
		return;
	for (const char *p = in; *p && k + 1 < n;) {
		if (!is_blank(*p)) {
			out[k++] = *p++;
			continue;
		}
		const char *q = p;
		while (is_blank(*q))
			q++;
		const char *sep = fold_sep(p, q, out, k);
		if (!sep) {
			sep = p; /* plain spaces stay */
			p = q;
			while (sep < q && k + 1 < n)
				out[k++] = *sep++;
			continue;
		}
		while (*sep && k + 1 < n)
			out[k++] = *sep++;
		p = q;
	}
	out[k] = '\0';
}

void log_event(enum log_level level, const char *msg, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char ts[40];
	timestamp(ts, sizeof ts);
	char raw[4096] = "", fields[4096] = "";
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(raw, sizeof raw, fmt, ap);
		va_end(ap);
		log_fold_lines(fields, sizeof fields, raw);
	}
	json_t *o = json_object();
	json_object_set_new(o, "time", json_string(ts));
	json_object_set_new(o, "level", json_string(level_names[level]));
	json_object_set_new(o, "msg", json_string(msg));
	if (fields[0])
		set_str(o, "detail", fields);
	growbuf text = {0};
	growbuf_printf(&text, "%s %-5s ", ts, level_names[level]);
	put_escaped(&text, msg);
	if (fields[0]) {
		growbuf_puts(&text, " ");
		put_escaped(&text, fields);
	}
	growbuf_puts(&text, "\n");
	emit(level, o, text.data);
	growbuf_free(&text);
	json_decref(o);
}

/* Microsecond resolution is plenty in a log line. */
/* Milliseconds to whole microseconds. A value too large for that (or not
 * a number) is left as it is: converting it to an integer would be
 * undefined. */
static double ms3(double ms)
{
	if (!(fabs(ms) < 9e15))
		return ms;
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
		growbuf e = {0};
		put_escaped(&e, v);
		j = json_stringn(e.data ? e.data : "", e.len);
		growbuf_free(&e);
	}
	json_object_set_new(o, k, j);
}

/* The request line is written by hand, without building a jansson object
 * per request (the most frequent line: about 45k instructions of a
 * forward went into building and dumping it). It is byte for byte what
 * jansson would make of the same fields (tests/unit/test_log.c compares
 * the two): strings escaped as json_dumps escapes them, a value that is
 * not UTF-8 first turned into \xHH by put_escaped (set_str), reals as
 * jansson formats them with JSON_REAL_PRECISION(10). */

/* The length of the UTF-8 sequence at s (at most n bytes) that jansson
 * accepts (no overlong form, no surrogate, at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	uint32_t v;
	if (c < 0x80)
		return 1;
	if (c < 0xc2)
		return 0;
	if (c < 0xe0) {
		len = 2;
		v = c & 0x1f;
	} else if (c < 0xf0) {
		len = 3;
		v = c & 0x0f;
	} else if (c < 0xf5) {
		len = 4;
		v = c & 0x07;
	} else {
		return 0;
	}
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3f);
	}
	if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff) ||
	    (len == 3 && v < 0x800) || (len == 4 && v < 0x10000))
		return 0;
	return len;
}

static bool is_utf8(const char *v, size_t n)
{
	const unsigned char *s = (const unsigned char *)v;
	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(s + i, n - i);
		if (!k)
			return false;
		i += k;
	}
	return true;
}

/* As jansson's dump_string, without JSON_ENSURE_ASCII or
 * JSON_ESCAPE_SLASH. */
static void json_escaped(growbuf *b, const char *v, size_t n)
{
	size_t run = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		const char *e = NULL;
		char u[8];
		switch (c) {
		case '"': e = "\\\""; break;
		case '\\': e = "\\\\"; break;
		case '\b': e = "\\b"; break;
		case '\f': e = "\\f"; break;
		case '\n': e = "\\n"; break;
		case '\r': e = "\\r"; break;
		case '\t': e = "\\t"; break;
		default:
			if (c < 0x20) {
				snprintf(u, sizeof u, "\\u%04X", c);
				e = u;
			}
		}
		if (!e)
			continue;
		growbuf_append(b, v + run, i - run);
		growbuf_puts(b, e);
		run = i + 1;
	}
	growbuf_append(b, v + run, n - run);
}

/* ,"k": (k is one of this file's names: nothing to escape). */
static void json_key(growbuf *b, const char *k)
{
	growbuf_puts(b, ",\"");
	growbuf_puts(b, k);
	growbuf_puts(b, "\":");
}

static void put_int(growbuf *b, int64_t v)
{
	char d[24], *p = d + sizeof d;
	uint64_t u = v < 0 ? -(uint64_t)v : (uint64_t)v;
	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		*--p = '-';
	growbuf_append(b, p, (size_t)(d + sizeof d - p));
}

static void json_str_field(growbuf *b, const char *k, const char *v)
{
	json_key(b, k);
	if (!v) {
		growbuf_puts(b, "null");
		return;
	}
	size_t n = strlen(v);
	growbuf_puts(b, "\"");
	if (is_utf8(v, n)) {
		json_escaped(b, v, n);
	} else {
		growbuf e = {0};
		put_escaped(&e, v);
		json_escaped(b, e.data ? e.data : "", e.len);
		growbuf_free(&e);
	}
	growbuf_puts(b, "\"");
}

/* As jansson's jsonp_dtostr with precision 10; json_real refuses what is
 * not finite, and then the field is left out. */
static void json_real_field(growbuf *b, const char *k, double v)
{
	if (!isfinite(v))
		return;
	/* Whole thousandths below 10^7 (every duration ms3 makes, up to
	 * hours) have at most 10 significant digits: %.10g prints them
	 * exactly, in fixed notation, which integers spell without printf. */
	double t = v * 1000.0;
	if (t > -1e10 && t < 1e10 && t == (double)(int64_t)t &&
	    !(t == 0 && signbit(v))) {
		int64_t m = (int64_t)t;
		json_key(b, k);
		if (m < 0) {
			growbuf_puts(b, "-");
			m = -m;
		}
		put_int(b, m / 1000);
		int f = (int)(m % 1000);
		char frac[5] = {'.', (char)('0' + f / 100),
				(char)('0' + f / 10 % 10), (char)('0' + f % 10)};
		size_t n = 4;
		while (n > 2 && frac[n - 1] == '0')
			n--;
		growbuf_append(b, frac, n);
		return;
	}
	char d[64];
	int n = snprintf(d, sizeof d, "%.10g", v);
	if (n <= 0 || (size_t)n >= sizeof d - 3)
		return;
	if (!strchr(d, '.') && !strchr(d, 'e')) {
		memcpy(d + n, ".0", 3);
		n += 2;
	}
	char *e = strchr(d, 'e');
	if (e) {
		char *start = e + 1, *end = e + 2;
		if (*start == '-')
			start++;
		while (*end == '0')
			end++;
		if (end != start)
			memmove(start, end, strlen(end) + 1);
	}
	json_key(b, k);
	growbuf_puts(b, d);
}

void log_request_json(growbuf *b, const log_request *r, const char *ts)
{
	growbuf_puts(b, "{\"time\":\"");
	json_escaped(b, ts, strlen(ts));
	growbuf_puts(b, "\",\"level\":\"info\",\"msg\":\"request\"");
	json_str_field(b, "request_id", r->request_id);
	json_str_field(b, "trace_id", r->trace_id);
	json_str_field(b, "route", r->route);
	json_str_field(b, "method", r->method);
	json_str_field(b, "path", r->path);
	json_str_field(b, "tenant", r->tenant);
	json_str_field(b, "key", r->key);
	json_str_field(b, "outcome", r->outcome);
	json_key(b, "status");
	put_int(b, r->status);
	json_key(b, "attempt");
	put_int(b, r->attempt);
	json_real_field(b, "upstream_ms", ms3(r->upstream_ms));
	json_real_field(b, "store_ms", ms3(r->store_ms));
	json_real_field(b, "total_ms", ms3(r->total_ms));
	growbuf_puts(b, "}");
}

void log_request_line(const log_request *r)
{
	if (!log_enabled(LOG_INFO))
		return;
	char ts[40];
	timestamp(ts, sizeof ts);
	growbuf text = {0};
	if (atomic_load_explicit(&g_json, memory_order_relaxed)) {
		log_request_json(&text, r, ts);
		growbuf_puts(&text, "\n");
	} else {
		/* Client-chosen values are quoted: a key cannot add fields. */
		growbuf f = {0};
		log_field(&f, "id", r->request_id);
		log_field(&f, "trace_id", r->trace_id);
		log_field(&f, "route", r->route);
		log_field(&f, "method", r->method);
		log_field(&f, "path", r->path);
		log_field(&f, "tenant", r->tenant);
		log_field(&f, "key", r->key);
		log_field(&f, "outcome", r->outcome);
		growbuf_printf(&text,
			       "%s info  request %s status=%d attempt=%d "
			       "upstream_ms=%.2f store_ms=%.2f total_ms=%.2f\n",
			       ts, f.data, r->status, r->attempt,
			       r->upstream_ms, r->store_ms, r->total_ms);
		growbuf_free(&f);
	}
	if (text.data)
		put(text.data, text.len, false);
	growbuf_free(&text);
}
