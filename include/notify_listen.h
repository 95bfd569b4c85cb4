/* The one LISTEN connection of an instance: it receives the wake-ups that
 * other instances (and this one's other sessions) send when they record a
 * waited-for record, and reconnects with backoff when the connection
 * breaks. Notifications sent while it was away are lost, so after every
 * (re)connect it says so, and every waiter claims again. */
#ifndef IDEMPROXY_NOTIFY_LISTEN_H
#define IDEMPROXY_NOTIFY_LISTEN_H

#include <stdint.h>

#include "wake.h"

typedef struct notify_listen_ops {
	void (*wake)(void *arg, const uint8_t scope[WAKE_SCOPE_LEN]);
	void (*connected)(void *arg); /* LISTEN is in force (again) */
	void *arg;
} notify_listen_ops;

typedef struct notify_listen notify_listen;

notify_listen *notify_listen_start(const char *db_url,
				   const notify_listen_ops *ops);
void notify_listen_stop(notify_listen *n);

#endif
