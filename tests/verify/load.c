/* The load generator of the verification campaign (tests/verify/).
 *
 *   verify_load --target URL [--target URL ...] --log FILE --seed N
 *               --rate R [--requests N] [--seconds S] [--concurrency C]
 *               [--timeout-ms 3000] [--flow-ms 30000] [--short-ttl-s 20]
 *               [--retry-cap-ms 2000] [--tenants 4] [--drain-ms 5000]
 *               [--prefer-wait 2] [--mix plain=40,dup=15,...]
 *
 * Clients as a payments API sees them: a flow is one logical operation (a
 * route, a tenant, a key, a JSON body) that is retried with the same key and
 * body after a timeout, a transport error (on the next target), a 5xx or a
 * 409 (after Retry-After, capped at --retry-cap-ms, else a jittered backoff)
 * until a final answer or --flow-ms. Flow kinds and their follow-ups are
 * described in verify_spec's "The load generator"; where it is silent:
 *
 * - akind: the first copies of a dup flow are `dup`, their retries `req`;
 *   every attempt of a follow-up (mismatch, tenant, late) carries the
 *   follow-up's kind, and every attempt of a wait or recheck flow its own.
 * - wait flows send two copies with `Prefer: wait=N` (--prefer-wait), the
 *   second 10-60 ms after the first on the next target, so it can wait.
 * - recheck flows have their own flow number and F line (fkind recheck);
 *   their key, tenant, route and body are those of an earlier flow that got
 *   a replayable final answer (2xx or 402) on a long-ttl route, sampled from
 *   a bounded reservoir. With nothing to sample yet, the flow is plain.
 * - --flow-ms counts from the start of each phase (the main one, then the
 *   follow-up): a late follow-up starts short-ttl + 2 s after the answer.
 * - F's final and cause are those of the main phase; t_final is when it
 *   ended (answer, deadline or stop). final is 1 when every copy ended with
 *   a final answer; cause is then the status of the last one.
 * - A requests cut at the stop get error `stopped`; a request that failed
 *   part way has status 0 and no resp_hash (the client got no answer).
 * - route is the route's name (pay, refund, transfer); X-Attempt-Id is
 *   a<seed>-<flow>-<seq>.
 * - No flow starts after --seconds or once --requests requests were sent;
 *   what is still going then is finished, or cut --drain-ms later (at once
 *   on SIGTERM or SIGINT). The log is flushed every second and at exit.
 *
 * curl 7.88 silently resends a request on a reused connection that died
 * with no byte of answer, and this cannot be turned off: a request cut by a
 * proxy's death can reach a proxy restarted at once a second time, with the
 * same X-Attempt-Id. CURLOPT_MAXAGE_CONN keeps the proxy's idle timeout
 * from doing the same.
 *
 * Draws are seeded per flow (flow number and seed), so the same seed gives
 * the same flows whatever the timing; only which earlier key a recheck
 * re-sends depends on the order in which flows finished.
 *
 * The cost per request is kept low: one easy handle per slot of
 * --concurrency, reused with the multi handle's connection cache; header
 * lists live in the slot; the answer's resp_hash is computed as it arrives.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_TARGETS 8
#define MAX_LANES 3
#define KEY_MAX 64
#define BODY_MAX 160
#define HEAD_KEEP 1024
#define RESERVOIR_CAP 4096
#define FLOW_CHUNK 256
#define N_HDR 6
#define HDR_MAX 128

enum fkind {
	K_PLAIN,
	K_DUP,
	K_MISMATCH,
	K_TENANT,
	K_LATE,
	K_RECHECK,
	K_WAIT,
	K_N
};
enum akind {
	A_REQ,
	A_DUP,
	A_MISMATCH,
	A_TENANT,
	A_LATE,
	A_RECHECK,
	A_WAIT,
	A_N
};
enum route { R_PAY, R_REFUND, R_TRANSFER, R_N };
enum phase { PH_MAIN, PH_FOLLOW };

static const char *const fkind_names[K_N] = {
	"plain", "dup", "mismatch", "tenant", "late", "recheck", "wait"};
static const char *const akind_names[A_N] = {
	"req", "dup", "mismatch", "tenant", "late", "recheck", "wait"};
static const char *const route_names[R_N] = {"pay", "refund", "transfer"};
static const char *const route_paths[R_N] = {"/v1/payments", "/v1/refunds",
					     "/v1/transfers"};

struct flow;

/* One chain of attempts: a flow has one, or one per concurrent copy. */
struct lane {
	struct flow *flow;
	int target;
	int akind;
	int retries;
	int64_t due;
	int heap_pos; /* -1: not in the timer heap */
	struct lane *next_ready;
	bool final;
};

struct flow {
	uint64_t id;
	uint64_t rng;
	int kind;
	int route;
	int tenant;     /* of the main phase */
	int tenant_alt; /* of a tenant flow's follow-up */
	int tenant_now;
	int phase;
	char key[KEY_MAX];
	char body[BODY_MAX];
	char body_alt[BODY_MAX];
	size_t body_len, body_alt_len;
	bool use_alt;
	char sha[17], sha_alt[17];
	struct lane lanes[MAX_LANES];
	int nlanes, active_lanes;
	int64_t t_first, t_final, deadline;
	bool final, stopped;
	long cause;
	uint32_t attempts;
	struct flow *prev, *next; /* the active list, or the free list */
};

/* One request in flight: an easy handle reused for every request it sends. */
struct slot {
	CURL *easy;
	struct lane *lane;
	struct slot *next_free;
	struct curl_slist hl[N_HDR];
	char hb[N_HDR][HDR_MAX];
	int64_t t0;
	uint32_t seq;
	char attempt_id[64];
	long status;
	char ctype[96];
	char exec[96];
	bool replayed;
	long ra_ms; /* -1: no Retry-After */
	bool hashing;
	uint64_t hash;
	char head[HEAD_KEEP];
	size_t head_len;
};

struct reservoir_entry {
	uint64_t flow;
	int route, tenant;
	char key[KEY_MAX];
	char body[BODY_MAX];
	size_t body_len;
};

struct options {
	const char *targets[MAX_TARGETS];
	int ntargets;
	const char *log_path;
	uint64_t seed;
	double rate;
	uint64_t requests;
	double seconds;
	int concurrency;
	long timeout_ms, flow_ms, retry_cap_ms, drain_ms;
	int short_ttl_s, tenants, prefer_wait;
	unsigned weights[K_N];
};

static struct {
	struct options o;
	CURLM *multi;
	FILE *log;
	char *urls[MAX_TARGETS][R_N];
	struct slot *slots;
	struct slot *free_slots;
	int nfree;
	struct lane **heap;
	size_t heap_len, heap_cap;
	struct lane *ready_head, *ready_tail;
	struct flow *active, *free_flows;
	uint64_t nactive;
	uint64_t next_flow;
	int64_t t_begin, next_start, stop_at, cut_at, next_flush;
	bool stopping;
	uint64_t sent, answered, flows_started;
	uint64_t by_kind[K_N], by_akind[A_N], final_flows, deadline_flows,
		stopped_flows, errors;
	struct reservoir_entry *res;
	uint64_t res_seen;
	size_t res_len;
	uint64_t res_rng;
} g;

static volatile sig_atomic_t g_signal;

/* ---- small helpers ---------------------------------------------------- */

static int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t draw(uint64_t *s, uint64_t n)
{
	return n ? splitmix(s) % n : 0;
}

#define FNV_OFFSET 14695981039346656037ULL
#define FNV_PRIME 1099511628211ULL

static uint64_t fnv_feed(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= FNV_PRIME;
	}
	return h;
}

static void fnv_hex(const void *p, size_t n, char out[17])
{
	snprintf(out, 17, "%016" PRIx64, fnv_feed(FNV_OFFSET, p, n));
}

static void on_signal(int sig)
{
	(void)sig;
	g_signal = 1;
}

/* ---- options ---------------------------------------------------------- */

static const unsigned default_weights[K_N] = {40, 15, 8, 8, 5, 12, 12};

static int parse_mix(const char *s, unsigned *w, char *err, size_t errlen)
{
	memset(w, 0, sizeof(unsigned) * K_N);
	char buf[256];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *save, *t = strtok_r(buf, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(t, '=');
		int k = K_N;
		if (eq) {
			*eq = '\0';
			for (k = 0; k < K_N && strcmp(fkind_names[k], t); k++)
				;
		}
		if (k == K_N) {
			snprintf(err, errlen, "--mix: bad item '%s'", t);
			return -1;
		}
		w[k] = (unsigned)strtoul(eq + 1, NULL, 10);
	}
	return 0;
}

static int set_number(const char *name, const char *v, struct options *o,
		      char *err, size_t errlen)
{
	char *end;
	double d = strtod(v, &end);
	if (*end || d < 0) {
		snprintf(err, errlen, "%s: not a number: '%s'", name, v);
		return -1;
	}
	static const struct {
		const char *name;
		size_t off;
		char type; /* d double, l long, i int, u uint64 */
	} nums[] = {
		{"--seed", offsetof(struct options, seed), 'u'},
		{"--rate", offsetof(struct options, rate), 'd'},
		{"--requests", offsetof(struct options, requests), 'u'},
		{"--seconds", offsetof(struct options, seconds), 'd'},
		{"--concurrency", offsetof(struct options, concurrency), 'i'},
		{"--timeout-ms", offsetof(struct options, timeout_ms), 'l'},
		{"--flow-ms", offsetof(struct options, flow_ms), 'l'},
		{"--retry-cap-ms", offsetof(struct options, retry_cap_ms), 'l'},
		{"--drain-ms", offsetof(struct options, drain_ms), 'l'},
		{"--short-ttl-s", offsetof(struct options, short_ttl_s), 'i'},
		{"--tenants", offsetof(struct options, tenants), 'i'},
		{"--prefer-wait", offsetof(struct options, prefer_wait), 'i'},
	};
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
		if (strcmp(nums[i].name, name))
			continue;
		char *p = (char *)o + nums[i].off;
		if (nums[i].type == 'd')
			*(double *)p = d;
		else if (nums[i].type == 'l')
			*(long *)p = (long)d;
		else if (nums[i].type == 'i')
			*(int *)p = (int)d;
		else
			*(uint64_t *)p = strtoull(v, NULL, 10);
		return 0;
	}
	snprintf(err, errlen, "unknown option %s", name);
	return -1;
}

static void set_defaults(struct options *o)
{
	memset(o, 0, sizeof *o);
	o->concurrency = 256;
	o->timeout_ms = 3000;
	o->flow_ms = 30000;
	o->retry_cap_ms = 2000;
	o->drain_ms = 5000;
	o->short_ttl_s = 20;
	o->tenants = 4;
	o->prefer_wait = 2;
	memcpy(o->weights, default_weights, sizeof o->weights);
}

static int check_options(struct options *o, char *err, size_t errlen)
{
	if (!o->ntargets || !o->log_path || o->rate <= 0) {
		snprintf(err, errlen, "--target, --log and --rate are needed");
		return -1;
	}
	if (!o->requests && o->seconds <= 0) {
		snprintf(err, errlen, "--requests or --seconds is needed");
		return -1;
	}
	if (o->concurrency < 1 || o->tenants < 1 || o->timeout_ms < 1 ||
	    o->prefer_wait < 1) {
		snprintf(err, errlen,
			 "bad --concurrency, --tenants, "
			 "--timeout-ms or --prefer-wait");
		return -1;
	}
	if (o->tenants < 2)
		o->weights[K_TENANT] = 0; /* no other tenant to move to */
	unsigned sum = 0;
	for (int k = 0; k < K_N; k++)
		sum += o->weights[k];
	if (!sum) {
		snprintf(err, errlen, "--mix: every weight is 0");
		return -1;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct options *o, char *err,
		      size_t errlen)
{
	set_defaults(o);
	for (int i = 1; i < argc; i++) {
		const char *name = argv[i];
		if (i + 1 >= argc) {
			snprintf(err, errlen, "%s: needs a value", name);
			return -1;
		}
		const char *v = argv[++i];
		int rc = 0;
		if (!strcmp(name, "--target")) {
			if (o->ntargets == MAX_TARGETS) {
				snprintf(err, errlen, "too many targets");
				return -1;
			}
			o->targets[o->ntargets++] = v;
		} else if (!strcmp(name, "--log")) {
			o->log_path = v;
		} else if (!strcmp(name, "--mix")) {
			rc = parse_mix(v, o->weights, err, errlen);
		} else {
			rc = set_number(name, v, o, err, errlen);
		}
		if (rc)
			return -1;
	}
	return check_options(o, err, errlen);
}

/* ---- the timer heap and the ready queue ------------------------------- */

static void heap_swap(size_t a, size_t b)
{
	struct lane *t = g.heap[a];
	g.heap[a] = g.heap[b];
	g.heap[b] = t;
	g.heap[a]->heap_pos = (int)a;
	g.heap[b]->heap_pos = (int)b;
}

static void heap_up(size_t i)
{
	while (i && g.heap[(i - 1) / 2]->due > g.heap[i]->due) {
		heap_swap(i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static void heap_down(size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < g.heap_len && g.heap[l]->due < g.heap[m]->due)
			m = l;
		if (r < g.heap_len && g.heap[r]->due < g.heap[m]->due)
			m = r;
		if (m == i)
			return;
		heap_swap(i, m);
		i = m;
	}
}

static int heap_push(struct lane *l, int64_t due)
{
	if (g.heap_len == g.heap_cap) {
		size_t cap = g.heap_cap ? 2 * g.heap_cap : 1024;
		struct lane **h = realloc(g.heap, cap * sizeof *h);
		if (!h)
			return -1;
		g.heap = h;
		g.heap_cap = cap;
	}
	l->due = due;
	l->heap_pos = (int)g.heap_len;
	g.heap[g.heap_len++] = l;
	heap_up(g.heap_len - 1);
	return 0;
}

static struct lane *heap_pop(void)
{
	struct lane *top = g.heap[0];
	heap_swap(0, --g.heap_len);
	heap_down(0);
	top->heap_pos = -1;
	return top;
}

static void ready_push(struct lane *l)
{
	l->next_ready = NULL;
	if (g.ready_tail)
		g.ready_tail->next_ready = l;
	else
		g.ready_head = l;
	g.ready_tail = l;
}

static struct lane *ready_pop(void)
{
	struct lane *l = g.ready_head;
	g.ready_head = l->next_ready;
	if (!g.ready_head)
		g.ready_tail = NULL;
	return l;
}

/* ---- the log ---------------------------------------------------------- */

static void log_headers(void)
{
	fputs("A\tflow\tseq\takind\tproxy\tt0\tt1\ttenant\troute\tkey\t"
	      "body_sha\tattempt_id\tstatus\tcode\treplayed\texec\t"
	      "resp_hash\tretry_after_ms\terror\n",
	      g.log);
	fputs("F\tflow\tfkind\ttenant\troute\tkey\tbody_sha\tt_first\t"
	      "t_final\tfinal\tcause\tattempts\n",
	      g.log);
}

/* The problem+json `code` member, as far as a flat scan of the kept head
 * of the body finds it (the proxy's problems are small and flat). */
static void problem_code(const struct slot *s, char *out, size_t outlen)
{
	out[0] = '\0';
	if (strncasecmp(s->ctype, "application/problem+json", 24))
		return;
	const char *p = memmem(s->head, s->head_len, "\"code\"", 6);
	if (!p)
		return;
	const char *end = s->head + s->head_len;
	p += 6;
	while (p < end && (*p == ' ' || *p == ':' || *p == '\t'))
		p++;
	if (p >= end || *p != '"')
		return;
	size_t n = 0;
	for (p++; p < end && *p != '"' && *p != '\\' &&
		  (unsigned char)*p > ' ' && n + 1 < outlen;
	     p++)
		out[n++] = *p;
	out[n] = '\0';
}

static void log_attempt(const struct slot *s, int64_t t1, const char *error)
{
	const struct lane *l = s->lane;
	const struct flow *f = l->flow;
	char code[64] = "", hash[17] = "", ra[24] = "";
	if (!error[0]) {
		problem_code(s, code, sizeof code);
		snprintf(hash, sizeof hash, "%016" PRIx64, s->hash);
	}
	if (s->ra_ms >= 0)
		snprintf(ra, sizeof ra, "%ld", s->ra_ms);
	fprintf(g.log,
		"A\t%" PRIu64 "\t%u\t%s\t%d\t%" PRId64 "\t%" PRId64
		"\tt%d\t%s\t%s\t%s\t%s\t%ld\t%s\t%d\t%s\t%s\t%s\t%s\n",
		f->id, s->seq, akind_names[l->akind], l->target, s->t0, t1,
		f->tenant_now, route_names[f->route], f->key,
		f->use_alt ? f->sha_alt : f->sha, s->attempt_id,
		error[0] ? 0 : s->status, code, !error[0] && s->replayed,
		error[0] ? "" : s->exec, hash, ra, error);
}

static void log_flow(const struct flow *f)
{
	char cause[24];
	if (f->final)
		snprintf(cause, sizeof cause, "%ld", f->cause);
	else
		snprintf(cause, sizeof cause, "%s",
			 f->stopped ? "stopped" : "deadline");
	fprintf(g.log,
		"F\t%" PRIu64 "\t%s\tt%d\t%s\t%s\t%s\t%" PRId64 "\t%" PRId64
		"\t%d\t%s\t%u\n",
		f->id, fkind_names[f->kind], f->tenant, route_names[f->route],
		f->key, f->sha, f->t_first, f->t_final, f->final, cause,
		f->attempts);
}

/* ---- answers: headers, body, hash ------------------------------------- */

static void copy_value(char *dst, size_t cap, const char *v, size_t n)
{
	while (n && (*v == ' ' || *v == '\t')) {
		v++;
		n--;
	}
	while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' ||
		     v[n - 1] == '\t'))
		n--;
	if (n >= cap)
		n = cap - 1;
	for (size_t i = 0; i < n; i++)
		dst[i] = v[i] == '\t' ? ' ' : v[i];
	dst[n] = '\0';
}

static void answer_reset(struct slot *s)
{
	s->status = 0;
	s->ctype[0] = s->exec[0] = '\0';
	s->replayed = false;
	s->ra_ms = -1;
	s->hashing = false;
	s->head_len = 0;
}

/* resp_hash's prefix is known once the head is complete, so the body is
 * hashed as it arrives and nothing is kept but its first bytes. */
static void hash_begin(struct slot *s)
{
	char st[16];
	int n = snprintf(st, sizeof st, "%ld\n", s->status);
	uint64_t h = fnv_feed(FNV_OFFSET, st, (size_t)n);
	h = fnv_feed(h, s->ctype, strlen(s->ctype));
	h = fnv_feed(h, "\n", 1);
	h = fnv_feed(h, s->exec, strlen(s->exec));
	s->hash = fnv_feed(h, "\n", 1);
	s->hashing = true;
}

static bool header_is(const char *buf, size_t len, const char *name,
		      size_t nlen, const char **value, size_t *vlen)
{
	if (len <= nlen || buf[nlen] != ':' || strncasecmp(buf, name, nlen))
		return false;
	*value = buf + nlen + 1;
	*vlen = len - nlen - 1;
	return true;
}

static void retry_after(struct slot *s, const char *v, size_t n)
{
	char tmp[32];
	copy_value(tmp, sizeof tmp, v, n);
	char *end;
	double sec = strtod(tmp, &end);
	if (end != tmp && !*end && sec >= 0)
		s->ra_ms = (long)(sec * 1000.0);
}

static size_t on_header(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct slot *s = ud;
	size_t len = size * nmemb;
	const char *v;
	size_t vn;
	if (len > 9 && !memcmp(buf, "HTTP/", 5)) {
		answer_reset(s);
		const char *sp = memchr(buf, ' ', len);
		s->status = sp ? strtol(sp + 1, NULL, 10) : 0;
	} else if (len <= 2 && (buf[0] == '\r' || buf[0] == '\n')) {
		if (s->status >= 200)
			hash_begin(s);
	} else if (header_is(buf, len, "Content-Type", 12, &v, &vn)) {
		copy_value(s->ctype, sizeof s->ctype, v, vn);
	} else if (header_is(buf, len, "X-Ledger-Exec", 13, &v, &vn)) {
		copy_value(s->exec, sizeof s->exec, v, vn);
	} else if (header_is(buf, len, "Idempotent-Replayed", 19, &v, &vn)) {
		char tmp[16];
		copy_value(tmp, sizeof tmp, v, vn);
		s->replayed = !strcasecmp(tmp, "true");
	} else if (header_is(buf, len, "Retry-After", 11, &v, &vn)) {
		retry_after(s, v, vn);
	}
	return len;
}

static size_t on_body(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct slot *s = ud;
	size_t len = size * nmemb;
	if (!s->hashing)
		hash_begin(s);
	s->hash = fnv_feed(s->hash, buf, len);
	size_t keep = HEAD_KEEP - s->head_len;
	if (keep > len)
		keep = len;
	memcpy(s->head + s->head_len, buf, keep);
	s->head_len += keep;
	return len;
}

/* ---- slots ------------------------------------------------------------ */

static int slots_init(char *err, size_t errlen)
{
	g.slots = calloc((size_t)g.o.concurrency, sizeof *g.slots);
	if (!g.slots) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (int i = g.o.concurrency - 1; i >= 0; i--) {
		struct slot *s = &g.slots[i];
		s->easy = curl_easy_init();
		if (!s->easy) {
			snprintf(err, errlen, "curl_easy_init failed");
			return -1;
		}
		CURL *e = s->easy;
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
				 (long)CURL_HTTP_VERSION_1_1);
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, g.o.timeout_ms);
		curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
				 g.o.timeout_ms < 1000 ? g.o.timeout_ms
						       : 1000L);
		/* Below the proxy's 30 s idle timeout: curl resends a POST
		 * on a reused connection the server had closed. */
		curl_easy_setopt(e, CURLOPT_MAXAGE_CONN, 20L);
		curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
		curl_easy_setopt(e, CURLOPT_PRIVATE, s);
		s->next_free = g.free_slots;
		g.free_slots = s;
		g.nfree++;
	}
	return 0;
}

/* The header list lives in the slot (curl only reads it), so a request
 * costs no allocation for its headers. */
static struct curl_slist *slot_headers(struct slot *s, const struct flow *f)
{
	int n = 0;
	snprintf(s->hb[n++], HDR_MAX, "Content-Type: application/json");
	snprintf(s->hb[n++], HDR_MAX, "Expect:");
	snprintf(s->hb[n++], HDR_MAX, "Idempotency-Key: %s", f->key);
	snprintf(s->hb[n++], HDR_MAX, "X-Tenant-Id: t%d", f->tenant_now);
	snprintf(s->hb[n++], HDR_MAX, "X-Attempt-Id: %s", s->attempt_id);
	if (f->kind == K_WAIT)
		snprintf(s->hb[n++], HDR_MAX, "Prefer: wait=%d",
			 g.o.prefer_wait);
	for (int i = 0; i < n; i++) {
		s->hl[i].data = s->hb[i];
		s->hl[i].next = i + 1 < n ? &s->hl[i + 1] : NULL;
	}
	return &s->hl[0];
}

static void dispatch(struct lane *l, int64_t now)
{
	struct slot *s = g.free_slots;
	struct flow *f = l->flow;
	g.free_slots = s->next_free;
	g.nfree--;
	s->lane = l;
	s->t0 = now;
	s->seq = f->attempts++;
	if (!s->seq)
		f->t_first = now;
	snprintf(s->attempt_id, sizeof s->attempt_id,
		 "a%" PRIu64 "-%" PRIu64 "-%u", g.o.seed, f->id, s->seq);
	answer_reset(s);
	const char *body = f->use_alt ? f->body_alt : f->body;
	size_t blen = f->use_alt ? f->body_alt_len : f->body_len;
	curl_easy_setopt(s->easy, CURLOPT_URL, g.urls[l->target][f->route]);
	curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE, (long)blen);
	curl_easy_setopt(s->easy, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(s->easy, CURLOPT_HTTPHEADER, slot_headers(s, f));
	curl_multi_add_handle(g.multi, s->easy);
	g.sent++;
	g.by_akind[l->akind]++;
}

static void slot_release(struct slot *s)
{
	curl_multi_remove_handle(g.multi, s->easy);
	s->lane = NULL;
	s->next_free = g.free_slots;
	g.free_slots = s;
	g.nfree++;
}

/* ---- flows ------------------------------------------------------------ */

static struct flow *flow_alloc(void)
{
	if (!g.free_flows) {
		struct flow *chunk = calloc(FLOW_CHUNK, sizeof *chunk);
		if (!chunk)
			return NULL;
		for (int i = 0; i < FLOW_CHUNK; i++) {
			chunk[i].next = g.free_flows;
			g.free_flows = &chunk[i];
		}
	}
	struct flow *f = g.free_flows;
	g.free_flows = f->next;
	memset(f, 0, sizeof *f);
	f->next = g.active;
	if (g.active)
		g.active->prev = f;
	g.active = f;
	g.nactive++;
	return f;
}

static void flow_free(struct flow *f)
{
	if (f->prev)
		f->prev->next = f->next;
	else
		g.active = f->next;
	if (f->next)
		f->next->prev = f->prev;
	f->prev = NULL;
	f->next = g.free_flows;
	g.free_flows = f;
	g.nactive--;
}

static int draw_kind(uint64_t *rng)
{
	unsigned sum = 0;
	for (int k = 0; k < K_N; k++)
		sum += g.o.weights[k];
	unsigned r = (unsigned)draw(rng, sum);
	for (int k = 0; k < K_N; k++) {
		if (r < g.o.weights[k])
			return k;
		r -= g.o.weights[k];
	}
	return K_PLAIN;
}

static void set_body(struct flow *f, const char *body, size_t len)
{
	memcpy(f->body, body, len);
	f->body_len = len;
	fnv_hex(f->body, len, f->sha);
}

/* Every draw of a new flow comes from its own stream, seeded by the seed
 * and the flow number, so a seed reproduces the flows whatever the timing. */
static void flow_draw(struct flow *f)
{
	f->rng = g.o.seed * 0x9e3779b97f4a7c15ULL ^
		 (f->id + 1) * 0xd1b54a32d192ed03ULL;
	f->kind = draw_kind(&f->rng);
	uint64_t r = draw(&f->rng, 4);
	f->route = r < 2 ? R_PAY : r == 2 ? R_REFUND : R_TRANSFER;
	if (f->kind == K_LATE)
		f->route = R_REFUND;
	if (f->kind == K_WAIT)
		f->route = R_TRANSFER;
	f->tenant = 1 + (int)draw(&f->rng, (uint64_t)g.o.tenants);
	f->tenant_alt = 1 + (f->tenant +
			     (int)draw(&f->rng, (uint64_t)g.o.tenants - 1)) %
				    g.o.tenants;
	snprintf(f->key, sizeof f->key, "%" PRIu64 "-%" PRIu64 "-%08" PRIx64,
		 g.o.seed, f->id, draw(&f->rng, 1ULL << 32));
	unsigned amount = 100 + (unsigned)draw(&f->rng, 99900);
	uint64_t memo = splitmix(&f->rng);
	char b[BODY_MAX];
	int n = snprintf(b, sizeof b,
			 "{\"amount\":%u,\"currency\":\"EUR\",\"flow\":%" PRIu64
			 ",\"memo\":\"%016" PRIx64 "\"}",
			 amount, f->id, memo);
	set_body(f, b, (size_t)n);
	f->body_alt_len = (size_t)snprintf(
		f->body_alt, sizeof f->body_alt,
		"{\"amount\":%u,\"currency\":\"EUR\",\"flow\":%" PRIu64
		",\"memo\":\"%016" PRIx64 "\"}",
		amount + 1, f->id, memo);
	fnv_hex(f->body_alt, f->body_alt_len, f->sha_alt);
}

/* A recheck re-sends an earlier flow's key as it was sent: same tenant,
 * route and body. */
static bool recheck_pick(struct flow *f)
{
	if (!g.res_len)
		return false;
	const struct reservoir_entry *e = &g.res[draw(&g.res_rng, g.res_len)];
	f->route = e->route;
	f->tenant = e->tenant;
	snprintf(f->key, sizeof f->key, "%s", e->key);
	set_body(f, e->body, e->body_len);
	return true;
}

static void reservoir_add(const struct flow *f)
{
	if (!f->final || f->route == R_REFUND ||
	    !((f->cause >= 200 && f->cause < 300) || f->cause == 402))
		return;
	uint64_t i = g.res_seen++;
	if (i >= RESERVOIR_CAP) {
		i = draw(&g.res_rng, g.res_seen);
		if (i >= RESERVOIR_CAP)
			return;
	} else {
		g.res_len++;
	}
	struct reservoir_entry *e = &g.res[i];
	e->flow = f->id;
	e->route = f->route;
	e->tenant = f->tenant;
	memcpy(e->key, f->key, sizeof e->key);
	memcpy(e->body, f->body, f->body_len);
	e->body_len = f->body_len;
}

static void lane_init(struct flow *f, int i, int target, int akind)
{
	struct lane *l = &f->lanes[i];
	memset(l, 0, sizeof *l);
	l->flow = f;
	l->target = target % g.o.ntargets;
	l->akind = akind;
	l->heap_pos = -1;
}

static int main_akind(int kind)
{
	static const int map[K_N] = {A_REQ, A_DUP,     A_REQ, A_REQ,
				     A_REQ, A_RECHECK, A_WAIT};
	return map[kind];
}

static int flow_start(int64_t now)
{
	struct flow *f = flow_alloc();
	if (!f)
		return -1;
	f->id = g.next_flow++;
	flow_draw(f);
	if (f->kind == K_RECHECK && !recheck_pick(f))
		f->kind = K_PLAIN;
	f->tenant_now = f->tenant;
	f->deadline = now + g.o.flow_ms * 1000;
	int base = (int)draw(&f->rng, (uint64_t)g.o.ntargets);
	f->nlanes = f->kind == K_DUP    ? 2 + (int)draw(&f->rng, 2)
		    : f->kind == K_WAIT ? 2
					: 1;
	f->active_lanes = f->nlanes;
	for (int i = 0; i < f->nlanes; i++)
		lane_init(f, i, base + i, main_akind(f->kind));
	ready_push(&f->lanes[0]);
	for (int i = 1; i < f->nlanes; i++) {
		if (f->kind == K_DUP)
			ready_push(&f->lanes[i]);
		else if (heap_push(&f->lanes[i],
				   now + 10000 + (int64_t)draw(&f->rng, 50000)))
			return -1;
	}
	g.flows_started++;
	g.by_kind[f->kind]++;
	return 0;
}

static void flow_end(struct flow *f)
{
	log_flow(f);
	if (f->final)
		g.final_flows++;
	else if (f->stopped)
		g.stopped_flows++;
	else
		g.deadline_flows++;
	flow_free(f);
}

/* The follow-up of a mismatch, tenant or late flow: one more chain of
 * attempts with the same key. */
static int follow_up(struct flow *f, int64_t now)
{
	int akind = f->kind == K_MISMATCH ? A_MISMATCH
		    : f->kind == K_TENANT ? A_TENANT
					  : A_LATE;
	f->phase = PH_FOLLOW;
	f->nlanes = f->active_lanes = 1;
	lane_init(f, 0, (int)draw(&f->rng, (uint64_t)g.o.ntargets), akind);
	if (f->kind == K_MISMATCH)
		f->use_alt = true;
	if (f->kind == K_TENANT)
		f->tenant_now = f->tenant_alt;
	int64_t start = now;
	if (f->kind == K_LATE)
		start += ((int64_t)g.o.short_ttl_s + 2) * 1000000;
	f->deadline = start + g.o.flow_ms * 1000;
	if (start == now) {
		ready_push(&f->lanes[0]);
		return 0;
	}
	return heap_push(&f->lanes[0], start);
}

static int phase_end(struct flow *f, int64_t now)
{
	if (f->phase == PH_FOLLOW) {
		flow_end(f);
		return 0;
	}
	f->t_final = now;
	f->final = true;
	for (int i = 0; i < f->nlanes; i++)
		f->final = f->final && f->lanes[i].final;
	reservoir_add(f);
	if (f->final &&
	    (f->kind == K_MISMATCH || f->kind == K_TENANT || f->kind == K_LATE))
		return follow_up(f, now);
	flow_end(f);
	return 0;
}

/* A 409 for a key reused with another body is final: retrying it cannot
 * change the answer (the other 409s say the key is busy, and are retried). */
static bool retryable(long status, bool mismatch)
{
	return status == 0 || (status == 409 && !mismatch) || status >= 500;
}

static int64_t retry_delay_us(struct lane *l, long ra_ms)
{
	long cap = g.o.retry_cap_ms;
	if (ra_ms >= 0)
		return (int64_t)(ra_ms < cap ? ra_ms : cap) * 1000;
	int shift = l->retries < 6 ? l->retries : 6;
	int64_t d = (int64_t)50000 << shift;
	if (d > (int64_t)cap * 1000)
		d = (int64_t)cap * 1000;
	return d / 2 + (int64_t)draw(&l->flow->rng, (uint64_t)d / 2 + 1);
}

static int lane_done(struct lane *l, long status, bool final, int64_t now)
{
	struct flow *f = l->flow;
	l->final = final;
	if (final)
		f->cause = status;
	if (--f->active_lanes)
		return 0;
	return phase_end(f, now);
}

static int lane_outcome(struct lane *l, long status, bool mismatch,
			long ra_ms, int64_t now)
{
	if (!retryable(status, mismatch))
		return lane_done(l, status, true, now);
	if (status == 0)
		l->target = (l->target + 1) % g.o.ntargets;
	if (l->akind == A_DUP)
		l->akind = A_REQ;
	int64_t due = now + retry_delay_us(l, ra_ms);
	l->retries++;
	if (due > l->flow->deadline)
		return lane_done(l, status, false, now);
	return heap_push(l, due);
}

/* ---- the loop --------------------------------------------------------- */

static const char *error_name(CURLcode rc, char *buf, size_t len)
{
	switch (rc) {
	case CURLE_OK:
		return "";
	case CURLE_OPERATION_TIMEDOUT:
		return "timeout";
	case CURLE_COULDNT_CONNECT:
		return "connect";
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
		return "reset";
	case CURLE_PARTIAL_FILE:
		return "partial";
	case CURLE_COULDNT_RESOLVE_HOST:
		return "resolve";
	case CURLE_WEIRD_SERVER_REPLY:
		return "weird_reply";
	default:
		snprintf(buf, len, "curl%d", (int)rc);
		return buf;
	}
}

static int harvest(int64_t now)
{
	CURLMsg *m;
	int left;
	while ((m = curl_multi_info_read(g.multi, &left))) {
		if (m->msg != CURLMSG_DONE)
			continue;
		struct slot *s;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE,
				  (char **)&s);
		char buf[24];
		const char *err = error_name(m->data.result, buf, sizeof buf);
		if (!err[0] && !s->hashing)
			hash_begin(s);
		log_attempt(s, now, err);
		if (err[0])
			g.errors++;
		else
			g.answered++;
		struct lane *l = s->lane;
		long status = err[0] ? 0 : s->status;
		long ra_ms = err[0] ? -1 : s->ra_ms;
		char code[64] = "";
		if (!err[0])
			problem_code(s, code, sizeof code);
		bool mismatch = !strcmp(code, "idempotency_key_mismatch");
		slot_release(s);
		if (lane_outcome(l, status, mismatch, ra_ms, now))
			return -1;
	}
	return 0;
}

static int run_timers(int64_t now)
{
	while (g.heap_len && g.heap[0]->due <= now)
		ready_push(heap_pop());
	return 0;
}

static void dispatch_ready(int64_t now)
{
	while (g.ready_head && g.nfree)
		dispatch(ready_pop(), now);
}

static void update_stop(int64_t now)
{
	if (g.stopping)
		return;
	bool by_time = g.o.seconds > 0 && now >= g.stop_at;
	bool by_count = g.o.requests && g.sent >= g.o.requests;
	if (!by_time && !by_count)
		return;
	g.stopping = true;
	g.cut_at = now + g.o.drain_ms * 1000;
}

/* Flows start on a schedule of --rate per second; a start waits while
 * every slot is busy or retries wait for one, and a schedule that fell
 * behind catches up by at most a tenth of a second's worth. */
static int start_flows(int64_t now)
{
	int64_t step = (int64_t)(1e6 / g.o.rate);
	if (step < 1)
		step = 1;
	if (g.next_start < now - 100000)
		g.next_start = now - 100000;
	while (!g.stopping && g.next_start <= now && g.nfree && !g.ready_head) {
		if (flow_start(now))
			return -1;
		g.next_start += step;
		dispatch_ready(now);
		update_stop(now);
	}
	return 0;
}

static long poll_timeout_ms(int64_t now)
{
	int64_t next = g.next_flush;
	if (g.heap_len && g.heap[0]->due < next)
		next = g.heap[0]->due;
	if (!g.stopping && g.nfree && g.next_start < next)
		next = g.next_start;
	if (!g.stopping && g.o.seconds > 0 && g.stop_at < next)
		next = g.stop_at;
	if (g.stopping && g.cut_at < next)
		next = g.cut_at;
	if (next <= now)
		return 0;
	return (long)((next - now + 999) / 1000);
}

/* At the cut, what is in flight is logged as stopped and every flow still
 * going ends as stopped (its main phase's answer kept if it had one). */
static void cut_all(int64_t now)
{
	for (int i = 0; i < g.o.concurrency; i++) {
		struct slot *s = &g.slots[i];
		if (!s->lane)
			continue;
		log_attempt(s, now, "stopped");
		slot_release(s);
	}
	while (g.active) {
		struct flow *f = g.active;
		if (f->phase == PH_MAIN) {
			f->stopped = true;
			f->final = false;
			f->t_final = now;
		}
		flow_end(f);
	}
}

static int loop(void)
{
	int running;
	for (;;) {
		int64_t now = now_us();
		if (g_signal || (g.stopping && (now >= g.cut_at || !g.nactive)))
			break;
		if (run_timers(now) || start_flows(now))
			return -1;
		dispatch_ready(now);
		update_stop(now);
		curl_multi_perform(g.multi, &running);
		now = now_us();
		if (harvest(now))
			return -1;
		if (now >= g.next_flush) {
			fflush(g.log);
			g.next_flush = now + 1000000;
		}
		if (g.ready_head && g.nfree)
			continue;
		curl_multi_poll(g.multi, NULL, 0, (int)poll_timeout_ms(now),
				NULL);
	}
	cut_all(now_us());
	return 0;
}

/* ---- start and report ------------------------------------------------- */

static int setup(char *err, size_t errlen)
{
	g.log = fopen(g.o.log_path, "w");
	if (!g.log) {
		snprintf(err, errlen, "%s: %s", g.o.log_path, strerror(errno));
		return -1;
	}
	setvbuf(g.log, NULL, _IOFBF, 1 << 20);
	log_headers();
	for (int t = 0; t < g.o.ntargets; t++) {
		const char *base = g.o.targets[t];
		size_t n = strlen(base);
		while (n && base[n - 1] == '/')
			n--;
		for (int r = 0; r < R_N; r++)
			if (asprintf(&g.urls[t][r], "%.*s%s", (int)n, base,
				     route_paths[r]) < 0)
				return -1;
	}
	g.res = calloc(RESERVOIR_CAP, sizeof *g.res);
	g.multi = curl_multi_init();
	if (!g.res || !g.multi) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	curl_multi_setopt(g.multi, CURLMOPT_MAXCONNECTS,
			  (long)g.o.concurrency + 16);
	g.res_rng = g.o.seed ^ 0x5eed5eedULL;
	return slots_init(err, errlen);
}

static void print_weights(void)
{
	fprintf(stderr, "verify_load: kinds");
	for (int k = 0; k < K_N; k++)
		fprintf(stderr, " %s=%u", fkind_names[k], g.o.weights[k]);
	fprintf(stderr, "\n");
}

static void print_counts(const char *name, const char *const *names,
			 const uint64_t *v, int n)
{
	printf(",\"%s\":{", name);
	for (int k = 0; k < n; k++)
		printf("%s\"%s\":%" PRIu64, k ? "," : "", names[k], v[k]);
	printf("}");
}

static void report(int64_t t_end)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
		     (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
	double secs = (t_end - g.t_begin) / 1e6;
	printf("{\"requests\":%" PRIu64 ",\"answered\":%" PRIu64
	       ",\"errors\":%" PRIu64 ",\"flows\":%" PRIu64
	       ",\"final\":%" PRIu64 ",\"deadline\":%" PRIu64
	       ",\"stopped\":%" PRIu64 ",\"seconds\":%.3f,\"rps\":%.1f"
	       ",\"cpu_s\":%.3f,\"cpu_us_per_request\":%.1f",
	       g.sent, g.answered, g.errors, g.flows_started, g.final_flows,
	       g.deadline_flows, g.stopped_flows, secs,
	       secs > 0 ? g.sent / secs : 0.0, cpu,
	       g.sent ? cpu * 1e6 / g.sent : 0.0);
	print_counts("by_kind", fkind_names, g.by_kind, K_N);
	print_counts("attempts_by_kind", akind_names, g.by_akind, A_N);
	uint64_t w[K_N];
	for (int k = 0; k < K_N; k++)
		w[k] = g.o.weights[k];
	print_counts("weights", fkind_names, w, K_N);
	printf("}\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char err[256] = "";
	if (parse_args(argc, argv, &g.o, err, sizeof err)) {
		fprintf(stderr, "verify_load: %s\n", err);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) || setup(err, sizeof err)) {
		fprintf(stderr, "verify_load: %s\n", err[0] ? err : "setup");
		return 1;
	}
	print_weights();
	g.t_begin = now_us();
	g.next_start = g.t_begin;
	g.next_flush = g.t_begin + 1000000;
	g.stop_at = g.t_begin + (int64_t)(g.o.seconds * 1e6);
	int rc = loop();
	int64_t t_end = now_us();
	if (fflush(g.log) || fclose(g.log) || rc) {
		fprintf(stderr, "verify_load: %s\n",
			rc ? "out of memory" : "log write failed");
		return 1;
	}
	report(t_end);
	return 0;
}
