/* A slow resolver for one host name, preloaded into the proxy by tests:
 *
 *   LD_PRELOAD=build/slow_resolver.so
 *   IDEMPROXY_SHIM_HOST=db.example.test   the one name it answers
 *   IDEMPROXY_SHIM_ADDR=127.0.0.1         with this IPv4 address
 *   IDEMPROXY_SHIM_DELAY_MS=2000          after this delay (optional)
 *   IDEMPROXY_SHIM_GATE=/tmp/gate         and while this file exists
 *                                         (optional: a test holds the
 *                                         lookup as long as it likes and
 *                                         releases it by removing the file)
 *   IDEMPROXY_SHIM_FREE=main,other        threads with these names are
 *                                         answered at once (optional)
 *
 * Every other name goes to the real getaddrinfo. libpq 15 resolves with
 * getaddrinfo only; gethostbyname and gethostbyname_r are answered as well
 * (and gethostbyname2_r for AF_INET) for anything else that may use them. Each lookup of the name is counted
 * in IDEMPROXY_SHIM_COUNT (a file that gets one line per lookup as it
 * starts: the thread's id and name), so a test can see which thread
 * resolved. Thread-safe: no
 * state but the environment, read once, and per-call buffers. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
		      struct addrinfo **);
typedef void (*fai_fn)(struct addrinfo *);

static struct {
	const char *host, *gate, *count, *free_threads;
	struct in_addr addr;
	long delay_ms;
	gai_fn real_gai;
	fai_fn real_fai;
} shim;
static pthread_once_t shim_once = PTHREAD_ONCE_INIT;

static void shim_init(void)
{
	shim.real_gai = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
	shim.real_fai = (fai_fn)dlsym(RTLD_NEXT, "freeaddrinfo");
	shim.host = getenv("IDEMPROXY_SHIM_HOST");
	shim.gate = getenv("IDEMPROXY_SHIM_GATE");
	shim.count = getenv("IDEMPROXY_SHIM_COUNT");
	shim.free_threads = getenv("IDEMPROXY_SHIM_FREE");
	const char *a = getenv("IDEMPROXY_SHIM_ADDR");
	if (!a || inet_pton(AF_INET, a, &shim.addr) != 1)
		shim.addr.s_addr = htonl(INADDR_LOOPBACK);
	const char *d = getenv("IDEMPROXY_SHIM_DELAY_MS");
	shim.delay_ms = d ? strtol(d, NULL, 10) : 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void thread_name(char name[17])
{
	memset(name, 0, 17);
	prctl(PR_GET_NAME, name, 0, 0, 0);
}

/* Is the calling thread one of IDEMPROXY_SHIM_FREE's? */
static int thread_free(void)
{
	if (!shim.free_threads)
		return 0;
	char name[17];
	thread_name(name);
	size_t n = strlen(name);
	for (const char *p = shim.free_threads; *p;) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		if (!e)
			break;
		p = e + 1;
	}
	return 0;
}

static void note_lookup(void)
{
	if (!shim.count)
		return;
	int fd = open(shim.count, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
		      0644);
	if (fd < 0)
		return;
	char name[17];
	thread_name(name);
	char line[64];
	int n = snprintf(line, sizeof line, "%ld %s\n",
			 (long)syscall(SYS_gettid), name);
	if (write(fd, line, (size_t)n) < 0) {
		/* nothing to do: the count is a test aid */
	}
	close(fd);
}

/* True (after the delay and the gate) when name is the shimmed one. */
static int shim_hold(const char *name)
{
	pthread_once(&shim_once, shim_init);
	if (!name || !shim.host || strcasecmp(name, shim.host) != 0)
		return 0;
	note_lookup();
	if (thread_free())
		return 1;
	if (shim.delay_ms > 0)
		sleep_ms(shim.delay_ms);
	while (shim.gate && access(shim.gate, F_OK) == 0)
		sleep_ms(20);
	return 1;
}

/* One allocation holds the addrinfo, its address and its name, so the
 * real freeaddrinfo would be wrong for it: it is marked by the address
 * of the shim's own tag and freed here. */
struct shim_ai {
	struct addrinfo ai;
	struct sockaddr_in sin;
};

static int answer(const char *service, const struct addrinfo *hints,
		  struct addrinfo **res)
{
	if (hints && hints->ai_family != AF_UNSPEC &&
	    hints->ai_family != AF_INET)
		return EAI_FAMILY;
	struct shim_ai *s = calloc(1, sizeof *s);
	if (!s)
		return EAI_MEMORY;
	s->sin.sin_family = AF_INET;
	s->sin.sin_addr = shim.addr;
	s->sin.sin_port = htons(service ? (uint16_t)atoi(service) : 0);
	s->ai.ai_family = AF_INET;
	s->ai.ai_socktype = hints && hints->ai_socktype ? hints->ai_socktype
							: SOCK_STREAM;
	s->ai.ai_protocol = hints ? hints->ai_protocol : 0;
	s->ai.ai_addrlen = sizeof s->sin;
	s->ai.ai_addr = (struct sockaddr *)&s->sin;
	s->ai.ai_canonname = (char *)"slow-resolver-shim";
	*res = &s->ai;
	return 0;
}

int getaddrinfo(const char *node, const char *service,
		const struct addrinfo *hints, struct addrinfo **res)
{
	bool numeric = hints && (hints->ai_flags & AI_NUMERICHOST);
	if (!numeric && shim_hold(node))
		return answer(service, hints, res);
	if (!shim.real_gai)
		return EAI_SYSTEM;
	return shim.real_gai(node, service, hints, res);
}

void freeaddrinfo(struct addrinfo *ai)
{
	pthread_once(&shim_once, shim_init);
	if (ai && ai->ai_canonname &&
	    strcmp(ai->ai_canonname, "slow-resolver-shim") == 0 &&
	    !ai->ai_next) {
		free(ai);
		return;
	}
	if (shim.real_fai)
		shim.real_fai(ai);
}

/* gethostbyname_r's answer lives in the caller's buffer. */
static int fill_hostent(const char *name, struct hostent *ret, char *buf,
			size_t len, struct hostent **result, int *h_errnop)
{
	size_t need = sizeof(struct in_addr) + 2 * sizeof(char *) +
		      strlen(name) + 1 + sizeof(char *);
	if (len < need + sizeof(void *)) {
		*result = NULL;
		return ERANGE;
	}
	char **list = (char **)(void *)buf;
	char **aliases = list + 2;
	struct in_addr *a = (struct in_addr *)(void *)(aliases + 1);
	char *n = (char *)(a + 1);
	*a = shim.addr;
	list[0] = (char *)a;
	list[1] = NULL;
	aliases[0] = NULL;
	strcpy(n, name);
	ret->h_name = n;
	ret->h_aliases = aliases;
	ret->h_addrtype = AF_INET;
	ret->h_length = sizeof *a;
	ret->h_addr_list = list;
	*result = ret;
	if (h_errnop)
		*h_errnop = 0;
	return 0;
}

typedef int (*ghbr_fn)(const char *, struct hostent *, char *, size_t,
		       struct hostent **, int *);

int gethostbyname_r(const char *name, struct hostent *ret, char *buf,
		    size_t buflen, struct hostent **result, int *h_errnop)
{
	if (shim_hold(name))
		return fill_hostent(name, ret, buf, buflen, result, h_errnop);
	ghbr_fn real = (ghbr_fn)dlsym(RTLD_NEXT, "gethostbyname_r");
	if (!real) {
		*result = NULL;
		return ENOSYS;
	}
	return real(name, ret, buf, buflen, result, h_errnop);
}

typedef int (*ghb2r_fn)(const char *, int, struct hostent *, char *, size_t,
			struct hostent **, int *);

int gethostbyname2_r(const char *name, int af, struct hostent *ret,
		     char *buf, size_t buflen, struct hostent **result,
		     int *h_errnop)
{
	if (af == AF_INET && shim_hold(name))
		return fill_hostent(name, ret, buf, buflen, result, h_errnop);
	ghb2r_fn real = (ghb2r_fn)dlsym(RTLD_NEXT, "gethostbyname2_r");
	if (!real) {
		*result = NULL;
		return ENOSYS;
	}
	return real(name, af, ret, buf, buflen, result, h_errnop);
}

/* Not thread-safe in libc either; a per-thread buffer keeps it so. */
struct hostent *gethostbyname(const char *name)
{
	static __thread struct hostent he;
	static __thread char buf[512];
	struct hostent *r = NULL;
	int herr = 0;
	if (shim_hold(name)) {
		fill_hostent(name, &he, buf, sizeof buf, &r, &herr);
		return r;
	}
	typedef struct hostent *(*ghb_fn)(const char *);
	ghb_fn real = (ghb_fn)dlsym(RTLD_NEXT, "gethostbyname");
	return real ? real(name) : NULL;
}
