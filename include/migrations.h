/* The SQL migrations, embedded at build time from sql/NNN_name.sql. */
#ifndef IDEMPROXY_MIGRATIONS_H
#define IDEMPROXY_MIGRATIONS_H

struct migration {
	int version;
	const char *name;
	const char *sql;
};

extern const struct migration embedded_migrations[];
extern const int n_embedded_migrations;

#endif
