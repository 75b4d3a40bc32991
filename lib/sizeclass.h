/* sizeclass.h - size classes spaced as jemalloc's: 256-byte steps up to
 * 1 KiB, then four classes per doubling.  Every class is a multiple of 256,
 * so every block of a slab with a 256-aligned base is 256-aligned. */
#ifndef FP_SIZECLASS_H
#define FP_SIZECLASS_H

#include <stddef.h>
#include <stdint.h>

#define FP_MIN_ALIGN 256u
#define FP_NCLASS 128                  /* up to 2^41 bytes: more than any device has */

static inline unsigned fp_log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

/* Index of the smallest class >= size (size >= 1). */
static inline unsigned fp_class_of(uint64_t size)
{
    if (size <= 1024)
        return (unsigned)((size + 255) >> 8) - 1u;
    uint64_t s = size - 1;
    unsigned lg = fp_log2_floor(s);
    return 4u + (lg - 10u) * 4u + (unsigned)((s - (1ull << lg)) >> (lg - 2u));
}

/* Size of class idx. */
static inline uint64_t fp_class_size(unsigned idx)
{
    if (idx < 4)
        return 256ull * (idx + 1);
    unsigned g = (idx - 4) / 4, k = (idx - 4) % 4;
    return (1ull << (10 + g)) + (uint64_t)(k + 1) * (1ull << (8 + g));
}

static inline uint64_t fp_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* Largest class <= x that is a multiple of `gran` (0 if none). */
uint64_t fp_class_round_down_gran(uint64_t x, uint64_t gran);
/* Smallest class >= x that is a multiple of `gran`. */
uint64_t fp_class_round_up_gran(uint64_t x, uint64_t gran);

#endif
