/* array.h - growable arrays of host metadata: an element pointer, a count
 * and a capacity, grown by doubling into fp_meta memory (or libc's, with
 * no arena).  The one growth rule for every array of lib/: the address
 * space's free ranges, the large chunks, a buffer's chunks and peer holds, a
 * view's chunks and the registry of live pools. */
#ifndef FP_ARRAY_H
#define FP_ARRAY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "meta.h"

/* Makes room for `need` elements of `elem` bytes in *(void **)items, which
 * holds `n` now in a capacity of *cap (0 with a NULL array): a new array of
 * twice the capacity (at least `first`, then doubled until need fits), the n
 * elements copied, the old one freed.  meta NULL: libc.  0, or -1 with the
 * array as it was when no host memory is left. */
int fp_array_reserve(fp_meta *meta, void *items, size_t elem, size_t n, size_t *cap, size_t need, size_t first);

/* FP_ARRAY_RESERVE(meta, b->chunks, b->n, b->cap, b->n + 1, 8) */
#define FP_ARRAY_RESERVE(meta, arr, n, cap, need, first) \
    fp_array_reserve((meta), &(arr), sizeof *(arr), (n), &(cap), (need), (first))

/* Binary search: the index of the first of n elements (elem bytes each,
 * sorted by the uint64_t at byte key_off) whose key is >= key; n if none. */
static inline size_t fp_array_lower(const void *items, size_t n, size_t elem, size_t key_off, uint64_t key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t k;
        memcpy(&k, (const char *)items + mid * elem + key_off, sizeof k);
        if (k < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
/* FP_ARRAY_LOWER(a->chunks, a->n_chunks, fp_lchunk, va, addr) */
#define FP_ARRAY_LOWER(arr, n, type, field, key) \
    fp_array_lower((arr), (n), sizeof(type), offsetof(type, field), (key))

/* Frees an array made by fp_array_reserve and leaves it empty. */
void fp_array_free(fp_meta *meta, void *items, size_t elem, size_t *cap);
#define FP_ARRAY_FREE(meta, arr, cap) fp_array_free((meta), &(arr), sizeof *(arr), &(cap))

#endif
