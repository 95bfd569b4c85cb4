# Test aids preloaded into the proxy (LD_PRELOAD): a resolver that answers
# one host name slowly, or only once a gate file is gone
# (tests/shim/slow_resolver.c). Built on demand by the tests that use it.
$(BUILD)/slow_resolver.so: tests/shim/slow_resolver.c | $(BUILD)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror $(DEPFLAGS) -fPIC -shared -o $@ $< \
		-ldl -lpthread

# Header dependencies, as in the Makefile.
-include $(wildcard $(BUILD)/slow_resolver.d)

# A wall clock stepped away from the kernel's (tests/shim/clock_step.c).
$(BUILD)/clock_step.so: tests/shim/clock_step.c | $(BUILD)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror $(DEPFLAGS) -fPIC -shared -o $@ $<

-include $(wildcard $(BUILD)/clock_step.d)

# A stall of the serving thread right before an upstream transfer starts
# (tests/shim/stall_transfer.c).
$(BUILD)/stall_transfer.so: tests/shim/stall_transfer.c | $(BUILD)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror $(DEPFLAGS) -fPIC -shared -o $@ $< -ldl

-include $(wildcard $(BUILD)/stall_transfer.d)

.PHONY: shim
shim: $(BUILD)/slow_resolver.so $(BUILD)/clock_step.so $(BUILD)/stall_transfer.so

# The proxy linked with glibc's malloc instead of $(MALLOC), for the tests
# that preload libfaketime (tests/integration/test_clock_skew.py): at start
# libfaketime 0.9.10 and jemalloc call into each other until libfaketime
# gives up (jemalloc's first clock read enters libfaketime's set-up, whose
# failed symbol look-ups allocate).
$(BUILD)/idemproxy-glibc-malloc: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(filter-out -l$(MALLOC),$(LDLIBS))
