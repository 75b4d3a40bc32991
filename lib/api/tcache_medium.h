/* tcache_medium.h - the medium blocks in the thread caches, on their
 * frees' slow side (tcache_medium.c): held back for the arena, evicted,
 * counted. */
#ifndef FP_TCACHE_MEDIUM_H
#define FP_TCACHE_MEDIUM_H

#include "tcache.h"

/* Gives the blocks tc holds back (mdef) to the medium arena, under one take of the pool lock. */
void fp_tcache_defer_flush(fp_alloc *a, fp_tcache *tc);
/* Gives blocks of tc's medium bins back, a size's whole bin at a time in turn, until room more bytes fit in
 * half its budget (no lock held). */
void fp_tcache_medium_evict(fp_alloc *a, fp_tcache *tc, uint64_t room);
/* fabpool_free's medium block (alloc.c, free_medium: d its base | its code, of `bytes`; f its state byte)
 * held back where the bin of its size rests or is full (the blocks held back given to the arena first where
 * there is no room: free_medium holds one back inline where there is); or kept past the cache's budget,
 * blocks of other sizes given back first.  FABPOOL_OK. */
fabpool_status fp_tcache_medium_back(fp_alloc *a, fp_tcache *tc, uint64_t d, uint64_t bytes, _Atomic uint8_t *f);
fabpool_status fp_tcache_medium_full(fp_alloc *a, fp_tcache *tc, uint64_t addr, _Atomic uint8_t *f);
/* The bytes of medium blocks that the thread caches hold (pool lock held, so that the list holds still). */
uint64_t fp_alloc_medium_cached(const fp_alloc *a);

#endif
