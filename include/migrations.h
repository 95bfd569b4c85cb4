/* The SQL migrations, embedded at build time from sql/NNN_name.sql. */
#ifndef IDEMPROXY_MIGRATIONS_H
#define IDEMPROXY_MIGRATIONS_H

struct migration {
	int version;
	const char *name;
	const char *sql;
};

extern const struct migration ip_migrations[];
extern const int ip_n_migrations;

#endif
