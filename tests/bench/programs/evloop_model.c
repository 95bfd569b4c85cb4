/* A model of an event-driven first attempt, for the benchmark only: not a
 * proxy. It measures what the request path costs on this machine when one
 * thread multiplexes everything, to compare with idemproxy's CPU per fresh
 * key (tests/bench/model.sh runs both in one run).
 *
 *   evloop_model --upstream PORT --db CONNINFO [--slots N]
 *
 * One thread, one epoll set. Clients send HTTP/1.1 requests with an
 * Idempotency-Key header (wrk with fresh.lua); each request takes a free
 * slot (one PostgreSQL connection, libpq's asynchronous calls, and one
 * kept-alive connection to the upstream) or waits for one, then:
 *
 *   1. INSERT ... ON CONFLICT DO NOTHING of the key and an owner token:
 *      idemproxy's claim of a new key (claim_record.sql's, on
 *      idempotency_records);
 *   2. the request, with the key and the client's body, to the upstream;
 *      its answer read whole (Content-Length);
 *   3. UPDATE ... WHERE the key AND the owner token, recording the status
 *      and the body: idemproxy's record (RETURNING wait_notify included);
 *   4. the upstream's status and body to the client.
 *
 * What it leaves out is everything that makes idemproxy a proxy (header
 * checks and forwarding, fingerprints, the lease and fencing, replays,
 * timeouts, errors, metrics, logs): its CPU per request is a floor for the
 * exchanges themselves (the client's request and answer, two statements,
 * the upstream's request and answer) in one event loop, not a target.
 * Anything unexpected ends it. The port is printed as the first line of
 * stdout; it runs until killed. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF_CAP 65536
#define MAX_SLOTS 256
#define MAX_FDS 65536

enum kind { K_LISTEN, K_CLIENT, K_PG, K_UP };

typedef struct buf {
	char d[BUF_CAP];
	size_t len;
} buf;

struct slot;

typedef struct client {
	int fd;
	buf in;
	char out[BUF_CAP];
	size_t out_len, out_off;
	struct slot *slot;
	struct client *next_wait;
	char key[256];
	const char *body;
	size_t body_len;
	size_t req_len; /* head + body, consumed when answered */
	int queued;
} client;

typedef struct slot {
	PGconn *pg;
	int pg_fd, up_fd;
	int step; /* 1 claim, 2 upstream, 3 record */
	client *c;
	buf up;
	int status;
	size_t body_off, body_len;
	char owner[40];
	struct slot *next_free;
} slot;

static int ep;
static void *owner_of[MAX_FDS];
static enum kind kind_of[MAX_FDS];
static slot slots[MAX_SLOTS];
static slot *free_slots;
static client *wait_head, *wait_tail;
static int up_port;
static unsigned long long owner_seq;

static void die(const char *what)
{
	fprintf(stderr, "evloop_model: %s (%s)\n", what, strerror(errno));
	exit(1);
}

static void watch(int fd, enum kind k, void *p, uint32_t ev)
{
	if (fd < 0 || fd >= MAX_FDS)
		die("fd out of range");
	kind_of[fd] = k;
	owner_of[fd] = p;
	struct epoll_event e = {.events = ev, .data.fd = fd};
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e))
		die("epoll_ctl add");
}

static void rewatch(int fd, uint32_t ev)
{
	struct epoll_event e = {.events = ev, .data.fd = fd};
	if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e))
		die("epoll_ctl mod");
}

static void nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK))
		die("fcntl");
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int connect_upstream(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)up_port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a))
		die("connect upstream");
	nonblock(fd);
	return fd;
}

static void write_all(int fd, const char *p, size_t n)
{
	/* small requests on an idle kept-alive connection: the socket
	 * buffer takes them whole */
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0)
			die("send");
		p += w;
		n -= (size_t)w;
	}
}

static void pg_send(slot *s, const char *stmt, int n, const char *const *v)
{
	if (!PQsendQueryPrepared(s->pg, stmt, n, v, NULL, NULL, 0))
		die(PQerrorMessage(s->pg));
	if (PQflush(s->pg) != 0)
		die("PQflush");
}

static void claim(slot *s)
{
	s->step = 1;
	snprintf(s->owner, sizeof s->owner, "00000000-0000-4000-8000-%012llx",
		 ++owner_seq);
	const char *v[2] = {s->c->key, s->owner};
	pg_send(s, "claim", 2, v);
}

static void start(client *c, slot *s)
{
	c->slot = s;
	s->c = c;
	claim(s);
}

static void answer(client *c, const slot *s);
static void send_answer(client *c);

static void release(slot *s)
{
	s->c = NULL;
	if (wait_head) {
		client *c = wait_head;
		wait_head = c->next_wait;
		if (!wait_head)
			wait_tail = NULL;
		c->queued = 0;
		start(c, s);
		return;
	}
	s->next_free = free_slots;
	free_slots = s;
}

static void to_upstream(slot *s)
{
	s->step = 2;
	s->up.len = 0;
	char head[1024];
	int n = snprintf(head, sizeof head,
			 "POST /v1/payments HTTP/1.1\r\nHost: upstream\r\n"
			 "Idempotency-Key: %s\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n",
			 s->c->key, s->c->body_len);
	write_all(s->up_fd, head, (size_t)n);
	if (s->c->body_len)
		write_all(s->up_fd, s->c->body, s->c->body_len);
}

static void record(slot *s)
{
	s->step = 3;
	char status[8];
	snprintf(status, sizeof status, "%d", s->status);
	/* the body as text, stored as bytea (convert_to) */
	static char body[BUF_CAP];
	size_t n = s->body_len < sizeof body - 1 ? s->body_len : sizeof body - 1;
	memcpy(body, s->up.d + s->body_off, n);
	body[n] = 0;
	const char *v[4] = {status, body, s->c->key, s->owner};
	pg_send(s, "record", 4, v);
}

static void prepare(PGconn *pg, const char *name, const char *sql, int n)
{
	PGresult *r = PQprepare(pg, name, sql, n, NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		die(PQresultErrorMessage(r));
	PQclear(r);
}

static void on_pg(slot *s)
{
	if (!PQconsumeInput(s->pg))
		die(PQerrorMessage(s->pg));
	while (!PQisBusy(s->pg)) {
		PGresult *r = PQgetResult(s->pg);
		if (!r)
			break;
		if (PQresultStatus(r) != PGRES_COMMAND_OK &&
		    PQresultStatus(r) != PGRES_TUPLES_OK)
			die(PQresultErrorMessage(r));
		if (s->step == 3 && PQntuples(r) != 1)
			die("the record matched no row");
		PQclear(r);
		/* the statement's end: the next result is NULL */
		PGresult *end = PQgetResult(s->pg);
		if (end)
			die("more than one result");
		if (s->step == 1) {
			to_upstream(s);
		} else if (s->step == 3) {
			client *c = s->c;
			answer(c, s);
			release(s);
			send_answer(c);
		}
		return;
	}
}

/* The upstream's answer is whole: status line, headers, Content-Length
 * bytes of body. */
static int up_done(slot *s)
{
	buf *b = &s->up;
	char *end = memmem(b->d, b->len, "\r\n\r\n", 4);
	if (!end)
		return 0;
	size_t head = (size_t)(end - b->d) + 4;
	char *cl = memmem(b->d, head, "Content-Length:", 15);
	size_t len = cl ? strtoul(cl + 15, NULL, 10) : 0;
	if (b->len < head + len)
		return 0;
	if (b->len != head + len)
		die("bytes after the upstream's answer");
	s->status = atoi(b->d + 9);
	s->body_off = head;
	s->body_len = len;
	return 1;
}

static void on_up(slot *s)
{
	buf *b = &s->up;
	ssize_t n = recv(s->up_fd, b->d + b->len, sizeof b->d - b->len, 0);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0)
		die("upstream closed");
	b->len += (size_t)n;
	if (s->step == 2 && up_done(s))
		record(s);
}

/* The upstream's status and body, for the client (before the slot is
 * handed on). */
static void answer(client *c, const slot *s)
{
	c->slot = NULL;
	int n = snprintf(c->out, sizeof c->out,
			 "HTTP/1.1 %d Created\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n",
			 s->status, s->body_len);
	if ((size_t)n + s->body_len > sizeof c->out)
		die("answer too large");
	memcpy(c->out + n, s->up.d + s->body_off, s->body_len);
	c->out_len = (size_t)n + s->body_len;
}

static void try_request(client *c);

static void send_answer(client *c)
{
	ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
	if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
		die("send to the client");
	c->out_off = w > 0 ? (size_t)w : 0;
	/* the request is answered: drop it from the input */
	memmove(c->in.d, c->in.d + c->req_len, c->in.len - c->req_len);
	c->in.len -= c->req_len;
	c->req_len = 0;
	if (c->out_off < c->out_len)
		rewatch(c->fd, EPOLLIN | EPOLLOUT);
	else
		try_request(c); /* one the client sent behind it */
}

static void close_client(client *c)
{
	if (c->slot || c->queued)
		die("a client left with a request in flight");
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c);
}

/* A whole request in c->in: find the key and the body, take a slot. */
static void try_request(client *c)
{
	if (c->slot || c->queued || c->req_len)
		return;
	char *end = memmem(c->in.d, c->in.len, "\r\n\r\n", 4);
	if (!end)
		return;
	size_t head = (size_t)(end - c->in.d) + 4;
	char *cl = memmem(c->in.d, head, "Content-Length:", 15);
	if (!cl)
		cl = memmem(c->in.d, head, "content-length:", 15);
	size_t len = cl ? strtoul(cl + 15, NULL, 10) : 0;
	if (c->in.len < head + len)
		return;
	char *k = memmem(c->in.d, head, "Idempotency-Key:", 16);
	if (!k)
		die("a request without Idempotency-Key");
	k += 16;
	while (*k == ' ')
		k++;
	char *ke = memmem(k, head - (size_t)(k - c->in.d), "\r\n", 2);
	size_t kl = (size_t)(ke - k);
	if (kl >= sizeof c->key)
		die("key too long");
	memcpy(c->key, k, kl);
	c->key[kl] = 0;
	c->body = c->in.d + head;
	c->body_len = len;
	c->req_len = head + len;
	if (free_slots) {
		slot *s = free_slots;
		free_slots = s->next_free;
		start(c, s);
	} else {
		c->queued = 1;
		c->next_wait = NULL;
		if (wait_tail)
			wait_tail->next_wait = c;
		else
			wait_head = c;
		wait_tail = c;
	}
}

static void on_client(client *c, uint32_t ev)
{
	if (ev & EPOLLOUT) {
		ssize_t w = send(c->fd, c->out + c->out_off,
				 c->out_len - c->out_off, MSG_NOSIGNAL);
		if (w > 0)
			c->out_off += (size_t)w;
		if (c->out_off == c->out_len)
			rewatch(c->fd, EPOLLIN);
	}
	if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		return;
	if (c->in.len == sizeof c->in.d)
		die("request too large");
	ssize_t n = recv(c->fd, c->in.d + c->in.len, sizeof c->in.d - c->in.len,
			 0);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		if (!c->slot && !c->queued)
			close_client(c);
		return;
	}
	c->in.len += (size_t)n;
	try_request(c);
}

int main(int argc, char **argv)
{
	const char *db = NULL;
	int nslots = 16;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--upstream"))
			up_port = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--db"))
			db = argv[i + 1];
		else if (!strcmp(argv[i], "--slots"))
			nslots = atoi(argv[i + 1]);
	}
	if (!db || up_port <= 0 || nslots < 1 || nslots > MAX_SLOTS) {
		fprintf(stderr, "usage: evloop_model --upstream PORT --db "
				"CONNINFO [--slots N]\n");
		return 2;
	}
	ep = epoll_create1(0);
	if (ep < 0)
		die("epoll_create1");
	for (int i = 0; i < nslots; i++) {
		slot *s = &slots[i];
		s->pg = PQconnectdb(db);
		if (PQstatus(s->pg) != CONNECTION_OK)
			die(PQerrorMessage(s->pg));
		prepare(s->pg, "claim",
			"INSERT INTO idempotency_records (tenant, operation, "
			"idem_key, request_hash, state, owner_token, attempt, "
			"lease_until, hold_on_unknown, created_at, updated_at, "
			"expires_at, replay_until) VALUES ('default', "
			"'create_payment', $1, "
			"'\\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c"
			"15b0f00a08'::bytea, 'processing', $2::uuid, 1, now() + "
			"30000 * interval '1 millisecond', false, now(), now(), "
			"now() + 86400000 * interval '1 millisecond', NULL) "
			"ON CONFLICT DO NOTHING",
			2);
		prepare(s->pg, "record",
			      "UPDATE idempotency_records SET state = "
			      "'completed', response_status = $1, "
			      "response_headers = E'Content-Type: "
			      "application/json\\r\\n', response_body = "
			      "convert_to($2, 'UTF8'), replayable = true, seal_key "
			      "= NULL, updated_at = now() WHERE tenant = 'default' "
			      "AND operation = 'create_payment' AND idem_key = $3 "
			      "AND owner_token = $4::uuid AND state IN "
			      "('processing', 'released') AND "
			      "coalesce(replay_until, expires_at) > now() "
			      "RETURNING wait_notify",
			      4);
		if (PQsetnonblocking(s->pg, 1))
			die("PQsetnonblocking");
		s->pg_fd = PQsocket(s->pg);
		s->up_fd = connect_upstream();
		watch(s->pg_fd, K_PG, s, EPOLLIN);
		watch(s->up_fd, K_UP, s, EPOLLIN);
		s->next_free = free_slots;
		free_slots = s;
	}
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof a;
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) ||
	    listen(lfd, 1024) || getsockname(lfd, (struct sockaddr *)&a, &al))
		die("listen");
	nonblock(lfd);
	watch(lfd, K_LISTEN, NULL, EPOLLIN);
	printf("%d\n", ntohs(a.sin_port));
	fflush(stdout);
	struct epoll_event evs[256];
	for (;;) {
		int n = epoll_wait(ep, evs, 256, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			switch (kind_of[fd]) {
			case K_LISTEN:
				for (;;) {
					int c = accept(lfd, NULL, NULL);
					if (c < 0)
						break;
					nonblock(c);
					client *cl = calloc(1, sizeof *cl);
					if (!cl)
						die("calloc");
					cl->fd = c;
					watch(c, K_CLIENT, cl, EPOLLIN);
				}
				break;
			case K_CLIENT:
				on_client(owner_of[fd], evs[i].events);
				break;
			case K_PG:
				on_pg(owner_of[fd]);
				break;
			case K_UP:
				on_up(owner_of[fd]);
				break;
			}
		}
	}
}
