/* Small shared helpers: allocation that aborts on OOM, a growable buffer,
 * an assert that stays on in release builds. */
#ifndef IDEMPROXY_UTIL_H
#define IDEMPROXY_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IP_WUR __attribute__((warn_unused_result))
#define IP_UNUSED __attribute__((unused))

#define IP_ASSERT(cond)                                                        \
	do {                                                                   \
		if (!(cond))                                                   \
			ip_assert_fail(#cond, __FILE__, __LINE__);             \
	} while (0)

void ip_assert_fail(const char *expr, const char *file, int line)
	__attribute__((noreturn));

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* A growable byte buffer; data is always NUL-terminated for convenience. */
typedef struct ip_buf {
	char *data;
	size_t len;
	size_t cap;
} ip_buf;

void ip_buf_reserve(ip_buf *b, size_t extra);
void ip_buf_append(ip_buf *b, const void *p, size_t n);
void ip_buf_puts(ip_buf *b, const char *s);
void ip_buf_printf(ip_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void ip_buf_reset(ip_buf *b);
void ip_buf_free(ip_buf *b);

/* ASCII case-insensitive comparisons (header names). */
bool ip_strcaseeq(const char *a, const char *b);
bool ip_strncaseeq(const char *a, const char *b, size_t n);

/* Monotonic clock in milliseconds (double, sub-ms resolution). */
double ip_now_ms(void);
/* Unix time in ms (the wall clock: for token expiry, never for timing). */
int64_t ip_wall_ms(void);

/* s with '%', ':' and every byte outside visible ASCII percent-encoded
 * (upper-case hex), into out (n bytes, NUL-terminated, cut if short).
 * Returns the length of the whole escaped form. The result has no ':',
 * so it can be one field of a ':'-separated name. */
size_t ip_pct_escape(const char *s, char *out, size_t n);

/* Lower-case hex encoding; out must hold 2*n+1 bytes. */
void ip_hex(const uint8_t *in, size_t n, char *out);

#endif
