/* A serving thread that stalls right before an upstream transfer starts,
 * preloaded into the proxy by tests:
 *
 *   LD_PRELOAD=build/stall_transfer.so
 *   IDEMPROXY_SHIM_STALL_GATE=/tmp/gate   while this file exists, the next
 *                                         curl_multi_add_handle removes it
 *                                         and sleeps first (once per file)
 *   IDEMPROXY_SHIM_STALL_MS=4500          for this long
 *
 * It stands for a freeze of the thread (a stop, a page-in storm, a
 * descheduled VM) that lands after the proxy checked its lease and before
 * libcurl writes the request: the moment a late write would be sent on a
 * lease that may have ended. Nothing else is changed. */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef CURLMcode (*add_fn)(CURLM *, CURL *);

CURLMcode curl_multi_add_handle(CURLM *m, CURL *h)
{
	static add_fn real;
	if (!real)
		real = (add_fn)dlsym(RTLD_NEXT, "curl_multi_add_handle");
	const char *gate = getenv("IDEMPROXY_SHIM_STALL_GATE");
	const char *ms = getenv("IDEMPROXY_SHIM_STALL_MS");
	if (gate && ms && unlink(gate) == 0) {
		long v = atol(ms);
		struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
		while (nanosleep(&ts, &ts) != 0)
			;
	}
	return real(m, h);
}
