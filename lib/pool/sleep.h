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
/* The chunks of the pool's records that sleep unmapped and wake has not
 * mapped again (fabpool_check: they are not counted in mapped_bytes).
 * Pool lock held. */
void fp_sleep_unmapped(const struct fabpool *p, uint64_t *chunks, uint64_t *bytes);

#endif
