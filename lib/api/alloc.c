/* alloc.c - fabpool_alloc / fabpool_free: the hot path through per-thread
 * caches, the slow path to the heap, and the thread caches' life (alloc.h). */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "error.h"
#include "list.h"
#include "lock.h"
#include "trace.h"

#define FP_LIKELY(x) __builtin_expect(!!(x), 1)
#define FP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define FP_TLS_SLOTS 8

/* The layer's state of a public pool handle, and back (alloc.h). */
static inline fp_alloc *A(fabpool_t *p) { return (fp_alloc *)(void *)p; }
static inline fabpool_t *P(fp_alloc *a) { return (fabpool_t *)(void *)a; }

/* The thread's caches, by pool.  A slot matches only if both the pool's
 * address and its unique id match, so a slot of a destroyed pool is never
 * used again (its cache was freed with the pool). */
typedef struct fp_tls_slot {
    fp_alloc *owner;
    uint64_t id;
    fp_tcache *tc;
} fp_tls_slot;

static _Thread_local fp_tls_slot tls_slots[FP_TLS_SLOTS];
static _Thread_local int tls_key_set;
static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

/* The one test of whether a slot (or a registry entry) is pool a's. */
static inline int slot_is(const fp_tls_slot *s, const fp_alloc *a) { return s->owner == a && s->id == a->id; }

/* Live pools, so that a thread that exits can tell whether the pool of a
 * slot still exists without touching it. */
static fp_lock_t registry_lock = FP_LOCK_INITIALIZER(FP_LOCK_REGISTRY, "registry");
static fp_tls_slot *registry;   /* .tc unused */
static size_t registry_n, registry_cap;
static _Atomic uint64_t next_pool_id = 1;

int fp_registry_add(fp_alloc *a)
{
    fp_lock(&registry_lock);
    if (FP_ARRAY_RESERVE(NULL, registry, registry_n, registry_cap, registry_n + 1, 8) != 0) {
        fp_unlock(&registry_lock);
        return -1;
    }
    a->id = atomic_fetch_add(&next_pool_id, 1);
    registry[registry_n++] = (fp_tls_slot){a, a->id, NULL};
    fp_unlock(&registry_lock);
    return 0;
}

static int registry_has(const fp_tls_slot *s)
{
    for (size_t i = 0; i < registry_n; i++)
        if (slot_is(s, registry[i].owner))
            return 1;
    return 0;
}

void fp_registry_remove(fp_alloc *a)
{
    fp_lock(&registry_lock);
    for (size_t i = 0; i < registry_n; i++)
        if (slot_is(&registry[i], a)) {
            registry[i] = registry[--registry_n];
            break;
        }
    fp_unlock(&registry_lock);
}

/* The log (info): what the heap gave back to the driver by itself during a call (begun: the tally at its
 * start): its cache policy (decay_ms, cache_limit) runs on every slow path, and a large block's miss trades
 * free chunks for its own (large_slack). */
static void log_released(const fp_alloc *a, fp_chunk_tally begun, const char *why)
{
    if (!begun.on)
        return;
    fp_chunk_tally t = fp_chunk_tally_end(begun);
    if (t.chunks)
        FP_LOG_CH(FP_LOG_INFO, a->sp->ch, "%s: %llu bytes in %llu chunks back to the driver (decay_ms %llu, "
                  "cache_limit %llu); the pool maps %llu", why, (unsigned long long)t.bytes,
                  (unsigned long long)t.chunks, (unsigned long long)a->heap->decay_ms,
                  (unsigned long long)a->heap->cache_limit, (unsigned long long)atomic_load(&a->sp->ch->mapped_bytes));
}

/* The heap's cache policy on a slow path. */
static void trim_policy(fp_alloc *a)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    fp_heap_trim_policy(a->heap);
    log_released(a, t, "decay");
}

/* A large block: the heap's own calls, which end with its cache policy (and, for a miss, the trade). */
static fabpool_status large_alloc(fp_alloc *a, size_t size, void **out)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    fabpool_status st = fp_large_alloc(a->heap, size, out);
    if (st == FABPOOL_OK)
        fp_usage_raise(a->use);
    log_released(a, t, "decay or large_slack");
    return st;
}

static fabpool_status large_free(fp_alloc *a, uint64_t addr, const char *fn)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    fabpool_status st = fp_large_free(a->heap, addr, fn);
    log_released(a, t, "decay");
    return st;
}

/* ------------------------------------------------------------ thread caches */

void fp_alloc_init(fp_alloc *a, fp_heap *heap, fp_retire *retire, int thread_cache)
{
    a->heap = heap;
    a->retire = retire;
    a->sp = heap->sp;
    a->map = heap->sp->map; /* set up before: see alloc.h */
    a->slab_max = heap->slab_max;
    a->n_slab_classes = heap->n_slab_classes;
    a->thread_cache = thread_cache;
    size_t bytes = 0;
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        uint64_t sz = fp_class_size(c);
        /* up to 64 blocks and 8 MiB a bin, and never fewer than 2, so that a
         * thread that frees and allocates a block of the largest slab class
         * takes no lock either (8 threads on one 4 MiB class contended on its
         * lock at 5.6 us a pair on the H200 without this) */
        uint64_t cap = (8ull << 20) / sz;
        a->tc_cap[c] = (uint32_t)(cap > 64 ? 64 : cap < 2 ? 2 : cap);
        bytes += a->tc_cap[c] * sizeof(fp_item);
    }
    a->tcache_bytes = bytes;
}

static void tcache_flush(fp_alloc *a, fp_tcache *tc)
{
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        fp_bin *b = &tc->bins[c];
        if (b->n) {
            fp_usage_slab_back(a->use, b->n * a->heap->classes[c].obj_size);
            fp_class_give(a->heap, c, b->items, b->n, 0);
            b->n = 0;
        }
    }
    tc->epoch = atomic_load(&a->flush_epoch) & ~FP_EPOCH_ASLEEP;
}

static void tcache_free(fp_alloc *a, fp_tcache *tc)
{
    for (unsigned c = 0; c < FP_NCLASS; c++) {
        atomic_fetch_add(&a->counts[c].tc_allocs, atomic_load_explicit(&tc->allocs[c], memory_order_relaxed));
        atomic_fetch_add(&a->counts[c].tc_frees, atomic_load_explicit(&tc->frees[c], memory_order_relaxed));
    }
    fp_meta_free(a->sp->meta, tc, tc->bytes);
}

/* Flushes and frees a cache whose pool is alive. */
static void tcache_retire(fp_alloc *a, fp_tcache *tc)
{
    tcache_flush(a, tc);
    fp_lock(&a->sp->lock);
    FP_LIST_REMOVE(&a->tcaches, tc, next, prev);
    fp_unlock(&a->sp->lock);
    tcache_free(a, tc);
    trim_policy(a);
}

static void thread_exit(void *arg)
{
    (void)arg;
    fp_lock(&registry_lock);
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        fp_tls_slot *s = &tls_slots[i];
        if (s->owner && registry_has(s))
            tcache_retire(s->owner, s->tc);
        memset(s, 0, sizeof *s);
    }
    fp_unlock(&registry_lock);
}

static void make_key(void) { pthread_key_create(&tls_key, thread_exit); }

void fp_tcaches_destroy(fp_alloc *a)
{
    /* The pool left the registry first: exiting threads no longer touch it. */
    while (a->tcaches) {
        fp_tcache *tc = a->tcaches;
        a->tcaches = tc->next;
        tcache_free(a, tc);
    }
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&tls_slots[i], a))
            memset(&tls_slots[i], 0, sizeof tls_slots[i]);
}

static fp_tcache *tcache_new(fp_alloc *a)
{
    size_t bytes = sizeof(fp_tcache) + a->n_slab_classes * sizeof(fp_bin) + a->tcache_bytes;
    fp_tcache *tc = fp_meta_alloc(a->sp->meta, bytes);
    if (!tc)
        return NULL;
    tc->owner = a;
    tc->bytes = bytes;
    fp_item *items = (fp_item *)(tc->bins + a->n_slab_classes);
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        tc->bins[c].cap = a->tc_cap[c];
        tc->bins[c].items = items;
        items += a->tc_cap[c];
    }
    tc->epoch = atomic_load(&a->flush_epoch) & ~FP_EPOCH_ASLEEP;
    fp_lock(&a->sp->lock);
    FP_LIST_PUSH(&a->tcaches, tc, next, prev);
    fp_unlock(&a->sp->lock);
    return tc;
}

/* The calling thread's cache for a, made on first use and flushed if a trim
 * asked; NULL if caches are off or no host memory is left (the caller then
 * uses the classes directly). */
static fp_tcache *tcache_get(fp_alloc *a)
{
    if (!a->thread_cache)
        return NULL;
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        if (slot_is(&tls_slots[i], a)) {
            fp_tls_slot s = tls_slots[i];
            memmove(&tls_slots[1], &tls_slots[0], (size_t)i * sizeof s);
            tls_slots[0] = s;
            if (s.tc->epoch != atomic_load(&a->flush_epoch))
                tcache_flush(a, s.tc);
            return s.tc;
        }
    }
    if (!tls_key_set) {
        pthread_once(&tls_key_once, make_key);
        pthread_setspecific(tls_key, (void *)1);
        tls_key_set = 1;
    }
    fp_tcache *tc = tcache_new(a);
    if (!tc)
        return NULL;
    fp_tls_slot *last = &tls_slots[FP_TLS_SLOTS - 1];
    if (last->owner) {
        fp_lock(&registry_lock);
        if (registry_has(last))
            tcache_retire(last->owner, last->tc);
        fp_unlock(&registry_lock);
    }
    memmove(&tls_slots[1], &tls_slots[0], (FP_TLS_SLOTS - 1) * sizeof tls_slots[0]);
    tls_slots[0] = (fp_tls_slot){a, a->id, tc};
    return tc;
}

void fp_alloc_set_asleep(fp_alloc *a, int asleep)
{
    if (asleep) {
        atomic_fetch_or(&a->flush_epoch, FP_EPOCH_ASLEEP);
        return;
    }
    atomic_fetch_and(&a->flush_epoch, ~FP_EPOCH_ASLEEP);
    atomic_fetch_add(&a->flush_epoch, 1);
}

void fp_alloc_flush_all(fp_alloc *a)
{
    /* other threads flush their caches at their next call */
    atomic_fetch_add(&a->flush_epoch, 1);
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&tls_slots[i], a))
            tcache_flush(a, tls_slots[i].tc);
}

int fp_tcache_mine(const fp_alloc *a, const fp_tcache *tc)
{
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&tls_slots[i], a) && tls_slots[i].tc == tc)
            return 1;
    return 0;
}

fabpool_status fabpool_thread_flush(fabpool_t *p)
{
    fp_alloc *a = A(p);
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_thread_flush: the pool is NULL");
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&tls_slots[i], a))
            tcache_flush(a, tls_slots[i].tc);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ the fast path */

static inline void count(_Atomic uint64_t *c)
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
    const fp_tls_slot *sl = &tls_slots[0];
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
    count(&tc->allocs[cls]);
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
    count(&tc->frees[s->cls]);
    return 1;
}

/* ------------------------------------------------------------ blocks */

/* Set while fabpool_alloc_on_stream calls fabpool_alloc after a poll of its own (and so, for the trace,
 * while fabpool_alloc is the pool's call and not the application's). */
static _Thread_local int tls_polled;

static fabpool_status alloc_slow_once(fp_alloc *a, size_t size, void **out)
{
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: the pool is NULL");
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: the output pointer is NULL");
    *out = NULL;
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: size 0; ask for at least one byte");
    if (FP_UNLIKELY(fp_chunks_asleep(a->sp->ch)))
        return fp_chunk_asleep_error("fabpool_alloc");
    if (size > a->slab_max)
        return large_alloc(a, size, out);

    unsigned cls = fp_class_of(size);
    fabpool_status st = FABPOOL_OK;
    fp_tcache *tc = tcache_get(a);
    if (tc && tc->bins[cls].cap) {
        fp_bin *b = &tc->bins[cls];
        if (!b->n) {
            unsigned want = b->cap / 2 ? b->cap / 2 : 1;
            b->n = fp_class_take(a->heap, cls, b->items, want, 0, &st);
            if (!b->n)
                return st;
            fp_usage_slab_out(a->use, b->n * a->heap->classes[cls].obj_size);
            trim_policy(a);   /* the decay's clock, on a slow path */
        }
        tcache_pop(tc, cls, out);   /* the fast path's pop, on a bin that now holds blocks */
        return FABPOOL_OK;
    }
    fp_item it;
    if (!fp_class_take(a->heap, cls, &it, 1, 1, &st))   /* its free flag cleared under the class lock */
        return st;
    fp_usage_slab_out(a->use, a->heap->classes[cls].obj_size);
    trim_policy(a);   /* the decay's clock, on a slow path */
    atomic_fetch_add_explicit(&a->counts[cls].allocs, 1, memory_order_relaxed);
    *out = (void *)(uintptr_t)it.ptr;
    return FABPOOL_OK;
}

/* The slow path: blocks freed on streams whose work is done go back to the
 * pool first (an event query per stream, only while some are pending), and
 * an allocation that finds the device out of memory waits for the rest and
 * tries once more. */
static fabpool_status alloc_slow(fp_alloc *a, size_t size, void **out)
{
    if (a && !tls_polled && fp_retire_pending(a->retire))
        fp_alloc_drain(a, 0, 0);
    fabpool_status st = alloc_slow_once(a, size, out);
    if (st == FABPOOL_ERR_OUT_OF_MEMORY && fp_retire_pending(a->retire)) {
        FP_LOG_CH(FP_LOG_INFO, a->sp->ch, "out of memory for %zu bytes: waiting for the %llu bytes freed on streams, "
                  "then one more try", size, (unsigned long long)atomic_load(&a->retire->pending_bytes));
        fp_heap_count_oom_retry(a->heap);
        fp_alloc_drain(a, 1, 0);
        st = alloc_slow_once(a, size, out);
    }
    if (st == FABPOOL_ERR_OUT_OF_MEMORY)
        FP_LOG_CH(FP_LOG_WARN, a->sp->ch, "an allocation of %zu bytes failed: %s", size, fabpool_last_error());
    return st;
}

/* An allocation with a trace: recorded with its status and trace_flags (FABPOOL_TRACE_R_APP for the
 * application's fabpool_alloc, 0 for the stream pair's own). */
static fabpool_status alloc_traced(fp_alloc *a, size_t size, void **out, unsigned trace_flags)
{
    fabpool_status st = alloc_slow(a, size, out);
    fp_trace_record(a->trace, FABPOOL_TR_ALLOC, trace_flags, st == FABPOOL_OK && out ? (uint64_t)(uintptr_t)*out : 0,
                    size, 0, (unsigned)st);
    return st;
}

/* fabpool_alloc's work, for any caller: the stream pair's owner comes here directly. */
static inline fabpool_status alloc_any(fp_alloc *a, size_t size, void **out)
{
    if (FP_UNLIKELY(a && a->trace))
        return alloc_traced(a, size, out, 0);
    if (FP_LIKELY(a && out && size && size <= a->slab_max)) {
        fp_tcache *tc = tcache_hot(a);
        if (FP_LIKELY(tc && tcache_pop(tc, fp_class_of(size), out)))
            return FABPOOL_OK;
    }
    return alloc_slow(a, size, out);
}

fabpool_status fabpool_alloc(fabpool_t *p, size_t size, void **out)
{
    fp_alloc *a = A(p);
    /* Blocks the owner stream freed may still be in use by its queued work:
     * the first allocation that is not the owner's waits for that work and
     * ends the owner mode (retire.h); a call that will be refused (asleep,
     * bad arguments) ends nothing. */
    if (FP_UNLIKELY(a && fp_retire_owned(a->retire)) && out && size && !fp_chunks_asleep(a->sp->ch)) {
        fabpool_status st = fp_retire_disown(a->retire);
        if (st != FABPOOL_OK) {
            if (out)
                *out = NULL;
            fp_error_append(" (fabpool_alloc: waiting for the stream-ordered frees of stream %p)", a->retire->owner);
            return st;
        }
    }
    if (FP_UNLIKELY(a && a->trace))
        return alloc_traced(a, size, out, tls_polled ? 0u : FABPOOL_TRACE_R_APP);
    return alloc_any(a, size, out);
}

/* Block addr of slab s (index idx) is free: into the thread's cache, made
 * or flushed as needed, or without one to its slab, its free flag set under
 * the class lock (a flag is set outside a lock only by a thread whose cache
 * the pool lists: fabpool_check, check.c). */
static fabpool_status free_slab_slow(fp_alloc *a, fp_span *s, uint64_t addr, uint32_t idx)
{
    unsigned cls = s->cls;
    fp_tcache *tc = tcache_get(a);
    if (tc && tc->bins[cls].cap) {
        fp_bin *b = &tc->bins[cls];
        if (b->n == b->cap) {
            /* give back the older half */
            unsigned half = b->n / 2 ? b->n / 2 : 1;
            fp_usage_slab_back(a->use, half * a->heap->classes[cls].obj_size);
            fp_class_give(a->heap, cls, b->items, half, 0);
            memmove(b->items, b->items + half, (b->n - half) * sizeof *b->items);
            b->n -= half;
        }
        tcache_push(tc, s, addr);   /* the fast path's push, on a bin that now has room */
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_FREE, memory_order_relaxed);
        trim_policy(a);
        return FABPOOL_OK;
    }
    fp_item it = {addr, s};
    fp_usage_slab_back(a->use, a->heap->classes[cls].obj_size);
    fp_class_give(a->heap, cls, &it, 1, 1);
    atomic_fetch_add_explicit(&a->counts[cls].frees, 1, memory_order_relaxed);
    trim_policy(a);
    return FABPOOL_OK;
}

/* The refusal of a free (or a use) of a slab block whose flag f says it is not given out. */
static fabpool_status already_free(const char *fn, uint64_t addr, uint64_t obj, uint8_t f)
{
    return fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this %llu-byte block is already free%s (double free)", fn,
                    (void *)(uintptr_t)addr, (unsigned long long)obj,
                    f == FP_FREEFLAG_PENDING ? ", freed on a stream and waiting for its work" : "");
}

static fabpool_status free_recorded(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                    void *stream, int traced, int *queued);

/* The frees off the hot path, apart so that it stays as it is: a large
 * block while some block has recorded streams (with recorded streams of
 * its own it waits for them) ... */
static __attribute__((noinline)) fabpool_status free_large_used(fp_alloc *a, fp_span *s, uint64_t addr,
                                                                const char *fn, int on_stream, void *stream,
                                                                int *queued)
{
    int q = 0;
    fabpool_status st;
    if ((st = free_recorded(a, s, addr, fn, on_stream, stream, 1, &q)) != FABPOOL_OK || q) {
        if (queued)
            *queued = q;
        return st;
    }
    return large_free(a, addr, fn);
}

/* ... and a slab block whose flag f is not FP_FREEFLAG_USED: a double free,
 * or a block with recorded streams, which waits for them. */
static __attribute__((noinline)) fabpool_status free_slab_flagged(fp_alloc *a, fp_span *s, uint64_t addr,
                                                                  const char *fn, uint8_t f, int on_stream,
                                                                  void *stream, int *queued)
{
    if (f != FP_FREEFLAG_RECORDED)
        return already_free(fn, addr, (uint64_t)s->obj_q << FP_QUANTUM_SHIFT, f);
    int q = 0;
    fabpool_status st = free_recorded(a, s, addr, fn, on_stream, stream, 1, &q);
    if (st != FABPOOL_OK || q) {
        if (queued)
            *queued = q;
        return st;
    }
    uint32_t idx = 0;
    fp_slab_index(s, addr, &idx);
    return free_slab_slow(a, s, addr, idx);
}

/* fabpool_free's work once the block's span s is looked up, its free in the
 * trace already; fn names the call in messages.  A block with recorded
 * streams waits for them (and for `stream`, with on_stream): *queued (if
 * not NULL) is set to 1 then, and left as it is otherwise. */
static inline __attribute__((always_inline)) fabpool_status free_block(fp_alloc *a, fp_span *s, uint64_t addr,
                                                                        const char *fn, int on_stream, void *stream,
                                                                        int *queued)
{
    if (s->kind != FP_SPAN_SLAB) {
        if (FP_UNLIKELY(fp_retire_any_used(a->retire)))
            return free_large_used(a, s, addr, fn, on_stream, stream, queued);
        return large_free(a, addr, fn);
    }
    uint32_t idx;
    if (FP_UNLIKELY(!fp_slab_index(s, addr, &idx)))
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "%s(%p): an interior pointer into a slab of %llu-byte blocks; free the pointer "
                        "fabpool_alloc returned",
                        fn, (void *)(uintptr_t)addr, (unsigned long long)((uint64_t)s->obj_q << FP_QUANTUM_SHIFT));
    /* A double free is caught by the block's flag.  Two threads freeing the
     * same block at the same instant may both pass: that race is the
     * caller's bug, and a locked exchange here would double the hot path. */
    uint8_t f = atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed);
    if (FP_UNLIKELY(f))
        return free_slab_flagged(a, s, addr, fn, f, on_stream, stream, queued);
    fp_tcache *tc = tcache_hot(a);
    if (FP_LIKELY(tc && tcache_push(tc, s, addr))) {
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_FREE, memory_order_relaxed);
        return FABPOOL_OK;
    }
    return free_slab_slow(a, s, addr, idx);
}

static fabpool_status not_ours(const fp_alloc *a, const char *fn, const void *ptr)
{
    return fp_error(FABPOOL_ERR_NOT_FOUND,
                    "%s(%p): this pool (device %d) did not give out that pointer, or it was freed and its memory "
                    "returned to the driver", fn, ptr, (int)a->sp->ch->dev);
}

/* fabpool_free's work; trace_flags: FABPOOL_TRACE_R_APP for the application's call, 0 for the pool's own
 * (a block freed on a stream, given back once its work is done). */
static inline fabpool_status free_any(fp_alloc *a, void *ptr, unsigned trace_flags)
{
    if (FP_UNLIKELY(!ptr))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free: the pointer is NULL");
    /* before the free: no reuse of ptr can precede it in the trace */
    FP_TRACE_F(a->trace, trace_flags, FABPOOL_TR_FREE, ptr, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN);
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    fp_span *s = fp_map_get(&a->map, addr);
    if (FP_UNLIKELY(!s))
        return not_ours(a, "fabpool_free", ptr);
    return free_block(a, s, addr, "fabpool_free", 0, NULL, NULL);
}

fabpool_status fabpool_free(fabpool_t *p, void *ptr)
{
    fp_alloc *a = A(p);
    if (FP_UNLIKELY(!a))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free(%p): the pool is NULL", ptr);
    return free_any(a, ptr, FABPOOL_TRACE_R_APP);
}

fabpool_status fabpool_usable_size(fabpool_t *p, const void *ptr, size_t *out)
{
    fp_alloc *a = A(p);
    if (!a || !ptr || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_usable_size: the pool, the pointer or the output is NULL");
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    fp_span *s = fp_map_get(&a->map, addr);
    uint32_t idx;
    if (s && s->kind != FP_SPAN_SLAB) {
        fabpool_status st = fp_large_usable(a->heap, addr, &usable, "fabpool_usable_size");
        *out = (size_t)usable;
        return st;
    }
    if (!s || !fp_slab_index(s, addr, &idx))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_usable_size(%p): not a block this pool gave out", ptr);
    *out = (size_t)s->obj_q << FP_QUANTUM_SHIFT;
    return FABPOOL_OK;
}

fabpool_status fp_alloc_live_block(fp_alloc *a, uint64_t addr, uint64_t *usable, const char *fn)
{
    fp_span *s = fp_map_get(&a->map, addr);
    if (!s)
        return not_ours(a, fn, (void *)(uintptr_t)addr);
    if (s->kind != FP_SPAN_SLAB)
        return fp_large_live_locked(a->heap, addr, usable, fn);
    uint32_t idx = 0;
    uint64_t size = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
    if (!fp_slab_index(s, addr, &idx))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer into a block of %llu bytes; give the "
                        "pointer fabpool_alloc returned", fn, (void *)(uintptr_t)addr, (unsigned long long)size);
    unsigned state = atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed);
    if (state != FP_FREEFLAG_USED && state != FP_FREEFLAG_RECORDED)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): this %llu-byte block is free%s; only a live block can be "
                        "used", fn, (void *)(uintptr_t)addr, (unsigned long long)size,
                        state == FP_FREEFLAG_PENDING ? " (freed on a stream and waiting for its work)" : "");
    *usable = size;
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ stream-ordered blocks
 *
 * A block freed on a stream stays a live block of the pool (its slab flag
 * FP_FREEFLAG_PENDING, a large block FP_LARGE_PENDING) in the retirement
 * queue (retire.h) until an allocation on the same stream takes it back or
 * an event recorded on its stream after the free has completed; then it is
 * freed into the pool like any other block. */

/* A pending block becomes a block given out again. */
static void unpend(fp_alloc *a, uint64_t ptr)
{
    fp_span *s = fp_map_get(&a->map, ptr);
    uint32_t idx = 0;
    if (s && s->kind == FP_SPAN_SLAB) {
        fp_slab_index(s, ptr, &idx);
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_USED, memory_order_relaxed);
    } else if (s) {
        fp_large_unpend(a->heap, ptr);
    }
}

/* Gives a chain of blocks the queue handed back to the pool (one whose
 * free is in the trace already is not traced again). */
static void release_chain(fp_alloc *a, fp_rblock *chain)
{
    for (fp_rblock *b = chain; b; b = b->fnext) {
        unpend(a, b->ptr);
        fp_span *s = b->traced ? fp_map_get(&a->map, b->ptr) : NULL;
        if ((b->traced ? s && free_block(a, s, b->ptr, "fabpool_free", 0, NULL, NULL) == FABPOOL_OK
                       : free_any(a, (void *)(uintptr_t)b->ptr, 0) == FABPOOL_OK))
            fp_retire_released(a->retire);
    }
    fp_retire_recycle(a->retire, chain);
}

/* A block with recorded streams (fabpool_record_stream), checked live by the
 * caller, is freed: by fabpool_free (on_stream 0) or on `stream`, its free
 * in the trace already (traced) or not.  If a stream other than `stream`
 * was recorded, it waits in the queue for an event on each and on `stream`
 * (*queued = 1); else its record goes and the caller frees it as any block
 * (*queued = 0, the block as it was but for its slab flag, now
 * FP_FREEFLAG_USED).  On failure nothing changed. */
static fabpool_status free_recorded(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                    void *stream, int traced, int *queued)
{
    *queued = 0;
    uint64_t usable = 0;
    uint32_t cls = FP_RETIRE_LARGE, idx = 0;
    fabpool_status st = FABPOOL_OK;
    if (s->kind == FP_SPAN_SLAB) {
        fp_slab_index(s, addr, &idx);
        usable = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
        cls = s->cls;
        uint8_t want = FP_FREEFLAG_RECORDED;
        if (!atomic_compare_exchange_strong_explicit(&s->freeflag[idx], &want, FP_FREEFLAG_PENDING,
                                                     memory_order_relaxed, memory_order_relaxed))
            return want == FP_FREEFLAG_USED ? FABPOOL_OK : already_free(fn, addr, usable, want);
    } else if (!fp_retire_used(a->retire, addr)) {
        return FABPOOL_OK;
    } else if ((st = fp_large_pend(a->heap, addr, fn, &usable)) != FABPOOL_OK) {
        return st;
    }
    st = fp_retire_free_used(a->retire, addr, usable, cls, on_stream, stream, traced, queued);
    if (st == FABPOOL_OK && *queued)
        return FABPOOL_OK;
    unpend(a, addr);
    if (st != FABPOOL_OK) {
        if (s->kind == FP_SPAN_SLAB) /* its streams are still recorded */
            atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_RECORDED, memory_order_relaxed);
        fp_error_append(" (%s(%p): the block is still the caller's, its streams recorded)", fn, (void *)(uintptr_t)addr);
    }
    return st;
}

void fp_alloc_drain(fp_alloc *a, int wait, int forget)
{
    release_chain(a, fp_retire_poll(a->retire, wait, forget));
    if (wait) /* and what the owner stream freed at once (its status: the next unmap fences again) */
        fp_retire_fence(a->retire);
}

/* Which list a request of size bytes looks in, and for a large one the sizes that fit it (at most 1.25x). */
static uint32_t stream_class(const fp_alloc *a, size_t size, uint64_t *need, uint64_t *max)
{
    if (size <= a->slab_max) {
        *need = *max = 0;
        return fp_class_of(size);
    }
    *need = fp_large_size(a->heap, size);
    *max = (uint64_t)size + size / 4;
    if (*max < *need)
        *max = *need;
    return FP_RETIRE_LARGE;
}

fabpool_status fabpool_alloc_on_stream(fabpool_t *p, size_t size, void *stream, void **out)
{
    fp_alloc *a = A(p);
    if (!a || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_on_stream: the pool or the output pointer is NULL");
    *out = NULL;
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_on_stream: size 0; ask for at least one byte");
    fabpool_status st = FABPOOL_OK;
    /* before anything is taken: a block the stream freed, another stream's
     * done block and the owner claim would each hand out (or change) what
     * sleep unmapped */
    if (FP_UNLIKELY(fp_chunks_asleep(a->sp->ch))) {
        st = fp_chunk_asleep_error("fabpool_alloc_on_stream");
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, 0, size, stream, st);
        return st;
    }
    if (fp_retire_owner_claim(a->retire, stream)) {
        /* the owner: what it freed went to the pool at once, and any block of the pool is safe for it */
        void *q = NULL;
        st = alloc_any(a, size, &q);
        if (st != FABPOOL_OK)
            fp_error_append(" (fabpool_alloc_on_stream, stream %p)", stream);
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, (uint64_t)(uintptr_t)q, size, stream, st);
        *out = q;
        return st;
    }
    if (fp_retire_owned(a->retire) && (st = fp_retire_disown(a->retire)) != FABPOOL_OK) {
        fp_error_append(" (fabpool_alloc_on_stream, stream %p, waiting for the owner stream %p)", stream,
                        a->retire->owner);
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, 0, size, stream, st);
        return st;
    }
    uint64_t need, max, usable = 0;
    uint32_t cls = size <= a->sp->va.size ? stream_class(a, size, &need, &max) : FP_RETIRE_LARGE;
    if (size > a->sp->va.size)
        need = max = 0;
    /* the stream's own freed blocks: stream order makes them safe at once */
    uint64_t ptr = fp_retire_pending(a->retire) && need <= max ?
                   fp_retire_take(a->retire, stream, cls, need, max, &usable) : 0;
    if (ptr) {
        unpend(a, ptr);
    } else if (fp_retire_pending(a->retire)) {
        /* a miss: what other streams freed and is done goes back, the first that fits to the caller */
        fp_rblock *chain = fp_retire_poll(a->retire, 0, 0), **at = &chain;
        for (fp_rblock *b = chain; b && size <= a->sp->va.size; at = &b->fnext, b = b->fnext)
            if (!b->traced && /* one whose free is traced is the pool's free memory in the trace: it goes back */
                (cls == FP_RETIRE_LARGE ? b->cls == cls && b->usable >= need && b->usable <= max : b->cls == cls)) {
                ptr = b->ptr;
                *at = b->fnext;
                b->fnext = NULL;
                unpend(a, ptr);
                fp_retire_recycle(a->retire, b);
                fp_retire_reused_after_event(a->retire);
                break;
            }
        release_chain(a, chain);
    }
    if (!ptr) {
        void *q = NULL;
        tls_polled = 1;
        st = fabpool_alloc(P(a), size, &q);
        tls_polled = 0;
        if (st == FABPOOL_OK)
            ptr = (uint64_t)(uintptr_t)q;
        else
            fp_error_append(" (fabpool_alloc_on_stream, stream %p)", stream);
    }
    FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, ptr, size, stream, st);
    *out = (void *)(uintptr_t)ptr;
    return st;
}

/* Whether the block at addr (span s) is live, given out and not freed: OK
 * with its size, list (slab class or FP_RETIRE_LARGE) and *recorded (a slab
 * block with recorded streams, or for a large block whether any block has
 * them), or the status and message of a refusal (an interior pointer, a
 * block already free or pending; fn names the call).  It changes nothing:
 * the caller acts after. */
static fabpool_status live_block(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, uint64_t *usable,
                                 uint32_t *cls, int *recorded)
{
    *recorded = s->kind == FP_SPAN_SLAB ? 0 : fp_retire_any_used(a->retire);
    if (s->kind != FP_SPAN_SLAB) {
        *cls = FP_RETIRE_LARGE;
        return fp_large_check(a->heap, addr, fn, usable);
    }
    uint64_t obj = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
    uint32_t idx = 0;
    if (!fp_slab_index(s, addr, &idx))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer into a slab of %llu-byte blocks; free "
                        "the pointer fabpool_alloc returned", fn, (void *)(uintptr_t)addr, (unsigned long long)obj);
    uint8_t f = atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed);
    if (f != FP_FREEFLAG_USED && f != FP_FREEFLAG_RECORDED)
        return already_free(fn, addr, obj, f);
    *recorded = f == FP_FREEFLAG_RECORDED;
    *usable = obj;
    *cls = s->cls;
    return FABPOOL_OK;
}

/* The span of the block ptr names, for fn: the refusal of a NULL pool or
 * pointer, or of an address outside this pool's blocks. */
static fabpool_status block_span(fp_alloc *a, void *ptr, const char *fn, fp_span **s)
{
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s(%p): the pool is NULL", fn, ptr);
    if (!ptr)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: the pointer is NULL", fn);
    *s = fp_map_get(&a->map, (uint64_t)(uintptr_t)ptr);
    return *s ? FABPOOL_OK : not_ours(a, fn, ptr);
}

fabpool_status fabpool_free_on_stream(fabpool_t *p, void *ptr, void *stream)
{
    fp_alloc *a = A(p);
    fp_span *s = NULL;
    fabpool_status st = block_span(a, ptr, "fabpool_free_on_stream", &s);
    if (st != FABPOOL_OK)
        return st;
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    uint32_t cls = 0;
    int recorded = 0, queued = 0, checked = 0;
    /* the owner's free checks the pointer as fabpool_free does; where the
     * call may make the stream the owner, the pointer is checked first (a
     * refused free changes nothing, and claims no owner) */
    int owner = fp_retire_owner_is(a->retire, stream);
    if (!owner) {
        if ((st = live_block(a, s, addr, "fabpool_free_on_stream", &usable, &cls, &recorded)) != FABPOOL_OK)
            return st;
        checked = 1;
        owner = fp_retire_owner_claim(a->retire, stream);
    }
    if (owner && fp_retire_owner_free(a->retire)) {
        /* the owner: freed into the pool at once (the next unmap or foreign allocation fences); with streams
         * recorded besides it, it waits for them */
        if (FP_UNLIKELY(a->trace)) {
            if (s->kind == FP_SPAN_SLAB)
                usable = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
            else if (!checked)
                (void)fp_large_usable(a->heap, addr, &usable, "fabpool_free_on_stream"); /* a bad pointer: refused below */
            FP_TRACE(a->trace, FABPOOL_TR_APP_FREE, ptr, usable, stream);
            FP_TRACE_POOL(a->trace, FABPOOL_TR_FREE, ptr, 0, 0);
        }
        if ((st = free_block(a, s, addr, "fabpool_free_on_stream", 1, stream, &queued)) == FABPOOL_OK && !queued)
            fp_retire_owner_freed(a->retire);
        return st;
    }
    if (!checked && (st = live_block(a, s, addr, "fabpool_free_on_stream", &usable, &cls, &recorded)) != FABPOOL_OK)
        return st;
    /* another stream while the owner mode holds: it ends (after the checks above: bad input changes nothing) */
    if (fp_retire_owned(a->retire) && (st = fp_retire_disown(a->retire)) != FABPOOL_OK) {
        fp_error_append(" (fabpool_free_on_stream(%p), stream %p, waiting for the owner stream %p: the block is "
                        "still the caller's)", ptr, stream, a->retire->owner);
        return st;
    }
    FP_TRACE(a->trace, FABPOOL_TR_APP_FREE, ptr, usable, stream); /* before any reuse of ptr */
    /* used on other streams too (fabpool_record_stream): it waits for them */
    if (FP_UNLIKELY(recorded) &&
        ((st = free_recorded(a, s, addr, "fabpool_free_on_stream", 1, stream, 0, &queued)) != FABPOOL_OK || queued))
        return st;
    /* marked pending, checked again where two threads could race: the flag's exchange, the large block's lock */
    if (s->kind == FP_SPAN_SLAB) {
        uint32_t idx = 0;
        fp_slab_index(s, addr, &idx);
        uint8_t want = FP_FREEFLAG_USED;
        if (!atomic_compare_exchange_strong_explicit(&s->freeflag[idx], &want, FP_FREEFLAG_PENDING,
                                                     memory_order_relaxed, memory_order_relaxed))
            return already_free("fabpool_free_on_stream", addr, usable, want);
    } else if ((st = fp_large_pend(a->heap, addr, "fabpool_free_on_stream", &usable)) != FABPOOL_OK) {
        return st;
    }
    int poll = 0;
    st = fp_retire_free(a->retire, stream, addr, usable, cls, &poll);
    if (st != FABPOOL_OK) {
        unpend(a, addr); /* nothing changed: the block is still the caller's */
        fp_error_append(" (fabpool_free_on_stream(%p): the block is still the caller's)", ptr);
        return st;
    }
    if (poll)
        fp_alloc_drain(a, 0, 0);
    return FABPOOL_OK;
}

fabpool_status fabpool_record_stream(fabpool_t *p, void *ptr, void *stream)
{
    fp_alloc *a = A(p);
    fp_span *s = NULL;
    fabpool_status st = block_span(a, ptr, "fabpool_record_stream", &s);
    if (st != FABPOOL_OK)
        return st;
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    uint32_t cls = 0;
    int recorded = 0;
    st = live_block(a, s, addr, "fabpool_record_stream", &usable, &cls, &recorded);
    if (st == FABPOOL_ERR_DOUBLE_FREE)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_record_stream(%p, stream %p): the block is not live: it was "
                        "freed (fabpool_free or fabpool_free_on_stream); record a stream on a block before its free",
                        ptr, stream);
    if (st != FABPOOL_OK)
        return st;
    if ((st = fp_retire_use(a->retire, addr, stream)) != FABPOOL_OK)
        return st;
    if (s->kind == FP_SPAN_SLAB) { /* its free goes to the slow path, which finds the streams */
        uint32_t idx = 0;
        fp_slab_index(s, addr, &idx);
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_RECORDED, memory_order_relaxed);
    }
    return FABPOOL_OK;
}
