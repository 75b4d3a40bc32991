/* tcache.c - the thread caches' life: the registry of live pools, a
 * thread's caches made on first use, flushed when a trim asks, closed when
 * the thread exits; and the heap's cache policy that their slow paths run
 * (alloc.h; the hit's pop and push are tcache.h's). */
#include "tcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "clock.h"
#include "counter.h"
#include "error.h"
#include "list.h"
#include "lock.h"
#include "trace.h"

_Thread_local fp_tls_hot fp_hot;
static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

/* Live pools, so that a thread that exits can tell whether the pool of a
 * slot still exists without touching it. */
static fp_lock_t registry_lock = FP_LOCK_INITIALIZER(FP_LOCK_REGISTRY, "registry");
static fp_tls_slot *registry;   /* .tc unused */
static size_t registry_n, registry_cap;
static _Atomic uint64_t next_pool_id = 1;
/* Hot keys (tcache.h): never 0 (a thread without one) nor FP_HOT_OFF. */
static _Atomic uint64_t next_hot_key = 1;

static void owner_sync_locked(fp_alloc *a);

/* Under the keys' lock, with the state read there: a rekey that read the state before a change (a sleep's bit,
 * set before its own rekey) stores its key before that change's rekey stores its own, never after it, so the
 * last key stored is what the last state says.  Unlocked, a trim's rekey that read the pool awake could store
 * a live key after the sleep's FP_HOT_OFF, and a thread's cache was hit while the pool slept. */
void fp_alloc_hot_rekey(fp_alloc *a)
{
    fp_lock(&a->key_lock);
    uint64_t k = FP_HOT_OFF;
    if (a->thread_cache && a->id && !a->trace && !(atomic_load(&a->flush_epoch) & FP_EPOCH_ASLEEP) &&
        !fp_device_forked(a->sp->ch))
        k = atomic_fetch_add(&next_hot_key, 1);
    /* after the epoch it follows: a thread that reads this key reads that epoch or a later one */
    atomic_store_explicit(&a->cache_key, k, memory_order_release);
    owner_sync_locked(a);
    fp_unlock(&a->key_lock);
}

static uint64_t hot_key_want(fp_alloc *a)
{
    /* a pool torn down before its retire queue was made has no owner stream; while the owner's frees are not
     * fenced (the mode ending), a cache may hold blocks the owner freed, so its fast path waits with the rest */
    return a->retire && (fp_retire_owned(a->retire) || fp_retire_unfenced(a->retire)) ? FP_HOT_OFF
                                                                                     : atomic_load(&a->cache_key);
}

/* Stored, then checked against the state again: the owner mode changes without the keys' lock, and a change
 * made after the check is followed by its own call, so the last store is what the last state says. */
static void owner_sync_locked(fp_alloc *a)
{
    uint64_t want = hot_key_want(a);
    if (atomic_load(&a->hot_key) == want)
        return;
    do
        atomic_store(&a->hot_key, want);
    while ((want = hot_key_want(a)) != atomic_load(&a->hot_key));
}

void fp_alloc_owner_sync(fp_alloc *a)
{
    /* the lock only where the key changes: a store made under it is not overtaken by one that read cache_key
     * before a rekey (a sleep's) and stores after it */
    if (atomic_load(&a->hot_key) == hot_key_want(a))
        return;
    fp_lock(&a->key_lock);
    owner_sync_locked(a);
    fp_unlock(&a->key_lock);
}

/* The calling thread's slots (NULL before its first cache). */
static fp_tls_slot *my_slots(void) { return fp_hot.th ? fp_hot.th->caches : NULL; }

/* Around a fork the registry is held, so that the child finds it whole: there every pool is marked forked
 * (device.h) and its keys turned off, so that no fast path hands out or takes back memory the child cannot use
 * (its CUDA context did not carry over) and every other call refuses, saying why, before it takes a lock that a
 * thread of the parent may have held at the fork (the child would wait for it for ever). */
static void fork_prepare(void) { fp_lock(&registry_lock); }
static void fork_parent(void) { fp_unlock(&registry_lock); }
static void fork_child(void)
{
    for (size_t i = 0; i < registry_n; i++) {
        fp_alloc *a = registry[i].owner;
        fp_device_set_forked(a->sp->ch);
        fp_lock_init(&a->key_lock, FP_LOCK_KEY, 0, "keys"); /* the child's only thread holds none */
        atomic_store(&a->cache_key, FP_HOT_OFF);
        atomic_store(&a->hot_key, FP_HOT_OFF);
    }
    fp_unlock(&registry_lock);
}
static void fork_hooks(void)
{
    fp_trace_fork_hooks(); /* first: its prepare hook then runs after this one's (the registry before the traces) */
    (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int fp_registry_add(fp_alloc *a)
{
    static pthread_once_t hooked = PTHREAD_ONCE_INIT;
    (void)pthread_once(&hooked, fork_hooks);
    fp_lock(&registry_lock);
    if (FP_ARRAY_RESERVE(NULL, registry, registry_n, registry_cap, registry_n + 1, 8) != 0) {
        fp_unlock(&registry_lock);
        return -1;
    }
    a->id = atomic_fetch_add(&next_pool_id, 1);
    registry[registry_n++] = (fp_tls_slot){a, a->id, NULL};
    fp_unlock(&registry_lock);
    fp_alloc_hot_rekey(a);
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

unsigned fp_tcache_refill(fp_alloc *a, fp_tcache *tc, unsigned cls, unsigned want, fabpool_status *st)
{
    fp_item got[FP_TC_CAP_MAX];
    if (want > FP_TC_CAP_MAX)
        want = FP_TC_CAP_MAX;
    unsigned n = fp_class_take(a->heap, cls, got, want, 0, st);
    for (unsigned i = 0; i < n; i++)
        tc->top[cls][i] = (fp_titem){got[i].ptr, slab_flag(got[i].span, got[i].ptr)};
    tc->top[cls] += n;
    return n;
}

void fp_tcache_give(fp_alloc *a, unsigned cls, const fp_titem *t, unsigned n)
{
    fp_item out[FP_TC_CAP_MAX];
    while (n) {
        unsigned k = n < FP_TC_CAP_MAX ? n : FP_TC_CAP_MAX;
        for (unsigned i = 0; i < k; i++)
            out[i] = (fp_item){t[i].ptr, fp_map_get(&a->map, t[i].ptr)};
        fp_class_give(a->heap, cls, out, k, 0);
        t += k;
        n -= k;
    }
}

/* The medium blocks' share of the thread caches follows the pool's blocks above slab_max, and their decay:
 * once a period every cache is asked to give them back at its next call (a flush, as a trim asks). */
void fp_alloc_medium_policy(fp_alloc *a)
{
    if (!a->mc_span)
        return;
    uint64_t b = atomic_load_explicit(&a->heap->large_in_use_bytes, memory_order_relaxed) / FP_MC_SHARE;
    b = b < FP_MC_BUDGET_MIN ? FP_MC_BUDGET_MIN : b > FP_MC_BUDGET_MAX ? FP_MC_BUDGET_MAX : b;
    if (atomic_load_explicit(&a->mc_budget, memory_order_relaxed) != b)
        atomic_store_explicit(&a->mc_budget, b, memory_order_relaxed);
    uint64_t t = fp_coarse_ns(), last = atomic_load_explicit(&a->mc_decay_ns, memory_order_relaxed);
    if (t - last >= a->heap->decay_ms * 1000000ull &&
        atomic_compare_exchange_strong_explicit(&a->mc_decay_ns, &last, t, memory_order_relaxed,
                                                memory_order_relaxed)) {
        atomic_fetch_add(&a->flush_epoch, 1);
        fp_alloc_hot_rekey(a);
    }
}

void fp_tcache_medium_flush(fp_alloc *a, fp_tcache *tc, int locked)
{
    if (!atomic_load_explicit(&tc->mbytes, memory_order_relaxed))
        return;
    if (!locked)
        fp_lock(&a->sp->lock);
    for (unsigned w = 0; w < sizeof tc->mmask / sizeof tc->mmask[0]; w++)
        for (uint64_t m = tc->mmask[w]; m; m &= m - 1) {
            unsigned c = w * 64 + (unsigned)__builtin_ctzll(m);
            for (unsigned i = 0; i < tc->mn[c]; i++)
                fp_large_release_cached_locked(a->heap, tc->mitems[c][i].ptr);
            tc->mn[c] = 0;
        }
    memset(tc->mmask, 0, sizeof tc->mmask);
    for (unsigned i = 0; i < tc->mdn; i++)
        fp_large_release_cached_locked(a->heap, fp_tcache_defer_addr(tc->mdef[i]));
    tc->mdn = 0;
    tc->mdbytes = 0;
    atomic_store_explicit(&tc->mbytes, 0, memory_order_relaxed);
    int due = fp_large_policy_due(a->heap);
    if (!locked)
        fp_unlock(&a->sp->lock);
    if (due && !locked)
        fp_alloc_trim_policy(a);
}

/* The heap's cache policy on a slow path. */
void fp_alloc_trim_policy(fp_alloc *a)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    fp_heap_trim_policy(a->heap);
    fp_alloc_log_released(a, t, "decay");
    fp_alloc_medium_policy(a);
}

/* ------------------------------------------------------------ thread caches */

void fp_alloc_init(fp_alloc *a, fp_heap *heap, fp_retire *retire, fp_usage *use, int thread_cache)
{
    a->heap = heap;
    a->retire = retire;
    a->use = use;
    fp_lock_init(&a->key_lock, FP_LOCK_KEY, 0, "keys");
    a->cache_key = FP_HOT_OFF;   /* until the registry gives the pool its id */
    a->hot_key = FP_HOT_OFF;
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
        a->tc_cap[c] = (uint32_t)(cap > FP_TC_CAP_MAX ? FP_TC_CAP_MAX : cap < 2 ? 2 : cap);
        bytes += a->tc_cap[c] * sizeof(fp_titem);
    }
    a->tcache_bytes = bytes;
    /* medium blocks: sizes above slab_max (from a multiple of the arenas' quantum) up to FP_MC_MAX, where the
     * pool keeps free memory at all (decay_ms 0 gives it back at once) and their states can be kept */
    uint64_t lo = (a->slab_max + FP_BLOCK_QUANTUM - 1) & ~(FP_BLOCK_QUANTUM - 1);
    uint64_t hi = FP_MC_MAX < heap->medium_max ? FP_MC_MAX : heap->medium_max;
    if (hi > lo + FP_MSTATE_MAX * FP_BLOCK_QUANTUM)
        hi = lo + FP_MSTATE_MAX * FP_BLOCK_QUANTUM;
    fp_arena *ma = &heap->arenas[FP_ARENA_MEDIUM];
    if (thread_cache && heap->decay_ms && hi > lo && fp_arena_mstate_init(ma, lo, hi) == 0) {
        a->mc_lo = lo;
        a->mc_span = hi - lo;
        a->mc_sentinel = &heap->sentinels[FP_ARENA_MEDIUM];
        a->ms = ma->ms;
        a->mc_budget = FP_MC_BUDGET_MIN;
        a->mc_decay_ns = fp_coarse_ns();
        for (unsigned c = 1; c <= FP_MSTATE_MAX; c++) {
            unsigned k = fp_class_of(lo + ((uint64_t)c << FP_PIECE_UNIT_SHIFT));
            a->mc_class[c] = (uint8_t)(k < FP_NCLASS ? k : FP_NCLASS - 1);
        }
    }
    /* the table holds while every class boundary up to its end is a multiple of 64 bytes */
    uint64_t end = a->slab_max < FP_CLS_TABLE * 64 ? a->slab_max / 64 * 64 : FP_CLS_TABLE * 64;
    _Static_assert(FP_CLS_TABLE * 64 <= UINT32_MAX, "the table's reach");
    a->cls_table_max = end;
    for (uint64_t q = 0; q < end / 64; q++) {
        unsigned c = fp_class_of(q * 64 + 1);
        if (c != fp_class_of(q * 64 + 64) || c > UINT8_MAX) {
            a->cls_table_max = 0;
            break;
        }
        a->cls_of_q[q] = (uint8_t)c;
    }
}

void fp_alloc_set_trace(fp_alloc *a, struct fp_trace *trace)
{
    a->trace = trace;
    fp_alloc_hot_rekey(a);
}

void fp_alloc_set_buffers(fp_alloc *a, struct fp_buffers *bufs) { a->bufs = bufs; }


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

/* The cache's blocks back to the pool; without the pool lock held, the heap's cache policy (cache_limit, decay)
 * then runs as on a free without a cache, so that the slabs the blocks emptied go back where it says. */
static void tcache_flush(fp_alloc *a, fp_tcache *tc, int locked)
{
    fp_tcache_medium_flush(a, tc, locked);
    int gave = 0;
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        if (tc->top[c] != tc->lo[c]) {
            fp_usage_slab_back(a->use, fp_bin_n(tc, c) * fp_heap_block_size(a->heap, c));
            fp_tcache_give(a, c, tc->lo[c], fp_bin_n(tc, c));
            tc->top[c] = tc->lo[c];
            gave = 1;
        }
    }
    tc->epoch = atomic_load(&a->flush_epoch) & ~FP_EPOCH_ASLEEP;
    if (gave && !locked)
        fp_alloc_trim_policy(a);
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
    tcache_flush(a, tc, 0);
    fp_lock(&a->sp->lock);
    FP_LIST_REMOVE(&a->tcaches, tc, next, prev);
    fp_unlock(&a->sp->lock);
    tcache_free(a, tc);
    fp_alloc_trim_policy(a);
}

/* Whether the cache of slot s may be closed: its pool is alive (registry lock held) and was not left behind by
 * a fork (in the child its locks may be held for ever, and its memory is of no use: the cache stays as it is). */
static int slot_closable(const fp_tls_slot *s)
{
    return s->owner && registry_has(s) && !fp_device_forked(s->owner->sp->ch);
}

static void thread_exit(void *arg)
{
    (void)arg;
    fp_thread *th = fp_hot.th;
    fp_hot = (fp_tls_hot){0, NULL, NULL, fp_hot.align, fp_hot.tick};
    if (!th)
        return;
    fp_lock(&registry_lock);
    for (int i = 0; i < FP_TLS_SLOTS; i++)
        if (slot_closable(&th->caches[i]))
            tcache_close(th->caches[i].owner, th->caches[i].tc);
    fp_unlock(&registry_lock);
    free(th);
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
    fp_tls_slot *sl = my_slots();
    for (int i = 0; sl && i < FP_TLS_SLOTS; i++)
        if (slot_is(&sl[i], a))
            memset(&sl[i], 0, sizeof sl[i]);
}

static fp_tcache *tcache_new(fp_alloc *a)
{
    size_t bytes = sizeof(fp_tcache) + a->tcache_bytes;
    fp_tcache *tc = fp_meta_alloc(a->sp->meta, bytes);
    if (!tc)
        return NULL;
    memset(tc, 0, sizeof *tc);
    tc->owner = a;
    tc->bytes = bytes;
    fp_titem *items = (fp_titem *)(tc + 1);
    for (unsigned c = 0; c < a->n_slab_classes; c++) {
        tc->top[c] = tc->lo[c] = items;
        tc->hi[c] = items += a->tc_cap[c];
    }
    tc->epoch = atomic_load(&a->flush_epoch) & ~FP_EPOCH_ASLEEP;
    fp_lock(&a->sp->lock);
    FP_LIST_PUSH(&a->tcaches, tc, next, prev);
    fp_unlock(&a->sp->lock);
    return tc;
}

/* tc, checked against a's epoch now, becomes the hot slot's with the key a held before the check (tcache.h). */
static void hot_install(fp_tcache *tc, uint64_t key)
{
    fp_hot.tc = tc;
    fp_hot.key = key == FP_HOT_OFF ? 0 : key;
}

/* The thread's record of its caches, made with its first cache (NULL without host memory). */
static fp_thread *my_thread(void)
{
    if (fp_hot.th)
        return fp_hot.th;
    pthread_once(&tls_key_once, make_key);
    fp_thread *th = calloc(1, sizeof *th);
    if (!th)
        return NULL;
    if (pthread_setspecific(tls_key, th) != 0) {   /* without it the thread's exit would never close them */
        free(th);
        return NULL;
    }
    fp_hot.th = th;
    return th;
}

fp_tcache *fp_tcache_get(fp_alloc *a)
{
    if (!a->thread_cache)
        return NULL;
    uint64_t key = atomic_load_explicit(&a->cache_key, memory_order_acquire);   /* before the epoch */
    fp_thread *th = my_thread();
    if (!th)
        return NULL;
    fp_tls_slot *sl = th->caches;
    for (int i = 0; i < FP_TLS_SLOTS; i++) {
        if (slot_is(&sl[i], a)) {
            fp_tls_slot s = sl[i];
            memmove(&sl[1], &sl[0], (size_t)i * sizeof s);
            sl[0] = s;
            if (s.tc->epoch != atomic_load(&a->flush_epoch))
                tcache_flush(a, s.tc, 0);
            hot_install(s.tc, key);
            return s.tc;
        }
    }
    fp_tcache *tc = tcache_new(a);
    if (!tc)
        return NULL;
    fp_tls_slot *last = &sl[FP_TLS_SLOTS - 1];
    if (last->owner) {
        fp_lock(&registry_lock);
        if (slot_closable(last))
            tcache_close(last->owner, last->tc);
        fp_unlock(&registry_lock);
    }
    memmove(&sl[1], &sl[0], (FP_TLS_SLOTS - 1) * sizeof sl[0]);
    sl[0] = (fp_tls_slot){a, a->id, tc};
    hot_install(tc, key);
    return tc;
}

void fp_alloc_set_asleep(fp_alloc *a, int asleep)
{
    if (asleep) {
        atomic_fetch_or(&a->flush_epoch, FP_EPOCH_ASLEEP);
    } else {
        atomic_fetch_and(&a->flush_epoch, ~FP_EPOCH_ASLEEP);
        atomic_fetch_add(&a->flush_epoch, 1);
    }
    fp_alloc_hot_rekey(a);
}

void fp_alloc_flush_all(fp_alloc *a)
{
    /* other threads flush their caches at their next call */
    atomic_fetch_add(&a->flush_epoch, 1);
    fp_alloc_hot_rekey(a);
    fp_tls_slot *sl = my_slots();
    for (int i = 0; sl && i < FP_TLS_SLOTS; i++)
        if (slot_is(&sl[i], a))
            tcache_flush(a, sl[i].tc, 0);
}

int fp_tcache_mine(const fp_alloc *a, const fp_tcache *tc)
{
    const fp_tls_slot *sl = my_slots();
    for (int i = 0; sl && i < FP_TLS_SLOTS; i++)
        if (slot_is(&sl[i], a) && sl[i].tc == tc)
            return 1;
    return 0;
}

fabpool_status fabpool_thread_flush(fabpool_t *p)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_thread_flush: the pool is NULL");
    if (fp_device_forked(a->sp->ch))
        return fp_device_forked_error(a->sp->ch, "fabpool_thread_flush");
    fp_tls_slot *sl = my_slots();
    for (int i = 0; sl && i < FP_TLS_SLOTS; i++)
        if (slot_is(&sl[i], a))
            tcache_flush(a, sl[i].tc, 0);
    return FABPOOL_OK;
}

void fp_alloc_thread_flush_locked(fp_alloc *a)
{
    fp_tls_slot *sl = my_slots();
    for (int i = 0; sl && i < FP_TLS_SLOTS; i++)
        if (slot_is(&sl[i], a))
            tcache_flush(a, sl[i].tc, 1);
}

uint64_t fp_alloc_align_next(uint64_t align)
{
    uint64_t was = fp_hot.align;
    fp_hot.align = align > FP_BLOCK_QUANTUM ? align : 0;
    return was;
}
