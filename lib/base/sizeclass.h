/* sizeclass.h - the size-class grid: 64 and 128 bytes, every multiple of
 * 256 up to 1024 (256, 512, 768, 1024), then four classes per doubling
 * (1280, 1536, 1792, 2048, 2560, ...).  Above 1024 bytes the class is at
 * most 1.25x the size asked (the worst case is 2^k + 1, which gets
 * 1.25 * 2^k); from 257 to 1024 bytes the class is the size rounded up to
 * 256 (at most 2x: 257 gets 512), the price of the alignment below, since a
 * class of that range that is not a multiple of 256 (320, 384, 448, 640,
 * 896) cannot give 256-aligned blocks; up to 256 bytes the class is the size
 * rounded up to a power of two, at least 64.
 *
 * Slabs serve the classes up to slab_max.  Above it a block is its size
 * rounded up to 256 bytes (the arenas' quantum), with no class (lib/heap/
 * large.c); the grid then only buckets those blocks in the statistics.
 *
 * Alignment, as cudaMalloc and RMM (CUDA_ALLOCATION_ALIGNMENT, 256 bytes): a
 * block of a slab lies at a multiple of its class size from the slab's
 * page-aligned base, so a block of a class of 256 bytes or more is aligned to
 * 256, and one of class 64 or 128 to its class: every block to its size
 * rounded up to a power of two, at most 256.  A class that is a multiple of
 * a larger power of two up to the page (1024, 2048, 4096, ...) gives blocks
 * aligned to it, which fabpool_alloc_aligned uses (lib/api/aligned.c).
 * Block offsets in a slab are counted in 64-byte quanta (FP_QUANTUM_SHIFT). */
#ifndef FP_SIZECLASS_H
#define FP_SIZECLASS_H

#include <stddef.h>
#include <stdint.h>

#define FP_MIN_ALIGN 64u               /* every block is at least this aligned (the smallest class) */
#define FP_QUANTUM_SHIFT 6u            /* block offsets in a slab, in 64-byte units */
#define FP_NCLASS 173                  /* the grid up to 2^51 bytes: more than any reservation (1 PiB) */
#define FP_CLASS_STEP_MAX 1024u        /* classes up to this: 64, 128, then the multiples of 256 */
#define FP_BLOCK_ALIGN 256u            /* a block of at least this size is aligned to it (cudaMalloc's) */
#define FP_SLAB_MAX_LIMIT (64ull << 20)  /* the largest slab_max */
/* the largest reservation (reserve) and chunk (max_chunk): sizes up to it add and round without overflow */
#define FP_RESERVE_MAX (1ull << 50)

static inline unsigned fp_log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

/* Index of the smallest class >= size (size >= 1; 0 lands in the first class, though no caller asks).  Up to
 * 1024 bytes one load from a table by the size in 64-byte steps, (size + 63) / 64 (a computed index took 12
 * more instructions an allocation and free: perf/insn_count.sh). */
static inline unsigned fp_class_of(uint64_t size)
{
    static const uint8_t up_to_1k[17] = {0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5};
    if (size <= FP_CLASS_STEP_MAX)
        return up_to_1k[(size + 63) >> 6];
    uint64_t s = size - 1;
    unsigned lg = fp_log2_floor(s);
    return 6u + (lg - 10u) * 4u + (unsigned)((s - (1ull << lg)) >> (lg - 2u));
}

/* Size of class idx. */
static inline uint64_t fp_class_size(unsigned idx)
{
    if (idx < 2)
        return 64ull << idx;
    if (idx < 6)
        return (uint64_t)(idx - 1) << 8;
    unsigned g = (idx - 6) / 4, k = (idx - 6) % 4;
    return (1ull << (10 + g)) + (uint64_t)(k + 1) * (1ull << (8 + g));
}

/* The alignment every block of a request of `size` bytes gets (size >= 1): the size rounded up to a power of
 * two, at most FP_BLOCK_ALIGN. */
static inline uint64_t fp_block_align(uint64_t size)
{
    if (size >= FP_BLOCK_ALIGN)
        return FP_BLOCK_ALIGN;
    return size <= FP_MIN_ALIGN ? FP_MIN_ALIGN : 2ull << fp_log2_floor(size - 1);
}

static inline uint64_t fp_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* Largest class <= x that is a multiple of `gran` (0 if none). */
uint64_t fp_class_round_down_gran(uint64_t x, uint64_t gran);
/* Smallest class >= x that is a multiple of `gran`. */
uint64_t fp_class_round_up_gran(uint64_t x, uint64_t gran);

#endif
