/* Fuzz target for the request-head checks (http_head.h).
 *
 * The input is split at its first two NUL bytes into a method, a target and
 * a header line ("name:value", or without a colon a name alone). Besides
 * "never crash", checks what the checks promise: an accepted method or
 * target holds only the bytes allowed there (no lower case in a method, no
 * fragment, space or stray '%' in a target), an accepted value has no
 * control byte but HTAB, an accepted name only tchar; the head as a whole
 * is accepted only when each part is; the same answer every time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http_head.h"
#include "util.h"

static char *part(const uint8_t **p, const uint8_t *end)
{
	const uint8_t *z = memchr(*p, 0, (size_t)(end - *p));
	size_t n = z ? (size_t)(z - *p) : (size_t)(end - *p);
	char *s = xmalloc(n + 1);
	memcpy(s, *p, n);
	s[n] = '\0';
	*p += z ? n + 1 : n;
	return s;
}

static void check_method(const char *m)
{
	bool ok = http_head_method_ok(m);
	ALWAYS_ASSERT(ok == http_head_method_ok(m));
	if (!ok)
		return;
	ALWAYS_ASSERT(*m);
	for (const unsigned char *q = (const unsigned char *)m; *q; q++)
		ALWAYS_ASSERT(*q > 0x20 && *q < 0x7f &&
			      !(*q >= 'a' && *q <= 'z') &&
			      !strchr("\"(),/:;<=>?@[\\]{}", *q));
}

static void check_target(const char *t)
{
	bool ok = http_head_origin_form(t);
	ALWAYS_ASSERT(ok == http_head_origin_form(t));
	if (!ok)
		return;
	ALWAYS_ASSERT(t[0] == '/');
	for (size_t i = 0; t[i]; i++) {
		unsigned char ch = (unsigned char)t[i];
		ALWAYS_ASSERT(ch > 0x20 && ch < 0x7f &&
			      !strchr("#\"<>\\^`{|}[]", ch));
		if (ch == '%')
			ALWAYS_ASSERT(t[i + 1] && t[i + 2]);
	}
}

static void check_line(const char *l)
{
	const char *colon = strchr(l, ':');
	size_t nn = colon ? (size_t)(colon - l) : strlen(l);
	const char *v = colon ? colon + 1 : "";
	size_t vn = strlen(v);
	if (http_head_name_ok(l, nn)) {
		ALWAYS_ASSERT(nn > 0);
		for (size_t i = 0; i < nn; i++)
			ALWAYS_ASSERT(l[i] > 0x20 && l[i] < 0x7f &&
				      l[i] != ':' && l[i] != '"');
	}
	if (http_head_value_ok(v, vn))
		for (size_t i = 0; i < vn; i++)
			ALWAYS_ASSERT(v[i] == '\t' ||
				      (unsigned char)v[i] >= 0x20);
	/* The line as libmicrohttpd leaves it: the colon a NUL. */
	char *buf = xstrdup(l);
	if (colon) {
		buf[nn] = '\0';
		size_t gap = strspn(buf + nn + 1, " \t");
		ALWAYS_ASSERT(http_head_on_own_line(buf, nn, buf + nn + 1 + gap,
						    gap));
		if (gap)
			ALWAYS_ASSERT(!http_head_on_own_line(buf, nn,
							     buf + nn + 1 + gap,
							     gap - 1));
	}
	(void)http_head_on_own_line(buf, nn, buf + strlen(l), strlen(l));
	(void)http_head_request_id_ok(v, 64);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;
	char *m = part(&p, end);
	char *t = part(&p, end);
	char *l = part(&p, end);
	check_method(m);
	check_target(t);
	check_line(l);
	http_head h = {
		.method = m,
		.target = t,
		.version = size % 2 ? "HTTP/1.0" : "HTTP/1.1",
		.folded = size % 3 == 0,
		.hosts = size % 5 % 3,
		.te = size % 7 % 3,
		.te_value = l,
	};
	const char *why = http_head_problem(&h);
	ALWAYS_ASSERT(why == http_head_problem(&h));
	if (!why)
		ALWAYS_ASSERT(http_head_method_ok(m) &&
			      http_head_origin_form(t) && !h.folded && h.hosts <= 1 && h.te <= 1);
	else
		ALWAYS_ASSERT(*why);
	free(l);
	free(t);
	free(m);
	return 0;
}
