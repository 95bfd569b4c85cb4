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
