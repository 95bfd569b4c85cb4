/* Durations and sizes as written in the conf file. Pure, no I/O. */
#ifndef IDEMPROXY_UNITS_H
#define IDEMPROXY_UNITS_H

#include <stdint.h>

#include "util.h"

/* "250ms", "30s", "5m", "24h", "7d" -> milliseconds. A number with no unit
 * is rejected (ambiguous). Returns 0, or -1 for malformed / negative /
 * overflowing input. */
int parse_duration_ms(const char *s, int64_t *out_ms) MUST_CHECK;

/* "512KiB", "1MiB", "2GiB", "100B", or a bare byte count "1024" -> bytes.
 * Also accepts KB/MB/GB as decimal (1000-based). Returns 0 or -1. */
int parse_size(const char *s, int64_t *out_bytes) MUST_CHECK;

#endif
