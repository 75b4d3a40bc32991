/* walk.h - what fabpool_check's invariant walks report into.  Each layer
 * walks its own structures (fp_va_check, fp_slabs_check, fp_arenas_check,
 * fp_buffers_check, fp_views_check, fp_chunks_kept_check, ...) and adds to
 * one fp_walk what the layers above compare: the address space in use, the
 * mappings, the blocks pending on streams.  pool/check.c takes the locks,
 * orders the walks and makes the comparisons across layers.
 *
 * A broken invariant answers FABPOOL_ERR_CORRUPT with a message that starts
 * with the invariant's name in brackets, e.g. "[slab.flags]":
 * tests/test_check.c breaks each one on purpose and looks for that name.
 * Scratch memory comes from libc, not the pool's metadata arena, so that a
 * check changes no statistic. */
#ifndef FP_WALK_H
#define FP_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define FP_WALK_FAIL(...) fp_error(FABPOOL_ERR_CORRUPT, "fabpool_check: " __VA_ARGS__)
#define FP_WALK_HOST_FAIL() \
    fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_check: no host memory for the walk's scratch lists")
#define FP_ULL(x) ((unsigned long long)(x))

/* a range of addresses [lo, hi) and what holds it */
typedef struct fp_ival {
    uint64_t lo, hi;
    const char *what;
    const void *obj;
} fp_ival;

/* a block in one of the calling thread's caches: its slab (a span), address, class */
typedef struct fp_tc_ref {
    const void *span;
    uint64_t ptr;
    unsigned cls;
} fp_tc_ref;

typedef struct fp_walk {
    /* the reservation the walks check against */
    uint64_t va_base, va_size, gran;
    unsigned page_shift;
    fp_ival *iv;              /* address space in use: arena runs, buffer and view windows */
    size_t n_iv, cap_iv;
    fp_ival *kept;            /* chunks exported for blocks: each must lie under an arena's chunk */
    size_t n_kept, cap_kept;
    fp_tc_ref *tc;            /* blocks in the calling thread's caches, sorted by slab */
    size_t n_tc, tc_found;
    int exact;                /* no other thread's cache is listed: every free flag is accounted for */
    int suspect;              /* more blocks flagged pending than queued, with exact: confirmed by a new walk */
    unsigned char *seen;      /* a byte per block of the slab being checked */
    uint64_t map_pages;       /* pages of the arenas' chunks: what the page map holds */
    uint64_t n_slabs, slab_bytes; /* slabs: blocks of the medium arena that are not the heap's blocks */
    uint64_t slab_out;        /* bytes of slab blocks out of their classes */
    uint64_t n_chunks, chunk_bytes;   /* mappings the pool counts */
    uint64_t idle;            /* empty slabs and the arenas' free ranges */
    uint64_t fds;             /* fds the buffers' chunks and the kept exports hold */
    uint64_t pending;         /* slab blocks and large blocks freed on a stream, not yet reusable */
    uint64_t recorded;        /* live blocks with recorded streams (fabpool_record_stream) */
} fp_walk;

/* Adds [lo, lo + size) to w's address space in use; -1: no host memory. */
int fp_walk_use(fp_walk *w, uint64_t lo, uint64_t size, const char *what, const void *obj);
/* Adds [lo, lo + size) to w's kept exports; -1: no host memory. */
int fp_walk_keep(fp_walk *w, uint64_t lo, uint64_t size, const char *what, const void *obj);
/* Sorts w's address space in use by address. */
void fp_walk_sort(fp_walk *w);
void fp_walk_free(fp_walk *w);

#endif
