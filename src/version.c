/* The build's identity (version.h). */
#include "version.h"

#include "metrics.h"
#include "version_gen.h"

const char idemproxy_version[] = IDEMPROXY_VERSION;
const char idemproxy_commit[] = IDEMPROXY_COMMIT;

static double read_one(void *arg)
{
	return 1.0;
}

void version_publish(void)
{
	/* version.sh admits no character a label would have to escape. */
	static const char labels[] = "version=\"" IDEMPROXY_VERSION
				     "\",commit=\"" IDEMPROXY_COMMIT "\"";
	metrics_reading *r = metrics_reading_add(
		"idemproxy_build_info", "gauge",
		"The version and commit of this build (always 1).", labels,
		read_one);
	metrics_reading_bind(r, NULL);
}
