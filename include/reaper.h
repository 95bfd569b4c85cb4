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
void reaper_stop(reaper *r);

#endif
