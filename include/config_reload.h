/* The reload rule of a setting, on its own so that the settings tables'
 * row type (config_table.h) and the conf's public face (config.h) can
 * both name it without either including the other. */
#ifndef IDEMPROXY_CONFIG_RELOAD_H
#define IDEMPROXY_CONFIG_RELOAD_H

/* What a SIGHUP does with a setting, as in redis's MODIFIABLE_CONFIG /
 * IMMUTABLE_CONFIG flags and pgbouncer's no-reload settings. Every row of
 * the settings tables (src/config.c) names one; a unit test checks. */
enum config_reload {
	CONFIG_RELOAD_UNSET,   /* a row that does not say: a bug */
	CONFIG_RELOAD_APPLY,   /* a reload puts the new value in force */
	CONFIG_RELOAD_RESTART, /* the value at start stays until a restart */
};

#endif
