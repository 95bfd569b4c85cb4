#include "sqlsplit.h"

#include <string.h>

static bool ident_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c == '$' ||
	       (unsigned char)c >= 0x80;
}

static bool tag_char(char c, bool first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
	       (unsigned char)c >= 0x80 || (!first && c >= '0' && c <= '9');
}

/* Length of a dollar-quote tag ("$" name "$") at s, or 0 if there is none
 * ($1 is a parameter; a $ inside an identifier is part of it). */
static size_t dollar_tag(const char *sql, const char *s)
{
	if (s > sql && ident_char(s[-1]))
		return 0;
	size_t n = 1;
	while (s[n] && tag_char(s[n], n == 1))
		n++;
	return s[n] == '$' ? n + 1 : 0;
}

/* Past the quoted text that opens at s (q: its quote character; backslash
 * escapes the next byte when esc). */
static const char *past_quoted(const char *s, char q, bool esc)
{
	for (s++; *s; s++) {
		if (esc && *s == '\\' && s[1])
			s++;
		else if (*s == q) {
			if (s[1] != q)
				return s + 1;
			s++;
		}
	}
	return s;
}

static const char *past_block_comment(const char *s)
{
	int depth = 0;
	while (*s) {
		if (s[0] == '/' && s[1] == '*') {
			depth++;
			s += 2;
		} else if (s[0] == '*' && s[1] == '/') {
			s += 2;
			if (--depth == 0)
				return s;
		} else
			s++;
	}
	return s;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
	       c == '\v';
}

/* Past space and comments. */
static const char *skip_blank(const char *s)
{
	for (;;) {
		while (is_space(*s))
			s++;
		if (s[0] == '-' && s[1] == '-') {
			s += strcspn(s, "\n");
		} else if (s[0] == '/' && s[1] == '*') {
			s = past_block_comment(s);
		} else
			return s;
	}
}

bool sql_next_statement(const char *sql, size_t *pos, const char **start,
			size_t *len)
{
	const char *s = skip_blank(sql + *pos);
	while (*s == ';')
		s = skip_blank(s + 1);
	if (!*s) {
		*pos = (size_t)(s - sql);
		return false;
	}
	*start = s;
	const char *end = NULL;
	while (*s && !end) {
		size_t tag;
		if (*s == ';') {
			end = s;
		} else if (*s == '\'') {
			bool e = s > sql && (s[-1] == 'E' || s[-1] == 'e') &&
				 (s - 1 == sql || !ident_char(s[-2]));
			s = past_quoted(s, '\'', e);
		} else if (*s == '"') {
			s = past_quoted(s, '"', false);
		} else if (s[0] == '-' && s[1] == '-') {
			s += strcspn(s, "\n");
		} else if (s[0] == '/' && s[1] == '*') {
			s = past_block_comment(s);
		} else if (*s == '$' && (tag = dollar_tag(sql, s)) > 0) {
			const char *body = s + tag;
			const char *close = memmem(body, strlen(body), s, tag);
			s = close ? close + tag : body + strlen(body);
		} else
			s++;
	}
	const char *stop = end ? end : s;
	while (stop > *start && is_space(stop[-1]))
		stop--;
	*len = (size_t)(stop - *start);
	*pos = (size_t)((end ? end + 1 : s) - sql);
	return true;
}
