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
/* A block of the medium arena of n bytes (a multiple of the quantum with a state code: the sizes the thread
 * caches hold), its state that code, after the n_back blocks at back[] (their bases; the bits below the
 * quantum are the caller's; at most FP_MEDIUM_BACK_MAX), whose state bytes are at flags[] (fp_mstate_at of
 * each base, which stays where it is until the pool's end), that the caller's thread cache held went back
 * (fp_large_release_cached_locked's work), all under one take of the pool lock: the medium blocks' way through
 * the heap with only what every call needs (docs/design.md, "Medium blocks").  *rest: what the caller does
 * after it, with no lock held (0 nearly always): FP_MEDIUM_POLICY, fp_heap_trim_policy; FP_MEDIUM_MISS, no
 * free range fit (*out NULL): fp_large_alloc's whole way, where the arena grows. */
#define FP_MEDIUM_BACK_MAX 8u
enum { FP_MEDIUM_POLICY = 1, FP_MEDIUM_MISS = 2 };
fabpool_status fp_medium_alloc(fp_heap *h, uint64_t n, const uint64_t *back, _Atomic uint8_t *const *flags,
                               unsigned n_back, void **out, unsigned *rest);
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
