# Sanitizer builds: everything rebuilt in its own directory and tested with
# the usual suites.
#
#   make check-asan   ASan+UBSan into build-asan/: unit tests, then every
#                     integration test against build-asan/idemproxy
#   make check-tsan   TSan into build-tsan/: the concurrency, replay-cache
#                     and two-instance tests
#                     (TSAN_TESTS=tests/integration for the whole suite)
#
# PYTEST_ARGS reaches pytest in both, as for `make integration`.
#
# The Makefile links with $(CC) $(CFLAGS) and CFLAGS starts from OPT, so the
# -fsanitize flags in OPT reach the link as well. The proxy runs under pytest,
# whose harness keeps its stderr, so there the sanitizers write reports to
# files (log_path) instead; the target prints any that appear and fails.
# Leaks and races inside the libraries we link (never in src/) are
# suppressed in tests/lsan.supp and tests/tsan.supp, each with its reason.

# clang, because gcc 12's UBSan, linked into ASan, ignores log_path and
# would leave its reports in the captured stderr only.
SAN_CC   ?= clang
SAN_BASE := -O1 -g -fno-omit-frame-pointer
ASAN_OPT := $(SAN_BASE) -fsanitize=address,undefined -fno-sanitize-recover=all
TSAN_OPT := $(SAN_BASE) -fsanitize=thread

# Of test_batch.py, the tests where calls queue for a batch while others
# go alone (the lanes, their fibers and the gauge read at the scrape).
TSAN_BATCH := $(foreach t,fresh_keys_that_arrive_together_are_claimed_in_one_statement \
	the_same_key_twice_in_one_batch_is_forwarded_once \
	a_claim_the_database_refuses_fails_only_its_own_request \
	answers_that_arrive_together_are_recorded_in_one_statement \
	a_record_the_database_refuses_fails_only_its_own,tests/integration/test_batch.py::test_$(t))
TSAN_TESTS ?= tests/integration/test_concurrency.py \
	tests/integration/test_replay_cache.py tests/integration/test_instances.py \
	tests/integration/test_busy_poll.py $(TSAN_BATCH)

ASAN_REPORTS := $(abspath build-asan/reports)
TSAN_REPORTS := $(abspath build-tsan/reports)

SAN_ASAN_OPTS := detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1
SAN_UBSAN_OPTS := print_stacktrace=1:halt_on_error=1
SAN_LSAN_OPTS := suppressions=$(abspath tests/lsan.supp):print_suppressions=0
# halt_on_error=0: collect every race of the run, then fail on the files.
SAN_TSAN_OPTS := halt_on_error=0:second_deadlock_stack=1:suppressions=$(abspath tests/tsan.supp):print_suppressions=0

# A sub-make for one sanitizer build. CFLAGS from the environment would
# replace OPT (CFLAGS ?= $(OPT)), so it is dropped. pytest runs outside it:
# its CC/BUILD/OPT would otherwise reach every make a test runs.
san_make = env -u CFLAGS $(MAKE) --no-print-directory CC=$(SAN_CC) BUILD=$(1) \
	MALLOC= OPT='$(2)'

# Prints every report file in $(1) and fails if there is one.
# ASan says once per process that it does not fully support swapcontext
# (the worker fibers switch stacks with it, and tell ASan each time, see
# src/fiber.c): a report with nothing else in it is not a finding.
SAN_NOTICE := fully support makecontext/swapcontext functions

san_reports = found=0; for f in $(1)/*; do [ -f "$$f" ] || continue; \
	grep -qv -e '$(SAN_NOTICE)' "$$f" || continue; \
	found=1; echo "==================== sanitizer report $$f"; cat "$$f"; \
	done; if [ $$found = 1 ]; then echo "$(2): sanitizer reports above (in $(1))"; \
	exit 1; fi

.PHONY: check-asan check-tsan
check-asan:
	@rm -rf $(ASAN_REPORTS) && mkdir -p $(ASAN_REPORTS)
	@$(call san_make,build-asan,$(ASAN_OPT)) all build-asan/store_check
	ASAN_OPTIONS=$(SAN_ASAN_OPTS) UBSAN_OPTIONS=$(SAN_UBSAN_OPTS) \
	LSAN_OPTIONS=$(SAN_LSAN_OPTS) \
		$(call san_make,build-asan,$(ASAN_OPT)) unit
	@rc=0; \
	ASAN_OPTIONS=$(SAN_ASAN_OPTS):log_path=$(ASAN_REPORTS)/report \
	UBSAN_OPTIONS=$(SAN_UBSAN_OPTS):log_path=$(ASAN_REPORTS)/report \
	LSAN_OPTIONS=$(SAN_LSAN_OPTS) \
	IDEMPROXY_BIN=$(abspath build-asan/idemproxy) \
	IDEMPROXY_STORE_CHECK=$(abspath build-asan/store_check) \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests/integration \
		$(PYTEST_ARGS) || rc=$$?; \
	$(call san_reports,$(ASAN_REPORTS),check-asan); \
	exit $$rc

check-tsan:
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	@$(call san_make,build-tsan,$(TSAN_OPT)) all build-tsan/store_check
	@rc=0; \
	TSAN_OPTIONS=$(SAN_TSAN_OPTS):log_path=$(TSAN_REPORTS)/report \
	IDEMPROXY_BIN=$(abspath build-tsan/idemproxy) \
	IDEMPROXY_STORE_CHECK=$(abspath build-tsan/store_check) \
		$(PYTHON) -m pytest -q -p no:cacheprovider \
		$(TSAN_TESTS) $(PYTEST_ARGS) || rc=$$?; \
	$(call san_reports,$(TSAN_REPORTS),check-tsan); \
	exit $$rc
