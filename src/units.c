/* Durations and sizes as written in the conf file.
 *
 * Both parsers are deliberately strict: an operator who writes "1.5s",
 * "10 s" or "-5m" made a mistake we would rather report than guess at. */
#include "units.h"

#include <string.h>

struct unit {
	const char *suffix;
	int64_t factor;
};

static const struct unit duration_units[] = {
	{ "ms", 1 },
	{ "s", 1000 },
	{ "m", 60 * 1000 },
	{ "h", 60 * 60 * 1000 },
	{ "d", 24 * 60 * 60 * 1000 },
	{ NULL, 0 },
};

static const struct unit size_units[] = {
	{ "", 1 },
	{ "B", 1 },
	{ "KiB", (int64_t)1 << 10 },
	{ "MiB", (int64_t)1 << 20 },
	{ "GiB", (int64_t)1 << 30 },
	{ "KB", 1000 },
	{ "MB", 1000 * 1000 },
	{ "GB", 1000 * 1000 * 1000 },
	{ NULL, 0 },
};

/* Reads the leading run of ASCII digits into *out; returns the number of
 * digits consumed (0 when there are none) or -1 on overflow. No sign, no
 * whitespace: strtoll would accept both, which we do not want. */
static int parse_digits(const char *s, int64_t *out, size_t *consumed)
{
	int64_t v = 0;
	size_t i = 0;

	for (; s[i] >= '0' && s[i] <= '9'; i++) {
		int d = s[i] - '0';
		if (v > (INT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	*consumed = i;
	return 0;
}

static int parse_with_units(const char *s, const struct unit *units,
			    int64_t *out)
{
	int64_t n;
	size_t used;

	if (s == NULL)
		return -1;
	if (parse_digits(s, &n, &used) < 0 || used == 0)
		return -1;
	for (const struct unit *u = units; u->suffix != NULL; u++) {
		if (strcmp(s + used, u->suffix) != 0)
			continue;
		if (n > INT64_MAX / u->factor)
			return -1;
		*out = n * u->factor;
		return 0;
	}
	return -1;
}

int parse_duration_ms(const char *s, int64_t *out_ms)
{
	return parse_with_units(s, duration_units, out_ms);
}

int parse_size(const char *s, int64_t *out_bytes)
{
	return parse_with_units(s, size_units, out_bytes);
}
