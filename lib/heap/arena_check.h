/* arena_check.h - fabpool_check's walk of the arenas (walk.h), pool lock
 * held: each arena's chunks, runs, pieces, bins and table of blocks, the
 * heap's count of large blocks besides the slabs (after fp_slabs_check),
 * and the streams recorded for live blocks in rt. */
#ifndef FP_ARENA_CHECK_H
#define FP_ARENA_CHECK_H

#include "retire.h"
#include "slab.h"
#include "walk.h"

fabpool_status fp_arenas_check(const fp_heap *h, fp_walk *w, fp_retire *rt);

#endif
