/* The ledger upstream of the verification campaign (doc: the shared
 * interfaces of tests/verify/). It logs every execution cheaply, so that the
 * checker can count executions per key and compare each answer a client got
 * with the one the ledger sent.
 *
 *   verify_ledger --listen ADDR:PORT [--listen ADDR:PORT ...] --log FILE
 *                 [--seed N] [--slow-ms 1500]
 *                 [--mix ok=70,e402=8,slow=5,e503=7,drop=5,stream=5]
 *
 * One thread, one epoll set, level-triggered. HTTP/1.1 with keep-alive,
 * Content-Length and chunked request bodies; the body is hashed as it
 * arrives and never kept, so a connection holds at most its head (64 KiB)
 * and its answer. A request under /v1/ takes a behaviour drawn from --mix
 * by a PRNG seeded with --seed, in the order requests complete; the
 * stream's delays come from a second PRNG, so that the sequence of
 * behaviours does not depend on them. Other paths answer 200, unlogged.
 *
 * Choices the shared interfaces leave open:
 *  - a request refused for its size or syntax (400, 413, 431, 501) is
 *    answered with Connection: close and is not logged: it never reached a
 *    behaviour; its reason goes to stderr and the counts are printed at exit;
 *  - a request whose answer is still pending when the ledger stops (a slow
 *    one, or a stream between pieces) is logged then, with cut=1: its client
 *    never got the whole answer;
 *  - the log is opened for appending, its header written only when it is
 *    empty, so that a restarted ledger adds to the same file (exec ids stay
 *    unique: they carry the start time).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEAD_MAX (64 * 1024)
#define BODY_MAX (1024 * 1024)
#define LINE_MAX_CHUNK 1024
#define IN_START 4096
#define DRAIN_MAX (4 * 1024 * 1024)
#define DRAIN_MS 2000
#define FLUSH_MS 100
#define ACCEPT_PAUSE_MS 100
#define LOG_BUF (1 << 20)
#define MAX_LISTEN 16
#define STREAM_MIN_MS 100
#define STREAM_SPAN_MS 201
#define FNV_BASIS 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

enum tag { TAG_LISTENER = 1, TAG_SIGNAL, TAG_CONN };
enum kind { K_OK, K_E402, K_SLOW, K_E503, K_DROP, K_STREAM, K_COUNT };
static const char *const kind_names[K_COUNT] = {"ok",   "e402", "slow",
						"e503", "drop", "stream"};
static const unsigned kind_default[K_COUNT] = {70, 8, 5, 7, 5, 5};

enum state { ST_HEAD, ST_BODY, ST_WAIT, ST_WRITE, ST_DRAIN };
enum body_mode { B_NONE, B_LENGTH, B_CHUNKED };
enum chunk_state { C_SIZE, C_DATA, C_CRLF, C_TRAILER };
enum reject { R_400, R_413, R_431, R_501, R_COUNT };
static const int reject_status[R_COUNT] = {400, 413, 431, 501};

struct listener {
	int tag;
	int fd;
	uint16_t port;
};

struct request {
	char *method, *target, *tenant, *key, *attempt;
	bool keep_alive;
	enum body_mode body_mode;
	enum chunk_state chunk;
	uint64_t body_left; /* of the Content-Length, or of the chunk */
	uint64_t body_total;
	uint64_t body_hash;
};

struct answer {
	bool logged; /* a /v1/ request: one log line when it ends */
	bool close_after;
	bool refused; /* drain the peer, then close */
	enum kind kind;
	uint64_t seq, t_start;
	char exec[64];
	int status;
	uint64_t resp_hash;
	char *out;
	size_t out_len, out_off, out_limit;
	size_t head_len;
	int pieces_left; /* of a stream, after the current one */
};

struct conn {
	int tag;
	int fd;
	uint16_t port;
	enum state state;
	uint32_t events;
	char *in;
	size_t in_len, in_cap;
	struct request req;
	struct answer ans;
	uint64_t due_us;
	ssize_t heap_idx;
	uint64_t drained;
	struct conn *prev, *next;
};

struct server {
	int ep, log_fd;
	struct listener listeners[MAX_LISTEN];
	int n_listen;
	struct {
		int tag;
		int fd;
	} sig;
	uint64_t start_us, seq, prng, delay_prng;
	unsigned weight[K_COUNT], weight_total;
	unsigned slow_ms;
	char *logbuf;
	size_t log_len;
	uint64_t next_flush_us, accept_resume_us;
	bool accept_paused, stopping;
	struct conn **heap;
	size_t heap_len, heap_cap;
	struct conn *conns;
	uint64_t rejected[R_COUNT], logged_lines;
};

static struct server S;

static int conn_process(struct conn *c);

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t fnv_add(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= FNV_PRIME;
	}
	return h;
}

/* splitmix64: small, seedable, and the same on every platform, so that a
 * seed names one sequence of behaviours. */
static uint64_t prng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* ---- a growable buffer for the answers ---- */

struct sbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

/* JSON string contents: quotes, backslashes and control bytes escaped;
 * other bytes as received. */
static void sb_json(struct sbuf *b, const char *s)
{
	char esc[8];
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\') {
			esc[0] = '\\';
			esc[1] = (char)ch;
			sb_add(b, esc, 2);
		} else if (ch < 0x20 || ch == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", ch);
			sb_add(b, esc, 6);
		} else {
			sb_add(b, s, 1);
		}
	}
}

/* ---- the log ---- */

static void log_flush(void)
{
	size_t off = 0;
	while (off < S.log_len) {
		ssize_t n = write(S.log_fd, S.logbuf + off, S.log_len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(stderr, "verify_ledger: log write: %s\n",
				strerror(errno));
			exit(1);
		}
		off += (size_t)n;
	}
	S.log_len = 0;
}

/* A field of a TSV line: tabs, newlines and other control bytes would
 * break the columns, so they become '?'. */
static void log_field(const char *s, bool last)
{
	size_t n = s ? strlen(s) : 0;
	if (S.log_len + n + 1 > LOG_BUF)
		log_flush();
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		S.logbuf[S.log_len++] = (ch < 0x20 || ch == 0x7f) ? '?' : s[i];
	}
	S.logbuf[S.log_len++] = last ? '\n' : '\t';
}

static void log_line(struct conn *c, bool cut)
{
	struct answer *a = &c->ans;
	char num[6][24], hash[2][20] = {"", ""};

	snprintf(num[0], sizeof(num[0]), "%" PRIu64, a->seq);
	snprintf(num[1], sizeof(num[1]), "%u", (unsigned)c->port);
	snprintf(num[2], sizeof(num[2]), "%" PRIu64, a->t_start);
	snprintf(num[3], sizeof(num[3]), "%" PRIu64, now_us());
	snprintf(num[4], sizeof(num[4]), "%d", a->kind != K_E503);
	snprintf(num[5], sizeof(num[5]), "%d", a->status);
	snprintf(hash[0], sizeof(hash[0]), "%016" PRIx64, c->req.body_hash);
	if (a->kind != K_DROP)
		snprintf(hash[1], sizeof(hash[1]), "%016" PRIx64, a->resp_hash);
	const char *f[] = {num[0],
			   num[1],
			   num[2],
			   num[3],
			   c->req.tenant,
			   c->req.key,
			   c->req.attempt,
			   c->req.method,
			   c->req.target,
			   hash[0],
			   kind_names[a->kind],
			   num[4],
			   a->exec,
			   num[5],
			   hash[1],
			   cut ? "1" : "0"};
	size_t nf = sizeof(f) / sizeof(f[0]);
	for (size_t i = 0; i < nf; i++)
		log_field(f[i], i + 1 == nf);
	a->logged = false;
	S.logged_lines++;
}

static int log_open(const char *path, char *err, size_t errlen)
{
	static const char header[] =
		"seq\tport\tt_start\tt_end\ttenant\tkey\tattempt_id\tmethod"
		"\ttarget\tbody_sha\tkind\teffect\texec\tstatus\tresp_hash"
		"\tcut\n";
	struct stat st;

	S.log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (S.log_fd < 0 || fstat(S.log_fd, &st) < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	S.logbuf = malloc(LOG_BUF);
	if (!S.logbuf) {
		snprintf(err, errlen, "no memory for the log buffer");
		return -1;
	}
	if (st.st_size == 0) {
		memcpy(S.logbuf, header, sizeof(header) - 1);
		S.log_len = sizeof(header) - 1;
		log_flush();
	}
	return 0;
}

/* ---- timers: a binary heap of connections by due time ---- */

static void heap_swap(size_t i, size_t j)
{
	struct conn *t = S.heap[i];
	S.heap[i] = S.heap[j];
	S.heap[j] = t;
	S.heap[i]->heap_idx = (ssize_t)i;
	S.heap[j]->heap_idx = (ssize_t)j;
}

static void heap_fix(size_t i)
{
	while (i > 0 && S.heap[(i - 1) / 2]->due_us > S.heap[i]->due_us) {
		heap_swap(i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < S.heap_len && S.heap[l]->due_us < S.heap[m]->due_us)
			m = l;
		if (r < S.heap_len && S.heap[r]->due_us < S.heap[m]->due_us)
			m = r;
		if (m == i)
			return;
		heap_swap(i, m);
		i = m;
	}
}

static void heap_remove(struct conn *c)
{
	if (c->heap_idx < 0)
		return;
	size_t i = (size_t)c->heap_idx;
	S.heap_len--;
	if (i != S.heap_len) {
		S.heap[i] = S.heap[S.heap_len];
		S.heap[i]->heap_idx = (ssize_t)i;
		heap_fix(i);
	}
	c->heap_idx = -1;
}

static int heap_add(struct conn *c, uint64_t delay_ms)
{
	heap_remove(c);
	if (S.heap_len == S.heap_cap) {
		size_t cap = S.heap_cap ? S.heap_cap * 2 : 1024;
		struct conn **h = realloc(S.heap, cap * sizeof(*h));
		if (!h)
			return -1;
		S.heap = h;
		S.heap_cap = cap;
	}
	c->due_us = mono_us() + delay_ms * 1000;
	c->heap_idx = (ssize_t)S.heap_len;
	S.heap[S.heap_len++] = c;
	heap_fix((size_t)c->heap_idx);
	return 0;
}

/* ---- connections ---- */

static void request_clear(struct request *r)
{
	free(r->method);
	free(r->target);
	free(r->tenant);
	free(r->key);
	free(r->attempt);
	memset(r, 0, sizeof(*r));
	r->body_hash = FNV_BASIS;
}

static void answer_clear(struct answer *a)
{
	free(a->out);
	memset(a, 0, sizeof(*a));
}

static void conn_close(struct conn *c)
{
	heap_remove(c);
	close(c->fd);
	if (c->prev)
		c->prev->next = c->next;
	else
		S.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	request_clear(&c->req);
	answer_clear(&c->ans);
	free(c->in);
	free(c);
}

/* The peer closed, or a write failed: an answer not wholly written is cut. */
static void conn_lost(struct conn *c)
{
	if (c->ans.logged)
		log_line(c, true);
	conn_close(c);
}

static int set_events(struct conn *c, uint32_t events)
{
	if (c->events == events)
		return 0;
	struct epoll_event ev = {.events = events, .data.ptr = c};
	if (epoll_ctl(S.ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) {
		fprintf(stderr, "verify_ledger: epoll_ctl: %s\n",
			strerror(errno));
		conn_lost(c);
		return -1;
	}
	c->events = events;
	return 0;
}

static void conn_new(int fd, uint16_t port)
{
	struct conn *c = calloc(1, sizeof(*c));
	int one = 1;

	if (!c) {
		close(fd);
		return;
	}
	c->tag = TAG_CONN;
	c->fd = fd;
	c->port = port;
	c->heap_idx = -1;
	c->events = EPOLLIN;
	c->req.body_hash = FNV_BASIS;
	/* The stream's pieces must leave one by one, not wait for an ACK. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	struct epoll_event ev = {.events = c->events, .data.ptr = c};
	if (epoll_ctl(S.ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
		close(fd);
		free(c);
		return;
	}
	c->next = S.conns;
	if (S.conns)
		S.conns->prev = c;
	S.conns = c;
}

static void consume(struct conn *c, size_t n)
{
	memmove(c->in, c->in + n, c->in_len - n);
	c->in_len -= n;
}

/* ---- answers ---- */

static const char *status_text(int status)
{
	switch (status) {
	case 200:
		return "OK";
	case 201:
		return "Created";
	case 400:
		return "Bad Request";
	case 402:
		return "Payment Required";
	case 413:
		return "Content Too Large";
	case 431:
		return "Request Header Fields Too Large";
	case 501:
		return "Not Implemented";
	case 503:
		return "Service Unavailable";
	}
	return "Unknown";
}

/* The whole answer into c->ans.out, and its resp_hash: FNV-1a of
 * "<status>\n<content-type>\n<x-ledger-exec>\n<body>". */
static int answer_build(struct conn *c, int status, const char *body)
{
	struct answer *a = &c->ans;
	struct sbuf b = {0};
	char line[160];
	size_t blen = strlen(body);

	snprintf(line, sizeof(line), "HTTP/1.1 %d %s\r\n", status,
		 status_text(status));
	sb_str(&b, line);
	sb_str(&b, "Content-Type: application/json\r\n");
	if (a->exec[0]) {
		snprintf(line, sizeof(line), "X-Ledger-Exec: %s\r\n", a->exec);
		sb_str(&b, line);
	}
	snprintf(line, sizeof(line), "Content-Length: %zu\r\n%s\r\n", blen,
		 a->close_after ? "Connection: close\r\n" : "");
	sb_str(&b, line);
	a->head_len = b.len;
	sb_add(&b, body, blen);
	if (b.failed) {
		free(b.p);
		return -1;
	}
	snprintf(line, sizeof(line), "%d\napplication/json\n%s\n", status,
		 a->exec);
	a->resp_hash =
		fnv_add(fnv_add(FNV_BASIS, line, strlen(line)), body, blen);
	a->status = status;
	a->out = b.p;
	a->out_len = b.len;
	a->out_off = 0;
	a->out_limit = b.len;
	return 0;
}

static int answer_done(struct conn *c)
{
	if (c->ans.logged)
		log_line(c, false);
	if (c->ans.refused) {
		shutdown(c->fd, SHUT_WR);
		c->state = ST_DRAIN;
		if (heap_add(c, DRAIN_MS) < 0) {
			conn_close(c);
			return -1;
		}
		return set_events(c, EPOLLIN);
	}
	if (c->ans.close_after) {
		conn_close(c);
		return -1;
	}
	answer_clear(&c->ans);
	request_clear(&c->req);
	c->state = ST_HEAD;
	/* A long head grew the buffer: give it back between requests. */
	if (c->in_cap > IN_START && c->in_len <= IN_START) {
		char *p = realloc(c->in, IN_START);
		if (p) {
			c->in = p;
			c->in_cap = IN_START;
		}
	}
	return set_events(c, EPOLLIN);
}

/* Writes what is released of the answer; a stream's next piece waits for
 * its timer. Returns -1 when c is gone. */
static int conn_flush(struct conn *c)
{
	struct answer *a = &c->ans;

	c->state = ST_WRITE;
	while (a->out_off < a->out_limit) {
		ssize_t n = send(c->fd, a->out + a->out_off,
				 a->out_limit - a->out_off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return set_events(c, EPOLLOUT | EPOLLRDHUP);
		if (n <= 0) {
			conn_lost(c);
			return -1;
		}
		a->out_off += (size_t)n;
	}
	if (a->out_limit < a->out_len) {
		uint64_t d = STREAM_MIN_MS +
			     prng_next(&S.delay_prng) % STREAM_SPAN_MS;
		c->state = ST_WAIT;
		if (heap_add(c, d) < 0) {
			conn_lost(c);
			return -1;
		}
		return set_events(c, EPOLLRDHUP);
	}
	return answer_done(c);
}

/* A request refused before any behaviour: answered, never logged. Returns
 * -1 always: the request is over, and c may be gone. */
static int conn_refuse(struct conn *c, enum reject why, const char *reason)
{
	char body[160];

	S.rejected[why]++;
	fprintf(stderr, "verify_ledger: port %u: %d: %s\n", (unsigned)c->port,
		reject_status[why], reason);
	snprintf(body, sizeof(body), "{\"error\":\"%s\"}", reason);
	answer_clear(&c->ans);
	c->ans.close_after = true;
	c->ans.refused = true;
	if (answer_build(c, reject_status[why], body) < 0) {
		conn_close(c);
		return -1;
	}
	conn_flush(c);
	return -1;
}

static enum kind draw_kind(void)
{
	uint64_t r = prng_next(&S.prng) % S.weight_total;
	int k = 0;
	while (r >= S.weight[k]) {
		r -= S.weight[k];
		k++;
	}
	return (enum kind)k;
}

static int effect_body(struct conn *c, struct sbuf *b)
{
	char sha[20];

	snprintf(sha, sizeof(sha), "%016" PRIx64, c->req.body_hash);
	sb_str(b, "{\"exec\":\"");
	sb_json(b, c->ans.exec);
	sb_str(b, "\",\"tenant\":\"");
	sb_json(b, c->req.tenant ? c->req.tenant : "");
	sb_str(b, "\",\"key\":\"");
	sb_json(b, c->req.key ? c->req.key : "");
	sb_str(b, "\",\"body_sha\":\"");
	sb_str(b, sha);
	sb_str(b, c->ans.kind == K_E402 ? "\",\"declined\":true}" : "\"}");
	return b->failed ? -1 : 0;
}

static int behave(struct conn *c)
{
	struct answer *a = &c->ans;
	struct sbuf b = {0};
	int rc;

	if (a->kind == K_DROP) {
		log_line(c, false);
		conn_close(c);
		return -1;
	}
	if (a->kind == K_E503)
		sb_str(&b, "{\"error\":\"ledger unavailable\"}");
	else
		effect_body(c, &b);
	rc = b.failed ? -1
		      : answer_build(c,
				     a->kind == K_E402   ? 402
				     : a->kind == K_E503 ? 503
							 : 201,
				     b.p);
	free(b.p);
	if (rc < 0) {
		conn_lost(c);
		return -1;
	}
	if (a->kind == K_SLOW) {
		c->state = ST_WAIT;
		if (heap_add(c, S.slow_ms) < 0) {
			conn_lost(c);
			return -1;
		}
		return set_events(c, EPOLLRDHUP);
	}
	if (a->kind == K_STREAM) {
		a->out_limit = a->head_len;
		a->pieces_left = 2;
	}
	return conn_flush(c);
}

/* The whole request is in: /v1/ takes a behaviour, anything else a 200. */
static int conn_dispatch(struct conn *c)
{
	struct answer *a = &c->ans;

	answer_clear(a);
	a->close_after = !c->req.keep_alive;
	a->t_start = now_us();
	if (!c->req.target || strncmp(c->req.target, "/v1/", 4) != 0) {
		if (answer_build(c, 200, "{\"ok\":true}") < 0) {
			conn_close(c);
			return -1;
		}
		return conn_flush(c);
	}
	a->logged = true;
	a->kind = draw_kind();
	a->seq = ++S.seq;
	if (a->kind != K_E503)
		snprintf(a->exec, sizeof(a->exec), "%u-%" PRIu64 "-%" PRIu64,
			 (unsigned)c->port, S.start_us, a->seq);
	return behave(c);
}

/* ---- reading a request ---- */

static char *trimmed_dup(const char *s, size_t n)
{
	while (n && (*s == ' ' || *s == '\t')) {
		s++;
		n--;
	}
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		n--;
	char *d = strndup(s, n);
	if (!d)
		abort();
	return d;
}

static bool has_token(const char *v, const char *tok)
{
	return v && strcasestr(v, tok) != NULL;
}

/* One header line; the few headers the ledger needs are kept. */
static int parse_header(struct conn *c, const char *l, size_t n,
			char **conn_hdr, char **te)
{
	struct request *r = &c->req;
	const char *colon = memchr(l, ':', n);
	if (!colon || colon == l || l[0] == ' ' || l[0] == '\t')
		return conn_refuse(c, R_400, "malformed header line");
	size_t nl = (size_t)(colon - l);
	char *v = trimmed_dup(colon + 1, n - nl - 1);
	char **slot = NULL;
#define IS(name) (nl == sizeof(name) - 1 && strncasecmp(l, name, nl) == 0)
	if (IS("x-tenant-id"))
		slot = &r->tenant;
	else if (IS("idempotency-key"))
		slot = &r->key;
	else if (IS("x-attempt-id"))
		slot = &r->attempt;
	else if (IS("connection"))
		slot = conn_hdr;
	else if (IS("transfer-encoding"))
		slot = te;
	else if (IS("content-length")) {
		char *end;
		errno = 0;
		unsigned long long len = strtoull(v, &end, 10);
		bool bad = !*v || *end || errno || v[0] == '-';
		free(v);
		if (bad)
			return conn_refuse(c, R_400, "bad Content-Length");
		if (len > BODY_MAX)
			return conn_refuse(c, R_413, "body over 1 MiB");
		r->body_mode = B_LENGTH;
		r->body_left = len;
		return 0;
	}
#undef IS
	if (slot) {
		free(*slot);
		*slot = v;
	} else {
		free(v);
	}
	return 0;
}

static int parse_request_line(struct conn *c, const char *l, size_t n,
			      bool *http10)
{
	const char *sp1 = memchr(l, ' ', n);
	const char *sp2 =
		sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 - l) - 1) : NULL;
	if (!sp1 || !sp2 || sp1 == l || sp2 == sp1 + 1)
		return conn_refuse(c, R_400, "malformed request line");
	size_t vlen = n - (size_t)(sp2 + 1 - l);
	if (vlen != 8 || strncmp(sp2 + 1, "HTTP/1.", 7) != 0)
		return conn_refuse(c, R_400, "not HTTP/1.x");
	*http10 = sp2[8] == '0';
	c->req.method = trimmed_dup(l, (size_t)(sp1 - l));
	c->req.target = trimmed_dup(sp1 + 1, (size_t)(sp2 - sp1 - 1));
	return 0;
}

/* Keep-alive and the body's framing, from the headers read. */
static int head_framing(struct conn *c, bool http10, char *conn_hdr, char *te)
{
	struct request *r = &c->req;
	int rc = 0;

	r->keep_alive = http10 ? has_token(conn_hdr, "keep-alive")
			       : !has_token(conn_hdr, "close");
	if (te) {
		size_t n = strlen(te);
		if (n < 7 || strcasecmp(te + n - 7, "chunked") != 0)
			rc = conn_refuse(c, R_501,
					 "transfer coding not chunked");
		else {
			r->body_mode = B_CHUNKED;
			r->chunk = C_SIZE;
			r->body_left = 0;
		}
	}
	free(conn_hdr);
	free(te);
	return rc;
}

static int parse_head(struct conn *c, size_t head_len)
{
	char *conn_hdr = NULL, *te = NULL;
	const char *p = c->in, *end = c->in + head_len - 2;
	bool http10 = false;
	bool first = true;

	while (p < end) {
		const char *eol = memmem(p, (size_t)(end + 2 - p), "\r\n", 2);
		size_t n = (size_t)(eol - p);
		int rc = first ? parse_request_line(c, p, n, &http10)
			       : parse_header(c, p, n, &conn_hdr, &te);
		if (rc < 0) {
			free(conn_hdr);
			free(te);
			return -1;
		}
		first = false;
		p = eol + 2;
	}
	if (first)
		return conn_refuse(c, R_400, "empty request");
	return head_framing(c, http10, conn_hdr, te);
}

static void expect_continue(struct conn *c, size_t head_len)
{
	/* curl sends Expect: 100-continue for larger bodies; say go at once
	 * rather than make it wait for its own timeout. */
	const char *e = memmem(c->in, head_len, "\r\nExpect:", 9);
	if (!e)
		e = memmem(c->in, head_len, "\r\nexpect:", 9);
	if (e && c->req.body_mode != B_NONE && c->in_len == head_len) {
		static const char go[] = "HTTP/1.1 100 Continue\r\n\r\n";
		if (send(c->fd, go, sizeof(go) - 1, MSG_NOSIGNAL) < 0)
			return;
	}
}

/* 1: the head is in and parsed; 0: more is needed; -1: c is gone or
 * answering a refusal. */
static int read_head(struct conn *c)
{
	char *e =
		c->in_len >= 4 ? memmem(c->in, c->in_len, "\r\n\r\n", 4) : NULL;
	if (!e) {
		if (c->in_len >= HEAD_MAX)
			return conn_refuse(c, R_431, "head over 64 KiB");
		return 0;
	}
	size_t head_len = (size_t)(e - c->in) + 4;
	if (head_len > HEAD_MAX)
		return conn_refuse(c, R_431, "head over 64 KiB");
	request_clear(&c->req);
	if (parse_head(c, head_len) < 0)
		return -1;
	expect_continue(c, head_len);
	consume(c, head_len);
	c->state = ST_BODY;
	return 1;
}

static void body_take(struct conn *c, size_t n)
{
	c->req.body_hash = fnv_add(c->req.body_hash, c->in, n);
	c->req.body_total += n;
	c->req.body_left -= n;
	consume(c, n);
}

/* A chunk-size line or a trailer line: its length without the CRLF, or -1
 * when it is not all in yet. */
static ssize_t chunk_line(struct conn *c)
{
	char *eol = memmem(c->in, c->in_len, "\r\n", 2);
	return eol ? eol - c->in : -1;
}

/* One step of a chunked body. 1: progressed; 0: more is needed; 2: the
 * body is complete; -1: refused. */
static int chunk_step(struct conn *c)
{
	struct request *r = &c->req;
	ssize_t n;

	switch (r->chunk) {
	case C_SIZE:
	case C_TRAILER:
		n = chunk_line(c);
		if (n < 0)
			return c->in_len > LINE_MAX_CHUNK
				       ? conn_refuse(c, R_400,
						     "chunk line too long")
				       : 0;
		if (r->chunk == C_TRAILER) {
			r->body_total += (size_t)n + 2;
			if (r->body_total > BODY_MAX)
				return conn_refuse(c, R_413, "body over 1 MiB");
			consume(c, (size_t)n + 2);
			return n == 0 ? 2 : 1;
		}
		/* strtoull would skip a CR or LF: the line must start with a
		 * hex digit, and the CRLF found stops the digits. */
		if (!isxdigit((unsigned char)c->in[0]))
			return conn_refuse(c, R_400, "bad chunk size");
		char *end;
		errno = 0;
		unsigned long long size = strtoull(c->in, &end, 16);
		if (errno || (*end != ';' && *end != '\r' && *end != ' ' &&
			      *end != '\t'))
			return conn_refuse(c, R_400, "bad chunk size");
		if (size > BODY_MAX || r->body_total + size > BODY_MAX)
			return conn_refuse(c, R_413, "body over 1 MiB");
		consume(c, (size_t)n + 2);
		r->body_left = size;
		r->chunk = size ? C_DATA : C_TRAILER;
		return 1;
	case C_DATA:
		n = (ssize_t)(c->in_len < r->body_left ? c->in_len
						       : r->body_left);
		body_take(c, (size_t)n);
		if (r->body_left == 0)
			r->chunk = C_CRLF;
		return n > 0 || r->body_left == 0 ? 1 : 0;
	case C_CRLF:
		if (c->in_len < 2)
			return 0;
		if (c->in[0] != '\r' || c->in[1] != '\n')
			return conn_refuse(c, R_400, "chunk not ended by CRLF");
		consume(c, 2);
		r->chunk = C_SIZE;
		return 1;
	}
	return conn_refuse(c, R_400, "chunk parser lost");
}

/* 1: the body is complete; 0: more is needed; -1: refused. */
static int read_body(struct conn *c)
{
	struct request *r = &c->req;

	if (r->body_mode == B_NONE)
		return 1;
	if (r->body_mode == B_LENGTH) {
		size_t n = c->in_len < r->body_left ? c->in_len : r->body_left;
		body_take(c, n);
		return r->body_left == 0;
	}
	for (;;) {
		int rc = chunk_step(c);
		if (rc != 1)
			return rc == 2 ? 1 : rc;
	}
}

/* Runs what is buffered through the request parser; several requests when
 * the client pipelines. Returns -1 when c is gone or busy with a refusal. */
static int conn_process(struct conn *c)
{
	for (;;) {
		int rc;
		if (c->state == ST_HEAD) {
			rc = read_head(c);
			if (rc <= 0)
				return rc;
		}
		if (c->state != ST_BODY)
			return 0;
		rc = read_body(c);
		if (rc <= 0)
			return rc;
		if (conn_dispatch(c) < 0)
			return -1;
		if (c->state != ST_HEAD || c->in_len == 0)
			return 0;
	}
}

static int ensure_room(struct conn *c)
{
	if (c->in_cap - c->in_len >= 1024 || c->in_cap >= HEAD_MAX + 1024)
		return c->in_cap > c->in_len ? 0 : -1;
	size_t cap = c->in_cap ? c->in_cap * 2 : IN_START;
	if (cap > HEAD_MAX + 1024)
		cap = HEAD_MAX + 1024;
	char *p = realloc(c->in, cap);
	if (!p)
		return -1;
	c->in = p;
	c->in_cap = cap;
	return 0;
}

static void on_readable(struct conn *c)
{
	if (ensure_room(c) < 0) {
		conn_close(c);
		return;
	}
	ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
	if (n < 0 &&
	    (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		/* A half request is not logged: no behaviour was drawn. */
		conn_close(c);
		return;
	}
	c->in_len += (size_t)n;
	conn_process(c);
}

/* After a refusal: read and discard what the peer still sends, so that
 * closing does not reset the connection before it has read the answer. */
static void on_drain(struct conn *c)
{
	char buf[16384];
	ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
	if (n < 0 &&
	    (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0 || (c->drained += (uint64_t)n) > DRAIN_MAX)
		conn_close(c);
}

static void on_conn_event(struct conn *c, uint32_t ev)
{
	switch (c->state) {
	case ST_HEAD:
	case ST_BODY:
		if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))
			on_readable(c);
		return;
	case ST_DRAIN:
		on_drain(c);
		return;
	case ST_WAIT:
	case ST_WRITE:
		if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
			conn_lost(c);
			return;
		}
		if ((ev & EPOLLOUT) && c->state == ST_WRITE &&
		    conn_flush(c) == 0 && c->state == ST_HEAD && c->in_len)
			conn_process(c);
		return;
	}
}

static void on_timer(struct conn *c)
{
	struct answer *a = &c->ans;

	if (c->state == ST_DRAIN) {
		conn_close(c);
		return;
	}
	if (c->state != ST_WAIT)
		return;
	if (a->kind == K_STREAM && a->pieces_left == 2)
		a->out_limit = a->head_len + (a->out_len - a->head_len) / 2;
	else
		a->out_limit = a->out_len;
	a->pieces_left--;
	if (conn_flush(c) == 0 && c->state == ST_HEAD && c->in_len)
		conn_process(c);
}

static void run_timers(void)
{
	uint64_t now = mono_us();
	while (S.heap_len && S.heap[0]->due_us <= now) {
		struct conn *c = S.heap[0];
		heap_remove(c);
		on_timer(c);
	}
}

/* ---- listening ---- */

static void accept_pause(bool pause)
{
	for (int i = 0; i < S.n_listen; i++) {
		struct epoll_event ev = {.events = pause ? 0 : EPOLLIN,
					 .data.ptr = &S.listeners[i]};
		epoll_ctl(S.ep, EPOLL_CTL_MOD, S.listeners[i].fd, &ev);
	}
	S.accept_paused = pause;
	S.accept_resume_us = mono_us() + ACCEPT_PAUSE_MS * 1000;
}

static void on_accept(struct listener *l)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			conn_new(fd, l->port);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
			continue;
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
		    errno == ENOMEM) {
			/* Out of descriptors: stop accepting for a moment
			 * rather than spin on a listener that stays readable. */
			fprintf(stderr, "verify_ledger: accept: %s (paused)\n",
				strerror(errno));
			accept_pause(true);
		}
		return;
	}
}

static int listen_on(const char *spec, char *err, size_t errlen)
{
	char host[64];
	const char *colon = strrchr(spec, ':');
	struct sockaddr_in sa = {.sin_family = AF_INET};
	int one = 1;

	if (S.n_listen == MAX_LISTEN || !colon ||
	    (size_t)(colon - spec) >= sizeof(host)) {
		snprintf(err, errlen,
			 "--listen %s: want ADDR:PORT (at most %d)", spec,
			 MAX_LISTEN);
		return -1;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	char *end;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (*end || port > 65535 ||
	    inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		snprintf(err, errlen, "--listen %s: bad address", spec);
		return -1;
	}
	sa.sin_port = htons((uint16_t)port);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	socklen_t len = sizeof(sa);
	if (fd < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(fd, SOMAXCONN) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		snprintf(err, errlen, "--listen %s: %s", spec, strerror(errno));
		return -1;
	}
	struct listener *l = &S.listeners[S.n_listen++];
	l->tag = TAG_LISTENER;
	l->fd = fd;
	l->port = ntohs(sa.sin_port);
	return 0;
}

/* ---- options ---- */

static int parse_mix(const char *spec, char *err, size_t errlen)
{
	char *copy = strdup(spec), *save = NULL;
	int rc = 0;

	memset(S.weight, 0, sizeof(S.weight));
	for (char *t = strtok_r(copy, ",", &save); t && rc == 0;
	     t = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(t, '='), *end;
		int k = 0;
		if (eq)
			*eq = '\0';
		while (k < K_COUNT && strcmp(kind_names[k], t) != 0)
			k++;
		unsigned long w = eq ? strtoul(eq + 1, &end, 10) : 0;
		if (!eq || k == K_COUNT || *end || end == eq + 1 ||
		    w > 1000000) {
			snprintf(err, errlen, "--mix: bad item '%s'", t);
			rc = -1;
		} else {
			S.weight[k] = (unsigned)w;
		}
	}
	free(copy);
	return rc;
}

static int weights_check(char *err, size_t errlen)
{
	S.weight_total = 0;
	for (int k = 0; k < K_COUNT; k++)
		S.weight_total += S.weight[k];
	if (S.weight_total == 0) {
		snprintf(err, errlen, "--mix: all weights are zero");
		return -1;
	}
	return 0;
}

static int parse_num(const char *name, const char *v, uint64_t max,
		     uint64_t *out, char *err, size_t errlen)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (!*v || *end || errno || v[0] == '-' || n > max) {
		snprintf(err, errlen, "--%s %s: want an integer up to %" PRIu64,
			 name, v, max);
		return -1;
	}
	*out = n;
	return 0;
}

static int parse_args(int argc, char **argv, char *err, size_t errlen)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"log", required_argument, NULL, 'o'},
		{"seed", required_argument, NULL, 's'},
		{"slow-ms", required_argument, NULL, 'w'},
		{"mix", required_argument, NULL, 'm'},
		{NULL, 0, NULL, 0}};
	const char *log_path = NULL;
	uint64_t slow_ms = 1500;
	int o;

	memcpy(S.weight, kind_default, sizeof(S.weight));
	S.prng = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rc = 0;
		if (o == 'l')
			rc = listen_on(optarg, err, errlen);
		else if (o == 'o')
			log_path = optarg;
		else if (o == 's')
			rc = parse_num("seed", optarg, UINT64_MAX, &S.prng, err,
				       errlen);
		else if (o == 'w')
			rc = parse_num("slow-ms", optarg, 3600000, &slow_ms,
				       err, errlen);
		else if (o == 'm')
			rc = parse_mix(optarg, err, errlen);
		else
			rc = (snprintf(err, errlen, "unknown option"), -1);
		if (rc < 0)
			return -1;
	}
	if (S.n_listen == 0 || !log_path || optind != argc) {
		snprintf(err, errlen,
			 "usage: verify_ledger --listen ADDR:PORT [...] --log "
			 "FILE [--seed N] [--slow-ms MS] [--mix k=w,...]");
		return -1;
	}
	S.slow_ms = (unsigned)slow_ms;
	S.delay_prng = S.prng ^ 0x5851f42d4c957f2dULL;
	if (weights_check(err, errlen) < 0)
		return -1;
	return log_open(log_path, err, errlen);
}

/* ---- the loop ---- */

static int setup(char *err, size_t errlen)
{
	struct rlimit rl;
	sigset_t mask;

	/* Thousands of connections: take every descriptor allowed. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	S.ep = epoll_create1(EPOLL_CLOEXEC);
	S.sig.tag = TAG_SIGNAL;
	S.sig.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &S.sig};
	if (S.ep < 0 || S.sig.fd < 0 ||
	    epoll_ctl(S.ep, EPOLL_CTL_ADD, S.sig.fd, &ev) < 0) {
		snprintf(err, errlen, "epoll/signalfd: %s", strerror(errno));
		return -1;
	}
	for (int i = 0; i < S.n_listen; i++) {
		ev.data.ptr = &S.listeners[i];
		if (epoll_ctl(S.ep, EPOLL_CTL_ADD, S.listeners[i].fd, &ev) <
		    0) {
			snprintf(err, errlen, "epoll: %s", strerror(errno));
			return -1;
		}
	}
	S.start_us = now_us();
	S.next_flush_us = mono_us() + FLUSH_MS * 1000;
	return 0;
}

static int next_timeout(void)
{
	uint64_t now = mono_us(), due = S.next_flush_us;
	if (S.heap_len && S.heap[0]->due_us < due)
		due = S.heap[0]->due_us;
	if (S.accept_paused && S.accept_resume_us < due)
		due = S.accept_resume_us;
	/* Rounded up: a timer never fires before its time. */
	return due > now ? (int)((due - now + 999) / 1000) : 0;
}

static void on_tick(void)
{
	uint64_t now = mono_us();
	if (now >= S.next_flush_us) {
		if (S.log_len)
			log_flush();
		S.next_flush_us = now + FLUSH_MS * 1000;
	}
	if (S.accept_paused && now >= S.accept_resume_us)
		accept_pause(false);
}

static void on_event(struct epoll_event *e)
{
	int tag = *(int *)e->data.ptr;

	if (tag == TAG_LISTENER) {
		on_accept(e->data.ptr);
	} else if (tag == TAG_SIGNAL) {
		struct signalfd_siginfo si;
		if (read(S.sig.fd, &si, sizeof(si)) == sizeof(si))
			S.stopping = true;
	} else {
		on_conn_event(e->data.ptr, e->events);
	}
}

/* Stopping: a request whose answer is not wholly written is logged as
 * cut, then the log is flushed. */
static void stop(void)
{
	while (S.conns) {
		struct conn *c = S.conns;
		if (c->ans.logged)
			log_line(c, true);
		conn_close(c);
	}
	log_flush();
	fprintf(stderr,
		"verify_ledger: stopped: %" PRIu64
		" logged, refused 400=%" PRIu64 " 413=%" PRIu64 " 431=%" PRIu64
		" 501=%" PRIu64 "\n",
		S.logged_lines, S.rejected[R_400], S.rejected[R_413],
		S.rejected[R_431], S.rejected[R_501]);
}

int main(int argc, char **argv)
{
	char err[256];
	struct epoll_event evs[256];

	if (parse_args(argc, argv, err, sizeof(err)) < 0 ||
	    setup(err, sizeof(err)) < 0) {
		fprintf(stderr, "verify_ledger: %s\n", err);
		return 2;
	}
	while (!S.stopping) {
		int n = epoll_wait(S.ep, evs, 256, next_timeout());
		if (n < 0 && errno != EINTR) {
			fprintf(stderr, "verify_ledger: epoll_wait: %s\n",
				strerror(errno));
			return 1;
		}
		for (int i = 0; i < n; i++)
			on_event(&evs[i]);
		run_timers();
		on_tick();
	}
	stop();
	return 0;
}
