/* Fuzz target for durations and sizes as written in the conf file.
 *
 * The input, as a C string, goes to both parsers. Each answer is checked
 * against a plain reference reading of units.h (digits, then exactly one
 * known unit, overflow refused) and, when accepted, written back in the
 * smallest unit and parsed again. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"

struct unit {
	const char *suffix;
	int64_t factor;
};

static const struct unit durations[] = {
	{ "ms", 1 },     { "s", 1000 },       { "m", 60000 },
	{ "h", 3600000 }, { "d", 86400000 }, { NULL, 0 },
};

static const struct unit sizes[] = {
	{ "", 1 },
	{ "B", 1 },
	{ "KiB", INT64_C(1) << 10 },
	{ "MiB", INT64_C(1) << 20 },
	{ "GiB", INT64_C(1) << 30 },
	{ "KB", 1000 },
	{ "MB", 1000000 },
	{ "GB", 1000000000 },
	{ NULL, 0 },
};

static int reference(const char *s, const struct unit *units, int64_t *out)
{
	int64_t v = 0;
	size_t i = 0;

	for (; s[i] >= '0' && s[i] <= '9'; i++)
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, s[i] - '0', &v))
			return -1;
	if (i == 0)
		return -1;
	for (const struct unit *u = units; u->suffix; u++) {
		if (strcmp(s + i, u->suffix) != 0)
			continue;
		if (__builtin_mul_overflow(v, u->factor, out))
			return -1;
		return 0;
	}
	return -1;
}

typedef int (*parse_fn)(const char *, int64_t *);

static void check(parse_fn parse, const struct unit *units, const char *s,
		  const char *smallest)
{
	int64_t got = -1, want = -1, again = -1;
	char buf[40];

	int rc = parse(s, &got);
	ALWAYS_ASSERT(rc == 0 || rc == -1);
	ALWAYS_ASSERT(rc == reference(s, units, &want));
	if (rc < 0)
		return;
	ALWAYS_ASSERT(got == want && got >= 0);
	snprintf(buf, sizeof buf, "%" PRId64 "%s", got, smallest);
	ALWAYS_ASSERT(parse(buf, &again) == 0 && again == got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = xmalloc(size + 1);

	memcpy(s, data, size);
	s[size] = '\0';
	check(parse_duration_ms, durations, s, "ms");
	check(parse_size, sizes, s, "B");
	ALWAYS_ASSERT(parse_duration_ms(NULL, &(int64_t){ 0 }) == -1);
	free(s);
	return 0;
}
