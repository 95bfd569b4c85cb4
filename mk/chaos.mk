# The chaos soak and the HTTP front-end fuzzer (tests/chaos/, see the
# README's "Chaos soak").
#
#   make chaos                       the checker's self-test, then each mode
#                                    (hold, release_after_lease) for
#                                    CHAOS_SECONDS (60), then fuzz-http for
#                                    CHAOS_FUZZ_SECONDS (30)
#   make chaos CHAOS_SECONDS=600     the long run
#   make fuzz-http                   the fuzzer alone
#
# CHAOS_SEED=N repeats a run's random draws (the seed is printed first).
# Both start their own PostgreSQL cluster and remove it afterwards; the logs
# of a failed run are kept and their directory printed.

CHAOS_SECONDS      ?= 60
CHAOS_FUZZ_SECONDS ?= 30
CHAOS_MODES        ?= hold,release
CHAOS_ENV          := IDEMPROXY_BIN=$(abspath $(BUILD)/idemproxy)

.PHONY: chaos chaos-selftest fuzz-http
chaos-selftest:
	cd tests/chaos && $(PYTHON) -m pytest -q -p no:cacheprovider test_checker.py

chaos: $(BUILD)/idemproxy $(BUILD)/slow_resolver.so chaos-selftest
	cd tests/chaos && $(CHAOS_ENV) $(PYTHON) soak.py --seconds $(CHAOS_SECONDS) \
		--modes $(CHAOS_MODES) --fuzz-seconds $(CHAOS_FUZZ_SECONDS)

fuzz-http: $(BUILD)/idemproxy
	cd tests/chaos && $(CHAOS_ENV) $(PYTHON) fuzz_http.py --seconds $(CHAOS_FUZZ_SECONDS)
