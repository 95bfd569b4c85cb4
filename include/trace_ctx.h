/* W3C Trace Context (https://www.w3.org/TR/trace-context/): the trace id
 * of a request's traceparent header, for logs and records. The proxy does
 * not take part in tracing: it never changes, adds or removes traceparent
 * or tracestate (doc/security.md#trace-context), it only reads the trace
 * id of a valid value. Pure: no I/O. */
#ifndef IDEMPROXY_TRACE_CTX_H
#define IDEMPROXY_TRACE_CTX_H

#include <stdbool.h>
#include <stdint.h>

#include "http_msg.h"

#define TRACE_ID_HEX 32 /* lowercase hex digits of a trace id */
#define TRACE_ID_LEN 16 /* its bytes */

/* true when v is a valid traceparent value (version 00 exactly, or a
 * higher version read by the version 00 prefix), with its trace id in out
 * as TRACE_ID_HEX lowercase hex digits and a NUL; out is "" otherwise. */
bool trace_ctx_parse(const char *v, char out[TRACE_ID_HEX + 1]);

/* As trace_ctx_parse for a request's one traceparent header: none, or
 * more than one (the spec's test suite treats duplicates as invalid),
 * leaves out "". */
bool trace_ctx_of_headers(const header_list *h, char out[TRACE_ID_HEX + 1]);

/* The bytes of a trace id trace_ctx_parse gave. */
void trace_ctx_id_bytes(const char *hex, uint8_t out[TRACE_ID_LEN]);

#endif
