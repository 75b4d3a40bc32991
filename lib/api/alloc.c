/* alloc.c - fabpool_alloc / fabpool_free: the hot path through the calling thread's cache (tcache.h, inline), the
 * slow path to the heap's classes and large blocks, and the free of a block with recorded streams (alloc.h). */
#include "alloc.h"

#include <string.h>

#include "error.h"
#include "release.h"
#include "tcache_medium.h"
#include "trace.h"

/* The medium blocks' policy (tcache.c) at every 16th block above slab_max
 * the thread gives out or frees. */
static void medium_tick(fp_alloc *a)
{
    if (FP_UNLIKELY((++fp_hot.tick & 15) == 0))
        fp_alloc_medium_policy(a);
}

/* A large block: the heap's own calls, which end with its cache policy (and, for a miss, the trade). */
static inline __attribute__((always_inline)) fabpool_status large_alloc(fp_alloc *a, size_t size, void **out)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    medium_tick(a);
    fabpool_status st = fp_large_alloc(a->heap, size, fp_hot.align, out);
    if (st == FABPOOL_OK)
        fp_usage_raise(a->use);
    if (FP_UNLIKELY(t.on))
        fp_alloc_log_released(a, t, "decay or large_slack");
    return st;
}

static fabpool_status large_free(fp_alloc *a, const fp_span *s, uint64_t addr, const char *fn)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    medium_tick(a);
    fabpool_status st = fp_large_free(a->heap, s, addr, fn);
    if (FP_UNLIKELY(t.on))
        fp_alloc_log_released(a, t, "decay");
    return st;
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
    if (size == 0)   /* cudaMalloc's answer: success and NULL, which fabpool_free takes back */
        return FABPOOL_OK;
    if (FP_UNLIKELY(fp_chunks_asleep(a->sp->ch)))
        return fp_chunk_asleep_error("fabpool_alloc");
    if (size > a->slab_max)
        return large_alloc(a, size, out);

    unsigned cls = fp_class_of(size);
    fabpool_status st = FABPOOL_OK;
    fp_tcache *tc = fp_tcache_get(a);
    if (tc && fp_bin_cap(tc, cls)) {
        if (tc->top[cls] == tc->lo[cls]) {
            unsigned want = fp_bin_cap(tc, cls) / 2 ? fp_bin_cap(tc, cls) / 2 : 1;
            if (!fp_tcache_refill(a, tc, cls, want, &st))
                return st;
            fp_usage_slab_out(a->use, fp_bin_n(tc, cls) * fp_heap_block_size(a->heap, cls));
            fp_alloc_trim_policy(a);   /* the decay's clock, on a slow path */
        }
        tcache_pop(tc, cls, out);   /* the fast path's pop, on a bin that now holds blocks */
        return FABPOOL_OK;
    }
    fp_item it;
    if (!fp_class_take(a->heap, cls, &it, 1, 1, &st))   /* its free flag cleared under the class lock */
        return st;
    fp_usage_slab_out(a->use, fp_heap_block_size(a->heap, cls));
    fp_alloc_trim_policy(a);   /* the decay's clock, on a slow path */
    atomic_fetch_add_explicit(&a->counts[cls].allocs, 1, memory_order_relaxed);
    *out = (void *)(uintptr_t)it.ptr;
    return FABPOOL_OK;
}

/* What follows an attempt that found the device out of memory (st): a wait for the blocks freed on streams and one
 * more try while some are pending, the buffers released and kept given back and one more try while some are kept,
 * and the log's warning if it failed still. */
static __attribute__((noinline)) fabpool_status alloc_oom(fp_alloc *a, size_t size, void **out, fabpool_status st)
{
    fp_msg_hold h; /* a try that works leaves the message as it was before the first */
    fp_error_hold_retry(&h);
    fp_tcache *tc = fp_hot.key && fp_hot.tc && fp_hot.tc->owner == a ? fp_hot.tc : NULL;
    if (st == FABPOOL_ERR_OUT_OF_MEMORY && tc && atomic_load_explicit(&tc->mbytes, memory_order_relaxed)) {
        /* the medium blocks this thread's cache holds go back, and every other cache's at its next call;
         * then one more try */
        FP_LOG_CH(FP_LOG_INFO, a->sp->ch, "out of memory for %zu bytes: the thread caches' medium blocks go back "
                  "to the pool, then one more try", size);
        fp_alloc_flush_all(a);
        st = alloc_slow_once(a, size, out);
    }
    if (st == FABPOOL_ERR_OUT_OF_MEMORY && fp_pending_any(a->retire)) {
        FP_LOG_CH(FP_LOG_INFO, a->sp->ch, "out of memory for %zu bytes: waiting for the %llu bytes freed on streams, "
                  "then one more try", size, (unsigned long long)atomic_load(&a->retire->pending_bytes));
        fp_heap_count_oom_retry(a->heap);
        fp_alloc_drain(a, 1, 0);
        st = alloc_slow_once(a, size, out);
    }
    if (st == FABPOOL_ERR_OUT_OF_MEMORY && fp_buffers_give_back_kept(a->bufs)) {
        fp_heap_count_oom_retry(a->heap);
        st = alloc_slow_once(a, size, out);
    }
    if (fp_error_unhold(&h, st) == FABPOOL_ERR_OUT_OF_MEMORY)
        FP_LOG_CH(FP_LOG_WARN, a->sp->ch, "an allocation of %zu bytes failed: %s", size, fabpool_last_error());
    return st;
}

/* A failure of fabpool_alloc's own: a message that does not begin with the call's name (the layers below
 * speak of chunks) names it and the size it was asked for.  The stream pair and fabpool_alloc_aligned, which
 * come through here, add their own. */
static __attribute__((noinline, cold)) fabpool_status alloc_failed(fabpool_status st, size_t size)
{
    if (!tls_polled && !fp_hot.align && strncmp(fabpool_last_error(), "fabpool_alloc", 13) != 0)
        fp_error_append(" (fabpool_alloc of %zu bytes)", size);
    return st;
}

/* The slow path: blocks freed on streams whose work is done go back to the pool first (an event query per stream,
 * only while some are pending), and an allocation that finds the device out of memory tries again (alloc_oom). */
static __attribute__((noinline)) fabpool_status alloc_slow(fp_alloc *a, size_t size, void **out)
{
    fabpool_status st;
    fp_tcache *held = a ? tcache_hot(a) : NULL;
    if (held && held->mdn)   /* the blocks its cache holds back go first: every fit sees them merged */
        fp_tcache_defer_flush(a, held);
    if (a && out && size > a->slab_max && !fp_pending_any(a->retire) && !fp_chunks_asleep(a->sp->ch)) {
        /* a block above slab_max while nothing waits on a stream and the pool is awake (the common case):
         * alloc_slow_once's work without its checks, so that a medium block pays for the arena and little
         * else */
        *out = NULL;
        if (size - a->mc_lo - 1 < a->mc_span && fp_hot.key != atomic_load_explicit(&a->hot_key, memory_order_relaxed))
            fp_tcache_get(a);   /* the thread's cache for the sizes it may hold: its fast path's key installed */
        st = large_alloc(a, size, out);
    } else {
        if (a && fp_pending_any(a->retire) && !tls_polled)
            fp_alloc_drain(a, 0, 0);
        st = alloc_slow_once(a, size, out);
    }
    return FP_UNLIKELY(st == FABPOOL_ERR_OUT_OF_MEMORY) ? alloc_oom(a, size, out, st) : st;
}

/* An allocation with a trace: recorded with its status and trace_flags (FABPOOL_TRACE_R_APP for the
 * application's fabpool_alloc, 0 for the stream pair's own). */
static fabpool_status alloc_traced(fp_alloc *a, size_t size, void **out, unsigned trace_flags)
{
    fabpool_status st = alloc_slow(a, size, out);
    if (size == 0 && st == FABPOOL_OK)   /* nothing was allocated: nothing for a replay to do */
        return st;
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

/* fabpool_alloc past its fast path. */
static __attribute__((noinline)) fabpool_status alloc_entry(fp_alloc *a, size_t size, void **out)
{
    if (FP_UNLIKELY(a && fp_device_forked(a->sp->ch))) {
        if (out)
            *out = NULL;
        return fp_device_forked_error(a->sp->ch, "fabpool_alloc");
    }
    if (a)   /* the owner mode may have ended elsewhere (stream.c): the fast path's key follows */
        fp_alloc_owner_sync(a);
    /* Blocks the owner stream freed may still be in use by its queued work:
     * the first allocation that is not the owner's waits for that work and
     * ends the owner mode, and while it waits every other one waits too
     * (retire.h); a call that will be refused (asleep, bad arguments) ends
     * nothing, and one refused after it puts the owner mode back on, its
     * fence done. */
    void *was = NULL;
    int disowned = 0;
    if (FP_UNLIKELY(a && (fp_retire_owned(a->retire) || fp_retire_unfenced(a->retire))) && out && size &&
        !fp_chunks_asleep(a->sp->ch)) {
        was = a->retire->owner;
        fabpool_status st = fp_retire_owner_leave(a->retire, &disowned);
        fp_alloc_owner_sync(a);
        if (st != FABPOOL_OK) {
            *out = NULL;
            fp_error_append(" (fabpool_alloc: waiting for the stream-ordered frees of stream %p)", a->retire->owner);
            return st;
        }
    }
    fabpool_status st = FP_UNLIKELY(a && a->trace) ? alloc_traced(a, size, out, tls_polled ? 0u : FABPOOL_TRACE_R_APP)
                                                   : alloc_any(a, size, out);
    if (FP_UNLIKELY(disowned && st != FABPOOL_OK)) {
        fp_retire_owner_reown(a->retire, was);
        fp_alloc_owner_sync(a);
    }
    return FP_UNLIKELY(st != FABPOOL_OK) ? alloc_failed(st, size) : st;
}

/* What fp_medium_alloc left to its caller (rest: FP_MEDIUM_POLICY, FP_MEDIUM_MISS), its releases logged. */
static __attribute__((noinline)) fabpool_status medium_rest(fp_alloc *a, uint64_t n, void **out, unsigned rest,
                                                            fabpool_status st)
{
    fp_chunk_tally t = fp_chunk_tally_begin();
    if (rest & FP_MEDIUM_POLICY)
        fp_heap_trim_policy(a->heap);
    if (rest & FP_MEDIUM_MISS)
        st = fp_large_alloc(a->heap, n, FP_BLOCK_QUANTUM, out);
    if (FP_UNLIKELY(t.on))
        fp_alloc_log_released(a, t, "decay or large_slack");
    return st;
}

/* A medium block the thread's cache does not hold, the fast path's key matched (no trace, the pool awake, no owner
 * mode: alloc_entry's checks pass; tc: the thread's cache, passed: GCC's noipa keeps it from reading the hot slot
 * again through the TLS descriptor; clang, which has no noipa, gets noinline): from the arena, after the blocks
 * freed on streams if some wait.  The medium blocks' policy runs at every 16th of these misses, counted by the
 * cache's window (medium_tick's cadence, with no counter of its own to keep). */
#if defined(__clang__)
#define FP_NOIPA __attribute__((noinline))
#else
#define FP_NOIPA __attribute__((noipa))
#endif
static FP_NOIPA fabpool_status alloc_medium_miss(fp_alloc *a, fp_tcache *tc, size_t size, void **out)
{
    if (FP_UNLIKELY(++tc->mmiss == FP_MC_WINDOW)) {
        /* the end of a window: a cache whose medium blocks seldom came back takes none for a while */
        if (tc->moff)
            tc->moff--;
        else if (tc->mhits < FP_MC_WINDOW / 4) {
            tc->moff = FP_MC_REST;
            fp_tcache_medium_flush(a, tc, 0);
        }
        tc->mhits = tc->mmiss = 0;
    }
    if (FP_UNLIKELY(fp_pending_any(a->retire)))
        return alloc_slow(a, size, out);
    if (FP_UNLIKELY((tc->mmiss & 15) == 0))
        fp_alloc_medium_policy(a);
    /* the blocks the cache holds back go to the arena under the same take of the lock, before the fit */
    unsigned nd = tc->mdn, rest = 0;
    uint64_t n = (size + FP_BLOCK_QUANTUM - 1) & ~(FP_BLOCK_QUANTUM - 1), back = tc->mdbytes;
    fabpool_status st = fp_medium_alloc(a->heap, n, tc->mdflag, nd, out, &rest);
    if (nd) {
        tc->mdn = 0;
        atomic_store_explicit(&tc->mbytes, atomic_load_explicit(&tc->mbytes, memory_order_relaxed) - back,
                              memory_order_relaxed);
        tc->mdbytes = 0;
    }
    if (FP_UNLIKELY(rest))
        st = medium_rest(a, n, out, rest, st);
    if (FP_LIKELY(st == FABPOOL_OK) && (n > back || rest))   /* the bytes in use rose: the mark follows */
        fp_usage_raise(a->use);
    if (FP_UNLIKELY(st != FABPOOL_OK))
        st = alloc_failed(st == FABPOOL_ERR_OUT_OF_MEMORY ? alloc_oom(a, size, out, st) : st, size);
    return st;
}

/* fabpool_alloc past its fast path for a size above its table's (a and out
 * not NULL): a medium block (above slab_max, up to FP_MC_MAX) of the size's
 * code from the thread's cache where it holds one, with the fast path's key
 * (so no trace, the pool awake, no owner mode) and no alignment asked; else
 * alloc_entry. */
static __attribute__((noinline)) fabpool_status alloc_miss(fp_alloc *a, size_t size, void **out)
{
    uint64_t k = size - a->mc_lo - 1;   /* a and out not NULL: fabpool_alloc's test */
    fp_tls_hot *h = &fp_hot;
    if (FP_LIKELY(k < a->mc_span && h->key == atomic_load_explicit(&a->hot_key, memory_order_relaxed) &&
                  !h->align)) {
        size_t c = (k >> FP_PIECE_UNIT_SHIFT) + 1;
        fp_tcache *tc = h->tc;
        unsigned n = tc->mn[c];
        if (FP_LIKELY(n)) {
            fp_titem it = tc->mitems[c][--n];
            tc->mn[c] = (uint8_t)n;
            atomic_store_explicit(&tc->mbytes, atomic_load_explicit(&tc->mbytes, memory_order_relaxed) -
                                  (a->mc_lo + (c << FP_PIECE_UNIT_SHIFT)), memory_order_relaxed);
            atomic_store_explicit(it.flag, (uint8_t)c, memory_order_relaxed);
            tcache_count(&tc->allocs[a->mc_class[c]]);
            tc->mhits++;
            *out = (void *)(uintptr_t)it.ptr;
            return FABPOOL_OK;
        }
        return alloc_medium_miss(a, tc, size, out);
    }
    return alloc_entry(a, size, out);
}

/* The fast path: a block of a slab class from the calling thread's cache,
 * with one access to the thread's storage, the class and a pop inline, and
 * nothing else.  The hot slot holds the pool's key only while the pool has
 * no trace, is awake and asked no flush since the thread checked its cache
 * (tcache.h), and its hot_key only while the stream pair's owner mode does
 * not hold.  size - 1 < cls_table_max: 1..cls_table_max, at most slab_max
 * (size 0, a pool without the table and sizes above 4 KiB go to the slow
 * path, whose alloc_any pops from the cache all the same). */
fabpool_status fabpool_alloc(fabpool_t *p, size_t size, void **out)
{
    fp_alloc *a = fp_alloc_of(p);
    if (FP_LIKELY(a && out)) {
        if (FP_UNLIKELY(size - 1 >= a->cls_table_max))
            return alloc_miss(a, size, out);
        const fp_tls_hot *h = &fp_hot;
        if (FP_LIKELY(h->key == atomic_load_explicit(&a->hot_key, memory_order_relaxed))) {
            size_t cls = a->cls_of_q[(size - 1) >> 6];
            fp_tcache *tc = h->tc;
            fp_titem *top = tc->top[cls];
            if (FP_LIKELY(top != tc->lo[cls])) {
                fp_titem it = *--top;
                tc->top[cls] = top;
                atomic_store_explicit(it.flag, 0, memory_order_relaxed);
                tcache_count(&tc->allocs[cls]);
                *out = (void *)(uintptr_t)it.ptr;
                return FABPOOL_OK;
            }
        }
    }
    return alloc_entry(a, size, out);
}

/* Block addr of slab s (index idx) is free: into the thread's cache, made
 * or flushed as needed, or without one to its slab, its free flag set under
 * the class lock (a flag is set outside a lock only by a thread whose cache
 * the pool lists: fabpool_check, check.c). */
static fabpool_status free_slab_slow(fp_alloc *a, fp_span *s, uint64_t addr, uint32_t idx)
{
    unsigned cls = s->cls;
    fp_tcache *tc = fp_tcache_get(a);
    if (tc && fp_bin_cap(tc, cls)) {
        if (tc->top[cls] == tc->hi[cls]) {
            /* give back the older half */
            unsigned n = fp_bin_n(tc, cls), half = n / 2 ? n / 2 : 1;
            fp_usage_slab_back(a->use, half * fp_heap_block_size(a->heap, cls));
            fp_tcache_give(a, cls, tc->lo[cls], half);
            memmove(tc->lo[cls], tc->lo[cls] + half, (n - half) * sizeof *tc->lo[cls]);
            tc->top[cls] -= half;
        }
        tcache_push(tc, s, addr);   /* the fast path's push, on a bin that now has room */
        atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_FREE, memory_order_relaxed);
        fp_alloc_trim_policy(a);
        return FABPOOL_OK;
    }
    fp_item it = {addr, s};
    fp_usage_slab_back(a->use, fp_heap_block_size(a->heap, cls));
    fp_class_give(a->heap, cls, &it, 1, 1);
    atomic_fetch_add_explicit(&a->counts[cls].frees, 1, memory_order_relaxed);
    fp_alloc_trim_policy(a);
    return FABPOOL_OK;
}

/* The frees off the hot path, apart so that it stays as it is: a large
 * block while some block has recorded streams (with recorded streams of
 * its own it waits for them) ... */
static __attribute__((noinline)) fabpool_status free_large_used(fp_alloc *a, fp_span *s, uint64_t addr,
                                                                const char *fn, int on_stream, void *stream,
                                                                int *queued)
{
    int q = 0;
    fabpool_status st;
    if ((st = fp_alloc_free_recorded(a, s, addr, fn, on_stream, stream, 1, &q)) != FABPOOL_OK || q) {
        if (queued)
            *queued = q;
        return st;
    }
    return large_free(a, s, addr, fn);
}

/* ... and a slab block whose flag f is not FP_FREEFLAG_USED: a double free,
 * or a block with recorded streams, which waits for them. */
static __attribute__((noinline)) fabpool_status free_slab_flagged(fp_alloc *a, fp_span *s, uint64_t addr,
                                                                  const char *fn, uint8_t f, int on_stream,
                                                                  void *stream, int *queued)
{
    if (f != FP_FREEFLAG_RECORDED)
        return fp_alloc_already_free(fn, addr, (uint64_t)s->obj_q << FP_QUANTUM_SHIFT, f);
    int q = 0;
    fabpool_status st = fp_alloc_free_recorded(a, s, addr, fn, on_stream, stream, 1, &q);
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
        return large_free(a, s, addr, fn);
    }
    uint32_t idx;
    if (FP_UNLIKELY(!fp_slab_index(s, addr, &idx)))
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "%s(%p): an interior pointer into a slab of %llu-byte blocks; free the pointer "
                        "fabpool_alloc returned",
                        fn, (void *)(uintptr_t)addr, (unsigned long long)((uint64_t)s->obj_q << FP_QUANTUM_SHIFT));
    /* A double free is caught by the block's flag.  Two threads freeing the
     * same block at the same instant may both pass: that race is the
     * caller's bug (fabpool.h says so), and a locked exchange here would add
     * about a quarter to the hot pair. */
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

/* fabpool_free's work; trace_flags: FABPOOL_TRACE_R_APP for the application's call, 0 for the pool's own
 * (a block freed on a stream, given back once its work is done). */
static inline fabpool_status free_any(fp_alloc *a, void *ptr, unsigned trace_flags)
{
    if (FP_UNLIKELY(!ptr))   /* what fabpool_alloc gives for size 0: free(NULL) and cudaFree(NULL) do nothing */
        return FABPOOL_OK;
    /* before the free: no reuse of ptr can precede it in the trace */
    FP_TRACE_F(a->trace, trace_flags, FABPOOL_TR_FREE, ptr, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN);
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    fp_span *s = fp_map_get(&a->map, addr);
    if (FP_UNLIKELY(!s))
        return fp_alloc_not_ours(a, "fabpool_free", ptr, 0);
    return free_block(a, s, addr, "fabpool_free", 0, NULL, NULL);
}

/* Whether a free flag is 0 (FP_FREEFLAG_USED): on x86-64 one compare with
 * memory, where an atomic load takes a load and a test (the flag is a byte
 * and only this thread's free writes it while the block is given out); a
 * ThreadSanitizer build keeps the atomic, which it sees. */
static inline int flag_clear(const _Atomic uint8_t *f)
{
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    int zero;
    __asm__("cmpb $0, %1" : "=@ccz"(zero) : "m"(*(const uint8_t *)f));
    return zero;
#else
    return atomic_load_explicit(f, memory_order_relaxed) == 0;
#endif
}

/* fabpool_free past its fast path. */
static __attribute__((noinline)) fabpool_status free_entry(fp_alloc *a, void *ptr)
{
    if (FP_UNLIKELY(!a))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_free(%p): the pool is NULL", ptr);
    if (FP_UNLIKELY(fp_device_forked(a->sp->ch)))
        return fp_device_forked_error(a->sp->ch, "fabpool_free");
    return free_any(a, ptr, FABPOOL_TRACE_R_APP);
}

/* A block of the medium arena, the fast path's key matched (tc: the thread's
 * cache): into tc where its state byte says it is a live block of a size the
 * caches hold (fp_mstate), no block has recorded streams, the bin of its size
 * has room and the cache's bytes stay in its budget (past it, fp_tcache_medium_full);
 * else free_entry, whose checks refuse a cached block's double free (its state
 * FP_MSTATE_CACHED) under the pool lock. */
static __attribute__((noinline)) fabpool_status free_medium(fp_alloc *a, void *ptr, fp_tcache *tc)
{
    uint64_t addr = (uint64_t)(uintptr_t)ptr;
    if (FP_UNLIKELY(fp_retire_any_used(a->retire)))
        return free_entry(a, ptr);
    _Atomic uint8_t *f;   /* a byte per quantum: a block start is a multiple; in the reservation (the page map) */
    if (FP_LIKELY(!(addr & (FP_BLOCK_QUANTUM - 1)) && (f = fp_mstate_in(&a->ms, addr)) != NULL)) {
        unsigned c = atomic_load_explicit(f, memory_order_relaxed);
        unsigned n = tc->mn[c];
        if (FP_LIKELY(c - 1u < FP_MSTATE_MAX)) {
            uint64_t bytes = a->mc_lo + ((uint64_t)c << FP_PIECE_UNIT_SHIFT);
            if (FP_UNLIKELY(tc->moff || n == FP_MC_CAP)) {
                if (FP_UNLIKELY(tc->mdn == FP_MD_CAP))
                    return fp_tcache_medium_back(a, tc, addr | c, bytes, f);
                fp_tcache_hold_back(tc, addr | c, bytes, f);
                return FABPOOL_OK;
            }
            uint64_t held = atomic_load_explicit(&tc->mbytes, memory_order_relaxed) + bytes;
            if (FP_UNLIKELY(held > atomic_load_explicit(&a->mc_budget, memory_order_relaxed)))
                return fp_tcache_medium_full(a, tc, addr, f);
            tc->mitems[c][n] = (fp_titem){addr, f};
            tc->mn[c] = (uint8_t)(n + 1);
            tc->mmask[c / 64] |= 1ull << (c % 64);
            atomic_store_explicit(&tc->mbytes, held, memory_order_relaxed);
            atomic_store_explicit(f, FP_MSTATE_CACHED, memory_order_relaxed);
            return FABPOOL_OK;
        }
    }
    /* free_block's way for a block of an arena with no block's streams recorded and no trace (the key) */
    return large_free(a, a->mc_sentinel, addr, "fabpool_free");
}

/* The fast path: a slab block given out and not freed (its flag 0: not
 * free, not pending, no recorded streams), into the calling thread's cache
 * with a bin that has room; the hot slot holds the pool's key only while it
 * has no trace (so nothing is recorded here).  Everything else, the checks'
 * refusals included, is free_entry's. */
fabpool_status fabpool_free(fabpool_t *p, void *ptr)
{
    fp_alloc *a = fp_alloc_of(p);
    if (FP_LIKELY(a != NULL)) {
        const fp_tls_hot *h = &fp_hot;
        uint64_t addr = (uint64_t)(uintptr_t)ptr;
        fp_span *s = fp_map_get(&a->map, addr);
        if (FP_LIKELY(s && h->key == atomic_load_explicit(&a->cache_key, memory_order_relaxed))) {
            /* fp_slab_index on the offset itself: slab.h's magic scaled by the 64-byte quantum is exact for
             * every block start, and the product says whether off is one.  No test of idx against nobj:
             * the pages the map sends here are the slab's, so a block start lies in its blocks or is the
             * one index past them, in the tail, whose flag is not 0.  An arena's sentinel span (every
             * field 0) passes only off 0, the address 0, which the map never sends to it. */
            uint64_t off = addr - s->base;
            uint64_t idx = (off * s->magic) >> (32 + FP_QUANTUM_SHIFT);
            if (FP_LIKELY(idx * s->obj_bytes == off)) {
                _Atomic uint8_t *flag = s->freeflag + idx;
                fp_tcache *tc = h->tc;
                size_t cls = s->cls;
                fp_titem *top = tc->top[cls];
                if (FP_LIKELY(flag_clear(flag) && top != tc->hi[cls])) {
                    *top = (fp_titem){addr, flag};
                    tc->top[cls] = top + 1;
                    tcache_count(&tc->frees[cls]);
                    atomic_store_explicit(flag, FP_FREEFLAG_FREE, memory_order_relaxed);
                    return FABPOOL_OK;
                }
            } else if (s == a->mc_sentinel) {
                return free_medium(a, ptr, h->tc);
            }
        }
    }
    return free_entry(a, ptr);
}

/* Gives a chain of blocks the queue handed back to the pool (one whose
 * free is in the trace already is not traced again). */
void fp_alloc_release_chain(fp_alloc *a, fp_rblock *chain)
{
    for (fp_rblock *b = chain; b; b = b->fnext) {
        fp_alloc_unpend(a, b->ptr);
        fp_span *s = b->traced ? fp_map_get(&a->map, b->ptr) : NULL;
        if ((b->traced ? s && free_block(a, s, b->ptr, "fabpool_free", 0, NULL, NULL) == FABPOOL_OK
                       : free_any(a, (void *)(uintptr_t)b->ptr, 0) == FABPOOL_OK))
            fp_pending_released(a->retire);
    }
    fp_pending_recycle(a->retire, chain);
}

void fp_alloc_drain(fp_alloc *a, int wait, int forget)
{
    fp_alloc_release_chain(a, fp_pending_poll(a->retire, wait, forget));
    if (wait) /* and what the owner stream freed at once (its status: the next unmap fences again) */
        fp_retire_fence(a->retire);
}

/* The stream pair's ways in (alloc.h): the work of fabpool_alloc and fabpool_free, out of line: theirs stay inline. */
fabpool_status fp_alloc_block(fp_alloc *a, size_t size, void **out)
{
    fp_alloc_owner_sync(a);   /* the owner stream's call: its claim may have begun the owner mode */
    return alloc_any(a, size, out);
}

fabpool_status fp_alloc_polled(fp_alloc *a, size_t size, void **out)
{
    tls_polled = 1;
    fabpool_status st = fabpool_alloc(fp_alloc_pool(a), size, out);
    tls_polled = 0;
    return st;
}

fabpool_status fp_alloc_free_block(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                   void *stream, int *queued)
{
    fp_alloc_owner_sync(a);   /* the stream pair's free: its claim may have begun the owner mode */
    return free_block(a, s, addr, fn, on_stream, stream, queued);
}
