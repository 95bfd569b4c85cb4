/* The key of a request from its parts (`key_from`).
 *
 * Each part's value obeys the rules of the Idempotency-Key header (1-255
 * characters of visible ASCII or space), so a joined key is as safe to log,
 * store and put in an admin URL as a header key. The parts are joined as
 * netstrings, each length-prefixed, so that no two different lists of
 * values join to the same key. */
#include "key_from.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "http_msg.h"

#define KP_WHY(why, whylen, ...) (snprintf(why, whylen, __VA_ARGS__), -1)

static bool is_tchar(unsigned char c)
{
	return isalnum(c) || (c != 0 && strchr("!#$%&'*+-.^_`|~", c));
}

static bool is_token(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!is_tchar((unsigned char)*s))
			return false;
	return true;
}

static bool visible(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
			return false;
	return true;
}

int key_from_parse_part(const char *spec, key_part *out, char *why,
			size_t whylen)
{
	memset(out, 0, sizeof *out);
	if (strncmp(spec, "header:", 7) == 0) {
		if (!is_token(spec + 7))
			return KP_WHY(why, whylen,
				      "\"%s\": \"%s\" is not a header name",
				      spec, spec + 7);
		out->source = KP_HEADER;
		out->name = xstrdup(spec + 7);
		out->is_key_header = str_caseeq(out->name, "Idempotency-Key");
	} else if (strncmp(spec, "query:", 6) == 0) {
		if (!visible(spec + 6))
			return KP_WHY(why, whylen,
				      "\"%s\" needs a parameter name of "
				      "visible ASCII after ':'",
				      spec);
		out->source = KP_QUERY;
		out->name = xstrdup(spec + 6);
	} else if (strncmp(spec, "body:", 5) == 0) {
		char pwhy[128];
		out->ptr = jsonptr_parse(spec + 5, strlen(spec + 5), pwhy,
					 sizeof pwhy);
		if (!out->ptr)
			return KP_WHY(why, whylen,
				      "\"%s\": bad JSON pointer: %s", spec,
				      pwhy);
		out->source = KP_BODY;
	} else {
		return KP_WHY(why, whylen,
			      "\"%s\" must be \"header:NAME\", \"query:NAME\" "
			      "or \"body:/json/pointer\"",
			      spec);
	}
	out->spec = xstrdup(spec);
	return 0;
}

static void part_free(key_part *p)
{
	free(p->spec);
	free(p->name);
	jsonptr_free(p->ptr);
}

static bool same_part(const key_part *a, const key_part *b)
{
	if (a->source != b->source)
		return false;
	if (a->source == KP_HEADER)
		return str_caseeq(a->name, b->name);
	if (a->source == KP_QUERY)
		return strcmp(a->name, b->name) == 0;
	return strcmp(a->ptr->text, b->ptr->text) == 0;
}

int key_from_add(key_from_cfg *kp, key_part *part, char *why, size_t whylen)
{
	int rc = 0;
	if (kp->n == KEY_FROM_MAX_PARTS)
		rc = KP_WHY(why, whylen, "at most %d parts",
			    KEY_FROM_MAX_PARTS);
	for (size_t i = 0; rc == 0 && i < kp->n; i++)
		if (same_part(&kp->v[i], part))
			rc = KP_WHY(why, whylen, "\"%s\" is listed twice",
				    part->spec);
	if (rc) {
		part_free(part);
		return -1;
	}
	kp->v = xrealloc(kp->v, (kp->n + 1) * sizeof *kp->v);
	kp->v[kp->n++] = *part;
	kp->bare = kp->n == 1 && kp->v[0].is_key_header;
	kp->needs_body = kp->needs_body || part->source == KP_BODY;
	return 0;
}

void key_from_free(key_from_cfg *kp)
{
	if (!kp)
		return;
	for (size_t i = 0; i < kp->n; i++)
		part_free(&kp->v[i]);
	free(kp->v);
	kp->v = NULL;
	kp->n = 0;
}

bool key_from_uses_header(const key_from_cfg *kp, const char *name)
{
	for (size_t i = 0; kp && i < kp->n; i++)
		if (kp->v[i].source == KP_HEADER &&
		    str_caseeq(kp->v[i].name, name))
			return true;
	return false;
}

/* ---- values ---------------------------------------------------------- */

/* The same rules as the header's key. */
static const char *value_problem(const char *v, size_t n)
{
	if (n == 0)
		return "is empty";
	if (n > KEY_LEN_MAX)
		return "is longer than 255 characters";
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e)
			return "contains a control character or non-ASCII "
			       "byte";
	return NULL;
}

static enum key_from_result missing(key_from_key *out, const key_part *p,
				    const char *why)
{
	snprintf(out->detail, sizeof out->detail, "the key part %s %s",
		 p->spec, why);
	return KEY_FROM_MISSING;
}

static enum key_from_result invalid(key_from_key *out, const key_part *p,
				    const char *why)
{
	snprintf(out->detail, sizeof out->detail, "the key part %s %s",
		 p->spec, why);
	return KEY_FROM_INVALID;
}

static enum key_from_result check_value(key_from_key *out, const key_part *p,
					const char *v, size_t n)
{
	const char *why = value_problem(v, n);
	return why ? invalid(out, p, why) : KEY_FROM_OK;
}

static enum key_from_result header_part(const key_part *p,
					const key_from_request *rq,
					key_from_key *out, growbuf *val)
{
	size_t count = header_list_count(rq->headers, p->name);
	const char *v = header_list_get(rq->headers, p->name);
	if (count == 0)
		return missing(out, p, "is missing: send the header");
	if (count > 1 && p->is_key_header) {
		snprintf(out->detail, sizeof out->detail,
			 "send exactly one Idempotency-Key header");
		return KEY_FROM_INVALID;
	}
	if (count > 1)
		return invalid(out, p, "is sent more than once");
	if (!p->is_key_header) {
		growbuf_puts(val, v);
		return check_value(out, p, v, strlen(v));
	}
	size_t klen;
	const char *why = NULL;
	if (key_header_parse(v, strlen(v), out->header_key, &klen, &why) != 0) {
		snprintf(out->detail, sizeof out->detail, "%s",
			 why ? why : "malformed Idempotency-Key");
		out->header_key[0] = '\0';
		return KEY_FROM_INVALID;
	}
	growbuf_append(val, out->header_key, klen);
	return KEY_FROM_OK;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)tolower((unsigned char)c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* application/x-www-form-urlencoded: '+' is a space, %XX a byte. */
static int form_decode(const char *s, size_t n, growbuf *out)
{
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (c == '%') {
			if (i + 2 >= n)
				return -1;
			int a = hexval(s[i + 1]), b = hexval(s[i + 2]);
			if (a < 0 || b < 0)
				return -1;
			c = (char)(a * 16 + b);
			i += 2;
		} else if (c == '+') {
			c = ' ';
		}
		growbuf_append(out, &c, 1);
	}
	return 0;
}

static enum key_from_result query_part(const key_part *p,
				       const key_from_request *rq,
				       key_from_key *out, growbuf *val)
{
	const char *s = rq->query ? rq->query : "";
	size_t n = rq->query ? rq->query_len : 0, found = 0;
	bool bad = false;
	for (size_t i = 0; i <= n && n > 0;) {
		const char *amp = memchr(s + i, '&', n - i);
		size_t e = amp ? (size_t)(amp - s) : n;
		const char *eq = memchr(s + i, '=', e - i);
		size_t ne = eq ? (size_t)(eq - s) : e;
		growbuf name = {0};
		if (form_decode(s + i, ne - i, &name) == 0 && name.len &&
		    strlen(p->name) == name.len &&
		    memcmp(name.data, p->name, name.len) == 0) {
			found++;
			growbuf_reset(val);
			size_t vs = eq ? ne + 1 : e;
			bad = form_decode(s + vs, e - vs, val) < 0;
		}
		growbuf_free(&name);
		i = e + 1;
		if (!amp)
			break;
	}
	if (found == 0)
		return missing(out, p, "is missing: add the parameter");
	if (found > 1)
		return invalid(out, p, "is sent more than once");
	if (bad)
		return invalid(out, p, "has a malformed %-escape");
	return check_value(out, p, val->data ? val->data : "", val->len);
}

typedef struct body_state {
	int checked;        /* 0 not yet, 1 JSON, -1 not JSON */
	char why[96];
} body_state;

static void check_body(const key_from_request *rq, body_state *b)
{
	char mt[128];
	fp_media_type(rq->content_type, mt, sizeof mt);
	b->checked = -1;
	if (!fp_is_json_media_type(mt)) {
		snprintf(b->why, sizeof b->why,
			 "needs a JSON body (the Content-Type is \"%.40s\")",
			 mt);
		return;
	}
	json_error_t jerr;
	/* A NUL byte is never JSON text (RFC 8259), but jansson skips one
	 * after a number while the walker that finds the parts does not:
	 * refuse the body rather than let the two read it differently. */
	if (rq->body_len && memchr(rq->body, '\0', rq->body_len)) {
		snprintf(b->why, sizeof b->why,
			 "needs a JSON body, and the body is not valid JSON "
			 "(it holds a NUL byte)");
		return;
	}
	/* Integers as reals: one beyond 64 bits is valid JSON, and its text
	 * is what the key gets. */
	json_t *doc = json_loadb(rq->body ? rq->body : "", rq->body_len,
				 JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
					 JSON_DECODE_INT_AS_REAL,
				 &jerr);
	if (!doc) {
		snprintf(b->why, sizeof b->why,
			 "needs a JSON body, and the body is not valid JSON "
			 "(or repeats a member name)");
		return;
	}
	json_decref(doc);
	b->checked = 1;
}

static enum key_from_result body_part(const key_part *p,
				      const key_from_request *rq,
				      key_from_key *out, growbuf *val,
				      body_state *b)
{
	if (b->checked == 0)
		check_body(rq, b);
	if (b->checked < 0)
		return missing(out, p, b->why);
	const char *v;
	size_t n;
	enum jsonptr_found f = jsonptr_locate(p->ptr, rq->body, rq->body_len,
					      &v, &n);
	if (f != JSONPTR_FOUND)
		return missing(out, p, "is not in the body");
	switch (v[0]) {
	case '"':
		if (jsonptr_string_value(v, n, val) < 0)
			return invalid(out, p, "is a string that cannot be "
					       "read");
		return check_value(out, p, val->data ? val->data : "",
				   val->len);
	case '{':
		return invalid(out, p, "is an object; it must be a string "
				       "or a number");
	case '[':
		return invalid(out, p, "is an array; it must be a string or "
				       "a number");
	case 'n':
		return invalid(out, p, "is null; it must be a string or a "
				       "number");
	case 't':
	case 'f':
		return invalid(out, p, "is a boolean; it must be a string or "
				       "a number");
	default:
		/* A number, as the client wrote it. */
		growbuf_append(val, v, n);
		return check_value(out, p, v, n);
	}
}

/* Is any part present at all? Decides an optional key's pass-through. */
static bool any_present(const key_from_cfg *kp, const key_from_request *rq)
{
	for (size_t i = 0; i < kp->n; i++) {
		const key_part *p = &kp->v[i];
		if (p->source == KP_HEADER &&
		    header_list_count(rq->headers, p->name) > 0)
			return true;
		if (p->source == KP_QUERY || p->source == KP_BODY) {
			key_from_key scratch;
			growbuf v = {0};
			body_state b = {0};
			enum key_from_result r =
				p->source == KP_QUERY
					? query_part(p, rq, &scratch, &v)
					: body_part(p, rq, &scratch, &v, &b);
			growbuf_free(&v);
			if (r != KEY_FROM_MISSING)
				return true;
		}
	}
	return false;
}

enum key_from_result key_from_key_of(const key_from_cfg *kp,
				     const key_from_request *rq,
				     key_from_key *out)
{
	out->key[0] = out->header_key[0] = out->detail[0] = '\0';
	growbuf joined = {0}, val = {0};
	body_state b = {0};
	enum key_from_result r = KEY_FROM_OK;
	for (size_t i = 0; r == KEY_FROM_OK && i < kp->n; i++) {
		const key_part *p = &kp->v[i];
		growbuf_reset(&val);
		if (p->source == KP_HEADER)
			r = header_part(p, rq, out, &val);
		else if (p->source == KP_QUERY)
			r = query_part(p, rq, out, &val);
		else
			r = body_part(p, rq, out, &val, &b);
		if (r != KEY_FROM_OK)
			break;
		if (kp->bare)
			growbuf_append(&joined, val.data, val.len);
		else
			growbuf_printf(&joined, "%zu:%.*s,", val.len,
				       (int)val.len, val.data ? val.data : "");
	}
	if (r == KEY_FROM_OK && joined.len > KEY_FROM_KEY_MAX) {
		snprintf(out->detail, sizeof out->detail,
			 "the key parts are longer than %d characters "
			 "together",
			 KEY_FROM_KEY_MAX);
		r = KEY_FROM_INVALID;
	}
	if (r == KEY_FROM_OK)
		memcpy(out->key, joined.data, joined.len + 1);
	growbuf_free(&joined);
	growbuf_free(&val);
	/* Only a missing part needs the question answered. */
	if (r == KEY_FROM_MISSING && !any_present(kp, rq))
		return KEY_FROM_NONE;
	return r;
}
