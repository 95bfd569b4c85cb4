#include "pg_resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fiber.h"

/* --- one lookup, on a thread of its own ---------------------------------- */

/* Shared by the lookup's thread and the fiber waiting for it; whichever
 * lets go last frees it, so a fiber that gives up at its deadline leaves
 * the thread to finish alone. */
typedef struct lookup {
	atomic_int refs;
	atomic_bool done;
	int efd;
	char *name;
	struct addrinfo *res;
	int rc;
} lookup;

static void lookup_unref(lookup *l)
{
	if (!l || atomic_fetch_sub(&l->refs, 1) != 1)
		return;
	if (l->res)
		freeaddrinfo(l->res);
	close(l->efd);
	free(l->name);
	free(l);
}

static void *lookup_main(void *arg)
{
	lookup *l = arg;
	/* named here, before the lookup: until then it has its creator's
	 * name (the serving thread's) */
	pthread_setname_np(pthread_self(), "ip-resolve");
	/* as libpq asks */
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM};
	l->rc = getaddrinfo(l->name, NULL, &hints, &l->res);
	atomic_store(&l->done, true);
	uint64_t one = 1;
	ssize_t w = write(l->efd, &one, sizeof one);
	(void)w;
	lookup_unref(l);
	return NULL;
}

/* The thread blocks every signal (a SIGTERM must reach the main thread's
 * sigwait) and is detached: nobody joins a lookup that was given up. */
static lookup *lookup_start(const char *name)
{
	lookup *l = xcalloc(1, sizeof *l);
	atomic_init(&l->refs, 2);
	l->name = xstrdup(name);
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	bool up = l->efd >= 0 && pthread_create(&t, &a, lookup_main, l) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&a);
	if (!up) {
		if (l->efd >= 0)
			close(l->efd);
		free(l->name);
		free(l);
		return NULL;
	}
	return l;
}

/* True once the lookup has an answer; false at the deadline. */
static bool lookup_wait(lookup *l, double deadline_ms)
{
	while (!atomic_load(&l->done)) {
		if (fiber_current()) {
			if (!fiber_wait_fd(l->efd, FIBER_IN, deadline_ms))
				return false;
			continue;
		}
		int ms = -1;
		if (deadline_ms >= 0) {
			double left = deadline_ms - mono_ms();
			if (left <= 0)
				return false;
			ms = (int)left + 1;
		}
		struct pollfd p = {.fd = l->efd, .events = POLLIN};
		if (poll(&p, 1, ms) == 0)
			return false;
	}
	return true;
}

/* --- the conninfo's hosts ------------------------------------------------ */

/* The value libpq would use for `name`: keys in order, the conninfo in
 * "dbname" expanded where it stands, later ones winning; then the
 * environment. NULL or "" when none. The result is copied. */
static char *effective(const char *const *keys, const char *const *vals,
		       const char *name, const char *env)
{
	const char *v = NULL;
	char *owned = NULL;
	for (int i = 0; keys[i]; i++) {
		if (strcmp(keys[i], "dbname")) {
			if (!strcmp(keys[i], name) && vals[i])
				v = vals[i];
			continue;
		}
		PQconninfoOption *opts = PQconninfoParse(vals[i], NULL);
		for (PQconninfoOption *o = opts; o && o->keyword; o++) {
			if (!strcmp(o->keyword, name) && o->val) {
				free(owned);
				owned = xstrdup(o->val);
				v = owned;
			}
		}
		PQconninfoFree(opts);
	}
	if ((!v || !v[0]) && getenv(env))
		v = getenv(env);
	char *out = v ? xstrdup(v) : NULL;
	free(owned);
	return out;
}

/* Splits a comma-separated list in place; at most max items. */
static int split(char *s, char **items, int max)
{
	int n = 0;
	for (char *p = s; n < max;) {
		items[n++] = p;
		p = strchr(p, ',');
		if (!p)
			break;
		*p++ = '\0';
	}
	return n;
}

/* A socket directory, an abstract socket, an address or the default: no
 * lookup. */
static bool is_name(const char *h)
{
	unsigned char buf[sizeof(struct in6_addr)];
	return h[0] && h[0] != '/' && h[0] != '@' &&
	       inet_pton(AF_INET, h, buf) != 1 &&
	       inet_pton(AF_INET6, h, buf) != 1;
}

#define MAX_HOSTS 32

typedef struct hosts {
	char *host_s, *port_s;
	char *host[MAX_HOSTS], *port[MAX_HOSTS];
	int n, nports;
	lookup *lk[MAX_HOSTS];
	growbuf h, a, p; /* the lists to connect with */
	int entries;
	char failed[256]; /* the first lookup that failed, as libpq says it */
} hosts;

static void hosts_free(hosts *hs)
{
	for (int i = 0; i < hs->n; i++)
		lookup_unref(hs->lk[i]);
	free(hs->host_s);
	free(hs->port_s);
	growbuf_free(&hs->h);
	growbuf_free(&hs->a);
	growbuf_free(&hs->p);
}

static void add_entry(hosts *hs, int i, const char *addr)
{
	const char *sep = hs->entries ? "," : "";
	growbuf_printf(&hs->h, "%s%s", sep, hs->host[i]);
	growbuf_printf(&hs->a, "%s%s", sep, addr);
	growbuf_printf(&hs->p, "%s%s", sep,
		       hs->nports == hs->n ? hs->port[i] : "");
	hs->entries++;
}

/* Host i's addresses as entries; a name that did not resolve is left
 * out, as libpq moves on from a host it cannot resolve. */
static void add_resolved(hosts *hs, int i, double deadline_ms)
{
	lookup *l = hs->lk[i];
	int rc = !l ? EAI_SYSTEM
		    : !lookup_wait(l, deadline_ms) ? EAI_AGAIN
						   : l->rc;
	if (rc) {
		if (!hs->failed[0])
			snprintf(hs->failed, sizeof hs->failed,
				 "could not translate host name \"%s\" to "
				 "address: %s",
				 hs->host[i],
				 rc == EAI_AGAIN && l && !atomic_load(&l->done)
					 ? "timeout expired"
					 : gai_strerror(rc));
		return;
	}
	char seen[MAX_HOSTS][64]; /* numeric: an IPv6 address and its scope */
	int nseen = 0;
	for (struct addrinfo *ai = l->res; ai && nseen < MAX_HOSTS;
	     ai = ai->ai_next) {
		char *buf = seen[nseen];
		if (getnameinfo(ai->ai_addr, ai->ai_addrlen, buf, sizeof seen[0],
				NULL, 0, NI_NUMERICHOST))
			continue;
		bool dup = false;
		for (int k = 0; k < nseen && !dup; k++)
			dup = !strcmp(seen[k], buf);
		if (dup)
			continue;
		nseen++;
		add_entry(hs, i, buf);
	}
}

/* --- the parameters to connect with --------------------------------------- */

static double lookup_deadline(const char *const *keys,
			      const char *const *vals)
{
	char *t = effective(keys, vals, "connect_timeout",
			    "PGCONNECT_TIMEOUT");
	int s = t ? atoi(t) : 0;
	free(t);
	return s > 0 ? mono_ms() + 1000.0 * s : -1;
}

/* The hosts to look up, or false when libpq has nothing to resolve (an
 * address given, sockets only) or will refuse the lists itself. */
static bool hosts_parse(hosts *hs, const char *const *keys,
			const char *const *vals)
{
	char *addr = effective(keys, vals, "hostaddr", "PGHOSTADDR");
	bool by_addr = addr && addr[0];
	free(addr);
	hs->host_s = effective(keys, vals, "host", "PGHOST");
	if (by_addr || !hs->host_s || strchr(hs->host_s, '\\'))
		return false;
	hs->port_s = effective(keys, vals, "port", "PGPORT");
	hs->n = split(hs->host_s, hs->host, MAX_HOSTS);
	hs->nports = hs->port_s && hs->port_s[0]
			     ? split(hs->port_s, hs->port, MAX_HOSTS)
			     : 0;
	if (hs->nports > 1 && hs->nports != hs->n)
		return false;
	bool any = false;
	for (int i = 0; i < hs->n; i++)
		any = any || is_name(hs->host[i]);
	return any && !strchr(hs->port_s ? hs->port_s : "", '\\');
}

static void copy_params(pg_resolved *out, const char *const *keys,
			const char *const *vals, int *n)
{
	for (*n = 0; keys[*n] && *n < PG_RESOLVE_MAX_KEYS; (*n)++) {
		out->keys[*n] = keys[*n];
		out->vals[*n] = vals[*n];
	}
}

int pg_resolve_params(const char *const *keys, const char *const *vals,
		      pg_resolved *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	int n;
	copy_params(out, keys, vals, &n);
	hosts hs = {0};
	if (!hosts_parse(&hs, keys, vals)) {
		hosts_free(&hs);
		return 0;
	}
	/* all at once: one lookup's time, not one per host */
	for (int i = 0; i < hs.n; i++)
		hs.lk[i] = is_name(hs.host[i]) ? lookup_start(hs.host[i])
					       : NULL;
	double deadline = lookup_deadline(keys, vals);
	for (int i = 0; i < hs.n; i++) {
		if (is_name(hs.host[i]))
			add_resolved(&hs, i, deadline);
		else
			add_entry(&hs, i, "");
	}
	if (hs.entries == 0) {
		snprintf(err, errlen, "%s", hs.failed);
		hosts_free(&hs);
		return -1;
	}
	out->host = xstrdup(hs.h.data);
	out->hostaddr = xstrdup(hs.a.data);
	out->keys[n] = "host", out->vals[n++] = out->host;
	out->keys[n] = "hostaddr", out->vals[n++] = out->hostaddr;
	if (hs.nports > 1) {
		out->port = xstrdup(hs.p.data);
		out->keys[n] = "port", out->vals[n++] = out->port;
	}
	out->keys[n] = NULL;
	out->vals[n] = NULL;
	hosts_free(&hs);
	return 0;
}

void pg_resolved_free(pg_resolved *r)
{
	free(r->host);
	free(r->hostaddr);
	free(r->port);
	memset(r, 0, sizeof *r);
}
