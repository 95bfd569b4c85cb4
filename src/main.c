/* idemproxy: wiring. Loads the conf, checks the schema, starts the workers,
 * the front end, the admin listener and the reaper, then waits for signals. */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "busy.h"
#include "config.h"
#include "http_front.h"
#include "log.h"
#include "proxy.h"
#include "reaper.h"
#include "replay_cache.h"
#include "store_pg.h"
#include "upstream.h"
#include "worker.h"

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "0.1.0"
#endif

/* The configuration in force; SIGHUP swaps it. Requests hold a reference to
 * the one they started with. */
static pthread_mutex_t cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static config *cfg_current;

static config *get_config(void *arg)
{
	pthread_mutex_lock(&cfg_mu);
	config *c = config_ref(cfg_current);
	pthread_mutex_unlock(&cfg_mu);
	return c;
}

static bool submit_job(void *arg, job *j)
{
	return worker_pool_submit(arg, j);
}

static void forget_cached(void *arg, const char *tenant,
			  const char *operation, const char *key)
{
	replay_key k = {tenant, operation, key};
	replay_cache_forget(arg, &k);
}

static void usage(FILE *out)
{
	fputs("usage: idemproxy -c FILE [--check | --migrate]\n"
	      "       idemproxy --version | --help\n"
	      "\n"
	      "  -c, --config FILE  the conf file (libconfig syntax)\n"
	      "      --check        validate FILE, print its routes, exit\n"
	      "      --migrate      apply missing database migrations, exit\n"
	      "  -V, --version      print the version\n"
	      "  -h, --help         this text\n"
	      "\n"
	      "Environment: IDEMPROXY_DATABASE_URL replaces database.url,\n"
	      "IDEMPROXY_LISTEN replaces listen.\n",
	      out);
}

static int cmd_migrate(config *cfg)
{
	char err[512];
	store *s = store_new(cfg->db_url, cfg->statement_timeout_ms);
	int applied = 0;
	int rc = store_migrate(s, &applied, err, sizeof err);
	store_free(s);
	if (rc) {
		fprintf(stderr, "idemproxy: migrate failed: %s\n", err);
		return 1;
	}
	printf("migrations applied: %d (schema version %d)\n", applied,
	       store_expected_version());
	return 0;
}

static int check_schema(config *cfg)
{
	char err[512];
	store *s = store_new(cfg->db_url, cfg->statement_timeout_ms);
	int version = 0;
	int rc = store_schema_version(s, &version, err, sizeof err);
	store_free(s);
	if (rc) {
		fprintf(stderr, "idemproxy: cannot reach the database: %s\n",
			err);
		return -1;
	}
	if (version < store_expected_version()) {
		fprintf(stderr,
			"idemproxy: database schema is version %d, this binary "
			"needs %d: run `idemproxy -c %s --migrate`\n",
			version, store_expected_version(), cfg->file);
		return -1;
	}
	return 0;
}

static void reload(const char *file)
{
	char err[1024];
	config *n = config_load(file, err, sizeof err);
	if (!n) {
		log_error("reload failed; keeping the old configuration", "%s",
			  err);
		return;
	}
	pthread_mutex_lock(&cfg_mu);
	config *old = cfg_current;
	if (strcmp(old->listen, n->listen) || old->workers != n->workers ||
	    strcmp(old->db_url, n->db_url) ||
	    strcmp(old->admin_listen, n->admin_listen))
		log_warn("reload: listen, admin_listen, workers and "
			 "database.url take effect only after a restart",
			 NULL);
	cfg_current = n;
	pthread_mutex_unlock(&cfg_mu);
	log_setup(n->log_level, n->log_json);
	busy_set_budget_ms(n->busy_poll_ms);
	log_info("configuration reloaded", "file=%s routes=%zu", file,
		 n->n_routes);
	config_unref(old);
}

static int serve(config *cfg)
{
	if (check_schema(cfg) || upstream_global_init()) {
		config_unref(cfg);
		return 1;
	}
	json_object_seed(0);
	signal(SIGPIPE, SIG_IGN);
	/* Every thread inherits this mask; only the main thread takes the
	 * signals, with sigwait. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	cfg_current = cfg;
	busy_set_budget_ms(cfg->busy_poll_ms);
	char err[512];
	replay_cache *cache =
		cfg->replay_cache_size > 0
			? replay_cache_new((size_t)cfg->replay_cache_size)
			: NULL;
	proxy_shared shared = {cfg->db_url, cfg->statement_timeout_ms, cache};
	worker_ops ops = {proxy_worker_init, proxy_worker_handle,
			  proxy_worker_fini, &shared};
	admin *adm = NULL;
	if (cfg->admin_listen[0]) {
		admin_opts ao = {
			.listen = cfg->admin_listen,
			.db_url = cfg->db_url,
			.statement_timeout_ms = cfg->statement_timeout_ms,
			.get_config = get_config,
			.forget = cache ? forget_cached : NULL,
			.forget_arg = cache,
		};
		adm = admin_start(&ao, err, sizeof err);
		if (!adm) {
			fprintf(stderr, "idemproxy: admin: %s\n", err);
			goto fail;
		}
	}
	worker_pool *pool =
		worker_pool_start(cfg->workers, cfg->queue_size, &ops);
	front_opts fo = {
		.listen = cfg->listen,
		.max_connections = cfg->max_connections,
		.max_connections_per_ip = cfg->max_connections_per_ip,
		.max_header_size = cfg->max_header_size,
		.get_config = get_config,
		.submit = submit_job,
		.arg = pool,
		.fast = proxy_fast_path,
		.fast_arg = &shared,
	};
	http_front *front = http_front_start(&fo, err, sizeof err);
	if (!front) {
		fprintf(stderr, "idemproxy: %s\n", err);
		worker_pool_stop(pool);
		admin_stop(adm);
		goto fail;
	}
	reaper *rp = reaper_start(cfg->db_url, cfg->statement_timeout_ms,
				  cfg->reaper_interval_ms, cfg->reaper_batch);
	log_info("idemproxy started", "listen=%s admin=%s workers=%d routes=%zu",
		 cfg->listen, cfg->admin_listen[0] ? cfg->admin_listen : "off",
		 cfg->workers, cfg->n_routes);

	/* The first reload frees cfg: keep the path. */
	char *file = xstrdup(cfg->file);
	int sig = 0;
	for (;;) {
		if (sigwait(&set, &sig))
			continue;
		if (sig == SIGHUP) {
			reload(file);
			continue;
		}
		break;
	}
	int64_t grace = cfg_current->shutdown_grace_ms;
	log_info("shutting down", "signal=%d in_flight=%d grace_ms=%lld", sig,
		 http_front_in_flight(front), (long long)grace);
	int left = http_front_drain(front, grace);
	if (left > 0) {
		/* Their records stay processing; the lease rules apply. */
		log_warn("shutdown grace ended with requests in flight",
			 "in_flight=%d", left);
		fflush(stderr);
		_exit(0);
	}
	http_front_stop(front);
	admin_stop(adm);
	reaper_stop(rp);
	worker_pool_stop(pool);
	replay_cache_free(cache);
	log_info("stopped", NULL);
	pthread_mutex_lock(&cfg_mu);
	config_unref(cfg_current);
	cfg_current = NULL;
	pthread_mutex_unlock(&cfg_mu);
	free(file);
	return 0;
fail:
	replay_cache_free(cache);
	cfg_current = NULL;
	config_unref(cfg);
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"check", no_argument, NULL, 'k'},
		{"migrate", no_argument, NULL, 'm'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *file = NULL;
	bool check = false, migrate = false;
	int c;
	while ((c = getopt_long(argc, argv, "c:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			file = optarg;
			break;
		case 'k':
			check = true;
			break;
		case 'm':
			migrate = true;
			break;
		case 'V':
			printf("idemproxy %s\n", IDEMPROXY_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (!file || optind < argc || (check && migrate)) {
		usage(stderr);
		return 1;
	}
	char err[1024];
	config *cfg = config_load(file, err, sizeof err);
	if (!cfg) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (check) {
		printf("%s: OK\n", file);
		config_print_routes(cfg, stdout);
		config_unref(cfg);
		return 0;
	}
	if (migrate) {
		int rc = cmd_migrate(cfg);
		config_unref(cfg);
		return rc;
	}
	log_setup(cfg->log_level, cfg->log_json);
	return serve(cfg);
}
