/* tcache.h - the layer's state (fp_alloc) and the thread caches that hang
 * from it: their life (made on first use, flushed when a trim asks, dropped
 * with their thread: tcache.c), and their hot side, inline: the calling
 * thread's slots, and the pop and push of a cache hit that fabpool_alloc and
 * fabpool_free (alloc.c) make without a call. */
#ifndef FP_TCACHE_H
#define FP_TCACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "pagemap.h"
#include "pending.h"
#include "large.h"
#include "usage.h"

struct fp_trace;

typedef struct fp_bin {
    uint32_t n, cap;
    fp_item *items;
} fp_bin;

/* A thread's cache for one pool.  Only its thread writes it (counters are
 * atomics so that stats can read them). */
typedef struct fp_tcache {
    struct fp_alloc *owner;
    struct fp_tcache *next, *prev;     /* the pool's list */
    uint64_t epoch;
    size_t bytes;                      /* its own allocation size */
    _Atomic uint64_t allocs[FP_NCLASS], frees[FP_NCLASS];
    fp_bin bins[];                     /* one per slab class */
} fp_tcache;

/* Blocks of one class given out and taken back without a thread cache, and
 * folded in from thread caches that were freed. */
typedef struct fp_class_counts {
    _Atomic uint64_t allocs, frees, tc_allocs, tc_frees;
} __attribute__((aligned(FP_CACHELINE))) fp_class_counts;

typedef struct fp_alloc {
    /* what the hot path reads, in its first cache line */
    uint64_t id;                       /* unique for the life of the process: a thread's slot must match it */
    struct fp_trace *trace;            /* NULL: none */
    uint64_t slab_max;
    _Atomic uint64_t flush_epoch;      /* a trim asks every cache to flush at its next call */
    fp_pagemap map;                    /* a copy of the space's page map handle (its first level never
                                          moves; leaves are shared), so the free's lookup follows no
                                          pointer more than it would in the pool itself */
    /* the rest */
    fp_heap *heap;
    fp_space *sp;                      /* the heap's */
    fp_retire *retire;                 /* blocks freed on streams (fabpool_free_on_stream) */
    fp_usage *use;                     /* the pool's in-use mark: slab blocks out of their classes (usage.h) */
    int thread_cache;                  /* the option */
    unsigned n_slab_classes;
    uint32_t tc_cap[FP_NCLASS];        /* thread-cache bin capacity per class */
    size_t tcache_bytes;
    fp_tcache *tcaches;
    fp_class_counts counts[FP_NCLASS];
} fp_alloc;

/* Sets up the caches' capacities from the heap's classes; use is the pool's in-use mark. */
void fp_alloc_init(fp_alloc *a, fp_heap *heap, fp_retire *retire, fp_usage *use, int thread_cache);
/* The trace the blocks' calls are recorded in (NULL: none). */
void fp_alloc_set_trace(fp_alloc *a, struct fp_trace *trace);
/* Whether thread caches are on (the option). */
static inline int fp_alloc_thread_cache(const fp_alloc *a) { return a->thread_cache; }
/* Blocks of slab class cls given out and taken back, all time: without a
 * thread cache, through the caches freed, and through every cache on the
 * list.  Pool lock held, so that the list holds still. */
void fp_alloc_class_counts(const fp_alloc *a, unsigned cls, uint64_t *allocs, uint64_t *frees);
/* A unique id and a place in the registry of live pools: 0, or -1 without host memory. */
int fp_registry_add(fp_alloc *a);
/* Out of the registry first at destroy: exiting threads no longer touch it. */
void fp_registry_remove(fp_alloc *a);
/* While the pool is asleep (fabpool_sleep), flush_epoch carries this bit: no
 * thread cache's epoch ever equals it (caches store the epoch without the
 * bit), so every fast path misses and the slow path sees the state. */
#define FP_EPOCH_ASLEEP (1ull << 63)
/* Sets or clears the bit (clearing also asks every cache to flush). */
void fp_alloc_set_asleep(fp_alloc *a, int asleep);

/* A trim: the calling thread's caches flushed now, every other thread's at
 * its next call. */
void fp_alloc_flush_all(fp_alloc *a);
/* Pool destroy: folds and frees every cache. */
void fp_tcaches_destroy(fp_alloc *a);
/* Whether tc, a cache on a's list, is the calling thread's (fabpool_check
 * reads only those: another thread writes its own without a lock).  Pool
 * lock held, so that the list holds still. */
int fp_tcache_mine(const fp_alloc *a, const fp_tcache *tc);


#define FP_LIKELY(x) __builtin_expect(!!(x), 1)
#define FP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define FP_TLS_SLOTS 8
/* The layer's state of a public pool handle, and back (alloc.h). */
static inline fp_alloc *fp_alloc_of(fabpool_t *p) { return (fp_alloc *)(void *)p; }
static inline fabpool_t *fp_alloc_pool(fp_alloc *a) { return (fabpool_t *)(void *)a; }

/* The thread's caches, by pool.  A slot matches only if both the pool's
 * address and its unique id match, so a slot of a destroyed pool is never
 * used again (its cache was freed with the pool). */
typedef struct fp_tls_slot {
    fp_alloc *owner;
    uint64_t id;
    fp_tcache *tc;
} fp_tls_slot;

/* Defined in tcache.c; hidden, so that the hot path reaches it as it
 * would a static of its own file. */
extern _Thread_local fp_tls_slot fp_tls_slots[FP_TLS_SLOTS]
    __attribute__((visibility("hidden"), tls_model("local-dynamic")));

/* The one test of whether a slot (or a registry entry) is pool a's. */
static inline int slot_is(const fp_tls_slot *s, const fp_alloc *a) { return s->owner == a && s->id == a->id; }

static inline void tcache_count(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Block ptr of slab s is given out: its free flag goes down. */
static inline void mark_used(fp_span *s, uint64_t ptr)
{
    uint32_t idx = 0;
    fp_slab_index(s, ptr, &idx);
    atomic_store_explicit(&s->freeflag[idx], 0, memory_order_relaxed);
}

/* The calling thread's cache for a when it is the thread's most recent one
 * and no trim has asked it to flush: the only one the fast path uses. */
static inline fp_tcache *tcache_hot(fp_alloc *a)
{
    const fp_tls_slot *sl = &fp_tls_slots[0];
    if (FP_LIKELY(slot_is(sl, a) && sl->tc->epoch == atomic_load_explicit(&a->flush_epoch, memory_order_relaxed)))
        return sl->tc;
    return NULL;
}

/* A block of class cls out of the cache: 1, or 0 if its bin is empty. */
static inline int tcache_pop(fp_tcache *tc, unsigned cls, void **out)
{
    fp_bin *b = &tc->bins[cls];
    if (FP_UNLIKELY(!b->n))
        return 0;
    fp_item it = b->items[--b->n];
    mark_used(it.span, it.ptr);
    tcache_count(&tc->allocs[cls]);
    *out = (void *)(uintptr_t)it.ptr;
    return 1;
}

/* Block addr of slab s into the cache: 1, or 0 if its bin is full. */
static inline int tcache_push(fp_tcache *tc, fp_span *s, uint64_t addr)
{
    fp_bin *b = &tc->bins[s->cls];
    if (FP_UNLIKELY(b->n == b->cap))
        return 0;
    b->items[b->n].ptr = addr;
    b->items[b->n].span = s;
    b->n++;
    tcache_count(&tc->frees[s->cls]);
    return 1;
}

/* The calling thread's cache for a, made on first use and flushed if a trim
 * asked; NULL if caches are off or no host memory is left (the caller then
 * uses the classes directly). */
fp_tcache *fp_tcache_get(fp_alloc *a);
/* The heap's cache policy on a slow path, its releases logged. */
void fp_alloc_trim_policy(fp_alloc *a);
/* The log (info): what the heap gave back to the driver by itself during a
 * call (begun: the tally at its start). */
void fp_alloc_log_released(const fp_alloc *a, fp_chunk_tally begun, const char *why);

#endif
