/* arena_grow.h - an arena's growth on a miss (arena_grow.c), in two steps
 * so that the heap may trim between them: the plan, then the map. */
#ifndef FP_ARENA_GROW_H
#define FP_ARENA_GROW_H

#include "arena.h"

/* A miss of n bytes aligned to align: chooses the range to map for them
 * (and, with ahead_ok, fp_arena_ahead more), rounded up to the
 * granularity, holds the free range it grows and takes the address space.
 * FABPOOL_ERR_LIMIT when the reservation has no room. */
fabpool_status fp_arena_grow_plan(fp_arena *a, uint64_t n, uint64_t align, int ahead_ok, fp_arena_grow *gr);
/* Maps the plan and cuts the block of n bytes (aligned as planned) from it:
 * *out.  On failure the arena is as before the plan (its range back in the
 * reservation). */
fabpool_status fp_arena_grow_map(fp_arena *a, fp_arena_grow *gr, uint64_t n, uint64_t align, fp_piece **out);
/* Gives a plan up (the range held goes back). */
void fp_arena_grow_cancel(fp_arena *a, fp_arena_grow *gr);

#endif
