/* shapes.h - the allocation shapes of fabpool_bench's mixed, activations and
 * loguniform workloads, as a seeded stream of operations that a caller
 * replays against any allocator (the bench, and tests/test_layout.c, which
 * draws their parameters at random).
 *
 * Mixed shapes (RMM's random_allocations): up to n_live blocks live, each
 * operation allocates (the more likely the fewer are live) or frees a
 * random live block; sizes uniform in 1..max_size, normal around max_size/2
 * (sigma max_size/6, clamped to 1..max_size), or log-uniform in
 * min_size..max_size.  Steps: each step draws a length in len_lo..len_hi,
 * then for each of `layers` layers allocates one block per factor of
 * factor x length x unit bytes, and at its end frees every block in
 * reverse order (a training step's activations).
 *
 * Families the layout was not tuned to (fabpool_bench --workload families):
 * FIFO, log-uniform sizes in min_size..max_size, the oldest block freed once
 * n_live are live (a queue of requests); realloc, a buffer that grows by a
 * quarter from min_size to max_size and starts again, the new size
 * allocated before the old is freed (a tensor grown by copying, as
 * torch.cat in a loop does), `layers` blocks log-uniform in 4 KiB..2 MiB
 * allocated at each growth and random ones freed down to n_live; Pareto,
 * heavy-tailed sizes min_size / (1 - u)^(1 / 0.8) up to max_size, random
 * frees as the mixed shapes; drift, normal sizes (sigma a quarter of the
 * mean) whose mean moves from min_size to max_size over the run, random
 * frees as the mixed shapes. */
#ifndef FABPOOL_SHAPES_H
#define FABPOOL_SHAPES_H

#include <stdint.h>

enum { SHAPE_UNIFORM = 0, SHAPE_NORMAL = 1, SHAPE_LOGU = 2, SHAPE_STEPS = 3, SHAPE_FIFO = 4, SHAPE_REALLOC = 5,
       SHAPE_PARETO = 6, SHAPE_DRIFT = 7 };

#define SHAPE_FACTORS 8

typedef struct shape {
    int kind;
    uint64_t seed;
    /* uniform, normal, log-uniform */
    int n_live;
    long n_ops;
    uint64_t min_size, max_size;
    /* steps */
    int steps, layers, n_factors;
    int factors[SHAPE_FACTORS];
    uint64_t unit;
    int len_lo, len_hi;
} shape;

typedef struct shape_run {
    shape s;
    uint64_t rng;
    long done, total;
    int nlive;
    int step, left, len;               /* steps: the step, blocks left to allocate in it, its length */
    /* FIFO and realloc free particular blocks: each block's id (the count of allocations before it) and the
     * caller's slot of each, kept as the caller moves its last live block into a freed slot */
    long *slot_id, *id_slot;
    long next_id, oldest;              /* the next id; FIFO: the oldest live */
    long big, fresh;                   /* realloc: the buffer's id (-1: none), and its successor's */
    int phase;                         /* realloc: 0 allocate the next size, 1 free the old one, 2 free small blocks */
    uint64_t big_size;
} shape_run;

/* splitmix64, and a uniform [0, 1) and a standard normal draw from it */
uint64_t shape_rng(uint64_t *state);
double shape_unit(uint64_t *state);
double shape_normal(uint64_t *state);

/* 0, or -1 without host memory (FIFO and realloc keep an array of ids); shape_end frees it. */
int shape_start(shape_run *r, const shape *s);
void shape_end(shape_run *r);
/* The next operation: 1 with *size > 0 (allocate *size bytes), or 1 with
 * *size == 0 (free the live block at *index; the caller then moves its last
 * live block to *index); 0 when the shape is over. */
int shape_next(shape_run *r, uint64_t *size, int *index);
/* Operations in all. */
long shape_ops(const shape *s);
/* Blocks live at most. */
int shape_max_live(const shape *s);

#endif
