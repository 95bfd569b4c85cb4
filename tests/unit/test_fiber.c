#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "coding.h"
#include "fiber.h"
#include "fingerprint.h"
#include "pathtpl.h"

/* Fibers that each echo bytes through their own socket pair: N fibers wait
 * on N sockets at once, a thread writes to them in reverse order, and every
 * fiber must see its own byte and answer it. */
#define N_FIBERS 64

typedef struct echo {
	int fd;       /* the fiber's end */
	int rounds;
	atomic_int done;
	bool on_fiber;
	int timeouts;
} echo;

static void echo_main(void *arg)
{
	echo *e = arg;
	e->on_fiber = fiber_current() != NULL;
	for (int r = 0; r < e->rounds; r++) {
		int got = fiber_wait_fd(e->fd, FIBER_IN, mono_ms() + 10000);
		if (!(got & FIBER_IN)) {
			e->timeouts++;
			continue;
		}
		char c;
		assert_int_equal(read(e->fd, &c, 1), 1);
		c++;
		assert_int_equal(write(e->fd, &c, 1), 1);
	}
	atomic_store(&e->done, 1);
}

static void test_many_fibers_wait_on_their_own_sockets(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	static echo e[N_FIBERS];
	int peer[N_FIBERS];
	for (int i = 0; i < N_FIBERS; i++) {
		int sv[2];
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		e[i] = (echo){.fd = sv[0], .rounds = 20};
		peer[i] = sv[1];
		fiber_spawn(s, echo_main, &e[i]);
	}
	for (int r = 0; r < 20; r++) {
		for (int i = N_FIBERS - 1; i >= 0; i--) {
			char c = (char)(i + r);
			assert_int_equal(write(peer[i], &c, 1), 1);
		}
		for (int i = 0; i < N_FIBERS; i++) {
			char c;
			assert_int_equal(read(peer[i], &c, 1), 1);
			assert_int_equal(c, (char)(i + r + 1));
		}
	}
	fiber_sched_join(s);
	for (int i = 0; i < N_FIBERS; i++) {
		assert_true(atomic_load(&e[i].done));
		assert_true(e[i].on_fiber);
		assert_int_equal(e[i].timeouts, 0);
		close(e[i].fd);
		close(peer[i]);
	}
}

typedef struct timed {
	int fd;
	double asked_ms, waited_ms;
	int got;
} timed;

static void timed_main(void *arg)
{
	timed *t = arg;
	double t0 = mono_ms();
	t->got = fiber_wait_fd(t->fd, FIBER_IN, t0 + t->asked_ms);
	t->waited_ms = mono_ms() - t0;
}

/* A wait with nothing to read ends at its deadline, with 0; the others'
 * deadlines do not move it. */
static void test_a_wait_ends_at_its_deadline(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	int sv[3][2];
	timed t[3] = {{.asked_ms = 30}, {.asked_ms = 120}, {.asked_ms = 60}};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
		t[i].fd = sv[i][0];
		fiber_spawn(s, timed_main, &t[i]);
	}
	fiber_sched_join(s);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(t[i].got, 0);
		assert_true(t[i].waited_ms >= t[i].asked_ms - 1);
		assert_true(t[i].waited_ms < t[i].asked_ms + 1000);
		close(sv[i][0]);
		close(sv[i][1]);
	}
}

/* A parked fiber wakes on fiber_wake from another thread; a wake that
 * comes before the park is kept. */
typedef struct parker {
	_Atomic(fiber *) self;
	atomic_int parks_done;
	int rounds;
} parker;

static void parker_main(void *arg)
{
	parker *p = arg;
	atomic_store(&p->self, fiber_current());
	for (int i = 0; i < p->rounds; i++) {
		fiber_park();
		atomic_fetch_add(&p->parks_done, 1);
	}
}

static void test_park_and_wake_across_threads(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(64 * 1024);
	parker p = {.rounds = 2000};
	fiber_spawn(s, parker_main, &p);
	while (!atomic_load(&p.self))
		usleep(100);
	fiber *f = atomic_load(&p.self);
	for (int i = 0; i < p.rounds; i++) {
		fiber_wake(f);
		/* every other round, wait until it has been taken: the next
		 * wake then finds it parked, or about to be */
		if (i % 2)
			while (atomic_load(&p.parks_done) <= i)
				usleep(10);
		else
			while (atomic_load(&p.parks_done) <= i)
				;
	}
	fiber_sched_join(s);
	assert_int_equal(atomic_load(&p.parks_done), p.rounds);
}

/* Code that waits the same way off a fiber: fiber_current() is NULL on a
 * plain thread. */
static void test_fiber_current_is_null_on_a_thread(void **state)
{
	(void)state;
	assert_null(fiber_current());
}

static void recurse_main(void *arg)
{
	/* 32 KiB of locals on a 256 KiB stack: a stack that was set up
	 * wrong faults here */
	volatile char big[32768];
	for (size_t i = 0; i < sizeof big; i += 512)
		big[i] = (char)i;
	*(int *)arg = big[512] == (char)512 ? 1 : 2;
	fiber_yield();
}

static void test_a_fiber_has_its_stack(void **state)
{
	(void)state;
	fiber_sched *s = fiber_sched_start(256 * 1024);
	int ok[8] = {0};
	for (int i = 0; i < 8; i++)
		fiber_spawn(s, recurse_main, &ok[i]);
	fiber_sched_join(s);
	for (int i = 0; i < 8; i++)
		assert_int_equal(ok[i], 1);
}

/* ---- the stack's limits ----------------------------------------------- */

#define PAINT 0xa5

/* Paints [lo, end) and finds the lowest byte written since, byte by byte
 * and outside ASan's view: memory below the stack pointer is no object. */
__attribute__((noinline, no_sanitize_address)) static void
paint(char *lo, char *end)
{
	for (volatile char *p = lo; p < end; p++)
		*p = (char)PAINT;
}

__attribute__((noinline, no_sanitize_address)) static char *
lowest_touched(char *lo, char *end)
{
	volatile char *p = lo;
	while (p < end && *p == (char)PAINT)
		p++;
	return (char *)p;
}

/* The deepest body the canonical JSON accepts: [[[...]]] nested `depth`
 * levels, as the fingerprint of a JSON request sees it. */
static char *nested(int depth, size_t *len)
{
	char *b = malloc((size_t)depth * 2 + 1);
	assert_non_null(b);
	memset(b, '[', (size_t)depth);
	memset(b + depth, ']', (size_t)depth);
	b[depth * 2] = '\0';
	*len = (size_t)depth * 2;
	return b;
}

static int deepest_json(void)
{
	int depth = 1;
	for (int d = 1024; d <= 8192; d++) {
		size_t len;
		char *b = nested(d, &len);
		growbuf out = {0};
		int rc = fp_canon_json(b, len, &out);
		growbuf_free(&out);
		free(b);
		if (rc != 0)
			break;
		depth = d;
	}
	return depth;
}

/* What a request does on its worker's stack that goes deepest: the
 * fingerprint of the deepest JSON body accepted, a stored gzip body
 * decoded, the longest path normalised. */
/* Not inlined: its buffers must not widen depth_main's frame, below which
 * the stack is painted. */
__attribute__((noinline)) static void deepest_request(int depth)
{
	size_t len;
	char *body = nested(depth, &len);
	const char *names[1] = {"X-Tenant"}, *values[1] = {"t"};
	fp_input in = {.method = "POST",
		       .route = "r",
		       .raw_target = "/payments",
		       .content_type = "application/json",
		       .n_headers = 1,
		       .header_names = names,
		       .header_values = values,
		       .body = body,
		       .body_len = len};
	uint8_t fp[FP_LEN];
	fp_compute(&in, fp);
	growbuf canon = {0};
	assert_int_equal(fp_canon_json(body, len, &canon), 0);
	growbuf_free(&canon);

	uLongf zlen = compressBound(len) + 32;
	Bytef *z = malloc(zlen);
	z_stream zs = {0};
	assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8,
				      Z_DEFAULT_STRATEGY), Z_OK);
	zs.next_in = (Bytef *)body;
	zs.avail_in = (uInt)len;
	zs.next_out = z;
	zs.avail_out = (uInt)zlen;
	assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
	growbuf dec = {0};
	char err[160];
	assert_int_equal(coding_decode("gzip", (char *)z, zs.total_out,
				       1 << 20, &dec, err, sizeof err), 0);
	assert_int_equal(dec.len, len);
	deflateEnd(&zs);
	growbuf_free(&dec);
	free(z);

	char path[8192], norm[8192];
	for (size_t i = 0; i + 2 < sizeof path; i += 2)
		memcpy(path + i, "/a", 2);
	path[sizeof path - 2] = '\0';
	size_t nlen;
	const char *why;
	assert_int_equal(pathtpl_normalize(path, strlen(path), norm, &nlen,
					   &why), 0);
	free(body);
}

typedef struct depth_run {
	int depth;
	size_t used;
	size_t size;
} depth_run;

static void depth_main(void *arg)
{
	depth_run *r = arg;
	char *lo, *hi;
	assert_true(fiber_stack_bounds(&lo, &hi));
	/* below this frame, with room for paint's own */
	char *end = (char *)__builtin_frame_address(0) - 4096;
	paint(lo, end);
	deepest_request(r->depth);
	r->used = (size_t)(hi - lowest_touched(lo, end));
	r->size = (size_t)(hi - lo);
}

/* The deepest stack a request reaches stays well inside a worker's: at
 * most three quarters of it, whatever the build (the margin is for the
 * libraries' versions and the sanitizers' frames). */
static void test_the_deepest_request_fits_a_worker_stack(void **state)
{
	(void)state;
	depth_run r = {.depth = deepest_json()};
	assert_true(r.depth >= 2000); /* jansson's limit, 2048 levels */
	fiber_sched *s = fiber_sched_start(FIBER_STACK_BYTES);
	fiber_spawn(s, depth_main, &r);
	fiber_sched_join(s);
	assert_int_equal(r.size, FIBER_STACK_BYTES);
	print_message("deepest JSON %d levels: %zu KiB of %zu KiB\n", r.depth,
		      r.used >> 10, r.size >> 10);
	assert_true(r.used > 0);
	assert_true(r.used < r.size / 4 * 3);
}

/* ---- an overflow faults in its own guard ------------------------------ */

static char *guard_lo, *guard_hi;     /* the diver's guard */
static char *nb_lo, *nb_end;          /* the neighbour's painted stack */

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)uc;
	char *a = si->si_addr;
	if (a < guard_lo || a >= guard_hi)
		_exit(3); /* past the guard: it wrote somewhere else first */
	if (lowest_touched(nb_lo, nb_end) != nb_end)
		_exit(4); /* the neighbour's stack was written */
	signal(SIGSEGV, SIG_DFL); /* the fault again, now fatal */
}

/* Frames larger than a page that touch only their lowest bytes: without
 * a guard larger than a frame or stack-clash probes, they step over a
 * one-page guard into whatever lies below. */
static volatile int dive_limit = 1 << 30; /* never reached */

__attribute__((noinline, no_sanitize_address)) static int dive(int n)
{
	volatile char frame[24576];
	frame[0] = (char)n;
	if (n >= dive_limit)
		return 0;
	return dive(n + 1) + frame[0];
}

static void neighbour_main(void *arg)
{
	char *lo, *hi;
	assert_true(fiber_stack_bounds(&lo, &hi));
	nb_lo = lo;
	nb_end = (char *)__builtin_frame_address(0) - 4096;
	paint(nb_lo, nb_end);
	fiber_park(); /* never woken: the child dies first */
}

static void diver_main(void *arg)
{
	char *lo, *hi;
	assert_true(fiber_stack_bounds(&lo, &hi));
	guard_lo = lo - FIBER_GUARD_BYTES;
	guard_hi = lo;
	static char alt[64 * 1024];
	stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
	sigaltstack(&ss, NULL); /* this thread's: the fiber's is used up */
	struct sigaction sa = {.sa_sigaction = on_segv,
			       .sa_flags = SA_SIGINFO | SA_ONSTACK};
	sigaction(SIGSEGV, &sa, NULL);
	_exit(dive(0) == 0 ? 5 : 6);
}

static void test_an_overflow_faults_in_its_own_guard(void **state)
{
	(void)state;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* the neighbour is mapped first, so that the diver's mapping
		 * usually lies right above it */
		fiber_sched *s = fiber_sched_start(256 * 1024);
		fiber_spawn(s, neighbour_main, NULL);
		fiber_spawn(s, diver_main, NULL);
		fiber_sched_join(s);
		_exit(7);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFSIGNALED(st))
		print_message("child exited with %d\n", WEXITSTATUS(st));
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGSEGV);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_fibers_wait_on_their_own_sockets),
		cmocka_unit_test(test_a_wait_ends_at_its_deadline),
		cmocka_unit_test(test_park_and_wake_across_threads),
		cmocka_unit_test(test_fiber_current_is_null_on_a_thread),
		cmocka_unit_test(test_a_fiber_has_its_stack),
		cmocka_unit_test(test_the_deepest_request_fits_a_worker_stack),
		cmocka_unit_test(test_an_overflow_faults_in_its_own_guard),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
