/* sleep.h - a pool's sleep and wake (sleep.c, fabpool_sleep / fabpool_wake):
 * what the other files of the top layer call.  The layers below never call
 * here: they read the asleep state from their fp_chunks (chunk.h:
 * fp_chunks_asleep, and fp_chunk_unmap forgets a sleeping chunk through
 * the list sleep.c gives it) and the thread caches from their epoch bit
 * (alloc.h: FP_EPOCH_ASLEEP). */
#ifndef FP_SLEEP_H
#define FP_SLEEP_H

#include "pool.h"

/* Pool teardown: frees the host copies and the record of a pool destroyed
 * while asleep (its chunks were forgotten by the unmaps before). */
void fp_sleep_free(struct fabpool *p);
/* fabpool_trim: frees the host copies kept from the last wake
 * (sleep_keep_host).  Pool lock held. */
fabpool_status fp_sleep_host_trim(struct fabpool *p);
/* The mappings of the pool's record that sleep unmapped and wake has not
 * mapped again, per kind (FP_MAP_KINDS each): their owners still hold them,
 * the registry does not (fabpool_check).  Pool lock held. */
void fp_sleep_unmapped(const struct fabpool *p, uint64_t *count, uint64_t *bytes);

#endif
