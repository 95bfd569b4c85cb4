#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void always_assert_fail(const char *expr, const char *file, int line)
{
	fprintf(stderr, "idemproxy: assertion failed: %s (%s:%d)\n", expr, file,
		line);
	abort();
}

static void oom(size_t n)
{
	fprintf(stderr, "idemproxy: out of memory allocating %zu bytes\n", n);
	abort();
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		oom(n);
	return p;
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		oom(n * size);
	return p;
}

void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q)
		oom(n);
	return q;
}

char *xstrdup(const char *s)
{
	return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

void growbuf_reserve(growbuf *b, size_t extra)
{
	size_t need = b->len + extra + 1;
	if (need <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap *= 2;
	b->data = xrealloc(b->data, cap);
	b->cap = cap;
}

void growbuf_append(growbuf *b, const void *p, size_t n)
{
	growbuf_reserve(b, n);
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
}

void growbuf_puts(growbuf *b, const char *s)
{
	growbuf_append(b, s, strlen(s));
}

void growbuf_printf(growbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	ALWAYS_ASSERT(n >= 0);
	growbuf_reserve(b, (size_t)n);
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void growbuf_reset(growbuf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

void growbuf_free(growbuf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

static int lower(int c)
{
	return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

bool str_caseeq(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if (lower((unsigned char)*a) != lower((unsigned char)*b))
			return false;
	return *a == *b;
}

bool str_ncaseeq(const char *a, const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (lower((unsigned char)a[i]) != lower((unsigned char)b[i]))
			return false;
		if (!a[i])
			return true;
	}
	return true;
}

double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void hex_encode(const uint8_t *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

size_t pct_escape(const char *s, char *out, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t k = 0;
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		char e[3] = {(char)*c, 0, 0};
		size_t w = 1;
		if (*c == '%' || *c == ':' || *c < 0x21 || *c > 0x7e) {
			e[0] = '%';
			e[1] = hex[*c >> 4];
			e[2] = hex[*c & 15];
			w = 3;
		}
		for (size_t i = 0; i < w; i++, k++)
			if (k + 1 < n)
				out[k] = e[i];
	}
	if (n)
		out[k < n ? k : n - 1] = '\0';
	return k;
}
