/* sleep.h - a pool's sleep and wake (sleep.c): the hooks the rest of lib/
 * calls.  While asleep, flush_epoch carries FP_EPOCH_ASLEEP: no thread
 * cache's epoch ever equals it (caches store the epoch without the bit), so
 * every fast path misses and the slow paths see the state. */
#ifndef FP_SLEEP_H
#define FP_SLEEP_H

#include "pool.h"

#define FP_EPOCH_ASLEEP (1ull << 63)

static inline int fp_asleep(const struct fabpool *p)
{
    return (atomic_load_explicit(&((struct fabpool *)p)->flush_epoch, memory_order_relaxed) & FP_EPOCH_ASLEEP) != 0;
}

/* The epoch a thread cache stores: the pool's, without the asleep bit. */
static inline uint64_t fp_tcache_epoch(struct fabpool *p)
{
    return atomic_load(&p->flush_epoch) & ~FP_EPOCH_ASLEEP;
}

/* FABPOOL_ERR_ASLEEP with a message naming fn. */
fabpool_status fp_asleep_error(const char *fn);

/* fp_chunk_unmap of a chunk that sleeps (unmapped already): forgets it, so
 * that wake does not map it again (a free or a trim while asleep).  Returns 1
 * if [va, va + size) was such a chunk.  Pool lock held. */
int fp_sleep_forget(struct fabpool *p, uint64_t va, uint64_t size);

/* Pool teardown: frees the host copies and the record of a pool destroyed
 * while asleep (its chunks were forgotten by the unmaps before). */
void fp_sleep_free(struct fabpool *p);
/* The chunks of the pool's records that sleep unmapped and wake has not
 * mapped again (fabpool_check: they are not counted in mapped_bytes).
 * Pool lock held. */
void fp_sleep_unmapped(const struct fabpool *p, uint64_t *chunks, uint64_t *bytes);

#endif
