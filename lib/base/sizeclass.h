/* sizeclass.h - the size-class grid: one class of 256 bytes for every size up
 * to 256, then four classes per doubling (320, 384, 448, 512, 640, 768, 896,
 * 1024, 1280, ...), so that for every size above 256 bytes the class is at
 * most 1.25x the size asked (the worst case is 2^k + 1, which gets 1.25 * 2^k).
 *
 * Slabs serve the classes up to slab_max.  Above it a block is its size
 * rounded up to the granularity, with no class (lib/slab.c); the grid then
 * only buckets those blocks in the statistics.
 *
 * Alignment: a block of a slab lies at a multiple of its class size from the
 * slab's granule-aligned base, so it is aligned to the largest power of two
 * that divides the class size, capped at 256: every class that is a multiple
 * of 256 (256, 512, 768 and every class from 1024 on) gives 256-aligned
 * blocks; 384, 640 and 896 give 128; 320 and 448 give 64.  Block offsets in a
 * slab are therefore counted in 64-byte quanta (FP_QUANTUM). */
#ifndef FP_SIZECLASS_H
#define FP_SIZECLASS_H

#include <stddef.h>
#include <stdint.h>

#define FP_MIN_ALIGN 64u               /* every block is at least this aligned */
#define FP_QUANTUM_SHIFT 6u            /* block offsets in a slab, in 64-byte units */
#define FP_NCLASS 176                  /* the grid up to 2^51 bytes: more than any reservation (1 PiB) */
#define FP_SLAB_MAX_LIMIT (64ull << 20)  /* the largest slab_max */

static inline unsigned fp_log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

/* Index of the smallest class >= size (size >= 1). */
static inline unsigned fp_class_of(uint64_t size)
{
    if (size <= 256)
        return 0;
    uint64_t s = size - 1;
    unsigned lg = fp_log2_floor(s);
    return 1u + (lg - 8u) * 4u + (unsigned)((s - (1ull << lg)) >> (lg - 2u));
}

/* Size of class idx. */
static inline uint64_t fp_class_size(unsigned idx)
{
    if (idx == 0)
        return 256;
    unsigned g = (idx - 1) / 4, k = (idx - 1) % 4;
    return (1ull << (8 + g)) + (uint64_t)(k + 1) * (1ull << (6 + g));
}

static inline uint64_t fp_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* Largest class <= x that is a multiple of `gran` (0 if none). */
uint64_t fp_class_round_down_gran(uint64_t x, uint64_t gran);
/* Smallest class >= x that is a multiple of `gran`. */
uint64_t fp_class_round_up_gran(uint64_t x, uint64_t gran);

#endif
