# The store suites on Citus (distributed PostgreSQL, README "Past one
# database"): a coordinator and two workers on 127.0.0.1, started by the
# tests (tests/integration/citus_cluster.py), each test's database on all
# three with the extension, the proxies with database.distributed = "citus".
#
#   make test-citus                     Citus must be installed (citus.so)
#   make test-citus CITUS_SRC=DIR       builds and installs it from DIR first
#                                       when citus.so is missing (a Citus
#                                       source tree, or a folder with a
#                                       build.sh that does it; needs root)
#
# Then the chaos soak (tests/chaos/soak.py --citus) on a coordinator and
# two workers of its own, fsync on, in the release_after_lease mode (the
# one the reaper works in) for CITUS_SOAK_SECONDS (60; 0 skips it), any
# violated invariant failing the target. CITUS_SOAK_MODES=hold,release runs
# both modes.

CITUS_SRC ?=
CITUS_SOAK_SECONDS ?= 60
CITUS_SOAK_MODES ?= release
CITUS_TESTS ?= tests/integration/test_core.py \
	tests/integration/test_concurrency.py tests/integration/test_failures.py \
	tests/integration/test_instances.py tests/integration/test_reaper_crash.py \
	tests/integration/test_ops.py tests/integration/test_replay_cache.py \
	tests/integration/test_wait.py tests/integration/test_citus.py \
	tests/integration/test_tombstones.py

.PHONY: test-citus
test-citus: $(BUILD)/idemproxy $(BUILD)/store_check
	@scripts/citus-install.sh $(CITUS_SRC)
	IDEMPROXY_TEST_CITUS=1 $(PYTHON) -m pytest -q -p no:cacheprovider \
		$(CITUS_TESTS) $(PYTEST_ARGS)
	$(if $(filter-out 0,$(CITUS_SOAK_SECONDS)),cd tests/chaos && \
		IDEMPROXY_BIN=$(abspath $(BUILD)/idemproxy) $(PYTHON) soak.py --citus \
		--seconds $(CITUS_SOAK_SECONDS) --modes $(CITUS_SOAK_MODES) --fuzz-seconds 0)
