/* Small shared helpers: allocation that aborts on OOM, a growable buffer,
 * an assert that stays on in release builds. */
#ifndef IDEMPROXY_UTIL_H
#define IDEMPROXY_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MUST_CHECK __attribute__((warn_unused_result))
#define UNUSED_ATTR __attribute__((unused))

#define ALWAYS_ASSERT(cond)                                                        \
	do {                                                                   \
		if (!(cond))                                                   \
			always_assert_fail(#cond, __FILE__, __LINE__);             \
	} while (0)

void always_assert_fail(const char *expr, const char *file, int line)
	__attribute__((noreturn));

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* A growable byte buffer; data is always NUL-terminated for convenience. */
typedef struct growbuf {
	char *data;
	size_t len;
	size_t cap;
} growbuf;

void growbuf_reserve(growbuf *b, size_t extra);
void growbuf_append(growbuf *b, const void *p, size_t n);
void growbuf_puts(growbuf *b, const char *s);
void growbuf_printf(growbuf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void growbuf_reset(growbuf *b);
void growbuf_free(growbuf *b);

/* ASCII case-insensitive comparisons (header names). */
bool str_caseeq(const char *a, const char *b);
bool str_ncaseeq(const char *a, const char *b, size_t n);

/* Monotonic clock in milliseconds (double, sub-ms resolution). */
double mono_ms(void);
/* Unix time in ms (the wall clock: for token expiry, never for timing). */
int64_t wall_ms(void);

/* s with '%', ':' and every byte outside visible ASCII percent-encoded
 * (upper-case hex), into out (n bytes, NUL-terminated, cut if short).
 * Returns the length of the whole escaped form. The result has no ':',
 * so it can be one field of a ':'-separated name. */
size_t pct_escape(const char *s, char *out, size_t n);

/* Lower-case hex encoding; out must hold 2*n+1 bytes. */
void hex_encode(const uint8_t *in, size_t n, char *out);

#endif
