#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <jose/openssl.h>
#include <openssl/evp.h>

#include "config.h"

#define EXAMPLE_CONF "conf/idemproxy.conf"
#define ROUTE_A                                                                \
	"routes = ( { name = \"a\"; path = \"/a\"; "                           \
	"upstream = \"http://127.0.0.1:9000\"; } );\n"

static char conf_path[64];
static char err[512];

/* Writes text to a fresh file and loads it; the file is removed again so a
 * failing test leaves nothing behind. */
static config *load_text(const char *text)
{
	snprintf(conf_path, sizeof conf_path, "/tmp/idemproxy-conf-XXXXXX");
	int fd = mkstemp(conf_path);
	assert_true(fd >= 0);
	size_t n = strlen(text);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	close(fd);
	err[0] = '\0';
	config *c = config_load(conf_path, err, sizeof err);
	unlink(conf_path);
	return c;
}

/* The load fails with "FILE:LINE: ..." (line 0: "FILE: ...") and the message
 * contains needle. */
static void assert_error(const char *text, int line, const char *needle)
{
	config *c = load_text(text);
	if (c) {
		config_unref(c);
		fail_msg("loaded, expected an error containing \"%s\"", needle);
	}
	char prefix[128];
	if (line > 0)
		snprintf(prefix, sizeof prefix, "%s:%d: ", conf_path, line);
	else
		snprintf(prefix, sizeof prefix, "%s: ", conf_path);
	if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, needle))
		fail_msg("got \"%s\", expected \"%s...%s...\"", err, prefix,
			 needle);
}

/* A route list around one route body, the route starting on line 2. */
static void assert_route_error(const char *route_body, int line,
			       const char *needle)
{
	char text[2048];
	snprintf(text, sizeof text,
		 "routes = (\n  { name = \"r\"; path = \"/r\";\n"
		 "    upstream = \"http://h\";\n    %s }\n);\n",
		 route_body);
	assert_error(text, line, needle);
}

static int clear_env(void **state)
{
	(void)state;
	unsetenv("IDEMPROXY_DATABASE_URL");
	unsetenv("IDEMPROXY_LISTEN");
	return 0;
}

/* ---- loading --------------------------------------------------------- */

static void assert_spec_defaults(const route_cfg *r)
{
	assert_int_equal(r->methods.n, 2);
	assert_string_equal(r->methods.v[0], "POST");
	assert_string_equal(r->methods.v[1], "PATCH");
	assert_true(r->key_required);
	assert_int_equal(r->tenant_kind, TENANT_STATIC);
	assert_string_equal(r->tenant_arg, "default");
	assert_int_equal(r->ttl_ms, 24 * 3600 * 1000LL);
	assert_int_equal(r->lease_ms, 30000);
	assert_int_equal(r->upstream_timeout_ms, 25000);
	assert_int_equal(r->retry_after_ms, 1000);
	assert_int_equal(r->mismatch_status, 409);
	static const int rel[] = {408, 425, 429, 500, 502, 503, 504};
	assert_int_equal(r->n_release_statuses, 7);
	assert_memory_equal(r->release_statuses, rel, sizeof rel);
	assert_false(r->on_unknown_hold);
	assert_int_equal(r->replay_headers.n, 7);
	assert_string_equal(r->replay_headers.v[0], "Content-Type");
	assert_string_equal(r->replay_headers.v[6], "Cache-Control");
	assert_int_equal(r->fingerprint_headers.n, 0);
}

static void assert_top_defaults(const config *c)
{
	assert_string_equal(c->listen, "127.0.0.1:8080");
	assert_string_equal(c->admin_listen, "127.0.0.1:8081");
	assert_string_equal(c->admin_token, "");
	assert_int_equal(c->workers, 16);
	assert_int_equal(c->queue_size, 1024);
	assert_int_equal(c->max_connections, 1024);
	assert_int_equal(c->max_request_body, 1 << 20);
	assert_int_equal(c->max_stored_response, 4 << 20);
	assert_int_equal(c->shutdown_grace_ms, 10000);
	assert_int_equal(c->log_level, LOG_INFO);
	assert_true(c->log_json);
	assert_string_equal(c->db_url, "postgresql:///idemproxy");
	assert_int_equal(c->statement_timeout_ms, 2000);
	assert_false(c->db_unavailable_forward);
	assert_false(c->db_citus);
	assert_int_equal(c->reaper_interval_ms, 5000);
	assert_int_equal(c->reaper_batch, 1000);
	assert_int_equal(c->reaper_durability_interval_ms, 30000);
}

static void test_example_conf(void **state)
{
	(void)state;
	config *c = config_load(EXAMPLE_CONF, err, sizeof err);
	if (!c)
		fail_msg("%s", err);
	assert_string_equal(c->file, EXAMPLE_CONF);
	assert_top_defaults(c);
	assert_int_equal(c->n_routes, 6);
	assert_string_equal(c->routes[3].name, "psp_webhook");
	assert_int_equal(c->routes[3].key_from.n, 1);
	assert_int_equal(c->routes[3].key_from.v[0].source, KP_BODY);
	assert_string_equal(c->routes[5].name, "order_transition");
	assert_int_equal(c->routes[5].key_from.n, 2);
	assert_int_equal(c->routes[5].n_fp_ignore, 1);
	assert_true(c->routes[0].key_from.bare);
	assert_string_equal(c->routes[0].name, "create_payment");
	assert_string_equal(c->routes[0].path, "/v1/payments");
	assert_string_equal(c->routes[0].upstream, "http://127.0.0.1:9000");
	assert_string_equal(c->routes[1].name, "capture_payment");
	assert_string_equal(c->routes[1].path, "/v1/payments/{id}/capture");
	assert_string_equal(c->routes[2].name, "create_refund");
	assert_string_equal(c->routes[2].path, "/v1/refunds");
	assert_spec_defaults(&c->routes[0]);
	assert_spec_defaults(&c->routes[2]);
	assert_int_equal(c->routes[1].ttl_ms, 7 * 24 * 3600 * 1000LL);
	assert_int_equal(c->routes[1].lease_ms, 30000);
	for (size_t i = 0; i < c->n_routes; i++)
		assert_true(c->routes[i].line > 0);
	assert_true(c->routes[0].line < c->routes[1].line);
	config_unref(c);
}

/* A file with nothing but a route gets every default SPEC 2 shows. */
static void test_defaults_when_absent(void **state)
{
	(void)state;
	config *c = load_text(ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	assert_top_defaults(c);
	assert_int_equal(c->n_routes, 1);
	assert_spec_defaults(&c->routes[0]);
	assert_int_equal(c->routes[0].line, 1);
	config_unref(c);
}

static void test_top_level_values(void **state)
{
	(void)state;
	config *c = load_text("listen = \"[::]:9090\";\n"
			      "admin_listen = \"\";\n"
			      "admin_token = \"s3cret\";\n"
			      "workers = 1;\n"
			      "queue_size = 5;\n"
			      "max_connections = 7;\n"
			      "max_request_body = \"512KiB\";\n"
			      "max_stored_response = 2048;\n"
			      "shutdown_grace = \"0s\";\n"
			      "log_level = \"debug\";\n"
			      "log_format = \"text\";\n"
			      "database = { url = \"postgresql://x/y\";\n"
			      "  statement_timeout = \"250ms\";\n"
			      "  unavailable = \"forward\";\n"
			      "  distributed = \"citus\"; };\n"
			      "reaper = { interval = \"1m\"; batch = 10; "
			      "durability_interval = \"2s\"; };\n" ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	assert_string_equal(c->listen, "[::]:9090");
	assert_string_equal(c->admin_listen, "");
	assert_string_equal(c->admin_token, "s3cret");
	assert_int_equal(c->workers, 1);
	assert_int_equal(c->queue_size, 5);
	assert_int_equal(c->max_connections, 7);
	assert_int_equal(c->max_request_body, 512 * 1024);
	assert_int_equal(c->max_stored_response, 2048);
	assert_int_equal(c->shutdown_grace_ms, 0);
	assert_int_equal(c->log_level, LOG_DEBUG);
	assert_false(c->log_json);
	assert_string_equal(c->db_url, "postgresql://x/y");
	assert_int_equal(c->statement_timeout_ms, 250);
	assert_true(c->db_unavailable_forward);
	assert_true(c->db_citus);
	assert_int_equal(c->reaper_interval_ms, 60000);
	assert_int_equal(c->reaper_batch, 10);
	assert_int_equal(c->reaper_durability_interval_ms, 2000);
	config_unref(c);
}

static void test_defaults_inherited_and_overridden(void **state)
{
	(void)state;
	config *c = load_text(
		"defaults = {\n"
		"  methods = [\"post\", \"Put\"];\n"
		"  tenant = \"header:X-Tenant-Id\";\n"
		"  ttl = \"48h\"; lease = \"1m\"; upstream_timeout = \"50s\";\n"
		"  fingerprint_headers = [\"X-Account\"];\n"
		"};\n"
		"routes = (\n"
		"  { name = \"inherits\"; path = \"/i\"; upstream = \"http://h\"; },\n"
		"  { name = \"overrides\"; path = \"/o\"; upstream = \"http://h\";\n"
		"    methods = (\"DELETE\"); key = \"optional\"; tenant = \"authorization\";\n"
		"    ttl = \"2h\"; mismatch_status = 422; release_statuses = [];\n"
		"    on_unknown = \"hold\"; replay_headers = [\"X-A\"];\n"
		"    retry_after = \"1500ms\"; fingerprint_headers = []; }\n"
		");\n");
	if (!c)
		fail_msg("%s", err);
	const route_cfg *i = &c->routes[0], *o = &c->routes[1];

	assert_int_equal(i->methods.n, 2);
	assert_string_equal(i->methods.v[0], "POST");
	assert_string_equal(i->methods.v[1], "PUT");
	assert_int_equal(i->tenant_kind, TENANT_HEADER);
	assert_string_equal(i->tenant_arg, "X-Tenant-Id");
	assert_int_equal(i->ttl_ms, 48 * 3600 * 1000LL);
	assert_int_equal(i->lease_ms, 60000);
	assert_int_equal(i->upstream_timeout_ms, 50000);
	assert_int_equal(i->fingerprint_headers.n, 1);
	assert_string_equal(i->fingerprint_headers.v[0], "X-Account");
	/* Not in defaults either: the built-in default. */
	assert_true(i->key_required);
	assert_int_equal(i->mismatch_status, 409);
	assert_int_equal(i->n_release_statuses, 7);

	assert_int_equal(o->methods.n, 1);
	assert_string_equal(o->methods.v[0], "DELETE");
	assert_false(o->key_required);
	assert_int_equal(o->tenant_kind, TENANT_AUTHORIZATION);
	assert_null(o->tenant_arg);
	assert_int_equal(o->ttl_ms, 2 * 3600 * 1000LL);
	assert_int_equal(o->lease_ms, 60000); /* still from defaults */
	assert_int_equal(o->mismatch_status, 422);
	assert_int_equal(o->n_release_statuses, 0);
	assert_true(o->on_unknown_hold);
	assert_int_equal(o->replay_headers.n, 1);
	assert_string_equal(o->replay_headers.v[0], "X-A");
	assert_int_equal(o->retry_after_ms, 1500);
	assert_int_equal(o->fingerprint_headers.n, 0);
	config_unref(c);
}

static const char *upstream_of(const char *url)
{
	static char got[256];
	char text[512];
	snprintf(text, sizeof text,
		 "routes = ( { name = \"a\"; path = \"/a\"; upstream = \"%s\"; "
		 "} );\n",
		 url);
	config *c = load_text(text);
	if (!c)
		fail_msg("%s: %s", url, err);
	snprintf(got, sizeof got, "%s", c->routes[0].upstream);
	config_unref(c);
	return got;
}

static void test_upstream_normalised(void **state)
{
	(void)state;
	assert_string_equal(upstream_of("http://127.0.0.1:9000/"),
			    "http://127.0.0.1:9000");
	assert_string_equal(upstream_of("HTTPS://api.example.com/base//"),
			    "https://api.example.com/base");
	assert_string_equal(upstream_of("http://[::1]:8443/v2"),
			    "http://[::1]:8443/v2");
	assert_string_equal(upstream_of("http://[::1]"), "http://[::1]");
	assert_string_equal(upstream_of("http://demo_upstream:65535"),
			    "http://demo_upstream:65535");
}

/* ---- errors, each at its line ---------------------------------------- */

static void test_error_syntax(void **state)
{
	(void)state;
	assert_error("workers = 4;\nlisten = ;\nqueue_size = 3;\n", 2,
		     "syntax error");
	assert_error("workers = 4;\nworkers = 5;\n" ROUTE_A, 2,
		     "duplicate setting name");
}

static void test_error_unreadable_file(void **state)
{
	(void)state;
	config *c = config_load("/nonexistent/idemproxy.conf", err, sizeof err);
	assert_null(c);
	assert_string_equal(err, "/nonexistent/idemproxy.conf: cannot read: "
				 "No such file or directory");
	assert_null(config_load("/tmp", err, sizeof err));
	assert_string_equal(err, "/tmp: cannot read: not a regular file");
}

static void test_error_unknown_settings(void **state)
{
	(void)state;
	assert_error("workers = 4;\n\nworker_count = 4;\n" ROUTE_A, 3,
		     "unknown setting \"worker_count\"");
	assert_error("database = {\n  url = \"x\";\n  pool = 4;\n};\n" ROUTE_A,
		     3, "database: unknown setting \"pool\"");
	assert_error("reaper = {\n  every = \"5s\"; };\n" ROUTE_A, 2,
		     "reaper: unknown setting \"every\"");
	assert_error("defaults = {\n  ttl = \"24h\";\n  tll = \"24h\";\n};\n" ROUTE_A,
		     3, "defaults: unknown setting \"tll\"");
	assert_error("defaults = {\n  upstream = \"http://h\";\n};\n" ROUTE_A, 2,
		     "defaults: \"upstream\" can only be set in a route");
	assert_route_error("\n  timeout = \"5s\";", 5,
			   "route \"r\": unknown setting \"timeout\"");
	/* A group where a value belongs is as unknown as any other name. */
	assert_route_error("extra = { a = 1; };", 4,
			   "route \"r\": unknown setting \"extra\"");
}

static void test_error_wrong_types(void **state)
{
	(void)state;
	assert_error("\nworkers = \"16\";\n" ROUTE_A, 2,
		     "workers: must be an integer, not a string");
	assert_error("workers = 16.0;\n" ROUTE_A, 1,
		     "workers: must be an integer, not a float");
	assert_error("listen = 8080;\n" ROUTE_A, 1,
		     "listen: must be a string");
	assert_error("database = \"postgresql:///x\";\n" ROUTE_A, 1,
		     "database: must be a group");
	assert_error("reaper = [1];\n" ROUTE_A, 1, "reaper: must be a group");
	assert_error("defaults = ( );\n" ROUTE_A, 1,
		     "defaults: must be a group");
	assert_route_error("ttl = 5;", 4,
			   "route \"r\": ttl: must be a duration string");
	assert_route_error("methods = \"POST\";", 4,
			   "methods: must be a list of HTTP methods");
	assert_route_error("replay_headers = [1, 2];", 4,
			   "replay_headers: element 1 must be a header name");
	assert_route_error("release_statuses = (500, \"502\");", 4,
			   "release_statuses: element 2 must be an integer");
	assert_error("routes = { a = 1; };\n", 1, "routes: must be a list");
	assert_error("routes = (\n  \"/a\" );\n", 2,
		     "routes[1]: must be a group");
}

static void test_error_durations_and_sizes(void **state)
{
	(void)state;
	assert_error("shutdown_grace = \"10\";\n" ROUTE_A, 1,
		     "shutdown_grace: bad duration \"10\"");
	assert_error("database = {\n statement_timeout = \"2 s\"; };\n" ROUTE_A,
		     2, "database: statement_timeout: bad duration \"2 s\"");
	assert_route_error("ttl = \"7x\";", 4,
			   "route \"r\": ttl: bad duration \"7x\"");
	assert_error("defaults = {\n\n lease = \"-1s\"; };\n" ROUTE_A, 3,
		     "defaults: lease: bad duration \"-1s\"");
	assert_error("max_request_body = \"1MB5\";\n" ROUTE_A, 1,
		     "max_request_body: bad size \"1MB5\"");
	assert_error("max_stored_response = \"1.5MiB\";\n" ROUTE_A, 1,
		     "max_stored_response: bad size");
}

static void test_error_out_of_range(void **state)
{
	(void)state;
	assert_error("workers = 0;\n" ROUTE_A, 1,
		     "workers: 0 is out of range 1..1024");
	assert_error("workers = 1025;\n" ROUTE_A, 1,
		     "workers: 1025 is out of range 1..1024");
	assert_error("queue_size = -1;\n" ROUTE_A, 1,
		     "queue_size: -1 is out of range");
	assert_error("max_request_body = \"2GiB\";\n" ROUTE_A, 1,
		     "max_request_body: 2GiB is out of range 1B..1GiB");
	assert_error("max_request_body = 0;\n" ROUTE_A, 1,
		     "max_request_body: 0 is out of range");
	assert_error("reaper = { interval = \"10ms\"; };\n" ROUTE_A, 1,
		     "reaper: interval: \"10ms\" is out of range 100ms..1h");
	assert_error("reaper = { batch = 0; };\n" ROUTE_A, 1,
		     "reaper: batch: 0 is out of range");
	assert_route_error("retry_after = \"0s\";", 4,
			   "retry_after: \"0s\" is out of range");
	assert_route_error("ttl = \"500ms\";", 4,
			   "ttl: \"500ms\" is out of range 1s..3650d");
}

static void test_error_duplicate_route_names(void **state)
{
	(void)state;
	assert_error("routes = (\n"
		     "  { name = \"pay\"; path = \"/a\"; upstream = \"http://h\"; },\n"
		     "  { path = \"/b\"; upstream = \"http://h\";\n"
		     "    name = \"pay\"; }\n"
		     ");\n",
		     4, "route \"pay\": duplicate name (first used at line 2)");
}

static void test_error_route_names(void **state)
{
	(void)state;
	assert_error("routes = (\n  { name = \"\"; path = \"/a\"; "
		     "upstream = \"http://h\"; }\n);\n",
		     2, "routes[1]: name: \"\" must be 1..128 characters");
	assert_error("routes = (\n  { name = \"a\"; path = \"/a\"; "
		     "upstream = \"http://h\"; },\n  { name = \"pay ment\"; "
		     "path = \"/b\"; upstream = \"http://h\"; }\n);\n",
		     3, "routes[2]: name: \"pay ment\" must be");
	assert_error("routes = (\n  { name = \"a{b}\"; path = \"/a\"; "
		     "upstream = \"http://h\"; }\n);\n",
		     2, "name: \"a{b}\" must be");
}

static void test_error_missing_route_settings(void **state)
{
	(void)state;
	assert_error("routes = (\n  { path = \"/a\";\n upstream = \"http://h\"; }\n);\n",
		     2, "routes[1]: missing required setting \"name\"");
	assert_error("routes = (\n  { name = \"a\";\n upstream = \"http://h\"; }\n);\n",
		     2, "route \"a\": missing required setting \"path\"");
	assert_error("routes = (\n  { name = \"a\";\n path = \"/a\"; }\n);\n", 2,
		     "route \"a\": missing required setting \"upstream\"");
}

static void test_error_no_routes(void **state)
{
	(void)state;
	assert_error("workers = 2;\n", 0, "no routes");
	assert_error("workers = 2;\nroutes = ( );\n", 2,
		     "routes: the list is empty");
}

static void test_error_lease_not_above_upstream_timeout(void **state)
{
	(void)state;
	assert_route_error("lease = \"25s\";", 4,
			   "route \"r\": lease (25s) must be longer than "
			   "upstream_timeout (25s)");
	assert_route_error("\n upstream_timeout = \"1m\";", 5,
			   "lease (30s) must be longer than upstream_timeout "
			   "(1m)");
	/* Inherited from defaults: the defaults' line is the one to fix. */
	assert_error("defaults = {\n  lease = \"10s\";\n};\n" ROUTE_A, 2,
		     "route \"a\": lease (10s) must be longer than "
		     "upstream_timeout (25s)");
	/* The route's own setting is blamed before anything inherited. */
	assert_error("\nroutes = (\n { name = \"a\"; path = \"/a\";"
		     " upstream = \"http://h\"; upstream_timeout = \"30s\";\n"
		     " }\n);\n",
		     3, "lease (30s) must be longer than upstream_timeout (30s)");
}

/* An attempt sends only with upstream_timeout plus the margin of its lease
 * left: a tenth of the lease, at least 100 ms, at most 2 s. */
static void test_error_lease_without_room_for_the_margin(void **state)
{
	(void)state;
	assert_route_error("upstream_timeout = \"28s\";", 4,
			   "route \"r\": lease (30s) must be longer than "
			   "upstream_timeout (28s) plus the lease margin (2s");
	assert_route_error("lease = \"10s\"; upstream_timeout = \"9s\";", 4,
			   "upstream_timeout (9s) plus the lease margin (1s");
	assert_route_error("lease = \"500ms\"; upstream_timeout = \"400ms\";",
			   4,
			   "upstream_timeout (400ms) plus the lease margin "
			   "(100ms");
}

static void test_lease_margin(void **state)
{
	(void)state;
	route_cfg r = {0};
	static const int64_t cases[][2] = {
		{500, 100},    {1000, 100},   {3000, 300},
		{10000, 1000}, {20000, 2000}, {86400000, 2000},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		r.lease_ms = cases[i][0];
		assert_int_equal(route_lease_margin_ms(&r), cases[i][1]);
	}
}

static void test_error_ttl_not_above_lease(void **state)
{
	(void)state;
	assert_route_error("ttl = \"30s\";", 4,
			   "route \"r\": ttl (30s) must be longer than lease "
			   "(30s)");
	assert_route_error("ttl = \"2m\";\n lease = \"5m\";", 4,
			   "ttl (2m) must be longer than lease (5m)");
}

static void test_error_upstream_url(void **state)
{
	(void)state;
	static const struct {
		const char *url;
		const char *needle;
	} bad[] = {
		{"ftp://h", "must start with http:// or https://"},
		{"127.0.0.1:9000", "must start with http:// or https://"},
		{"http://", "missing host"},
		{"http:///v1", "missing host"},
		{"http://:9000", "missing host"},
		{"http://h:0", "port must be 1..65535"},
		{"http://h:65536", "port must be 1..65535"},
		{"http://h:", "port must be 1..65535"},
		{"http://h:80x", "port must be 1..65535"},
		{"http://h/v1?x=1", "no query or fragment"},
		{"http://h/#top", "no query or fragment"},
		{"http://user:pw@h", "credentials in the URL"},
		{"http://h o", "malformed host"},
		{"http://h/a b", "characters not allowed in a path"},
		{"http://::1/", "IPv6 address goes in brackets"},
		{"http://[::1/", "malformed IPv6"},
		{"http://[zz::1]/", "malformed IPv6"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char text[512];
		snprintf(text, sizeof text,
			 "routes = (\n { name = \"a\"; path = \"/a\";\n"
			 "   upstream = \"%s\"; }\n);\n",
			 bad[i].url);
		assert_error(text, 3, bad[i].needle);
		assert_non_null(strstr(err, "route \"a\": upstream: "));
	}
}

static void test_error_path_template(void **state)
{
	(void)state;
	assert_error("routes = (\n { name = \"a\";\n  path = \"v1/payments\";"
		     " upstream = \"http://h\"; }\n);\n",
		     3, "route \"a\": path: \"v1/payments\": ");
	assert_error("routes = (\n { name = \"a\";\n  path = \"/v1/{id\";"
		     " upstream = \"http://h\"; }\n);\n",
		     3, "path: \"/v1/{id\": ");
	assert_error("routes = (\n { name = \"a\";\n  path = \"/v1/*/x\";"
		     " upstream = \"http://h\"; }\n);\n",
		     3, "path: \"/v1/*/x\": ");
}

static void test_error_tenant(void **state)
{
	(void)state;
	assert_route_error("tenant = \"static:\";", 4,
			   "tenant: \"static:\" needs a NAME");
	assert_route_error("tenant = \"header:\";", 4,
			   "tenant: \"header:\" needs a NAME");
	assert_route_error("tenant = \"header:X Tenant\";", 4,
			   "\"X Tenant\" is not a valid header name");
	assert_route_error("tenant = \"header:Authorization\";", 4,
			   "use tenant = \"authorization\"");
	assert_route_error("tenant = \"static:a b\";", 4,
			   "must be visible ASCII");
	assert_route_error("tenant = \"static:header:x\";", 4,
			   "static tenant \"header:x\" may not contain ':'");
	assert_route_error("tenant = \"Authorization\";", 4,
			   "must be \"static:NAME\", \"header:NAME\", "
			   "\"authorization\" or \"jwt:CLAIM\"");
	assert_route_error("tenant = \"cookie:sid\";", 4,
			   "must be \"static:NAME\"");
}

static void test_error_key_from(void **state)
{
	(void)state;
	assert_route_error("key_from = [];", 4, "key_from: must name at least "
			   "one part");
	assert_route_error("key_from = [\"cookie:sid\"];", 4,
			   "key_from: \"cookie:sid\" must be \"header:NAME\"");
	assert_route_error("key_from = [\"body:order/id\"];", 4,
			   "bad JSON pointer: must be empty or start with '/'");
	assert_route_error("key_from = [\"body:/a~2\"];", 4,
			   "'~' must be followed by 0 or 1");
	assert_route_error("key_from = [\"header:X\", \"header:x\"];", 4,
			   "\"header:x\" is listed twice");
	/* One part may be a string; it is checked as a list's element is. */
	assert_route_error("key_from = \"cookie:sid\";", 4,
			   "key_from: \"cookie:sid\" must be \"header:NAME\"");
	assert_route_error("key_from = \"\";", 4, "key_from: \"\" must be");
	assert_route_error("key_from = 5;", 4,
			   "key_from: must be a list of key parts or one key "
			   "part string, not an integer");
}

/* key_from = "header:NAME" is the list of that one part. */
static void test_key_from_one_string(void **state)
{
	(void)state;
	config *c = load_text("routes = (\n  { name = \"r\"; path = \"/r\";\n"
			      "    upstream = \"http://h\";\n"
			      "    key_from = \"header:PayPal-Request-Id\"; }\n"
			      ");\n");
	assert_non_null(c);
	const key_from_cfg *kp = &c->routes[0].key_from;
	assert_int_equal(kp->n, 1);
	assert_int_equal(kp->v[0].source, KP_HEADER);
	assert_string_equal(kp->v[0].name, "PayPal-Request-Id");
	assert_false(kp->bare);
	config_unref(c);
}

static void test_error_fingerprint_pointers(void **state)
{
	(void)state;
	assert_route_error("fingerprint_ignore = [\"sent_at\"];", 4,
			   "fingerprint_ignore: \"sent_at\": must be empty or "
			   "start with '/'");
	assert_route_error("fingerprint_only = [\"\"];", 4,
			   "\"\" is the whole body");
	assert_route_error("fingerprint_ignore = [\"/a\"];\n"
			   "    fingerprint_only = [\"/b\"];",
			   5, "set fingerprint_ignore or fingerprint_only, "
			      "not both");
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

#define JWKS_PATH "/tmp/idemproxy-test-jwks.json"
#define JWKS_OCT "{\"keys\":[{\"kty\":\"oct\",\"kid\":\"h\"," \
		 "\"k\":\"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY\"}]}"
#define JWT_GROUP(extra)                                                      \
	"jwt = { keys = \"" JWKS_PATH "\"; issuer = \"i\"; "                 \
	"audience = \"a\"; " extra " };"

static void test_error_jwt(void **state)
{
	(void)state;
	write_file(JWKS_PATH, JWKS_OCT);
	assert_route_error("tenant = \"jwt:sub\";", 4,
			   "tenant \"jwt:sub\" needs a jwt = {");
	assert_route_error("tenant = \"jwt:sub\"; "
			   JWT_GROUP("algorithms = [\"none\"];"), 4,
			   "\"none\" would accept unsigned tokens");
	assert_route_error(JWT_GROUP("algorithms = [\"RS512\"];"), 4,
			   "\"RS512\" must be \"RS256\"");
	assert_route_error(JWT_GROUP("algorithms = [];"), 4,
			   "name at least one algorithm");
	assert_route_error(JWT_GROUP(""), 4,
			   "missing required setting \"algorithms\"");
	assert_route_error("jwt = { keys = \"" JWKS_PATH "\"; "
			   "algorithms = [\"HS256\"]; audience = \"a\"; };",
			   4, "missing required setting \"issuer\"");
	assert_route_error(JWT_GROUP("algorithms = [\"HS256\"]; "
				     "leeway = \"1h\";"), 4,
			   "leeway: must be a duration of at most 5m");
	assert_route_error(JWT_GROUP("algorithms = [\"HS256\"]; x = 1;"), 4,
			   "unknown setting \"x\"");
	assert_route_error("jwt = { keys = \"/nonexistent/jwks\"; "
			   "issuer = \"i\"; audience = \"a\"; "
			   "algorithms = [\"HS256\"]; };",
			   4, "keys: cannot read /nonexistent/jwks");
	write_file(JWKS_PATH, "{\"keys\": [{\"kty\":\"oct\",\"k\":\"AAAA\"}]}");
	assert_route_error(JWT_GROUP("algorithms = [\"HS256\"];"), 4,
			   "key 1: an HS256 secret of 3 bytes");
	/* An RSA key whose verifications would cost the serving thread too
	 * much is refused when the file is loaded. */
	EVP_PKEY *big = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)4608);
	json_t *jwk = jose_openssl_jwk_from_EVP_PKEY(NULL, big);
	EVP_PKEY_free(big);
	assert_non_null(jwk);
	for (const char **m = (const char *[]){"d", "p", "q", "dp", "dq",
						"qi", NULL};
	     *m; m++)
		json_object_del(jwk, *m); /* the public key */
	json_t *set = json_pack("{s:[o]}", "keys", jwk);
	char *text = json_dumps(set, 0);
	write_file(JWKS_PATH, text);
	free(text);
	json_decref(set);
	assert_route_error(JWT_GROUP("algorithms = [\"RS256\"];"), 4,
			   "key 1: an RSA key of 4608 bits; 2048 to 4096 are "
			   "accepted");
	unlink(JWKS_PATH);
}

/* A jwt group in defaults serves every route that names a jwt tenant. */
static void test_jwt_tenant_loads(void **state)
{
	(void)state;
	write_file(JWKS_PATH, JWKS_OCT);
	config *c = load_text(
		"defaults = { " JWT_GROUP("algorithms = [\"HS256\"];") " };\n"
		"routes = ( { name = \"r\"; path = \"/r\"; "
		"upstream = \"http://h\"; tenant = \"jwt:org\"; "
		"key_from = [\"body:/order\", \"header:Idempotency-Key\"]; "
		"fingerprint_ignore = [\"/sent_at\"]; } );\n");
	unlink(JWKS_PATH);
	if (!c)
		fail_msg("%s", err);
	const route_cfg *r = &c->routes[0];
	assert_int_equal(r->tenant_kind, TENANT_JWT);
	assert_string_equal(r->tenant_arg, "org");
	assert_non_null(r->jwt);
	assert_int_equal(r->jwt->algs, JWT_HS256);
	assert_int_equal(r->jwt->leeway_ms, 30000);
	assert_int_equal(jwt_keyset_count(r->jwt->keys), 1);
	assert_int_equal(r->key_from.n, 2);
	assert_false(r->key_from.bare);
	assert_int_equal(r->n_fp_ignore, 1);
	config_unref(c);
}

static void test_error_statuses(void **state)
{
	(void)state;
	assert_route_error("mismatch_status = 418;", 4,
			   "mismatch_status: must be 409 or 422");
	assert_route_error("mismatch_status = \"409\";", 4,
			   "mismatch_status: must be 409 or 422");
	assert_route_error("release_statuses = [500, 600];", 4,
			   "release_statuses: 600 is not an HTTP status "
			   "100..599");
	assert_route_error("release_statuses = [99];", 4,
			   "release_statuses: 99 is not an HTTP status");
}

static void test_error_methods(void **state)
{
	(void)state;
	assert_route_error("methods = [\"POST\", \"FETCH\"];", 4,
			   "methods: \"FETCH\" is not a valid HTTP method");
	assert_route_error("methods = [\"PO ST\"];", 4,
			   "\"PO ST\" is not a valid HTTP method");
	assert_route_error("methods = [\"\"];", 4,
			   "\"\" is not a valid HTTP method");
	assert_route_error("methods = [];", 4,
			   "methods: must name at least one method");
}

static void test_error_enums(void **state)
{
	(void)state;
	assert_route_error("key = \"maybe\";", 4,
			   "key: must be \"required\" or \"optional\"");
	assert_route_error("key = true;", 4,
			   "key: must be \"required\" or \"optional\"");
	assert_route_error("on_unknown = \"release\";", 4,
			   "on_unknown: must be \"release_after_lease\" or "
			   "\"hold\"");
	assert_error("database = { unavailable = \"open\"; };\n" ROUTE_A, 1,
		     "database: unavailable: must be \"reject\" or "
		     "\"forward\"");
	assert_error("database = { distributed = \"yes\"; };\n" ROUTE_A, 1,
		     "database: distributed: must be \"none\" or \"citus\"");
	assert_error("log_level = \"warning\";\n" ROUTE_A, 1,
		     "log_level: must be \"error\", \"warn\", \"info\" or "
		     "\"debug\"");
	assert_error("log_format = \"JSON\";\n" ROUTE_A, 1,
		     "log_format: must be \"json\" or \"text\"");
}

/* worker_model was removed: a conf written for an earlier release that
 * names the one model left still loads, the other is refused with why. */
static void test_worker_model_removed(void **state)
{
	(void)state;
	config *c = load_text("worker_model = \"fibers\";\n" ROUTE_A);
	assert_non_null(c);
	config_unref(c);
	assert_error("worker_model = \"threads\";\n" ROUTE_A, 1,
		     "worker_model was removed: workers are fibers "
		     "(delete the line)");
	assert_error("worker_model = 1;\n" ROUTE_A, 1,
		     "worker_model was removed: workers are fibers "
		     "(delete the line)");
}

static void test_error_listen(void **state)
{
	(void)state;
	assert_error("listen = \"8080\";\n" ROUTE_A, 1,
		     "listen: \"8080\" is not \"host:port\"");
	assert_error("listen = \"\";\n" ROUTE_A, 1, "listen: ");
	assert_error("listen = \":8080\";\n" ROUTE_A, 1,
		     "listen: missing host");
	assert_error("listen = \"localhost:0\";\n" ROUTE_A, 1,
		     "listen: port must be 1..65535");
	assert_error("listen = \"localhost:65536\";\n" ROUTE_A, 1,
		     "port must be 1..65535");
	assert_error("listen = \"::1:8080\";\n" ROUTE_A, 1,
		     "IPv6 address goes in brackets");
	assert_error("admin_listen = \"[::1:8081\";\n" ROUTE_A, 1,
		     "admin_listen: malformed IPv6 address");
	assert_error("listen = \"127.0.0.1:9999\";\n\n"
		     "admin_listen = \"127.0.0.1:9999\";\n" ROUTE_A,
		     3, "admin_listen: \"127.0.0.1:9999\" is also listen");
}

static void test_error_headers(void **state)
{
	(void)state;
	assert_route_error("replay_headers = [\"Content-Type\", \"Set-Cookie\"];",
			   4, "replay_headers: \"Set-Cookie\" is never replayed");
	assert_route_error("replay_headers = [\"date\"];", 4,
			   "replay_headers: \"date\" is never replayed");
	assert_route_error("replay_headers = [\"X:Y\"];", 4,
			   "replay_headers: \"X:Y\" is not a valid header name");
	assert_route_error("fingerprint_headers = [\"X-A\", \"\"];", 4,
			   "fingerprint_headers: \"\" is not a valid header");
	assert_error("defaults = {\n fingerprint_headers = [\"a b\"]; };\n" ROUTE_A,
		     2, "defaults: fingerprint_headers: \"a b\" is not a valid");
}

/* ---- environment ----------------------------------------------------- */

static void test_store_encryption_and_store_body(void **state)
{
	config *c = load_text(ROUTE_A);
	assert_non_null(c);
	assert_null(c->seal);
	assert_false(c->routes[0].status_only);
	config_unref(c);

	char keys[] = "/tmp/idemproxy-keys-XXXXXX";
	int fd = mkstemp(keys);
	assert_true(fd >= 0);
	const char *kt = "active = k1\n"
			 "k1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n";
	assert_int_equal(write(fd, kt, strlen(kt)), (ssize_t)strlen(kt));
	close(fd);
	char text[512];
	snprintf(text, sizeof text,
		 "store_encryption = { keys = \"%s\"; };\n"
		 "defaults = { store_body = \"status_only\"; };\n" ROUTE_A,
		 keys);
	c = load_text(text);
	assert_non_null(c);
	assert_string_equal(seal_keyring_active(c->seal), "k1");
	assert_true(c->routes[0].status_only);
	config_unref(c);

	/* A key file others may read refuses the whole conf, at its line. */
	assert_int_equal(chmod(keys, 0644), 0);
	snprintf(text, sizeof text,
		 "\nstore_encryption = {\n  keys = \"%s\";\n};\n" ROUTE_A,
		 keys);
	assert_error(text, 3, "store_encryption.keys:");
	assert_non_null(strstr(err, "accessible by group or others"));
	unlink(keys);
	assert_error(text, 3, "cannot read");
	assert_error("store_encryption = { key = \"x\"; };\n" ROUTE_A, 1,
		     "unknown setting \"key\"");
	assert_route_error("store_body = \"none\";", 4,
			   "must be \"full\" or \"status_only\"");
}

static void test_env_overrides(void **state)
{
	(void)state;
	setenv("IDEMPROXY_DATABASE_URL", "postgresql://db:5432/prod", 1);
	setenv("IDEMPROXY_LISTEN", "[::]:80", 1);
	config *c = load_text("listen = \"127.0.0.1:1\";\n"
			      "database = { url = \"postgresql:///x\"; };\n" ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	assert_string_equal(c->db_url, "postgresql://db:5432/prod");
	assert_string_equal(c->listen, "[::]:80");
	config_unref(c);

	/* Empty means unset. */
	setenv("IDEMPROXY_DATABASE_URL", "", 1);
	setenv("IDEMPROXY_LISTEN", "", 1);
	c = load_text("listen = \"127.0.0.1:1\";\n" ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	assert_string_equal(c->db_url, "postgresql:///idemproxy");
	assert_string_equal(c->listen, "127.0.0.1:1");
	config_unref(c);
}

static void test_env_listen_invalid(void **state)
{
	(void)state;
	setenv("IDEMPROXY_LISTEN", "0.0.0.0:http", 1);
	assert_null(load_text(ROUTE_A));
	assert_string_equal(err, "IDEMPROXY_LISTEN: port must be 1..65535");
	setenv("IDEMPROXY_LISTEN", "8080", 1);
	assert_null(load_text(ROUTE_A));
	assert_string_equal(err, "IDEMPROXY_LISTEN: \"8080\" is not "
				 "\"host:port\" or \"[v6]:port\"");
}

/* ---- using a loaded config ------------------------------------------- */

static const char *match(const config *c, const char *path)
{
	const route_cfg *r =
		route_match(c->routes, c->n_routes, path, strlen(path));
	return r ? r->name : NULL;
}

static void test_route_matching_order(void **state)
{
	(void)state;
	config *c = load_text(
		"routes = (\n"
		"  { name = \"capture\"; path = \"/v1/payments/{id}/capture\"; "
		"upstream = \"http://h\"; },\n"
		"  { name = \"special\"; path = \"/v1/payments/special/capture\"; "
		"upstream = \"http://h\"; },\n"
		"  { name = \"payments\"; path = \"/v1/payments\"; "
		"upstream = \"http://h\"; },\n"
		"  { name = \"rest\"; path = \"/v1/*\"; upstream = \"http://h\"; }\n"
		");\n");
	if (!c)
		fail_msg("%s", err);
	assert_string_equal(match(c, "/v1/payments/p1/capture"), "capture");
	/* Also matches "special", but "capture" comes first in the file. */
	assert_string_equal(match(c, "/v1/payments/special/capture"), "capture");
	assert_string_equal(match(c, "/v1/payments"), "payments");
	assert_string_equal(match(c, "/v1/refunds/r1"), "rest");
	assert_null(match(c, "/v2/payments"));
	/* The length is honoured: a prefix of a longer buffer. */
	const char *raw = "/v1/paymentsXYZ";
	const route_cfg *r = route_match(c->routes, c->n_routes, raw,
					 strlen("/v1/payments"));
	assert_non_null(r);
	assert_string_equal(r->name, "payments");
	config_unref(c);
}

static void test_route_methods_and_statuses(void **state)
{
	(void)state;
	config *c = load_text(ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	const route_cfg *r = &c->routes[0];
	assert_true(route_has_method(r, "POST"));
	assert_true(route_has_method(r, "PATCH"));
	assert_false(route_has_method(r, "post"));
	assert_false(route_has_method(r, "GET"));
	assert_false(route_has_method(r, "POSTX"));
	assert_true(route_releases_status(r, 503));
	assert_true(route_releases_status(r, 408));
	assert_false(route_releases_status(r, 200));
	assert_false(route_releases_status(r, 501));
	config_unref(c);
}

static void test_print_routes(void **state)
{
	(void)state;
	config *c = load_text(
		"routes = (\n"
		"  { name = \"create_payment\"; path = \"/v1/payments\"; "
		"upstream = \"http://127.0.0.1:9000/\"; },\n"
		"  { name = \"hooks\"; path = \"/hooks/*\"; "
		"upstream = \"https://h:9001\"; key = \"optional\"; "
		"methods = [\"POST\"]; tenant = \"header:X-Tenant-Id\"; "
		"ttl = \"7d\"; lease = \"90s\"; upstream_timeout = \"1m\"; }\n"
		");\n");
	if (!c)
		fail_msg("%s", err);
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	assert_non_null(f);
	config_print_routes(c, f);
	fclose(f);
	assert_string_equal(
		out,
		"create_payment  /v1/payments  -> http://127.0.0.1:9000  "
		"methods=POST,PATCH key=required tenant=static:default "
		"ttl=1d lease=30s\n"
		"hooks           /hooks/*      -> https://h:9001  "
		"methods=POST key=optional tenant=header:X-Tenant-Id "
		"ttl=7d lease=90s\n");
	free(out);
	config_unref(c);
}

static void test_refcount(void **state)
{
	(void)state;
	config *c = load_text(ROUTE_A);
	if (!c)
		fail_msg("%s", err);
	assert_int_equal(atomic_load(&c->refs), 1);
	assert_ptr_equal(config_ref(c), c);
	assert_ptr_equal(config_ref(c), c);
	assert_int_equal(atomic_load(&c->refs), 3);
	config_unref(c);
	config_unref(c);
	assert_int_equal(atomic_load(&c->refs), 1);
	/* Still whole while referenced. */
	assert_string_equal(c->routes[0].name, "a");
	config_unref(c);
	assert_null(config_ref(NULL));
	config_unref(NULL);
}

static void test_split_listen(void **state)
{
	(void)state;
	char host[64], why[128];
	int port = 0;
	assert_int_equal(config_split_listen("127.0.0.1:8080", host,
					     sizeof host, &port, why,
					     sizeof why),
			 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 8080);
	assert_int_equal(config_split_listen("[::]:1", host, sizeof host,
					     &port, why, sizeof why),
			 0);
	assert_string_equal(host, "::");
	assert_int_equal(port, 1);
	assert_int_equal(config_split_listen("localhost:65535", host, 4, &port,
					     why, sizeof why),
			 -1);
	assert_string_equal(why, "host too long");
}

/* ---- problem links ---------------------------------------------------- */

static void test_problem_links(void **state)
{
	(void)state;
	config *c = load_text(ROUTE_A);
	assert_non_null(c);
	assert_string_equal(c->problem_type_base, "urn:idemproxy:problem:");
	assert_string_equal(c->problem_doc_url, "");
	config_unref(c);
	c = load_text(
		"problem_type_base = \"https://docs.example.com/p/\";\n"
		"problem_doc_url = \"https://docs.example.com/p\";\n" ROUTE_A);
	assert_non_null(c);
	assert_string_equal(c->problem_type_base,
			    "https://docs.example.com/p/");
	assert_string_equal(c->problem_doc_url, "https://docs.example.com/p");
	config_unref(c);
	assert_error("problem_type_base = \"\";\n" ROUTE_A, 1,
		     "problem_type_base: must be 1 to 512 bytes long");
	assert_error("problem_type_base = \"docs.example.com/\";\n" ROUTE_A, 1,
		     "problem_type_base: must be an absolute URI");
	assert_error("problem_doc_url = \"https://x/\\\"a\";\n" ROUTE_A, 1,
		     "problem_doc_url: byte 11 (0x22) may not appear in a URI");
	assert_error("problem_doc_url = \"https://x/a\\r\\nX: y\";\n" ROUTE_A,
		     1, "problem_doc_url: byte 12 (0x0d)");
	assert_error("problem_doc_url = \"https://x/<a>\";\n" ROUTE_A, 1,
		     "(0x3c) may not appear in a URI");
	assert_error("problem_doc_url = 3;\n" ROUTE_A, 1,
		     "problem_doc_url: must be a string");
}

/* ---- reload rules ---------------------------------------------------- */

typedef struct rule_seen {
	int n;
	char restart[1024]; /* "scope.name," of each restart-only setting */
} rule_seen;

static void check_rule(void *arg, const char *scope, const char *name,
		       enum config_reload rule)
{
	rule_seen *seen = arg;
	seen->n++;
	if (rule != CONFIG_RELOAD_APPLY && rule != CONFIG_RELOAD_RESTART)
		fail_msg("setting \"%s%s%s\" has no reload rule (.reload in "
			 "its table row)",
			 scope, *scope ? "." : "", name);
	/* A reload replaces the routes as a whole. */
	if (!strcmp(scope, "route") || !strcmp(scope, "route-only"))
		if (rule != CONFIG_RELOAD_APPLY)
			fail_msg("route setting \"%s\" must be applied on "
				 "reload",
				 name);
	if (rule == CONFIG_RELOAD_RESTART) {
		size_t l = strlen(seen->restart);
		snprintf(seen->restart + l, sizeof seen->restart - l, "%s%s%s,",
			 scope, *scope ? "." : "", name);
	}
}

static void test_every_setting_has_a_reload_rule(void **state)
{
	(void)state;
	rule_seen seen = {0};
	config_each_setting(check_rule, &seen);
	assert_true(seen.n >= 30);
	assert_string_equal(seen.restart,
			    "listen,admin_listen,workers,"
			    "max_connections,"
			    "max_connections_per_ip,max_header_size,"
			    "database.url,database.distributed,");
}

static void test_restart_changes_name_what_differs_from_the_running(
	void **state)
{
	(void)state;
	config *a = load_text(ROUTE_A);
	assert_non_null(a);
	char names[256] = "x";
	/* Every restart-only setting is compared, without a change. */
	assert_int_equal(config_restart_changes(a, a, names, sizeof names), 0);
	assert_string_equal(names, "");
	config *b = load_text("workers = 3; queue_size = 7;\n"
			      "max_connections = 10;\n"
			      "replay_cache_size = 0; log_level = \"debug\";\n"
			      "database = { url = \"postgresql:///other\";\n"
			      "  statement_timeout = \"1s\"; };\n"
			      "reaper = { interval = \"1s\"; batch = 5; };\n"
			      "routes = ( { name = \"b\"; path = \"/b\"; "
			      "upstream = \"http://127.0.0.1:9001\"; } );\n");
	assert_non_null(b);
	assert_int_equal(config_restart_changes(a, b, names, sizeof names), 3);
	assert_string_equal(names, "workers,max_connections,database.url");
	/* cut short to fit, still terminated */
	char small[10];
	assert_int_equal(config_restart_changes(a, b, small, sizeof small), 3);
	assert_string_equal(small, "workers,m");
	config_unref(a);
	config_unref(b);
}

#define T(f) cmocka_unit_test_setup(f, clear_env)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_example_conf),
		T(test_defaults_when_absent),
		T(test_top_level_values),
		T(test_defaults_inherited_and_overridden),
		T(test_upstream_normalised),
		T(test_error_syntax),
		T(test_error_unreadable_file),
		T(test_error_unknown_settings),
		T(test_error_wrong_types),
		T(test_error_durations_and_sizes),
		T(test_error_out_of_range),
		T(test_error_duplicate_route_names),
		T(test_error_route_names),
		T(test_error_missing_route_settings),
		T(test_error_no_routes),
		T(test_error_lease_not_above_upstream_timeout),
		T(test_error_lease_without_room_for_the_margin),
		T(test_lease_margin),
		T(test_error_ttl_not_above_lease),
		T(test_error_upstream_url),
		T(test_error_path_template),
		T(test_error_tenant),
		T(test_error_key_from),
		T(test_key_from_one_string),
		T(test_error_fingerprint_pointers),
		T(test_error_jwt),
		T(test_jwt_tenant_loads),
		T(test_error_statuses),
		T(test_error_methods),
		T(test_error_enums),
		T(test_error_listen),
		T(test_error_headers),
		T(test_store_encryption_and_store_body),
		T(test_env_overrides),
		T(test_env_listen_invalid),
		T(test_route_matching_order),
		T(test_route_methods_and_statuses),
		T(test_print_routes),
		T(test_refcount),
		T(test_split_listen),
		T(test_problem_links),
		T(test_every_setting_has_a_reload_rule),
		T(test_worker_model_removed),
		T(test_restart_changes_name_what_differs_from_the_running),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
