/* The proxy's own response headers, exposed to browser code (cors.h). */
#include "cors.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define EXPOSE "Access-Control-Expose-Headers"
#define N_OWN (sizeof own_headers / sizeof own_headers[0])

/* Every header the proxy adds to an answer that carries the upstream's
 * CORS headers: the replay marker (proxy.c respond_replay) and the wait
 * applied (proxy.c add_preference_applied). Retry-After, Content-Type and
 * Connection go only on the proxy's own answers, which carry no CORS
 * headers; Content-Type is safelisted anyway. */
static const char *const own_headers[] = {"Idempotent-Replayed",
					  "Preference-Applied"};

typedef struct name_list {
	growbuf joined; /* ", "-separated */
	bool wildcard;
} name_list;

static bool has_name(const growbuf *joined, const char *s, size_t n)
{
	const char *p = joined->data;
	const char *end = p ? p + joined->len : NULL;
	while (p && p < end) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		size_t len = (size_t)((comma ? comma : end) - p);
		if (len == n && strncasecmp(p, s, n) == 0)
			return true;
		p = comma ? comma + 2 : end;
	}
	return false;
}

static void add_name(name_list *l, const char *s, size_t n)
{
	if (n == 0 || has_name(&l->joined, s, n))
		return;
	if (n == 1 && s[0] == '*')
		l->wildcard = true;
	if (l->joined.len)
		growbuf_puts(&l->joined, ", ");
	growbuf_append(&l->joined, s, n);
}

/* The elements of one field value (a #token list, RFC 9110 5.6.1). */
static void add_field(name_list *l, const char *v)
{
	while (*v) {
		const char *comma = strchr(v, ',');
		const char *e = comma ? comma : v + strlen(v);
		const char *s = v;
		while (s < e && (*s == ' ' || *s == '\t'))
			s++;
		const char *t = e;
		while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
			t--;
		add_name(l, s, (size_t)(t - s));
		v = comma ? comma + 1 : e;
	}
}

static void drop_fields(header_list *resp, const char *name)
{
	size_t k = 0;
	for (size_t i = 0; i < resp->n; i++) {
		http_header *h = &resp->v[i];
		if (str_caseeq(h->name, name)) {
			free(h->name);
			free(h->value);
			continue;
		}
		resp->v[k++] = *h;
	}
	resp->n = k;
}

bool cors_is_preflight(const char *method, const header_list *req)
{
	return method && strcmp(method, "OPTIONS") == 0 &&
	       header_list_get(req, "Access-Control-Request-Method");
}

void cors_expose_own(const char *method, const header_list *req,
		     header_list *resp)
{
	if (!header_list_get(resp, "Access-Control-Allow-Origin") ||
	    cors_is_preflight(method, req))
		return;
	name_list l = {0};
	for (size_t i = 0; i < resp->n; i++)
		if (str_caseeq(resp->v[i].name, EXPOSE))
			add_field(&l, resp->v[i].value);
	const char *cred =
		header_list_get(resp, "Access-Control-Allow-Credentials");
	bool covered = l.wildcard && !(cred && strcmp(cred, "true") == 0);
	size_t before = l.joined.len;
	for (size_t i = 0; !covered && i < N_OWN; i++)
		add_name(&l, own_headers[i], strlen(own_headers[i]));
	if (l.joined.len != before) {
		drop_fields(resp, EXPOSE);
		header_list_add(resp, EXPOSE, strlen(EXPOSE), l.joined.data,
				l.joined.len);
	}
	growbuf_free(&l.joined);
}
