#include "fiber.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* The sanitizers must be told of each switch of stacks: gcc says it is
 * building for them with __SANITIZE_*__, clang with __has_feature. */
#if defined(__SANITIZE_ADDRESS__)
#define FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define FIBER_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define FIBER_TSAN 1
#endif
#endif
#ifdef FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* A switch of stacks. swapcontext also saves and sets the signal mask: a
 * system call each way, 7 per request, for a mask all fibers of a thread
 * share. On x86-64 the switch is ours instead, in its own assembly file
 * (src/fiber_switch_x86_64.S, where what it saves and why it suits the
 * compiler's control-flow protection is said). Elsewhere ucontext. */
#if defined(__x86_64__)
#define FIBER_OWN_SWITCH 1
typedef struct fctx {
	void *sp;
} fctx;
/* Saves the current stack in *from and continues on to. */
void fiber_switch_asm(fctx *from, const fctx *to);
#define FIBER_SWITCH(from, to) fiber_switch_asm(from, to)
#else
#include <ucontext.h>
typedef ucontext_t fctx;
#define FIBER_SWITCH(from, to) ALWAYS_ASSERT(swapcontext(from, to) == 0)
#endif

enum fstate { F_RUNNABLE, F_RUNNING, F_WAITING, F_PARKED, F_DONE };

struct fiber {
	fctx ctx;
	fiber_sched *s;
	void (*fn)(void *);
	void *arg;
	char *map;       /* the mapping: the guard, then the stack */
	size_t map_size; /* both */
	enum fstate state; /* the scheduler thread's own */
	bool parked;       /* under s->mu: waits for fiber_wake */
	bool wake_pending; /* under s->mu: a wake came first */
	fiber *next;       /* run queue / remote list */
	/* a wait on fds */
	int nwait;
	const int *wfds;
	int *wready;
	int got;
	double deadline; /* < 0: none */
	int wait_index;  /* in s->waiting, -1 if not there */
#ifdef FIBER_ASAN
	void *asan_fake;
#endif
#ifdef FIBER_TSAN
	void *tsan;
#endif
};

typedef struct fdent {
	fiber *waiter;
	int idx; /* in the waiter's fd list */
	bool registered;
} fdent;

typedef struct sched_call {
	void (*fn)(void *);
	void *arg;
	bool done;
	struct sched_call *next;
} sched_call;

struct fiber_sched {
	pthread_t thread;
	int ep, evfd;
	size_t stack_size;
	fctx main_ctx;
	size_t guard; /* bytes of PROT_NONE below each stack */
	fiber *run_head, *run_tail; /* the scheduler thread's own */
	pthread_mutex_t mu;
	fiber *remote_head, *remote_tail; /* under mu */
	sched_call *calls;                /* under mu */
	pthread_cond_t calls_cv;
	fiber_source src; /* the scheduler thread's own */
	bool src_ready;
	atomic_bool src_poked; /* fiber_sched_poke_source, from any thread */
	atomic_bool sleeping;
	/* When the loop is due to come round again (mono_ms's clock): now
	 * while it runs, the end of its sleep while it sleeps. Read by other
	 * threads (fiber_sched_lag_ms). */
	_Atomic double due_ms;
	atomic_int live;
	atomic_bool joining;
	fiber **waiting; /* fibers with a deadline */
	int nwaiting, cap_waiting;
	fdent *fds;
	int nfds;
	_Atomic(fiber_poll_hooks *) poll;
#ifdef FIBER_ASAN
	void *asan_fake;
	const void *main_bottom;
	size_t main_size;
#endif
#ifdef FIBER_TSAN
	void *tsan_main;
#endif
};

static __thread fiber_sched *tls_sched;
static __thread fiber *tls_current;

fiber *fiber_current(void)
{
	return tls_current;
}

bool fiber_stack_bounds(char **lo, char **hi)
{
	fiber *f = tls_current;
	if (!f)
		return false;
	*lo = f->map + f->s->guard;
	*hi = f->map + f->map_size;
	return true;
}

/* ---- switching ------------------------------------------------------ */

static void to_fiber(fiber_sched *s, fiber *f)
{
	tls_current = f;
	f->state = F_RUNNING;
#ifdef FIBER_ASAN
	__sanitizer_start_switch_fiber(&s->asan_fake, f->map + s->guard,
				       f->map_size - s->guard);
#endif
#ifdef FIBER_TSAN
	__tsan_switch_to_fiber(f->tsan, 0);
#endif
	FIBER_SWITCH(&s->main_ctx, &f->ctx);
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(s->asan_fake, NULL, NULL);
#endif
	tls_current = NULL;
}

/* From the running fiber back to its scheduler. */
static void to_sched(fiber *f)
{
	fiber_sched *s = f->s;
#ifdef FIBER_ASAN
	__sanitizer_start_switch_fiber(
		f->state == F_DONE ? NULL : &f->asan_fake, s->main_bottom,
		s->main_size);
#endif
#ifdef FIBER_TSAN
	__tsan_switch_to_fiber(s->tsan_main, 0);
#endif
	FIBER_SWITCH(&f->ctx, &s->main_ctx);
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(f->asan_fake, &s->main_bottom,
					&s->main_size);
#endif
}

/* A fiber's first code: its scheduler set tls_current before switching. */
static void entry(void)
{
	fiber *f = tls_current;
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(NULL, &f->s->main_bottom,
					&f->s->main_size);
#endif
	f->fn(f->arg);
	f->state = F_DONE;
	to_sched(f);
	abort(); /* never resumed */
}

static void free_fiber(fiber *f)
{
#ifdef FIBER_TSAN
	__tsan_destroy_fiber(f->tsan);
#endif
	munmap(f->map, f->map_size);
	free(f);
}

/* ---- queues --------------------------------------------------------- */

static void append(fiber **head, fiber **tail, fiber *f)
{
	f->next = NULL;
	if (*tail)
		(*tail)->next = f;
	else
		*head = f;
	*tail = f;
}

static void run_push(fiber_sched *s, fiber *f)
{
	f->state = F_RUNNABLE;
	append(&s->run_head, &s->run_tail, f);
}

static void kick(fiber_sched *s)
{
	if (atomic_load(&s->sleeping)) {
		uint64_t one = 1;
		ssize_t w = write(s->evfd, &one, sizeof one);
		(void)w; /* a full counter already wakes it */
	}
}

/* Under s->mu. */
static void remote_push(fiber_sched *s, fiber *f)
{
	append(&s->remote_head, &s->remote_tail, f);
}

static void take_remote(fiber_sched *s)
{
	pthread_mutex_lock(&s->mu);
	fiber *f = s->remote_head;
	s->remote_head = s->remote_tail = NULL;
	pthread_mutex_unlock(&s->mu);
	while (f) {
		fiber *next = f->next;
		run_push(s, f);
		f = next;
	}
}

static void waiting_add(fiber_sched *s, fiber *f)
{
	if (s->nwaiting == s->cap_waiting) {
		s->cap_waiting = s->cap_waiting ? 2 * s->cap_waiting : 16;
		s->waiting = xrealloc(s->waiting,
				      (size_t)s->cap_waiting * sizeof *s->waiting);
	}
	f->wait_index = s->nwaiting;
	s->waiting[s->nwaiting++] = f;
}

static void waiting_remove(fiber_sched *s, fiber *f)
{
	if (f->wait_index < 0)
		return;
	fiber *last = s->waiting[--s->nwaiting];
	s->waiting[f->wait_index] = last;
	last->wait_index = f->wait_index;
	f->wait_index = -1;
}

/* ---- waits ---------------------------------------------------------- */

static fdent *fd_entry(fiber_sched *s, int fd)
{
	if (fd >= s->nfds) {
		int n = s->nfds ? s->nfds : 64;
		while (n <= fd)
			n *= 2;
		s->fds = xrealloc(s->fds, (size_t)n * sizeof *s->fds);
		memset(s->fds + s->nfds, 0,
		       (size_t)(n - s->nfds) * sizeof *s->fds);
		s->nfds = n;
	}
	return &s->fds[fd];
}

/* Arms fd, once, for events. A descriptor closed since it was last armed
 * has left the epoll set by itself (ENOENT); one never armed may already
 * be in it under an earlier file with the same number (EEXIST). */
static int arm(fiber_sched *s, int fd, int events)
{
	fdent *e = fd_entry(s, fd);
	struct epoll_event ev = {.events = EPOLLONESHOT, .data.fd = fd};
	if (events & FIBER_IN)
		ev.events |= EPOLLIN | EPOLLRDHUP;
	if (events & FIBER_OUT)
		ev.events |= EPOLLOUT;
	int op = e->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
	if (epoll_ctl(s->ep, op, fd, &ev)) {
		op = errno == ENOENT ? EPOLL_CTL_ADD
		     : errno == EEXIST ? EPOLL_CTL_MOD
				       : -1;
		if (op < 0 || epoll_ctl(s->ep, op, fd, &ev))
			return -1;
	}
	e->registered = true;
	return 0;
}

int fiber_wait_fds(int n, const int *fds, const int *events, int *ready,
		   double deadline_ms)
{
	fiber *f = tls_current;
	ALWAYS_ASSERT(f);
	ALWAYS_ASSERT(n > 0 || deadline_ms >= 0); /* else it never wakes */
	fiber_sched *s = f->s;
	f->got = 0;
	for (int i = 0; i < n; i++) {
		ready[i] = 0;
		if (arm(s, fds[i], events[i])) {
			/* not a socket epoll can watch: report it ready, the
			 * caller's own call will see what it is */
			ready[i] = events[i];
			f->got |= events[i];
		}
	}
	if (f->got) {
		for (int i = 0; i < n; i++)
			fd_entry(s, fds[i])->waiter = NULL;
		return f->got;
	}
	for (int i = 0; i < n; i++) {
		fdent *e = fd_entry(s, fds[i]);
		e->waiter = f;
		e->idx = i;
	}
	f->nwait = n;
	f->wfds = fds;
	f->wready = ready;
	f->deadline = deadline_ms;
	if (deadline_ms >= 0)
		waiting_add(s, f);
	f->state = F_WAITING;
	to_sched(f);
	for (int i = 0; i < n; i++) {
		fdent *e = fd_entry(s, fds[i]);
		if (e->waiter == f)
			e->waiter = NULL;
	}
	f->nwait = 0;
	return f->got;
}

int fiber_wait_fd(int fd, int events, double deadline_ms)
{
	int ready;
	return fiber_wait_fds(1, &fd, &events, &ready, deadline_ms);
}

void fiber_yield(void)
{
	fiber *f = tls_current;
	ALWAYS_ASSERT(f);
	run_push(f->s, f);
	to_sched(f);
}

void fiber_park(void)
{
	fiber *f = tls_current;
	ALWAYS_ASSERT(f);
	fiber_sched *s = f->s;
	pthread_mutex_lock(&s->mu);
	if (f->wake_pending) {
		f->wake_pending = false;
		pthread_mutex_unlock(&s->mu);
		return;
	}
	f->parked = true;
	pthread_mutex_unlock(&s->mu);
	/* A wake from now on queues it; the scheduler takes that queue only
	 * after this switch. */
	f->state = F_PARKED;
	to_sched(f);
}

void fiber_wake(fiber *f)
{
	fiber_sched *s = f->s;
	pthread_mutex_lock(&s->mu);
	bool parked = f->parked;
	if (parked) {
		f->parked = false;
		remote_push(s, f);
	} else {
		f->wake_pending = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (parked)
		kick(s);
}

/* ---- the scheduler -------------------------------------------------- */

static void ready_fd(fiber_sched *s, int fd, uint32_t ev)
{
	if (fd < 0 || fd >= s->nfds)
		return;
	fdent *e = &s->fds[fd];
	fiber *f = e->waiter;
	if (!f || f->state != F_WAITING)
		return;
	int got = 0;
	if (ev & (EPOLLIN | EPOLLRDHUP))
		got |= FIBER_IN;
	if (ev & EPOLLOUT)
		got |= FIBER_OUT;
	if (ev & (EPOLLERR | EPOLLHUP))
		got |= FIBER_IN | FIBER_OUT;
	f->wready[e->idx] = got;
	f->got |= got;
	waiting_remove(s, f);
	run_push(s, f);
}

static int next_timeout(fiber_sched *s)
{
	double now = mono_ms(), first = -1;
	for (int i = 0; i < s->nwaiting;) {
		fiber *f = s->waiting[i];
		if (f->deadline <= now) {
			waiting_remove(s, f);
			f->got = 0;
			run_push(s, f);
			continue;
		}
		if (first < 0 || f->deadline < first)
			first = f->deadline;
		i++;
	}
	if (s->run_head || atomic_load(&s->src_poked))
		return 0;
	if (first < 0)
		return -1;
	double ms = first - now;
	return ms < 1 ? 1 : (int)(ms + 0.999);
}

static bool remote_pending(fiber_sched *s)
{
	pthread_mutex_lock(&s->mu);
	bool any = s->remote_head != NULL || s->calls != NULL ||
		   atomic_load(&s->src_poked);
	pthread_mutex_unlock(&s->mu);
	return any;
}

static void handle_events(fiber_sched *s, const struct epoll_event *evs,
			  int n)
{
	for (int i = 0; i < n; i++) {
		if (s->src.run && evs[i].data.fd == s->src.fd) {
			s->src_ready = true;
			continue;
		}
		if (evs[i].data.fd == s->evfd) {
			uint64_t v;
			ssize_t r = read(s->evfd, &v, sizeof v);
			(void)r; /* the remote list is taken anyway */
			continue;
		}
		ready_fd(s, evs[i].data.fd, evs[i].events);
	}
}

/* The calls other threads queued (fiber_sched_call), in order. */
static void take_calls(fiber_sched *s)
{
	pthread_mutex_lock(&s->mu);
	while (s->calls) {
		sched_call *c = s->calls;
		s->calls = c->next;
		pthread_mutex_unlock(&s->mu);
		c->fn(c->arg);
		pthread_mutex_lock(&s->mu);
		c->done = true;
		pthread_cond_broadcast(&s->calls_cv);
	}
	pthread_mutex_unlock(&s->mu);
}

/* The source's own timeout folded into the wait's: the earlier one. */
static int with_source(fiber_sched *s, int timeout, double *src_deadline)
{
	*src_deadline = -1;
	if (!s->src.run || !s->src.timeout_ms)
		return timeout;
	int64_t t = s->src.timeout_ms(s->src.arg);
	if (t < 0)
		return timeout;
	*src_deadline = mono_ms() + (double)t;
	if (timeout < 0 || t < timeout)
		return (int)t;
	return timeout;
}

static void run_source(fiber_sched *s, double src_deadline)
{
	if (atomic_exchange(&s->src_poked, false))
		s->src_ready = true;
	if (!s->src.run)
		return;
	if (s->src_ready || (src_deadline >= 0 && mono_ms() >= src_deadline)) {
		s->src_ready = false;
		s->src.run(s->src.arg);
	}
}

/* Runs every fiber that is ready, until none is. */
static void run_ready(fiber_sched *s)
{
	while (s->run_head) {
		fiber *f = s->run_head;
		s->run_head = f->next;
		if (!s->run_head)
			s->run_tail = NULL;
		to_fiber(s, f);
		if (f->state == F_DONE) {
			free_fiber(f);
			atomic_fetch_sub(&s->live, 1);
		}
	}
}

/* Busy polling: looks at the epoll set without sleeping until deadline.
 * True when events came (handled); otherwise *timeout and *src_deadline
 * are worked out again for the sleep. */
static bool busy_poll(fiber_sched *s, fiber_poll_hooks *hooks,
		      double deadline, struct epoll_event *evs,
		      double *src_deadline, int *timeout)
{
	int n = 0;
	double t0 = mono_ms();
	atomic_store_explicit(&s->due_ms, deadline, memory_order_relaxed);
	while (!remote_pending(s) &&
	       (n = epoll_wait(s->ep, evs, 64, 0)) == 0 &&
	       mono_ms() < deadline)
		hooks->relax();
	hooks->done(t0, deadline);
	if (n > 0) {
		handle_events(s, evs, n);
		run_source(s, *src_deadline);
		return true;
	}
	*timeout = with_source(s, next_timeout(s), src_deadline);
	return false;
}

/* Sleeps in epoll_wait up to timeout (0: only looks), then handles what
 * came. True when the sleep ended at the heartbeat with nothing to do. */
static bool sleep_poll(fiber_sched *s, int timeout, struct epoll_event *evs,
		       double src_deadline)
{
	if (timeout != 0) {
		atomic_store(&s->sleeping, true);
		if (remote_pending(s))
			timeout = 0;
	}
	/* The heartbeat: even with nothing to do the loop comes round every
	 * FIBER_BEAT_MS, so that a thread stopped in its sleep shows as late
	 * too. */
	bool capped = timeout < 0 || timeout > FIBER_BEAT_MS;
	if (capped)
		timeout = FIBER_BEAT_MS;
	atomic_store_explicit(&s->due_ms, mono_ms() + timeout,
			      memory_order_relaxed);
	int n = epoll_wait(s->ep, evs, 64, timeout);
	atomic_store(&s->sleeping, false);
	handle_events(s, evs, n);
	run_source(s, src_deadline);
	return capped && n == 0;
}

static void *sched_main(void *arg)
{
	fiber_sched *s = arg;
	tls_sched = s;
#ifdef FIBER_TSAN
	s->tsan_main = __tsan_get_current_fiber();
#endif
	struct epoll_event evs[64];
	/* The last sleep ended at the heartbeat with nothing to do. */
	bool beat_only = false;
	for (;;) {
		atomic_store_explicit(&s->due_ms, mono_ms(),
				      memory_order_relaxed);
		take_calls(s);
		take_remote(s);
		if (s->run_head)
			beat_only = false;
		run_ready(s);
		if (atomic_load(&s->live) == 0 && atomic_load(&s->joining))
			break;
		double src_deadline;
		int timeout = with_source(s, next_timeout(s), &src_deadline);
		fiber_poll_hooks *hooks = atomic_load(&s->poll);
		double deadline;
		/* Busy polling follows activity; a heartbeat's wake-up is
		 * none, or an idle loop would poll every FIBER_BEAT_MS. */
		if (timeout != 0 && !beat_only && hooks &&
		    hooks->ok(&deadline) &&
		    busy_poll(s, hooks, deadline, evs, &src_deadline, &timeout))
			continue;
		beat_only = sleep_poll(s, timeout, evs, src_deadline);
	}
	return NULL;
}

fiber_sched *fiber_sched_start(size_t stack_size)
{
	fiber_sched *s = xcalloc(1, sizeof *s);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	s->guard = (FIBER_GUARD_BYTES + page - 1) & ~(page - 1);
	s->stack_size = (stack_size + page - 1) & ~(page - 1);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->calls_cv, NULL);
	atomic_init(&s->due_ms, mono_ms());
	s->ep = epoll_create1(EPOLL_CLOEXEC);
	s->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ALWAYS_ASSERT(s->ep >= 0 && s->evfd >= 0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = s->evfd};
	ALWAYS_ASSERT(epoll_ctl(s->ep, EPOLL_CTL_ADD, s->evfd, &ev) == 0);
	ALWAYS_ASSERT(pthread_create(&s->thread, NULL, sched_main, s) == 0);
	/* named so that tests and operators (top -H) find the serving
	 * thread */
	pthread_setname_np(s->thread, "ip-serve");
	return s;
}

void fiber_spawn(fiber_sched *s, void (*fn)(void *), void *arg)
{
	fiber *f = xcalloc(1, sizeof *f);
	f->s = s;
	f->fn = fn;
	f->arg = arg;
	f->wait_index = -1;
	f->deadline = -1;
	f->map_size = s->guard + s->stack_size;
	f->map = mmap(NULL, f->map_size, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	ALWAYS_ASSERT(f->map != MAP_FAILED);
	/* the guard: an overflow faults instead of writing over another
	 * fiber's stack */
	ALWAYS_ASSERT(mprotect(f->map, s->guard, PROT_NONE) == 0);
#ifdef FIBER_OWN_SWITCH
	/* The frame fiber_switch_asm pops: MXCSR and the x87 control word at
	 * their defaults, six registers, then entry as the return address;
	 * entry starts with the stack as after a call (8 mod 16), above it
	 * a null return address. */
	uint64_t *top = (uint64_t *)(void *)(f->map + f->map_size);
	uint64_t *sp = top - 9;
	memset(sp, 0, 9 * sizeof *sp);
	sp[0] = 0x1f80u | ((uint64_t)0x037fu << 32);
	sp[7] = (uint64_t)(uintptr_t)entry;
	f->ctx.sp = sp;
#else
	ALWAYS_ASSERT(getcontext(&f->ctx) == 0);
	f->ctx.uc_stack.ss_sp = f->map + s->guard;
	f->ctx.uc_stack.ss_size = s->stack_size;
	f->ctx.uc_link = NULL;
	makecontext(&f->ctx, entry, 0);
#endif
#ifdef FIBER_TSAN
	f->tsan = __tsan_create_fiber(0);
#endif
	atomic_fetch_add(&s->live, 1);
	pthread_mutex_lock(&s->mu);
	remote_push(s, f);
	pthread_mutex_unlock(&s->mu);
	kick(s);
}

void fiber_sched_set_poll(fiber_sched *s, fiber_poll_hooks *hooks)
{
	atomic_store(&s->poll, hooks);
}

void fiber_sched_call(fiber_sched *s, void (*fn)(void *), void *arg)
{
	if (tls_sched == s && !tls_current) {
		fn(arg);
		return;
	}
	sched_call c = {.fn = fn, .arg = arg};
	pthread_mutex_lock(&s->mu);
	sched_call **tail = &s->calls;
	while (*tail)
		tail = &(*tail)->next;
	*tail = &c;
	uint64_t one = 1;
	ssize_t w = write(s->evfd, &one, sizeof one);
	(void)w;
	while (!c.done)
		pthread_cond_wait(&s->calls_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

typedef struct set_src {
	fiber_sched *s;
	const fiber_source *src;
} set_src;

static void do_set_source(void *arg)
{
	set_src *a = arg;
	fiber_sched *s = a->s;
	if (s->src.run)
		epoll_ctl(s->ep, EPOLL_CTL_DEL, s->src.fd, NULL);
	memset(&s->src, 0, sizeof s->src);
	s->src_ready = false;
	if (!a->src)
		return;
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = a->src->fd};
	ALWAYS_ASSERT(epoll_ctl(s->ep, EPOLL_CTL_ADD, a->src->fd, &ev) == 0);
	s->src = *a->src;
	s->src_ready = true; /* a first look */
}

void fiber_sched_poke_source(fiber_sched *s)
{
	atomic_store(&s->src_poked, true);
	kick(s);
}

void fiber_sched_set_source(fiber_sched *s, const fiber_source *src)
{
	set_src a = {s, src};
	fiber_sched_call(s, do_set_source, &a);
}

double fiber_sched_lag_ms(fiber_sched *s)
{
	double lag = mono_ms() - atomic_load_explicit(&s->due_ms,
						      memory_order_relaxed);
	return lag > 0 ? lag : 0;
}

void fiber_sched_join(fiber_sched *s)
{
	atomic_store(&s->joining, true);
	uint64_t one = 1;
	ssize_t w = write(s->evfd, &one, sizeof one);
	(void)w;
	pthread_join(s->thread, NULL);
	close(s->ep);
	close(s->evfd);
	free(s->waiting);
	free(s->fds);
	pthread_cond_destroy(&s->calls_cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
