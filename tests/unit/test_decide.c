#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decide.h"

static config *cfg;

static const char CONF[] =
	"routes = (\n"
	"  { name = \"pay\"; path = \"/v1/payments\"; "
	"upstream = \"http://127.0.0.1:9\"; },\n"
	"  { name = \"hooks\"; path = \"/hooks/*\"; "
	"upstream = \"http://127.0.0.1:9\"; tenant = \"header:X-Tenant-Id\"; },\n"
	"  { name = \"auth\"; path = \"/auth\"; "
	"upstream = \"http://127.0.0.1:9\"; tenant = \"authorization\"; },\n"
	"  { name = \"any\"; path = \"/*\"; upstream = \"http://127.0.0.1:9\"; "
	"key = \"optional\"; }\n"
	");\n";

static int setup(void **state)
{
	char path[] = "/tmp/idemproxy-decide-XXXXXX";
	char err[512];
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(write(fd, CONF, strlen(CONF)), (ssize_t)strlen(CONF));
	close(fd);
	cfg = config_load(path, err, sizeof err);
	unlink(path);
	if (!cfg)
		fail_msg("%s", err);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	config_unref(cfg);
	return 0;
}

/* Plans POST path with headers given as name, value, ..., NULL. */
static void plan(request_plan *p, const char *path, ...)
{
	header_list h = {0};
	va_list ap;

	va_start(ap, path);
	for (;;) {
		const char *n = va_arg(ap, const char *);
		if (!n)
			break;
		const char *v = va_arg(ap, const char *);
		header_list_add(&h, n, strlen(n), v, strlen(v));
	}
	va_end(ap);
	decide_request rq = {"POST", path, strlen(path), &h, "", 0, 0};
	decide_plan(cfg, &rq, p);
	header_list_free(&h);
}

static void key_header_is(const char *key, const char *want)
{
	char out[PLAN_KEY_HEADER_MAX + 1];
	decide_key_header(key, out);
	assert_string_equal(out, want);
}

static void test_key_header(void **state)
{
	(void)state;
	key_header_is("abc", "abc");
	key_header_is("a:b/c=d?e", "a:b/c=d?e");
	key_header_is("a b", "\"a b\"");
	key_header_is("a\"b", "\"a\\\"b\"");
	key_header_is("a\\b", "\"a\\\\b\"");
	key_header_is("a;b", "\"a;b\"");
	key_header_is("a,b", "\"a,b\"");
	key_header_is(" ", "\" \"");

	/* The longest key, every character escaped, fits. */
	char key[KEY_LEN_MAX + 1], want[PLAN_KEY_HEADER_MAX + 1];
	memset(key, '"', KEY_LEN_MAX);
	key[KEY_LEN_MAX] = '\0';
	want[0] = '"';
	for (int i = 0; i < KEY_LEN_MAX; i++)
		memcpy(want + 1 + 2 * i, "\\\"", 2);
	want[PLAN_KEY_HEADER_MAX - 1] = '"';
	want[PLAN_KEY_HEADER_MAX] = '\0';
	key_header_is(key, want);
}

/* Every spelling of a key is forwarded the same way, and reads back as
 * the key. */
static void test_key_header_round_trips(void **state)
{
	static const char *const spellings[][2] = {
		{"k", "k"}, {"\"k\"", "k"}, {"\"k\";retry=1", "k"},
		{"  \"k\"  ", "k"}, {"\"a b\"", "\"a b\""},
		{"\"a\\\\b\"", "\"a\\\\b\""},
	};
	(void)state;
	for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
		request_plan p;
		plan(&p, "/v1/payments", "Idempotency-Key", spellings[i][0],
		     NULL);
		assert_int_equal(p.action, PLAN_CLAIM);
		assert_string_equal(p.key_header, spellings[i][1]);
		char back[KEY_LEN_MAX + 1];
		size_t n;
		assert_int_equal(key_header_parse(p.key_header,
						  strlen(p.key_header),
						  back, &n, NULL),
				 0);
		assert_string_equal(back, p.key);
	}
}

static void test_path_spellings(void **state)
{
	request_plan p;

	(void)state;
	plan(&p, "/v1/pay%6dents", NULL);
	assert_int_equal(p.action, PLAN_REJECT);
	assert_string_equal(p.code, "idempotency_key_missing");
	assert_string_equal(p.route->name, "pay");
	plan(&p, "/v1/payments/", "Idempotency-Key", "k", NULL);
	assert_int_equal(p.action, PLAN_CLAIM);
	assert_string_equal(p.route->name, "pay");
	plan(&p, "/v1/x/../payments", NULL);
	assert_int_equal(p.action, PLAN_REJECT);
	assert_int_equal(p.status, 400);
	assert_string_equal(p.code, "bad_request");
	assert_null(p.route);
	plan(&p, "/v1%2Fpayments", NULL);
	assert_int_equal(p.status, 400);
	assert_string_equal(p.code, "bad_request");
	plan(&p, "/other", NULL);
	assert_int_equal(p.action, PLAN_PASSTHROUGH);
	assert_string_equal(p.route->name, "any");
}

static void canonical_is(const char *v, const char *want)
{
	growbuf b = {0};
	decide_canonical_credentials(v, &b);
	assert_int_equal(b.len, strlen(want));
	assert_memory_equal(b.len ? b.data : "", want, b.len);
	growbuf_free(&b);
}

static void test_canonical_credentials(void **state)
{
	(void)state;
	canonical_is("Bearer abc", "Bearer abc");
	canonical_is("bearer abc", "Bearer abc");
	canonical_is("BEARER abc", "Bearer abc");
	canonical_is("  bEaReR \t  abc \t ", "Bearer abc");
	canonical_is("Basic QWxhZGRpbjpvcGVu", "Basic QWxhZGRpbjpvcGVu");
	canonical_is("Bearer ABC", "Bearer ABC");	/* credentials keep case */
	canonical_is("Digest a=\"x y\",  b=1", "Digest a=\"x y\",  b=1");
	canonical_is("token", "Token");
	canonical_is("   ", "");
	canonical_is("", "");
}

static const char *tenant_of(request_plan *p, const char *auth)
{
	plan(p, "/auth", "Idempotency-Key", "k", "Authorization", auth, NULL);
	assert_int_equal(p->action, PLAN_CLAIM);
	return p->tenant;
}

static void test_authorization_tenant(void **state)
{
	request_plan a, b;

	(void)state;
	assert_string_equal(tenant_of(&a, "Bearer x"),
			    tenant_of(&b, "bearer x  "));
	assert_string_not_equal(tenant_of(&a, "Bearer x"),
				tenant_of(&b, "Bearer X"));
	plan(&a, "/auth", "Idempotency-Key", "k", "Authorization", "Bearer x",
	     "Authorization", "Bearer y", NULL);
	assert_int_equal(a.action, PLAN_REJECT);
	assert_int_equal(a.status, 400);
	assert_string_equal(a.code, "bad_request");
	plan(&a, "/auth", "Idempotency-Key", "k", "Authorization", "  ", NULL);
	assert_int_equal(a.status, 401);
	assert_string_equal(a.code, "credentials_missing");
}

static void test_tenants_name_their_source(void **state)
{
	request_plan p;

	(void)state;
	plan(&p, "/v1/payments", "Idempotency-Key", "k", NULL);
	assert_string_equal(p.tenant, "default");
	plan(&p, "/hooks/x", "Idempotency-Key", "k", "X-Tenant-Id", "default",
	     NULL);
	assert_string_equal(p.tenant, "header:default");
	/* sha256("Bearer x") */
	assert_string_equal(tenant_of(&p, "bearer x"),
			    "authorization:"
			    "b937a6fd6074f3650930dd9a8c3ea51f"
			    "a502846a5301d74c252c768aef76dcda");
}

static int64_t wait_for(bool wait_route, const char *prefer, int64_t *applied)
{
	route_cfg r = {0};
	r.in_flight_wait = wait_route;
	r.wait_max_ms = 10000;
	header_list h = {0};
	if (prefer)
		header_list_add(&h, "Prefer", 6, prefer, strlen(prefer));
	int64_t ms = decide_wait_ms(&r, &h, applied);
	header_list_free(&h);
	return ms;
}

static void test_prefer_wait(void **state)
{
	(void)state;
	int64_t a;
	assert_int_equal(wait_for(false, NULL, &a), 0);
	assert_int_equal(a, -1);
	assert_int_equal(wait_for(true, NULL, &a), 10000);
	assert_int_equal(a, -1);
	assert_int_equal(wait_for(false, "wait=5", &a), 5000);
	assert_int_equal(a, 5);
	assert_int_equal(wait_for(false, "respond-async, WAIT = 3", &a), 3000);
	assert_int_equal(a, 3);
	assert_int_equal(wait_for(false, "wait=\"7\"", &a), 7000);
	assert_int_equal(wait_for(false, "wait=100", &a), 10000);
	assert_int_equal(a, 10);
	assert_int_equal(wait_for(true, "wait=0", &a), 0);
	assert_int_equal(a, 0);
	/* another preference's quoted value may hold a comma */
	assert_int_equal(wait_for(false, "x=\"a, wait=9\", wait=2", &a), 2000);
	assert_int_equal(wait_for(true, "wait=soon", &a), 10000);
	assert_int_equal(a, -1);
	assert_int_equal(wait_for(false, "waiting=4", &a), 0);
}

/* The issuer in a stored jwt tenant: no ':' left, nothing ambiguous. */
static void test_issuer_escape(void **state)
{
	(void)state;
	char out[64];
	assert_int_equal(pct_escape("https://id.example:8443/a%2Fb", out,
				    sizeof out),
			 strlen("https%3A//id.example%3A8443/a%252Fb"));
	assert_string_equal(out, "https%3A//id.example%3A8443/a%252Fb");
	assert_int_equal(pct_escape("a b\xc3\xa9", out, sizeof out), 11);
	assert_string_equal(out, "a%20b%C3%A9");
	/* cut to the buffer, the whole length still returned */
	char small[5];
	assert_int_equal(pct_escape("a:b:c", small, sizeof small), 9);
	assert_string_equal(small, "a%3A");
	assert_int_equal(pct_escape("x:y", NULL, 0), 5);
}

/* The upstream's CORS headers go with the record whatever replay_headers
 * says: a replay without them is unreadable to the browser that retried. */
static void test_cors_headers_stored(void **state)
{
	(void)state;
	request_plan p;
	plan(&p, "/v1/payments", "Idempotency-Key", "k1", NULL);
	assert_non_null(p.route);
	header_list h = {0};
	const char *pairs[][2] = {
		{"Access-Control-Allow-Origin", "https://shop.example"},
		{"access-control-allow-credentials", "true"},
		{"Access-Control-Expose-Headers", "X-Charge-Id"},
		{"Access-Control-Max-Age", "600"},
		{"X-Internal", "secret"},
	};
	for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
		header_list_add(&h, pairs[i][0], strlen(pairs[i][0]),
				pairs[i][1], strlen(pairs[i][1]));
	growbuf out = {0};
	decide_encode_replay_headers(p.route, &h, &out);
	growbuf_puts(&out, "");
	assert_string_equal(
		out.data,
		"Access-Control-Allow-Origin: https://shop.example\r\n"
		"access-control-allow-credentials: true\r\n"
		"Access-Control-Expose-Headers: X-Charge-Id\r\n");
	growbuf_free(&out);
	header_list_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_header),
		cmocka_unit_test(test_key_header_round_trips),
		cmocka_unit_test(test_path_spellings),
		cmocka_unit_test(test_canonical_credentials),
		cmocka_unit_test(test_issuer_escape),
		cmocka_unit_test(test_authorization_tenant),
		cmocka_unit_test(test_tenants_name_their_source),
		cmocka_unit_test(test_prefer_wait),
		cmocka_unit_test(test_cors_headers_stored),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
