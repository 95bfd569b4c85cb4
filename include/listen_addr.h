/* Listening addresses and client addresses, for both listeners (the
 * front end and the admin API): kept apart from either so that neither
 * depends on the other. */
#ifndef IDEMPROXY_LISTEN_ADDR_H
#define IDEMPROXY_LISTEN_ADDR_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

struct sockaddr_storage;
/* A listen address as config_load validated it ("host:port" or
 * "[v6]:port"; an empty host: every address) into ss; *v6 when
 * it is an IPv6 address. 0, or -1 with err. */
int listen_addr_parse(const char *listen, struct sockaddr_storage *ss,
		      bool *v6, char *err, size_t errlen) MUST_CHECK;

struct MHD_Connection;
/* The connection's peer address as text; "unknown" when there is none. */
void listen_addr_peer(struct MHD_Connection *conn, char *out, size_t n);

#endif
