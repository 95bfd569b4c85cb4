#include "listen_addr.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"

int listen_addr_parse(const char *listen, struct sockaddr_storage *ss,
		      bool *v6, char *err, size_t errlen)
{
	char host[256], port[16];
	int portnum;
	if (config_split_listen(listen, host, sizeof host, &portnum, err,
				errlen))
		return -1;
	snprintf(port, sizeof port, "%d", portnum);
	size_t hl = strlen(host);
	struct addrinfo hints = {0}, *res = NULL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	int rc = getaddrinfo(hl ? host : NULL, port, &hints, &res);
	if (rc || !res) {
		snprintf(err, errlen, "listen address %s: %s", listen,
			 gai_strerror(rc));
		return -1;
	}
	memset(ss, 0, sizeof *ss);
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*v6 = res->ai_family == AF_INET6;
	freeaddrinfo(res);
	return 0;
}

void listen_addr_peer(struct MHD_Connection *conn, char *out, size_t n)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	snprintf(out, n, "unknown");
	if (!ci || !ci->client_addr)
		return;
	const struct sockaddr *sa = ci->client_addr;
	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr,
			  out, (socklen_t)n);
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6,
			  &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
			  (socklen_t)n);
}
