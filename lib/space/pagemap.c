/* pagemap.c - the page map (pagemap.h). */
#include "pagemap.h"

int fp_map_init(fp_pagemap *m, fp_meta *meta, const fp_lock_t *lock, uint64_t base, uint64_t size, unsigned shift)
{
    m->meta = meta;
    m->lock = lock;
    m->base = base;
    m->size = size;
    m->shift = shift;
    m->l1_n = ((size >> shift) + FP_MAP_LEAF - 1) >> FP_MAP_LEAF_SHIFT;
    m->l1 = fp_meta_alloc(meta, m->l1_n * sizeof *m->l1);
    return m->l1 ? 0 : -1;
}

int fp_map_set(fp_pagemap *m, uint64_t addr, uint64_t size, struct fp_span *s)
{
    fp_lock_assert_held(m->lock);
    uint64_t g0 = (addr - m->base) >> m->shift, n = size >> m->shift;
    for (uint64_t g = g0; g < g0 + n; g++) {
        _Atomic(struct fp_span *) *leaf = atomic_load_explicit(&m->l1[g >> FP_MAP_LEAF_SHIFT], memory_order_acquire);
        if (!leaf) {
            if (!s)
                continue;
            leaf = fp_meta_alloc(m->meta, FP_MAP_LEAF * sizeof *leaf);
            if (!leaf) {
                if (g > g0)
                    fp_map_set(m, addr, (g - g0) << m->shift, NULL);
                return -1;
            }
            atomic_store_explicit(&m->l1[g >> FP_MAP_LEAF_SHIFT], leaf, memory_order_release);
        }
        atomic_store_explicit(&leaf[g & (FP_MAP_LEAF - 1)], s, memory_order_release);
    }
    return 0;
}

void fp_map_destroy(fp_pagemap *m)
{
    if (!m->l1)
        return;
    for (uint64_t i = 0; i < m->l1_n; i++) {
        _Atomic(struct fp_span *) *leaf = atomic_load(&m->l1[i]);
        if (leaf)
            fp_meta_free(m->meta, (void *)leaf, FP_MAP_LEAF * sizeof *leaf);
    }
    fp_meta_free(m->meta, (void *)m->l1, m->l1_n * sizeof *m->l1);
    m->l1 = NULL;
}

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* Nothing else in the page map: it holds as many entries as the arenas'
 * chunks have pages (w->map_pages). */
fabpool_status fp_map_check_count(const fp_pagemap *m, const fp_walk *w)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < m->l1_n; i++) {
        _Atomic(struct fp_span *) *leaf = atomic_load_explicit(&m->l1[i], memory_order_acquire);
        if (!leaf)
            continue;
        for (unsigned g = 0; g < FP_MAP_LEAF; g++)
            if (atomic_load_explicit(&leaf[g], memory_order_relaxed)) {
                n++;
                if (n > w->map_pages)
                    return FAIL("[map.stray] the page map sends 0x%llx to a span, but no chunk of the heap is there",
                                ULL(w->va_base + (((i << FP_MAP_LEAF_SHIFT) + g) << w->page_shift)));
            }
    }
    return FABPOOL_OK;
}
