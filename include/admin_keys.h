/* The admin API's key listing (GET /admin/keys), and the answers of the
 * admin endpoints that admin_resolve.c shares. The listener (admin.c)
 * authenticates, routes and sends; these parse what came, query the
 * store (under the listener's lock) and make the answer. */
#ifndef IDEMPROXY_ADMIN_KEYS_H
#define IDEMPROXY_ADMIN_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "problem.h"
#include "store_admin.h"
#include "util.h"

#define ADMIN_LIST_DEFAULT 100
#define ADMIN_LIST_MAX 1000

/* An answer to send: status, content type, body, and one optional extra
 * header. links (set by the caller, from the configuration in force) are
 * what a problem body's type and Link header are made with. */
typedef struct admin_answer {
	problem_links links;
	int status;
	const char *type;
	growbuf body;
	const char *extra_name;
	const char *extra_value;
} admin_answer;

/* One query parameter, percent-decoded. */
typedef struct admin_arg {
	const char *name;
	const char *value;
} admin_arg;

/* Parsed GET /admin/keys parameters; cursor positions point into buf. */
typedef struct admin_list_args {
	admin_list_req req;
	admin_list_pos after;
	char *buf;
} admin_list_args;

/* Parses the listing's parameters. -1 with the reason in err (the
 * parameter named first) for anything unknown, repeated or malformed. */
int admin_list_parse(const admin_arg *args, size_t n, admin_list_args *out,
		     char *err, size_t errlen) MUST_CHECK;
void admin_list_args_free(admin_list_args *a);

/* The opaque cursor of a place in the walk, in one order (into out,
 * base64url). And back: -1 when it is not one, or of the other order. */
void admin_cursor_encode(bool newest, const admin_list_pos *p, growbuf *out);
int admin_cursor_decode(const char *s, bool newest, admin_list_pos *p,
			char **buf) MUST_CHECK;

/* GET /admin/keys with the store locked by the caller. who names the
 * caller in the log (its address). */
void admin_keys_list(store_admin *st, const char *who, const admin_arg *args,
		     size_t n, admin_answer *out);

/* Answers a problem, a JSON document (taken), or 503 after a store
 * failure (logged, with who and the action). */
void admin_answer_problem(admin_answer *out, int status, const char *code,
			  const char *detail);
void admin_answer_json(admin_answer *out, int status, json_t *doc);
void admin_answer_store_failed(admin_answer *out, const char *who,
			       const char *what, const char *err);

#endif
