#include "coding.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* One element of a comma-separated list: the coding name, whether its
 * weight is q=0, and the whole element (trimmed). */
typedef struct coding_elem {
	const char *name, *all;
	size_t name_len, all_len;
	bool refused;
} coding_elem;

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* q=0, q=0., q=0.0 ... q=0.000 (RFC 9110 12.4.2) */
static bool weight_is_zero(const char *p, const char *end)
{
	while (p < end && is_ows(*p))
		p++;
	if (end - p < 2 || (p[0] != 'q' && p[0] != 'Q') || p[1] != '=')
		return false;
	p += 2;
	if (p == end || *p != '0')
		return false;
	for (p++; p < end && !is_ows(*p) && *p != ';'; p++)
		if (*p != '.' && *p != '0')
			return false;
	return true;
}

/* Parses the element in [s, e); false for an empty one. */
static bool parse_elem(const char *s, const char *e, coding_elem *out)
{
	while (s < e && is_ows(*s))
		s++;
	while (e > s && is_ows(e[-1]))
		e--;
	if (s == e)
		return false;
	const char *semi = memchr(s, ';', (size_t)(e - s));
	const char *ne = semi ? semi : e;
	while (ne > s && is_ows(ne[-1]))
		ne--;
	out->name = s;
	out->name_len = (size_t)(ne - s);
	out->all = s;
	out->all_len = (size_t)(e - s);
	out->refused = false;
	/* the weight is the first parameter, but look at each */
	for (const char *p = semi; p && p < e;) {
		const char *next = memchr(p + 1, ';', (size_t)(e - p - 1));
		if (weight_is_zero(p + 1, next ? next : e))
			out->refused = true;
		p = next;
	}
	return true;
}

typedef bool (*elem_fn)(const coding_elem *el, void *arg);

/* Calls fn for each element of every `name` header; stops when it returns
 * false. Returns how many headers there were. */
static size_t each_elem(const header_list *h, const char *name, elem_fn fn,
			void *arg)
{
	size_t n = 0;
	for (size_t i = 0; i < h->n; i++) {
		if (!str_caseeq(h->v[i].name, name))
			continue;
		n++;
		const char *p = h->v[i].value, *end = p + strlen(p);
		while (p <= end) {
			const char *c = memchr(p, ',', (size_t)(end - p));
			coding_elem el;
			if (parse_elem(p, c ? c : end, &el) && !fn(&el, arg))
				return n;
			if (!c)
				break;
			p = c + 1;
		}
	}
	return n;
}

static bool name_is(const char *s, size_t n, const char *name)
{
	return strlen(name) == n && str_ncaseeq(s, name, n);
}

/* x-gzip is gzip (RFC 9110 8.4.1.3). */
static bool same_coding(const char *a, size_t an, const char *b, size_t bn)
{
	if (name_is(a, an, "x-gzip")) {
		a = "gzip";
		an = 4;
	}
	if (name_is(b, bn, "x-gzip")) {
		b = "gzip";
		bn = 4;
	}
	return an == bn && str_ncaseeq(a, b, an);
}

static bool decodable(const char *s, size_t n)
{
	return name_is(s, n, "gzip") || name_is(s, n, "x-gzip") ||
	       name_is(s, n, "deflate") || name_is(s, n, "identity");
}

static bool join_elem(const coding_elem *el, void *arg)
{
	growbuf *out = arg;
	if (name_is(el->name, el->name_len, "identity"))
		return true;
	if (out->len)
		growbuf_puts(out, ", ");
	growbuf_append(out, el->name, el->name_len);
	return true;
}

bool coding_of(const header_list *resp, growbuf *out)
{
	growbuf_reset(out);
	each_elem(resp, "Content-Encoding", join_elem, out);
	return out->len > 0;
}

typedef struct accept_q {
	const char *name;
	size_t name_len;
	int explicit_ok; /* -1 not named, 0 refused, 1 accepted */
	int star_ok;
} accept_q;

static bool look_up(const coding_elem *el, void *arg)
{
	accept_q *q = arg;
	if (name_is(el->name, el->name_len, "*"))
		q->star_ok = !el->refused;
	else if (same_coding(el->name, el->name_len, q->name, q->name_len))
		q->explicit_ok = !el->refused;
	return true;
}

static bool accepts_one(const header_list *req, const char *c, size_t n)
{
	if (name_is(c, n, "identity"))
		return true; /* what a replay falls back to anyway */
	accept_q q = {c, n, -1, -1};
	if (!each_elem(req, "Accept-Encoding", look_up, &q))
		return false;
	if (q.explicit_ok >= 0)
		return q.explicit_ok;
	return q.star_ok > 0;
}

typedef struct accept_all {
	const header_list *req;
	bool ok;
} accept_all;

static bool check_one(const coding_elem *el, void *arg)
{
	accept_all *a = arg;
	if (!accepts_one(a->req, el->name, el->name_len))
		a->ok = false;
	return a->ok;
}

bool coding_accepted(const header_list *req, const char *ce)
{
	header_list one = {0};
	header_list_add(&one, "Content-Encoding", 16, ce, strlen(ce));
	accept_all a = {req, true};
	each_elem(&one, "Content-Encoding", check_one, &a);
	header_list_free(&one);
	return a.ok;
}

static bool keep_decodable(const coding_elem *el, void *arg)
{
	growbuf *out = arg;
	if (!decodable(el->name, el->name_len))
		return true;
	if (out->len)
		growbuf_puts(out, ", ");
	growbuf_append(out, el->all, el->all_len);
	return true;
}

bool coding_upstream_accept(const header_list *req, growbuf *out)
{
	growbuf_reset(out);
	if (!each_elem(req, "Accept-Encoding", keep_decodable, out))
		return false;
	if (!out->len)
		growbuf_puts(out, "identity");
	return true;
}

/* One zlib pass: windowBits 16 + 15 is gzip (members may follow one
 * another), 15 the zlib format, -15 raw deflate. */
static int inflate_into(const char *in, size_t len, int wbits, int64_t max,
			growbuf *out, char *err, size_t errlen)
{
	z_stream z;
	memset(&z, 0, sizeof z);
	if (inflateInit2(&z, wbits) != Z_OK) {
		snprintf(err, errlen, "zlib: %s", z.msg ? z.msg : "init failed");
		return -1;
	}
	z.next_in = (Bytef *)in;
	z.avail_in = (uInt)len;
	int rc = Z_OK, ret = 0;
	char chunk[16384];
	while (rc != Z_STREAM_END || z.avail_in > 0) {
		if (rc == Z_STREAM_END) {
			/* another gzip member; anything else is junk */
			if (wbits <= 15 || inflateReset(&z) != Z_OK) {
				snprintf(err, errlen, "data after the end of "
						      "the compressed stream");
				ret = -1;
				break;
			}
		}
		z.next_out = (Bytef *)chunk;
		z.avail_out = sizeof chunk;
		rc = inflate(&z, Z_NO_FLUSH);
		if (rc != Z_OK && rc != Z_STREAM_END) {
			snprintf(err, errlen, "zlib: %s",
				 z.msg ? z.msg
				       : rc == Z_BUF_ERROR ? "truncated data"
							   : "corrupt data");
			ret = -1;
			break;
		}
		size_t got = sizeof chunk - z.avail_out;
		if ((int64_t)(out->len + got) > max) {
			snprintf(err, errlen, "decoded body larger than %lld "
					      "bytes",
				 (long long)max);
			ret = -1;
			break;
		}
		growbuf_append(out, chunk, got);
		if (rc == Z_OK && got == 0 && z.avail_in == 0) {
			snprintf(err, errlen, "truncated compressed data");
			ret = -1;
			break;
		}
	}
	inflateEnd(&z);
	return ret;
}

static int decode_one(const char *c, size_t n, const char *in, size_t len,
		      int64_t max, growbuf *out, char *err, size_t errlen)
{
	growbuf_reset(out);
	if (name_is(c, n, "identity")) {
		growbuf_append(out, in, len);
		return 0;
	}
	if (name_is(c, n, "gzip") || name_is(c, n, "x-gzip"))
		return inflate_into(in, len, 16 + MAX_WBITS, max, out, err,
				    errlen);
	if (name_is(c, n, "deflate")) {
		/* "deflate" is the zlib format; some servers send it raw. */
		if (inflate_into(in, len, MAX_WBITS, max, out, err, errlen) ==
		    0)
			return 0;
		growbuf_reset(out);
		return inflate_into(in, len, -MAX_WBITS, max, out, err, errlen);
	}
	snprintf(err, errlen, "the proxy cannot decode the %.*s coding",
		 (int)(n > 32 ? 32 : n), c);
	return -1;
}

typedef struct coding_names {
	coding_elem v[8];
	size_t n;
	bool too_many;
} coding_names;

static bool collect(const coding_elem *el, void *arg)
{
	coding_names *c = arg;
	if (c->n == sizeof c->v / sizeof c->v[0]) {
		c->too_many = true;
		return false;
	}
	c->v[c->n++] = *el;
	return true;
}

int coding_decode(const char *ce, const char *in, size_t len, int64_t max,
		  growbuf *out, char *err, size_t errlen)
{
	header_list one = {0};
	header_list_add(&one, "Content-Encoding", 16, ce, strlen(ce));
	coding_names names = {.n = 0};
	each_elem(&one, "Content-Encoding", collect, &names);
	int rc = 0;
	if (names.too_many) {
		snprintf(err, errlen, "too many content codings");
		rc = -1;
	}
	growbuf cur = {0}, next = {0};
	growbuf_append(&cur, in, len);
	/* the last coding listed was applied last: undo it first */
	for (size_t i = names.n; rc == 0 && i-- > 0;) {
		rc = decode_one(names.v[i].name, names.v[i].name_len, cur.data,
				cur.len, max, &next, err, errlen);
		growbuf t = cur;
		cur = next;
		next = t;
	}
	header_list_free(&one);
	growbuf_free(&next);
	if (rc) {
		growbuf_free(&cur);
		return -1;
	}
	growbuf_free(out);
	*out = cur;
	return 0;
}

void coding_mark_decoded(header_list *resp)
{
	size_t k = 0;
	for (size_t i = 0; i < resp->n; i++) {
		http_header *h = &resp->v[i];
		if (str_caseeq(h->name, "Content-Encoding")) {
			free(h->name);
			free(h->value);
			continue;
		}
		if (str_caseeq(h->name, "ETag") && h->value[0] == '"') {
			growbuf w = {0};
			growbuf_printf(&w, "W/%s", h->value);
			free(h->value);
			h->value = w.data;
		}
		resp->v[k++] = *h;
	}
	resp->n = k;
}
