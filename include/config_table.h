/* Inside the conf loader: what its three parts share. config.c holds the
 * settings tables and walks them (loading, defaults, reload rules);
 * config_conv.c the generic converters a table row names (strings,
 * numbers, durations, sizes, choices, listen addresses) and the error
 * messages; config_route.c the route-only converters (methods, tenant,
 * key_from, jwt, ...), the rules between a route's settings and --check's
 * summary. Nothing outside those three includes this. */
#ifndef IDEMPROXY_CONFIG_TABLE_H
#define IDEMPROXY_CONFIG_TABLE_H

#include <libconfig.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config_reload.h"

/* Named, not included: the loader's parts include config.h themselves,
 * and the row type stays below the conf it fills. */
struct config;
struct route_cfg;
struct str_list;

#define CFG_MS_SECOND INT64_C(1000)
#define CFG_MS_MINUTE (60 * CFG_MS_SECOND)
#define CFG_MS_HOUR (60 * CFG_MS_MINUTE)
#define CFG_MS_DAY (24 * CFG_MS_HOUR)
#define CFG_GIB (INT64_C(1) << 30)
#define CFG_ROUTE_NAME_MAX 128
#define CFG_WHY 256

typedef struct cfg_choice {
	const char *name;
	int value;
} cfg_choice;

struct cfg_opt;

/* Converts one setting into base + opt->off; on a bad value writes the reason
 * (without file, line or setting name) into why and returns -1. */
typedef int (*cfg_conv_fn)(const struct cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen);

typedef struct cfg_opt {
	const char *name;
	cfg_conv_fn conv;
	const char *def;  /* conf-file syntax; NULL = required */
	int64_t min, max; /* bounds of the value or of each element */
	size_t off;       /* destination in the scope's struct */
	size_t aux;       /* second destination (count, argument) if any */
	const cfg_choice *choices;
	enum config_reload reload; /* what a SIGHUP does with it */
} cfg_opt;

#define CFG_APPLY CONFIG_RELOAD_APPLY
#define CFG_RESTART CONFIG_RELOAD_RESTART

/* Where errors go, and what the values are converted from. */
typedef struct cfg_ctx {
	const char *file;
	char *err;
	size_t errlen;
	config_t builtin; /* the defaults of every table, parsed */
} cfg_ctx;

#define CFG_N(t) (sizeof(t) / sizeof((t)[0]))
#define CFG_DST(o, base, type) ((type *)((char *)(base) + (o)->off))
#define CFG_AUX(o, base, type) ((type *)((char *)(base) + (o)->aux))

/* The per-route table (shared by `defaults` and the routes) and the
 * route-only one, in config.c. */
extern const cfg_opt cfg_route[];
extern const size_t cfg_route_n;
extern const cfg_opt cfg_route_only[];
extern const size_t cfg_route_only_n;

/* ---- config_conv.c: errors */

/* Writes "FILE:LINE: msg" for the nearest line at or above at into x's
 * error buffer; returns -1. */
__attribute__((format(printf, 3, 4))) int
cfg_fail(cfg_ctx *x, const config_setting_t *at, const char *fmt, ...);
/* Writes the reason into why; returns -1. */
__attribute__((format(printf, 3, 4))) int cfg_why(char *why, size_t whylen,
						  const char *fmt, ...);

/* ---- config_conv.c: formatting, validators, generic converters */

void cfg_fmt_ms(int64_t ms, char *buf, size_t n);
bool cfg_is_token(const char *s);
bool cfg_span_is(const char *s, size_t n, const char *allowed);
int cfg_check_upstream(const char *url, char **out, char *why, size_t whylen);
const char *cfg_type_name(const config_setting_t *s);
bool cfg_is_int(const config_setting_t *s);
bool cfg_is_seq(const config_setting_t *s);
int cfg_want_string(const config_setting_t *s, const char *what, char *why,
		    size_t whylen);
int cfg_conv_string(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen);
int cfg_conv_uri(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen);
int cfg_conv_int(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen);
int cfg_conv_int64(const cfg_opt *o, const config_setting_t *s, void *base,
		   char *why, size_t whylen);
int cfg_conv_duration(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen);
int cfg_conv_size(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen);
int cfg_conv_enum(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen);
int cfg_conv_flag(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen);
int cfg_conv_int_choice(const cfg_opt *o, const config_setting_t *s, void *base,
			char *why, size_t whylen);
int cfg_conv_listen(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen);
int cfg_conv_listen_or_off(const cfg_opt *o, const config_setting_t *s,
			   void *base, char *why, size_t whylen);
void cfg_list_free(struct str_list *l);
int cfg_strings(const config_setting_t *s, struct str_list *out,
		const char *what, bool (*ok)(const char *), char *why,
		size_t whylen);

/* ---- config_route.c */

int cfg_conv_methods(const cfg_opt *o, const config_setting_t *s, void *base,
		     char *why, size_t whylen);
int cfg_conv_headers(const cfg_opt *o, const config_setting_t *s, void *base,
		     char *why, size_t whylen);
int cfg_conv_replay_headers(const cfg_opt *o, const config_setting_t *s,
			    void *base, char *why, size_t whylen);
int cfg_conv_statuses(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen);
int cfg_conv_tenant(const cfg_opt *o, const config_setting_t *s, void *base,
		    char *why, size_t whylen);
int cfg_conv_key_from(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen);
int cfg_conv_pointers(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen);
int cfg_conv_jwt(const cfg_opt *o, const config_setting_t *s, void *base,
		 char *why, size_t whylen);
int cfg_conv_route_name(const cfg_opt *o, const config_setting_t *s, void *base,
			char *why, size_t whylen);
int cfg_conv_path(const cfg_opt *o, const config_setting_t *s, void *base,
		  char *why, size_t whylen);
int cfg_conv_upstream(const cfg_opt *o, const config_setting_t *s, void *base,
		      char *why, size_t whylen);
void cfg_route_free(struct route_cfg *r);
int cfg_check_defaults(cfg_ctx *x, const config_setting_t *d);
int cfg_load_routes(cfg_ctx *x, struct config *c, const config_setting_t *root,
		    const config_setting_t *defaults);

/* ---- config.c: applying tables */

const config_setting_t *cfg_member(const config_setting_t *g, const char *name);
int cfg_apply(cfg_ctx *x, const char *scope, const cfg_opt *opts, size_t n,
	      const config_setting_t *group, const config_setting_t *fallback,
	      void *base, const char *prefix);
int cfg_check_known(cfg_ctx *x, const config_setting_t *group,
		    const cfg_opt *opts, size_t n, bool route_only,
		    const char *prefix);
int cfg_want_group(cfg_ctx *x, const config_setting_t *g, const char *name);

#endif
