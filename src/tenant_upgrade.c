#include "tenant_upgrade.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>

#include "pg_link.h"

static int exec(PGconn *c, const char *sql, int n, const char *const *vals,
		char *err, size_t errlen)
{
	PGresult *r = PQexecParams(c, sql, n, NULL, vals, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	int rc = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, "tenant upgrade",
			    PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

/* One boolean from sql, into *yes. */
static int ask(PGconn *c, const char *sql, bool *yes, char *err,
	       size_t errlen)
{
	PGresult *r = PQexec(c, sql);
	int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, "tenant upgrade",
			    PQresultErrorMessage(r));
	else
		*yes = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return rc;
}

/* Has migration 003 been applied? (A query naming schema_migrations fails
 * when there is none yet: ask in two steps.) */
static int applied(PGconn *c, bool *yes, char *err, size_t errlen)
{
	*yes = false;
	bool table = false;
	if (ask(c, "SELECT to_regclass('schema_migrations') IS NOT NULL",
		&table, err, errlen))
		return -1;
	if (!table)
		return 0;
	return ask(c,
		   "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE "
		   "version = 3)",
		   yes, err, errlen);
}

static int stage(PGconn *c, const config *cfg, char *err, size_t errlen)
{
	if (exec(c,
		 "CREATE TABLE IF NOT EXISTS idemproxy_tenant_sources_003 ("
		 "operation text PRIMARY KEY, source text NOT NULL)",
		 0, NULL, err, errlen))
		return -1;
	for (size_t i = 0; i < cfg->n_routes; i++) {
		const route_cfg *r = &cfg->routes[i];
		const char *src = r->tenant_kind == TENANT_HEADER ? "header"
				  : r->tenant_kind == TENANT_AUTHORIZATION
					  ? "authorization"
					  : NULL;
		if (!src)
			continue;
		const char *vals[2] = {r->name, src};
		if (exec(c,
			 "INSERT INTO idemproxy_tenant_sources_003 "
			 "(operation, source) VALUES ($1, $2) "
			 "ON CONFLICT (operation) DO UPDATE SET source = "
			 "EXCLUDED.source",
			 2, vals, err, errlen))
			return -1;
	}
	return 0;
}

int tenant_upgrade_stage(const config *cfg, char *err, size_t errlen)
{
	pg_link l;
	pg_link_init(&l, cfg->db_url, "idemproxy-migrate",
		     cfg->statement_timeout_ms);
	int rc = -1;
	bool done = false;
	if (pg_link_connect(&l, NULL, err, errlen) ||
	    applied(l.conn, &done, err, errlen))
		goto out;
	if (done)
		rc = exec(l.conn,
			  "DROP TABLE IF EXISTS idemproxy_tenant_sources_003",
			  0, NULL, err, errlen);
	else
		rc = stage(l.conn, cfg, err, errlen);
out:
	pg_link_close(&l);
	return rc;
}
