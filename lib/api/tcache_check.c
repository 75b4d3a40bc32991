/* tcache_check.c - fabpool_check's walk of the thread caches (walk.h): the
 * pool's list of them, and the calling thread's cached blocks gathered for
 * the slabs' walk.  Another thread's cache is written by its thread alone,
 * without a lock: it is only counted, never read. */
#include <stdlib.h>

#include "tcache_check.h"

#define FAIL FP_WALK_FAIL

static int tc_cmp(const void *a, const void *b)
{
    const fp_tc_ref *x = a, *y = b;
    if (x->span != y->span)
        return (uintptr_t)x->span < (uintptr_t)y->span ? -1 : 1;
    return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

/* The list, and how many blocks the calling thread's caches hold (*n); w->exact: no other thread's cache. */
static fabpool_status count_tcaches(const fp_alloc *a, unsigned n_classes, fp_walk *w, size_t *n)
{
    uint64_t guard = 0, others = 0;
    for (const fp_tcache *tc = a->tcaches; tc; tc = tc->next) {
        if (++guard > (1u << 24))
            return FAIL("[tcache.list] the list of thread caches does not end");
        if (tc->owner != a)
            return FAIL("[tcache.pool] a thread cache on the pool's list belongs to pool %p", (void *)tc->owner);
        if (!fp_tcache_mine(a, tc)) {
            others++;
            continue;
        }
        for (unsigned c = 0; c < n_classes; c++) {
            if (tc->top[c] < tc->lo[c] || tc->top[c] > tc->hi[c])
                return FAIL("[tcache.bin] a thread cache's bin of class %u holds %td blocks in a bin of %u", c,
                            tc->top[c] - tc->lo[c], fp_bin_cap(tc, c));
            *n += fp_bin_n(tc, c);
        }
    }
    w->exact = others == 0;
    return FABPOOL_OK;
}

/* The medium blocks of tc, a cache of the calling thread, in its bins and held back (mdef): each a block of
 * the medium arena given out (to the arena) of its code's size, its state byte FP_MSTATE_CACHED (and a bin's
 * cached with that byte's address), and their bytes what the cache counts. */
static fabpool_status check_medium(const fp_alloc *a, const fp_heap *h, const fp_tcache *tc)
{
    const fp_arena *ar = &h->arenas[FP_ARENA_MEDIUM];
    uint64_t bytes = 0;
    for (unsigned c = 0; c <= FP_MSTATE_MAX; c++) {
        if (tc->mn[c] > FP_MC_CAP || (tc->mn[c] && (!c || !a->mc_span)))
            return FAIL("[tcache.medium] a thread cache holds %u medium blocks of code %u (at most %u, of codes "
                        "1..%u, with the medium cache on)", tc->mn[c], c, FP_MC_CAP, FP_MSTATE_MAX);
        uint64_t size = a->mc_lo + ((uint64_t)c << FP_PIECE_UNIT_SHIFT);
        for (unsigned i = 0; i < tc->mn[c]; i++) {
            const fp_titem *it = &tc->mitems[c][i];
            const fp_piece *b = fp_arena_block(ar, it->ptr);
            const _Atomic uint8_t *f = fp_mstate_at(&a->ms, it->ptr);
            if (!f || it->flag != f || atomic_load_explicit(f, memory_order_relaxed) != FP_MSTATE_CACHED || !b ||
                b->state != FP_LARGE_LIVE || fp_piece_size(b) != size)
                return FAIL("[tcache.medium] a thread cache holds 0x%llx as a free block of %llu bytes: its state "
                            "byte is %d (want %u), the arena's block there is %llu bytes in state %d",
                            (unsigned long long)it->ptr, (unsigned long long)size,
                            f ? (int)atomic_load_explicit(f, memory_order_relaxed) : -1, FP_MSTATE_CACHED,
                            (unsigned long long)(b ? fp_piece_size(b) : 0), b ? (int)b->state : -1);
            bytes += size;
        }
    }
    if (tc->mdn > FP_MD_CAP || (tc->mdn && !a->mc_span))
        return FAIL("[tcache.medium] a thread cache holds back %u medium blocks (at most %u, with the medium cache "
                    "on)", tc->mdn, FP_MD_CAP);
    for (unsigned i = 0; i < tc->mdn; i++) {
        uint64_t at = fp_tcache_defer_addr(tc->mdef[i]), size = fp_tcache_defer_bytes(a, tc->mdef[i]);
        const fp_piece *b = fp_arena_block(ar, at);
        const _Atomic uint8_t *f = fp_mstate_at(&a->ms, at);
        if (!(tc->mdef[i] & (FP_BLOCK_QUANTUM - 1)) || !f ||
            atomic_load_explicit(f, memory_order_relaxed) != FP_MSTATE_CACHED || !b || b->state != FP_LARGE_LIVE ||
            fp_piece_size(b) != size)
            return FAIL("[tcache.medium] a thread cache holds back 0x%llx as a free block of %llu bytes: its state "
                        "byte is %d (want %u), the arena's block there is %llu bytes in state %d",
                        (unsigned long long)at, (unsigned long long)size,
                        f ? (int)atomic_load_explicit(f, memory_order_relaxed) : -1, FP_MSTATE_CACHED,
                        (unsigned long long)(b ? fp_piece_size(b) : 0), b ? (int)b->state : -1);
        bytes += size;
    }
    uint64_t counted = atomic_load_explicit(&tc->mbytes, memory_order_relaxed);
    if (bytes != counted)
        return FAIL("[tcache.medium] a thread cache holds %llu bytes of medium blocks and counts %llu",
                    (unsigned long long)bytes, (unsigned long long)counted);
    return FABPOOL_OK;
}

fabpool_status fp_tcaches_check(const fp_alloc *a, const fp_heap *h, fp_walk *w)
{
    unsigned n_classes = h->n_slab_classes;
    size_t n = 0;
    fabpool_status st = count_tcaches(a, n_classes, w, &n);
    if (st != FABPOOL_OK)
        return st;
    w->tc = n ? malloc(n * sizeof *w->tc) : NULL;
    if (n && !w->tc)
        return FP_WALK_HOST_FAIL();
    for (const fp_tcache *tc = a->tcaches; tc; tc = tc->next) {
        if (!fp_tcache_mine(a, tc))
            continue;
        if ((st = check_medium(a, h, tc)) != FABPOOL_OK)
            return st;
        for (unsigned c = 0; c < n_classes; c++)
            for (uint32_t i = 0; i < fp_bin_n(tc, c); i++)
                w->tc[w->n_tc++] = (fp_tc_ref){fp_map_get(&a->map, tc->lo[c][i].ptr), tc->lo[c][i].ptr, c};
    }
    if (w->n_tc)
        qsort(w->tc, w->n_tc, sizeof *w->tc, tc_cmp);
    return FABPOOL_OK;
}
