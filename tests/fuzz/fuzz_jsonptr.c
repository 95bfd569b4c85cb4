/* Fuzz target for JSON pointers and the text walker behind body: key parts.
 *
 * The input is a pointer and a document separated by the first newline.
 * Parsing must never crash and must say why it refused; locating must stay
 * inside the document whatever it holds. On a document jansson accepts
 * (no duplicate names), the walker and the jansson evaluator must agree on
 * whether the pointer names a value, and a string found must decode to the
 * string jansson holds. Removing must leave a document jansson can dump. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsonptr.h"

static void check_against_jansson(const jsonptr *p, const char *doc,
				  size_t n, enum jsonptr_found f,
				  const char *v, size_t vlen)
{
	json_error_t e;
	/* jansson skips a NUL after a number; the proxy refuses any body
	 * with a NUL before either reads it (key_from.c), so only NUL-free
	 * documents are compared. */
	if (memchr(doc, '\0', n))
		return;
	json_t *j = json_loadb(doc, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
					       JSON_DECODE_INT_AS_REAL,
			       &e);
	if (!j)
		return;
	json_t *x = jsonptr_get(p, j);
	ALWAYS_ASSERT((f == JSONPTR_FOUND) == (x != NULL));
	if (x && json_is_string(x)) {
		growbuf s = {0};
		ALWAYS_ASSERT(jsonptr_string_value(v, vlen, &s) == 0);
		ALWAYS_ASSERT(s.len == json_string_length(x));
		ALWAYS_ASSERT(s.len == 0 ||
			      memcmp(s.data, json_string_value(x), s.len) == 0);
		growbuf_free(&s);
	}
	jsonptr *const ps[] = {(jsonptr *)p, (jsonptr *)p};
	jsonptr_remove_all(ps, 2, j);
	char *out = json_dumps(j, JSON_ENCODE_ANY);
	ALWAYS_ASSERT(out != NULL);
	free(out);
	json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t plen = nl ? (size_t)(nl - data) : size;
	size_t dlen = nl ? size - plen - 1 : 0;
	char why[128] = "";
	jsonptr *p = jsonptr_parse((const char *)data, plen, why, sizeof why);
	if (!p) {
		ALWAYS_ASSERT(why[0] != '\0');
		return 0;
	}
	/* An exact-size copy, so ASan sees any read past the end. */
	char *doc = xmalloc(dlen ? dlen : 1);
	if (dlen)
		memcpy(doc, nl + 1, dlen);
	const char *v = NULL;
	size_t vlen = 0;
	enum jsonptr_found f = jsonptr_locate(p, doc, dlen, &v, &vlen);
	if (f == JSONPTR_FOUND) {
		ALWAYS_ASSERT(v >= doc && vlen > 0 && v + vlen <= doc + dlen);
		growbuf s = {0};
		(void)jsonptr_string_value(v, vlen, &s);
		growbuf_free(&s);
	}
	check_against_jansson(p, doc, dlen, f, v, vlen);
	free(doc);
	jsonptr_free(p);
	return 0;
}
