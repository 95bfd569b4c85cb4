/* The conf-dependent halves of migrations 003 (sql/003_tenant_sources.sql:
 * which operations' stored tenants came from a header or from
 * Authorization, for --migrate to prefix once) and 010
 * (sql/010_jwt_tenant_issuer.sql: the issuer each jwt route's tenants are
 * scoped by). */
#ifndef IDEMPROXY_TENANT_UPGRADE_H
#define IDEMPROXY_TENANT_UPGRADE_H

#include <stddef.h>

#include "config.h"

/* When the database has not had migration 003 yet, writes each route of
 * cfg whose tenant source is a header or Authorization, with its source,
 * into the table migration 003 reads; when it has, drops a table left
 * behind. Likewise for 010 and each jwt route with its issuer. Run before
 * store_migrate. 0 or -1 with err. */
int tenant_upgrade_stage(const config *cfg, char *err,
			 size_t errlen) MUST_CHECK;

#endif
