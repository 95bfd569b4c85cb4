/* GET /admin/keys and its cursor; the resolve endpoint is in
 * admin_resolve.c. */
#include "admin_keys.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "problem.h"
#include "units.h"

#define JSON_TYPE "application/json"

void admin_answer_problem(admin_answer *out, int status, const char *code,
			  const char *detail)
{
	growbuf_reset(&out->body);
	problem_render(&out->body, &out->links, status, code, detail, NULL,
		       (problem_facts){0});
	out->status = status;
	out->type = PROBLEM_CONTENT_TYPE;
}

void admin_answer_json(admin_answer *out, int status, json_t *doc)
{
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(doc);
	ALWAYS_ASSERT(s != NULL);
	growbuf_reset(&out->body);
	growbuf_puts(&out->body, s);
	growbuf_puts(&out->body, "\n");
	free(s);
	out->status = status;
	out->type = JSON_TYPE;
}

void admin_answer_store_failed(admin_answer *out, const char *who,
			       const char *what, const char *err)
{
	growbuf b = {0};
	log_field(&b, "remote", who);
	log_field(&b, "action", what);
	log_field(&b, "error", err);
	log_warn("admin action failed", "%s", b.data);
	growbuf_free(&b);
	admin_answer_problem(out, 503, "idempotency_store_unavailable",
			     "the idempotency store cannot be reached; retry "
			     "later");
	out->extra_name = "Retry-After";
	out->extra_value = "1";
}

/* ---- The cursor ------------------------------------------------------ */

/* "n" or "o" (the order), then the four parts of the place, separated by
 * '\n' (which no tenant, operation or key holds), as base64url. */
void admin_cursor_encode(bool newest, const admin_list_pos *p, growbuf *out)
{
	growbuf raw = {0};
	growbuf_puts(&raw, newest ? "n" : "o");
	for (int i = 0; i < 4; i++) {
		growbuf_puts(&raw, "\n");
		growbuf_puts(&raw, p->v[i]);
	}
	size_t n = 4 * ((raw.len + 2) / 3);
	growbuf_reserve(out, n + 1);
	EVP_EncodeBlock((unsigned char *)out->data + out->len,
			(const unsigned char *)raw.data, (int)raw.len);
	char *s = out->data + out->len;
	while (n && s[n - 1] == '=')
		n--;
	for (size_t i = 0; i < n; i++)
		s[i] = s[i] == '+' ? '-' : s[i] == '/' ? '_' : s[i];
	out->len += n;
	out->data[out->len] = '\0';
	growbuf_free(&raw);
}

static bool printable(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
			return false;
	return true;
}

/* created_at as the listing writes it: YYYY-MM-DDTHH:MM:SS.ffffffZ. */
static bool time_form(const char *s)
{
	static const char pat[] = "dddd-dd-ddTdd:dd:dd.ddddddZ";
	if (strlen(s) != sizeof pat - 1)
		return false;
	for (size_t i = 0; pat[i]; i++)
		if (pat[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i])
			return false;
	return true;
}

/* base64url (no padding) into a new NUL-terminated buffer, or NULL. */
static char *unbase64url(const char *s, size_t *len)
{
	size_t n = strlen(s);
	if (n == 0 || n > 4096 || n % 4 == 1)
		return NULL;
	char *b = xmalloc(n + 4);
	size_t k = 0;
	for (; k < n; k++) {
		char c = s[k];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_')) {
			free(b);
			return NULL;
		}
		b[k] = c == '-' ? '+' : c == '_' ? '/' : c;
	}
	size_t pad = (4 - n % 4) % 4;
	for (size_t i = 0; i < pad; i++)
		b[k++] = '=';
	char *out = xmalloc(k / 4 * 3 + 1);
	int got = EVP_DecodeBlock((unsigned char *)out, (unsigned char *)b,
				  (int)k);
	free(b);
	if (got < 0 || (size_t)got < pad) {
		free(out);
		return NULL;
	}
	*len = (size_t)got - pad;
	out[*len] = '\0';
	return out;
}

int admin_cursor_decode(const char *s, bool newest, admin_list_pos *p,
			char **buf)
{
	size_t len;
	char *raw = unbase64url(s, &len);
	if (!raw)
		return -1;
	char *part[5], *save = NULL;
	int n = 0;
	if (strlen(raw) == len && raw[0] && raw[1] == '\n' &&
	    raw[len - 1] != '\n')
		for (char *t = strtok_r(raw, "\n", &save); t && n < 5;
		     t = strtok_r(NULL, "\n", &save))
			part[n++] = t;
	bool ok = n == 5 && !strtok_r(NULL, "\n", &save) &&
		  !strcmp(part[0], newest ? "n" : "o") && time_form(part[1]) &&
		  printable(part[2]) && printable(part[3]) &&
		  printable(part[4]);
	if (!ok) {
		free(raw);
		return -1;
	}
	for (int i = 0; i < 4; i++)
		p->v[i] = part[i + 1];
	*buf = raw;
	return 0;
}

/* ---- The parameters -------------------------------------------------- */

static const char *const state_names[] = {
	[ADMIN_LIST_PROCESSING] = "processing",
	[ADMIN_LIST_HELD] = "held",
	[ADMIN_LIST_RELEASED] = "released",
	[ADMIN_LIST_COMPLETED] = "completed",
};

static int parse_state(const char *v, enum admin_list_state *out)
{
	for (int i = ADMIN_LIST_PROCESSING; i <= ADMIN_LIST_COMPLETED; i++)
		if (!strcmp(v, state_names[i])) {
			*out = (enum admin_list_state)i;
			return 0;
		}
	return -1;
}

static int parse_limit(const char *v, int *out)
{
	char *end;
	long n = strtol(v, &end, 10);
	if (*v < '0' || *v > '9' || *end || n < 1 || n > ADMIN_LIST_MAX)
		return -1;
	*out = (int)n;
	return 0;
}

static const char *const known_args[] = {"state",      "tenant", "route",
					 "older_than", "limit",  "order",
					 "cursor",     NULL};

/* Each known parameter once, by index into known_args; the first
 * unknown or repeated one is refused. */
static int collect(const admin_arg *args, size_t n, const char *vals[7],
		   char *err, size_t errlen)
{
	memset(vals, 0, 7 * sizeof *vals);
	for (size_t i = 0; i < n; i++) {
		int k = 0;
		while (known_args[k] && strcmp(known_args[k], args[i].name))
			k++;
		if (!known_args[k]) {
			snprintf(err, errlen,
				 "unknown parameter %.64s; the parameters are "
				 "state, tenant, route, older_than, limit, "
				 "order and cursor",
				 args[i].name);
			return -1;
		}
		if (vals[k]) {
			snprintf(err, errlen, "%s is given more than once",
				 known_args[k]);
			return -1;
		}
		vals[k] = args[i].value ? args[i].value : "";
	}
	return 0;
}

static int bad(char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s", what);
	return -1;
}

static int parse_filters(const char *v[7], admin_list_req *q, char *err,
			 size_t errlen)
{
	if (v[0] && parse_state(v[0], &q->state))
		return bad(err, errlen,
			   "state must be processing, held, released or "
			   "completed");
	if (v[1] && !printable(v[1]))
		return bad(err, errlen,
			   "tenant must be a non-empty name of printable "
			   "ASCII");
	if (v[2] && !printable(v[2]))
		return bad(err, errlen,
			   "route must be a non-empty route name (the "
			   "operation)");
	q->tenant = v[1];
	q->operation = v[2];
	if (v[3] && parse_duration_ms(v[3], &q->older_than_ms))
		return bad(err, errlen,
			   "older_than must be a duration such as 90s, 15m "
			   "or 2h");
	return 0;
}

int admin_list_parse(const admin_arg *args, size_t n, admin_list_args *out,
		     char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	admin_list_req *q = &out->req;
	q->older_than_ms = -1;
	q->limit = ADMIN_LIST_DEFAULT;
	q->newest = true;
	const char *v[7];
	if (collect(args, n, v, err, errlen) ||
	    parse_filters(v, q, err, errlen))
		return -1;
	if (v[4] && parse_limit(v[4], &q->limit)) {
		snprintf(err, errlen, "limit must be an integer from 1 to %d",
			 ADMIN_LIST_MAX);
		return -1;
	}
	if (v[5] && strcmp(v[5], "newest") && strcmp(v[5], "oldest"))
		return bad(err, errlen, "order must be newest or oldest");
	q->newest = !v[5] || !strcmp(v[5], "newest");
	if (v[6]) {
		if (admin_cursor_decode(v[6], q->newest, &out->after,
					&out->buf))
			return bad(err, errlen,
				   "cursor is not one this listing gave for "
				   "this order; start again without it");
		q->after = &out->after;
	}
	return 0;
}

void admin_list_args_free(admin_list_args *a)
{
	free(a->buf);
	memset(a, 0, sizeof *a);
}

/* ---- The listing ----------------------------------------------------- */

static json_t *row_json(const admin_list_row *r)
{
	json_t *o = json_object();
	json_object_set_new(o, "tenant", json_string(r->tenant));
	json_object_set_new(o, "operation", json_string(r->operation));
	json_object_set_new(o, "key", json_string(r->key));
	json_object_set_new(o, "state", json_string(r->state));
	json_object_set_new(o, "attempt", json_integer(r->attempt));
	json_object_set_new(o, "created_at", json_string(r->created_at));
	json_object_set_new(o, "age_seconds", json_real(atof(r->age_s)));
	json_object_set_new(o, "lease_left_ms",
			    r->lease_left_ms < 0
				    ? json_null()
				    : json_integer(r->lease_left_ms));
	json_object_set_new(o, "outcome",
			    r->outcome ? json_string(r->outcome) : json_null());
	json_object_set_new(o, "hold_on_unknown",
			    json_boolean(r->hold_on_unknown));
	json_object_set_new(o, "expired", json_boolean(r->expired));
	return o;
}

static json_t *list_json(const admin_list_args *a, const admin_list *l)
{
	json_t *keys = json_array();
	for (size_t i = 0; i < l->n; i++)
		json_array_append_new(keys, row_json(&l->rows[i]));
	json_t *doc = json_object();
	json_object_set_new(doc, "keys", keys);
	growbuf c = {0};
	if (l->more)
		admin_cursor_encode(a->req.newest, &l->next, &c);
	json_object_set_new(doc, "next_cursor",
			    l->more ? json_string(c.data) : json_null());
	json_object_set_new(doc, "walked", json_integer(l->walked));
	growbuf_free(&c);
	return doc;
}

void admin_keys_list(store_admin *st, const char *who, const admin_arg *args,
		     size_t n, admin_answer *out)
{
	admin_list_args a;
	char err[512];
	if (admin_list_parse(args, n, &a, err, sizeof err)) {
		admin_list_args_free(&a);
		admin_answer_problem(out, 400, "invalid_parameter", err);
		return;
	}
	admin_list l;
	if (store_admin_list(st, &a.req, &l, err, sizeof err)) {
		admin_list_args_free(&a);
		admin_answer_store_failed(out, who, "list", err);
		return;
	}
	admin_answer_json(out, 200, list_json(&a, &l));
	store_admin_list_clear(&l);
	admin_list_args_free(&a);
}
