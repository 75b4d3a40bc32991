/* view_open.c - a peer's buffer opened in this process from its full
 * descriptor: a view mapped afresh, or a view kept after its release taken
 * back and brought to the descriptor (view_open.h). */
#include "view_open.h"

#include "array.h"
#include "error.h"
#include "handles.h"
#include "list.h"

/* The kept view of the buffer ds describes, opened from the process the
 * caller vouches for now (`vouched`), taken back and brought to ds (importing
 * and mapping only the chunks it lacks); NULL if none is kept, or if the one
 * kept could not take ds (it is closed: the caller opens a view afresh).
 * The view taken back gets a new handle: the released one stays refused.
 * The vouched pid is what makes the reuse safe: a chunk the view maps
 * already is not imported again, so its fd is never looked at, and every
 * field of the descriptor that names the buffer is the sender's word; another
 * peer could name a buffer it was never given, with fds of anything.  Pool
 * lock held. */
static fabpool_view_t *reopen_kept(fp_views *vs, int vouched, const fp_desc *ds, const int *fds)
{
    fp_views_drop_kept(vs, 0);
    fabpool_view_t *v = vs->list;
    while (v && !(v->kept && v->vouched_pid == vouched && v->uid == ds->uid && v->peer_pid == ds->pid &&
                  v->window == ds->window && v->handle_type == ds->handle_type))
        v = v->next;
    if (!v || !(v = fp_handle_renew(v, FP_HANDLE_VIEW, sizeof *v)))
        return NULL; /* none, or no host memory for its new handle (it stays kept) */
    FP_LIST_MOVED(&vs->list, v, next, prev);
    fp_view_keep(vs, v, 0); /* taken back: what the apply unmaps or maps is an open view's */
    fp_msg_hold h; /* a failure here is not the caller's: it opens the view afresh */
    fp_error_hold(&h);
    int took = fp_view_apply_locked(v, ds, fds) == FABPOOL_OK;
    if (!took && fp_view_free(vs, v, 0) != FABPOOL_OK)
        fp_view_keep(vs, v, 1); /* a refusal: it stays kept, the next drop closes it */
    fp_error_unhold(&h, FABPOOL_OK);
    return took ? v : NULL;
}

/* fp_view_open's work; fn: the call's name, for the messages of its own. */
static fabpool_status open_view(fp_views *vs, int vouched, const void *desc, size_t len, const int *fds, size_t nfds,
                                fabpool_view_t **out, const char *fn)
{
    if (!vs || !out || vouched < 0) {
        fp_view_close_fds(fds, nfds);
        return fp_error(FABPOOL_ERR_INVALID_ARG, vouched < 0 ? "%s: the peer's pid is not a process id (above 0)"
                        : "%s: the pool or the output pointer is NULL", fn);
    }
    *out = NULL;
    fp_desc ds;
    fabpool_status st = fp_device_forked(vs->sp->ch) ? fp_device_forked_error(vs->sp->ch, fn)
                                                     : fp_desc_parse(desc, len, nfds, &ds);
    if (st == FABPOOL_OK && ds.since != 0)
        st = fp_desc_refuse("a first view needs a full descriptor (since 0), this is a delta since %llu (of %llu)",
                      ds.since, ds.generation);
    if (st == FABPOOL_OK && ds.gran != vs->sp->gran && ds.gran % vs->sp->gran)
        st = fp_desc_refuse("its granularity %llu does not fit this pool's %llu", ds.gran, vs->sp->gran);
    fabpool_view_t *v = NULL;
    if (st == FABPOOL_OK && vouched && atomic_load(&vs->kept_bytes)) {
        fp_lock(&vs->sp->lock);
        v = fp_chunks_asleep(vs->sp->ch) ? NULL : reopen_kept(vs, vouched, &ds, fds);
        fp_unlock(&vs->sp->lock);
        if (v) {
            fp_view_close_fds(fds, nfds);
            *out = v;
            return FABPOOL_OK;
        }
    }
    if (st == FABPOOL_OK && !(v = fp_handle_alloc(FP_HANDLE_VIEW, vs->sp->meta)))
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a view");
    if (st != FABPOOL_OK) {
        fp_view_close_fds(fds, nfds);
        return st;
    }
    v->owner = vs;
    v->window = ds.window;
    v->uid = ds.uid;
    v->handle_type = ds.handle_type;
    v->peer_pid = ds.pid;
    v->peer_device = ds.device;
    v->vouched_pid = vouched;
    fp_lock(&vs->sp->lock);
    int asleep = fp_chunks_asleep(vs->sp->ch);
    v->base = asleep ? 0 : fp_va_alloc(&vs->sp->va, v->window, ds.gran > vs->sp->gran ? ds.gran : vs->sp->gran);
    if (asleep)
        st = fp_chunk_asleep_error(fn);
    else if (!v->base)
        st = fp_error(FABPOOL_ERR_LIMIT, "%s: no free address range of %llu bytes left in the pool's reservation; "
                      "raise reserve", fn, (unsigned long long)v->window);
    else if ((st = fp_view_apply_locked(v, &ds, fds)) != FABPOOL_OK)
        fp_space_free_range(vs->sp, v->base, v->window); /* what the driver would not unmap keeps its range */
    if (st == FABPOOL_OK)
        FP_LIST_PUSH(&vs->list, v, next, prev);
    fp_unlock(&vs->sp->lock);
    fp_view_close_fds(fds, nfds);
    if (st != FABPOOL_OK) {
        FP_ARRAY_FREE(vs->sp->meta, v->chunks, v->cap);
        fp_handle_free(v, vs->sp->meta);
        return st;
    }
    *out = v;
    return FABPOOL_OK;
}

fabpool_status fp_view_open(fp_views *vs, int vouched, const void *desc, size_t len, const int *fds, size_t nfds,
                            fabpool_view_t **out)
{
    const char *fn = vouched ? "fabpool_view_open_peer" : "fabpool_view_open";
    return fp_view_named(open_view(vs, vouched, desc, len, fds, nfds, out, fn), fn);
}
