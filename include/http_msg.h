/* The parts of an HTTP message that every layer reads and none owns: a
 * list of header fields, in the order received, names as written. Below
 * the request job (job.h) and the key derivation (key_from.h) alike, so
 * that neither has to reach the other, nor the conf, for it. */
#ifndef IDEMPROXY_HTTP_MSG_H
#define IDEMPROXY_HTTP_MSG_H

#include <stddef.h>

#include "util.h"

typedef struct http_header {
	char *name;
	char *value;
} http_header;

typedef struct header_list {
	http_header *v;
	size_t n;
	size_t cap;
} header_list;

void header_list_add(header_list *l, const char *name, size_t name_len,
		     const char *value, size_t value_len);
/* First value of name (case-insensitive), or NULL. */
const char *header_list_get(const header_list *l, const char *name);
size_t header_list_count(const header_list *l, const char *name);
void header_list_free(header_list *l);

#endif
