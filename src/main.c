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
#include "contract.h"
#include "fiber.h"
#include "http_front.h"
#include "log.h"
#include "metrics.h"
#include "notify_listen.h"
#include "offload.h"
#include "pg_link.h"
#include "proxy.h"
#include "reaper.h"
#include "reencrypt.h"
#include "record_retry.h"
#include "replay_cache.h"
#include "service.h"
#include "store_batch.h"
#include "store_pg.h"
#include "store_pg_schema.h"
#include "tenant_upgrade.h"
#include "upstream.h"
#include "version.h"
#include "waiters.h"
#include "worker.h"

/* The configuration in force; SIGHUP swaps it. Requests hold a reference to
 * the one they started with. */
static pthread_mutex_t cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static config *cfg_current;

/* What a reload adjusts, set up by serve(). started is the configuration
 * the process started with: restart-only settings keep its values. */
static struct {
	config *started;
	replay_cache *cache;
	worker_pool *pool;
	reaper *reaper;
	waiters *waiters;
} running;

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

/* A waiter claims again through the same pool (waiters.h). */
static bool resubmit_job(void *arg, job *j)
{
	return worker_pool_submit(running.pool, j);
}

static void listen_wake(void *arg, const uint8_t scope[WAKE_SCOPE_LEN])
{
	waiters_wake(arg, scope);
}

static void listen_connected(void *arg)
{
	waiters_wake_all(arg);
}

static void forget_cached(void *arg, const char *tenant,
			  const char *operation, const char *key)
{
	replay_key k = {tenant, operation, key};
	replay_cache_forget(arg, &k);
}

static void usage(FILE *out)
{
	fputs("usage: idemproxy -c FILE [--check | --contract | --migrate |\n"
	      "                      --reencrypt [--batch N]]\n"
	      "       idemproxy --version | --help\n"
	      "\n"
	      "  -c, --config FILE  the conf file (libconfig syntax)\n"
	      "      --check        validate FILE, print its routes, exit\n"
	      "      --contract     print the OpenAPI 3.1 document of "
	      "FILE's idempotency\n"
	      "                     rules (doc/contract.md), exit\n"
	      "      --migrate      apply missing database migrations, exit\n"
	      "      --reencrypt    re-seal stored records under the active "
	      "key, exit\n"
	      "      --batch N      records per --reencrypt transaction "
	      "(500)\n"
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
	/* Migrations 003 and 010 need to know, from this conf, which routes'
	 * tenants came from a header or a credential, and each jwt route's
	 * issuer. */
	if (tenant_upgrade_stage(cfg, err, sizeof err)) {
		fprintf(stderr, "idemproxy: migrate failed: %s\n", err);
		return 1;
	}
	store *s = store_new(cfg->db_url, cfg->statement_timeout_ms);
	int applied = 0;
	bool converted = false;
	enum store_layout l;
	const char *mismatch = NULL;
	/* A plain migrate of a distributed store would re-create functions
	 * without distributing them: refuse before changing anything. */
	int rc = store_layout_get(s, &l, err, sizeof err);
	if (!rc && (mismatch = store_layout_mismatch(l, cfg->db_citus)) &&
	    (!cfg->db_citus || l == STORE_PLAIN || l == STORE_CITUS_OTHER)) {
		snprintf(err, sizeof err, "%s", mismatch);
		rc = -1;
	}
	if (!rc)
		rc = store_migrate(s, &applied, err, sizeof err);
	if (!rc && cfg->db_citus)
		rc = store_distribute(s, &converted, err, sizeof err);
	store_free(s);
	if (rc) {
		fprintf(stderr, "idemproxy: migrate failed: %s\n", err);
		return 1;
	}
	printf("migrations applied: %d (schema version %d)\n", applied,
	       store_expected_version());
	if (cfg->db_citus)
		printf("records distributed by tenant (%s)\n",
		       converted ? "now: any existing rows were moved to the "
				   "shards"
				 : "already");
	return 0;
}

/* Exit 0: every completed record is under the active key; 1: some are
 * left (named in the output), or the run failed. */
static int cmd_reencrypt(config *cfg, int batch)
{
	char err[512];
	int rc = reencrypt_run(cfg, batch, stdout, stderr, err, sizeof err);
	if (rc < 0)
		fprintf(stderr, "idemproxy: reencrypt failed: %s\n", err);
	return rc == 0 ? 0 : 1;
}

/* Also reads the secret the instances share for the NOTIFY payloads. */
static int check_schema(config *cfg, wake_key *wk)
{
	char err[512];
	store *s = store_new(cfg->db_url, cfg->statement_timeout_ms);
	int version = 0;
	enum store_layout layout = STORE_PLAIN;
	int rc = store_schema_version(s, &version, err, sizeof err);
	if (!rc)
		rc = store_layout_get(s, &layout, err, sizeof err);
	bool current = !rc && version >= store_expected_version();
	if (current)
		rc = store_wake_key_read(s, wk, err, sizeof err);
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
	const char *mismatch = store_layout_mismatch(layout, cfg->db_citus);
	if (mismatch) {
		fprintf(stderr, "idemproxy: %s\n", mismatch);
		return -1;
	}
	return 0;
}

static reaper_config reaper_config_of(const config *c)
{
	reaper_config rc = {c->statement_timeout_ms, c->reaper_interval_ms,
			    c->reaper_batch,
			    c->seal ? seal_keyring_active(c->seal) : NULL,
			    c->seal_warn_seals, c->reaper_durability_interval_ms};
	return rc;
}

/* The reloadable settings that live outside the per-request configuration
 * (the rest is read from each request's own reference). */
static void apply_settings(const config *c)
{
	log_setup(c->log_level, c->log_json, c->log_flush_ms);
	busy_set_budget_ms(c->busy_poll_ms);
	replay_cache_resize(running.cache, (size_t)c->replay_cache_size);
	worker_pool_set_queue_size(running.pool, c->queue_size);
	waiters_set_max(running.waiters, c->max_waiters,
			c->max_waiters_per_tenant);
	reaper_config rc = reaper_config_of(c);
	reaper_configure(running.reaper, &rc);
}

static void export_routes(const config *c)
{
	for (size_t i = 0; i < c->n_routes; i++)
		metrics_known_route(c->routes[i].name);
}

/* A key made active in the reload that adds it seals records that every
 * instance not yet reloaded cannot open (500 record_unreadable there). */
static void warn_new_active_key(const config *old, const config *n)
{
	if (!n->seal || !old->seal)
		return;
	const char *id = seal_keyring_active(n->seal);
	if (seal_keyring_has(old->seal, id))
		return;
	log_warn("store_encryption: the active key was added in this same "
		 "reload; instances that have not loaded it cannot read what "
		 "this one seals now. Rotate in two phases: add the key "
		 "everywhere and reload, then make it active and reload",
		 "sealing_key=%s", id);
}

static bool reload(const char *file)
{
	char err[1024];
	config *n = config_load(file, err, sizeof err);
	if (!n) {
		log_error("reload failed; keeping the old configuration", "%s",
			  err);
		return false;
	}
	pthread_mutex_lock(&cfg_mu);
	config *old = cfg_current;
	cfg_current = n;
	pthread_mutex_unlock(&cfg_mu);
	apply_settings(n);
	export_routes(n);
	warn_new_active_key(old, n);
	char names[512];
	if (config_restart_changes(running.started, n, names, sizeof names))
		log_warn("reload: settings that differ from the running ones "
			 "take effect only after a restart",
			 "settings=%s", names);
	log_info("configuration reloaded", "file=%s routes=%zu sealing_key=%s",
		 file, n->n_routes,
		 n->seal ? seal_keyring_active(n->seal) : "off");
	config_unref(old);
	return true;
}

static double read_loop_lag_s(void *loop)
{
	return fiber_sched_lag_ms(loop) / 1000.0;
}

/* Adds the readings /metrics shows, at 0 until what they read exists,
 * before anything can scrape. /readyz reads the loop's lag through its. */
static metrics_reading *publish_readings(void)
{
	metrics_reading *lag = metrics_reading_add(
		"idemproxy_loop_lag_seconds", "gauge",
		"How late the serving loop (libmicrohttpd, the workers' "
		"fibers, the batch lanes) is in coming round: 0 while it "
		"keeps up; above loop_stall_max, /readyz fails.",
		"", read_loop_lag_s);
	worker_pool_publish(NULL);
	store_batch_publish(NULL);
	offload_publish();
	busy_publish();
	pg_link_publish();
	version_publish();
	return lag;
}

/* Everything serve() starts, in the order it starts them. */
typedef struct parts {
	char *db_url; /* the workers' own copy: a reload frees cfg */
	replay_cache *cache;
	record_retry *retry;
	waiters *wt;
	store_batch *batch; /* NULL on Citus */
	proxy_shared shared;
	worker_ops ops;
	admin *adm;
	worker_pool *pool;
	fiber_sched *loop;
	http_front *front;
	notify_listen *nl;
	reaper *rp;
	metrics_reading *loop_lag;
	service *svc; /* NULL unless systemd gave a NOTIFY_SOCKET */
} parts;

/* What the process needs before any thread starts: the schema, libcurl,
 * and the signals only the main thread takes. */
static int prepare_process(config *cfg, wake_key *wk, sigset_t *set)
{
	if (check_schema(cfg, wk) || upstream_global_init()) {
		config_unref(cfg);
		return -1;
	}
	/* The schema check was a store call that succeeded: an idle instance
	 * must not show a store it has not lost as down. */
	metrics_set_store_up(true);
	json_object_seed(0);
	signal(SIGPIPE, SIG_IGN);
	/* Every thread inherits this mask; only the main thread takes the
	 * signals, with sigwait. */
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, set, NULL);
	return 0;
}

/* What the workers share: the replay cache, the record retrier, the
 * waiters and the store batches. */
static void start_shared(parts *p, const config *cfg, wake_key *wk)
{
	/* Even at size 0: a reload may turn it on. */
	p->cache = replay_cache_new((size_t)cfg->replay_cache_size);
	running.cache = p->cache;
	/* Workers read the URL when they start, which may be after the first
	 * reload has freed cfg: they get a copy of their own. */
	p->db_url = xstrdup(cfg->db_url);
	p->retry = record_retry_start(p->db_url, cfg->statement_timeout_ms, wk);
	static const waiters_ops wops = {resubmit_job, proxy_wait_answer, NULL};
	/* Half the workers at most claim again for waiters: the rest stay
	 * free for fresh requests, whatever wakes the waiters. */
	p->wt = waiters_start(cfg->max_waiters, cfg->max_waiters_per_tenant,
			      (cfg->workers + 1) / 2, &wops);
	running.waiters = p->wt;
	/* On Citus a claim stays the delegated call of one tenant's shard. */
	p->batch = !cfg->db_citus ? store_batch_new(p->db_url,
						    cfg->statement_timeout_ms)
				  : NULL;
	p->shared = (proxy_shared){
		.db_url = p->db_url,
		.statement_timeout_ms = cfg->statement_timeout_ms,
		.citus = cfg->db_citus,
		.cache = p->cache,
		.retry = p->retry,
		.waiters = p->wt,
		.batch = p->batch,
		.wake = wk,
	};
	p->ops = (worker_ops){proxy_worker_init, proxy_worker_handle,
			      proxy_worker_fini, &p->shared};
}

static int start_admin(parts *p, const config *cfg)
{
	if (!cfg->admin_listen[0])
		return 0;
	admin_opts ao = {
		.listen = cfg->admin_listen,
		.db_url = cfg->db_url,
		.statement_timeout_ms = cfg->statement_timeout_ms,
		.get_config = get_config,
		.forget = forget_cached,
		.forget_arg = p->cache,
	};
	char err[512];
	p->adm = admin_start(&ao, err, sizeof err);
	if (!p->adm) {
		fprintf(stderr, "idemproxy: admin: %s\n", err);
		return -1;
	}
	return 0;
}

/* Takes back what start_serving started when the front end cannot. */
static void unstart_serving(parts *p)
{
	metrics_reading_unbind(p->loop_lag);
	worker_pool_publish(NULL);
	store_batch_publish(NULL);
	store_batch_stop(p->batch);
	worker_pool_stop(p->pool);
	store_batch_free(p->batch);
	admin_stop(p->adm);
}

/* The workers, their loop and the front end that runs on it. */
static int start_serving(parts *p, const config *cfg)
{
	/* A worker's deepest stack (OpenSSL, libcurl, libpq, jansson, our
	 * own buffers) stays well inside this (tests/unit/test_fiber.c pins
	 * it); the guard below it faults rather than overflow. */
	p->pool = worker_pool_start(cfg->workers, cfg->queue_size, &p->ops,
				    FIBER_STACK_BYTES);
	running.pool = p->pool;
	p->loop = worker_pool_sched(p->pool);
	if (p->batch)
		store_batch_start(p->batch, p->loop);
	metrics_reading_bind(p->loop_lag, p->loop);
	worker_pool_publish(p->pool);
	store_batch_publish(p->batch);
	export_routes(cfg);
	front_opts fo = {
		.listen = cfg->listen,
		.max_connections = cfg->max_connections,
		.max_connections_per_ip = cfg->max_connections_per_ip,
		.max_header_size = cfg->max_header_size,
		.get_config = get_config,
		.submit = submit_job,
		.arg = p->pool,
		.fast = proxy_fast_path,
		.fast_arg = &p->shared,
		/* the front end runs on the workers' thread */
		.sched = p->loop,
	};
	char err[512];
	p->front = http_front_start(&fo, err, sizeof err);
	if (!p->front) {
		fprintf(stderr, "idemproxy: %s\n", err);
		unstart_serving(p);
		return -1;
	}
	return 0;
}

/* The threads that work beside the requests: LISTEN and the reaper. */
static void start_background(parts *p, const config *cfg)
{
	static notify_listen_ops lo;
	lo = (notify_listen_ops){listen_wake, listen_connected, p->wt};
	p->nl = notify_listen_start(p->db_url, &lo);
	reaper_config rcfg = reaper_config_of(cfg);
	p->rp = reaper_start(cfg->db_url, &rcfg, cfg->db_citus);
	running.reaper = p->rp;
	log_info("idemproxy started",
		 "version=%s commit=%s listen=%s admin=%s workers=%d "
		 "routes=%zu sealing_key=%s",
		 idemproxy_version, idemproxy_commit, cfg->listen,
		 cfg->admin_listen[0] ? cfg->admin_listen : "off",
		 cfg->workers, cfg->n_routes,
		 cfg->seal ? seal_keyring_active(cfg->seal) : "off");
}

/* The counts of the STATUS= line systemd shows. */
static void service_counts(void *arg, char *buf, size_t len)
{
	parts *p = arg;
	snprintf(buf, len, "requests=%llu in_flight=%d store=%s",
		 (unsigned long long)metrics_requests_answered(),
		 http_front_in_flight(p->front),
		 metrics_store_is_up() ? "up" : "down");
}

static double service_loop_lag_ms(void *arg)
{
	parts *p = arg;
	return fiber_sched_lag_ms(p->loop);
}

static void loop_came_round(void *arg)
{
}

/* Tells systemd the process serves: the listeners accept (the loop that
 * runs them has come round once since they were set up) and the store
 * answered (check_schema, before anything started). */
static void notify_ready(parts *p)
{
	static service_ops ops;
	ops = (service_ops){service_counts, service_loop_lag_ms, p};
	p->svc = service_start(&ops);
	if (!p->svc)
		return;
	fiber_sched_call(p->loop, loop_came_round, NULL);
	service_ready(p->svc);
}

/* Reloads at each SIGHUP; returns the signal that stops the process. */
static int wait_for_stop(const sigset_t *set, const char *cfg_file,
			 service *svc)
{
	/* The first reload frees the conf: keep the path. */
	char *file = xstrdup(cfg_file);
	int sig = 0;
	for (;;) {
		if (sigwait(set, &sig))
			continue;
		if (sig == SIGHUP) {
			service_reloading(svc);
			service_reloaded(svc, reload(file));
			continue;
		}
		break;
	}
	free(file);
	return sig;
}

/* Drains the requests within shutdown_grace, then stops every part in
 * the order that lets each finish what the one before handed it. */
static void stop_all(parts *p, int sig)
{
	int64_t grace = cfg_current->shutdown_grace_ms;
	service_stopping(p->svc);
	log_info("shutting down", "signal=%d in_flight=%d grace_ms=%lld", sig,
		 http_front_in_flight(p->front), (long long)grace);
	/* Waiting duplicates are answered first: their connections are
	 * suspended, and must be resumed before the front end stops. */
	waiters_drain(p->wt);
	double deadline = mono_ms() + (double)grace;
	int left = http_front_drain(p->front, grace);
	if (left > 0) {
		/* Their records stay processing; the lease rules apply. */
		log_warn("shutdown grace ended with requests in flight",
			 "in_flight=%d records_pending=%d", left,
			 record_retry_pending(p->retry));
		log_flush(); /* _exit runs no atexit handler */
		_exit(0);
	}
	/* It reads the front end and the loop: both stop next. */
	service_stop(p->svc);
	http_front_stop(p->front);
	metrics_reading_unbind(p->loop_lag);
	admin_stop(p->adm);
	reaper_stop(p->rp);
	worker_pool_publish(NULL);
	store_batch_publish(NULL);
	/* The front end drained: nothing is with a worker now, and anything
	 * still coming goes alone. */
	store_batch_stop(p->batch);
	worker_pool_stop(p->pool);
	store_batch_free(p->batch);
	notify_listen_stop(p->nl);
	waiters_stop(p->wt);
	/* Outcomes the workers could not record keep being tried for the
	 * rest of the grace. */
	record_retry_stop(p->retry, deadline);
	replay_cache_free(p->cache);
}

/* A part failed to start: what start_shared started goes, and cfg. */
static int serve_failed(parts *p, config *cfg)
{
	waiters_stop(p->wt);
	record_retry_stop(p->retry, 0);
	replay_cache_free(p->cache);
	free(p->db_url);
	config_unref(running.started);
	cfg_current = NULL;
	config_unref(cfg);
	return 1;
}

static int serve(config *cfg)
{
	/* Lives as long as every thread that names a wake-up. */
	static wake_key wk;
	sigset_t set;
	if (prepare_process(cfg, &wk, &set))
		return 1;
	cfg_current = cfg;
	/* Lives as long as the workers that read p.shared. */
	parts p = {0};
	p.loop_lag = publish_readings();
	busy_set_budget_ms(cfg->busy_poll_ms);
	running.started = config_ref(cfg);
	start_shared(&p, cfg, &wk);
	if (start_admin(&p, cfg) || start_serving(&p, cfg))
		return serve_failed(&p, cfg);
	start_background(&p, cfg);
	notify_ready(&p);
	int sig = wait_for_stop(&set, cfg->file, p.svc);
	stop_all(&p, sig);
	log_info("stopped", NULL);
	log_flush();
	pthread_mutex_lock(&cfg_mu);
	config_unref(cfg_current);
	cfg_current = NULL;
	pthread_mutex_unlock(&cfg_mu);
	free(p.db_url);
	config_unref(running.started);
	return 0;
}

/* What the command line asks for. */
typedef struct cli {
	const char *file;
	bool check, contract, migrate, reenc;
	int batch;
} cli;

/* Reads the options into o; returns -1 to go on, else the exit status
 * (--version, --help, a bad option). */
static int parse_args(int argc, char **argv, cli *o)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"check", no_argument, NULL, 'k'},
		{"contract", no_argument, NULL, 'o'},
		{"migrate", no_argument, NULL, 'm'},
		{"reencrypt", no_argument, NULL, 'r'},
		{"batch", required_argument, NULL, 'b'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*o = (cli){.batch = REENCRYPT_BATCH_DEFAULT};
	char *end;
	int c;
	while ((c = getopt_long(argc, argv, "c:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			o->file = optarg;
			break;
		case 'k':
			o->check = true;
			break;
		case 'o':
			o->contract = true;
			break;
		case 'm':
			o->migrate = true;
			break;
		case 'r':
			o->reenc = true;
			break;
		case 'b':
			o->batch = (int)strtol(optarg, &end, 10);
			if (*end || o->batch < 1 || o->batch > 100000) {
				fprintf(stderr,
					"idemproxy: --batch: 1..100000\n");
				return 1;
			}
			break;
		case 'V':
			printf("idemproxy %s (commit %s)\n", idemproxy_version,
			       idemproxy_commit);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (!o->file || optind < argc ||
	    o->check + o->contract + o->migrate + o->reenc > 1) {
		usage(stderr);
		return 1;
	}
	return -1;
}

/* --check: the conf is valid; what it routes, and its keys. */
static int cmd_check(config *cfg, const char *file)
{
	printf("%s: OK\n", file);
	config_print_routes(cfg, stdout);
	if (cfg->seal)
		printf("store_encryption: %zu key%s in %s, active \"%s\"\n",
		       seal_keyring_count(cfg->seal),
		       seal_keyring_count(cfg->seal) == 1 ? "" : "s",
		       cfg->seal_keys_file, seal_keyring_active(cfg->seal));
	config_unref(cfg);
	return 0;
}

/* --contract: the rules of the conf, from the conf alone. */
static int cmd_contract(config *cfg)
{
	size_t len;
	char *doc = contract_document(cfg, CONTRACT_OPENAPI, &len);
	config_unref(cfg);
	bool ok = fwrite(doc, 1, len, stdout) == len && fflush(stdout) == 0;
	free(doc);
	if (!ok)
		fprintf(stderr, "idemproxy: --contract: cannot write\n");
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	cli o;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	char err[1024];
	config *cfg = config_load(o.file, err, sizeof err);
	if (!cfg) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (o.check)
		return cmd_check(cfg, o.file);
	if (o.contract)
		return cmd_contract(cfg);
	if (o.migrate || o.reenc) {
		rc = o.migrate ? cmd_migrate(cfg) : cmd_reencrypt(cfg, o.batch);
		config_unref(cfg);
		return rc;
	}
	log_setup(cfg->log_level, cfg->log_json, cfg->log_flush_ms);
	return serve(cfg);
}
