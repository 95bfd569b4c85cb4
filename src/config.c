/* The conf file as data. Each scope (top level, database, reaper, the per-route
 * settings shared by `defaults` and the routes, the route-only settings) is a
 * table of settings: name, converter, default, bounds, destination, and what
 * a reload does with it. Loading walks the tables; nothing is read from the
 * file outside them.
 *
 * Defaults are written in conf-file syntax and parsed by libconfig like the
 * file itself, so they go through the same converters and bounds as what an
 * operator writes and can never bypass validation. */
#include "config.h"

#include <errno.h>
#include <libconfig.h>
#include <stdlib.h>
#include <string.h>

#include "config_table.h"
#include "problem.h"

/* ---- the tables ------------------------------------------------------ */

static const cfg_choice cfg_log_levels[] = {
	{"error", LOG_ERROR}, {"warn", LOG_WARN}, {"info", LOG_INFO},
	{"debug", LOG_DEBUG}, {NULL, 0},
};
static const cfg_choice cfg_log_formats[] = {
	{"json", 1}, {"text", 0}, {NULL, 0}};
static const cfg_choice cfg_unavailable[] = {
	{"reject", 0}, {"forward", 1}, {NULL, 0}};
static const cfg_choice cfg_distributed[] = {
	{"none", 0}, {"citus", 1}, {NULL, 0}};
static const cfg_choice cfg_key_modes[] = {
	{"required", 1}, {"optional", 0}, {NULL, 0}};
static const cfg_choice cfg_on_unknown[] = {
	{"release_after_lease", 0}, {"hold", 1}, {NULL, 0}};
static const cfg_choice cfg_store_body[] = {
	{"full", 0}, {"status_only", 1}, {NULL, 0}};
static const cfg_choice cfg_in_flight[] = {
	{"reject", 0}, {"wait", 1}, {NULL, 0}};
static const cfg_choice cfg_mismatch[] = {
	{"409", 409}, {"422", 422}, {NULL, 0}};

/* Reload rules. Routes, and whatever is read from the request's own
 * configuration, apply to the next request. Restart-only: the listeners,
 * the thread count and database.url make threads and sockets at start;
 * max_connections and max_connections_per_ip are libmicrohttpd daemon
 * options; max_header_size sizes each connection's memory at start (a lower
 * value is enforced on the next request anyway, a higher one cannot be). */
#define C_(f) offsetof(config, f)
#define R_(f) offsetof(route_cfg, f)

static const cfg_opt cfg_top[] = {
	{.name = "listen", .conv = cfg_conv_listen,
	 .def = "\"127.0.0.1:8080\"", .off = C_(listen), .reload = CFG_RESTART},
	{.name = "admin_listen", .conv = cfg_conv_listen_or_off,
	 .def = "\"127.0.0.1:8081\"", .off = C_(admin_listen),
	 .reload = CFG_RESTART},
	{.name = "admin_token", .conv = cfg_conv_string, .def = "\"\"",
	 .off = C_(admin_token), .reload = CFG_APPLY},
	/* Checked against the routes once they are loaded
	 * (cfg_check_contract_path). */
	{.name = "contract_path", .conv = cfg_conv_string, .def = "\"\"",
	 .off = C_(contract_path), .reload = CFG_APPLY},
	{.name = "workers", .conv = cfg_conv_int, .def = "16", .min = 1,
	 .max = 1024, .off = C_(workers), .reload = CFG_RESTART},
	{.name = "queue_size", .conv = cfg_conv_int, .def = "1024", .min = 1,
	 .max = 1048576, .off = C_(queue_size), .reload = CFG_APPLY},
	{.name = "max_connections", .conv = cfg_conv_int, .def = "1024",
	 .min = 1, .max = 1048576, .off = C_(max_connections),
	 .reload = CFG_RESTART},
	{.name = "max_connections_per_ip", .conv = cfg_conv_int, .def = "0",
	 .min = 0, .max = 1048576, .off = C_(max_connections_per_ip),
	 .reload = CFG_RESTART},
	{.name = "max_header_size", .conv = cfg_conv_size,
	 .def = "\"32KiB\"", .min = 1024, .max = 1 << 20,
	 .off = C_(max_header_size), .reload = CFG_RESTART},
	{.name = "max_request_body", .conv = cfg_conv_size,
	 .def = "\"1MiB\"", .min = 1, .max = CFG_GIB,
	 .off = C_(max_request_body), .reload = CFG_APPLY},
	{.name = "max_stored_response", .conv = cfg_conv_size,
	 .def = "\"4MiB\"", .min = 1, .max = CFG_GIB,
	 .off = C_(max_stored_response), .reload = CFG_APPLY},
	{.name = "max_response", .conv = cfg_conv_size,
	 .def = "\"256MiB\"", .min = 1, .max = 16 * CFG_GIB,
	 .off = C_(max_response), .reload = CFG_APPLY},
	{.name = "replay_cache_size", .conv = cfg_conv_size,
	 .def = "\"64MiB\"", .min = 0, .max = 16 * CFG_GIB,
	 .off = C_(replay_cache_size), .reload = CFG_APPLY},
	{.name = "replay_cache_ttl", .conv = cfg_conv_duration,
	 .def = "\"10s\"", .min = 0, .max = CFG_MS_DAY,
	 .off = C_(replay_cache_ttl_ms), .reload = CFG_APPLY},
	{.name = "max_waiters", .conv = cfg_conv_int, .def = "1000",
	 .min = 0, .max = 1048576, .off = C_(max_waiters),
	 .reload = CFG_APPLY},
	/* 0: half of max_waiters, so that one tenant never takes them all. */
	{.name = "max_waiters_per_tenant", .conv = cfg_conv_int, .def = "0",
	 .min = 0, .max = 1048576, .off = C_(max_waiters_per_tenant),
	 .reload = CFG_APPLY},
	{.name = "shutdown_grace", .conv = cfg_conv_duration,
	 .def = "\"10s\"", .min = 0, .max = CFG_MS_HOUR,
	 .off = C_(shutdown_grace_ms), .reload = CFG_APPLY},
	/* Whole-request deadlines (MHD's 30 s timeout is an idle timeout that
	 * a trickling client resets with every byte). */
	{.name = "request_head_timeout", .conv = cfg_conv_duration,
	 .def = "\"60s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(request_head_timeout_ms), .reload = CFG_APPLY},
	{.name = "request_body_timeout", .conv = cfg_conv_duration,
	 .def = "\"300s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(request_body_timeout_ms), .reload = CFG_APPLY},
	{.name = "busy_poll", .conv = cfg_conv_duration, .def = "\"0ms\"",
	 .min = 0, .max = 100, .off = C_(busy_poll_ms), .reload = CFG_APPLY},
	/* How late the serving loop's heartbeat may be before /readyz fails
	 * (fiber.h: the loop beats at least every FIBER_BEAT_MS). */
	{.name = "loop_stall_max", .conv = cfg_conv_duration,
	 .def = "\"2s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(loop_stall_max_ms), .reload = CFG_APPLY},
	{.name = "log_level", .conv = cfg_conv_enum, .def = "\"info\"",
	 .off = C_(log_level), .choices = cfg_log_levels, .reload = CFG_APPLY},
	{.name = "log_format", .conv = cfg_conv_flag, .def = "\"json\"",
	 .off = C_(log_json), .choices = cfg_log_formats, .reload = CFG_APPLY},
	{.name = "log_flush_interval", .conv = cfg_conv_duration,
	 .def = "\"100ms\"", .min = 0, .max = 60000,
	 .off = C_(log_flush_ms), .reload = CFG_APPLY},
	/* Bounds are of the length; min 0: may be empty (off). The code is
	 * appended to the base, so it leaves room for the longest. */
	{.name = "problem_type_base", .conv = cfg_conv_uri,
	 .def = "\"" PROBLEM_TYPE_BASE_DEFAULT "\"", .min = 1, .max = 512,
	 .off = C_(problem_type_base), .reload = CFG_APPLY},
	{.name = "problem_doc_url", .conv = cfg_conv_uri, .def = "\"\"",
	 .min = 0, .max = 2048, .off = C_(problem_doc_url),
	 .reload = CFG_APPLY},
};

static const cfg_opt cfg_database[] = {
	{.name = "url", .conv = cfg_conv_string,
	 .def = "\"postgresql:///idemproxy\"", .off = C_(db_url),
	 .reload = CFG_RESTART},
	{.name = "statement_timeout", .conv = cfg_conv_duration,
	 .def = "\"2s\"", .min = 1, .max = CFG_MS_HOUR,
	 .off = C_(statement_timeout_ms), .reload = CFG_APPLY},
	{.name = "unavailable", .conv = cfg_conv_flag, .def = "\"reject\"",
	 .off = C_(db_unavailable_forward), .choices = cfg_unavailable,
	 .reload = CFG_APPLY},
	{.name = "distributed", .conv = cfg_conv_flag, .def = "\"none\"",
	 .off = C_(db_citus), .choices = cfg_distributed, .reload = CFG_RESTART},
	/* First attempts per claim or record statement (store_batch.h); 1:
	 * each alone. The ceiling is what one statement carries. */
	{.name = "batch", .conv = cfg_conv_int, .def = "64", .min = 1,
	 .max = 256, .off = C_(db_batch), .reload = CFG_APPLY},
	/* The least time a batch statement is out before calls stop waiting
	 * behind it (store_batch.h: or 8 times the lane's average round
	 * trip, if longer). */
	{.name = "batch_stall", .conv = cfg_conv_duration, .def = "\"250ms\"",
	 .min = 10, .max = CFG_MS_HOUR, .off = C_(db_batch_stall_ms),
	 .reload = CFG_APPLY},
};

/* A reaper faster than 100ms would only keep the database busy. */
static const cfg_opt cfg_reaper[] = {
	{.name = "interval", .conv = cfg_conv_duration, .def = "\"5s\"",
	 .min = 100, .max = CFG_MS_HOUR, .off = C_(reaper_interval_ms),
	 .reload = CFG_APPLY},
	{.name = "batch", .conv = cfg_conv_int, .def = "1000", .min = 1,
	 .max = 100000, .off = C_(reaper_batch), .reload = CFG_APPLY},
	/* How often the store's synchronous standbys are read again between
	 * the other checks (reaper.c): one cheap query; 30 s keeps the gauge
	 * well within the 5 minutes IdemproxyStoreNotSynchronous waits. */
	{.name = "durability_interval", .conv = cfg_conv_duration,
	 .def = "\"30s\"", .min = 100, .max = CFG_MS_HOUR,
	 .off = C_(reaper_durability_interval_ms), .reload = CFG_APPLY},
};

/* Settable in `defaults` and in each route. */
const cfg_opt cfg_route[] = {
	{.name = "methods", .conv = cfg_conv_methods,
	 .def = "[\"POST\", \"PATCH\"]", .off = R_(methods),
	 .reload = CFG_APPLY},
	{.name = "key", .conv = cfg_conv_flag, .def = "\"required\"",
	 .off = R_(key_required), .choices = cfg_key_modes,
	 .reload = CFG_APPLY},
	{.name = "tenant", .conv = cfg_conv_tenant,
	 .def = "\"static:default\"", .off = R_(tenant_kind),
	 .aux = R_(tenant_arg), .reload = CFG_APPLY},
	{.name = "ttl", .conv = cfg_conv_duration, .def = "\"24h\"",
	 .min = CFG_MS_SECOND, .max = 3650 * CFG_MS_DAY, .off = R_(ttl_ms),
	 .reload = CFG_APPLY},
	/* "0s": unset, follows ttl (cfg_route_retain_rule). */
	{.name = "retain_key", .conv = cfg_conv_duration, .def = "\"0s\"",
	 .min = 0, .max = 3650 * CFG_MS_DAY, .off = R_(retain_key_ms),
	 .reload = CFG_APPLY},
	{.name = "lease", .conv = cfg_conv_duration, .def = "\"30s\"",
	 .min = 1, .max = CFG_MS_DAY, .off = R_(lease_ms), .reload = CFG_APPLY},
	{.name = "upstream_timeout", .conv = cfg_conv_duration,
	 .def = "\"25s\"", .min = 1, .max = CFG_MS_DAY,
	 .off = R_(upstream_timeout_ms), .reload = CFG_APPLY},
	{.name = "retry_after", .conv = cfg_conv_duration, .def = "\"1s\"",
	 .min = 1, .max = CFG_MS_HOUR, .off = R_(retry_after_ms),
	 .reload = CFG_APPLY},
	{.name = "mismatch_status", .conv = cfg_conv_int_choice, .def = "409",
	 .off = R_(mismatch_status), .choices = cfg_mismatch,
	 .reload = CFG_APPLY},
	{.name = "release_statuses", .conv = cfg_conv_statuses,
	 .def = "[408, 425, 429, 500, 502, 503, 504]", .min = 100,
	 .max = 599, .off = R_(release_statuses),
	 .aux = R_(n_release_statuses), .reload = CFG_APPLY},
	{.name = "on_unknown", .conv = cfg_conv_flag,
	 .def = "\"release_after_lease\"", .off = R_(on_unknown_hold),
	 .choices = cfg_on_unknown, .reload = CFG_APPLY},
	{.name = "replay_headers", .conv = cfg_conv_replay_headers,
	 .def = "[\"Content-Type\", \"Content-Language\", \"Location\", "
		"\"ETag\", \"Last-Modified\", \"Link\", \"Cache-Control\"]",
	 .off = R_(replay_headers), .reload = CFG_APPLY},
	{.name = "fingerprint_headers", .conv = cfg_conv_headers, .def = "[]",
	 .off = R_(fingerprint_headers), .reload = CFG_APPLY},
	{.name = "store_body", .conv = cfg_conv_flag, .def = "\"full\"",
	 .off = R_(status_only), .choices = cfg_store_body, .reload = CFG_APPLY},
	{.name = "key_from", .conv = cfg_conv_key_from,
	 .def = "[\"header:Idempotency-Key\"]", .off = R_(key_from), .reload = CFG_APPLY},
	{.name = "fingerprint_ignore", .conv = cfg_conv_pointers, .def = "[]",
	 .off = R_(fp_ignore), .aux = R_(n_fp_ignore), .reload = CFG_APPLY},
	{.name = "fingerprint_only", .conv = cfg_conv_pointers, .def = "[]",
	 .off = R_(fp_only), .aux = R_(n_fp_only), .reload = CFG_APPLY},
	{.name = "jwt", .conv = cfg_conv_jwt, .def = "{}", .off = R_(jwt), .reload = CFG_APPLY},
	{.name = "in_flight", .conv = cfg_conv_flag, .def = "\"reject\"",
	 .off = R_(in_flight_wait), .choices = cfg_in_flight,
	 .reload = CFG_APPLY},
	{.name = "wait_max", .conv = cfg_conv_duration, .def = "\"10s\"",
	 .min = 1, .max = CFG_MS_DAY, .off = R_(wait_max_ms),
	 .reload = CFG_APPLY},
};

/* Only in a route, and required there (no default). */
const cfg_opt cfg_route_only[] = {
	{.name = "name", .conv = cfg_conv_route_name, .off = R_(name),
	 .reload = CFG_APPLY},
	{.name = "path", .conv = cfg_conv_path, .off = R_(path),
	 .aux = R_(tpl), .reload = CFG_APPLY},
	{.name = "upstream", .conv = cfg_conv_upstream, .off = R_(upstream),
	 .reload = CFG_APPLY},
};
const size_t cfg_route_n = CFG_N(cfg_route);
const size_t cfg_route_only_n = CFG_N(cfg_route_only);

/* The key file is read (and its keys checked) with the conf, so a reload
 * with a bad key file keeps the old keys along with the old conf. */
static const cfg_opt cfg_seal[] = {
	{.name = "keys", .conv = cfg_conv_string, .def = "\"\"",
	 .off = C_(seal_keys_file), .reload = CFG_APPLY},
	/* Random 96-bit nonces are safe for about 2^32 seals per key: warn at
	 * half of that, leaving the other half for the rotation. */
	{.name = "warn_seals", .conv = cfg_conv_int64, .def = "2147483648L",
	 .min = 1, .max = INT64_C(4294967296), .off = C_(seal_warn_seals),
	 .reload = CFG_APPLY},
};

/* Top-level groups, handled by code rather than converters. */
static const char *const cfg_sections[] = {"database", "reaper", "defaults",
					   "routes", "store_encryption"};

/* The tables with defaults; a scope's name is also its group in the file
 * (but for top and route) and in the built-in defaults. */
enum cfg_scope_id { CFG_TOP, CFG_DATABASE, CFG_REAPER, CFG_ROUTE, CFG_SEAL };
static const struct cfg_scope {
	const char *name;
	const cfg_opt *opts;
	size_t n;
} cfg_scopes[] = {
	[CFG_TOP] = {"top", cfg_top, CFG_N(cfg_top)},
	[CFG_DATABASE] = {"database", cfg_database, CFG_N(cfg_database)},
	[CFG_REAPER] = {"reaper", cfg_reaper, CFG_N(cfg_reaper)},
	[CFG_ROUTE] = {"route", cfg_route, CFG_N(cfg_route)},
	[CFG_SEAL] = {"store_encryption", cfg_seal, CFG_N(cfg_seal)},
};

/* ---- reload rules ---------------------------------------------------- */

static const struct {
	const char *scope;
	const cfg_opt *opts;
	size_t n;
	bool per_route; /* into route_cfg, not config */
} cfg_all_tables[] = {
	{"", cfg_top, CFG_N(cfg_top), false},
	{"database", cfg_database, CFG_N(cfg_database), false},
	{"reaper", cfg_reaper, CFG_N(cfg_reaper), false},
	{"route", cfg_route, CFG_N(cfg_route), true},
	{"route-only", cfg_route_only, CFG_N(cfg_route_only), true},
	{"store_encryption", cfg_seal, CFG_N(cfg_seal), false},
};

void config_each_setting(void (*fn)(void *arg, const char *scope,
				    const char *name,
				    enum config_reload rule),
			 void *arg)
{
	for (size_t i = 0; i < CFG_N(cfg_all_tables); i++)
		for (size_t j = 0; j < cfg_all_tables[i].n; j++)
			fn(arg, cfg_all_tables[i].scope,
			   cfg_all_tables[i].opts[j].name,
			   cfg_all_tables[i].opts[j].reload);
}

#define CFG_VAL(o, base, type) (*(const type *)((const char *)(base) + (o)->off))

/* Restart-only settings are single values of the top-level scopes; a row of
 * another kind marked restart-only fails here, in the unit test. */
static bool cfg_same(const cfg_opt *o, const config *a, const config *b)
{
	if (o->conv == cfg_conv_string || o->conv == cfg_conv_uri ||
	    o->conv == cfg_conv_listen ||
	    o->conv == cfg_conv_listen_or_off)
		return strcmp(CFG_VAL(o, a, char *), CFG_VAL(o, b, char *)) == 0;
	if (o->conv == cfg_conv_int || o->conv == cfg_conv_enum ||
	    o->conv == cfg_conv_int_choice)
		return CFG_VAL(o, a, int) == CFG_VAL(o, b, int);
	if (o->conv == cfg_conv_duration || o->conv == cfg_conv_size)
		return CFG_VAL(o, a, int64_t) == CFG_VAL(o, b, int64_t);
	ALWAYS_ASSERT(o->conv == cfg_conv_flag);
	return CFG_VAL(o, a, bool) == CFG_VAL(o, b, bool);
}

size_t config_restart_changes(const config *running, const config *next,
			      char *buf, size_t len)
{
	growbuf names = {0};
	size_t n = 0;
	for (size_t i = 0; i < CFG_N(cfg_all_tables); i++) {
		/* Routes are replaced as a whole, on every reload. */
		if (cfg_all_tables[i].per_route)
			continue;
		for (size_t j = 0; j < cfg_all_tables[i].n; j++) {
			const cfg_opt *o = &cfg_all_tables[i].opts[j];
			if (o->reload != CFG_RESTART ||
			    cfg_same(o, running, next))
				continue;
			growbuf_printf(&names, "%s%s%s%s", n ? "," : "",
				       cfg_all_tables[i].scope,
				       *cfg_all_tables[i].scope ? "." : "",
				       o->name);
			n++;
		}
	}
	snprintf(buf, len, "%s", names.data ? names.data : "");
	growbuf_free(&names);
	return n;
}

/* ---- applying tables ------------------------------------------------- */

static const cfg_opt *cfg_find(const cfg_opt *opts, size_t n,
			       const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

static void cfg_builtin_load(config_t *lc)
{
	growbuf b = {0};
	for (size_t i = 0; i < CFG_N(cfg_scopes); i++) {
		growbuf_printf(&b, "%s = {\n", cfg_scopes[i].name);
		for (size_t j = 0; j < cfg_scopes[i].n; j++)
			growbuf_printf(&b, "  %s = %s;\n",
				       cfg_scopes[i].opts[j].name,
				       cfg_scopes[i].opts[j].def);
		growbuf_puts(&b, "};\n");
	}
	config_init(lc);
	ALWAYS_ASSERT(config_read_string(lc, b.data) == CONFIG_TRUE);
	growbuf_free(&b);
}

const config_setting_t *cfg_member(const config_setting_t *g, const char *name)
{
	return g ? config_setting_get_member(g, name) : NULL;
}

static const config_setting_t *cfg_builtin(cfg_ctx *x, const char *scope,
					   const char *name)
{
	return cfg_member(cfg_member(config_root_setting(&x->builtin), scope),
			  name);
}

/* Every setting of opts into base, each from the first of: group, fallback
 * (the `defaults` group for a route), the built-in default. prefix names the
 * scope in messages ("database: ", "route \"x\": "). */
int cfg_apply(cfg_ctx *x, const char *scope, const cfg_opt *opts, size_t n,
	      const config_setting_t *group, const config_setting_t *fallback,
	      void *base, const char *prefix)
{
	for (size_t i = 0; i < n; i++) {
		const cfg_opt *o = &opts[i];
		const config_setting_t *s = cfg_member(group, o->name);
		if (!s)
			s = cfg_member(fallback, o->name);
		bool builtin = !s;
		if (builtin && !o->def)
			return cfg_fail(x, group,
					"%smissing required setting \"%s\"",
					prefix, o->name);
		if (builtin)
			s = cfg_builtin(x, scope, o->name);
		ALWAYS_ASSERT(s);
		char why[CFG_WHY];
		if (o->conv(o, s, base, why, sizeof why) == 0)
			continue;
		ALWAYS_ASSERT(!builtin);
		return cfg_fail(x, s, "%s%s: %s", prefix, o->name, why);
	}
	return 0;
}

/* Names the first setting of group that opts does not know. Route-only
 * settings are known only where route_only is true, and elsewhere get a hint. */
int cfg_check_known(cfg_ctx *x, const config_setting_t *group,
		    const cfg_opt *opts, size_t n, bool route_only,
		    const char *prefix)
{
	for (int i = 0; i < config_setting_length(group); i++) {
		const config_setting_t *s =
			config_setting_get_elem(group, (unsigned)i);
		const char *name = config_setting_name(s);
		bool in_route_only =
			cfg_find(cfg_route_only, CFG_N(cfg_route_only), name);
		if (cfg_find(opts, n, name) || (route_only && in_route_only))
			continue;
		if (in_route_only)
			return cfg_fail(x, s,
					"%s\"%s\" can only be set in a route",
					prefix, name);
		return cfg_fail(x, s, "%sunknown setting \"%s\"", prefix, name);
	}
	return 0;
}

/* Top-level settings a release removed. A conf written for an earlier
 * release may still name one: the value that is now the only behaviour
 * passes silently, any other is refused with the reason rather than as an
 * unknown setting. */
static const struct {
	const char *name, *kept, *why;
} cfg_removed[] = {
	{"worker_model", "fibers",
	 "worker_model was removed: workers are fibers (delete the line)"},
};

static int cfg_check_removed(cfg_ctx *x, const config_setting_t *s,
			     bool *known)
{
	const char *name = config_setting_name(s);
	for (size_t i = 0; i < CFG_N(cfg_removed); i++) {
		if (strcmp(name, cfg_removed[i].name) != 0)
			continue;
		const char *v = config_setting_type(s) == CONFIG_TYPE_STRING
					? config_setting_get_string(s)
					: NULL;
		if (!v || strcmp(v, cfg_removed[i].kept) != 0)
			return cfg_fail(x, s, "%s", cfg_removed[i].why);
		*known = true;
	}
	return 0;
}

static int cfg_check_top_known(cfg_ctx *x, const config_setting_t *root)
{
	for (int i = 0; i < config_setting_length(root); i++) {
		const config_setting_t *s =
			config_setting_get_elem(root, (unsigned)i);
		const char *name = config_setting_name(s);
		bool known = cfg_find(cfg_top, CFG_N(cfg_top), name) != NULL;
		if (cfg_check_removed(x, s, &known) < 0)
			return -1;
		for (size_t j = 0; j < CFG_N(cfg_sections); j++)
			known = known || strcmp(name, cfg_sections[j]) == 0;
		if (!known)
			return cfg_fail(x, s, "unknown setting \"%s\"", name);
	}
	return 0;
}

/* An optional top-level group: absent is fine, anything but a group is not. */
int cfg_want_group(cfg_ctx *x, const config_setting_t *g, const char *name)
{
	if (!g || config_setting_is_group(g))
		return 0;
	return cfg_fail(x, g, "%s: must be a group { ... }, not %s", name,
			cfg_type_name(g));
}

/* database = { ... } or reaper = { ... } into c. */
static int cfg_load_section(cfg_ctx *x, const config_setting_t *root,
			    const struct cfg_scope *sc, config *c)
{
	const config_setting_t *g = cfg_member(root, sc->name);
	char prefix[64];
	snprintf(prefix, sizeof prefix, "%s: ", sc->name);
	if (cfg_want_group(x, g, sc->name) < 0)
		return -1;
	if (g && cfg_check_known(x, g, sc->opts, sc->n, false, prefix) < 0)
		return -1;
	return cfg_apply(x, sc->name, sc->opts, sc->n, g, NULL, c, prefix);
}

/* ---- the whole file -------------------------------------------------- */

static void cfg_free(config *c)
{
	free(c->file);
	free(c->listen);
	free(c->admin_listen);
	free(c->admin_token);
	free(c->contract_path);
	free(c->problem_type_base);
	free(c->problem_doc_url);
	free(c->db_url);
	free(c->seal_keys_file);
	seal_keyring_free(c->seal);
	for (size_t i = 0; i < c->n_routes; i++)
		cfg_route_free(&c->routes[i]);
	free(c->routes);
	free(c);
}

/* Containers set these instead of editing the file. An empty variable counts
 * as unset, the usual way to clear one in a compose file. */
static int cfg_env_overrides(cfg_ctx *x, config *c)
{
	const char *url = getenv("IDEMPROXY_DATABASE_URL");
	if (url && *url) {
		free(c->db_url);
		c->db_url = xstrdup(url);
	}
	const char *listen = getenv("IDEMPROXY_LISTEN");
	if (!listen || !*listen)
		return 0;
	char host[256], why[CFG_WHY];
	int port;
	if (config_split_listen(listen, host, sizeof host, &port, why,
				sizeof why) < 0) {
		snprintf(x->err, x->errlen, "IDEMPROXY_LISTEN: %s", why);
		return -1;
	}
	free(c->listen);
	c->listen = xstrdup(listen);
	return 0;
}

/* store_encryption.keys names the key file; its errors carry its own
 * FILE:LINE. */
static int cfg_load_keys(cfg_ctx *x, config *c, const config_setting_t *root)
{
	if (!*c->seal_keys_file)
		return 0;
	char why[512];
	c->seal = seal_keyring_load(c->seal_keys_file, why, sizeof why);
	if (c->seal)
		return 0;
	const config_setting_t *g = cfg_member(root, "store_encryption");
	return cfg_fail(x, cfg_member(g, "keys"), "store_encryption.keys: %s",
			why);
}

/* Why p cannot be contract_path, or NULL. It is compared with paths in
 * the form requests are routed in, so it must already be in that form. */
static const char *cfg_contract_path_why(const char *p)
{
	size_t len = strlen(p), nlen;
	if (p[0] != '/')
		return "it must start with '/'";
	if (strcspn(p, "?#") != len)
		return "a path has no query or fragment";
	char *norm = xmalloc(len + 1);
	const char *why = NULL;
	if (pathtpl_normalize(p, len, norm, &nlen, &why) == 0 &&
	    (nlen != len || memcmp(norm, p, len) != 0))
		why = "write it as requests are routed: no trailing '/', "
		      "unreserved characters unescaped, escapes in upper case";
	free(norm);
	return why;
}

/* The contract is served at a path that no route can have: a request
 * there would otherwise be two things. */
static int cfg_check_contract_path(cfg_ctx *x, config *c,
				   const config_setting_t *root)
{
	const char *p = c->contract_path;
	if (!*p)
		return 0;
	const config_setting_t *s = cfg_member(root, "contract_path");
	const char *why = cfg_contract_path_why(p);
	if (why)
		return cfg_fail(x, s, "contract_path: \"%s\": %s", p, why);
	const route_cfg *r = route_match(c->routes, c->n_routes, p, strlen(p));
	if (r)
		return cfg_fail(x, s,
				"contract_path: \"%s\" is a path of route "
				"\"%s\" (line %d); choose a path no route "
				"matches",
				p, r->name, r->line);
	return 0;
}

static int cfg_load_all(cfg_ctx *x, config *c, const config_setting_t *root)
{
	const config_setting_t *defaults = cfg_member(root, "defaults");
	if (cfg_check_top_known(x, root) < 0 ||
	    cfg_apply(x, "top", cfg_top, CFG_N(cfg_top), root, NULL, c, "") <
		    0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_DATABASE], c) < 0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_REAPER], c) < 0 ||
	    cfg_load_section(x, root, &cfg_scopes[CFG_SEAL], c) < 0 ||
	    cfg_load_keys(x, c, root) < 0 ||
	    cfg_check_defaults(x, defaults) < 0 ||
	    cfg_load_routes(x, c, root, defaults) < 0 ||
	    cfg_check_contract_path(x, c, root) < 0 ||
	    cfg_env_overrides(x, c) < 0)
		return -1;
	if (*c->admin_listen && strcmp(c->admin_listen, c->listen) == 0)
		return cfg_fail(x, cfg_member(root, "admin_listen"),
				"admin_listen: \"%s\" is also listen",
				c->admin_listen);
	return 0;
}

config *config_load(const char *file, char *err, size_t errlen)
{
	cfg_ctx x = {.file = file, .err = err, .errlen = errlen};
	config_t lc;
	config_init(&lc);
	errno = 0;
	if (config_read_file(&lc, file) != CONFIG_TRUE) {
		/* libconfig keeps errno from the failed open or read; a
		 * directory opens fine and fails with errno still 0. */
		int e = errno;
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
			snprintf(err, errlen, "%s: cannot read: %s", file,
				 e ? strerror(e) : "not a regular file");
		else
			snprintf(err, errlen, "%s:%d: %s",
				 config_error_file(&lc) ? config_error_file(&lc)
							: file,
				 config_error_line(&lc), config_error_text(&lc));
		config_destroy(&lc);
		return NULL;
	}

	cfg_builtin_load(&x.builtin);
	config *c = xcalloc(1, sizeof *c);
	atomic_init(&c->refs, 1);
	c->file = xstrdup(file);
	int rc = cfg_load_all(&x, c, config_root_setting(&lc));
	config_destroy(&x.builtin);
	config_destroy(&lc);
	if (rc < 0) {
		cfg_free(c);
		return NULL;
	}
	return c;
}

config *config_ref(config *c)
{
	if (c)
		atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
	return c;
}

/* acq_rel so the thread that frees sees every other holder's last use. */
void config_unref(config *c)
{
	if (!c)
		return;
	int before =
		atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel);
	ALWAYS_ASSERT(before > 0);
	if (before == 1)
		cfg_free(c);
}
