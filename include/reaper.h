/* The reaper thread: releases processing records whose lease ended (unless
 * held), deletes expired records in batches, refreshes the gauges. On a
 * distributed store (Citus) each batch runs on every shard at once. */
#ifndef IDEMPROXY_REAPER_H
#define IDEMPROXY_REAPER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct reaper reaper;

reaper *reaper_start(const char *db_url, int64_t statement_timeout_ms,
		     int64_t interval_ms, int batch, bool distributed);
/* New settings (a reload): the next pass uses them, and a new interval
 * counts from the end of the last pass. */
void reaper_configure(reaper *r, int64_t statement_timeout_ms,
		      int64_t interval_ms, int batch);
void reaper_stop(reaper *r);

#endif
