/* `idemproxy -c FILE --reencrypt`: re-seals every completed record that is
 * not under the key file's active key (an older key, or stored in the clear)
 * so that older keys can be removed. Bounded batches, each one transaction
 * that locks its rows with FOR UPDATE SKIP LOCKED (live traffic is never
 * waited for; a skipped row is left for the next run), walking the primary
 * key so the run ends; stopping at any point loses nothing, and a second
 * run takes up what is left. */
#ifndef IDEMPROXY_REENCRYPT_H
#define IDEMPROXY_REENCRYPT_H

#include <stdio.h>

#include "config.h"

#define REENCRYPT_BATCH_DEFAULT 500

/* Prints a progress line per batch and, at the end, the records left per
 * key id on out; records that do not open are named on errs. Returns 0 when
 * every completed record is under the active key, 1 when some are left, -1
 * on a store failure or without store_encryption (err filled). */
int reencrypt_run(const config *cfg, int batch, FILE *out, FILE *errs,
		  char *err, size_t errlen);

#endif
