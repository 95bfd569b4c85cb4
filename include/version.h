/* The version and the commit this binary was built from: one source for
 * --version and /metrics (scripts/version.sh writes them at build time). */
#ifndef IDEMPROXY_VERSION_H
#define IDEMPROXY_VERSION_H

extern const char idemproxy_version[];
extern const char idemproxy_commit[];

/* Adds idemproxy_build_info{version,commit} 1 to /metrics: dashboards
 * join on it to tell which build each instance runs. */
void version_publish(void);

#endif
