/* What the store's server offers for durability (durability.h), read on
 * the store's own connection. */
#ifndef IDEMPROXY_STORE_PG_DURABILITY_H
#define IDEMPROXY_STORE_PG_DURABILITY_H

#include <stddef.h>

#include "durability.h"
#include "store_pg.h"

/* Reads synchronous_commit, synchronous_standby_names and the standbys
 * attached in sync or quorum state (pg_stat_replication; -1 when the role
 * cannot see sync_state) into d, and judges them (durability_judge). */
int store_read_durability(store *s, store_durability *d, char *err,
			  size_t errlen) MUST_CHECK;

/* "host:port pid" of the connection in place ("" without one): it
 * changes when the connection is made again, to the same server or to
 * another after a failover. */
void store_server_id(const store *s, char *out, size_t n);

#endif
