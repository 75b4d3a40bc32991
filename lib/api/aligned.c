/* aligned.c - fabpool_alloc_aligned: a block whose base is a multiple of an
 * alignment larger than the one every block gets (sizeclass.h: the size
 * rounded up to a power of two, at most 256 bytes).
 *
 * No path of its own: the block is fabpool_alloc's, of a size chosen so that
 * it comes out aligned, and so frees with fabpool_free and works with every
 * call that takes a block.  Up to slab_max, a slab class that is a multiple
 * of the alignment (a slab's page-aligned base then aligns every block of
 * it); above, a block of the arenas, placed on a multiple of the alignment
 * (fp_alloc_align_next) for the one fabpool_alloc call. */
#include "alloc.h"

#include "error.h"
#include "large.h"

fabpool_status fabpool_alloc_aligned(fabpool_t *p, size_t size, size_t alignment, void **out)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_aligned: the pool is NULL");
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_aligned: the output pointer is NULL");
    *out = NULL;
    if (fp_device_forked(a->sp->ch))
        return fp_device_forked_error(a->sp->ch, "fabpool_alloc_aligned");
    uint64_t gran = fp_space_gran(a->sp);
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > gran)
        return fp_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_alloc_aligned: an alignment of %zu bytes; give a power of two from 1 to %llu "
                        "bytes (this pool's allocation granularity)", alignment, (unsigned long long)gran);
    if (size == 0)   /* as fabpool_alloc: success and NULL */
        return FABPOOL_OK;
    uint64_t slab_max = fp_heap_slab_max(a->heap);
    if (size <= slab_max ? alignment <= fp_block_align(size) : alignment <= FP_BLOCK_QUANTUM)
        return fabpool_alloc(p, size, out);   /* every block of this size is aligned so already */

    uint64_t ask = size;
    if (size <= slab_max) {
        /* the smallest class that holds the size and is a multiple of the alignment, if a slab serves it
         * and its page aligns it; else a block above slab_max */
        uint64_t c = fp_class_round_up_gran(size > alignment ? size : alignment, alignment);
        if (c <= slab_max && alignment <= fp_heap_slab_align(a->heap))
            return fabpool_alloc(p, c, out);
        ask = slab_max + 1;
    }
    uint64_t was = fp_alloc_align_next(alignment);
    fabpool_status st = fabpool_alloc(p, ask, out);
    fp_alloc_align_next(was);
    if (st != FABPOOL_OK)
        fp_error_append(" (fabpool_alloc_aligned: %zu bytes aligned to %zu)", size, alignment);
    return st;
}
