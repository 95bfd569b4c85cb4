# The verification campaign (tests/verify/, see doc/verification.md): a
# ledger upstream and a load generator in C, the campaign that runs them
# against proxies, PostgreSQL and a standby in network namespaces with a
# nemesis, and the checker of the invariants.

# The ledger upstream: a plain epoll server, no project code.
$(BUILD)/verify_ledger: tests/verify/ledger.c | $(BUILD)
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< -lpthread

# The load generator: libcurl's multi interface.
$(BUILD)/verify_load: tests/verify/load.c | $(BUILD) pkg-check
	$(CC) $(CFLAGS) $(DEPFLAGS) -o $@ $< $(shell pkg-config --libs libcurl) -lpthread

VERIFY_PROGS := $(BUILD)/verify_ledger $(BUILD)/verify_load
-include $(wildcard $(VERIFY_PROGS:=.d))

# The campaign (tests/verify/campaign.py, as root: it makes network
# namespaces).
#
#   make verify             one million client requests shared by the modes
#                           hold and release_after_lease (VERIFY_REQUESTS),
#                           every fault kind, then the checker
#   make verify-short       the same for about a minute in all (the CI phase)
#
# VERIFY_SEED=N repeats a run (the seed is printed first); VERIFY_RATE sets
# the flows started per second; VERIFY_ARGS passes more options. A passed run
# keeps its report (report.md) under build/verify/; a failed one keeps all.
# The instance run under libfaketime is built with glibc's malloc
# ($(BUILD)/idemproxy-glibc-malloc, mk/shim.mk): libfaketime hangs at start
# under jemalloc.
VERIFY_REQUESTS       ?= 1000000
VERIFY_RATE           ?= 700
VERIFY_SEED           ?=
VERIFY_ARGS           ?=
VERIFY_SHORT_REQUESTS ?= 16000
VERIFY_SHORT_RATE     ?= 150
VERIFY_SHORT_SECONDS  ?= 20
VERIFY_CAMPAIGN := $(PYTHON) tests/verify/campaign.py $(if $(VERIFY_SEED),--seed $(VERIFY_SEED))

.PHONY: verify verify-short verify-bins verify-selftest
# The ledger, the load generator and the checker tested on their own first.
verify-selftest: $(VERIFY_PROGS)
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/verify

verify-bins: $(BUILD)/idemproxy $(VERIFY_PROGS) $(BUILD)/idemproxy-glibc-malloc

verify: verify-bins verify-selftest
	$(VERIFY_CAMPAIGN) --requests $(VERIFY_REQUESTS) --rate $(VERIFY_RATE) $(VERIFY_ARGS)

# Faults for the first half only, so that the flows in flight at the heal
# have the second half to reach a final state (invariant 6 judges them).
verify-short: verify-bins verify-selftest
	$(VERIFY_CAMPAIGN) --requests $(VERIFY_SHORT_REQUESTS) --rate $(VERIFY_SHORT_RATE) \
		--seconds $(VERIFY_SHORT_SECONDS) --short-ttl 5 --flow-ms 15000 \
		--fault-frac 0.5 $(VERIFY_ARGS)
