/* retire.c - the stream queue (retire.h): its per-stream records and the
 * events that say when the GPU is done with memory, the owner stream, and
 * the tickets of retired buffer chunks.  The stream-pending blocks that wait
 * on the same records are pending.c's. */
#include <string.h>

#include "array.h"
#include "counter.h"
#include "error.h"
#include "retire.h"

fabpool_status fp_retire_init(fp_retire *r, fp_meta *meta, fp_drv_counters *calls, CUcontext ctx, int device,
                              int owner)
{
    memset(r, 0, sizeof *r);
    atomic_store(&r->owner_mode, owner ? FP_OWNER_NONE : FP_OWNER_OFF);
    fp_lock_init(&r->lock, FP_LOCK_RETIRE, 0, "retire");
    r->meta = meta;
    r->calls = calls;
    r->ctx = ctx;
    r->device = device;
    return FABPOOL_OK;
}

static void stream_free(fp_retire *r, fp_rstream *rs)
{
    for (uint32_t i = rs->ev_head; i < rs->n_evs; i++)
        FP_CU(r->calls, cuEventDestroy, rs->evs[i].ev);
    fp_meta_free(r->meta, rs->evs, rs->cap_evs * sizeof *rs->evs);
    fp_meta_free(r->meta, rs, sizeof *rs);
}

void fp_retire_destroy(fp_retire *r)
{
    if (!r->meta)
        return;
    /* the events go in the pool's context; where it cannot be made current they go all the same, and the
     * caller's context stays: only a context that was read is made current again */
    CUcontext saved = r->ctx;
    if (r->n_streams || r->n_spare_evs)
        (void)fp_rq_ctx_enter(r, &saved, NULL);
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        /* blocks still listed (a drain that failed): forget their records */
        for (fp_rblock *b = rs->head, *n; b; b = n) {
            n = b->fnext;
            fp_meta_free(r->meta, b, sizeof *b);
        }
        stream_free(r, rs);
    }
    fp_meta_free(r->meta, r->streams, r->cap_streams * sizeof *r->streams);
    for (fp_rblock *b = r->spare, *n; b; b = n) {
        n = b->cnext;
        fp_meta_free(r->meta, b, sizeof *b);
    }
    for (fp_rblock *b = r->used, *n; b; b = n) { /* a drain that failed: forget them */
        n = b->fnext;
        FP_ARRAY_FREE(r->meta, b->uses.t, b->uses.cap);
        fp_meta_free(r->meta, b, sizeof *b);
    }
    for (size_t i = 0; i < r->uses_cap; i++) /* blocks still live with recorded streams */
        FP_ARRAY_FREE(r->meta, r->uses[i].streams, r->uses[i].cap);
    fp_meta_free(r->meta, r->uses, r->uses_cap * sizeof *r->uses);
    for (uint32_t i = 0; i < r->n_spare_evs; i++)
        FP_CU(r->calls, cuEventDestroy, r->spare_evs[i]);
    fp_meta_free(r->meta, r->spare_evs, r->cap_spare_evs * sizeof *r->spare_evs);
    fp_rq_ctx_leave(r, saved);
    fp_lock_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}


void fp_retire_read_counters(const fp_retire *src, fp_retire_counters *c)
{
    FP_RETIRE_COUNTERS(FP_COUNTER_COPY)
}

/* ------------------------------------------------------------ records */

fp_rstream *fp_rq_stream_find(fp_retire *r, void *stream)
{
    if (r->last && r->last->stream == stream)
        return r->last;
    for (uint32_t i = 0; i < r->n_streams; i++)
        if (r->streams[i]->stream == stream)
            return r->last = r->streams[i];
    return NULL;
}

fp_rstream *fp_rq_stream_get(fp_retire *r, void *stream)
{
    fp_rstream *rs = fp_rq_stream_find(r, stream);
    if (rs)
        return rs;
    if (r->n_streams == r->cap_streams) {
        uint32_t cap = r->cap_streams ? r->cap_streams * 2 : 8;
        fp_rstream **n = fp_meta_alloc(r->meta, cap * sizeof *n);
        if (!n)
            return NULL;
        if (r->n_streams)
            memcpy(n, r->streams, r->n_streams * sizeof *n);
        fp_meta_free(r->meta, r->streams, r->cap_streams * sizeof *n);
        r->streams = n;
        r->cap_streams = cap;
    }
    rs = fp_meta_alloc(r->meta, sizeof *rs);
    if (!rs)
        return NULL;
    rs->stream = stream;
    r->streams[r->n_streams++] = rs;
    atomic_store(&r->n_streams_now, r->n_streams);
    return r->last = rs;
}

static int stream_idle(const fp_rstream *rs) { return !rs->blocks && rs->ev_head == rs->n_evs && !rs->tickets; }

void fp_rq_forget_idle(fp_retire *r)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        if (stream_idle(rs)) {
            if (r->last == rs)
                r->last = NULL;
            stream_free(r, rs);
            continue;
        }
        r->streams[w++] = rs;
    }
    r->n_streams = w;
    atomic_store(&r->n_streams_now, w);
}

void fp_rq_unlink_block(fp_rstream *rs, fp_rblock *b)
{
    if (b->cprev)
        b->cprev->cnext = b->cnext;
    else
        rs->cls[b->cls] = b->cnext;
    if (b->cnext)
        b->cnext->cprev = b->cprev;
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        rs->head = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    else
        rs->tail = b->fprev;
    b->cnext = b->cprev = b->fnext = b->fprev = NULL;
    if (b->seq > rs->recorded) {
        rs->fresh_blocks -= rs->fresh_blocks ? 1 : 0;
        rs->fresh_bytes -= rs->fresh_bytes >= b->usable ? b->usable : rs->fresh_bytes;
    }
    rs->blocks--;
}

void fp_rq_spare_block(fp_retire *r, fp_rblock *b)
{
    b->cnext = r->spare;
    r->spare = b;
}

/* ------------------------------------------------------------ events */

int fp_rq_ctx_enter(fp_retire *r, CUcontext *saved, fabpool_status *st)
{
    *saved = NULL;
    const char *call = "cuCtxGetCurrent";
    CUresult res = FP_CU(r->calls, cuCtxGetCurrent, saved);
    if (res == CUDA_SUCCESS && *saved != r->ctx) {
        call = "cuCtxSetCurrent";
        res = FP_CU(r->calls, cuCtxSetCurrent, r->ctx);
    }
    if (res != CUDA_SUCCESS) {
        fabpool_status s = fp_drv_error(res, call, "making device %d's context current to record or ask about an "
                                        "event", r->device);
        if (st)
            *st = s;
        *saved = r->ctx;
        return -1;
    }
    return 0;
}

void fp_rq_ctx_leave(fp_retire *r, CUcontext saved)
{
    if (saved != r->ctx)
        FP_CU(r->calls, cuCtxSetCurrent, saved);
}

static void event_spare(fp_retire *r, CUevent ev)
{
    if (r->n_spare_evs == r->cap_spare_evs) {
        uint32_t cap = r->cap_spare_evs ? r->cap_spare_evs * 2 : 16;
        CUevent *n = fp_meta_alloc(r->meta, cap * sizeof *n);
        if (!n) {
            FP_CU(r->calls, cuEventDestroy, ev);
            return;
        }
        if (r->n_spare_evs)
            memcpy(n, r->spare_evs, r->n_spare_evs * sizeof *n);
        fp_meta_free(r->meta, r->spare_evs, r->cap_spare_evs * sizeof *n);
        r->spare_evs = n;
        r->cap_spare_evs = cap;
    }
    r->spare_evs[r->n_spare_evs++] = ev;
}

/* Appends (ev, seq) to rs's events.  Nonzero without host memory. */
static int event_push(fp_retire *r, fp_rstream *rs, CUevent ev, uint64_t seq)
{
    if (rs->ev_head && rs->ev_head == rs->n_evs)
        rs->ev_head = rs->n_evs = 0;
    if (rs->n_evs == rs->cap_evs) {
        uint32_t live = rs->n_evs - rs->ev_head;
        uint32_t cap = live * 2 >= rs->cap_evs ? (rs->cap_evs ? rs->cap_evs * 2 : 4) : rs->cap_evs;
        fp_revent *n = fp_meta_alloc(r->meta, cap * sizeof *n);
        if (!n)
            return -1;
        if (live)
            memcpy(n, rs->evs + rs->ev_head, live * sizeof *n);
        fp_meta_free(r->meta, rs->evs, rs->cap_evs * sizeof *n);
        rs->evs = n;
        rs->cap_evs = cap;
        rs->ev_head = 0;
        rs->n_evs = live;
    }
    rs->evs[rs->n_evs++] = (fp_revent){ev, seq};
    return 0;
}

/* An event recorded on rs now, covering rs->seq.  Context current.  On
 * failure the message names the call and nothing is recorded. */
fabpool_status fp_rq_event_record(fp_retire *r, fp_rstream *rs)
{
    CUevent ev = NULL;
    if (r->n_spare_evs) {
        ev = r->spare_evs[--r->n_spare_evs];
    } else {
        CUresult res = FP_CU(r->calls, cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
        if (res != CUDA_SUCCESS)
            return fp_drv_error(res, "cuEventCreate", "creating an event to record on stream %p", rs->stream);
    }
    CUresult res = FP_CU(r->calls, cuEventRecord, ev, (CUstream)rs->stream);
    if (res != CUDA_SUCCESS) {
        event_spare(r, ev);
        return fp_drv_error(res, "cuEventRecord", "recording an event on stream %p", rs->stream);
    }
    if (event_push(r, rs, ev, rs->seq) != 0) {
        event_spare(r, ev);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of events of stream %p", rs->stream);
    }
    rs->recorded = rs->seq;
    rs->fresh_blocks = rs->fresh_bytes = 0;
    fp_rq_bump(&r->events_recorded, (int64_t)1);
    return FABPOOL_OK;
}

/* Waits for the whole context: every stream's work so far is done.  Used
 * where an event cannot be made, recorded or asked about (a stream the
 * program destroyed).  Context current.  Where cuCtxSynchronize fails too,
 * nothing is known done: every stream's records stay as they were (its
 * blocks pending, its tickets held), and the status says why. */
fabpool_status fp_rq_sync_all(fp_retire *r)
{
    fp_rq_bump(&r->syncs, (int64_t)1);
    CUresult res = FP_CU(r->calls, cuCtxSynchronize);
    if (res != CUDA_SUCCESS)
        return fp_drv_error(res, "cuCtxSynchronize", "waiting for device %d's work before reusing or unmapping "
                            "memory freed on a stream (it stays pending)", r->device);
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        for (uint32_t k = rs->ev_head; k < rs->n_evs; k++)
            event_spare(r, rs->evs[k].ev);
        rs->ev_head = rs->n_evs = 0;
        rs->done = rs->recorded = rs->seq;
        rs->fresh_blocks = rs->fresh_bytes = 0;
    }
    return FABPOOL_OK;
}

/* Moves rs->done on past the events that have completed (wait: up to seq
 * `until`, waiting).  1: done >= until; 0: not yet; -1: the driver failed
 * (*st says how; the event stays). */
int fp_rq_advance(fp_retire *r, fp_rstream *rs, uint64_t until, int wait, fabpool_status *st)
{
    while (rs->done < until && rs->ev_head < rs->n_evs) {
        fp_revent *e = &rs->evs[rs->ev_head];
        fp_rq_bump(&r->event_queries, (int64_t)1);
        CUresult res = wait ? FP_CU(r->calls, cuEventSynchronize, e->ev) : FP_CU(r->calls, cuEventQuery, e->ev);
        if (res == CUDA_ERROR_NOT_READY)
            return 0;
        if (res != CUDA_SUCCESS) {
            *st = fp_drv_error(res, wait ? "cuEventSynchronize" : "cuEventQuery",
                               "waiting for the GPU work on stream %p before its memory is reused or unmapped",
                               rs->stream);
            return -1;
        }
        if (e->seq > rs->done)
            rs->done = e->seq;
        event_spare(r, e->ev);
        rs->ev_head++;
    }
    return rs->done >= until;
}


/* A ticket no longer held (lock held). */
void fp_rq_ticket_release(fp_rticket *t)
{
    if (t->rs && t->rs->tickets)
        t->rs->tickets--;
    t->rs = NULL;
    t->seq = 0;
}

/* ------------------------------------------------------------ the owner stream */

int fp_retire_owner_claim(fp_retire *r, void *stream)
{
    int m = atomic_load_explicit(&r->owner_mode, memory_order_acquire);
    if (m == FP_OWNER_NONE) {
        fp_lock(&r->lock);
        if (atomic_load(&r->owner_mode) == FP_OWNER_NONE) {
            r->owner = stream;
            atomic_store_explicit(&r->owner_mode, FP_OWNER_ON, memory_order_release);
        }
        fp_unlock(&r->lock);
        m = atomic_load_explicit(&r->owner_mode, memory_order_acquire);
    }
    return m == FP_OWNER_ON && r->owner == stream;
}

int fp_retire_owner_free(fp_retire *r)
{
    /* counted before the mode is read: a disown that ends the mode after
     * this read fences after this count, so it waits for this block's work */
    atomic_fetch_add(&r->owner_seq, 1);
    return atomic_load(&r->owner_mode) == FP_OWNER_ON;
}

int fp_retire_owner_unclaim(fp_retire *r, void *stream, uint64_t seq)
{
    int undone = 0, on = FP_OWNER_ON;
    fp_lock(&r->lock); /* no claim comes between: a claim takes the lock to leave FP_OWNER_NONE */
    if (r->owner == stream && atomic_compare_exchange_strong(&r->owner_mode, &on, FP_OWNER_NONE)) {
        /* an owner's free counted after the store reads the mode off and queues its block; one counted before
         * it may have been freed at once: then the mode goes back on.  owner_seq stays (a fence it asks for
         * waits for nothing more) */
        if (atomic_load(&r->owner_seq) == seq)
            undone = 1;
        else
            atomic_store(&r->owner_mode, FP_OWNER_ON);
    }
    fp_unlock(&r->lock);
    return undone;
}

void fp_retire_owner_reown(fp_retire *r, void *owner)
{
    int off = FP_OWNER_OFF;
    fp_lock(&r->lock);
    if (r->owner == owner)
        atomic_compare_exchange_strong(&r->owner_mode, &off, FP_OWNER_ON);
    fp_unlock(&r->lock);
}

fabpool_status fp_retire_disown(fp_retire *r)
{
    int m = FP_OWNER_ON;
    if (!atomic_compare_exchange_strong(&r->owner_mode, &m, FP_OWNER_OFF) && m != FP_OWNER_OFF)
        return FABPOOL_OK; /* no owner yet: nothing to wait for */
    fabpool_status st = fp_retire_fence(r);
    if (st != FABPOOL_OK && m == FP_OWNER_ON) {
        /* the owner's blocks freed at once are not known safe yet: the owner mode stays, so that the caller's
         * refusal changes nothing and the next caller that ends it waits again (with the mode off, nothing
         * else would) */
        int off = FP_OWNER_OFF;
        atomic_compare_exchange_strong(&r->owner_mode, &off, FP_OWNER_ON);
    }
    return st;
}

fabpool_status fp_retire_owner_leave(fp_retire *r, int *disowned)
{
    *disowned = fp_retire_owned(r);
    return *disowned ? fp_retire_disown(r) : fp_retire_fence(r);
}

fabpool_status fp_retire_owner_close(fp_retire *r)
{
    int none = FP_OWNER_NONE, disowned;
    fp_lock(&r->lock); /* as a claim leaves FP_OWNER_NONE: none can come between its read and its store */
    atomic_compare_exchange_strong(&r->owner_mode, &none, FP_OWNER_OFF);
    fp_unlock(&r->lock);
    return fp_retire_owner_leave(r, &disowned);
}

fabpool_status fp_retire_fence(fp_retire *r)
{
    if (atomic_load(&r->owner_seq) == atomic_load(&r->owner_fenced))
        return FABPOOL_OK;
    fabpool_status st = FABPOOL_OK;
    fp_lock(&r->lock);
    uint64_t n = atomic_load(&r->owner_seq);
    if (n != atomic_load(&r->owner_fenced)) {
        fp_msg_hold h; /* an event that failed, where the context's wait did not, is no failure of the fence's */
        fp_error_hold(&h);
        CUcontext saved;
        if (fp_rq_ctx_enter(r, &saved, &st) == 0) {
            fp_rstream *rs = fp_rq_stream_get(r, r->owner);
            int done = 0;
            if (rs) {
                rs->seq++; /* a number for the fence: the event covers it and every free before */
                fabpool_status es = fp_rq_event_record(r, rs);
                if (es == FABPOOL_OK)
                    done = fp_rq_advance(r, rs, rs->seq, 1, &es) == 1;
            }
            /* no record, no event, or its wait failed: the whole context, as for a destroyed stream; where that
             * fails too, the fence is not done (the owner's frees are not known safe: the next caller fences) */
            if (!done)
                st = fp_rq_sync_all(r);
            fp_rq_ctx_leave(r, saved);
            if (st == FABPOOL_OK) {
                atomic_store(&r->owner_fenced, n);
                fp_rq_bump(&r->fences, (int64_t)1);
            }
        }
        fp_error_unhold(&h, st);
    }
    fp_unlock(&r->lock);
    return st;
}

/* ------------------------------------------------------------ buffer chunks */

fabpool_status fp_retire_mark(fp_retire *r, void *stream, uint32_t holders, fp_rticket *t)
{
    t->rs = NULL;
    t->seq = 0;
    fp_lock(&r->lock);
    fp_rstream *rs = fp_rq_stream_get(r, stream);
    if (!rs) {
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the record of stream %p", stream);
    }
    CUcontext saved;
    fabpool_status st = FABPOOL_OK;
    if (fp_rq_ctx_enter(r, &saved, &st) != 0) {
        fp_unlock(&r->lock);
        return st;
    }
    rs->seq++;
    st = fp_rq_event_record(r, rs);
    if (st == FABPOOL_OK) {
        rs->tickets += holders;
        t->rs = rs;
        t->seq = rs->seq;
    } else {
        rs->seq--; /* nothing took the number */
    }
    fp_rq_ctx_leave(r, saved);
    fp_unlock(&r->lock);
    return st;
}

int fp_retire_ticket_done(fp_retire *r, const fp_rticket *t, int wait, fabpool_status *st)
{
    if (!t->rs)
        return 1;
    fp_lock(&r->lock);
    fp_rstream *rs = t->rs;
    int done = rs->done >= t->seq;
    if (!done) {
        CUcontext saved;
        if (fp_rq_ctx_enter(r, &saved, st) != 0) {
            done = -1;
        } else {
            done = fp_rq_advance(r, rs, t->seq, wait, st);
            fp_rq_ctx_leave(r, saved);
        }
    }
    fp_unlock(&r->lock);
    return done;
}

void fp_retire_ticket_drop(fp_retire *r, fp_rticket *t)
{
    if (!t->rs)
        return;
    fp_lock(&r->lock);
    fp_rq_ticket_release(t);
    fp_unlock(&r->lock);
}

/* ------------------------------------------------------------ tickets of several streams */

int fp_retire_waits_reserve(fp_retire *r, fp_rwaits *w)
{
    return FP_ARRAY_RESERVE(r->meta, w->t, w->n, w->cap, w->n + 1, 2);
}

void fp_retire_waits_add(fp_retire *r, fp_rwaits *w, fp_rticket t)
{
    if (!t.rs)
        return;
    for (uint32_t i = 0; i < w->n; i++)
        if (w->t[i].rs == t.rs) {
            fp_retire_ticket_drop(r, &w->t[i]);
            w->t[i] = t;
            return;
        }
    w->t[w->n++] = t;
}

int fp_retire_waits_ok(const fp_rwaits *w, uint32_t *n, size_t *room)
{
    *n = w->n;
    *room = w->cap;
    int ok = w->n <= w->cap && (w->t != NULL) == (w->cap != 0);
    for (uint32_t k = 0; ok && k < w->n; k++)
        for (uint32_t m = 0; m <= k && ok; m++)
            ok = w->t[k].rs && (m == k || w->t[m].rs != w->t[k].rs);
    return ok;
}

int fp_retire_waits_done(fp_retire *r, fp_rwaits *w, int wait, fabpool_status *st)
{
    for (uint32_t i = 0; i < w->n;) {
        int done = fp_retire_ticket_done(r, &w->t[i], wait, st);
        if (done < 0)
            return -1;
        if (!done) {
            i++;
            continue;
        }
        fp_retire_ticket_drop(r, &w->t[i]);
        w->t[i] = w->t[--w->n];
    }
    if (w->n)
        return 0;
    FP_ARRAY_FREE(r->meta, w->t, w->cap);
    return 1;
}

void fp_retire_waits_drop(fp_retire *r, fp_rwaits *w)
{
    for (uint32_t i = 0; i < w->n; i++)
        fp_retire_ticket_drop(r, &w->t[i]);
    w->n = 0;
    FP_ARRAY_FREE(r->meta, w->t, w->cap);
}

