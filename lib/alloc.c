/* alloc.c - fabpool_alloc / fabpool_free: the hot path through per-thread
 * caches, the slow path to the slab classes, and the thread caches' life. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"
#include "trace.h"

#define FP_LIKELY(x) __builtin_expect(!!(x), 1)
#define FP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define FP_TLS_SLOTS 8

/* The thread's caches, by pool.  A slot matches only if both the pool's
 * address and its unique id match, so a slot of a destroyed pool is never
 * used again (its cache was freed with the pool). */
typedef struct fp_tls_slot {
    struct fabpool *pool;
    uint64_t id;
    fp_tcache *tc;
} fp_tls_slot;

static _Thread_local fp_tls_slot tls_slots[FP_TLS_SLOTS];
static _Thread_local int tls_key_set;
static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

/* Live pools, so that a thread that exits can tell whether the pool of a
 * slot still exists without touching it. */
static fp_lock_t registry_lock = FP_LOCK_INITIALIZER(FP_LOCK_REGISTRY, "registry");
static fp_tls_slot *registry;   /* .tc unused */
static size_t registry_n, registry_cap;
static _Atomic uint64_t next_pool_id = 1;

int fp_registry_add(struct fabpool *p)
{
    fp_lock(&registry_lock);
    if (registry_n == registry_cap) {
        size_t cap = registry_cap ? registry_cap * 2 : 8;
        fp_tls_slot *r = realloc(registry, cap * sizeof *r);
        if (!r) {
            fp_unlock(&registry_lock);
            return -1;
        }
        registry = r;
        registry_cap = cap;
    }
    p->id = atomic_fetch_add(&next_pool_id, 1);
    registry[registry_n++] = (fp_tls_slot){p, p->id, NULL};
    fp_unlock(&registry_lock);
    return 0;
}

static int registry_has(struct fabpool *p, uint64_t id)
{
    for (size_t i = 0; i < registry_n; i++)
        if (registry[i].pool == p && registry[i].id == id)
            return 1;
    return 0;
}

static void tcache_free(struct fabpool *p, fp_tcache *tc)
{
    for (unsigned c = 0; c < FP_NCLASS; c++) {
        atomic_fetch_add(&p->classes[c].tc_allocs, atomic_load_explicit(&tc->allocs[c], memory_order_relaxed));
        atomic_fetch_add(&p->classes[c].tc_frees, atomic_load_explicit(&tc->frees[c], memory_order_relaxed));
    }
    fp_meta_free(&p->meta, tc, tc->bytes);
}

/* Flushes and frees a cache whose pool is alive. */
static void tcache_retire(struct fabpool *p, fp_tcache *tc)
{
    fp_tcache_flush(p, tc);
    fp_lock(&p->lock);
    if (tc->prev)
        tc->prev->next = tc->next;
    else
        p->tcaches = tc->next;
    if (tc->next)
        tc->next->prev = tc->prev;
    fp_unlock(&p->lock);
    tcache_free(p, tc);
    fp_trim_policy(p);
}

void fp_registry_remove(struct fabpool *p)
{
    fp_lock(&registry_lock);
    for (size_t i = 0; i < registry_n; i++)
        if (registry[i].pool == p && registry[i].id == p->id) {
            registry[i] = registry[--registry_n];
            break;
        }
    fp_unlock(&registry_lock);
}

static void thread_exit(void *arg)
{
    (void)arg;
    fp_lock(&registry_lock);
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        fp_tls_slot *s = &tls_slots[i];
        if (s->pool && registry_has(s->pool, s->id))
            tcache_retire(s->pool, s->tc);
        memset(s, 0, sizeof *s);
    }
    fp_unlock(&registry_lock);
}

static void make_key(void) { pthread_key_create(&tls_key, thread_exit); }

void fp_tcaches_destroy(struct fabpool *p)
{
    /* The pool left the registry first: exiting threads no longer touch it. */
    while (p->tcaches) {
        fp_tcache *tc = p->tcaches;
        p->tcaches = tc->next;
        tcache_free(p, tc);
    }
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (tls_slots[i].pool == p && tls_slots[i].id == p->id)
            memset(&tls_slots[i], 0, sizeof tls_slots[i]);
}

void fp_tcache_flush(struct fabpool *p, fp_tcache *tc)
{
    for (unsigned c = 0; c < p->n_slab_classes; c++) {
        fp_bin *b = &tc->bins[c];
        if (b->n) {
            fp_class_give(p, c, b->items, b->n);
            b->n = 0;
        }
    }
    tc->epoch = fp_tcache_epoch(p);
}

static fp_tcache *tcache_new(struct fabpool *p)
{
    size_t bytes = sizeof(fp_tcache) + p->n_slab_classes * sizeof(fp_bin);
    for (unsigned c = 0; c < p->n_slab_classes; c++)
        bytes += p->tc_cap[c] * sizeof(fp_item);
    fp_tcache *tc = fp_meta_alloc(&p->meta, bytes);
    if (!tc)
        return NULL;
    tc->pool = p;
    tc->bytes = bytes;
    fp_item *items = (fp_item *)(tc->bins + p->n_slab_classes);
    for (unsigned c = 0; c < p->n_slab_classes; c++) {
        tc->bins[c].cap = p->tc_cap[c];
        tc->bins[c].items = items;
        items += p->tc_cap[c];
    }
    tc->epoch = fp_tcache_epoch(p);
    fp_lock(&p->lock);
    tc->next = p->tcaches;
    if (p->tcaches)
        p->tcaches->prev = tc;
    p->tcaches = tc;
    fp_unlock(&p->lock);
    return tc;
}

/* The calling thread's cache for p, made on first use; NULL if caches are
 * off or no host memory is left (the caller then uses the classes directly). */
fp_tcache *fp_tcache_get(struct fabpool *p)
{
    if (!p->opt.thread_cache)
        return NULL;
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        if (tls_slots[i].pool == p && tls_slots[i].id == p->id) {
            fp_tls_slot s = tls_slots[i];
            memmove(&tls_slots[1], &tls_slots[0], (size_t)i * sizeof s);
            tls_slots[0] = s;
            if (s.tc->epoch != atomic_load(&p->flush_epoch))
                fp_tcache_flush(p, s.tc);
            return s.tc;
        }
    }
    if (!tls_key_set) {
        pthread_once(&tls_key_once, make_key);
        pthread_setspecific(tls_key, (void *)1);
        tls_key_set = 1;
    }
    fp_tcache *tc = tcache_new(p);
    if (!tc)
        return NULL;
    fp_tls_slot *last = &tls_slots[FP_TLS_SLOTS - 1];
    if (last->pool) {
        fp_lock(&registry_lock);
        if (registry_has(last->pool, last->id))
            tcache_retire(last->pool, last->tc);
        fp_unlock(&registry_lock);
    }
    memmove(&tls_slots[1], &tls_slots[0], (FP_TLS_SLOTS - 1) * sizeof tls_slots[0]);
    tls_slots[0] = (fp_tls_slot){p, p->id, tc};
    return tc;
}

fabpool_status fabpool_thread_flush(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_thread_flush: the pool is NULL");
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (tls_slots[i].pool == p && tls_slots[i].id == p->id)
            fp_tcache_flush(p, tls_slots[i].tc);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ blocks */

static inline void mark_used(const fp_item *it)
{
    uint32_t idx = 0;
    fp_slab_index(it->span, it->ptr, &idx);
    atomic_store_explicit(&it->span->freeflag[idx], 0, memory_order_relaxed);
}

static inline void count(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Set while fabpool_alloc_on_stream calls fabpool_alloc after a poll of its own. */
static _Thread_local int tls_polled;

static fabpool_status alloc_slow_once(fabpool_t *p, size_t size, void **out)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: the pool is NULL");
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: the output pointer is NULL");
    *out = NULL;
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc: size 0; ask for at least one byte");
    if (FP_UNLIKELY(fp_asleep(p)))
        return fp_asleep_error("fabpool_alloc");
    if (size > p->opt.slab_max_bytes)
        return fp_large_alloc(p, size, out);

    unsigned cls = fp_class_of(size);
    fabpool_status st = FABPOOL_OK;
    fp_tcache *tc = fp_tcache_get(p);
    if (tc && tc->bins[cls].cap) {
        fp_bin *b = &tc->bins[cls];
        if (!b->n) {
            unsigned want = b->cap / 2 ? b->cap / 2 : 1;
            b->n = fp_class_take(p, cls, b->items, want, &st);
            if (!b->n)
                return st;
            fp_trim_policy(p);   /* the decay's clock, on a slow path */
        }
        fp_item it = b->items[--b->n];
        mark_used(&it);
        count(&tc->allocs[cls]);
        *out = (void *)(uintptr_t)it.ptr;
        return FABPOOL_OK;
    }
    fp_item it;
    if (!fp_class_take(p, cls, &it, 1, &st))
        return st;
    fp_trim_policy(p);   /* the decay's clock, on a slow path */
    mark_used(&it);
    atomic_fetch_add_explicit(&p->classes[cls].allocs, 1, memory_order_relaxed);
    *out = (void *)(uintptr_t)it.ptr;
    return FABPOOL_OK;
}

/* The slow path: blocks freed on streams whose work is done go back to the
 * pool first (an event query per stream, only while some are pending), and
 * an allocation that finds the device out of memory waits for the rest and
 * tries once more. */
static fabpool_status alloc_slow(fabpool_t *p, size_t size, void **out)
{
    if (p && !tls_polled && fp_retire_pending(&p->retire))
        fp_retire_drain(p, 0, 0);
    fabpool_status st = alloc_slow_once(p, size, out);
    if (st == FABPOOL_ERR_OUT_OF_MEMORY && fp_retire_pending(&p->retire)) {
        atomic_fetch_add(&p->oom_retries, 1);
        fp_retire_drain(p, 1, 0);
        st = alloc_slow_once(p, size, out);
    }
    return st;
}

fabpool_status fabpool_alloc(fabpool_t *p, size_t size, void **out)
{
    if (FP_UNLIKELY(p && p->trace))
        return fp_trace_alloc(p, size, out, alloc_slow);
    if (FP_LIKELY(p && out && size && size <= p->opt.slab_max_bytes)) {
        fp_tls_slot *sl = &tls_slots[0];
        if (FP_LIKELY(sl->pool == p && sl->id == p->id)) {
            fp_tcache *tc = sl->tc;
            unsigned cls = fp_class_of(size);
            fp_bin *b = &tc->bins[cls];
            if (FP_LIKELY(b->n && tc->epoch == atomic_load_explicit(&p->flush_epoch, memory_order_relaxed))) {
                fp_item it = b->items[--b->n];
                mark_used(&it);
                count(&tc->allocs[cls]);
                *out = (void *)(uintptr_t)it.ptr;
                return FABPOOL_OK;
            }
        }
    }
    return alloc_slow(p, size, out);
}

static fabpool_status free_slab_slow(fabpool_t *p, fp_span *s, uint64_t addr)
{
    unsigned cls = s->cls;
    fp_item it = {addr, s};
    fp_tcache *tc = fp_tcache_get(p);
    if (tc && tc->bins[cls].cap) {
        fp_bin *b = &tc->bins[cls];
        if (b->n == b->cap) {
            /* give back the older half */
            unsigned half = b->n / 2 ? b->n / 2 : 1;
            fp_class_give(p, cls, b->items, half);
            memmove(b->items, b->items + half, (b->n - half) * sizeof *b->items);
            b->n -= half;
        }
        b->items[b->n++] = it;
        count(&tc->frees[cls]);
        fp_trim_policy(p);
        return FABPOOL_OK;
    }
    fp_class_give(p, cls, &it, 1);
    atomic_fetch_add_explicit(&p->classes[cls].frees, 1, memory_order_relaxed);
    fp_trim_policy(p);
    return FABPOOL_OK;
}

fabpool_status fabpool_free(fabpool_t *p, void *ptr)
{
    if (FP_UNLIKELY(!p))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free(%p): the pool is NULL", ptr);
    if (FP_UNLIKELY(!ptr))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free: the pointer is NULL");
    FP_TRACE(p, FABPOOL_TR_FREE, ptr, 0, 0); /* before the free: no reuse of ptr can precede it in the trace */
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    fp_span *s = fp_map_get(p, addr);
    if (FP_UNLIKELY(!s))
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "fabpool_free(%p): this pool (device %d) did not give out that pointer, or it was freed "
                        "and its memory returned to the driver",
                        ptr, (int)p->dev);
    if (s->kind != FP_SPAN_SLAB)
        return fp_large_free(p, s, addr);
    uint32_t idx;
    if (FP_UNLIKELY(!fp_slab_index(s, addr, &idx)))
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "fabpool_free(%p): an interior pointer into a slab of %llu-byte blocks; free the pointer "
                        "fabpool_alloc returned",
                        ptr, (unsigned long long)((uint64_t)s->obj_q << FP_QUANTUM_SHIFT));
    /* A double free is caught by the block's flag.  Two threads freeing the
     * same block at the same instant may both pass: that race is the
     * caller's bug, and a locked exchange here would double the hot path. */
    if (FP_UNLIKELY(atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed)))
        return fp_error(FABPOOL_ERR_DOUBLE_FREE, "fabpool_free(%p): this %llu-byte block is already free%s (double free)",
                        ptr, (unsigned long long)((uint64_t)s->obj_q << FP_QUANTUM_SHIFT),
                        atomic_load(&s->freeflag[idx]) == FP_FREEFLAG_PENDING ? ", freed on a stream and waiting for "
                        "its work" : "");
    atomic_store_explicit(&s->freeflag[idx], 1, memory_order_relaxed);
    fp_tls_slot *sl = &tls_slots[0];
    if (FP_LIKELY(sl->pool == p && sl->id == p->id)) {
        fp_tcache *tc = sl->tc;
        fp_bin *b = &tc->bins[s->cls];
        if (FP_LIKELY(b->n < b->cap && tc->epoch == atomic_load_explicit(&p->flush_epoch, memory_order_relaxed))) {
            b->items[b->n].ptr = addr;
            b->items[b->n].span = s;
            b->n++;
            count(&tc->frees[s->cls]);
            return FABPOOL_OK;
        }
    }
    return free_slab_slow(p, s, addr);
}

fabpool_status fabpool_usable_size(fabpool_t *p, const void *ptr, size_t *out)
{
    if (!p || !ptr || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_usable_size: the pool, the pointer or the output is NULL");
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    fp_span *s = fp_map_get(p, addr);
    uint32_t idx;
    if (!s || (s->kind == FP_SPAN_SLAB ? !fp_slab_index(s, addr, &idx)
                                        : addr != s->base || atomic_load(&s->in_use) != FP_LARGE_LIVE))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_usable_size(%p): not a block this pool gave out", ptr);
    *out = s->kind == FP_SPAN_SLAB ? (size_t)s->obj_q << FP_QUANTUM_SHIFT : (size_t)s->size;
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
static void unpend(struct fabpool *p, uint64_t ptr)
{
    fp_span *s = fp_map_get(p, ptr);
    uint32_t idx = 0;
    if (s && s->kind == FP_SPAN_SLAB) {
        fp_slab_index(s, ptr, &idx);
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_USED, memory_order_relaxed);
    } else if (s) {
        atomic_store_explicit(&s->in_use, FP_LARGE_LIVE, memory_order_relaxed);
    }
}

/* Gives a chain of blocks the queue handed back to the pool. */
static void release_chain(struct fabpool *p, fp_rblock *chain)
{
    for (fp_rblock *b = chain; b; b = b->fnext) {
        unpend(p, b->ptr);
        if (fabpool_free(p, (void *)(uintptr_t)b->ptr) == FABPOOL_OK)
            atomic_fetch_add_explicit(&p->retire.releases, 1, memory_order_relaxed);
    }
    fp_retire_recycle(&p->retire, chain);
}

void fp_retire_drain(struct fabpool *p, int wait, int forget)
{
    release_chain(p, fp_retire_poll(&p->retire, wait, forget));
}

/* Which list a request of size bytes looks in, and for a large one the sizes that fit it (at most 1.25x). */
static uint32_t stream_class(const struct fabpool *p, size_t size, uint64_t *need, uint64_t *max)
{
    if (size <= p->opt.slab_max_bytes) {
        *need = *max = 0;
        return fp_class_of(size);
    }
    *need = fp_round_up(size, p->gran);
    *max = (uint64_t)size + size / 4;
    if (*max < *need)
        *max = *need;
    return FP_RETIRE_LARGE;
}

fabpool_status fabpool_alloc_on_stream(fabpool_t *p, size_t size, void *stream, void **out)
{
    if (!p || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_on_stream: the pool or the output pointer is NULL");
    *out = NULL;
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_on_stream: size 0; ask for at least one byte");
    uint64_t need, max, usable = 0;
    uint32_t cls = size <= p->va_size ? stream_class(p, size, &need, &max) : FP_RETIRE_LARGE;
    if (size > p->va_size)
        need = max = 0;
    /* the stream's own freed blocks: stream order makes them safe at once */
    uint64_t ptr = fp_retire_pending(&p->retire) && need <= max ?
                   fp_retire_take(&p->retire, stream, cls, need, max, &usable) : 0;
    fabpool_status st = FABPOOL_OK;
    if (ptr) {
        unpend(p, ptr);
    } else if (fp_retire_pending(&p->retire)) {
        /* a miss: what other streams freed and is done goes back, the first that fits to the caller */
        fp_rblock *chain = fp_retire_poll(&p->retire, 0, 0), **at = &chain;
        for (fp_rblock *b = chain; b && size <= p->va_size; at = &b->fnext, b = b->fnext)
            if (cls == FP_RETIRE_LARGE ? b->cls == cls && b->usable >= need && b->usable <= max : b->cls == cls) {
                ptr = b->ptr;
                *at = b->fnext;
                b->fnext = NULL;
                unpend(p, ptr);
                fp_retire_recycle(&p->retire, b);
                atomic_fetch_add_explicit(&p->retire.reuse_after_event, 1, memory_order_relaxed);
                break;
            }
        release_chain(p, chain);
    }
    if (!ptr) {
        void *q = NULL;
        tls_polled = 1;
        st = fabpool_alloc(p, size, &q);
        tls_polled = 0;
        if (st == FABPOOL_OK)
            ptr = (uint64_t)(uintptr_t)q;
        else
            fp_error_append(" (fabpool_alloc_on_stream, stream %p)", stream);
    }
    FP_TRACE_ST(p, FABPOOL_TR_APP_ALLOC, ptr, size, stream, st);
    *out = (void *)(uintptr_t)ptr;
    return st;
}

fabpool_status fabpool_free_on_stream(fabpool_t *p, void *ptr, void *stream)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free_on_stream(%p): the pool is NULL", ptr);
    if (!ptr)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free_on_stream: the pointer is NULL");
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    fp_span *s = fp_map_get(p, addr);
    if (!s)
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "fabpool_free_on_stream(%p): this pool (device %d) did not give out that pointer, or it was "
                        "freed and its memory returned to the driver", ptr, (int)p->dev);
    uint32_t cls, idx = 0;
    if (s->kind == FP_SPAN_SLAB) {
        uint64_t obj = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
        if (!fp_slab_index(s, addr, &idx))
            return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_free_on_stream(%p): an interior pointer into a slab of "
                            "%llu-byte blocks; free the pointer fabpool_alloc returned", ptr, (unsigned long long)obj);
        uint8_t want = FP_FREEFLAG_USED;
        if (!atomic_compare_exchange_strong_explicit(&s->freeflag[idx], &want, FP_FREEFLAG_PENDING,
                                                     memory_order_relaxed, memory_order_relaxed))
            return fp_error(FABPOOL_ERR_DOUBLE_FREE, "fabpool_free_on_stream(%p): this %llu-byte block is already "
                            "free%s (double free)", ptr, (unsigned long long)obj,
                            want == FP_FREEFLAG_PENDING ? ", freed on a stream and waiting for its work" : "");
        usable = obj;
        cls = s->cls;
    } else {
        fabpool_status st = fp_large_pend(p, addr, &usable);
        if (st != FABPOOL_OK)
            return st;
        cls = FP_RETIRE_LARGE;
    }
    FP_TRACE(p, FABPOOL_TR_APP_FREE, ptr, usable, stream);
    int poll = 0;
    fabpool_status st = fp_retire_free(&p->retire, stream, addr, usable, cls, &poll);
    if (st != FABPOOL_OK) {
        unpend(p, addr); /* nothing changed: the block is still the caller's */
        fp_error_append(" (fabpool_free_on_stream(%p): the block is still the caller's)", ptr);
        return st;
    }
    if (poll)
        fp_retire_drain(p, 0, 0);
    return FABPOOL_OK;
}
