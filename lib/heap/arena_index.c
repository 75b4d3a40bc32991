/* arena_index.c - the leaves of an arena's direct index of blocks, which
 * hold its blocks' states too (arena_index.h). */
#include "arena_index.h"

#include <string.h>

#define BIDX_LEAF_BYTES (FP_BIDX_LEAF_IDS * sizeof(fp_bent))
#define BIDX_NLEAVES(size) ((size_t)(((size) + (1ull << FP_BIDX_LEAF_SHIFT) - 1) >> FP_BIDX_LEAF_SHIFT))

static int bidx_init(fp_bidx *x, fp_meta *meta, uint64_t rbase, uint64_t rsize)
{
    if (x->leaves)
        return 0;
    x->leaves = fp_meta_alloc(meta, BIDX_NLEAVES(rsize) * sizeof *x->leaves); /* zeroed: no leaf made */
    if (!x->leaves)
        return -1;
    x->base = rbase;
    x->size = rsize;
    return 0;
}

int fp_bidx_reserve(fp_bidx *x, fp_meta *meta, uint64_t rbase, uint64_t rsize, uint64_t va, uint64_t size)
{
    if (bidx_init(x, meta, rbase, rsize) != 0)
        return -1;
    if (!size || va - x->base >= x->size || size > x->size - (va - x->base))
        return 0; /* nothing an arena can map */
    for (uint64_t l = (va - x->base) >> FP_BIDX_LEAF_SHIFT; l <= (va + size - 1 - x->base) >> FP_BIDX_LEAF_SHIFT; l++) {
        if (atomic_load_explicit(&x->leaves[l], memory_order_relaxed))
            continue;
        fp_bent *leaf = fp_meta_alloc(meta, BIDX_LEAF_BYTES); /* zeroed */
        if (!leaf)
            return -1;
        /* states' readers take no lock: the zeroes before the leaf */
        atomic_store_explicit(&x->leaves[l], leaf, memory_order_release);
    }
    return 0;
}

void fp_bidx_leaf_free(fp_bidx *x, fp_meta *meta, uint64_t l)
{
    if (!x->leaves)
        return;
    fp_bent *leaf = atomic_load_explicit(&x->leaves[l], memory_order_relaxed);
    if (!leaf)
        return;
    fp_meta_free(meta, leaf, BIDX_LEAF_BYTES);
    atomic_store_explicit(&x->leaves[l], NULL, memory_order_relaxed);
}

void fp_bidx_free(fp_bidx *x, fp_meta *meta)
{
    if (!x->leaves)
        return;
    size_t n = BIDX_NLEAVES(x->size);
    for (size_t l = 0; l < n; l++)
        fp_meta_free(meta, atomic_load_explicit(&x->leaves[l], memory_order_relaxed), BIDX_LEAF_BYTES);
    fp_meta_free(meta, (void *)x->leaves, n * sizeof *x->leaves);
    memset(x, 0, sizeof *x);
}

int fp_mstate_init(fp_mstate *m, fp_bidx *x, fp_meta *meta, uint64_t base, uint64_t size, uint64_t lo, uint64_t hi)
{
    if (bidx_init(x, meta, base, size) != 0)
        return -1;
    x->keep = 1;
    m->base = base;
    m->end = base + size;
    m->lo = lo;
    m->hi = hi;
    m->leaves = x->leaves;
    return 0;
}
