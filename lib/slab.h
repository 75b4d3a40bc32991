/* slab.h - the heap of blocks: slabs of size-class blocks, large blocks on
 * pieces of their own, and the trim that returns what they cache.
 *
 * A slab is a run of address space mapped with one physical chunk, holding
 * blocks of one class.  A large piece is a run of address space mapped by
 * one or more chunks (fp_lchunk) that is one large block given out, or a
 * free range of them.  Both are spans, found by address in the page map.
 *
 * Calls: chunk, vaspace, pagemap (its space), meta, array, list, sizeclass, error.
 * Counters it owns (written only here): idle bytes and the decay's clock,
 * large blocks, OOM retries.  Out of device memory, a chunk it maps (and
 * one a buffer maps, through fp_heap_chunk_create / fp_heap_chunk_map) is
 * tried again after trimming what the heap caches.
 *
 * Locking: the pool lock (h->sp->lock) guards the address space, the page
 * map's writers, the large pieces and the list of every slab; each class
 * has its own lock.  The pool lock may be held while a class lock is
 * taken; never the reverse. */
#ifndef FP_SLAB_H
#define FP_SLAB_H

#include <stdatomic.h>
#include <stdint.h>

#include "lock.h"
#include "sizeclass.h"
#include "space.h"

#define FP_CACHELINE 64

enum { FP_SPAN_SLAB = 1, FP_SPAN_LARGE = 2 };
/* in_use of a large piece: a free range, a block given out, a free range held by an allocation in progress,
 * a block freed on a stream whose work may still use it (retire.h: live for the rest of the pool) */
enum { FP_LARGE_FREE = 0, FP_LARGE_LIVE = 1, FP_LARGE_HELD = 2, FP_LARGE_PENDING = 3 };
/* a slab block's freeflag: given out, free, freed on a stream and still pending there (retire.h), given out and
 * used on other streams too (fabpool_record_stream: its free takes the slow path, which asks the retirement queue) */
enum { FP_FREEFLAG_USED = 0, FP_FREEFLAG_FREE = 1, FP_FREEFLAG_PENDING = 2, FP_FREEFLAG_RECORDED = 3 };
enum { FP_LIST_NONE = 0, FP_LIST_PARTIAL = 1, FP_LIST_EMPTY = 2, FP_LIST_FULL = 3 };

typedef struct fp_span {
    uint64_t base, size;
    uint8_t kind, list;
    uint16_t cls;
    _Atomic uint32_t in_use;           /* large: FP_LARGE_FREE / LIVE / HELD */
    struct fp_span *next, *prev;       /* class list, or the large live / free list */
    struct fp_span *all_next, *all_prev; /* every slab of the heap (pool lock) */
    /* slabs */
    uint32_t obj_q;                    /* block size / 64 (FP_QUANTUM_SHIFT) */
    uint64_t magic;                    /* ceil(2^32 / obj_q): index = (off/64 * magic) >> 32 */
    uint32_t nobj, nfree;              /* nfree: blocks on free_stack (held centrally) */
    uint32_t *free_stack;
    _Atomic uint8_t *freeflag;         /* per block, FP_FREEFLAG_*: 1 = free (central or in a thread cache), 2 =
                                          pending on a stream (given out for the rest of the pool), 3 = given
                                          out with recorded streams: a byte each, so setting one is a plain
                                          store, not a locked RMW */
} fp_span;

/* One slab class, central part. */
typedef struct fp_class {
    fp_lock_t lock;                    /* level FP_LOCK_CLASS, sub-level the class index (lock.h) */
    fp_span *partial, *empty;          /* slabs with some / all blocks free */
    uint64_t obj_size, slab_size;
    uint32_t nobj, nslabs, nempty;
} __attribute__((aligned(FP_CACHELINE))) fp_class;

/* A block on its way between a class and a thread cache. */
typedef struct fp_item {
    uint64_t ptr;
    fp_span *span;
} fp_item;

/* One physical chunk mapped for large blocks (cuMemUnmap takes whole chunks). */
typedef struct fp_lchunk {
    uint64_t va, size;
} fp_lchunk;

typedef struct fp_heap {
    fp_space *sp;                      /* chunks, ranges, page map, metadata, the pool lock */
    uint64_t slab_max;                 /* rounded up to a class size; 0: no slabs */
    uint64_t cache_limit, decay_ms;
    uint32_t large_slack_percent;      /* free large memory a miss leaves mapped */
    unsigned n_slab_classes;           /* classes [0, n_slab_classes) come from slabs */
    fp_span *spans;                    /* every slab, for destroy (pool lock) */
    /* large blocks, under the pool lock: pieces of address space, each a live
     * block or a free range (free neighbours are merged), and the chunks that
     * map them, sorted by address */
    fp_span *large_live, *large_free;
    fp_lchunk *lchunks;
    size_t n_lchunks, cap_lchunks;
    uint64_t large_free_bytes;
    _Atomic uint64_t idle_bytes;       /* empty slabs + free large ranges */
    _Atomic uint64_t idle_low, decay_epoch_ns; /* decay: the least idle_bytes seen since the period began */
    _Atomic uint64_t large_in_use_bytes, large_blocks, large_allocs[FP_NCLASS], oom_retries;
    fp_class classes[FP_NCLASS];
} fp_heap;

/* Sets up the classes (slab_max from o, rounded up to a class size). */
void fp_heap_init(fp_heap *h, fp_space *sp, const fabpool_options *o);
/* Unmaps every span and frees the heap's metadata. */
void fp_heap_destroy(fp_heap *h);

/* Takes up to n free blocks of class cls into out[]; returns how many (0 with an error set).  given != 0: the
 * blocks are given out, their free flags cleared under the class's lock; 0: they go to a thread cache, still
 * free.  Under the lock a block is on its slab's free stack or flagged as given out, so that fabpool_check,
 * which holds every class lock, sees no block between the two (check.c). */
unsigned fp_class_take(fp_heap *h, unsigned cls, fp_item *out, unsigned n, int given, fabpool_status *st);
/* Gives blocks back to their slabs: with flag != 0 their free flags are set under the class's lock (a block
 * freed without a thread cache), with 0 they are already set (a thread cache's blocks). */
void fp_class_give(fp_heap *h, unsigned cls, const fp_item *items, unsigned n, int flag);

fabpool_status fp_large_alloc(fp_heap *h, uint64_t size, void **out);
/* Frees the large block at addr (checked under the lock: interior and double frees are refused; fn names
 * the call in messages). */
fabpool_status fp_large_free(fp_heap *h, uint64_t addr, const char *fn);
/* FABPOOL_OK with *usable the block's size if addr is a live large block, else the errors of fp_large_free;
 * changes nothing. */
fabpool_status fp_large_check(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable);
/* A live large block freed on a stream: FP_LARGE_PENDING (live for the rest
 * of the pool), *usable its size.  The errors of fp_large_free otherwise. */
fabpool_status fp_large_pend(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable);

/* cuMemCreate / create + map of a chunk, with one trim and retry when the
 * device is out of memory.  Pool lock held. */
fabpool_status fp_heap_chunk_create(fp_heap *h, uint64_t size, CUmemGenericAllocationHandle *out);
fabpool_status fp_heap_chunk_map(fp_heap *h, uint64_t va, uint64_t size);
/* Counts an out-of-memory retry made above the heap (alloc.c, after waiting
 * for blocks freed on streams): the heap owns the counter. */
void fp_heap_count_oom_retry(fp_heap *h);

/* Unmaps idle slabs and free large chunks until at most keep bytes are idle
 * (a chunk that also holds part of a live block stays).  Pool lock held. */
void fp_heap_trim_locked(fp_heap *h, uint64_t keep);
/* Trims to the cache limit if idle memory is above it, and returns what
 * stayed idle for a whole decay period.  No lock held. */
void fp_heap_trim_policy(fp_heap *h);

/* block index in a slab, and whether addr is a block start */
static inline int fp_slab_index(const fp_span *s, uint64_t addr, uint32_t *idx)
{
    uint64_t off = addr - s->base;
    if (off & (FP_MIN_ALIGN - 1))
        return 0;
    uint32_t q = (uint32_t)(off >> FP_QUANTUM_SHIFT);
    uint32_t i = (uint32_t)(((uint64_t)q * s->magic) >> 32);
    *idx = i;
    return i < s->nobj && i * s->obj_q == q;
}

#endif
