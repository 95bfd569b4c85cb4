/* The Idempotency-Key header value (SPEC 3.1).
 *
 * The key decides which record a request reads and writes, so anything we
 * cannot read in exactly one way is refused rather than normalised: two
 * clients must never reach the same record through different spellings
 * except the one equivalence the spec allows ("abc" == abc). */
#include "key_header.h"

#include <stdbool.h>

static const char WHY_EMPTY[] = "the key is empty";
static const char WHY_LONG[] = "the key is longer than 255 characters";
static const char WHY_CTL[] =
	"the key contains a control character or non-ASCII byte";
static const char WHY_LIST[] = "the key is a list; send exactly one key";
static const char WHY_ESCAPE[] =
	"bad escape in quoted key (only \\\" and \\\\ are allowed)";
static const char WHY_UNTERMINATED[] = "unterminated quoted key";
static const char WHY_BARE_CHAR[] =
	"the unquoted key contains a space, '\"', ';' or '\\'; "
	"send it as a quoted string";
static const char WHY_TRAILING[] = "unexpected characters after the quoted key";
static const char WHY_PARAMS[] = "malformed parameters after the quoted key";

static bool is_ows(unsigned char c)
{
	return c == ' ' || c == '\t';
}

/* Visible ASCII or SP: everything an sf-string may carry. */
static bool is_sf_char(unsigned char c)
{
	return c >= 0x20 && c <= 0x7e;
}

/* RFC 9651 keys are lower-case; upper case is tolerated because the
 * parameters are ignored anyway and refusing them would only hurt clients. */
static bool is_key_start(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '*';
}

static bool is_key_char(unsigned char c)
{
	return is_key_start(c) || (c >= '0' && c <= '9') || c == '_' ||
	       c == '-' || c == '.';
}

/* Parses an sf-string starting at s[*pos] == '"'. With out != NULL the
 * unquoted bytes are stored (at most KEY_LEN_MAX); parameters reuse this
 * with out == NULL to skip a quoted value. */
static int parse_sf_string(const char *s, size_t len, size_t *pos, char *out,
			   size_t *out_len, const char **why)
{
	size_t i = *pos + 1;
	size_t n = 0;

	for (; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"') {
			*pos = i + 1;
			if (out_len)
				*out_len = n;
			return 0;
		}
		if (!is_sf_char(c)) {
			*why = WHY_CTL;
			return -1;
		}
		if (c == '\\') {
			if (i + 1 >= len) {
				*why = WHY_UNTERMINATED;
				return -1;
			}
			c = (unsigned char)s[++i];
			if (c != '"' && c != '\\') {
				*why = is_sf_char(c) ? WHY_ESCAPE : WHY_CTL;
				return -1;
			}
		}
		if (out) {
			if (n >= KEY_LEN_MAX) {
				*why = WHY_LONG;
				return -1;
			}
			out[n] = (char)c;
		}
		n++;
	}
	*why = WHY_UNTERMINATED;
	return -1;
}

/* A parameter value that is not a string: a token, number, boolean,
 * byte sequence or date. Their exact grammar does not matter (they are
 * ignored); what matters is where they end. */
static bool is_param_value_char(unsigned char c)
{
	return c > 0x20 && c < 0x7f && c != '"' && c != ',' && c != ';' &&
	       c != '\\';
}

/* RFC 9651 parameters: *( ";" *SP key [ "=" bare-item ] ). Their contents
 * are ignored, but they are parsed so that a list ("a";p=1, "b") or
 * garbage after them is still recognised. */
static int parse_params(const char *s, size_t len, size_t *pos,
			const char **why)
{
	size_t i = *pos;

	while (i < len && s[i] == ';') {
		i++;
		while (i < len && s[i] == ' ')
			i++;
		if (i >= len || !is_key_start((unsigned char)s[i]))
			goto bad;
		while (i < len && is_key_char((unsigned char)s[i]))
			i++;
		if (i >= len || s[i] != '=')
			continue;
		i++;
		if (i < len && s[i] == '"') {
			if (parse_sf_string(s, len, &i, NULL, NULL, why) < 0)
				return -1;
			continue;
		}
		size_t start = i;
		while (i < len && is_param_value_char((unsigned char)s[i]))
			i++;
		if (i == start)
			goto bad;
	}
	*pos = i;
	return 0;
bad:
	/* Report a control byte as such, whatever position it is in. */
	*why = (i < len && !is_sf_char((unsigned char)s[i]) && s[i] != '\t')
		       ? WHY_CTL
		       : WHY_PARAMS;
	return -1;
}

static int parse_quoted(const char *s, size_t len, char *out, size_t *out_len,
			const char **why)
{
	size_t pos = 0;
	size_t n;

	if (parse_sf_string(s, len, &pos, out, &n, why) < 0)
		return -1;
	if (parse_params(s, len, &pos, why) < 0)
		return -1;
	/* Only OWS may follow; a comma after it would start a second member. */
	while (pos < len && is_ows((unsigned char)s[pos]))
		pos++;
	if (pos < len) {
		unsigned char c = (unsigned char)s[pos];
		if (c == ',')
			*why = WHY_LIST;
		else if (!is_sf_char(c))
			*why = WHY_CTL;
		else
			*why = WHY_TRAILING;
		return -1;
	}
	if (n == 0) {
		*why = WHY_EMPTY;
		return -1;
	}
	out[n] = '\0';
	*out_len = n;
	return 0;
}

static int parse_bare(const char *s, size_t len, char *out, size_t *out_len,
		      const char **why)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c >= 0x7f) {
			*why = WHY_CTL;
			return -1;
		}
		if (c == ',') {
			*why = WHY_LIST;
			return -1;
		}
		if (c == ' ' || c == '\t' || c == '"' || c == ';' || c == '\\') {
			*why = WHY_BARE_CHAR;
			return -1;
		}
		if (i >= KEY_LEN_MAX) {
			*why = WHY_LONG;
			return -1;
		}
		out[i] = (char)c;
	}
	out[len] = '\0';
	*out_len = len;
	return 0;
}

int key_header_parse(const char *value, size_t len, char out[KEY_LEN_MAX + 1],
		     size_t *out_len, const char **why)
{
	const char *dummy;

	if (why == NULL)
		why = &dummy;
	if (value == NULL) {
		*why = WHY_EMPTY;
		return -1;
	}
	while (len > 0 && is_ows((unsigned char)value[0])) {
		value++;
		len--;
	}
	while (len > 0 && is_ows((unsigned char)value[len - 1]))
		len--;
	if (len == 0) {
		*why = WHY_EMPTY;
		return -1;
	}
	if (value[0] == '"')
		return parse_quoted(value, len, out, out_len, why);
	return parse_bare(value, len, out, out_len, why);
}
