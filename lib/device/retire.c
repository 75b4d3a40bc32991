/* retire.c - the retirement queue (retire.h): per-stream records of blocks
 * freed on a stream and of the events that say when the GPU is done with
 * them and with retired buffer chunks. */
#include <string.h>

#include "array.h"
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
    CUcontext saved = NULL;
    int switched = r->n_streams || r->n_spare_evs;
    if (switched && FP_CU(r->calls, cuCtxGetCurrent, &saved) == CUDA_SUCCESS && saved != r->ctx)
        FP_CU(r->calls, cuCtxSetCurrent, r->ctx);
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
    if (switched && saved != r->ctx)
        FP_CU(r->calls, cuCtxSetCurrent, saved);
    fp_lock_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}

/* The counters are written under the queue's lock only: a plain store (no
 * locked read-modify-write) is enough; readers load them without the lock. */
static inline uint64_t bump(_Atomic uint64_t *c, int64_t d)
{
    uint64_t v = atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d;
    atomic_store_explicit(c, v, memory_order_relaxed);
    return v;
}

/* ------------------------------------------------------------ records */

static fp_rstream *stream_find(fp_retire *r, void *stream)
{
    if (r->last && r->last->stream == stream)
        return r->last;
    for (uint32_t i = 0; i < r->n_streams; i++)
        if (r->streams[i]->stream == stream)
            return r->last = r->streams[i];
    return NULL;
}

static fp_rstream *stream_get(fp_retire *r, void *stream)
{
    fp_rstream *rs = stream_find(r, stream);
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

static void forget_idle(fp_retire *r)
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

static void unlink_block(fp_rstream *rs, fp_rblock *b)
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

static void spare_block(fp_retire *r, fp_rblock *b)
{
    b->cnext = r->spare;
    r->spare = b;
}

/* ------------------------------------------------------------ events */

static int ctx_enter(fp_retire *r, CUcontext *saved, fabpool_status *st)
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

static void ctx_leave(fp_retire *r, CUcontext saved)
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
static fabpool_status event_record(fp_retire *r, fp_rstream *rs)
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
    bump(&r->events_recorded, (int64_t)1);
    return FABPOOL_OK;
}

/* Waits for the whole context: every stream's work so far is done.  Used
 * where an event cannot be made, recorded or asked about (a stream the
 * program destroyed).  Context current. */
static void sync_all(fp_retire *r)
{
    bump(&r->syncs, (int64_t)1);
    CUresult res = FP_CU(r->calls, cuCtxSynchronize);
    if (res != CUDA_SUCCESS) /* a broken context: nothing more can be waited for */
        fp_drv_error(res, "cuCtxSynchronize", "waiting for device %d's work before reusing blocks freed on a stream",
                     r->device);
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        for (uint32_t k = rs->ev_head; k < rs->n_evs; k++)
            event_spare(r, rs->evs[k].ev);
        rs->ev_head = rs->n_evs = 0;
        rs->done = rs->recorded = rs->seq;
        rs->fresh_blocks = rs->fresh_bytes = 0;
    }
}

/* Moves rs->done on past the events that have completed (wait: up to seq
 * `until`, waiting).  1: done >= until; 0: not yet; -1: the driver failed
 * (*st says how; the event stays). */
static int advance(fp_retire *r, fp_rstream *rs, uint64_t until, int wait, fabpool_status *st)
{
    while (rs->done < until && rs->ev_head < rs->n_evs) {
        fp_revent *e = &rs->evs[rs->ev_head];
        bump(&r->event_queries, (int64_t)1);
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

/* ------------------------------------------------------------ blocks */

fabpool_status fp_retire_free(fp_retire *r, void *stream, uint64_t ptr, uint64_t usable, uint32_t cls, int *poll)
{
    *poll = 0;
    fp_lock(&r->lock);
    fp_rstream *rs = stream_get(r, stream);
    fp_rblock *b = r->spare;
    if (b)
        r->spare = b->cnext;
    else if (rs)
        b = fp_meta_alloc(r->meta, sizeof *b);
    if (!rs || !b) {
        if (b)
            spare_block(r, b);
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
    uint64_t nb = bump(&r->pending_blocks, (int64_t)1);
    uint64_t nbytes = bump(&r->pending_bytes, (int64_t)usable);
    bump(&r->frees, (int64_t)1);
    if (rs->fresh_blocks >= FP_RETIRE_BATCH_BLOCKS || rs->fresh_bytes >= FP_RETIRE_BATCH_BYTES) {
        /* one event for the batch, so that the rest of the pool can have it soon */
        CUcontext saved;
        if (ctx_enter(r, &saved, NULL) == 0) {
            if (event_record(r, rs) != FABPOOL_OK)
                sync_all(r);
            ctx_leave(r, saved);
        }
        fp_error_clear();
    }
    *poll = nb > FP_RETIRE_POLL_BLOCKS || nbytes > FP_RETIRE_POLL_BYTES;
    fp_unlock(&r->lock);
    return FABPOOL_OK;
}

uint64_t fp_retire_take(fp_retire *r, void *stream, uint32_t cls, uint64_t need, uint64_t max, uint64_t *usable)
{
    fp_lock(&r->lock);
    fp_rstream *rs = stream_find(r, stream);
    fp_rblock *b = rs ? rs->cls[cls] : NULL;
    if (b && cls == FP_RETIRE_LARGE) {
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
    unlink_block(rs, b);
    uint64_t ptr = b->ptr;
    *usable = b->usable;
    bump(&r->pending_blocks, -(int64_t)1);
    bump(&r->pending_bytes, -(int64_t)b->usable);
    bump(&r->reuse_same, (int64_t)1);
    spare_block(r, b);
    fp_unlock(&r->lock);
    return ptr;
}

/* A ticket no longer held (lock held). */
static void ticket_release(fp_rticket *t)
{
    if (t->rs && t->rs->tickets)
        t->rs->tickets--;
    t->rs = NULL;
    t->seq = 0;
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
            int done = t->rs->done >= t->seq ? 1 : advance(r, t->rs, t->seq, wait, &st);
            if (done < 0) {
                sync_all(r);
                done = 1;
            }
            if (!done)
                break;
            ticket_release(t);
            b->uses.n--;
        }
        if (b->uses.n) {
            at = &b->fnext;
            continue;
        }
        FP_ARRAY_FREE(r->meta, b->uses.t, b->uses.cap);
        *at = b->fnext;
        b->fnext = NULL;
        bump(&r->pending_blocks, -(int64_t)1);
        bump(&r->pending_bytes, -(int64_t)b->usable);
        **tail = b;
        *tail = &b->fnext;
    }
}

fp_rblock *fp_retire_poll(fp_retire *r, int wait, int forget)
{
    fp_lock(&r->lock);
    if (!r->n_streams && !r->used) {
        fp_unlock(&r->lock);
        return NULL;
    }
    fp_rblock *chain = NULL, **tail = &chain;
    CUcontext saved;
    if (ctx_enter(r, &saved, NULL) != 0) {
        fp_unlock(&r->lock);
        return NULL;
    }
    /* one event on every stream whose frees no event covers */
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        if (rs->blocks && rs->seq > rs->recorded && rs->seq > rs->done && event_record(r, rs) != FABPOOL_OK) {
            sync_all(r);
            break;
        }
    }
    for (uint32_t i = 0; i < r->n_streams; i++) {
        fp_rstream *rs = r->streams[i];
        if (!rs->blocks)
            continue;
        fabpool_status st = FABPOOL_OK;
        uint64_t until = wait ? rs->recorded : rs->tail ? rs->tail->seq : 0;
        if (advance(r, rs, until, wait, &st) < 0) {
            sync_all(r);
            i = (uint32_t)-1; /* every stream is done now: walk them again */
            continue;
        }
        while (rs->head && rs->head->seq <= rs->done) {
            fp_rblock *b = rs->head;
            unlink_block(rs, b);
            bump(&r->pending_blocks, -(int64_t)1);
            bump(&r->pending_bytes, -(int64_t)b->usable);
            *tail = b;
            tail = &b->fnext;
        }
    }
    poll_used(r, wait, &tail);
    if (forget)
        forget_idle(r);
    ctx_leave(r, saved);
    fp_unlock(&r->lock);
    fp_error_clear();
    return chain;
}

void fp_retire_recycle(fp_retire *r, fp_rblock *chain)
{
    if (!chain)
        return;
    fp_lock(&r->lock);
    for (fp_rblock *b = chain, *n; b; b = n) {
        n = b->fnext;
        spare_block(r, b);
    }
    fp_unlock(&r->lock);
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

fabpool_status fp_retire_disown(fp_retire *r)
{
    int m = FP_OWNER_ON;
    if (!atomic_compare_exchange_strong(&r->owner_mode, &m, FP_OWNER_OFF) && m != FP_OWNER_OFF)
        return FABPOOL_OK; /* no owner yet: nothing to wait for */
    return fp_retire_fence(r);
}

fabpool_status fp_retire_fence(fp_retire *r)
{
    if (atomic_load(&r->owner_seq) == atomic_load(&r->owner_fenced))
        return FABPOOL_OK;
    fabpool_status st = FABPOOL_OK;
    fp_lock(&r->lock);
    uint64_t n = atomic_load(&r->owner_seq);
    if (n != atomic_load(&r->owner_fenced)) {
        CUcontext saved;
        if (ctx_enter(r, &saved, &st) == 0) {
            fp_rstream *rs = stream_get(r, r->owner);
            int done = 0;
            if (rs) {
                rs->seq++; /* a number for the fence: the event covers it and every free before */
                fabpool_status es = event_record(r, rs);
                if (es == FABPOOL_OK)
                    done = advance(r, rs, rs->seq, 1, &es) == 1;
            }
            if (!done) /* no record, no event, or its wait failed: the whole context, as for a destroyed stream */
                sync_all(r);
            ctx_leave(r, saved);
            atomic_store(&r->owner_fenced, n);
            bump(&r->fences, (int64_t)1);
        }
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
    fp_rstream *rs = stream_get(r, stream);
    if (!rs) {
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the record of stream %p", stream);
    }
    CUcontext saved;
    fabpool_status st = FABPOOL_OK;
    if (ctx_enter(r, &saved, &st) != 0) {
        fp_unlock(&r->lock);
        return st;
    }
    rs->seq++;
    st = event_record(r, rs);
    if (st == FABPOOL_OK) {
        rs->tickets += holders;
        t->rs = rs;
        t->seq = rs->seq;
    } else {
        rs->seq--; /* nothing took the number */
    }
    ctx_leave(r, saved);
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
        if (ctx_enter(r, &saved, st) != 0) {
            done = -1;
        } else {
            done = advance(r, rs, t->seq, wait, st);
            ctx_leave(r, saved);
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
    ticket_release(t);
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
    bump(&r->records, (int64_t)1);
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

fabpool_status fp_retire_free_used(fp_retire *r, uint64_t ptr, uint64_t usable, uint32_t cls, int on_stream,
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
            spare_block(r, b);
        fp_unlock(&r->lock);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to queue the block at 0x%llx, freed while %u other "
                        "stream%s use it", (unsigned long long)ptr, others, others == 1 ? "" : "s");
    }
    CUcontext saved;
    fabpool_status st = FABPOOL_OK;
    if (ctx_enter(r, &saved, &st) != 0) {
        FP_ARRAY_FREE(r->meta, b->uses.t, b->uses.cap);
        spare_block(r, b);
        fp_unlock(&r->lock);
        return st;
    }
    /* an event now on every recorded stream, then on the stream of the free */
    int synced = 0;
    for (uint32_t k = 0; k <= e->n && !synced; k++) {
        if (k < e->n ? on_stream && e->streams[k] == stream : !on_stream)
            continue;
        fp_rstream *rs = stream_get(r, k < e->n ? e->streams[k] : stream);
        if (rs) {
            rs->seq++;
            if (event_record(r, rs) == FABPOOL_OK) {
                rs->tickets++;
                b->uses.t[b->uses.n++] = (fp_rticket){rs, rs->seq};
                continue;
            }
            rs->seq--; /* nothing took the number */
        }
        sync_all(r); /* a stream the program destroyed, or no host memory: every stream's work is done now */
        synced = 1;
    }
    while (synced && b->uses.n)
        ticket_release(&b->uses.t[--b->uses.n]);
    ctx_leave(r, saved);
    b->ptr = ptr;
    b->usable = usable;
    b->cls = cls;
    b->traced = (uint8_t)(traced != 0);
    b->fnext = r->used;
    r->used = b;
    bump(&r->pending_blocks, (int64_t)1);
    bump(&r->pending_bytes, (int64_t)usable);
    bump(&r->used_frees, (int64_t)1);
    if (on_stream)
        bump(&r->frees, (int64_t)1);
    use_remove(r, (size_t)(e - r->uses));
    *queued = 1;
    fp_unlock(&r->lock);
    fp_error_clear();
    return FABPOOL_OK;
}
