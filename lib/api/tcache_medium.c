/* tcache_medium.c - the medium blocks in the thread caches, on their
 * frees' slow side: the blocks held back for the arena, the eviction when a
 * cache is full or over its share, and the bytes every cache holds (tcache.h;
 * the hit's pop and push are alloc.c's and tcache.h's, their flush and
 * policy tcache.c's). */
#include "lock.h"
#include "tcache_medium.h"

void fp_tcache_defer_flush(fp_alloc *a, fp_tcache *tc)
{
    if (!tc->mdn)
        return;
    fp_lock(&a->sp->lock);
    for (unsigned i = 0; i < tc->mdn; i++)
        fp_large_release_cached_locked(a->heap, fp_tcache_defer_addr(tc->mdef[i]));
    tc->mdn = 0;
    atomic_store_explicit(&tc->mbytes, atomic_load_explicit(&tc->mbytes, memory_order_relaxed) - tc->mdbytes,
                          memory_order_relaxed);
    tc->mdbytes = 0;
    int due = fp_large_policy_due(a->heap);
    fp_unlock(&a->sp->lock);
    if (due)
        fp_alloc_trim_policy(a);
}

/* The first code from `from` on (round the end to 1) whose bin of tc may hold blocks: 0 if none. */
static unsigned next_code(const fp_tcache *tc, unsigned from)
{
    enum { W = sizeof tc->mmask / sizeof tc->mmask[0] };
    for (unsigned k = 0; k <= W; k++) {
        unsigned w = (from / 64 + k) % W;
        uint64_t m = tc->mmask[w];
        if (k == 0)
            m &= ~0ull << (from % 64);
        if (m)
            return w * 64 + (unsigned)__builtin_ctzll(m);
    }
    return 0;
}

void fp_tcache_medium_evict(fp_alloc *a, fp_tcache *tc, uint64_t room)
{
    uint64_t held = atomic_load_explicit(&tc->mbytes, memory_order_relaxed), budget = a->mc_budget;
    fp_lock(&a->sp->lock);
    for (unsigned i = 0; i < tc->mdn; i++)   /* the blocks held back first: they wait for no reuse */
        fp_large_release_cached_locked(a->heap, fp_tcache_defer_addr(tc->mdef[i]));
    held -= tc->mdbytes;
    tc->mdn = 0;
    tc->mdbytes = 0;
    while (held + room > budget / 2) {   /* half the budget at once: one lock for several frees */
        unsigned c = next_code(tc, tc->mevict);
        if (!c)
            break;
        tc->mevict = c + 1;
        tc->mmask[c / 64] &= ~(1ull << (c % 64));
        for (unsigned i = 0; i < tc->mn[c]; i++)
            fp_large_release_cached_locked(a->heap, tc->mitems[c][i].ptr);
        held -= tc->mn[c] * (a->mc_lo + ((uint64_t)c << FP_PIECE_UNIT_SHIFT));
        tc->mn[c] = 0;
    }
    atomic_store_explicit(&tc->mbytes, held, memory_order_relaxed);
    int due = fp_large_policy_due(a->heap);
    fp_unlock(&a->sp->lock);
    if (due)
        fp_alloc_trim_policy(a);
}

/* alloc.c's free_medium: its block past the cache's budget: the cache gives back blocks
 * of other sizes, a size's bin at a time in turn, until this one fits; so
 * that the newest stay and no free gives back more than a few blocks. */
fabpool_status fp_tcache_medium_full(fp_alloc *a, fp_tcache *tc, uint64_t addr, _Atomic uint8_t *f)
{
    unsigned c = atomic_load_explicit(f, memory_order_relaxed);
    uint64_t bytes = a->mc_lo + ((uint64_t)c << FP_PIECE_UNIT_SHIFT);
    fp_tcache_medium_evict(a, tc, bytes);
    unsigned n = tc->mn[c];   /* below FP_MC_CAP still: the eviction only takes */
    tc->mitems[c][n] = (fp_titem){addr, f};
    tc->mn[c] = (uint8_t)(n + 1);
    tc->mmask[c / 64] |= 1ull << (c % 64);
    atomic_store_explicit(&tc->mbytes, atomic_load_explicit(&tc->mbytes, memory_order_relaxed) + bytes,
                          memory_order_relaxed);
    atomic_store_explicit(f, FP_MSTATE_CACHED, memory_order_relaxed);
    return FABPOOL_OK;
}

/* alloc.c's free_medium: its block (d: its base | its code, of `bytes`) where the bin of its size rests or is full: held
 * back (tcache.h, mdef) until the thread's next medium allocation gives it to the arena under the lock that
 * allocation takes anyway, before its fit, so that the fit sees the arena as it would have without it. */
fabpool_status fp_tcache_medium_back(fp_alloc *a, fp_tcache *tc, uint64_t d, uint64_t bytes, _Atomic uint8_t *f)
{
    if (FP_UNLIKELY(tc->mdn == FP_MD_CAP))
        fp_tcache_defer_flush(a, tc);
    fp_tcache_hold_back(tc, d, bytes, f);
    return FABPOOL_OK;
}

uint64_t fp_alloc_medium_cached(const fp_alloc *a)
{
    fp_space_assert_locked(a->sp);
    uint64_t n = 0;
    for (const fp_tcache *tc = a->tcaches; tc; tc = tc->next)
        n += atomic_load_explicit(&tc->mbytes, memory_order_relaxed);
    return n;
}
