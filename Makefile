# idemproxy — see README.md. `make` builds, `make test` tests, `make run` demos.

CC      ?= cc
PKGS    := libmicrohttpd libcurl libpq jansson libcrypto libconfig zlib jose libsystemd
# The Debian package that installs each one's .pc file (`make deps` installs
# them all); pkg-check names the missing ones before a compiler would fail.
DEB_libmicrohttpd := libmicrohttpd-dev
DEB_libcurl       := libcurl4-openssl-dev
DEB_libpq         := libpq-dev
DEB_jansson       := libjansson-dev
DEB_libcrypto     := libssl-dev
DEB_libconfig     := libconfig-dev
DEB_zlib          := zlib1g-dev
DEB_jose          := libjose-dev
DEB_libsystemd    := libsystemd-dev
OPT     ?= -O2 -g
CFLAGS  ?= $(OPT)
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-unused-parameter \
           -D_GNU_SOURCE -Iinclude -Ibuild $(shell pkg-config --cflags $(PKGS) 2>/dev/null) \
           $(HARDEN) $(CPPFLAGS)
# A frame larger than a page probes each page it takes, so that a stack
# overflow faults in the guard below the stack (a fiber's is 64 KiB) and
# never steps over it into a neighbour; on x86-64, endbr64 at indirect
# branch targets (IBT; src/fiber_switch_x86_64.S says why not shadow stacks).
HARDEN  ?= -fstack-clash-protection $(if $(filter x86_64,$(shell uname -m)),-fcf-protection=branch)
# The allocator: with jemalloc a fresh key's ~90 allocations cost the proxy
# about 14 us less CPU than with glibc's malloc (README, Performance).
# `make MALLOC=` links glibc's; the sanitizer builds always do.
MALLOC  ?= jemalloc
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) $(if $(MALLOC),-l$(MALLOC)) -lpthread
PYTHON  := /usr/bin/python3
BUILD   ?= build
# Each compile writes the headers its output includes into a .d file beside
# it (-MMD; -MP so that a header deleted since is no error), read at the end:
# a changed header rebuilds only what includes it. An output with no .d
# beside it (built before there were any) depends on every header, as all
# did then.
DEPFLAGS := -MMD -MP
with_no_d = $(foreach t,$(1),$(if $(wildcard $(basename $(t)).d),,$(t)))

SRCS    := $(wildcard src/*.c)
ASRCS   := $(wildcard src/*.S)
OBJS    := $(patsubst src/%.c,$(BUILD)/%.o,$(SRCS)) \
           $(patsubst src/%.S,$(BUILD)/%.o,$(ASRCS)) $(BUILD)/migrations.o
LIBOBJS := $(filter-out $(BUILD)/main.o,$(OBJS))
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/%,$(UNIT_SRCS))
MIGRATIONS := $(sort $(wildcard sql/*.sql))

.PHONY: all deps pkg-check run test unit integration check-busy-poll clean FORCE \
	contract-deps
all: $(BUILD)/idemproxy

deps:
	@scripts/deps.sh

$(BUILD):
	@mkdir -p $(BUILD)

# Run before any compile: a library pkg-config cannot find would otherwise
# show up as a missing header or an undefined flag from the compiler.
pkg-check:
	@command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config is missing: \
	install the Debian package pkg-config, or run \`make deps\`" >&2; exit 1; }
	@missing=; for p in $(foreach p,$(PKGS),$(p)=$(DEB_$(p))); do \
		pkg-config --exists "$${p%%=*}" && continue; \
		echo "pkg-config cannot find $${p%%=*} (the Debian package $${p#*=})" >&2; \
		missing="$$missing $${p#*=}"; \
	done; [ -z "$$missing" ] || { echo "install them with: apt-get install$$missing \
	(or run \`make deps\`, which installs everything the build and the tests need)" >&2; \
	exit 1; }

$(BUILD)/%.o: src/%.c | $(BUILD) pkg-check
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

# Assembly (the switch between fibers), through the preprocessor so that it
# sees what the C files are built for (-fcf-protection sets __CET__).
$(BUILD)/%.o: src/%.S | $(BUILD) pkg-check
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

# The migrations are compiled into the binary so a deployment needs no sql/ dir.
# sql itself is a prerequisite too: a migration removed or renamed changes it.
$(BUILD)/migrations.c: $(MIGRATIONS) sql scripts/embed-sql.sh | $(BUILD)
	scripts/embed-sql.sh $(MIGRATIONS) > $@

$(BUILD)/migrations.o: $(BUILD)/migrations.c | pkg-check
	$(CC) $(CFLAGS) -c -o $@ $<

# The version and commit (scripts/version.sh), checked on every build but
# rewritten only when they change, so that only version.o is rebuilt then.
$(BUILD)/version_gen.h: FORCE | $(BUILD)
	@scripts/version.sh . > $@.tmp && \
		{ cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@; }
$(BUILD)/version.o: $(BUILD)/version_gen.h
$(BUILD)/version.o: CFLAGS += -I$(BUILD)
FORCE:

$(BUILD)/idemproxy: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/test_%: tests/unit/test_%.c $(LIBOBJS)
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< $(LIBOBJS) $(LDFLAGS) $(LDLIBS) -lcmocka

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

# Store-level checks that the black box cannot reach (fencing), run by pytest.
$(BUILD)/store_check: tests/integration/store_check.c $(LIBOBJS)
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< $(LIBOBJS) $(LDFLAGS) $(LDLIBS)

# The OpenAPI validator of the contract tests (tests/contract): the versions
# its lock file pins, installed into the build directory, never globally.
CONTRACT_NODE := $(BUILD)/contract-node
contract-deps: $(CONTRACT_NODE)/node_modules/.installed
$(CONTRACT_NODE)/node_modules/.installed: tests/contract/package.json \
		tests/contract/package-lock.json | $(BUILD)
	@command -v npm >/dev/null 2>&1 || { echo "npm is missing: run \
	\`make deps\` (the Debian packages nodejs and npm)" >&2; exit 1; }
	mkdir -p $(CONTRACT_NODE)
	cp tests/contract/package.json tests/contract/package-lock.json \
		$(CONTRACT_NODE)/
	cd $(CONTRACT_NODE) && npm ci --no-audit --no-fund --ignore-scripts
	touch $@

integration: $(BUILD)/idemproxy $(BUILD)/store_check contract-deps
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/integration $(PYTEST_ARGS)

# The suites whose waits busy polling changes (store, upstream, queue), run
# again with busy_poll on; test_busy_poll.py runs in `make test` as well.
BUSY_POLL_TESTS ?= tests/integration/test_core.py \
	tests/integration/test_concurrency.py tests/integration/test_failures.py \
	tests/integration/test_outage.py tests/integration/test_instances.py \
	tests/integration/test_replay_cache.py
check-busy-poll: $(BUILD)/idemproxy $(BUILD)/store_check
	IDEMPROXY_TEST_BUSY_POLL=2ms $(PYTHON) -m pytest -q -p no:cacheprovider \
		$(BUSY_POLL_TESTS) $(PYTEST_ARGS)

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory integration

run: deps
	@$(MAKE) --no-print-directory all
	@demo/run.sh

clean:
	rm -rf build build-* .run

# Further targets (sanitizers, fuzzing, benchmark) live in mk/*.mk.
-include $(wildcard mk/*.mk)

DEP_OUTPUTS := $(filter-out $(BUILD)/migrations.o,$(OBJS)) $(UNIT_BINS) $(BUILD)/store_check
$(call with_no_d,$(DEP_OUTPUTS)): $(wildcard include/*.h)
-include $(wildcard $(addsuffix .d,$(basename $(DEP_OUTPUTS))))
