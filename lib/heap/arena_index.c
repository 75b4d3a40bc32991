/* arena_index.c - the leaves of an arena's direct index of blocks and of
 * its blocks' states (arena_index.h). */
#include "arena_index.h"

#include <string.h>

#define BIDX_LEAF_BYTES (FP_BIDX_LEAF_IDS * sizeof(fp_rid))
#define MSTATE_LEAF_BYTES ((1ull << FP_MSTATE_LEAF_SHIFT) >> FP_PIECE_UNIT_SHIFT)

int fp_bidx_reserve(fp_bidx *x, fp_meta *meta, uint64_t rbase, uint64_t rsize, uint64_t va, uint64_t size)
{
    if (!x->leaves) {
        size_t n = (size_t)((rsize + (1ull << FP_BIDX_LEAF_SHIFT) - 1) >> FP_BIDX_LEAF_SHIFT);
        x->leaves = fp_meta_alloc(meta, n * sizeof *x->leaves); /* zeroed: no leaf made */
        if (!x->leaves)
            return -1;
        x->base = rbase;
        x->size = rsize;
    }
    if (!size || va - x->base >= x->size || size > x->size - (va - x->base))
        return 0; /* nothing an arena can map */
    for (uint64_t l = (va - x->base) >> FP_BIDX_LEAF_SHIFT; l <= (va + size - 1 - x->base) >> FP_BIDX_LEAF_SHIFT; l++)
        if (!x->leaves[l] && !(x->leaves[l] = fp_meta_alloc(meta, BIDX_LEAF_BYTES)))
            return -1;
    return 0;
}

void fp_bidx_leaf_free(fp_bidx *x, fp_meta *meta, uint64_t l)
{
    if (!x->leaves || !x->leaves[l])
        return;
    fp_meta_free(meta, x->leaves[l], BIDX_LEAF_BYTES);
    x->leaves[l] = NULL;
}

void fp_bidx_free(fp_bidx *x, fp_meta *meta)
{
    if (!x->leaves)
        return;
    size_t n = (size_t)((x->size + (1ull << FP_BIDX_LEAF_SHIFT) - 1) >> FP_BIDX_LEAF_SHIFT);
    for (size_t l = 0; l < n; l++)
        fp_bidx_leaf_free(x, meta, l);
    fp_meta_free(meta, x->leaves, n * sizeof *x->leaves);
    memset(x, 0, sizeof *x);
}

int fp_mstate_init(fp_mstate *m, fp_meta *meta, uint64_t base, uint64_t size, uint64_t lo, uint64_t hi)
{
    uint64_t n = (size + (1ull << FP_MSTATE_LEAF_SHIFT) - 1) >> FP_MSTATE_LEAF_SHIFT;
    /* the pool's metadata, as every other table (zeroed: an index of leaves, most never made) */
    m->leaves = fp_meta_alloc(meta, n * sizeof *m->leaves);
    if (!m->leaves)
        return -1;
    m->base = base;
    m->end = base + size;
    m->lo = lo;
    m->hi = hi;
    return 0;
}

_Atomic uint8_t *fp_mstate_make(fp_mstate *m, fp_meta *meta, uint64_t addr)
{
    if (addr - m->base >= m->end - m->base)
        return NULL;
    /* written through now, not left to fault page by page under the blocks' calls that touch it first */
    _Atomic uint8_t *leaf = fp_meta_alloc(meta, MSTATE_LEAF_BYTES); /* zeroed */
    if (!leaf)
        return NULL;
    atomic_store_explicit(&m->leaves[(addr - m->base) >> FP_MSTATE_LEAF_SHIFT], leaf, memory_order_release);
    return fp_mstate_at(m, addr);
}

void fp_mstate_free(fp_mstate *m, fp_meta *meta)
{
    if (!m->leaves)
        return;
    uint64_t n = (m->end - m->base + (1ull << FP_MSTATE_LEAF_SHIFT) - 1) >> FP_MSTATE_LEAF_SHIFT;
    for (uint64_t i = 0; i < n; i++)
        fp_meta_free(meta, (void *)atomic_load_explicit(&m->leaves[i], memory_order_relaxed), MSTATE_LEAF_BYTES);
    fp_meta_free(meta, (void *)m->leaves, n * sizeof *m->leaves);
    m->leaves = NULL;
}
