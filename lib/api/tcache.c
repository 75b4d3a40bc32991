/* tcache.c - the thread caches' life: the registry of live pools, a
 * thread's caches made on first use, flushed when a trim asks, closed when
 * the thread exits; and the heap's cache policy that their slow paths run
 * (alloc.h; the hit's pop and push are tcache.h's). */
#include "tcache.h"

#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "counter.h"
#include "error.h"
#include "list.h"
#include "lock.h"

_Thread_local fp_tls_slot fp_tls_slots[FP_TLS_SLOTS];
static _Thread_local int tls_key_set;
static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

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

/* tcache.h; the heap's cache policy (decay_ms, cache_limit) runs on every slow path, and a large block's
 * miss trades free chunks for its own (large_slack). */
void fp_alloc_log_released(const fp_alloc *a, fp_chunk_tally begun, const char *why)
{
    if (!begun.on)
        return;
    fp_chunk_tally t = fp_chunk_tally_end(begun);
    if (t.chunks)
        FP_LOG_CH(FP_LOG_INFO, a->sp->ch, "%s: %llu bytes in %llu chunks back to the driver (decay_ms %llu, "
                  "cache_limit %llu); the pool maps %llu", why, (unsigned long long)t.bytes,
                  (unsigned long long)t.chunks, (unsigned long long)a->heap->decay_ms,
                  (unsigned long long)a->heap->cache_limit, (unsigned long long)fp_chunks_mapped(a->sp->ch, NULL));
}

/* The heap's cache policy on a slow path. */
void fp_alloc_trim_policy(fp_alloc *a)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    fp_heap_trim_policy(a->heap);
    fp_alloc_log_released(a, t, "decay");
}

/* ------------------------------------------------------------ thread caches */

void fp_alloc_init(fp_alloc *a, fp_heap *heap, fp_retire *retire, fp_usage *use, int thread_cache)
{
    a->heap = heap;
    a->retire = retire;
    a->use = use;
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

void fp_alloc_set_trace(fp_alloc *a, struct fp_trace *trace) { a->trace = trace; }


void fp_alloc_class_counts(const fp_alloc *a, unsigned cls, uint64_t *allocs, uint64_t *frees)
{
    fp_space_assert_locked(a->sp);
    const fp_class_counts *n = &a->counts[cls];
    uint64_t al = fp_counter(&n->allocs) + fp_counter(&n->tc_allocs);
    uint64_t fr = fp_counter(&n->frees) + fp_counter(&n->tc_frees);
    for (const fp_tcache *tc = a->tcaches; tc; tc = tc->next) {
        al += fp_counter(&tc->allocs[cls]);
        fr += fp_counter(&tc->frees[cls]);
    }
    *allocs = al;
    *frees = fr;
}

static void tcache_flush(fp_alloc *a, fp_tcache *tc)
{
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        fp_bin *b = &tc->bins[c];
        if (b->n) {
            fp_usage_slab_back(a->use, b->n * fp_heap_block_size(a->heap, c));
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
static void tcache_close(fp_alloc *a, fp_tcache *tc)
{
    tcache_flush(a, tc);
    fp_lock(&a->sp->lock);
    FP_LIST_REMOVE(&a->tcaches, tc, next, prev);
    fp_unlock(&a->sp->lock);
    tcache_free(a, tc);
    fp_alloc_trim_policy(a);
}

static void thread_exit(void *arg)
{
    (void)arg;
    fp_lock(&registry_lock);
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        fp_tls_slot *s = &fp_tls_slots[i];
        if (s->owner && registry_has(s))
            tcache_close(s->owner, s->tc);
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
        if (slot_is(&fp_tls_slots[i], a))
            memset(&fp_tls_slots[i], 0, sizeof fp_tls_slots[i]);
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

fp_tcache *fp_tcache_get(fp_alloc *a)
{
    if (!a->thread_cache)
        return NULL;
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        if (slot_is(&fp_tls_slots[i], a)) {
            fp_tls_slot s = fp_tls_slots[i];
            memmove(&fp_tls_slots[1], &fp_tls_slots[0], (size_t)i * sizeof s);
            fp_tls_slots[0] = s;
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
    fp_tls_slot *last = &fp_tls_slots[FP_TLS_SLOTS - 1];
    if (last->owner) {
        fp_lock(&registry_lock);
        if (registry_has(last))
            tcache_close(last->owner, last->tc);
        fp_unlock(&registry_lock);
    }
    memmove(&fp_tls_slots[1], &fp_tls_slots[0], (FP_TLS_SLOTS - 1) * sizeof fp_tls_slots[0]);
    fp_tls_slots[0] = (fp_tls_slot){a, a->id, tc};
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
        if (slot_is(&fp_tls_slots[i], a))
            tcache_flush(a, fp_tls_slots[i].tc);
}

int fp_tcache_mine(const fp_alloc *a, const fp_tcache *tc)
{
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&fp_tls_slots[i], a) && fp_tls_slots[i].tc == tc)
            return 1;
    return 0;
}

fabpool_status fabpool_thread_flush(fabpool_t *p)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_thread_flush: the pool is NULL");
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_is(&fp_tls_slots[i], a))
            tcache_flush(a, fp_tls_slots[i].tc);
    return FABPOOL_OK;
}
