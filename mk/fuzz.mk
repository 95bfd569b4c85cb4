# libFuzzer targets, one per parser (tests/fuzz/fuzz_*.c), built with clang
# and ASan+UBSan into build-fuzz/ from only the sources each parser needs.
#
#   make fuzz-build             build every target
#   make fuzz                   build, then fuzz each for FUZZ_SECONDS (30)
#   make fuzz FUZZ_TARGETS=json FUZZ_SECONDS=600
#
# Seeds are in tests/fuzz/corpus/<target>/; crashes found earlier are kept
# in tests/fuzz/crashes/<target>/ and replayed first (see tests/fuzz/run.sh).

FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_TARGETS ?= key_header json pathtpl units config keys jsonptr jwt http_head

FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS := -O1 -g -fno-omit-frame-pointer $(FUZZ_SAN) -std=gnu11 \
               -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-unused-parameter \
               -D_GNU_SOURCE -Iinclude \
               $(shell pkg-config --cflags jansson libcrypto libconfig jose 2>/dev/null)
FUZZ_LIBS   := $(shell pkg-config --libs jansson libcrypto libconfig jose 2>/dev/null) \
               -lpthread

# The sources each target links: the parser and what it calls, no I/O layers.
fuzz_objs = $(patsubst %,$(FUZZ_BUILD)/obj/%.o,$(1) util)
FUZZ_DEPS_key_header := $(call fuzz_objs,key_header)
FUZZ_DEPS_json       := $(call fuzz_objs,fingerprint jsonptr)
FUZZ_DEPS_pathtpl    := $(call fuzz_objs,pathtpl)
FUZZ_DEPS_units      := $(call fuzz_objs,units)
FUZZ_DEPS_config     := $(call fuzz_objs,config config_conv config_route route \
			pathtpl units seal key_from \
			jsonptr jwt_auth fingerprint key_header http_msg problem)
FUZZ_DEPS_keys       := $(call fuzz_objs,seal)
FUZZ_DEPS_jsonptr    := $(call fuzz_objs,jsonptr)
FUZZ_DEPS_jwt        := $(call fuzz_objs,jwt_auth)
FUZZ_DEPS_http_head  := $(call fuzz_objs,http_head)

FUZZ_BINS := $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_TARGETS))
FUZZ_OBJS := $(sort $(foreach t,$(FUZZ_TARGETS),$(FUZZ_DEPS_$(t))))

# Reached only through the pattern rule below; keep them between builds.
.SECONDARY: $(FUZZ_OBJS)

# Header dependencies, as in the Makefile.
$(call with_no_d,$(FUZZ_OBJS) $(FUZZ_BINS)): $(wildcard include/*.h)
-include $(wildcard $(FUZZ_OBJS:.o=.d) $(FUZZ_BINS:=.d))

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

$(FUZZ_BUILD)/obj:
	@mkdir -p $@

# fuzzer-no-link: coverage instrumentation without libFuzzer's main().
$(FUZZ_BUILD)/obj/%.o: src/%.c | $(FUZZ_BUILD)/obj pkg-check
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

.SECONDEXPANSION:
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_DEPS_$$*)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer -o $@ $< \
		$(FUZZ_DEPS_$*) $(FUZZ_LIBS)
