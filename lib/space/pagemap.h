/* pagemap.h - the page map: page of the pool's reservation (FP_PAGE_SHIFT,
 * space.h) -> the span that covers it: a slab, or the sentinel of the arena
 * whose chunk maps it (arena.h).  Two levels, leaves (of 2^14 pages: a GiB)
 * made on first use; read without a lock (fabpool_free's lookup), written
 * under the pool lock.  It stores span pointers and never looks into them.
 */
#ifndef FP_PAGEMAP_H
#define FP_PAGEMAP_H

#include <stdatomic.h>
#include <stdint.h>

#include "lock.h"
#include "meta.h"
#include "walk.h"

struct fp_span;

#define FP_MAP_LEAF_SHIFT 14
#define FP_MAP_LEAF (1u << FP_MAP_LEAF_SHIFT)

typedef struct fp_pagemap {
    uint64_t base, size;               /* the reservation it covers */
    unsigned shift;                    /* log2 of the granularity */
    _Atomic(struct fp_span *) *_Atomic *l1; /* made at init, never moved: a copy of the handle reads alike */
    uint64_t l1_n;
    fp_meta *meta;
    const fp_lock_t *lock;             /* held by every writer (asserted) */
} fp_pagemap;

/* The first level for [base, base + size) in pages of 1 << shift: 0, or -1 without host memory. */
int fp_map_init(fp_pagemap *m, fp_meta *meta, const fp_lock_t *lock, uint64_t base, uint64_t size, unsigned shift);
void fp_map_destroy(fp_pagemap *m);

/* Points every page of [addr, addr + size) at s (NULL: clears).  -1 if a
 * leaf could not be made (what this call set is cleared again); a range
 * whose leaves exist (it was set before) cannot fail. */
int fp_map_set(fp_pagemap *m, uint64_t addr, uint64_t size, struct fp_span *s);

/* The span of addr's page, or NULL.  One comparison for the range (an address below the base wraps above the
 * size): fabpool_free's fast path looks up every block here. */
static inline struct fp_span *fp_map_get(const fp_pagemap *m, uint64_t addr)
{
    uint64_t off = addr - m->base;
    if (__builtin_expect(off >= m->size, 0))
        return NULL;
    uint64_t g = off >> m->shift;
    _Atomic(struct fp_span *) *leaf = atomic_load_explicit(&m->l1[g >> FP_MAP_LEAF_SHIFT], memory_order_acquire);
    return leaf ? atomic_load_explicit(&leaf[g & (FP_MAP_LEAF - 1)], memory_order_acquire) : NULL;
}

/* fabpool_check's walk (walk.h): the map holds no more entries than the
 * w->map_pages that the heap's walk counted. */
fabpool_status fp_map_check_count(const fp_pagemap *m, const fp_walk *w);

#endif
