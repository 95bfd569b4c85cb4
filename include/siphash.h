/* SipHash-2-4 (Aumasson and Bernstein): a keyed hash for tables whose keys
 * clients choose, so that no one who lacks the key can aim keys at one
 * bucket. */
#ifndef IDEMPROXY_SIPHASH_H
#define IDEMPROXY_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

#define SIPHASH_KEY_LEN 16

uint64_t siphash24(const uint8_t key[SIPHASH_KEY_LEN], const void *p,
		   size_t n);

#endif
