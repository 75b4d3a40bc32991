/* space.h - where a pool's chunks go, and who may change it: the device's
 * chunks, the reservation's free ranges, the page map, the metadata arena
 * and the pool lock that guards the ranges and the page map's writers.
 * Every layer above (heap, buffers, views, thread caches) works in one
 * fp_space; pool.h owns it.  The reservation is made, checked and freed in
 * space.c; the lock and the reservation's bounds are read through the
 * macros and inlines below. */
#ifndef FP_SPACE_H
#define FP_SPACE_H

#include <stdint.h>

#include "chunk.h"
#include "fabpool.h"
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

/* The pool lock, taken, let go and asserted: macros, so that a lock-checked
 * build (lock.h) names the caller. */
#define fp_space_lock(sp) fp_lock(&(sp)->lock)
#define fp_space_unlock(sp) fp_unlock(&(sp)->lock)
#define fp_space_assert_locked(sp) fp_lock_assert_held(&(sp)->lock)
/* The pool lock itself, for the device's chunks to assert (chunk.h). */
static inline const fp_lock_t *fp_space_pool_lock(const fp_space *sp) { return &sp->lock; }

/* The reservation's base, size and granularity: set at creation, never
 * changed, read without a lock. */
static inline uint64_t fp_space_base(const fp_space *sp) { return sp->va.base; }
static inline uint64_t fp_space_size(const fp_space *sp) { return sp->va.size; }
static inline uint64_t fp_space_gran(const fp_space *sp) { return sp->gran; }

/* The pool lock set up, over the device's chunks and the metadata arena;
 * nothing reserved yet. */
void fp_space_init(fp_space *sp, fp_chunks *ch, fp_meta *meta);
/* Reserves size bytes (a multiple of gran, the driver's granularity, a
 * power of two) of address space for the pool. */
fabpool_status fp_space_reserve(fp_space *sp, uint64_t gran, uint64_t size);
/* The page map and the free ranges over the reservation. */
fabpool_status fp_space_map_init(fp_space *sp);
/* Frees the page map, the ranges and the reservation (tried twice: the
 * status says when the driver refused) and destroys the lock. */
fabpool_status fp_space_destroy(fp_space *sp);

/* Gives [va, va + size), a range of the reservation its user no longer needs, back to the free ranges, but
 * for the stuck mappings in it (chunk.h: mappings the driver would not unmap): their ranges are held until
 * fp_space_unstick unmaps them, so that nothing is mapped under them.  Every range a layer gave up goes through
 * it.  -1 where host memory for the free ranges ran out (harmless, as fp_va_free's).  Pool lock held. */
int fp_space_free_range(fp_space *sp, uint64_t va, uint64_t size);
/* Tries again to unmap every stuck mapping, and frees the ranges held for them: FABPOOL_OK, or the first
 * refusal (what is refused stays for the next try).  The collects call it (fabpool_collect, trim, destroy,
 * wake).  Pool lock held. */
fabpool_status fp_space_unstick(fp_space *sp);

/* fabpool_check's walks (walk.h), pool lock held: the free ranges against
 * themselves; the chunks exported for blocks (w->kept) against the page
 * map; the address space in use against the free ranges; the page map's
 * count of entries. */
fabpool_status fp_space_check_ranges(const fp_space *sp, fp_walk *w);
fabpool_status fp_space_check_kept(const fp_space *sp, const fp_walk *w);
fabpool_status fp_space_check_used(const fp_space *sp, fp_walk *w);
fabpool_status fp_space_check_pages(const fp_space *sp, fp_walk *w);

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
