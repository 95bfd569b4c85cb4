#include "http_msg.h"

#include <stdlib.h>
#include <string.h>

void header_list_add(header_list *l, const char *name, size_t name_len,
		     const char *value, size_t value_len)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 16;
		l->v = xrealloc(l->v, l->cap * sizeof *l->v);
	}
	l->v[l->n].name = xstrndup(name, name_len);
	l->v[l->n].value = xstrndup(value, value_len);
	l->n++;
}

const char *header_list_get(const header_list *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (str_caseeq(l->v[i].name, name))
			return l->v[i].value;
	return NULL;
}

size_t header_list_count(const header_list *l, const char *name)
{
	size_t n = 0;
	for (size_t i = 0; i < l->n; i++)
		if (str_caseeq(l->v[i].name, name))
			n++;
	return n;
}

void header_list_free(header_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->v[i].name);
		free(l->v[i].value);
	}
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}
