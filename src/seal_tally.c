#include "seal_tally.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static seal_tally_entry pending[SEAL_TALLY_MAX];
static size_t npending;

/* With mu held. A key file holds at most SEAL_MAX_KEYS ids and the tally
 * is emptied every reaper pass, so the table fills only if reload after
 * reload brings new ids within one pass; those seals are then folded into
 * the first id's count, which overstates it (the safe side) and says so. */
static void add_locked(const char *id, uint64_t n)
{
	for (size_t i = 0; i < npending; i++)
		if (!strcmp(pending[i].id, id)) {
			pending[i].n += n;
			return;
		}
	if (npending == SEAL_TALLY_MAX) {
		pending[0].n += n;
		log_warn("seal tally full; counted under another key id",
			 "key=%s counted_as=%s", id, pending[0].id);
		return;
	}
	seal_tally_entry *e = &pending[npending++];
	snprintf(e->id, sizeof e->id, "%s", id);
	e->n = n;
}

void seal_tally_add(const char *id, uint64_t n)
{
	pthread_mutex_lock(&mu);
	add_locked(id, n);
	pthread_mutex_unlock(&mu);
}

size_t seal_tally_take(seal_tally_entry out[SEAL_TALLY_MAX])
{
	pthread_mutex_lock(&mu);
	size_t n = npending;
	memcpy(out, pending, n * sizeof *out);
	npending = 0;
	pthread_mutex_unlock(&mu);
	return n;
}

void seal_tally_put_back(const seal_tally_entry *e, size_t n)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n; i++)
		add_locked(e[i].id, e[i].n);
	pthread_mutex_unlock(&mu);
}
