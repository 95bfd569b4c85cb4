/* The reaper thread: releases processing records whose lease ended (unless
 * held), deletes expired records in batches, refreshes the gauges. On a
 * distributed store (Citus) each batch runs on every shard at once. */
#ifndef IDEMPROXY_REAPER_H
#define IDEMPROXY_REAPER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct reaper reaper;

/* It also moves the seals counted in this process (seal_tally.h) to the
 * store at each pass and at its stop, and warns when the active key
 * reaches seal_warn. */
typedef struct reaper_config {
	int64_t statement_timeout_ms;
	int64_t interval_ms;
	int batch;
	const char *seal_active; /* the active key id; NULL: sealing off */
	int64_t seal_warn;
	/* What the store offers for durability (durability.h) is read again
	 * this often, beside start, reload and reconnect. */
	int64_t durability_interval_ms;
} reaper_config;

reaper *reaper_start(const char *db_url, const reaper_config *c,
		     bool distributed);
/* New settings (a reload): the next pass uses them, and a new interval
 * counts from the end of the last pass. */
void reaper_configure(reaper *r, const reaper_config *c);
void reaper_stop(reaper *r);

#endif
