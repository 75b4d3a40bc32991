/* large.h - blocks above slab_max: each a best fit in the heap's medium
 * arena (up to medium_max) or its large one, checked on free, pending while
 * freed on a stream.  Pool lock held inside; the callers hold none. */
#ifndef FP_LARGE_H
#define FP_LARGE_H

#include "slab.h"

/* The usable size of a block of `size` bytes above slab_max. */
uint64_t fp_large_size(const fp_heap *h, uint64_t size);
/* A block of size bytes, its base a multiple of align (a power of two up to the granularity; FP_BLOCK_QUANTUM
 * or less: the arenas' own 256 bytes).  A block of the medium arena with a state code (fp_mstate) may go to a
 * thread cache when freed. */
fabpool_status fp_large_alloc(fp_heap *h, uint64_t size, uint64_t align, void **out);
/* A block a thread cache held (state FP_MSTATE_CACHED) goes back to the medium arena: its state 0, merged with
 * its free neighbours.  Pool lock held; the caller then runs fp_large_policy_due (the idle sum follows) and,
 * if it says so and the lock is let go, fp_heap_trim_policy. */
void fp_large_release_cached_locked(fp_heap *h, uint64_t addr);
int fp_large_policy_due(fp_heap *h);
/* Frees the block above slab_max at addr, whose page the page map sends to s (checked under the lock:
 * interior and double frees are refused; fn names the call in messages). */
fabpool_status fp_large_free(fp_heap *h, const fp_span *s, uint64_t addr, const char *fn);
/* FABPOOL_OK with *usable the block's size if addr is a live block above slab_max, else the errors of
 * fp_large_free; changes nothing. */
fabpool_status fp_large_check(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable);
/* A live block above slab_max freed on a stream: FP_LARGE_PENDING (live for the rest of the pool), *usable its
 * size.  The errors of fp_large_free otherwise. */
fabpool_status fp_large_pend(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable);
/* A pending block given out again (FP_LARGE_LIVE). */
void fp_large_unpend(fp_heap *h, uint64_t addr);
/* The usable size of the live block above slab_max at addr (fp_large_usable: or of one freed on a stream and
 * still waiting for its work); FABPOOL_ERR_NOT_FOUND (fn in the message, which says whether addr is inside a
 * block, in a block freed on a stream, or in free memory) if none starts there.  The _locked form with the pool
 * lock held. */
fabpool_status fp_large_usable(fp_heap *h, uint64_t addr, uint64_t *usable, const char *fn);
fabpool_status fp_large_live_locked(fp_heap *h, uint64_t addr, uint64_t *usable, const char *fn);
/* Live blocks above slab_max by the class of the grid their size falls in (counts[FP_NCLASS]).  Pool lock held. */
void fp_heap_count_large(const fp_heap *h, uint64_t *counts);

#endif
