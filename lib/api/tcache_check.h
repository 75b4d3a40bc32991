/* tcache_check.h - fabpool_check's walk of the thread caches (walk.h),
 * under every class lock: the pool's list, and the calling thread's cached
 * blocks of h's slab classes into w->tc, sorted by slab; w->exact
 * when no other thread's cache is listed. */
#ifndef FP_TCACHE_CHECK_H
#define FP_TCACHE_CHECK_H

#include "alloc.h"
#include "walk.h"

fabpool_status fp_tcaches_check(const fp_alloc *a, const fp_heap *h, fp_walk *w);

#endif
