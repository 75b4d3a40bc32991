/* stream.c - the stream-ordered pair: fabpool_alloc_on_stream,
 * fabpool_free_on_stream and fabpool_record_stream, over the stream-pending
 * queue (pending.h) and the block paths of alloc.c (alloc.h). */
#include "alloc.h"

#include "device.h"
#include "error.h"
#include "trace.h"

/* A block freed on a stream stays a live block of the pool (its slab flag
 * FP_FREEFLAG_PENDING, a large block FP_LARGE_PENDING) in the retirement
 * queue (pending.h) until an allocation on the same stream takes it back or
 * an event recorded on its stream after the free has completed; then it is
 * freed into the pool like any other block. */

/* The stream a handle names, as the pool keys its records and its owner: CU_STREAM_LEGACY (cudaStreamLegacy) is
 * the legacy default stream that NULL names, so a block allocated on one and freed on the other is the same
 * stream's (the owner's free at once, or taken back by the stream's next allocation). */
static inline void *stream_key(void *stream) { return stream == (void *)CU_STREAM_LEGACY ? NULL : stream; }

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
    return FP_PENDING_LARGE;
}

/* A refused call of the stream pair leaves the owner stream as it was
 * (retire.h): a claim it made (`fresh`: the pool had no owner; seq:
 * owner_seq as the call leaves it) is taken back, and an owner mode it ended
 * (`disowned`, of `was`) is on again; its fence stays done. */
static void owner_restore(fp_alloc *a, void *stream, int fresh, uint64_t seq, int disowned, void *was)
{
    if (fresh && fp_retire_owner_unclaim(a->retire, stream, seq))
        fp_alloc_owner_sync(a);
    if (disowned) {
        fp_retire_owner_reown(a->retire, was);
        fp_alloc_owner_sync(a);
    }
}

/* Before a stream that is not the owner takes memory (fp_retire_owner_leave); a refusal leaves the owner mode as
 * it was, which the fast path's key follows. */
static fabpool_status owner_end(fp_alloc *a, void *stream, int *disowned)
{
    fabpool_status st = fp_retire_owner_leave(a->retire, disowned);
    fp_alloc_owner_sync(a);
    if (st != FABPOOL_OK)
        fp_error_append(" (fabpool_alloc_on_stream, stream %p, waiting for the owner stream %p)", stream,
                        a->retire->owner);
    return st;
}

/* fabpool_alloc_on_stream on the per-thread default stream: fabpool_alloc's block, and its refusal naming the call
 * the caller made too. */
static fabpool_status alloc_per_thread(fabpool_t *p, size_t size, void **out)
{
    fabpool_status st = fabpool_alloc(p, size, out);
    if (st != FABPOOL_OK)
        fp_error_append(" (fabpool_alloc_on_stream of %zu bytes on the per-thread default stream)", size);
    return st;
}

fabpool_status fabpool_alloc_on_stream(fabpool_t *p, size_t size, void *stream, void **out)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_alloc_on_stream: the pool or the output pointer is NULL");
    *out = NULL;
    if (FP_UNLIKELY(fp_device_forked(a->sp->ch)))
        return fp_device_forked_error(a->sp->ch, "fabpool_alloc_on_stream");
    if (size == 0)   /* as fabpool_alloc: success and NULL */
        return FABPOOL_OK;
    if (stream == (void *)CU_STREAM_PER_THREAD)   /* a different stream in every thread: no stream's block */
        return alloc_per_thread(p, size, out);
    stream = stream_key(stream);
    fabpool_status st = FABPOOL_OK;
    /* before anything is taken: a freed or done block and the owner claim would hand out what sleep unmapped */
    if (FP_UNLIKELY(fp_chunks_asleep(a->sp->ch))) {
        st = fp_chunk_asleep_error("fabpool_alloc_on_stream");
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, 0, size, stream, st);
        return st;
    }
    fp_retire *r = a->retire;
    int fresh = atomic_load(&r->owner_mode) == FP_OWNER_NONE; /* the claim below would be this call's */
    uint64_t seq = atomic_load(&r->owner_seq);
    if (fp_retire_owner_claim(r, stream)) {
        /* the owner: what it freed went to the pool at once, and any block of the pool is safe for it */
        void *q = NULL;
        st = fp_alloc_block(a, size, &q);
        if (st != FABPOOL_OK) {
            owner_restore(a, stream, fresh, seq, 0, NULL);
            fp_error_append(" (fabpool_alloc_on_stream of %zu bytes, stream %p)", size, stream);
        }
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, (uint64_t)(uintptr_t)q, size, stream, st);
        *out = q;
        return st;
    }
    void *was = r->owner;
    int disowned = 0;
    if ((st = owner_end(a, stream, &disowned)) != FABPOOL_OK) {
        FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, 0, size, stream, st);
        return st;
    }
    uint64_t need, max, usable = 0;
    uint32_t cls = size <= fp_space_size(a->sp) ? stream_class(a, size, &need, &max) : FP_PENDING_LARGE;
    if (size > fp_space_size(a->sp))
        need = max = 0;
    /* the stream's own freed blocks: stream order makes them safe at once */
    uint64_t ptr = fp_pending_any(a->retire) && need <= max ?
                   fp_pending_take(a->retire, stream, cls, need, max, &usable) : 0;
    if (ptr) {
        fp_alloc_unpend(a, ptr);
    } else if (fp_pending_any(a->retire)) {
        /* a miss: what other streams freed and is done goes back, the first that fits to the caller */
        fp_rblock *chain = fp_pending_poll(a->retire, 0, 0), **at = &chain;
        for (fp_rblock *b = chain; b && size <= fp_space_size(a->sp); at = &b->fnext, b = b->fnext)
            if (!b->traced && /* one whose free is traced is the pool's free memory in the trace: it goes back */
                (cls == FP_PENDING_LARGE ? b->cls == cls && b->usable >= need && b->usable <= max : b->cls == cls)) {
                ptr = b->ptr;
                *at = b->fnext;
                b->fnext = NULL;
                fp_alloc_unpend(a, ptr);
                fp_pending_recycle(a->retire, b);
                fp_pending_reused_after_event(a->retire);
                break;
            }
        fp_alloc_release_chain(a, chain);
    }
    if (!ptr) {
        void *q = NULL;
        st = fp_alloc_polled(a, size, &q);
        if (st == FABPOOL_OK) {
            ptr = (uint64_t)(uintptr_t)q;
        } else {
            owner_restore(a, stream, 0, 0, disowned, was);
            fp_error_append(" (fabpool_alloc_on_stream of %zu bytes, stream %p)", size, stream);
        }
    }
    FP_TRACE_ST(a->trace, FABPOOL_TR_APP_ALLOC, ptr, size, stream, st);
    *out = (void *)(uintptr_t)ptr;
    return st;
}

/* A block a stream call names: its pool's allocator, its span and address,
 * and, once live_block says so, its size, list and recorded streams. */
typedef struct stream_block {
    fp_alloc *a;
    fp_span *s;
    uint64_t addr, usable;
    uint32_t cls;
    int recorded;
} stream_block;

/* Whether block b is live, given out and not freed: OK with its usable size,
 * list (slab class or FP_PENDING_LARGE) and recorded (a slab block with
 * recorded streams, or for a large block whether any block has them), or the
 * status and message of a refusal (an interior pointer, a block already free
 * or pending; fn names the call).  It changes nothing: the caller acts
 * after. */
static fabpool_status live_block(stream_block *b, const char *fn)
{
    fp_span *s = b->s;
    b->recorded = s->kind == FP_SPAN_SLAB ? 0 : fp_retire_any_used(b->a->retire);
    if (s->kind != FP_SPAN_SLAB) {
        b->cls = FP_PENDING_LARGE;
        return fp_large_check(b->a->heap, b->addr, fn, &b->usable);
    }
    uint64_t obj = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
    uint32_t idx = 0;
    if (!fp_slab_index(s, b->addr, &idx))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer into a slab of %llu-byte blocks; free "
                        "the pointer fabpool_alloc returned", fn, (void *)(uintptr_t)b->addr, (unsigned long long)obj);
    uint8_t f = atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed);
    if (f != FP_FREEFLAG_USED && f != FP_FREEFLAG_RECORDED)
        return fp_alloc_already_free(fn, b->addr, obj, f);
    b->recorded = f == FP_FREEFLAG_RECORDED;
    b->usable = obj;
    b->cls = s->cls;
    return FABPOOL_OK;
}

/* The opening of a stream call fn on the block ptr of pool p: b filled with
 * the block's allocator, span and address, or the refusal of a NULL pool or
 * of an address outside this pool's blocks.  A NULL ptr opens with b->s NULL:
 * the call has nothing to do. */
static fabpool_status stream_block_open(fabpool_t *p, void *ptr, const char *fn, stream_block *b)
{
    memset(b, 0, sizeof *b);
    b->a = fp_alloc_of(p);
    b->addr = (uint64_t)(uintptr_t)ptr;
    if (!b->a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s(%p): the pool is NULL", fn, ptr);
    if (FP_UNLIKELY(fp_device_forked(b->a->sp->ch)))
        return fp_device_forked_error(b->a->sp->ch, fn);
    if (!ptr)   /* the block of size 0: the caller does nothing */
        return FABPOOL_OK;
    b->s = fp_map_get(&b->a->map, b->addr);
    return b->s ? FABPOOL_OK : fp_alloc_not_ours(b->a, fn, ptr, 0);
}

/* The owner stream's free: into the pool at once (the next unmap or foreign allocation fences); with streams
 * recorded besides it, it waits for them.  `checked`: the pointer was checked already; `fresh`, `seq`: this
 * call's claim, taken back if the free is refused. */
static fabpool_status free_as_owner(stream_block *b, void *ptr, void *stream, int checked, int fresh, uint64_t seq)
{
    int queued = 0;
    if (FP_UNLIKELY(b->a->trace)) {
        if (b->s->kind == FP_SPAN_SLAB)
            b->usable = (uint64_t)b->s->obj_q << FP_QUANTUM_SHIFT;
        else if (!checked) /* a bad pointer: refused below */
            (void)fp_large_usable(b->a->heap, b->addr, &b->usable, "fabpool_free_on_stream");
        FP_TRACE(b->a->trace, FABPOOL_TR_APP_FREE, ptr, b->usable, stream);
        FP_TRACE_POOL(b->a->trace, FABPOOL_TR_FREE, ptr, 0, 0);
    }
    fabpool_status st = fp_alloc_free_block(b->a, b->s, b->addr, "fabpool_free_on_stream", 1, stream, &queued);
    if (st == FABPOOL_OK && !queued)
        fp_retire_owner_freed(b->a->retire);
    else if (st != FABPOOL_OK)
        owner_restore(b->a, stream, fresh, seq, 0, NULL);
    return st;
}

/* fabpool_free_on_stream on the per-thread default stream (CU_STREAM_PER_THREAD): the handle names a different
 * stream in every thread, so no record keyed by it can order a later allocation after this free; the calling
 * thread's stream is waited for, then the block is freed as fabpool_free frees it. */
static fabpool_status free_per_thread(fabpool_t *p, void *ptr)
{
    fp_alloc *a = fp_alloc_of(p);
    if (a && fp_device_forked(a->sp->ch))
        return fp_device_forked_error(a->sp->ch, "fabpool_free_on_stream");
    if (a && ptr) {
        CUcontext saved;
        fabpool_status st = fp_ctx_push(a->sp->ch, &saved);
        if (st != FABPOOL_OK)
            return st;
        CUresult r = fp_device_sync(a->sp->ch, (void *)CU_STREAM_PER_THREAD);
        fp_ctx_pop(a->sp->ch, saved);
        if (r != CUDA_SUCCESS)
            return fp_drv_error(r, "cuStreamSynchronize", "waiting for this thread's per-thread default stream "
                                "before freeing %p on it (the block is still the caller's)", ptr);
    }
    fabpool_status st = fabpool_free(p, ptr);
    if (st != FABPOOL_OK)   /* fabpool_free's message: the call the caller made is named too */
        fp_error_append(" (fabpool_free_on_stream on the per-thread default stream)");
    return st;
}

fabpool_status fabpool_free_on_stream(fabpool_t *p, void *ptr, void *stream)
{
    if (stream == (void *)CU_STREAM_PER_THREAD)
        return free_per_thread(p, ptr);
    stream = stream_key(stream);
    stream_block b;
    fabpool_status st = stream_block_open(p, ptr, "fabpool_free_on_stream", &b);
    if (st != FABPOOL_OK || !b.s)
        return st;
    int queued = 0, checked = 0, fresh = 0;
    fp_retire *r = b.a->retire;
    uint64_t seq = 0;
    /* the owner's free checks the pointer as fabpool_free does; where the
     * call may make the stream the owner, the pointer is checked first (a
     * refused free changes nothing, and claims no owner: a claim of a call
     * the driver refuses later is taken back) */
    int owner = fp_retire_owner_is(r, stream);
    if (!owner) {
        if ((st = live_block(&b, "fabpool_free_on_stream")) != FABPOOL_OK)
            return st;
        checked = 1;
        fresh = atomic_load(&r->owner_mode) == FP_OWNER_NONE;
        seq = atomic_load(&r->owner_seq) + 1; /* with this call's announced free below */
        owner = fp_retire_owner_claim(r, stream);
    }
    if (owner && fp_retire_owner_free(b.a->retire))
        return free_as_owner(&b, ptr, stream, checked, fresh, seq);
    if (!checked && (st = live_block(&b, "fabpool_free_on_stream")) != FABPOOL_OK)
        return st;
    /* another stream while the owner mode holds: it ends (after the checks above: bad input changes nothing;
     * a refusal after it puts it back) */
    void *was = r->owner;
    int disowned = fp_retire_owned(r);
    if (disowned && (st = fp_retire_disown(r)) != FABPOOL_OK) {
        fp_alloc_owner_sync(b.a); /* the owner mode is on again (retire.h) */
        fp_error_append(" (fabpool_free_on_stream(%p), stream %p, waiting for the owner stream %p: the block is "
                        "still the caller's)", ptr, stream, b.a->retire->owner);
        return st;
    }
    FP_TRACE(b.a->trace, FABPOOL_TR_APP_FREE, ptr, b.usable, stream); /* before any reuse of ptr */
    /* used on other streams too (fabpool_record_stream): it waits for them */
    if (FP_UNLIKELY(b.recorded) &&
        ((st = fp_alloc_free_recorded(b.a, b.s, b.addr, "fabpool_free_on_stream", 1, stream, 0, &queued)) != FABPOOL_OK ||
         queued)) {
        if (st != FABPOOL_OK)
            owner_restore(b.a, stream, 0, 0, disowned, was);
        return st;
    }
    /* marked pending, checked again where two threads could race: the flag's exchange, the large block's lock */
    if (b.s->kind == FP_SPAN_SLAB) {
        uint32_t idx = 0;
        fp_slab_index(b.s, b.addr, &idx);
        uint8_t want = FP_FREEFLAG_USED;
        if (!atomic_compare_exchange_strong_explicit(&b.s->freeflag[idx], &want, FP_FREEFLAG_PENDING,
                                                     memory_order_relaxed, memory_order_relaxed)) {
            /* freed by another thread since live_block: refused, the owner mode this call ended on again */
            owner_restore(b.a, stream, 0, 0, disowned, was);
            return fp_alloc_already_free("fabpool_free_on_stream", b.addr, b.usable, want);
        }
    } else if ((st = fp_large_pend(b.a->heap, b.addr, "fabpool_free_on_stream", &b.usable)) != FABPOOL_OK) {
        owner_restore(b.a, stream, 0, 0, disowned, was);
        return st;
    }
    int poll = 0;
    st = fp_pending_free(b.a->retire, stream, b.addr, b.usable, b.cls, &poll);
    if (st != FABPOOL_OK) {
        fp_alloc_unpend(b.a, b.addr); /* nothing changed: the block is still the caller's */
        owner_restore(b.a, stream, 0, 0, disowned, was);
        fp_error_append(" (fabpool_free_on_stream(%p): the block is still the caller's)", ptr);
        return st;
    }
    if (poll)
        fp_alloc_drain(b.a, 0, 0);
    return FABPOOL_OK;
}

fabpool_status fabpool_stream_owner_end(fabpool_t *p)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_stream_owner_end: the pool is NULL");
    if (fp_device_forked(a->sp->ch))
        return fp_device_forked_error(a->sp->ch, "fabpool_stream_owner_end");
    fp_retire *r = a->retire;
    /* no owner yet: none may come now (a stream that captures a graph must not become one) */
    fabpool_status st = fp_retire_owner_close(r);
    fp_alloc_owner_sync(a);
    if (st != FABPOOL_OK)
        fp_error_append(" (fabpool_stream_owner_end: waiting for the owner stream %p's work; the owner mode holds)",
                        r->owner);
    return st;
}

fabpool_status fabpool_record_stream(fabpool_t *p, void *ptr, void *stream)
{
    if (stream == (void *)CU_STREAM_PER_THREAD)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_record_stream(%p): the per-thread default stream "
                        "(CU_STREAM_PER_THREAD) names a different stream in every thread, which the free cannot wait "
                        "for; record the stream's own handle, or synchronize it before the free", ptr);
    stream = stream_key(stream);
    stream_block b;
    fabpool_status st = stream_block_open(p, ptr, "fabpool_record_stream", &b);
    if (st != FABPOOL_OK || !b.s)
        return st;
    st = live_block(&b, "fabpool_record_stream");
    if (st == FABPOOL_ERR_DOUBLE_FREE)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_record_stream(%p, stream %p): the block is not live: it was "
                        "freed (fabpool_free or fabpool_free_on_stream); record a stream on a block before its free",
                        ptr, stream);
    if (st != FABPOOL_OK)
        return st;
    if ((st = fp_retire_use(b.a->retire, b.addr, stream)) != FABPOOL_OK)
        return st;
    if (b.s->kind == FP_SPAN_SLAB) { /* its free goes to the slow path, which finds the streams */
        uint32_t idx = 0;
        fp_slab_index(b.s, b.addr, &idx);
        atomic_store_explicit(&b.s->freeflag[idx], FP_FREEFLAG_RECORDED, memory_order_relaxed);
    }
    return FABPOOL_OK;
}
