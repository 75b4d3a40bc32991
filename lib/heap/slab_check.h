/* slab_check.h - fabpool_check's walks of the slabs and the page map
 * (walk.h), under the pool lock and every class lock: the slabs, their
 * blocks, the calling thread's cached blocks (w->tc) and the class lists;
 * the page map against the arenas' chunks and the slabs, counting
 * w->map_pages; and the class locks that the walk holds. */
#ifndef FP_SLAB_CHECK_H
#define FP_SLAB_CHECK_H

#include "slab.h"
#include "walk.h"

fabpool_status fp_slabs_check(const fp_heap *h, fp_walk *w);
fabpool_status fp_heap_map_check(const fp_heap *h, fp_walk *w);
/* Takes every slab class's lock in ascending index (lock.h), and lets them go. */
void fp_heap_lock_classes(fp_heap *h);
void fp_heap_unlock_classes(fp_heap *h);

#endif
