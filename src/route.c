#include "route.h"

#include <string.h>

const route_cfg *route_match(const route_cfg *routes, size_t n,
			     const char *path, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (pathtpl_match(routes[i].tpl, path, len))
			return &routes[i];
	return NULL;
}

bool route_has_method(const route_cfg *r, const char *method)
{
	for (size_t i = 0; i < r->methods.n; i++)
		if (strcmp(r->methods.v[i], method) == 0)
			return true;
	return false;
}

int64_t route_lease_margin_ms(const route_cfg *r)
{
	int64_t m = r->lease_ms / 10;
	if (m < ROUTE_LEASE_MARGIN_MIN_MS)
		m = ROUTE_LEASE_MARGIN_MIN_MS;
	return m > ROUTE_LEASE_MARGIN_MAX_MS ? ROUTE_LEASE_MARGIN_MAX_MS : m;
}

bool route_releases_status(const route_cfg *r, int status)
{
	for (size_t i = 0; i < r->n_release_statuses; i++)
		if (r->release_statuses[i] == status)
			return true;
	return false;
}
