/* space.h - where a pool's chunks go, and who may change it: the device's
 * chunks, the reservation's free ranges, the page map, the metadata arena
 * and the pool lock that guards the ranges and the page map's writers.
 * Every layer above (heap, buffers, views, thread caches) works in one
 * fp_space; pool.h owns it.  Header only: nothing to call but an inline. */
#ifndef FP_SPACE_H
#define FP_SPACE_H

#include <stdint.h>

#include "chunk.h"
#include "lock.h"
#include "meta.h"
#include "pagemap.h"
#include "vaspace.h"

/* The page map's unit, 64 KiB: a slab is a run of pages, so that a few of
 * them fit in a granule and a class holds a page or two, not a granule. */
#define FP_PAGE_SHIFT 16u

typedef struct fp_space {
    fp_chunks *ch;
    fp_meta *meta;
    fp_lock_t lock;                    /* the pool lock, level FP_LOCK_POOL (lock.h says what it guards) */
    fp_vaspace va;                     /* under the lock */
    fp_pagemap map;                    /* written under the lock, read without */
    uint64_t gran;                     /* the granularity: chunks and ranges are multiples of it */
    unsigned gran_shift;
    unsigned page_shift;               /* the page map's unit: FP_PAGE_SHIFT, or the granularity if smaller */
} fp_space;

/* The reservation that fabpool_check's walks (walk.h) check against: the
 * range the page map covers, its granularity and page. */
static inline void fp_space_walk_init(const fp_space *sp, fp_walk *w)
{
    w->va_base = sp->map.base;
    w->va_size = sp->map.size;
    w->gran = sp->gran;
    w->page_shift = sp->page_shift;
}

#endif
