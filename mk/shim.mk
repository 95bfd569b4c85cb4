# Test aids preloaded into the proxy (LD_PRELOAD): a resolver that answers
# one host name slowly, or only once a gate file is gone
# (tests/shim/slow_resolver.c). Built on demand by the tests that use it.
$(BUILD)/slow_resolver.so: tests/shim/slow_resolver.c | $(BUILD)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror $(DEPFLAGS) -fPIC -shared -o $@ $< \
		-ldl -lpthread

# Header dependencies, as in the Makefile.
-include $(wildcard $(BUILD)/slow_resolver.d)

.PHONY: shim
shim: $(BUILD)/slow_resolver.so
