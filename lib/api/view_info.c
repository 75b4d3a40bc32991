/* view_info.c - what a view says of itself (its info, its address) and
 * fabpool_check's walk of the views (view.h). */
#include "view_info.h"

#include "error.h"
#include "handles.h"

fabpool_status fabpool_view_get_info(const fabpool_view_t *v, fabpool_buffer_info *out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_view_get_info: the output is NULL");
    fabpool_status st = fp_handle_check(v, FP_HANDLE_VIEW, "fabpool_view_get_info", "the view");
    if (st != FABPOOL_OK)
        return st;
    if (fp_device_forked(v->owner->sp->ch))
        return fp_device_forked_error(v->owner->sp->ch, "fabpool_view_get_info");
    st = fp_struct_size_check("fabpool_view_get_info", "fabpool_buffer_info", out->struct_size, sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    fp_lock(&v->owner->sp->lock);
    out->base = (void *)(uintptr_t)v->base;
    out->size = v->live;
    out->mapped = v->live;
    out->max_size = v->window;
    out->n_chunks = v->n;
    out->generation = v->generation;
    out->export_id = v->uid;
    fp_unlock(&v->owner->sp->lock);
    return FABPOOL_OK;
}

void *fabpool_view_ptr(const fabpool_view_t *v)
{
    if (fp_handle_check(v, FP_HANDLE_VIEW, "fabpool_view_ptr", "the view") != FABPOOL_OK)
        return NULL;
    return (void *)(uintptr_t)v->base;
}

/* ---- fabpool_check (walk.h) */

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

fabpool_status fp_views_check(const fp_views *vs, fp_walk *w)
{
    uint64_t bytes = 0, kept = 0;
    const struct fabpool_view *pv = NULL;
    for (const struct fabpool_view *v = vs->list; v; pv = v, v = v->next) {
        if (v->prev != pv || v->owner != vs || v->n > v->cap)
            return FAIL("[view.list] view 0x%llx: its back link, its pool or its chunk count is wrong", ULL(v->base));
        if (fp_handle_live(v, FP_HANDLE_VIEW) == v->kept)
            return FAIL("[view.handle] view 0x%llx%s: its handle is %s", ULL(v->base), v->kept ? " (released)" : "",
                        v->kept ? "live" : "refused");
        uint64_t end = 0;
        for (uint32_t i = 0; i < v->n; i++) {
            const fp_vchunk *c = &v->chunks[i];
            if (!c->size || c->off < end || c->off + c->size > v->window)
                return FAIL("[view.chunks] view 0x%llx: chunk %u (%llu bytes at +%llu) is empty, overlaps the one before "
                            "or leaves the window of %llu bytes", ULL(v->base), i, ULL(c->size), ULL(c->off),
                            ULL(v->window));
            end = c->off + c->size;
            bytes += c->size;
            kept += v->kept ? c->size : 0;
            w->n_chunks++;
            w->chunk_bytes += c->size;
        }
        if (fp_walk_use(w, v->base, v->window, "a view's window", v) != 0)
            return FP_WALK_HOST_FAIL();
    }
    if (bytes != atomic_load(&vs->bytes) || kept != atomic_load(&vs->kept_bytes))
        return FAIL("[view.stats] the views' chunks add up to %llu bytes, %llu of them kept; view_bytes says %llu, "
                    "kept_bytes %llu", ULL(bytes), ULL(kept), ULL(atomic_load(&vs->bytes)),
                    ULL(atomic_load(&vs->kept_bytes)));
    return FABPOOL_OK;
}
