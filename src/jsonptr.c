/* JSON pointers (RFC 6901).
 *
 * Two evaluators: one over a jansson document (the fingerprint's view of the
 * body) and one over the raw text (the key's view), because a key part that
 * is a number must be the number as the client wrote it: jansson keeps 1.50
 * as the double 1.5 and refuses integers beyond 64 bits. The text walker
 * never recurses and never reads past the end, whatever it is given; the
 * caller validates the document with jansson first, so the walker does not
 * have to judge it. */
#include "jsonptr.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ptr_why(char *why, size_t whylen, const char *msg)
{
	snprintf(why, whylen, "%s", msg);
	return -1;
}

void jsonptr_free(jsonptr *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		free(p->tok[i]);
	free(p->tok);
	free(p->text);
	free(p);
}

/* One reference token, s[0..n) without its leading '/', decoded. */
static int parse_token(const char *s, size_t n, char **out, char *why,
		       size_t whylen)
{
	char *t = xmalloc(n + 1);
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '~') {
			t[o++] = s[i];
			continue;
		}
		if (i + 1 >= n || (s[i + 1] != '0' && s[i + 1] != '1')) {
			free(t);
			return ptr_why(why, whylen,
				       "'~' must be followed by 0 or 1 "
				       "(~0 is '~', ~1 is '/')");
		}
		t[o++] = s[++i] == '0' ? '~' : '/';
	}
	t[o] = '\0';
	*out = t;
	return 0;
}

jsonptr *jsonptr_parse(const char *s, size_t len, char *why, size_t whylen)
{
	if (len > JSONPTR_MAX_LEN) {
		ptr_why(why, whylen, "longer than 1024 characters");
		return NULL;
	}
	if (memchr(s, '\0', len)) {
		ptr_why(why, whylen, "contains a NUL byte");
		return NULL;
	}
	if (len > 0 && s[0] != '/') {
		ptr_why(why, whylen,
			"must be empty or start with '/' (as in \"/order/id\")");
		return NULL;
	}
	jsonptr *p = xcalloc(1, sizeof *p);
	p->text = xstrndup(s, len);
	p->tok = xcalloc(JSONPTR_MAX_TOKENS, sizeof *p->tok);
	size_t i = 0;
	while (i < len) {
		const char *seg = s + i + 1;
		const char *end = memchr(seg, '/', len - i - 1);
		size_t n = end ? (size_t)(end - seg) : len - i - 1;
		if (p->n == JSONPTR_MAX_TOKENS) {
			ptr_why(why, whylen, "more than 64 reference tokens");
			jsonptr_free(p);
			return NULL;
		}
		if (parse_token(seg, n, &p->tok[p->n], why, whylen) < 0) {
			jsonptr_free(p);
			return NULL;
		}
		p->n++;
		i += n + 1;
	}
	return p;
}

/* An array index: "0" or a decimal without a leading zero, in range. */
static bool array_index(const char *t, size_t *out)
{
	size_t n = strlen(t), v = 0;
	if (n == 0 || n > 9 || (n > 1 && t[0] == '0'))
		return false;
	for (size_t i = 0; i < n; i++) {
		if (t[i] < '0' || t[i] > '9')
			return false;
		v = v * 10 + (size_t)(t[i] - '0');
	}
	*out = v;
	return true;
}

static json_t *step(json_t *v, const char *tok)
{
	size_t idx;
	if (json_is_object(v))
		return json_object_get(v, tok);
	if (json_is_array(v) && array_index(tok, &idx))
		return json_array_get(v, idx);
	return NULL;
}

json_t *jsonptr_get(const jsonptr *p, json_t *doc)
{
	json_t *v = doc;
	for (size_t i = 0; v && i < p->n; i++)
		v = step(v, p->tok[i]);
	return v;
}

typedef struct removal {
	json_t *parent;
	json_t *value;
	const char *tok;
} removal;

static void remove_one(const removal *r)
{
	if (json_is_object(r->parent)) {
		if (json_object_get(r->parent, r->tok) == r->value)
			json_object_del(r->parent, r->tok);
		return;
	}
	/* Indices were read before anything was removed: find the element by
	 * identity. Equal singletons (true, null) may match an earlier equal
	 * element, which leaves the same document. */
	for (size_t i = 0; i < json_array_size(r->parent); i++) {
		if (json_array_get(r->parent, i) == r->value) {
			json_array_remove(r->parent, i);
			return;
		}
	}
}

void jsonptr_remove_all(jsonptr *const *ps, size_t n, json_t *doc)
{
	removal *rs = xcalloc(n ? n : 1, sizeof *rs);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const jsonptr *p = ps[i];
		if (p->n == 0)
			continue;
		json_t *parent = doc;
		for (size_t t = 0; parent && t + 1 < p->n; t++)
			parent = step(parent, p->tok[t]);
		json_t *v = parent ? step(parent, p->tok[p->n - 1]) : NULL;
		if (!v)
			continue;
		/* Held, so removing an ancestor first frees nothing that a
		 * later removal still points into. */
		rs[k++] = (removal){json_incref(parent), json_incref(v),
				    p->tok[p->n - 1]};
	}
	for (size_t i = 0; i < k; i++)
		remove_one(&rs[i]);
	for (size_t i = 0; i < k; i++) {
		json_decref(rs[i].value);
		json_decref(rs[i].parent);
	}
	free(rs);
}

/* ---- the raw text ---------------------------------------------------- */

static bool is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_ws(const char *s, size_t len, size_t *i)
{
	while (*i < len && is_ws(s[*i]))
		(*i)++;
}

/* s[*i] == '"': past the closing quote. */
static int skip_string(const char *s, size_t len, size_t *i)
{
	for (size_t j = *i + 1; j < len; j++) {
		if (s[j] == '\\') {
			j++;
			continue;
		}
		if (s[j] == '"') {
			*i = j + 1;
			return 0;
		}
	}
	return -1;
}

/* Past one value; containers by counting brackets outside strings, so
 * nesting costs no stack. */
static int skip_value(const char *s, size_t len, size_t *i)
{
	if (*i >= len)
		return -1;
	if (s[*i] == '"')
		return skip_string(s, len, i);
	if (s[*i] != '{' && s[*i] != '[') {
		size_t j = *i;
		while (j < len && !is_ws(s[j]) && !strchr(",:]}[{\"", s[j]))
			j++;
		if (j == *i)
			return -1;
		*i = j;
		return 0;
	}
	size_t depth = 0, j = *i;
	while (j < len) {
		char c = s[j];
		if (c == '"') {
			if (skip_string(s, len, &j) < 0)
				return -1;
			continue;
		}
		j++;
		if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (--depth == 0) {
				*i = j;
				return 0;
			}
		}
	}
	return -1;
}

static int hex4(const char *s, uint32_t *out)
{
	uint32_t v = 0;
	for (int k = 0; k < 4; k++) {
		char c = s[k];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint32_t)(c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

static void put_utf8(growbuf *out, uint32_t cp)
{
	char b[4];
	size_t n;
	if (cp < 0x80) {
		b[0] = (char)cp;
		n = 1;
	} else if (cp < 0x800) {
		b[0] = (char)(0xc0 | (cp >> 6));
		b[1] = (char)(0x80 | (cp & 0x3f));
		n = 2;
	} else if (cp < 0x10000) {
		b[0] = (char)(0xe0 | (cp >> 12));
		b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		b[2] = (char)(0x80 | (cp & 0x3f));
		n = 3;
	} else {
		b[0] = (char)(0xf0 | (cp >> 18));
		b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
		b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
		b[3] = (char)(0x80 | (cp & 0x3f));
		n = 4;
	}
	growbuf_append(out, b, n);
}

/* \uXXXX at s[j] (j at 'u'), a surrogate pair taken whole; *j ends on the
 * last hex digit. */
static int unicode_escape(const char *s, size_t end, size_t *j, growbuf *out)
{
	uint32_t cp, lo;
	if (*j + 4 >= end || hex4(s + *j + 1, &cp) < 0)
		return -1;
	*j += 4;
	if (cp >= 0xdc00 && cp <= 0xdfff)
		return -1;
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (*j + 6 >= end || s[*j + 1] != '\\' || s[*j + 2] != 'u' ||
		    hex4(s + *j + 3, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
			return -1;
		cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
		*j += 6;
	}
	if (cp == 0)
		return -1;
	put_utf8(out, cp);
	return 0;
}

int jsonptr_string_value(const char *s, size_t len, growbuf *out)
{
	static const char esc_in[] = "\"\\/bfnrt", esc_out[] = "\"\\/\b\f\n\r\t";
	if (len < 2 || s[0] != '"' || s[len - 1] != '"')
		return -1;
	size_t end = len - 1;
	for (size_t j = 1; j < end; j++) {
		char c = s[j];
		if ((unsigned char)c < 0x20 || c == '"')
			return -1;
		if (c != '\\') {
			growbuf_append(out, &c, 1);
			continue;
		}
		if (++j >= end)
			return -1;
		const char *e = s[j] ? strchr(esc_in, s[j]) : NULL;
		if (e) {
			growbuf_append(out, &esc_out[e - esc_in], 1);
			continue;
		}
		if (s[j] != 'u' || unicode_escape(s, end, &j, out) < 0)
			return -1;
	}
	return 0;
}

/* Is the member name literal s[a..b) equal to tok? */
static bool name_is(const char *s, size_t a, size_t b, const char *tok)
{
	growbuf name = {0};
	bool eq = jsonptr_string_value(s + a, b - a, &name) == 0 &&
		  name.len == strlen(tok) &&
		  (name.len == 0 || memcmp(name.data, tok, name.len) == 0);
	growbuf_free(&name);
	return eq;
}

/* Past the value at s[*i] and the ',' after it, to the next member or
 * element of a container that ends with close: true, or false with *end
 * saying whether the container ended (absent) or is malformed. */
static bool next_item(const char *s, size_t len, size_t *i, char close,
		      enum jsonptr_found *end)
{
	*end = JSONPTR_MALFORMED;
	if (skip_value(s, len, i) < 0)
		return false;
	skip_ws(s, len, i);
	if (*i < len && s[*i] == close) {
		*end = JSONPTR_ABSENT;
		return false;
	}
	if (*i >= len || s[*i] != ',')
		return false;
	(*i)++;
	skip_ws(s, len, i);
	return true;
}

/* From the '{' at s[*i] to the value of member tok. */
static enum jsonptr_found member(const char *s, size_t len, size_t *i,
				 const char *tok)
{
	(*i)++;
	skip_ws(s, len, i);
	if (*i < len && s[*i] == '}')
		return JSONPTR_ABSENT;
	while (*i < len) {
		size_t a = *i;
		if (s[a] != '"' || skip_string(s, len, i) < 0)
			return JSONPTR_MALFORMED;
		size_t b = *i;
		skip_ws(s, len, i);
		if (*i >= len || s[*i] != ':')
			return JSONPTR_MALFORMED;
		(*i)++;
		skip_ws(s, len, i);
		if (name_is(s, a, b, tok))
			return JSONPTR_FOUND;
		enum jsonptr_found end;
		if (!next_item(s, len, i, '}', &end))
			return end;
	}
	return JSONPTR_MALFORMED;
}

/* From the '[' at s[*i] to element tok. */
static enum jsonptr_found element(const char *s, size_t len, size_t *i,
				  const char *tok)
{
	size_t want;
	if (!array_index(tok, &want))
		return JSONPTR_ABSENT;
	(*i)++;
	skip_ws(s, len, i);
	if (*i < len && s[*i] == ']')
		return JSONPTR_ABSENT;
	for (size_t k = 0; *i < len; k++) {
		if (k == want)
			return JSONPTR_FOUND;
		enum jsonptr_found end;
		if (!next_item(s, len, i, ']', &end))
			return end;
	}
	return JSONPTR_MALFORMED;
}

enum jsonptr_found jsonptr_locate(const jsonptr *p, const char *text,
				  size_t len, const char **start,
				  size_t *vlen)
{
	size_t i = 0;
	skip_ws(text, len, &i);
	for (size_t t = 0; t < p->n; t++) {
		if (i >= len)
			return JSONPTR_MALFORMED;
		enum jsonptr_found f;
		if (text[i] == '{')
			f = member(text, len, &i, p->tok[t]);
		else if (text[i] == '[')
			f = element(text, len, &i, p->tok[t]);
		else
			f = JSONPTR_ABSENT;
		if (f != JSONPTR_FOUND)
			return f;
	}
	size_t a = i;
	if (skip_value(text, len, &i) < 0)
		return JSONPTR_MALFORMED;
	*start = text + a;
	*vlen = i - a;
	return JSONPTR_FOUND;
}
