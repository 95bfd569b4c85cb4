#include "trace_ctx.h"

#include <string.h>

/* HEXDIGLC: the spec's fields are lowercase hex only. */
static int hexdig_lc(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* n lowercase hex digits at p, not all of them '0' when nonzero is set. */
static bool hex_field(const char *p, size_t n, bool nonzero)
{
	bool any = false;
	for (size_t i = 0; i < n; i++) {
		int d = hexdig_lc(p[i]);
		if (d < 0)
			return false;
		any |= d != 0;
	}
	return any || !nonzero;
}

/* Version 00 is exactly "vv-<trace-id>-<parent-id>-<flags>", 55
 * characters. A higher version must start that way and either end there
 * or go on with a '-' (its later fields are not read); version ff is
 * invalid. */
bool trace_ctx_parse(const char *v, char out[TRACE_ID_HEX + 1])
{
	out[0] = '\0';
	if (!v)
		return false;
	size_t n = strnlen(v, 56);
	if (n < 55 || !hex_field(v, 2, false) || !memcmp(v, "ff", 2))
		return false;
	bool v00 = !memcmp(v, "00", 2);
	if (v00 ? n != 55 : (n > 55 && v[55] != '-'))
		return false;
	if (v[2] != '-' || v[35] != '-' || v[52] != '-')
		return false;
	if (!hex_field(v + 3, TRACE_ID_HEX, true) ||
	    !hex_field(v + 36, 16, true) || !hex_field(v + 53, 2, false))
		return false;
	memcpy(out, v + 3, TRACE_ID_HEX);
	out[TRACE_ID_HEX] = '\0';
	return true;
}

bool trace_ctx_of_headers(const header_list *h, char out[TRACE_ID_HEX + 1])
{
	out[0] = '\0';
	if (header_list_count(h, "traceparent") != 1)
		return false;
	return trace_ctx_parse(header_list_get(h, "traceparent"), out);
}

void trace_ctx_id_bytes(const char *hex, uint8_t out[TRACE_ID_LEN])
{
	for (int i = 0; i < TRACE_ID_LEN; i++)
		out[i] = (uint8_t)(hexdig_lc(hex[2 * i]) << 4 |
				   hexdig_lc(hex[2 * i + 1]));
}
