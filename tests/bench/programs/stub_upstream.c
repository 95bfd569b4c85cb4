/* A fast upstream for the benchmark.
 *
 *   stub_upstream [--port N] [--threads N] [--dump FILE]
 *
 * Serves HTTP/1.1 with keep-alive on 127.0.0.1 and answers every request at
 * once: POST gets 201, anything else 200, each with a small JSON body that
 * names the Idempotency-Key it saw. It counts requests per Idempotency-Key so
 * the benchmark can prove that no key reached the upstream twice. It must be
 * much cheaper than the proxies measured in front of it, or it would measure
 * itself: epoll, one loop per thread, no per-request allocation once warm.
 *
 * --port 0 (the default) picks a free port; the port is printed as the first
 * line of stdout either way. Control requests (not counted):
 *
 *   GET  /__stub/stats   {"requests":R,"keys":K,"max":M,"duplicated_keys":D,
 *                         "no_key":N}
 *   POST /__stub/reset   the same, then forget every count
 *   POST /__stub/dump    the same, after writing "count<TAB>key" lines to the
 *                        --dump file (also written at SIGTERM/SIGINT)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

/* A request head larger than this is an error here: the benchmark sends a
 * few hundred bytes. */
#define STUB_MAX_HEAD 65536
#define STUB_MAX_BODY (4 << 20)
#define STUB_MAX_KEY 512

static volatile sig_atomic_t g_stop;
static atomic_ulong g_seq;
static const char *g_dump_path;

/* ---- counts per key -------------------------------------------------- */

typedef struct key_slot {
	char *key; /* NULL: empty slot */
	size_t len;
	uint64_t count;
} key_slot;

static struct {
	pthread_mutex_t mu;
	key_slot *slots;
	size_t cap; /* a power of two */
	size_t used;
	uint64_t requests;
	uint64_t no_key;
	uint64_t max;
	uint64_t duplicated; /* keys seen more than once */
} g_counts = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t hash_key(const char *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)p[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static key_slot *find_slot(key_slot *slots, size_t cap, const char *k,
			   size_t n)
{
	size_t i = hash_key(k, n) & (cap - 1);
	while (slots[i].key &&
	       (slots[i].len != n || memcmp(slots[i].key, k, n) != 0))
		i = (i + 1) & (cap - 1);
	return &slots[i];
}

static void grow_table(void)
{
	size_t cap = g_counts.cap ? g_counts.cap * 2 : 1024;
	key_slot *slots = xcalloc(cap, sizeof *slots);
	for (size_t i = 0; i < g_counts.cap; i++) {
		key_slot *old = &g_counts.slots[i];
		if (old->key)
			*find_slot(slots, cap, old->key, old->len) = *old;
	}
	free(g_counts.slots);
	g_counts.slots = slots;
	g_counts.cap = cap;
}

/* Called with the lock held. */
static void count_locked(const char *k, size_t n)
{
	g_counts.requests++;
	if (!k) {
		g_counts.no_key++;
		return;
	}
	if ((g_counts.used + 1) * 10 >= g_counts.cap * 7)
		grow_table();
	key_slot *s = find_slot(g_counts.slots, g_counts.cap, k, n);
	if (!s->key) {
		s->key = xstrndup(k, n);
		s->len = n;
		g_counts.used++;
	}
	s->count++;
	if (s->count == 2)
		g_counts.duplicated++;
	if (s->count > g_counts.max)
		g_counts.max = s->count;
}

static void count_request(const char *k, size_t n)
{
	pthread_mutex_lock(&g_counts.mu);
	count_locked(k, n);
	pthread_mutex_unlock(&g_counts.mu);
}

static void stats_locked(growbuf *out)
{
	growbuf_printf(out,
		       "{\"requests\":%llu,\"keys\":%zu,\"max\":%llu,"
		       "\"duplicated_keys\":%llu,\"no_key\":%llu}\n",
		       (unsigned long long)g_counts.requests, g_counts.used,
		       (unsigned long long)g_counts.max,
		       (unsigned long long)g_counts.duplicated,
		       (unsigned long long)g_counts.no_key);
}

static void reset_locked(void)
{
	for (size_t i = 0; i < g_counts.cap; i++)
		free(g_counts.slots[i].key);
	free(g_counts.slots);
	g_counts.slots = NULL;
	g_counts.cap = g_counts.used = 0;
	g_counts.requests = g_counts.no_key = 0;
	g_counts.max = g_counts.duplicated = 0;
}

/* Writes the counts; returns 0, or -1 with errno set. */
static int dump_locked(const char *path)
{
	if (!path)
		return 0;
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	for (size_t i = 0; i < g_counts.cap; i++) {
		const key_slot *s = &g_counts.slots[i];
		if (s->key)
			fprintf(f, "%llu\t%s\n", (unsigned long long)s->count,
				s->key);
	}
	if (g_counts.no_key)
		fprintf(f, "%llu\t\n", (unsigned long long)g_counts.no_key);
	return fclose(f) == 0 ? 0 : -1;
}

/* ---- HTTP ------------------------------------------------------------ */

typedef struct conn {
	int fd;
	growbuf in;
	size_t in_off; /* bytes of in already answered */
	growbuf out;
	size_t out_off; /* bytes of out already written */
	bool close_after;
	bool want_out; /* EPOLLOUT registered */
} conn;

typedef struct request {
	const char *method;
	size_t method_len;
	const char *target;
	size_t target_len;
	const char *key; /* NULL: no Idempotency-Key */
	size_t key_len;
	size_t content_length;
	bool chunked;
	bool close;
	size_t head_len; /* through the blank line */
} request;

static const char *trim(const char *p, const char *end, size_t *len)
{
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*len = (size_t)(end - p);
	return p;
}

static bool name_is(const char *p, size_t n, const char *want)
{
	return strlen(want) == n && str_ncaseeq(p, want, n);
}

static bool value_has_close(const char *v, size_t n)
{
	for (size_t i = 0; i + 5 <= n; i++)
		if (str_ncaseeq(v + i, "close", 5))
			return true;
	return false;
}

/* One header line [p, e): keeps what the stub acts on. Returns -1 when the
 * request cannot be served. */
static int parse_header(request *r, const char *p, const char *e)
{
	const char *colon = memchr(p, ':', (size_t)(e - p));
	if (!colon)
		return -1;
	size_t vlen;
	const char *v = trim(colon + 1, e, &vlen);
	size_t nlen = (size_t)(colon - p);
	if (name_is(p, nlen, "Content-Length")) {
		char num[24];
		if (vlen == 0 || vlen >= sizeof num)
			return -1;
		memcpy(num, v, vlen);
		num[vlen] = '\0';
		char *end;
		unsigned long long n = strtoull(num, &end, 10);
		if (*end || n > STUB_MAX_BODY)
			return -1;
		r->content_length = (size_t)n;
	} else if (name_is(p, nlen, "Idempotency-Key")) {
		if (vlen > STUB_MAX_KEY)
			return -1;
		r->key = v;
		r->key_len = vlen;
	} else if (name_is(p, nlen, "Transfer-Encoding")) {
		r->chunked = true;
	} else if (name_is(p, nlen, "Connection")) {
		r->close = value_has_close(v, vlen);
	}
	return 0;
}

/* Parses the head at [p, p+n). Returns 1 when a whole head is there, 0 when
 * more bytes are needed, -1 when it cannot be served. */
static int parse_head(const char *p, size_t n, request *r)
{
	memset(r, 0, sizeof *r);
	const char *end = memmem(p, n, "\r\n\r\n", 4);
	if (!end)
		return n > STUB_MAX_HEAD ? -1 : 0;
	r->head_len = (size_t)(end - p) + 4;
	const char *line_end = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
	const char *sp1 = memchr(p, ' ', (size_t)(line_end - p));
	if (!sp1)
		return -1;
	const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1));
	if (!sp2)
		return -1;
	r->method = p;
	r->method_len = (size_t)(sp1 - p);
	r->target = sp1 + 1;
	r->target_len = (size_t)(sp2 - sp1 - 1);
	if (name_is(sp2 + 1, (size_t)(line_end - sp2 - 1), "HTTP/1.0"))
		r->close = true;
	const char *q = line_end + 2;
	while (q < end + 2) {
		const char *e = memmem(q, (size_t)(end + 2 - q), "\r\n", 2);
		if (parse_header(r, q, e))
			return -1;
		q = e + 2;
	}
	/* The benchmark never sends chunked bodies; refusing them keeps the
	 * parser small. */
	return r->chunked ? -1 : 1;
}

static void json_string(growbuf *out, const char *p, size_t n)
{
	growbuf_puts(out, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (c == '"' || c == '\\')
			growbuf_printf(out, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			growbuf_printf(out, "\\u%04x", c);
		else
			growbuf_append(out, &c, 1);
	}
	growbuf_puts(out, "\"");
}

static void respond(conn *c, int status, const char *reason,
		    const growbuf *body, bool close)
{
	growbuf_printf(&c->out,
		       "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
		       "Content-Length: %zu\r\n%s\r\n",
		       status, reason, body->len,
		       close ? "Connection: close\r\n" : "");
	growbuf_append(&c->out, body->data, body->len);
	if (close)
		c->close_after = true;
}

static void serve_control(conn *c, const request *r, growbuf *body)
{
	bool post = name_is(r->method, r->method_len, "POST");
	const char *t = r->target + 8; /* after "/__stub/" */
	size_t tl = r->target_len - 8;
	pthread_mutex_lock(&g_counts.mu);
	if (!post && name_is(t, tl, "stats")) {
		stats_locked(body);
	} else if (post && name_is(t, tl, "reset")) {
		stats_locked(body);
		reset_locked();
	} else if (post && name_is(t, tl, "dump")) {
		if (dump_locked(g_dump_path))
			growbuf_printf(body, "{\"error\":\"%s\"}\n",
				       strerror(errno));
		else
			stats_locked(body);
	} else {
		growbuf_puts(body, "{\"error\":\"unknown control request\"}\n");
		pthread_mutex_unlock(&g_counts.mu);
		respond(c, 404, "Not Found", body, r->close);
		return;
	}
	pthread_mutex_unlock(&g_counts.mu);
	respond(c, 200, "OK", body, r->close);
}

static void serve(conn *c, const request *r, growbuf *body)
{
	growbuf_reset(body);
	if (r->target_len >= 8 && !memcmp(r->target, "/__stub/", 8)) {
		serve_control(c, r, body);
		return;
	}
	count_request(r->key, r->key_len);
	unsigned long id = atomic_fetch_add(&g_seq, 1) + 1;
	growbuf_printf(body,
		       "{\"id\":\"pay_%lu\",\"object\":\"payment\","
		       "\"idempotency_key\":",
		       id);
	if (r->key)
		json_string(body, r->key, r->key_len);
	else
		growbuf_puts(body, "null");
	growbuf_puts(body, "}");
	if (name_is(r->method, r->method_len, "POST"))
		respond(c, 201, "Created", body, r->close);
	else
		respond(c, 200, "OK", body, r->close);
}

/* Answers every complete request in the input buffer; a request it cannot
 * parse is answered 400 and ends the connection. */
static void process_input(conn *c, growbuf *body)
{
	for (;;) {
		const char *p = c->in.data + c->in_off;
		size_t n = c->in.len - c->in_off;
		if (n == 0 || c->close_after)
			break;
		request r;
		int rc = parse_head(p, n, &r);
		if (rc < 0) {
			growbuf_reset(body);
			growbuf_puts(body, "{\"error\":\"bad request\"}");
			respond(c, 400, "Bad Request", body, true);
			break;
		}
		if (rc == 0 || n < r.head_len + r.content_length)
			break;
		serve(c, &r, body);
		c->in_off += r.head_len + r.content_length;
	}
	/* Keep the unanswered tail at the start of the buffer. */
	if (c->in_off == c->in.len) {
		c->in.len = 0;
		c->in_off = 0;
	} else if (c->in_off > 0 && c->in_off * 2 >= c->in.len) {
		memmove(c->in.data, c->in.data + c->in_off,
			c->in.len - c->in_off);
		c->in.len -= c->in_off;
		c->in_off = 0;
	}
}

/* ---- event loop ------------------------------------------------------ */

typedef struct loop {
	int ep;
	int listen_fd;
	pthread_t th;
} loop;

static void conn_free(int ep, conn *c)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	growbuf_free(&c->in);
	growbuf_free(&c->out);
	free(c);
}

/* Writes what it can. Returns -1 when the connection must go. */
static int flush_output(int ep, conn *c)
{
	while (c->out_off < c->out.len) {
		ssize_t w = send(c->fd, c->out.data + c->out_off,
				 c->out.len - c->out_off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (w <= 0)
			return -1;
		c->out_off += (size_t)w;
	}
	bool pending = c->out_off < c->out.len;
	if (!pending) {
		c->out.len = 0;
		c->out_off = 0;
		if (c->close_after)
			return -1;
	}
	if (pending != c->want_out) {
		struct epoll_event ev = {
			.events = EPOLLIN | (pending ? EPOLLOUT : 0),
			.data.ptr = c,
		};
		epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
		c->want_out = pending;
	}
	return 0;
}

/* Reads what is there. Returns -1 on EOF or error. */
static int read_input(conn *c)
{
	for (;;) {
		growbuf_reserve(&c->in, 16384);
		ssize_t r = recv(c->fd, c->in.data + c->in.len,
				 c->in.cap - c->in.len - 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (r <= 0)
			return -1;
		c->in.len += (size_t)r;
		if (c->in.len - c->in_off > STUB_MAX_HEAD + STUB_MAX_BODY)
			return -1;
	}
}

static void accept_all(loop *l)
{
	for (;;) {
		int fd = accept4(l->listen_fd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return; /* EAGAIN: another loop took it, or none left */
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		conn *c = xcalloc(1, sizeof *c);
		c->fd = fd;
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		if (epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			free(c);
		}
	}
}

static void on_conn_event(loop *l, conn *c, uint32_t events, growbuf *body)
{
	if (events & EPOLLIN) {
		bool eof = read_input(c) != 0;
		process_input(c, body);
		if (flush_output(l->ep, c) || eof) {
			conn_free(l->ep, c);
			return;
		}
	}
	if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
		if (flush_output(l->ep, c) || (events & (EPOLLERR | EPOLLHUP)))
			conn_free(l->ep, c);
	}
}

static void *loop_run(void *arg)
{
	loop *l = arg;
	struct epoll_event evs[128];
	growbuf body = {0};
	while (!g_stop) {
		/* The timeout only bounds how late a stop is noticed. */
		int n = epoll_wait(l->ep, evs, 128, 200);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == NULL)
				accept_all(l);
			else
				on_conn_event(l, evs[i].data.ptr,
					      evs[i].events, &body);
		}
	}
	growbuf_free(&body);
	return NULL;
}

/* ---- setup ----------------------------------------------------------- */

static void on_signal(int sig)
{
	g_stop = 1;
}

static int listen_on(int port, int *bound)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t alen = sizeof a;
	if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1024) ||
	    getsockname(fd, (struct sockaddr *)&a, &alen)) {
		close(fd);
		return -1;
	}
	*bound = ntohs(a.sin_port);
	return fd;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: stub_upstream [--port N] [--threads N] "
			"[--dump FILE]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int port = 0, threads = 2;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			usage();
		if (!strcmp(a, "--port") && !parse_int(v, 0, 65535, &port))
			i++;
		else if (!strcmp(a, "--threads") &&
			 !parse_int(v, 1, 64, &threads))
			i++;
		else if (!strcmp(a, "--dump"))
			g_dump_path = argv[++i];
		else
			usage();
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	int bound;
	int lfd = listen_on(port, &bound);
	if (lfd < 0) {
		fprintf(stderr, "stub_upstream: cannot listen on port %d: %s\n",
			port, strerror(errno));
		return 1;
	}
	printf("%d\n", bound);
	fflush(stdout);

	loop *loops = xcalloc((size_t)threads, sizeof *loops);
	for (int i = 0; i < threads; i++) {
		loop *l = &loops[i];
		l->listen_fd = lfd;
		l->ep = epoll_create1(EPOLL_CLOEXEC);
		/* EPOLLEXCLUSIVE: one loop wakes per new connection. */
		struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE,
					 .data.ptr = NULL};
		ALWAYS_ASSERT(l->ep >= 0 &&
			      epoll_ctl(l->ep, EPOLL_CTL_ADD, lfd, &ev) == 0);
		ALWAYS_ASSERT(pthread_create(&l->th, NULL, loop_run, l) == 0);
	}
	for (int i = 0; i < threads; i++)
		pthread_join(loops[i].th, NULL);

	pthread_mutex_lock(&g_counts.mu);
	int rc = dump_locked(g_dump_path);
	if (rc)
		fprintf(stderr, "stub_upstream: cannot write %s: %s\n",
			g_dump_path, strerror(errno));
	pthread_mutex_unlock(&g_counts.mu);
	return rc ? 1 : 0;
}
