/* pattern.h - a test's data in device memory: a block filled with words of a seed, and read back whole. */
#ifndef FP_TEST_PATTERN_H
#define FP_TEST_PATTERN_H

#include <stdint.h>
#include <stdlib.h>

#include "testutil.h"

/* Word i of the pattern of seed (splitmix64's finalizer: neighbours and seeds differ in every bit). */
static inline uint64_t pattern_word(uint64_t seed, uint64_t i)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 29);
}

/* The block at ptr filled with the pattern of seed (size rounded down to words). */
static inline void pattern_fill(void *ptr, size_t size, uint64_t seed)
{
    size_t n = size / 8;
    uint64_t *h = malloc(n * 8);
    for (size_t i = 0; i < n; i++)
        h[i] = pattern_word(seed, i);
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)ptr, h, n * 8));
    free(h);
}

/* Whether the block at ptr reads back as the pattern of seed. */
static inline int pattern_intact(const void *ptr, size_t size, uint64_t seed)
{
    size_t n = size / 8;
    uint64_t *h = malloc(n * 8);
    int ok = h && cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)ptr, n * 8) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < n; i++)
        ok = h[i] == pattern_word(seed, i);
    free(h);
    return ok;
}

#endif
