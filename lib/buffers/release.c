/* release.c - a buffer's end: destroyed, or released and kept for reuse.  A buffer given up with
 * fabpool_buffer_release keeps its window, its chunks and their exported
 * handles for keep_ms; fabpool_buffer_reuse hands the kept buffer that fits
 * best to the next caller, under a new handle (the released one stays
 * refused: handles.h), resized: growing maps only the missing chunks, at
 * the same base address, and a later export names the chunks it had with
 * the handles cached then.  So code that frees a buffer set and allocates it
 * again larger (HybridEP's update_buffer) pays only for the growth.
 *
 * What bounds the kept memory: its age (keep_ms, checked at the pool's next
 * release, reuse or collect), a reuse that finds nothing that fits (every
 * kept buffer goes then: a miss means the frees were not a regrow, and kept
 * memory must not add to new memory), an out-of-memory retry (a grow's in
 * buffer.c, a block allocation's through fp_buffers_give_back_kept),
 * fabpool_trim, sleep and pool destroy; a release while the pool sleeps
 * keeps nothing (a destroy).  A kept buffer stays on the pool's
 * list (check walks it, destroy frees it) with size 0, counted in kept_bytes
 * and not in the buffers' bytes or count. */
#include "release.h"

#include <stdio.h>

#include "array.h"
#include "clock.h"
#include "error.h"
#include "handles.h"
#include "log.h"
#include "trace.h"

fabpool_status fabpool_buffer_destroy(fabpool_buffer_t *b, void *stream)
{
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_destroy", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_destroy");
    fp_msg_hold h;
    fp_error_hold(&h);
    fp_lock(&bs->sp->lock);
    st = fp_buffer_destroy_locked(bs, b, stream);
    if (st != FABPOOL_OK) {
        fp_error_append(" (fabpool_buffer_destroy: the buffer is still alive; destroy it again)");
        fp_unlock(&bs->sp->lock);
        return fp_error_unhold(&h, st);
    }
    FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_DESTROY, b->base, 0, stream, FABPOOL_OK);
    /* what no peer can still import goes now (once its GPU work is done);
     * the rest when the peers acknowledge (fabpool_peers_ack) or at pool
     * destroy.  A collect that fails here is retried by the next one. */
    (void)fp_collect_locked(bs, 0);
    fp_unlock(&bs->sp->lock);
    return fp_error_unhold(&h, FABPOOL_OK);
}

void fp_buffers_destroy(fp_buffers *bs)
{
    fp_lock_assert_held(&bs->sp->lock);
    while (bs->list) {
        struct fabpool_buffer *b = bs->list;
        while (b->n)
            if (fp_buffer_pop_chunk(bs, b) != FABPOOL_OK) {
                b->n--; /* the driver refused: forget the chunk, the reservation goes next */
            }
        fp_buffer_peer_holds_release(bs, b, 1);
        fp_buffer_free(bs, b);
    }
    /* copies the driver would not unmap at the collect before: forgotten, as a chunk it refuses above, and
     * the reservation goes next */
    bs->n_stuck = 0;
    FP_ARRAY_FREE(bs->sp->meta, bs->stuck, bs->cap_stuck);
}

fabpool_status fabpool_buffer_release(fabpool_buffer_t *b)
{
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_release", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_release");
    if (bs->keep_ms == 0)
        return fabpool_buffer_destroy(b, NULL);
    fp_lock(&bs->sp->lock);
    if (fp_chunks_asleep(bs->sp->ch)) {
        /* asleep, a release is a destroy (only the records change): the sleep gave back what was kept and a reuse
         * is refused until the wake, so a buffer kept now would count in kept_bytes memory the pool does not map,
         * and the wake would map it and restore its host copy for no caller.  (A wake by another thread before
         * the destroy takes the lock: a destroy, as keep_ms 0 makes every release.) */
        fp_unlock(&bs->sp->lock);
        return fabpool_buffer_destroy(b, NULL);
    }
    fp_buffers_drop_kept(bs, 0);
    atomic_fetch_sub(&bs->bytes, b->size);
    atomic_fetch_sub(&bs->count, 1);
    atomic_fetch_add(&bs->kept_bytes, b->live);
    b->size = 0;
    b->kept = 1;
    fp_handle_kill(b); /* a reuse hands it out under a new handle */
    b->kept_ns = fp_coarse_ns();
    FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_DESTROY, b->base, 0, NULL, FABPOOL_OK);
    fp_msg_hold h; /* a collect that fails here is retried by the next one */
    fp_error_hold(&h);
    (void)fp_collect_locked(bs, 0);
    fp_unlock(&bs->sp->lock);
    return fp_error_unhold(&h, FABPOOL_OK);
}

int fp_buffers_give_back_kept(fp_buffers *bs)
{
    if (!bs || !atomic_load(&bs->kept_bytes))
        return 0;
    fp_msg_hold h;
    fp_error_hold(&h);
    fp_lock(&bs->sp->lock);
    uint64_t kept = atomic_load(&bs->kept_bytes);
    fp_buffers_drop_kept(bs, 1);
    (void)fp_collect_locked(bs, 0); /* a collect that fails here is retried by the next one */
    uint64_t left = atomic_load(&bs->kept_bytes);
    fp_unlock(&bs->sp->lock);
    fp_error_unhold(&h, FABPOOL_OK);
    if (left < kept)
        FP_LOG_CH(FP_LOG_INFO, bs->sp->ch, "out of memory: %llu bytes of buffers released and kept for reuse went "
                  "back to the driver, then one more try", (unsigned long long)(kept - left));
    return left < kept;
}

/* The kept buffer for `size` bytes: its window holds size, and its live bytes
 * are the nearest to size (the least to map or to give up); among equals one
 * that maps nothing, then the one kept first. */
static struct fabpool_buffer *best_fit(fp_buffers *bs, uint64_t size)
{
    struct fabpool_buffer *best = NULL;
    uint64_t best_d = UINT64_MAX;
    for (struct fabpool_buffer *b = bs->list; b; b = b->next) {
        if (!b->kept || b->window < size)
            continue;
        uint64_t d = b->live > size ? b->live - size : size - b->live;
        int better_tie = best && d == best_d &&
                         ((b->live >= size) != (best->live >= size) ? b->live >= size : b->kept_ns <= best->kept_ns);
        if (d < best_d || better_tie) {
            best = b;
            best_d = d;
        }
    }
    return best;
}

fabpool_status fp_buffer_reuse(fp_buffers *bs, size_t size, void *stream, fabpool_buffer_t **out)
{
    if (!bs || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_reuse: the pool or the output pointer is NULL");
    *out = NULL;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_reuse");
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_reuse: size 0; a buffer holds at least one byte");
    fp_lock(&bs->sp->lock);
    if (fp_chunks_asleep(bs->sp->ch)) { /* the kept buffers went with the sleep: say why, not "none fits" */
        fp_unlock(&bs->sp->lock);
        return fp_chunk_asleep_error("fabpool_buffer_reuse");
    }
    fp_buffers_drop_kept(bs, 0);
    struct fabpool_buffer *b = best_fit(bs, size);
    if (!b) {
        fp_buffers_drop_kept(bs, 1);
        (void)fp_collect_locked(bs, 0);
        fp_unlock(&bs->sp->lock);
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_buffer_reuse: no released buffer's window holds %zu bytes "
                        "(the kept ones were given back): create one", size);
    }
    struct fabpool_buffer *nb = fp_buffer_rehandle(bs, b); /* the released handle stays refused */
    if (!nb) {
        fp_unlock(&bs->sp->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_buffer_reuse: no host memory for the buffer's new handle; "
                        "nothing handed out, the released buffer stays kept");
    }
    b = nb;
    atomic_fetch_sub(&bs->kept_bytes, b->live);
    atomic_fetch_add(&bs->count, 1);
    b->kept = 0;
    FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_CREATE, b->base, size, b->window, FABPOOL_OK);
    fp_unlock(&bs->sp->lock);
    /* from size 0: the resize counts its bytes and raises the in-use mark */
    fabpool_status st = fabpool_buffer_resize(b, size, stream);
    if (st != FABPOOL_OK) {
        /* refused: nothing is handed out and the buffer is given back, as a miss gives the kept ones back (the
         * caller creates one next).  Where the driver refuses that too, the buffer is kept again as the release
         * left it (its age too): never a buffer neither kept nor the caller's.  A resize that lost a chunk
         * (FABPOOL_ERR_PARTIAL, resize's own answer: two faults) is a driver error here: nothing is partly the
         * caller's */
        char first[1024]; /* the resize's message: the give-back below may write its own */
        snprintf(first, sizeof first, "%s", fabpool_last_error());
        fp_lock(&bs->sp->lock);
        fabpool_status gone = fp_buffer_destroy_locked(bs, b, stream);
        if (gone == FABPOOL_OK) {
            (void)fp_collect_locked(bs, 0);
        } else {
            atomic_fetch_sub(&bs->bytes, b->size);
            atomic_fetch_sub(&bs->count, 1);
            atomic_fetch_add(&bs->kept_bytes, b->live);
            b->size = 0;
            b->kept = 1;
            fp_handle_kill(b);
        }
        FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_DESTROY, b->base, 0, NULL, FABPOOL_OK);
        fp_unlock(&bs->sp->lock);
        fp_error(st, "%s", first);
        fp_error_append(gone == FABPOOL_OK ? " (fabpool_buffer_reuse: nothing handed out; the released buffer was "
                        "given back)" : " (fabpool_buffer_reuse: nothing handed out; giving the released buffer "
                        "back failed too, so it stays kept)");
        return st == FABPOOL_ERR_PARTIAL ? FABPOOL_ERR_DRIVER : st;
    }
    *out = b;
    return FABPOOL_OK;
}
