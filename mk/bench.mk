# The benchmark (tests/bench/, see tests/bench/README.md).
#
#   make bench          optimised build, then throughput, latency and CPU
#                       per request of idemproxy against nginx, the bare
#                       upstream, pgbench of the same statements and of the
#                       raw two-commit pair; build-bench/results.md
#   make bench-profile  instructions per forwarded and per replayed request
#                       under callgrind; build-bench/profile.txt
#   make bench-syscalls system calls and context switches per fresh-key
#                       request (perf stat, strace -c); build-bench/syscalls.txt
#   make bench-model    idemproxy's CPU per fresh key beside a model of an
#                       event-driven first attempt (programs/evloop_model.c) and
#                       pgbench's own CPU per raw pair; build-bench/model.md
#   make bench-citus    the store's rows on a plain PostgreSQL and on a Citus
#                       coordinator with two workers on this machine, with
#                       their ratios (needs citus.so); build-bench/citus.md.
#                       `make bench BENCH_CITUS=1` runs it after the bench.
#
# The binaries are built in their own directory with fixed flags, so a bench
# never measures whatever build/ happens to hold.

BENCH_OUT := build-bench
BENCH_BIN := $(BENCH_OUT)/bin

BENCH_CITUS ?=

.PHONY: bench bench-profile bench-syscalls bench-model bench-deps bench-build bench-citus

bench-deps:
	@tests/bench/deps.sh

bench-build:
	@$(MAKE) --no-print-directory BUILD=$(BENCH_BIN) OPT='-O2 -g' \
		$(BENCH_BIN)/idemproxy $(BENCH_BIN)/stub_upstream \
		$(BENCH_BIN)/wake_cost $(BENCH_BIN)/evloop_model

# Header dependencies, as in the Makefile.
BENCH_PROGS := $(patsubst %,$(BUILD)/%,stub_upstream wake_cost evloop_model)
$(call with_no_d,$(BENCH_PROGS)): $(wildcard include/*.h)
-include $(wildcard $(BENCH_PROGS:=.d))

# The stub needs only the allocation and buffer helpers.
$(BUILD)/stub_upstream: tests/bench/programs/stub_upstream.c $(BUILD)/util.o
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< $(BUILD)/util.o -lpthread

$(BUILD)/wake_cost: tests/bench/programs/wake_cost.c | $(BUILD)
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< -lpthread

$(BUILD)/evloop_model: tests/bench/programs/evloop_model.c | $(BUILD) pkg-check
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< -lpq

bench: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/run.sh
	$(if $(BENCH_CITUS),@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/citus.sh)

bench-citus: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/citus.sh

bench-profile: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/profile.sh

bench-syscalls: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/syscalls.sh

bench-model: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) tests/bench/model.sh
