/* arena_trim.h - an arena's free chunks unmapped, and the sizes of its
 * recent blocks (arena_trim.c).  Pool lock held. */
#ifndef FP_ARENA_TRIM_H
#define FP_ARENA_TRIM_H

#include "arena.h"

/* Unmaps chunks that lie wholly in free ranges (not held ones), those in
 * the smallest ranges first, until goal bytes went back or none is left;
 * returns the bytes unmapped.  fit != 0: free ranges of fit bytes or more
 * keep at least `keep` bytes among them (fit == 0: no range is kept). */
uint64_t fp_arena_unmap_free(fp_arena *a, uint64_t goal, uint64_t fit, uint64_t keep);
/* The size of the rank-th smallest (from 0) of the arena's last
 * FP_ARENA_RATE blocks (rank scaled down while fewer were cut); 0 if none. */
uint64_t fp_arena_recent_size(const fp_arena *a, unsigned rank);
#endif
