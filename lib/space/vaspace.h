/* vaspace.h - carving address ranges out of the pool's one reservation.
 * First fit over a sorted list of free ranges, merged on free.  Called on
 * cold paths only (a new slab, span or buffer window), under the pool lock. */
#ifndef FP_VASPACE_H
#define FP_VASPACE_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"
#include "walk.h"

typedef struct fp_range {
    uint64_t start, size;
} fp_range;

typedef struct fp_vaspace {
    uint64_t base, size;
    fp_range *free;   /* sorted by start, never adjacent */
    size_t n, cap;
    uint64_t free_bytes;
    fp_meta *meta;
} fp_vaspace;

int fp_va_init(fp_vaspace *v, fp_meta *meta, uint64_t base, uint64_t size);
void fp_va_destroy(fp_vaspace *v);
/* A range of `size` bytes aligned to `align` (a power of two); 0 if none. */
uint64_t fp_va_alloc(fp_vaspace *v, uint64_t size, uint64_t align);
/* The same, from the top of the reservation down (large blocks: they grow
 * into free address space next to them, away from slabs and buffers). */
uint64_t fp_va_alloc_top(fp_vaspace *v, uint64_t size, uint64_t align);
/* The same, below `limit` if a free range there holds it (the highest one),
 * else as fp_va_alloc_top: a heap's home in the reservation, kept apart from
 * the other heaps' so that each grows into free space beside its own. */
uint64_t fp_va_alloc_top_below(fp_vaspace *v, uint64_t size, uint64_t align, uint64_t limit);
/* Takes exactly [start, start + size) if it is free: 0, else -1. */
int fp_va_take(fp_vaspace *v, uint64_t start, uint64_t size);
/* Returns -1 if host memory for the list ran out (the range is then lost
 * to reuse, which is harmless: the reservation is freed whole at destroy). */
int fp_va_free(fp_vaspace *v, uint64_t start, uint64_t size);

/* fabpool_check's walks (walk.h): the free list against itself and the
 * reservation w names; then the ranges in use that the layers above added
 * to w against the free ones (sorts them). */
fabpool_status fp_va_check(const fp_vaspace *v, const fp_walk *w);
fabpool_status fp_va_check_used(const fp_vaspace *v, fp_walk *w);

#endif
