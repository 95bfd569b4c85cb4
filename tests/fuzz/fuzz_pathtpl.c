/* Fuzz target for route path templates.
 *
 * The input is a template and a path separated by the first newline (the
 * path may hold any bytes, NUL included, as pathtpl_match takes a length).
 * Matching and normalising must never crash. A template that compiles must match the path
 * it describes: each {name} filled with one segment, a trailing slash-star
 * with nothing or with further segments; without slash-star it must not
 * match that path with segments added. A template that does not compile
 * must say why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pathtpl.h"

/* The concrete path a template describes, with every {name} as "x" and a
 * trailing slash-star dropped; sets *rest when there was one. */
static char *describe(const char *tpl, bool *rest)
{
	size_t n = strlen(tpl);
	char *out = xmalloc(n + 1);
	size_t o = 0;

	*rest = n >= 2 && tpl[n - 2] == '/' && tpl[n - 1] == '*';
	if (*rest)
		n -= 2;
	for (size_t i = 0; i < n; i++) {
		if (tpl[i] == '{') {
			const char *close = memchr(tpl + i, '}', n - i);
			ALWAYS_ASSERT(close != NULL);
			out[o++] = 'x';
			i = (size_t)(close - tpl);
			continue;
		}
		out[o++] = tpl[i];
	}
	if (o == 0)
		out[o++] = '/';
	out[o] = '\0';
	return out;
}

/* Matches s as the proxy does: normalised first. */
static bool match_str(const pathtpl *t, const char *s)
{
	size_t n = strlen(s), k;
	char *norm = xmalloc(n + 1);
	const char *why;
	bool ok = pathtpl_normalize(s, n, norm, &k, &why) == 0 &&
		  pathtpl_match(t, norm, k);
	free(norm);
	return ok;
}

static void check_compiled(const pathtpl *t, const char *tpl)
{
	bool rest;
	char *path = describe(tpl, &rest);
	size_t n = strlen(path);
	char *longer = xmalloc(n + 16);

	ALWAYS_ASSERT(match_str(t, path));
	/* "/a/" + "/x/y" would hold an empty segment; append after the
	 * existing slash instead. */
	memcpy(longer, path, n);
	strcpy(longer + n, path[n - 1] == '/' ? "x/y" : "/x/y");
	ALWAYS_ASSERT(match_str(t, longer) == rest);
	free(longer);
	free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t tlen = nl ? (size_t)(nl - data) : size;
	size_t plen = nl ? size - tlen - 1 : 0;
	char *tpl = xmalloc(tlen + 1);
	char *path = xmalloc(plen ? plen : 1);
	char err[128];

	memcpy(tpl, data, tlen);
	tpl[tlen] = '\0';
	if (plen)
		memcpy(path, nl + 1, plen);

	memset(err, 0, sizeof err);
	pathtpl *t = pathtpl_compile(tpl, err, sizeof err);
	if (t == NULL) {
		ALWAYS_ASSERT(err[0] != '\0');
	} else {
		char *norm = xmalloc(plen ? plen : 1);
		size_t nlen;
		const char *why;
		if (pathtpl_normalize(path, plen, norm, &nlen, &why) == 0)
			ALWAYS_ASSERT(nlen <= plen);
		free(norm);
		bool m = pathtpl_match(t, path, plen);
		ALWAYS_ASSERT(pathtpl_match(t, path, plen) == m);
		(void)pathtpl_match(t, tpl, tlen);
		(void)pathtpl_match(t, "", 0);
		check_compiled(t, tpl);
	}
	pathtpl_free(t);
	free(path);
	free(tpl);
	return 0;
}
