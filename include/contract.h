/* The idempotency rules of a conf as a document: OpenAPI 3.1 for every
 * protected route (path, methods, where the key comes from, every problem
 * the route can answer, and an x-idempotency object with the rules), or
 * the rules alone as plain JSON. Made from the conf only: no store, no
 * network. Served by --contract, the admin listener and, with
 * contract_path, the public listener. */
#ifndef IDEMPROXY_CONTRACT_H
#define IDEMPROXY_CONTRACT_H

#include <stddef.h>

#include "config.h"

/* The IETF draft whose header the proxy implements. */
#define CONTRACT_DRAFT "draft-ietf-httpapi-idempotency-key-header-07"
/* application/json rather than the proposed application/openapi+json:
 * every client and OpenAPI tool reads it, and the latter is not
 * registered. */
#define CONTRACT_MEDIA_TYPE "application/json"

enum contract_form {
	CONTRACT_OPENAPI, /* the OpenAPI 3.1 document */
	CONTRACT_RULES,   /* {"x-idempotency": ..., "routes": [...]} */
};

/* The document for cfg, indented JSON ending in a newline, malloc'd.
 * Made once per configuration snapshot and form: a snapshot never
 * changes, and a reload brings a new one. */
char *contract_document(config *cfg, enum contract_form form, size_t *len);

#endif
