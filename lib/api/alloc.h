/* alloc.h - fabpool_alloc / fabpool_free: the hot path through per-thread
 * caches, the slow path to the heap's classes and large blocks, and the
 * thread caches' life.
 *
 * fabpool_alloc_on_stream / fabpool_free_on_stream are here too.  Counters it owns: blocks given out
 * and taken back per class, with and without a thread cache, and the bytes
 * of slab blocks out of their classes in the pool's in-use mark (usage.h:
 * counted when a cache is refilled or flushed, never on its hit).
 *
 * fabpool_t, to this layer, is its fp_alloc: struct fabpool begins with one
 * (lifecycle.c asserts it), so that the public entry points of this file reach
 * their state with a cast, with neither a call nor the pool's header on the
 * hot path.
 *
 * Locking: the pool lock (a->sp->lock) guards the list of caches; the registry
 * of live pools has its own lock, taken before the pool lock (a thread that
 * exits retires its caches under it). */
#ifndef FP_ALLOC_H
#define FP_ALLOC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "pagemap.h"
#include "retire.h"
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

/* FABPOOL_OK with *usable its size where addr is the start of a block given
 * out and not freed (nor freed on a stream); else FABPOOL_ERR_NOT_FOUND with
 * a message that says which (fn names the call).  The block may be freed
 * meanwhile by another thread: callers hold the pool lock for what only it
 * guards (large blocks) and rely on the caller of the public call for the
 * rest. */
fabpool_status fp_alloc_live_block(fp_alloc *a, uint64_t addr, uint64_t *usable, const char *fn);

/* Sets up the caches' capacities from the heap's classes. */
void fp_alloc_init(fp_alloc *a, fp_heap *heap, fp_retire *retire, int thread_cache);
/* The retirement queue's blocks whose work is done go back to the pool
 * (with wait: all of them, after waiting; forget: streams that hold nothing
 * are dropped).  No lock held. */
void fp_alloc_drain(fp_alloc *a, int wait, int forget);
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

#endif
