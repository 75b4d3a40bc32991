/* medium.h - the medium blocks' way through the heap (docs/design.md,
 * "Medium blocks"): the held-back blocks' releases and a fit under one take
 * of the pool lock, inline, and the counters and the policy's tick that
 * large.c shares with it.  Pool lock taken inside; the callers hold none. */
#ifndef FP_MEDIUM_H
#define FP_MEDIUM_H

#include "slab.h"

/* Whether fp_heap_trim_policy is due after a block's allocation or free,
 * the arenas' free bytes idle_arenas (fp_heap_idle_follow's sum, not read
 * back): the decay's clock only at every 16th of the pool's (a medium
 * block's path is a few tens of ns, the clock a good part of that); what
 * cannot wait (decay_ms:0, through a mask of 0; the cache limit, empty slabs
 * to give back) every time.  Pool lock held (the tick is the lock's); the
 * policy runs after it is let go. */
static inline int fp_heap_policy_due(fp_heap *h, uint64_t idle_arenas)
{
    return (++h->policy_tick & h->policy_mask) == 0 || atomic_load_explicit(&h->shed, memory_order_relaxed) ||
           atomic_load_explicit(&h->idle_slabs, memory_order_relaxed) + idle_arenas > h->cache_limit;
}

/* counter += d, for a counter that only the pool lock's holder writes (stats read it without the lock): a
 * plain load and store, not a locked read-modify-write */
static inline void fp_count_locked(_Atomic uint64_t *counter, uint64_t d)
{
    atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + d, memory_order_relaxed);
}

#define FP_MEDIUM_BACK_MAX 8u
enum { FP_MEDIUM_POLICY = 1, FP_MEDIUM_MISS = 2 };

/* A block of the medium arena of n bytes (a multiple of the quantum with a state code: the sizes the thread
 * caches hold), its state that code, after the n_back blocks (at most FP_MEDIUM_BACK_MAX) whose state bytes are
 * at flags[] (fp_mstate_at of each base, never NULL: a block is held back only where its free found its byte;
 * a byte stays where it is until the pool's end; the byte's entry of the direct index is the block's), that
 * the caller's thread cache held went back
 * (fp_large_release_cached_locked's work), all under one take of the pool lock: the medium blocks' way through
 * the heap with only what every call needs (docs/design.md, "Medium blocks").  *rest: what the caller does
 * after it, with no lock held (0 nearly always): FP_MEDIUM_POLICY, fp_heap_trim_policy; FP_MEDIUM_MISS, no
 * free range fit (*out NULL): fp_large_alloc's whole way, where the arena grows.  Inline: its caller
 * (alloc.c) runs it in its own frame, with no call and no arguments through memory. */
FP_ARENA_INLINE fabpool_status fp_medium_alloc(fp_heap *h, uint64_t n, _Atomic uint8_t *const *flags,
                                               unsigned n_back, void **out, unsigned *rest)
{
    fp_arena *a = &h->arenas[FP_ARENA_MEDIUM];
    fabpool_status st = FABPOOL_OK;
    uint64_t back_bytes = 0;
    fp_lock(&h->sp->lock);
    /* the held-back blocks released and the fit in this frame (arena.h: the medium arena's table is the
     * direct index); the counters as one sum each */
    if (n_back > FP_MEDIUM_BACK_MAX)
        n_back = FP_MEDIUM_BACK_MAX;
    for (unsigned i = 0; i < n_back; i++) {   /* release_cached's checks */
        /* a multiple of the quantum in the reservation, whose state byte said a live block of the arena: the
         * free's checks (alloc.c); the block's entry is the one that holds that byte */
        _Atomic uint8_t *f = flags[i];
        fp_bent *e = fp_bent_of_state(f);
        fp_piece *p = fp_piece_at(a, e->rid);
        if (!p || p->state != FP_LARGE_LIVE || atomic_load_explicit(f, memory_order_relaxed) != FP_MSTATE_CACHED)
            continue;
        back_bytes += fp_piece_size(p);
        fp_arena_release_(a, p, 1, e);
        atomic_store_explicit(f, 0, memory_order_relaxed);
    }
    /* n has a code (above), not 0: the caches' sizes are the states' (lo, hi] (tcache.c), which a pool keeps
     * wherever its thread caches hold medium blocks (this path's callers); the cut stores it */
    fp_piece *b = fp_arena_best_fit_(a, n, a->quantum, &st, 1, (unsigned)((n - a->ms.lo) >> FP_PIECE_UNIT_SHIFT));
    uint64_t in_use = atomic_load_explicit(&h->large_in_use_bytes, memory_order_relaxed) - back_bytes;
    if (__builtin_expect(b != NULL, 1)) {
        in_use += n;
        fp_count_locked(&h->large_allocs[a->cls_of_q[(n >> FP_PIECE_UNIT_SHIFT) - 1]], 1);
        *out = (void *)(uintptr_t)b->base;
    } else {
        *out = NULL;
    }
    atomic_store_explicit(&h->large_in_use_bytes, in_use, memory_order_relaxed);
    *rest = (fp_heap_policy_due(h, fp_heap_idle_follow(h)) ? FP_MEDIUM_POLICY : 0) |
            (!b && st == FABPOOL_OK ? FP_MEDIUM_MISS : 0);
    fp_unlock(&h->sp->lock);
    return st;
}

#endif
