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

#include "device.h"
#include "pagemap.h"
#include "pending.h"
#include "large.h"
#include "medium.h"
#include "usage.h"

struct fp_trace;

/* A block in a thread cache: its address and its slab's free flag, so that
 * a hit clears the flag with one store (the slab itself is found again
 * through the page map on the slow paths that give blocks back). */
typedef struct fp_titem {
    uint64_t ptr;
    _Atomic uint8_t *flag;
} fp_titem;

/* The most blocks a bin holds (fp_alloc_init). */
#define FP_TC_CAP_MAX 64u
/* The most medium blocks of one size a thread cache holds, and the sizes it holds: above slab_max up to this. */
#define FP_MC_CAP 4u
#define FP_MC_MAX (64ull << 10)
/* The bytes of medium blocks a thread cache holds at most: a share of what the pool's blocks above slab_max
 * take (1 / FP_MC_SHARE of them), between FP_MC_BUDGET_MIN and FP_MC_BUDGET_MAX, set on the slow paths. */
#define FP_MC_SHARE 512u
#define FP_MC_BUDGET_MIN (256ull << 10)
#define FP_MC_BUDGET_MAX (2ull << 20)
/* A thread cache that hit fewer than a quarter of FP_MC_WINDOW medium misses (sizes that seldom repeat: the
 * blocks it holds would only wait) gives its medium blocks back and takes none for FP_MC_REST windows. */
#define FP_MC_WINDOW 64u
#define FP_MC_REST 64u
/* The most medium blocks a thread cache holds back from the arena until its thread's next take of the pool
 * lock (the blocks it frees while its bins rest or are full): their merge then rides on that take. */
#define FP_MD_CAP 8u
_Static_assert(FP_MD_CAP <= FP_MEDIUM_BACK_MAX, "fp_medium_alloc takes them all");

/* A thread's cache for one pool.  Only its thread writes it (counters are
 * atomics so that stats can read them).  The bin of class c holds the
 * blocks [lo[c], top[c]), room up to hi[c]: three arrays indexed by the
 * class, not an array of bins, so that the hit addresses each word as
 * base + class * 8 with no multiply; top and hi, not a count and a cap, so
 * that a pop or a push moves one pointer.  The arrays lead the struct: the
 * hit reads them at small offsets of the cache's address. */
typedef struct fp_tcache {
    fp_titem *top[FP_NCLASS], *lo[FP_NCLASS], *hi[FP_NCLASS];
    _Atomic uint64_t allocs[FP_NCLASS], frees[FP_NCLASS];   /* by class; a medium block's hits count in the
                                                              class its size falls in */
    struct fp_alloc *owner;
    struct fp_tcache *next, *prev;     /* the pool's list */
    uint64_t epoch;
    size_t bytes;                      /* its own allocation size */
    /* medium blocks (docs/design.md, "Medium blocks"): mn[c] blocks of the size of code c (fp_mstate) in
     * mitems[c], the last freed on top; mbytes their bytes, at most the pool's mc_budget */
    _Atomic uint64_t mbytes;
    uint64_t mmask[(FP_MSTATE_MAX + 64) / 64];   /* a bit per code whose mn is not 0 */
    unsigned mevict;                   /* the code whose blocks go first when the budget is short (in turn) */
    uint32_t mhits, mmiss;             /* its medium hits and misses in the current window (FP_MC_WINDOW misses) */
    uint32_t moff;                     /* windows left that it takes no medium block (0: it takes them) */
    uint32_t mdn;                      /* blocks in mdef */
    uint64_t mdbytes;                  /* and their bytes */
    uint64_t mdef[FP_MD_CAP];          /* medium blocks freed and not kept for reuse (state FP_MSTATE_CACHED,
                                          in mbytes), each its base | its code (in the quantum's low bits):
                                          they go back to the arena at the thread's next medium allocation,
                                          under its take of the pool lock and before its fit, or at the
                                          thread's next slow allocation, so that the fits the thread makes see
                                          the arena as they would have without them */
    _Atomic uint8_t *mdflag[FP_MD_CAP];  /* and each one's state byte (fp_mstate_at's, at its free): the arena
                                            reads it without looking it up again */
    uint8_t mn[FP_MSTATE_CACHED + 1]; /* every state byte a valid index (free_medium reads before it checks) */
    fp_titem mitems[FP_MSTATE_MAX + 1][FP_MC_CAP];
} fp_tcache;

/* Blocks in the bin of class c, and its room. */
static inline uint32_t fp_bin_n(const fp_tcache *tc, unsigned c) { return (uint32_t)(tc->top[c] - tc->lo[c]); }
static inline uint32_t fp_bin_cap(const fp_tcache *tc, unsigned c) { return (uint32_t)(tc->hi[c] - tc->lo[c]); }

/* Blocks of one class given out and taken back without a thread cache, and
 * folded in from thread caches that were freed. */
typedef struct fp_class_counts {
    _Atomic uint64_t allocs, frees, tc_allocs, tc_frees;
} __attribute__((aligned(FP_CACHELINE))) fp_class_counts;

/* The fast path's table of classes covers sizes up to 64 times this. */
#define FP_CLS_TABLE 64u

typedef struct fp_alloc {
    /* what the hot path reads, in its first cache line */
    _Atomic uint64_t cache_key;        /* the key a thread's hot slot must hold for its cache to be hit
                                          (fp_tls_hot); FP_HOT_OFF while none may be */
    _Atomic uint64_t hot_key;          /* fabpool_alloc's: cache_key, or FP_HOT_OFF while the stream pair's
                                          owner mode holds (the first allocation of another caller ends it) */
    uint64_t cls_table_max;            /* fabpool_alloc's fast path: sizes up to this (0: none) */
    uint8_t cls_of_q[FP_CLS_TABLE];    /* the class of sizes ((q - 1) * 64, q * 64], for q up to cls_table_max
                                          / 64: one load where fp_class_of takes a dozen instructions; 0
                                          where a class boundary up to slab_max or 4 KiB is not a multiple
                                          of 64 bytes */
    uint64_t slab_max;
    struct fp_retire *retire;          /* blocks freed on streams (fabpool_free_on_stream) */
    uint64_t id;                       /* unique for the life of the process: a thread's slot must match it */
    struct fp_trace *trace;            /* NULL: none */
    _Atomic uint64_t flush_epoch;      /* a trim asks every cache to flush at its next call */
    fp_pagemap map;                    /* a copy of the space's page map handle (its first level never
                                          moves; leaves are shared), so the free's lookup follows no
                                          pointer more than it would in the pool itself */
    /* medium blocks: sizes in (mc_lo, mc_lo + mc_span] come from the thread caches where they can; the medium
     * arena's sentinel and a copy of its states' handle (fp_mstate: its leaves' array never moves) */
    uint64_t mc_lo, mc_span;
    const fp_span *mc_sentinel;
    fp_mstate ms;
    _Atomic uint64_t mc_budget;        /* a thread cache's most bytes of them (FP_MC_SHARE) */
    _Atomic uint64_t mc_decay_ns;      /* when their decay last asked every cache to give them back */
    uint8_t mc_class[FP_MSTATE_MAX + 1]; /* the class of the grid each code's size falls in (its hits' count) */
    /* the rest */
    fp_heap *heap;
    fp_space *sp;                      /* the heap's */
    struct fp_buffers *bufs;           /* the pool's buffers: those released and kept go back at out of memory */
    fp_usage *use;                     /* the pool's in-use mark: slab blocks out of their classes (usage.h) */
    int thread_cache;                  /* the option */
    fp_lock_t key_lock;                /* the stores of cache_key and hot_key (tcache.c: fp_alloc_hot_rekey) */
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
/* The pool's buffers, whose kept ones an allocation out of memory gives back (NULL: none). */
void fp_alloc_set_buffers(fp_alloc *a, struct fp_buffers *bufs);
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
/* The pool's keys follow its state: a new one (caches on, awake, no trace), or FP_HOT_OFF. */
void fp_alloc_hot_rekey(fp_alloc *a);
/* The stream pair's owner mode (retire.h) or cache_key may have changed:
 * fabpool_alloc's key follows both (called after every change of either). */
void fp_alloc_owner_sync(fp_alloc *a);

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
 * used again (its cache was freed with the pool).  They live on the heap
 * (fp_thread), reached from the hot slot; the thread-local block of the
 * library holds the hot slot alone. */
typedef struct fp_tls_slot {
    fp_alloc *owner;
    uint64_t id;
    fp_tcache *tc;
} fp_tls_slot;

typedef struct fp_thread {
    fp_tls_slot caches[FP_TLS_SLOTS];  /* the most recently used pool first */
} fp_thread;

/* The hot slot: the cache of the pool the thread used last, and the key
 * that pool held when the thread last checked it (fp_tcache_get).  A pool
 * draws a new key, unique for the life of the process, whenever its
 * caches must take the slow path (a trim asks them to flush, it falls
 * asleep or wakes, a trace starts), and holds FP_HOT_OFF while no cache
 * may be hit; a thread installs a key only after checking its cache
 * against the pool.  So the fast paths compare one word of the pool with
 * one of the thread.  40 bytes, reached through a TLS descriptor
 * (-mtls-dialect=gnu2 for alloc.c and tcache.c, CMakeLists.txt): where the
 * loader placed the library's thread-local block in static TLS (a program
 * that links it, or a dlopen with room left) an access is one indirect
 * call of two instructions and no __tls_get_addr; where it had no room
 * (a dlopen after others took it) the same code reaches a dynamic block.
 * initial-exec would save the call, but makes the loader refuse the
 * library where that room is short: the torch adapter, which holds the
 * library and its own 7 KiB of message buffers, could not be dlopen'ed.
 * The library's own block stays small all the same (docs/design.md, "The
 * hot path"). */
typedef struct fp_tls_hot {
    uint64_t key;                      /* 0: none (no pool's key is 0) */
    fp_tcache *tc;
    fp_thread *th;                     /* NULL until the thread's first cache */
    uint64_t align;                    /* the alignment the thread's next blocks above slab_max ask for beyond
                                          the arenas' quantum (0: none), set only around the fabpool_alloc call
                                          that fabpool_alloc_aligned makes (fp_alloc_align_next); a cached
                                          medium block is given only while it is 0 */
    unsigned tick;                     /* the thread's blocks above slab_max given out and freed by the heap's
                                          own calls: the medium blocks' policy at every 16th (alloc.c; the
                                          medium path's misses count in the cache's window instead) */
} fp_tls_hot;

#define FP_HOT_OFF UINT64_MAX

/* Defined in tcache.c. */
extern _Thread_local fp_tls_hot fp_hot __attribute__((visibility("hidden")));

/* The one test of whether a slot (or a registry entry) is pool a's. */
static inline int slot_is(const fp_tls_slot *s, const fp_alloc *a) { return s->owner == a && s->id == a->id; }

/* A counter of the calling thread's cache: only its thread writes it,
 * others read it with atomic loads.  On x86-64 one unlocked add to memory
 * (an aligned quadword: a reader sees the old or the new value), where the
 * relaxed load and store take three instructions and a register; a
 * ThreadSanitizer build keeps the atomics, which it sees. */
static inline void tcache_count(_Atomic uint64_t *c)
{
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    __asm__("addq $1, %0" : "+m"(*(uint64_t *)c));
#else
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
#endif
}

/* The free flag of block ptr of slab s (a block start). */
static inline _Atomic uint8_t *slab_flag(fp_span *s, uint64_t ptr)
{
    uint32_t idx = 0;
    fp_slab_index(s, ptr, &idx);
    return &s->freeflag[idx];
}

/* The calling thread's cache for a when the hot slot holds a's key: the only one the fast path uses. */
static inline fp_tcache *tcache_hot(fp_alloc *a)
{
    fp_tls_hot *h = &fp_hot;
    if (FP_LIKELY(h->key == atomic_load_explicit(&a->cache_key, memory_order_relaxed)))
        return h->tc;
    return NULL;
}

/* A block of class cls out of the cache: 1, or 0 if its bin is empty. */
static inline int tcache_pop(fp_tcache *tc, unsigned cls, void **out)
{
    fp_titem *top = tc->top[cls];
    if (FP_UNLIKELY(top == tc->lo[cls]))
        return 0;
    fp_titem it = *--top;
    tc->top[cls] = top;
    atomic_store_explicit(it.flag, 0, memory_order_relaxed);
    tcache_count(&tc->allocs[cls]);
    *out = (void *)(uintptr_t)it.ptr;
    return 1;
}

/* Block addr of slab s into the cache: 1, or 0 if its bin is full. */
static inline int tcache_push(fp_tcache *tc, fp_span *s, uint64_t addr)
{
    fp_titem *top = tc->top[s->cls];
    if (FP_UNLIKELY(top == tc->hi[s->cls]))
        return 0;
    *top = (fp_titem){addr, slab_flag(s, addr)};
    tc->top[s->cls] = top + 1;
    tcache_count(&tc->frees[s->cls]);
    return 1;
}

/* The calling thread's blocks above slab_max from now on have bases that are multiples of align (a power of
 * two up to the granularity; FP_BLOCK_QUANTUM or less: the arenas' own 256 bytes, as without a call);
 * returns the alignment asked before.  For fabpool_alloc_aligned (api/aligned.c), which sets it around one
 * fabpool_alloc and puts the old one back, so that an aligned block takes fabpool_alloc's whole path (its
 * wait for the owner stream's work, its out-of-memory retry, its trace) without a parameter on it. */
uint64_t fp_alloc_align_next(uint64_t align);
/* Gives the medium blocks of tc back to the medium arena (pool lock held: locked != 0; else taken). */
void fp_tcache_medium_flush(fp_alloc *a, fp_tcache *tc, int locked);
/* A block tc holds back (mdef): its base, and its bytes. */
static inline uint64_t fp_tcache_defer_addr(uint64_t d) { return d & ~(uint64_t)(FP_BLOCK_QUANTUM - 1); }
static inline uint64_t fp_tcache_defer_bytes(const fp_alloc *a, uint64_t d)
{
    return a->mc_lo + ((d & (FP_BLOCK_QUANTUM - 1)) << FP_PIECE_UNIT_SHIFT);
}
/* Block d (its base | its code, of `bytes`; f its state byte) onto tc's blocks held back, which have room. */
static inline void fp_tcache_hold_back(fp_tcache *tc, uint64_t d, uint64_t bytes, _Atomic uint8_t *f)
{
    tc->mdflag[tc->mdn] = f;
    tc->mdef[tc->mdn++] = d;
    tc->mdbytes += bytes;
    atomic_store_explicit(&tc->mbytes, atomic_load_explicit(&tc->mbytes, memory_order_relaxed) + bytes,
                          memory_order_relaxed);
    atomic_store_explicit(f, FP_MSTATE_CACHED, memory_order_relaxed);
}
/* fabpool_thread_flush with the pool lock held (fabpool_sleep). */
void fp_alloc_thread_flush_locked(fp_alloc *a);

/* The calling thread's cache for a, made on first use and flushed if a trim
 * asked; NULL if caches are off or no host memory is left (the caller then
 * uses the classes directly). */
fp_tcache *fp_tcache_get(fp_alloc *a);
/* Up to want blocks of class cls from the heap onto its bin of tc (want
 * plus the blocks there at most its room); how many (0 with st set). */
unsigned fp_tcache_refill(fp_alloc *a, fp_tcache *tc, unsigned cls, unsigned want, fabpool_status *st);
/* Gives the n cached blocks t of class cls back to the heap (their flags set). */
void fp_tcache_give(fp_alloc *a, unsigned cls, const fp_titem *t, unsigned n);
/* The heap's cache policy on a slow path, its releases logged, and the medium blocks' (their share and their
 * decay: fp_alloc_medium_policy). */
void fp_alloc_trim_policy(fp_alloc *a);
void fp_alloc_medium_policy(fp_alloc *a);
/* The log (info): what the heap gave back to the driver by itself during a
 * call (begun: the tally at its start). */
void fp_alloc_log_released(const fp_alloc *a, fp_chunk_tally begun, const char *why);

#endif
