/* Seals made by this process per key id and not yet added to the store's
 * count (idemproxy_seal_counts, migration 011). Every seal draws a random
 * 96-bit nonce, safe for about 2^32 seals per key; the workers add here
 * (a lock and a short walk), and the reaper moves the tally to the store
 * at each pass. Process-wide and thread-safe, like the metrics. */
#ifndef IDEMPROXY_SEAL_TALLY_H
#define IDEMPROXY_SEAL_TALLY_H

#include <stddef.h>
#include <stdint.h>

#include "seal.h"

#define SEAL_TALLY_MAX 128

typedef struct seal_tally_entry {
	char id[SEAL_ID_MAX + 1];
	uint64_t n;
} seal_tally_entry;

void seal_tally_add(const char *id, uint64_t n);
/* Moves the pending counts (at most SEAL_TALLY_MAX) into out. */
size_t seal_tally_take(seal_tally_entry out[SEAL_TALLY_MAX]);
/* Gives back what could not be written, to be written next time. */
void seal_tally_put_back(const seal_tally_entry *e, size_t n);

#endif
