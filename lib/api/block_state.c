/* block_state.c - what a block's record says, for the calls that are not
 * fabpool_alloc / fabpool_free: the size and liveness of a block given out
 * (fabpool_usable_size, fp_alloc_live_block), and the step of a free of a
 * block with recorded streams (fp_alloc_free_recorded, fp_alloc_unpend)
 * that fabpool_free and the stream pair share (alloc.h). */
#include "block_state.h"

#include "bchunk.h"
#include "error.h"

/* The refusal of a free (or a use) of a slab block whose flag f says it is not given out. */
fabpool_status fp_alloc_already_free(const char *fn, uint64_t addr, uint64_t obj, uint8_t f)
{
    return fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this %llu-byte block is already free%s (a double free, or a "
                    "block of a slab that this pool never gave out: a slab cannot tell the two apart)", fn,
                    (void *)(uintptr_t)addr, (unsigned long long)obj,
                    f == FP_FREEFLAG_PENDING ? ", freed on a stream and waiting for its work" : "");
}

fabpool_status fp_alloc_not_ours(const fp_alloc *a, const char *fn, const void *ptr, int locked)
{
    uint64_t addr = (uint64_t)(uintptr_t)ptr, base = 0;
    if (!locked)
        fp_space_lock(a->sp);
    const fp_mapping *m = fp_chunk_mapping_over(a->sp->ch, addr);
    int kind = m ? m->kind : -1;
    if (kind == FP_MAP_BUFFER)
        base = ((const struct fabpool_buffer *)m->owner)->base;
    if (!locked)
        fp_space_unlock(a->sp);
    if (kind == FP_MAP_BUFFER && addr == base)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): that is the base of a growable buffer (fabpool_buffer_create), "
                        "not a block: give the buffer back with fabpool_buffer_destroy (and share it with "
                        "fabpool_buffer_export)", fn, ptr);
    if (kind == FP_MAP_BUFFER)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): that address is %llu bytes into a growable buffer's memory "
                        "(the buffer at 0x%llx, fabpool_buffer_create), not a block: give the buffer back with "
                        "fabpool_buffer_destroy (and share it with fabpool_buffer_export)", fn, ptr,
                        (unsigned long long)(addr - base), (unsigned long long)base);
    if (kind == FP_MAP_VIEW)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): that address is in a view of another process's buffer "
                        "(fabpool_view_open), not a block: the view is closed with fabpool_view_close", fn, ptr);
    return fp_error(FABPOOL_ERR_NOT_FOUND,
                    "%s(%p): this pool (device %d) did not give out that pointer, or it was freed and its memory "
                    "returned to the driver", fn, ptr, (int)a->sp->ch->dev);
}

/* A pending block becomes a block given out again. */
void fp_alloc_unpend(fp_alloc *a, uint64_t ptr)
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

/* A block with recorded streams (fabpool_record_stream), checked live by the
 * caller, is freed: by fabpool_free (on_stream 0) or on `stream`, its free
 * in the trace already (traced) or not.  If a stream other than `stream`
 * was recorded, it waits in the queue for an event on each and on `stream`
 * (*queued = 1); else its record goes and the caller frees it as any block
 * (*queued = 0, the block as it was but for its slab flag, now
 * FP_FREEFLAG_USED).  On failure nothing changed. */
fabpool_status fp_alloc_free_recorded(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                      void *stream, int traced, int *queued)
{
    *queued = 0;
    uint64_t usable = 0;
    uint32_t cls = FP_PENDING_LARGE, idx = 0;
    fabpool_status st = FABPOOL_OK;
    if (s->kind == FP_SPAN_SLAB) {
        fp_slab_index(s, addr, &idx);
        usable = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
        cls = s->cls;
        uint8_t want = FP_FREEFLAG_RECORDED;
        if (!atomic_compare_exchange_strong_explicit(&s->freeflag[idx], &want, FP_FREEFLAG_PENDING,
                                                     memory_order_relaxed, memory_order_relaxed))
            return want == FP_FREEFLAG_USED ? FABPOOL_OK : fp_alloc_already_free(fn, addr, usable, want);
    } else if (!fp_retire_used(a->retire, addr)) {
        return FABPOOL_OK;
    } else if ((st = fp_large_pend(a->heap, addr, fn, &usable)) != FABPOOL_OK) {
        return st;
    }
    st = fp_pending_free_used(a->retire, addr, usable, cls, on_stream, stream, traced, queued);
    if (st == FABPOOL_OK && *queued)
        return FABPOOL_OK;
    fp_alloc_unpend(a, addr);
    if (st != FABPOOL_OK) {
        if (s->kind == FP_SPAN_SLAB) /* its streams are still recorded */
            atomic_store_explicit(&s->freeflag[idx], FP_FREEFLAG_RECORDED, memory_order_relaxed);
        fp_error_append(" (%s(%p): the block is still the caller's, its streams recorded)", fn, (void *)(uintptr_t)addr);
    }
    return st;
}

fabpool_status fabpool_usable_size(fabpool_t *p, const void *ptr, size_t *out)
{
    fp_alloc *a = fp_alloc_of(p);
    if (!a || !ptr || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_usable_size: the pool, the pointer or the output is NULL");
    if (fp_device_forked(a->sp->ch))
        return fp_device_forked_error(a->sp->ch, "fabpool_usable_size");
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    fp_span *s = fp_map_get(&a->map, addr);
    uint32_t idx;
    if (s && s->kind != FP_SPAN_SLAB) {
        fabpool_status st = fp_large_usable(a->heap, addr, &usable, "fabpool_usable_size");
        *out = (size_t)usable;
        return st;
    }
    if (!s)
        return fp_alloc_not_ours(a, "fabpool_usable_size", ptr, 0);
    if (!fp_slab_index(s, addr, &idx))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_usable_size(%p): an interior pointer into a block of %u "
                        "bytes, not a block this pool gave out", ptr, (unsigned)s->obj_q << FP_QUANTUM_SHIFT);
    /* a block freed on a stream is still given out until its work is done: it keeps its size, as an arena's */
    if (atomic_load_explicit(&s->freeflag[idx], memory_order_relaxed) == FP_FREEFLAG_FREE) {
        *out = 0;
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_usable_size(%p): this %u-byte block is free; only a live "
                        "block can be used", ptr, (unsigned)s->obj_q << FP_QUANTUM_SHIFT);
    }
    *out = (size_t)s->obj_q << FP_QUANTUM_SHIFT;
    return FABPOOL_OK;
}

fabpool_status fp_alloc_live_block(fp_alloc *a, uint64_t addr, uint64_t *usable, const char *fn)
{
    fp_span *s = fp_map_get(&a->map, addr);
    if (!s)
        return fp_alloc_not_ours(a, fn, (void *)(uintptr_t)addr, 1);
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

