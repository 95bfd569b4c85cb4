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

/* Has migration `version` been applied? (A query naming schema_migrations
 * fails when there is none yet: ask in two steps.) */
static int applied(PGconn *c, int version, bool *yes, char *err,
		   size_t errlen)
{
	*yes = false;
	bool table = false;
	if (ask(c, "SELECT to_regclass('schema_migrations') IS NOT NULL",
		&table, err, errlen))
		return -1;
	if (!table)
		return 0;
	char sql[128];
	snprintf(sql, sizeof sql,
		 "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE "
		 "version = %d)",
		 version);
	return ask(c, sql, yes, err, errlen);
}

static int stage_003(PGconn *c, const config *cfg, char *err, size_t errlen)
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

/* Each jwt route's operation and the prefix its tenants get
 * ("jwt:ISSUER:", the issuer escaped as decide.c stores it). */
static int stage_010(PGconn *c, const config *cfg, char *err, size_t errlen)
{
	if (exec(c,
		 "CREATE TABLE IF NOT EXISTS idemproxy_tenant_issuers_010 ("
		 "operation text PRIMARY KEY, prefix text NOT NULL)",
		 0, NULL, err, errlen))
		return -1;
	for (size_t i = 0; i < cfg->n_routes; i++) {
		const route_cfg *r = &cfg->routes[i];
		if (r->tenant_kind != TENANT_JWT || !r->jwt)
			continue;
		char iss[ROUTE_JWT_ISSUER_MAX + 1], prefix[sizeof iss + 8];
		pct_escape(r->jwt->issuer, iss, sizeof iss);
		snprintf(prefix, sizeof prefix, "jwt:%s:", iss);
		const char *vals[2] = {r->name, prefix};
		if (exec(c,
			 "INSERT INTO idemproxy_tenant_issuers_010 "
			 "(operation, prefix) VALUES ($1, $2) "
			 "ON CONFLICT (operation) DO UPDATE SET prefix = "
			 "EXCLUDED.prefix",
			 2, vals, err, errlen))
			return -1;
	}
	return 0;
}

typedef int (*stage_fn)(PGconn *, const config *, char *, size_t);

/* Stages what migration `version` reads, or drops a table left behind
 * once it has been applied. */
static int stage_one(PGconn *c, const config *cfg, int version,
		     const char *table, stage_fn fn, char *err, size_t errlen)
{
	bool done = false;
	if (applied(c, version, &done, err, errlen))
		return -1;
	if (!done)
		return fn(c, cfg, err, errlen);
	char sql[128];
	snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s", table);
	return exec(c, sql, 0, NULL, err, errlen);
}

int tenant_upgrade_stage(const config *cfg, char *err, size_t errlen)
{
	pg_link l;
	pg_link_init(&l, cfg->db_url, "idemproxy-migrate",
		     cfg->statement_timeout_ms);
	int rc = -1;
	if (pg_link_connect(&l, NULL, err, errlen))
		goto out;
	rc = stage_one(l.conn, cfg, 3, "idemproxy_tenant_sources_003",
		       stage_003, err, errlen);
	if (!rc)
		rc = stage_one(l.conn, cfg, 10, "idemproxy_tenant_issuers_010",
			       stage_010, err, errlen);
out:
	pg_link_close(&l);
	return rc;
}
