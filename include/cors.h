/* Cross-origin answers (Fetch standard, CORS protocol): browser code sees
 * only the CORS-safelisted response headers and those the answer names in
 * Access-Control-Expose-Headers. The proxy adds headers of its own to the
 * upstream's answers (Idempotent-Replayed, Preference-Applied); where the
 * upstream lets an origin read its answer, the proxy lets that origin read
 * those too. It never grants CORS access the upstream did not grant. */
#ifndef IDEMPROXY_CORS_H
#define IDEMPROXY_CORS_H

#include <stdbool.h>

#include "http_msg.h"

/* A CORS preflight (OPTIONS with Access-Control-Request-Method). */
bool cors_is_preflight(const char *method, const header_list *req);

/* When resp carries Access-Control-Allow-Origin and answers no preflight,
 * merges the proxy's own header names into its Access-Control-Expose-
 * Headers: one field, the upstream's names first (as written, without
 * duplicates, compared case-insensitively), then the missing ones. Leaves
 * resp as it is when nothing is missing, or when the upstream exposed "*"
 * and does not allow credentials (the wildcard then covers every header;
 * for a credentialed request "*" is only a name, Fetch 3.2.3). */
void cors_expose_own(const char *method, const header_list *req,
		     header_list *resp);

#endif
