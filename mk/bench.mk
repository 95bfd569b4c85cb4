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
#   make bench-ab BENCH_BASE=REV
#                       the proxy built at git revision REV beside the
#                       current tree, interleaved in one run: fresh keys,
#                       replays, one-connection p50; build-bench/ab.md
#
# The binaries are built in their own directory with fixed flags, so a bench
# never measures whatever build/ happens to hold.

BENCH_OUT := build-bench
BENCH_BIN := $(BENCH_OUT)/bin

BENCH_OPT := -O2 -g
BENCH_CITUS ?=
BENCH_BASE ?=
BENCH_BASE_DIR := $(BENCH_OUT)/base

.PHONY: bench bench-profile bench-syscalls bench-model bench-deps bench-build bench-citus \
	bench-ab bench-base-build

bench-deps:
	@tests/bench/deps.sh

bench-build:
	@$(MAKE) --no-print-directory BUILD=$(BENCH_BIN) OPT='$(BENCH_OPT)' \
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

# The base's source is its commit's tree (git archive) in
# build-bench/base/src, extracted again only when REV names another commit;
# built by its own Makefile with the flags of bench-build.
bench-base-build:
	@test -n "$(BENCH_BASE)" || { echo "bench-ab: name the base: make bench-ab BENCH_BASE=<git revision>" >&2; exit 2; }
	@rev=$$(git rev-parse --verify -q "$(BENCH_BASE)^{commit}") || \
		{ echo "bench-ab: $(BENCH_BASE) is not a commit" >&2; exit 2; }; \
	if [ "$$(cat $(BENCH_BASE_DIR)/rev 2>/dev/null)" != "$$rev" ]; then \
		rm -rf $(BENCH_BASE_DIR) && mkdir -p $(BENCH_BASE_DIR)/src && \
		git archive "$$rev" | tar -x -C $(BENCH_BASE_DIR)/src && \
		echo "$$rev" >$(BENCH_BASE_DIR)/rev; \
	fi; \
	echo "bench-ab: base $(BENCH_BASE) = $$rev"; \
	$(MAKE) --no-print-directory -C $(BENCH_BASE_DIR)/src \
		BUILD=$(CURDIR)/$(BENCH_BASE_DIR)/bin OPT='$(BENCH_OPT)' \
		$(CURDIR)/$(BENCH_BASE_DIR)/bin/idemproxy

bench-ab: bench-deps
	@$(MAKE) --no-print-directory bench-build
	@$(MAKE) --no-print-directory bench-base-build
	@BENCH_BIN=$(BENCH_BIN) BENCH_OUT=$(BENCH_OUT) BENCH_BASE_BIN=$(BENCH_BASE_DIR)/bin \
		BENCH_BASE_SRC=$(BENCH_BASE_DIR)/src \
		BENCH_BASE_REV="$(BENCH_BASE) ($$(git rev-parse --short "$(BENCH_BASE)^{commit}"))" \
		tests/bench/ab.sh
