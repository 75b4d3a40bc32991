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
        for (unsigned c = 0; c < n_classes; c++)
            for (uint32_t i = 0; i < fp_bin_n(tc, c); i++)
                w->tc[w->n_tc++] = (fp_tc_ref){fp_map_get(&a->map, tc->lo[c][i].ptr), tc->lo[c][i].ptr, c};
    }
    if (w->n_tc)
        qsort(w->tc, w->n_tc, sizeof *w->tc, tc_cmp);
    return FABPOOL_OK;
}
