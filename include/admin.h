/* The admin listener: /healthz, /readyz, /metrics. */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include <stdbool.h>

#include "util.h"

typedef struct admin admin;

typedef struct admin_opts {
	const char *listen;
	/* 0 when the store answers and its schema is current; else -1 with
	 * a reason. Called from the admin thread. */
	int (*ready)(void *arg, char *err, size_t errlen);
	void *arg;
} admin_opts;

admin *admin_start(const admin_opts *o, char *err, size_t errlen) IP_WUR;
void admin_stop(admin *a);

#endif
