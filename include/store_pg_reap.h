/* The reaper's statements on the store: releasing ended leases, purging
 * expired records, and the processing figures. */
#ifndef IDEMPROXY_STORE_PG_REAP_H
#define IDEMPROXY_STORE_PG_REAP_H

#include "store_pg.h"

/* Walks up to batch rows whose lease ended at or after *since (text of a
 * timestamptz; "-infinity" at first), releasing the processing ones that
 * are not held; the held ones join *held (a tid[] as text, "{}" or empty at
 * first). since advances to the last lease walked, and *more says a full
 * batch was walked. */
int store_reap_leases(store *s, int batch, char *since, size_t since_len,
		      growbuf *held, int *released, bool *more, char *err,
		      size_t errlen) MUST_CHECK;
/* The walk's safety net: releases the processing rows whose lease ended
 * (not held) in pages [*page, *page + pages) of the table, whatever their
 * place in the walk; held ones join *held. *page moves on, back to 0 after
 * the table's last page. On a distributed store each shard keeps its own
 * page in the map (held) and page is not used. */
int store_sweep_leases(store *s, int pages, int64_t *page, growbuf *held,
		       int *released, char *err, size_t errlen) MUST_CHECK;
int store_purge_expired(store *s, int batch, int *purged, char *err,
			size_t errlen) MUST_CHECK;
/* Tombstones (sql/012_tombstones.sql): deletes the stored response of up
 * to batch completed records past the end of their response whose key is
 * kept longer; deletes up to batch stripped tombstones whose key ended. */
int store_strip_tombstones(store *s, int batch, int *stripped, char *err,
			   size_t errlen) MUST_CHECK;
int store_purge_tombstones(store *s, int batch, int *purged, char *err,
			   size_t errlen) MUST_CHECK;
/* The processing figures: every processing row (held ones too) and the
 * oldest one's age, and of those the held ones (on_unknown hold, lease
 * ended) and the oldest held one's age; ages from updated_at, the start
 * of the attempt. */
typedef struct processing_figures {
	int64_t count;
	double oldest_age_s;
	int64_t held;
	double oldest_held_age_s;
} processing_figures;

/* The processing figures, from since and held as the walk left them;
 * held keeps the rows still held.
 * On a distributed store (store_set_distributed) both walk every shard
 * from its own place: held is then the map of each shard's since and held
 * rows (JSON, empty at first), and since is not used. */
int store_processing_stats(store *s, const char *since, growbuf *held,
			   processing_figures *fig, char *err,
			   size_t errlen) MUST_CHECK;
/* This process's wall clock minus the database server's, read at the
 * middle of one round trip (*offset_s), and how far off that reading may
 * be (*error_s: half the round trip, plus the clocks' millisecond). */
int store_clock_offset(store *s, double *offset_s, double *error_s, char *err,
		       size_t errlen) MUST_CHECK;

#endif
