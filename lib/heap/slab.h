/* slab.h - the heap of blocks: small blocks in slabs of size classes, every
 * larger block carved from an arena, and the trim that returns what they
 * cache.
 *
 * Two arenas (arena.h) hold the heap's memory, each in a home of its own in
 * the reservation: the medium arena (blocks above slab_max up to
 * FP_MEDIUM_MAX, and the slabs) and the large arena.  A slab is a run of
 * pages (FP_PAGE_SHIFT, 64 KiB) cut from the medium arena on a page
 * boundary, holding blocks of one class, its pages sent to it by the page
 * map; other blocks are their size rounded up to FP_BLOCK_QUANTUM (256
 * bytes), cut from their arena by best fit.  Keeping medium and large apart
 * keeps small blocks from pinning granules among large free ranges.
 *
 * Counters it owns (written only here): idle bytes and
 * the decay's clock, blocks above slab_max, OOM retries.  Out of device
 * memory, an arena's miss (and a chunk a buffer maps, through
 * fp_heap_chunk_create / fp_heap_chunk_map) is tried again after trimming
 * what the heap caches.
 *
 * Locking: the pool lock (h->sp->lock) guards the arenas, the address
 * space, the page map's writers and the list of every slab; each class has
 * its own lock.  The pool lock may be held while a class lock is taken;
 * never the reverse. */
#ifndef FP_SLAB_H
#define FP_SLAB_H

#include <stdatomic.h>
#include <stdint.h>

#include "arena.h"
#include "counter.h"
#include "lock.h"
#include "sizeclass.h"
#include "space.h"
#include "usage.h"

#define FP_CACHELINE 64

enum { FP_LIST_NONE = 0, FP_LIST_PARTIAL = 1, FP_LIST_EMPTY = 2, FP_LIST_FULL = 3 };

/* Blocks above slab_max and up to FP_MEDIUM_MAX come from the medium arena, with the slabs; larger ones from
 * the large arena. */
#define FP_MEDIUM_MAX (256ull << 10)
/* Medium and large blocks are their size rounded up to this (the alignment cudaMalloc promises): the arenas'
 * quantum. */
#define FP_BLOCK_QUANTUM 256ull
_Static_assert(FP_BLOCK_QUANTUM == 1ull << FP_PIECE_UNIT_SHIFT, "the arenas count sizes in quanta");
/* The arenas. */
enum { FP_ARENA_MEDIUM = 0, FP_ARENA_LARGE = 1, FP_NARENAS = 2 };

/* The heap's counters that fp_heap_read_counters copies (counter.h): the bytes of large blocks given out (exact
 * under the pool lock), out-of-memory misses tried again after a trim, and the free chunks unmapped by trades
 * (slab.c, trade), all time. */
#define FP_HEAP_COUNTERS(X) X(large_in_use_bytes) X(oom_retries) X(traded_bytes)

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

typedef struct fp_heap {
    fp_space *sp;                      /* chunks, ranges, page map, metadata, the pool lock */
    uint64_t slab_max;                 /* rounded up to a class size; 0: no slabs */
    uint64_t medium_max;               /* blocks above slab_max up to this come from the medium arena */
    uint64_t cache_limit, decay_ms;
    uint32_t large_slack_percent;      /* free memory a miss leaves mapped, in percent of what is in use */
    unsigned n_slab_classes;           /* classes [0, n_slab_classes) come from slabs */
    fp_span *spans;                    /* every slab, for destroy (pool lock) */
    fp_arena arenas[FP_NARENAS];       /* under the pool lock */
    fp_span sentinels[FP_NARENAS];     /* what the page map holds for each arena's pages */
    _Atomic uint64_t trim_floor;       /* idle bytes a trim to the cache limit could not go below */
    _Atomic int shed;                  /* some class holds more empty slabs than it keeps */
    _Atomic uint64_t idle_slabs;       /* empty slabs (class locks) */
    _Atomic uint64_t idle_arenas;      /* the arenas' free ranges (written under the pool lock) */
    _Atomic uint64_t idle_slabs_low;   /* decay: the least of each seen since the period began */
    uint64_t idle_arenas_low;          /* (pool lock) */
    _Atomic uint64_t decay_epoch_ns;
    FP_HEAP_COUNTERS(FP_COUNTER_ATOMIC)
    _Atomic uint64_t large_allocs[FP_NCLASS];
    unsigned policy_tick;              /* blocks above slab_max given out and freed (pool lock; large.c) */
    unsigned policy_mask;              /* the decay's clock every (policy_mask + 1)th tick: 15, or 0 with decay_ms 0 */
    fp_class classes[FP_NCLASS];
} fp_heap;

/* Sets up the classes (slab_max from o, rounded up to a class size) and the arenas, and points the pool's
 * in-use mark at the heap's bytes of large blocks (usage.h). */
void fp_heap_init(fp_heap *h, fp_space *sp, fp_usage *use, const fabpool_options *o);
/* The block size of slab class cls. */
static inline uint64_t fp_heap_block_size(const fp_heap *h, unsigned cls) { return h->classes[cls].obj_size; }
/* slab_max as fp_heap_init rounded it (0: no slabs). */
static inline uint64_t fp_heap_slab_max(const fp_heap *h) { return h->slab_max; }
/* The alignment of every slab's base (its page): a block of a class that is a multiple of a power of two up
 * to this is aligned to that power (sizeclass.h), which fabpool_alloc_aligned relies on. */
static inline uint64_t fp_heap_slab_align(const fp_heap *h) { return 1ull << h->sp->page_shift; }

/* What the heap counts (fabpool_stats, fabpool_counters): atomics, read without a lock; the bytes of large
 * blocks are exact under the pool lock. */
typedef struct fp_heap_counters {
    unsigned n_slab_classes;           /* classes [0, n_slab_classes) come from slabs */
    FP_HEAP_COUNTERS(FP_COUNTER_PLAIN)
    uint64_t large_allocs[FP_NCLASS];  /* blocks above slab_max given out, by the class their size falls in */
} fp_heap_counters;
void fp_heap_read_counters(const fp_heap *h, fp_heap_counters *c);
/* Slab class cls: its block size, blocks per slab, and slabs (read under the class's lock). */
typedef struct fp_class_counters {
    uint64_t size, nobj, slabs;
} fp_class_counters;
void fp_heap_read_class(fp_heap *h, unsigned cls, fp_class_counters *c);
/* Unmaps everything and frees the heap's metadata. */
void fp_heap_destroy(fp_heap *h);

/* Takes up to n free blocks of class cls into out[]; returns how many (0 with an error set).  given != 0: the
 * blocks are given out, their free flags cleared under the class's lock; 0: they go to a thread cache, still
 * free.  Under the lock a block is on its slab's free stack or flagged as given out, so that fabpool_check,
 * which holds every class lock, sees no block between the two (check.c). */
unsigned fp_class_take(fp_heap *h, unsigned cls, fp_item *out, unsigned n, int given, fabpool_status *st);
/* Gives blocks back to their slabs: with flag != 0 their free flags are set under the class's lock (a block
 * freed without a thread cache), with 0 they are already set (a thread cache's blocks). */
void fp_class_give(fp_heap *h, unsigned cls, const fp_item *items, unsigned n, int flag);

/* cuMemCreate / create + map of a chunk (registered as kind's, owner's:
 * mapreg.h), with one trim and retry when the device is out of memory.
 * Pool lock held. */
fabpool_status fp_heap_chunk_create(fp_heap *h, uint64_t size, CUmemGenericAllocationHandle *out);
fabpool_status fp_heap_chunk_map(fp_heap *h, uint64_t va, uint64_t size, fp_map_kind kind, void *owner);
/* Counts an out-of-memory retry made above the heap (alloc.c, after waiting
 * for blocks freed on streams): the heap owns the counter. */
void fp_heap_count_oom_retry(fp_heap *h);

/* Unmaps free chunks of the arenas (empty slabs go back to theirs first
 * where that is needed) until at most keep bytes are idle, or nothing more
 * can go (a chunk that also holds part of a block stays).  Pool lock held. */
void fp_heap_trim_locked(fp_heap *h, uint64_t keep);
/* Idle memory: empty slabs and the arenas' free ranges.  No lock needed. */
static inline uint64_t fp_heap_idle(const fp_heap *h)
{
    return atomic_load_explicit(&h->idle_slabs, memory_order_relaxed) +
           atomic_load_explicit(&h->idle_arenas, memory_order_relaxed);
}
/* The arenas' free bytes changed: the idle sum and its low-water mark follow; the sum.  Pool lock held. */
static inline uint64_t fp_heap_idle_follow(fp_heap *h)
{
    uint64_t n = 0;
    for (int i = 0; i < FP_NARENAS; i++)
        n += h->arenas[i].free_bytes;
    atomic_store_explicit(&h->idle_arenas, n, memory_order_relaxed);
    if (n < h->idle_arenas_low)
        h->idle_arenas_low = n;
    return n;
}
/* A miss of arena a for a block of n bytes aligned to align: the arena grows (fp_heap_take's slow side). */
fp_piece *fp_heap_miss(fp_heap *h, fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st);
/* A block of n bytes (a multiple of the arena's quantum), its base a multiple of align, from arena a of the
 * heap: the best fit, or a miss that grows the arena.  Pool lock held. */
static inline fp_piece *fp_heap_take(fp_heap *h, fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_piece *b = fp_arena_fit(a, n, align, st);
    if (!b && *st == FABPOOL_OK)
        b = fp_heap_miss(h, a, n, align, st);
    fp_heap_idle_follow(h);
    return b;
}
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
