/* The store's schema: its version and migrations, the NOTIFY secret, and
 * the Citus layout of the records. Each call runs on a plain connection of
 * its own. */
#ifndef IDEMPROXY_STORE_PG_SCHEMA_H
#define IDEMPROXY_STORE_PG_SCHEMA_H

#include "store_pg.h"

/* Schema: the highest applied migration (0 if none). */
int store_schema_version(store *s, int *version, char *err,
			 size_t errlen) MUST_CHECK;
/* Applies the embedded migrations the database lacks; *applied counts them. */
int store_migrate(store *s, int *applied, char *err, size_t errlen) MUST_CHECK;
/* The secret that keys the NOTIFY payloads (migration 011), read once at
 * start; every instance reads the same one. */
int store_wake_key_read(store *s, wake_key *out, char *err,
			size_t errlen) MUST_CHECK;
/* The version this binary expects (the highest embedded migration). */
int store_expected_version(void);

/* How the records are laid out on this database. */
enum store_layout {
	STORE_PLAIN,             /* no citus extension */
	STORE_CITUS_LOCAL,       /* citus, the table absent or not distributed */
	STORE_CITUS_OTHER,       /* distributed, but not by hash of tenant */
	STORE_CITUS_PARTIAL,     /* by tenant; a function not distributed */
	STORE_CITUS_DISTRIBUTED, /* by tenant, the functions with it */
};
int store_layout_get(store *s, enum store_layout *out, char *err,
		     size_t errlen) MUST_CHECK;
/* One line saying how the layout disagrees with the setting, or NULL. */
const char *store_layout_mismatch(enum store_layout l, bool citus);
/* On a Citus coordinator, after store_migrate: distributes the records by
 * tenant (copying the rows of a store migrated plain; *converted then) if
 * not done yet, and the proxy's functions with them. Idempotent. */
int store_distribute(store *s, bool *converted, char *err,
		     size_t errlen) MUST_CHECK;

#endif
