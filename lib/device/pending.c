/* pending.c - stream-pending blocks (retire.h): blocks freed on a stream,
 * taken back by the same stream or handed back once an event after their
 * free has completed, and the streams recorded on live blocks
 * (fabpool_record_stream) whose work their free waits for. */
#include <string.h>

#include "array.h"
#include "error.h"
#include "pending.h"

/* ------------------------------------------------------------ blocks */

/* One event for a stream's batch of frees, so that the rest of the pool can have them soon.  Where it cannot be
 * recorded, the whole context is waited for; where that fails too, the batch waits for the next poll's event:
 * no failure of the free's, and the thread's message stays as it was. */
static void batch_event(fp_retire *r, fp_rstream *rs)
{
    fp_msg_hold h;
    fp_error_hold(&h);
    CUcontext saved;
    if (fp_rq_ctx_enter(r, &saved, NULL) == 0) {
        if (fp_rq_event_record(r, rs) != FABPOOL_OK)
            (void)fp_rq_sync_all(r);
        fp_rq_ctx_leave(r, saved);
    }
    fp_error_unhold(&h, FABPOOL_OK);
}

fabpool_status fp_pending_free(fp_retire *r, void *stream, uint64_t ptr, uint64_t usable, uint32_t cls, int *poll)
{
    *poll = 0;
    fp_lock(&r->lock);
    fp_rstream *rs = fp_rq_stream_get(r, stream);
    fp_rblock *b = r->spare;
    if (b)
        r->spare = b->cnext;
    else if (rs)
        b = fp_meta_alloc(r->meta, sizeof *b);
    if (!rs || !b) {
        if (b)
            fp_rq_spare_block(r, b);
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to queue a block freed on stream %p", stream);
    }
    memset(b, 0, sizeof *b);
    b->ptr = ptr;
    b->usable = usable;
    b->cls = cls;
    b->rs = rs;
    b->seq = ++rs->seq;
    b->cnext = rs->cls[cls];
    if (b->cnext)
        b->cnext->cprev = b;
    rs->cls[cls] = b;
    b->fprev = rs->tail;
    if (rs->tail)
        rs->tail->fnext = b;
    else
        rs->head = b;
    rs->tail = b;
    rs->blocks++;
    rs->fresh_blocks++;
    rs->fresh_bytes += usable;
    uint64_t nb = fp_rq_bump(&r->pending_blocks, (int64_t)1);
    uint64_t nbytes = fp_rq_bump(&r->pending_bytes, (int64_t)usable);
    fp_rq_bump(&r->frees, (int64_t)1);
    if (rs->fresh_blocks >= FP_PENDING_BATCH_BLOCKS || rs->fresh_bytes >= FP_PENDING_BATCH_BYTES)
        batch_event(r, rs);
    *poll = nb > FP_PENDING_POLL_BLOCKS || nbytes > FP_PENDING_POLL_BYTES;
    fp_unlock(&r->lock);
    return FABPOOL_OK;
}

uint64_t fp_pending_take(fp_retire *r, void *stream, uint32_t cls, uint64_t need, uint64_t max, uint64_t *usable)
{
    fp_lock(&r->lock);
    fp_rstream *rs = fp_rq_stream_find(r, stream);
    fp_rblock *b = rs ? rs->cls[cls] : NULL;
    if (b && cls == FP_PENDING_LARGE) {
        int n = 0;
        while (b && !(b->usable >= need && b->usable <= max) && ++n < 32)
            b = b->cnext;
        if (b && !(b->usable >= need && b->usable <= max))
            b = NULL;
    }
    if (!b) {
        fp_unlock(&r->lock);
        return 0;
    }
    fp_rq_unlink_block(rs, b);
    uint64_t ptr = b->ptr;
    *usable = b->usable;
    fp_rq_bump(&r->pending_blocks, -(int64_t)1);
    fp_rq_bump(&r->pending_bytes, -(int64_t)b->usable);
    fp_rq_bump(&r->reuse_same, (int64_t)1);
    fp_rq_spare_block(r, b);
    fp_unlock(&r->lock);
    return ptr;
}

/* Detaches every used block whose events have all completed (waiting, with
 * wait) onto *tail.  Lock held, context current. */
static void poll_used(fp_retire *r, int wait, fp_rblock ***tail)
{
    for (fp_rblock **at = &r->used; *at;) {
        fp_rblock *b = *at;
        while (b->uses.n) {
            fp_rticket *t = &b->uses.t[b->uses.n - 1];
            fabpool_status st = FABPOOL_OK;
            int done = t->rs->done >= t->seq ? 1 : fp_rq_advance(r, t->rs, t->seq, wait, &st);
            if (done < 0) /* the whole context instead; where that fails too, the block waits on */
                done = fp_rq_sync_all(r) == FABPOOL_OK;
            if (!done)
                break;
            fp_rq_ticket_release(t);
            b->uses.n--;
        }
        if (b->uses.n) {
            at = &b->fnext;
            continue;
        }
        FP_ARRAY_FREE(r->meta, b->uses.t, b->uses.cap);
        *at = b->fnext;
        b->fnext = NULL;
        fp_rq_bump(&r->pending_blocks, -(int64_t)1);
        fp_rq_bump(&r->pending_bytes, -(int64_t)b->usable);
        **tail = b;
        *tail = &b->fnext;
    }
}

static fp_rblock *poll_streams(fp_retire *r, int wait, int forget)
{
    fp_lock(&r->lock);
    if (!r->n_streams && !r->used) {
        fp_unlock(&r->lock);
        return NULL;
    }
    fp_rblock *chain = NULL, **tail = &chain;
    CUcontext saved;
    if (fp_rq_ctx_enter(r, &saved, NULL) != 0) {
        fp_unlock(&r->lock);
        return NULL;
    }
    /* one event on every stream whose frees no event covers */
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        /* where it cannot be recorded, the whole context instead (which covers the rest); where that fails
         * too, the stream's frees wait on, and the next stream is tried */
        if (rs->blocks && rs->seq > rs->recorded && rs->seq > rs->done && fp_rq_event_record(r, rs) != FABPOOL_OK &&
            fp_rq_sync_all(r) == FABPOOL_OK)
            break;
    }
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        if (!rs->blocks)
            continue;
        fabpool_status st = FABPOOL_OK;
        uint64_t until = wait ? rs->recorded : rs->tail ? rs->tail->seq : 0;
        if (fp_rq_advance(r, rs, until, wait, &st) < 0) {
            if (fp_rq_sync_all(r) == FABPOOL_OK) {
                i = (uint32_t)-1; /* every stream is done now: walk them again */
                continue;
            }
            /* nothing is known done past rs->done: only the blocks it covers go back */
        }
        while (rs->head && rs->head->seq <= rs->done) {
            fp_rblock *b = rs->head;
            fp_rq_unlink_block(rs, b);
            fp_rq_bump(&r->pending_blocks, -(int64_t)1);
            fp_rq_bump(&r->pending_bytes, -(int64_t)b->usable);
            *tail = b;
            tail = &b->fnext;
        }
    }
    poll_used(r, wait, &tail);
    if (forget)
        fp_rq_forget_idle(r);
    fp_rq_ctx_leave(r, saved);
    fp_unlock(&r->lock);
    return chain;
}

fp_rblock *fp_pending_poll(fp_retire *r, int wait, int forget)
{
    fp_msg_hold h; /* what fails here leaves blocks pending for a later poll: no failure of the caller's */
    fp_error_hold(&h);
    fp_rblock *chain = poll_streams(r, wait, forget);
    fp_error_unhold(&h, FABPOOL_OK);
    return chain;
}

void fp_pending_recycle(fp_retire *r, fp_rblock *chain)
{
    if (!chain)
        return;
    fp_lock(&r->lock);
    for (fp_rblock *b = chain, *n; b; b = n) {
        n = b->fnext;
        fp_rq_spare_block(r, b);
    }
    fp_unlock(&r->lock);
}


/* ------------------------------------------------------------ streams that use a block */

static size_t use_home(uint64_t ptr, size_t cap)
{
    return (size_t)(((ptr >> 6) * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

/* The slot of ptr, or the empty one where it would go (the table has one). */
static size_t use_slot(const fp_retire *r, uint64_t ptr)
{
    size_t m = r->uses_cap - 1, i = use_home(ptr, r->uses_cap);
    while (r->uses[i].ptr && r->uses[i].ptr != ptr)
        i = (i + 1) & m;
    return i;
}

static fp_ruse *use_find(fp_retire *r, uint64_t ptr)
{
    if (!r->uses_n)
        return NULL;
    fp_ruse *e = &r->uses[use_slot(r, ptr)];
    return e->ptr ? e : NULL;
}

/* Room for one more slot, the table kept at most half full: 0, or -1 without host memory. */
static int use_room(fp_retire *r)
{
    if ((r->uses_n + 1) * 2 <= r->uses_cap)
        return 0;
    size_t cap = r->uses_cap ? r->uses_cap * 2 : 16, old_cap = r->uses_cap;
    fp_ruse *n = fp_meta_alloc(r->meta, cap * sizeof *n), *old = r->uses;
    if (!n)
        return -1;
    memset(n, 0, cap * sizeof *n);
    r->uses = n;
    r->uses_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr)
            r->uses[use_slot(r, old[i].ptr)] = old[i];
    fp_meta_free(r->meta, old, old_cap * sizeof *old);
    return 0;
}

/* Empties slot i, moving back the slots after it that would no longer be
 * found (so the table needs no tombstones). */
static void use_remove(fp_retire *r, size_t i)
{
    FP_ARRAY_FREE(r->meta, r->uses[i].streams, r->uses[i].cap);
    size_t m = r->uses_cap - 1;
    for (size_t j = (i + 1) & m; r->uses[j].ptr; j = (j + 1) & m)
        if (((j - use_home(r->uses[j].ptr, r->uses_cap)) & m) >= ((j - i) & m)) {
            r->uses[i] = r->uses[j];
            i = j;
        }
    memset(&r->uses[i], 0, sizeof r->uses[i]);
    r->uses_n--;
    atomic_store_explicit(&r->used_blocks, r->uses_n, memory_order_relaxed);
}

fabpool_status fp_retire_use(fp_retire *r, uint64_t ptr, void *stream)
{
    fp_lock(&r->lock);
    fp_ruse *e = use_find(r, ptr);
    for (uint32_t k = 0; e && k < e->n; k++)
        if (e->streams[k] == stream) {
            fp_unlock(&r->lock);
            return FABPOOL_OK;
        }
    if (!e && use_room(r) == 0)
        e = &r->uses[use_slot(r, ptr)]; /* an empty slot: it stays empty until the stream is in */
    if (!e || FP_ARRAY_RESERVE(r->meta, e->streams, e->n, e->cap, e->n + 1, 2) != 0) {
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to record stream %p on the block at 0x%llx; nothing "
                        "changed", stream, (unsigned long long)ptr);
    }
    e->streams[e->n++] = stream;
    if (!e->ptr) {
        e->ptr = ptr;
        r->uses_n++;
        atomic_store_explicit(&r->used_blocks, r->uses_n, memory_order_relaxed);
    }
    fp_rq_bump(&r->records, (int64_t)1);
    fp_unlock(&r->lock);
    return FABPOOL_OK;
}

int fp_retire_used_locked(fp_retire *r, uint64_t ptr)
{
    fp_lock_assert_held(&r->lock);
    return use_find(r, ptr) != NULL;
}

int fp_retire_used(fp_retire *r, uint64_t ptr)
{
    fp_lock(&r->lock);
    int used = fp_retire_used_locked(r, ptr);
    fp_unlock(&r->lock);
    return used;
}

/* Used block b's tickets (room reserved): an event now on every stream recorded in e, then on the stream of
 * the free; where one cannot be recorded, the context synchronized instead (no ticket: every stream's work is
 * done).  Lock held.  On failure (the context, or that synchronize, refused) b holds no ticket: nothing is
 * known done. */
static fabpool_status used_events(fp_retire *r, const fp_ruse *e, int on_stream, void *stream, fp_rblock *b)
{
    CUcontext saved;
    fabpool_status st = FABPOOL_OK;
    if (fp_rq_ctx_enter(r, &saved, &st) != 0)
        return st;
    fp_msg_hold h; /* an event not recorded, where the synchronize worked, is no failure of the free's */
    fp_error_hold(&h);
    int synced = 0;
    for (uint32_t k = 0; k <= e->n && !synced; k++) {
        if (k < e->n ? on_stream && e->streams[k] == stream : !on_stream)
            continue;
        fp_rstream *rs = fp_rq_stream_get(r, k < e->n ? e->streams[k] : stream);
        if (rs) {
            rs->seq++;
            if (fp_rq_event_record(r, rs) == FABPOOL_OK) {
                rs->tickets++;
                b->uses.t[b->uses.n++] = (fp_rticket){rs, rs->seq};
                continue;
            }
            rs->seq--; /* nothing took the number */
        }
        /* a stream the program destroyed, or no host memory: every stream's work is done now */
        if ((st = fp_rq_sync_all(r)) != FABPOOL_OK)
            break; /* nothing is known done: the free is refused, the block still the caller's */
        synced = 1;
    }
    while ((synced || st != FABPOOL_OK) && b->uses.n)
        fp_rq_ticket_release(&b->uses.t[--b->uses.n]);
    fp_rq_ctx_leave(r, saved);
    return fp_error_unhold(&h, st);
}

fabpool_status fp_pending_free_used(fp_retire *r, uint64_t ptr, uint64_t usable, uint32_t cls, int on_stream,
                                    void *stream, int traced, int *queued)
{
    *queued = 0;
    fp_lock(&r->lock);
    fp_ruse *e = use_find(r, ptr);
    uint32_t others = 0;
    for (uint32_t k = 0; e && k < e->n; k++)
        others += !(on_stream && e->streams[k] == stream);
    if (!others) { /* nothing but the stream of the free: an ordinary free */
        if (e)
            use_remove(r, (size_t)(e - r->uses));
        fp_unlock(&r->lock);
        return FABPOOL_OK;
    }
    uint32_t want = others + (on_stream != 0);
    fp_rblock *b = r->spare;
    if (b)
        r->spare = b->cnext;
    else
        b = fp_meta_alloc(r->meta, sizeof *b);
    if (b)
        memset(b, 0, sizeof *b);
    if (!b || FP_ARRAY_RESERVE(r->meta, b->uses.t, 0, b->uses.cap, want, want) != 0) {
        if (b)
            fp_rq_spare_block(r, b);
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to queue the block at 0x%llx, freed while %u other "
                        "stream%s use it", (unsigned long long)ptr, others, others == 1 ? "" : "s");
    }
    fabpool_status st = used_events(r, e, on_stream, stream, b);
    if (st != FABPOOL_OK) {
        FP_ARRAY_FREE(r->meta, b->uses.t, b->uses.cap);
        fp_rq_spare_block(r, b);
        fp_unlock(&r->lock);
        return st;
    }
    b->ptr = ptr;
    b->usable = usable;
    b->cls = cls;
    b->traced = (uint8_t)(traced != 0);
    b->fnext = r->used;
    r->used = b;
    fp_rq_bump(&r->pending_blocks, (int64_t)1);
    fp_rq_bump(&r->pending_bytes, (int64_t)usable);
    fp_rq_bump(&r->used_frees, (int64_t)1);
    if (on_stream)
        fp_rq_bump(&r->frees, (int64_t)1);
    use_remove(r, (size_t)(e - r->uses));
    *queued = 1;
    fp_unlock(&r->lock);
    return FABPOOL_OK;
}
