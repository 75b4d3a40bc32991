/* lock.h - every mutex of lib/, its level, and the one lock order.
 *
 * The order (a thread takes locks only in ascending level; it may skip
 * levels, and it never takes a lock while it holds one of an equal or
 * higher level).
 *
 *   level  lock                          where
 *   1      registry   (registry_lock)    alloc.c: the live pools, for exiting threads
 *   2      pool       (fp_space.lock)    space.h: address space, page-map writers, the arenas, buffers,
 *                                        views, retirements, the driver calls that map and unmap
 *                                        and the registry of mappings they keep (mapreg.h)
 *   3      class i    (fp_class.lock)    slab.h: one per size class; several at once in ascending
 *                                        class index (lock sub-level = the index)
 *   4      retire     (fp_retire.lock)   the stream queue: stream-pending blocks, retired chunks, events
 *   5      trace list (traces_lock)      trace.c: every open trace of the process
 *   6      trace      (fp_trace.lock)    trace.c: one trace's buffer and file
 *   7      keys       (fp_alloc.key_lock) tcache.c: the stores of a pool's thread-cache keys
 *   8      handles    (handles.c lock)   the process's handle area: its segments and the quarantine of
 *                                        freed buffer and view slots
 *
 * Why this order:
 * - registry first: a thread that exits (thread_exit) or that evicts a
 *   cache of another pool from its slots (tcache_get) holds the
 *   registry while it flushes that cache (class locks) and unlinks it (pool
 *   lock), so that the pool cannot be destroyed under it; nothing takes the
 *   registry with a pool or class lock held.
 * - pool before class: a trim and an out-of-memory retry run under the pool
 *   lock and take each class's lock to unlink its empty slabs, and a new
 *   slab joins its class under both; a class lock holder never needs the
 *   pool lock (a new slab is mapped after the class lock is dropped).
 * - class locks in ascending index: fabpool_check and stats hold several
 *   (fabpool_check then the stream queue's too).
 * - retire is a leaf of the pool's locks: taken with the pool or a class lock
 *   held (or none); nothing of the pool is taken under it (the blocks it
 *   hands back go to the pool after it is released).
 * - traces after the pool's: a record may be written with any pool or class
 *   lock held; the trace list is taken before a trace's lock (close, exit).
 * - keys, a leaf: a pool's keys change under any of the others (a trim
 *   under the pool lock, a trace's start), and nothing is taken under it.
 * - handles last, a leaf: a buffer or view is made or freed with the pool
 *   lock held or none, and nothing is taken under it.
 * Two pools' locks are never held at once (same level).  The hot path (a
 * thread-cache hit) takes no lock.
 *
 * In a build with FP_DEBUG_LOCKS (cmake -DFABPOOL_DEBUG_LOCKS=ON, on by
 * default with CMAKE_BUILD_TYPE=Debug) each thread keeps the list of locks
 * it holds: fp_lock() aborts with a message naming both locks when the
 * order is broken, and fp_lock_assert_held() aborts when a function that
 * needs a lock is called without it.  Otherwise fp_lock_t is the bare
 * word below and the calls are its inline take and release, nothing more. */
#ifndef FP_LOCK_H
#define FP_LOCK_H

#include <stdatomic.h>

enum {
    FP_LOCK_REGISTRY = 1,
    FP_LOCK_POOL = 2,
    FP_LOCK_CLASS = 3,
    FP_LOCK_RETIRE = 4,
    FP_LOCK_TRACE_LIST = 5,
    FP_LOCK_TRACE = 6,
    FP_LOCK_KEY = 7,
    FP_LOCK_HANDLES = 8,
};

/* The mutex itself: a word (0 free, 1 held, 2 held and a thread may sleep on it: Drepper's "Futexes are
 * tricky", mutex3), taken and let go inline: one compare-and-swap and one exchange, where pthread's calls took
 * about 50 instructions for a lock and its unlock (a medium block's allocation takes the pool lock once:
 * docs/performance.md, "Instructions a pair").  A thread that finds it held spins a while, then sleeps on
 * the word (lock.c); as fair as a default pthread mutex, which is the same scheme.  ThreadSanitizer sees the
 * acquire and the release of the word. */
typedef struct fp_lock {
    _Atomic unsigned w;
#ifdef FP_DEBUG_LOCKS
    unsigned level, sub;   /* sub: the class index of a class lock, else 0 */
    const char *name;
#endif
} fp_lock_t;

/* The slow sides: the wait of a lock found held, and the wake of a sleeper (lock.c). */
void fp_lock_wait(_Atomic unsigned *w);
void fp_lock_wake(_Atomic unsigned *w);
static inline void fp_lock_word(_Atomic unsigned *w)
{
    unsigned free_ = 0;
    if (__builtin_expect(!atomic_compare_exchange_strong_explicit(w, &free_, 1, memory_order_acquire,
                                                                  memory_order_relaxed), 0))
        fp_lock_wait(w);
}
static inline void fp_unlock_word(_Atomic unsigned *w)
{
    if (__builtin_expect(atomic_exchange_explicit(w, 0, memory_order_release) == 2, 0))
        fp_lock_wake(w);
}

/* Whether this library was built with the checks (tests skip otherwise). */
int fp_lock_debug_enabled(void);

#ifdef FP_DEBUG_LOCKS
#define FP_LOCK_INITIALIZER(level, name) {0, (level), 0, (name)}
void fp_lock_debug_init(fp_lock_t *l, unsigned level, unsigned sub, const char *name);
void fp_lock_debug_lock(fp_lock_t *l, const char *fn);
void fp_lock_debug_unlock(fp_lock_t *l, const char *fn);
void fp_lock_debug_assert_held(const fp_lock_t *l, const char *fn);

static inline void fp_lock_init(fp_lock_t *l, unsigned level, unsigned sub, const char *name)
{
    atomic_init(&l->w, 0);
    fp_lock_debug_init(l, level, sub, name);
}
#define fp_lock(l) fp_lock_debug_lock((l), __func__)
#define fp_unlock(l) fp_lock_debug_unlock((l), __func__)
/* Aborts unless the calling thread holds l. */
#define fp_lock_assert_held(l) fp_lock_debug_assert_held((l), __func__)
#else
#define FP_LOCK_INITIALIZER(level, name) {0}
static inline void fp_lock_init(fp_lock_t *l, unsigned level, unsigned sub, const char *name)
{
    (void)level, (void)sub, (void)name;
    atomic_init(&l->w, 0);
}
static inline void fp_lock(fp_lock_t *l) { fp_lock_word(&l->w); }
static inline void fp_unlock(fp_lock_t *l) { fp_unlock_word(&l->w); }
#define fp_lock_assert_held(l) ((void)0)
#endif

static inline void fp_lock_destroy(fp_lock_t *l) { (void)l; }

#endif
