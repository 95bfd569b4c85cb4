/* The store's schema (store_pg_schema.h): its version, the embedded
 * migrations, the NOTIFY secret, and the Citus layout. All of it runs on
 * a plain connection of its own, without the prepared statements. */
#include "store_pg_schema.h"

#include <stdio.h>

#include "migrations.h"
#include "sqlsplit.h"
#include "store_pg_int.h"

/* Schema management runs on a plain connection: the prepared statements need
 * the schema, which may not exist yet. */
static PGconn *plain_connect(store *s, char *err, size_t errlen)
{
	const char *keys[] = {"connect_timeout", PG_LINK_TCP_KEYS,
			      "application_name", "dbname", NULL};
	const char *vals[] = {"5", PG_LINK_TCP_VALS, "idemproxy", s->link.url,
			      NULL};
	PGconn *c = PQconnectdbParams(keys, vals, 1);
	if (!c || PQstatus(c) != CONNECTION_OK) {
		pg_link_err(err, errlen, "connect",
			    c ? PQerrorMessage(c) : "out of memory");
		if (c)
			PQfinish(c);
		return NULL;
	}
	pg_link_quiet(c);
	return c;
}

static bool has_version(const PGresult *r, int v)
{
	for (int i = 0; i < PQntuples(r); i++)
		if (atoi(PQgetvalue(r, i, 0)) == v)
			return true;
	return false;
}

/* The applied migrations (NULL result: none yet), or -1. */
static int applied_on(PGconn *c, PGresult **out, char *err, size_t errlen)
{
	*out = NULL;
	PGresult *r = PQexec(c, "SELECT to_regclass('schema_migrations') IS "
				"NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "schema", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	bool exists = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	if (!exists)
		return 0;
	r = PQexec(c, "SELECT version FROM schema_migrations");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "schema", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	*out = r;
	return 0;
}

/* The schema's version: the last embedded migration before the first one
 * missing (migrations are numbered apart by the branches that add them, so
 * a database may have a later one without an earlier one), or, with all of
 * them applied, the highest applied (a newer binary's). */
static int version_on(PGconn *c, int *version, char *err, size_t errlen)
{
	PGresult *r;
	*version = 0;
	if (applied_on(c, &r, err, errlen))
		return -1;
	if (!r)
		return 0;
	bool all = true;
	for (int i = 0; i < n_embedded_migrations && all; i++) {
		if (has_version(r, embedded_migrations[i].version))
			*version = embedded_migrations[i].version;
		else
			all = false;
	}
	for (int i = 0; all && i < PQntuples(r); i++)
		if (atoi(PQgetvalue(r, i, 0)) > *version)
			*version = atoi(PQgetvalue(r, i, 0));
	PQclear(r);
	return 0;
}

int store_schema_version(store *s, int *version, char *err, size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = version_on(c, version, err, errlen);
	PQfinish(c);
	return rc;
}

int store_wake_key_read(store *s, wake_key *out, char *err, size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	PGresult *r = PQexecParams(c, "SELECT secret FROM idemproxy_secrets "
				   "WHERE name = 'wait_notify'", 0, NULL, NULL,
				   NULL, NULL, 1);
	int rc = -1;
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		pg_link_err(err, errlen, "wait secret",
			    PQresultErrorMessage(r));
	else if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0) ||
		 PQgetlength(r, 0, 0) < WAKE_KEY_MIN ||
		 PQgetlength(r, 0, 0) > WAKE_KEY_MAX)
		snprintf(err, errlen, "idemproxy_secrets holds no wait_notify "
			 "secret of %d to %d bytes", WAKE_KEY_MIN,
			 WAKE_KEY_MAX);
	else {
		out->len = (size_t)PQgetlength(r, 0, 0);
		memcpy(out->k, PQgetvalue(r, 0, 0), out->len);
		rc = 0;
	}
	PQclear(r);
	PQfinish(c);
	return rc;
}

int store_expected_version(void)
{
	int v = 0;
	for (int i = 0; i < n_embedded_migrations; i++)
		if (embedded_migrations[i].version > v)
			v = embedded_migrations[i].version;
	return v;
}

static int simple(PGconn *c, const char *sql, char *err, size_t errlen,
		  const char *what)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	int rc = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, what, PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

static int apply_one(PGconn *c, const struct migration *m, char *err,
		     size_t errlen)
{
	char what[160];
	snprintf(what, sizeof what, "migration %s", m->name);
	if (simple(c, "BEGIN", err, errlen, what))
		return -1;
	/* One statement at a time (sqlsplit.h: Citus passes a DDL
	 * statement's text on to the shards). */
	size_t pos = 0, len;
	const char *st;
	while (sql_next_statement(m->sql, &pos, &st, &len)) {
		char *one = xstrndup(st, len);
		int failed = simple(c, one, err, errlen, what);
		free(one);
		if (failed)
			goto rollback;
	}
	char ver[16];
	snprintf(ver, sizeof ver, "%d", m->version);
	const char *vals[2] = {ver, m->name};
	PGresult *r = PQexecParams(c,
				   "INSERT INTO schema_migrations (version, "
				   "name) VALUES ($1::int, $2)",
				   2, NULL, vals, NULL, NULL, 0);
	int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, what, PQresultErrorMessage(r));
	PQclear(r);
	if (rc)
		goto rollback;
	return simple(c, "COMMIT", err, errlen, what);
rollback:
	PQclear(PQexec(c, "ROLLBACK"));
	return -1;
}

int store_migrate(store *s, int *applied, char *err, size_t errlen)
{
	*applied = 0;
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = -1;
	/* Several instances may migrate at once: one at a time. */
	if (simple(c, "SELECT pg_advisory_lock(7307114101)", err, errlen,
		   "lock"))
		goto out;
	if (simple(c,
		   "CREATE TABLE IF NOT EXISTS schema_migrations ("
		   "version integer PRIMARY KEY, name text NOT NULL, "
		   "applied_at timestamptz NOT NULL DEFAULT now())",
		   err, errlen, "schema_migrations"))
		goto out;
	/* Every embedded migration not applied yet, in order: not only those
	 * above the highest applied one. */
	PGresult *have;
	if (applied_on(c, &have, err, errlen))
		goto out;
	for (int i = 0; i < n_embedded_migrations; i++) {
		if (have && has_version(have, embedded_migrations[i].version))
			continue;
		if (apply_one(c, &embedded_migrations[i], err, errlen)) {
			PQclear(have);
			goto out;
		}
		(*applied)++;
	}
	PQclear(have);
	rc = 0;
out:
	PQfinish(c);
	return rc;
}

/* ---- Citus ----------------------------------------------------------- */

/* The functions the proxy calls, each distributed by its tenant argument
 * and colocated with the records, so that a call is delegated to the
 * worker holding the tenant's shard. Every overload of the name in the
 * records' schema is distributed. */
static const char *const citus_functions[] = {"idem_claim"};

static const char layout_sql[] =
	"SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'citus')";

/* With the extension: is the table hash-distributed by tenant, and how
 * many of the proxy's functions ($1) are not distributed with it? */
static const char citus_layout_sql[] =
	"WITH t AS (SELECT p.logicalrelid, p.partmethod, p.colocationid, "
	"column_to_column_name(p.logicalrelid, p.partkey) AS col "
	"FROM pg_dist_partition p "
	"WHERE p.logicalrelid = to_regclass('idempotency_records')) "
	"SELECT (SELECT count(*) FROM t), "
	"(SELECT count(*) FROM t WHERE partmethod = 'h' AND col = 'tenant'), "
	"(SELECT count(*) FROM pg_proc f "
	"JOIN pg_class c ON c.oid = to_regclass('idempotency_records') "
	"AND f.pronamespace = c.relnamespace "
	"WHERE f.proname = ANY ($1::text[]) AND NOT EXISTS ("
	"SELECT 1 FROM pg_dist_object o, t WHERE o.classid = "
	"'pg_proc'::regclass AND o.objid = f.oid "
	"AND o.distribution_argument_index IS NOT NULL "
	"AND o.colocationid = t.colocationid))";

static void functions_array(char *out, size_t n)
{
	size_t k = (size_t)snprintf(out, n, "{");
	for (size_t i = 0; i < sizeof citus_functions / sizeof *citus_functions;
	     i++)
		k += (size_t)snprintf(out + k, n > k ? n - k : 0, "%s%s",
				      i ? "," : "", citus_functions[i]);
	snprintf(out + k, n > k ? n - k : 0, "}");
}

static int layout_on(PGconn *c, enum store_layout *out, char *err,
		     size_t errlen)
{
	PGresult *r = PQexec(c, layout_sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "layout", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	bool citus = atoi(PQgetvalue(r, 0, 0)) > 0;
	PQclear(r);
	*out = STORE_PLAIN;
	if (!citus)
		return 0;
	char fns[256];
	functions_array(fns, sizeof fns);
	const char *vals[1] = {fns};
	r = PQexecParams(c, citus_layout_sql, 1, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		pg_link_err(err, errlen, "layout", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	int distributed = atoi(PQgetvalue(r, 0, 0));
	int by_tenant = atoi(PQgetvalue(r, 0, 1));
	int loose = atoi(PQgetvalue(r, 0, 2));
	PQclear(r);
	*out = !distributed ? STORE_CITUS_LOCAL
	       : !by_tenant ? STORE_CITUS_OTHER
	       : loose	    ? STORE_CITUS_PARTIAL
			    : STORE_CITUS_DISTRIBUTED;
	return 0;
}

int store_layout_get(store *s, enum store_layout *out, char *err,
		     size_t errlen)
{
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = layout_on(c, out, err, errlen);
	PQfinish(c);
	return rc;
}

const char *store_layout_mismatch(enum store_layout l, bool citus)
{
	if (!citus)
		return l == STORE_PLAIN || l == STORE_CITUS_LOCAL
			       ? NULL
			       : "idempotency_records is distributed (Citus) "
				 "but database.distributed = \"none\": set "
				 "database.distributed = \"citus\"";
	switch (l) {
	case STORE_PLAIN:
		return "database.distributed = \"citus\" but the database has "
		       "no citus extension";
	case STORE_CITUS_LOCAL:
		return "database.distributed = \"citus\" but "
		       "idempotency_records is not distributed: run --migrate "
		       "on the coordinator";
	case STORE_CITUS_OTHER:
		return "database.distributed = \"citus\" but "
		       "idempotency_records is not hash-distributed by tenant";
	case STORE_CITUS_PARTIAL:
		return "database.distributed = \"citus\" but idem_claim is not "
		       "distributed with idempotency_records: run --migrate";
	case STORE_CITUS_DISTRIBUTED:
		break;
	}
	return NULL;
}

/* Distributes each overload of the proxy's functions; Citus accepts a
 * function that is distributed already, so this runs on every migrate
 * (a numbered migration may have re-created one). */
static int distribute_functions(PGconn *c, char *err, size_t errlen)
{
	char fns[256];
	functions_array(fns, sizeof fns);
	const char *vals[1] = {fns};
	PGresult *r = PQexecParams(
		c,
		"SELECT create_distributed_function(f.oid::regprocedure, "
		"'p_tenant', colocate_with := 'idempotency_records') "
		"FROM pg_proc f JOIN pg_class c ON c.oid = "
		"to_regclass('idempotency_records') "
		"AND f.pronamespace = c.relnamespace "
		"WHERE f.proname = ANY ($1::text[])",
		1, NULL, vals, NULL, NULL, 0);
	int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
	if (rc)
		pg_link_err(err, errlen, "create_distributed_function",
			    PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

int store_distribute(store *s, bool *converted, char *err, size_t errlen)
{
	*converted = false;
	PGconn *c = plain_connect(s, err, errlen);
	if (!c)
		return -1;
	int rc = -1;
	enum store_layout l;
	if (simple(c, "SELECT pg_advisory_lock(7307114101)", err, errlen,
		   "lock") ||
	    layout_on(c, &l, err, errlen))
		goto out;
	if (l == STORE_PLAIN || l == STORE_CITUS_OTHER) {
		snprintf(err, errlen, "%s", store_layout_mismatch(l, true));
		goto out;
	}
	if (l == STORE_CITUS_LOCAL) {
		/* Copies any rows to the shards (a store migrated plain),
		 * then drops the coordinator's local copy of them, in one
		 * transaction. */
		if (simple(c, "BEGIN", err, errlen, "distribute") ||
		    simple(c,
			   "SELECT create_distributed_table("
			   "'idempotency_records', 'tenant')",
			   err, errlen, "create_distributed_table") ||
		    simple(c,
			   "SELECT truncate_local_data_after_distributing_table("
			   "'idempotency_records')",
			   err, errlen, "distribute") ||
		    simple(c, "COMMIT", err, errlen, "distribute")) {
			PQclear(PQexec(c, "ROLLBACK"));
			goto out;
		}
		*converted = true;
	}
	rc = distribute_functions(c, err, errlen);
out:
	PQfinish(c);
	return rc;
}
