/* Fuzz target for the conf file loader.
 *
 * libconfig reads files, so each input is written to a memfd and loaded
 * through its /proc/self/fd path. A rejected file must get a message that
 * starts with the file name; an accepted one must hold what config_load
 * validates (SPEC 2): at least one route, unique names, compiled paths,
 * http(s) upstreams, lease > upstream_timeout, ttl > lease, a mismatch
 * status of 409 or 422. Freeing it must release everything (the leak
 * checker runs after every input). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "pathtpl.h"

static int conf_fd = -1;
static char conf_path[64];
static FILE *sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* The overrides would replace what the input says. */
	unsetenv("IDEMPROXY_DATABASE_URL");
	unsetenv("IDEMPROXY_LISTEN");
	conf_fd = memfd_create("fuzz.conf", MFD_CLOEXEC);
	ALWAYS_ASSERT(conf_fd >= 0);
	snprintf(conf_path, sizeof conf_path, "/proc/self/fd/%d", conf_fd);
	sink = fopen("/dev/null", "w");
	ALWAYS_ASSERT(sink != NULL);
	return 0;
}

/* @include would have libconfig open whatever file the input names
 * (/dev/zero, a FIFO, ...): that tests the machine, not the loader. The
 * directive is matched case-insensitively, as libconfig's scanner does. */
static bool has_include(const uint8_t *d, size_t n)
{
	static const char dir[] = "@include";
	const size_t dl = sizeof dir - 1;

	for (size_t i = 0; i + dl <= n; i++)
		if (d[i] == '@' && str_ncaseeq((const char *)d + i, dir, dl))
			return true;
	return false;
}

static bool starts_with(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

static void check_route(const config *c, size_t i)
{
	const route_cfg *r = &c->routes[i];

	ALWAYS_ASSERT(r->name && r->name[0] != '\0');
	ALWAYS_ASSERT(r->path && r->path[0] == '/' && r->tpl != NULL);
	ALWAYS_ASSERT(starts_with(r->upstream, "http://") ||
		      starts_with(r->upstream, "https://"));
	ALWAYS_ASSERT(r->lease_ms > r->upstream_timeout_ms);
	ALWAYS_ASSERT(r->ttl_ms > r->lease_ms);
	ALWAYS_ASSERT(r->mismatch_status == 409 || r->mismatch_status == 422);
	for (size_t j = 0; j < i; j++)
		ALWAYS_ASSERT(strcmp(c->routes[j].name, r->name) != 0);
	/* The template's own text is a path it matches ({id} is a segment,
	 * slash-star a rest), so it routes to this route or an earlier one.
	 * Requests are routed on their normalised path (decide.c), so the text
	 * is normalised first: "/o/" is written, "/o" is what routes. */
	size_t pl = strlen(r->path), nl;
	char *norm = xmalloc(pl + 1);
	const char *why;
	ALWAYS_ASSERT(pathtpl_normalize(r->path, pl, norm, &nl, &why) == 0);
	const route_cfg *m = route_match(c->routes, c->n_routes, norm, nl);
	ALWAYS_ASSERT(m != NULL && m <= r);
	free(norm);
	(void)route_has_method(r, "POST");
	(void)route_releases_status(r, 503);
}

static void check_accepted(config *c)
{
	ALWAYS_ASSERT(c->n_routes >= 1 && c->routes != NULL);
	ALWAYS_ASSERT(c->listen != NULL && c->admin_listen != NULL);
	ALWAYS_ASSERT(c->db_url != NULL);
	for (size_t i = 0; i < c->n_routes; i++)
		check_route(c, i);
	config_print_routes(c, sink);
	ALWAYS_ASSERT(config_ref(c) == c);
	config_unref(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512];

	if (has_include(data, size))
		return -1; /* keeps the input out of the corpus */
	ALWAYS_ASSERT(ftruncate(conf_fd, 0) == 0);
	ALWAYS_ASSERT(pwrite(conf_fd, data, size, 0) == (ssize_t)size);

	err[0] = '\0';
	config *c = config_load(conf_path, err, sizeof err);
	if (c == NULL) {
		ALWAYS_ASSERT(starts_with(err, conf_path));
		ALWAYS_ASSERT(err[strlen(conf_path)] == ':');
		return 0;
	}
	check_accepted(c);
	config_unref(c);
	return 0;
}
