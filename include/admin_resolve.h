/* POST /admin/keys/{tenant}/{operation}/{key}/resolve: an operator who
 * learned the outcome of a held attempt from the upstream records it,
 * either the response the upstream gave (replayed to the next retry) or
 * "executed, no answer to give" (the next retry is told the operation
 * completed). Fenced by the attempt number or owner token the operator
 * saw; audited in the log and counted. */
#ifndef IDEMPROXY_ADMIN_RESOLVE_H
#define IDEMPROXY_ADMIN_RESOLVE_H

#include <stddef.h>

#include "admin_keys.h"
#include "config.h"

/* The largest request body the endpoint reads, for a configuration whose
 * max_stored_response is max_stored (base64 and JSON around it). */
size_t admin_resolve_max_request(int64_t max_stored);

/* With the store locked by the caller. part: tenant, operation, key. */
void admin_keys_resolve(store_admin *st, const config *cfg, const char *who,
			const char *const part[3], const char *body, size_t len,
			admin_answer *out);

#endif
