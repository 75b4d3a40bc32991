/* retire.h - the stream queue: memory that waits for GPU work.
 *
 * Two kinds of memory wait here, on the same per-stream records, under two
 * names so that neither is taken for the other:
 *  - stream-pending blocks ("pending", pending.h / pending.c): blocks freed
 *    with fabpool_free_on_stream: each stream has lists of the
 *    blocks freed on it (by size class, and in free order).  An allocation
 *    on the same stream takes one back at once; the rest of the pool gets a
 *    block only once an event recorded on its stream after its free has
 *    completed (fp_pending_poll hands those back to the caller, who gives
 *    them to the pool);
 *  - retired buffer chunks ("retire", here and retire.c): chunks of
 *    growable buffers that a shrink on a stream retired: the
 *    shrink takes a ticket (fp_retire_mark: an event recorded now), the
 *    buffer's collect asks whether the ticket is done.
 *
 * Events: every free or mark on a stream S takes the next sequence number
 * of S.  An event recorded on S when S's number is n covers every free
 * numbered <= n, since the work on one stream completes in order.  So one
 * event per stream is enough for any number of frees, and it is recorded
 * lazily: when the pool needs memory (a miss of another stream, a trim, the
 * decay, an out-of-memory retry, collect, destroy) or after
 * FP_PENDING_BATCH_BLOCKS frees / FP_PENDING_BATCH_BYTES bytes on S.  Where an
 * event cannot be made or recorded (a stream the program destroyed), the
 * context is synchronized instead, which completes every stream; where the
 * driver refuses that too, nothing is taken for done (blocks stay pending,
 * buffer chunks retired, a fence undone) until a later call can tell.
 *
 * A pending block stays a live block for the rest of the pool (its slab
 * flag says FP_FREEFLAG_PENDING, a large block FP_LARGE_PENDING), so no trim,
 * decay, chunk trade or out-of-memory retry can unmap it.
 *
 * The owner stream (docs/design.md, "Stream-ordered free").  Most programs
 * allocate on one stream only (PyTorch's default stream).  The first stream
 * that allocates or frees through the stream pair becomes the pool's owner
 * (unless the option stream_owner is off); a block freed on the owner is
 * freed into the pool at once, with no queue, so any allocation on the owner
 * may reuse its memory, whatever its size, as PyTorch's caching allocator
 * reuses a stream's blocks.  Memory freed that way may still be in use by
 * the owner's queued work, so two things wait for that work first (a fence:
 * an event recorded on the owner now, and waited for), but only while the
 * owner has freed something since the last fence:
 *  - any unmap of a chunk (fp_chunk_unmap calls fp_retire_fence), so trim,
 *    decay, trades, sleep and the out-of-memory retry never unmap memory
 *    the GPU still uses;
 *  - the first allocation that is not the owner's (fabpool_alloc, another
 *    stream; a free on another stream): it ends the owner mode for good
 *    (fp_retire_disown), and from then on every stream uses the queue.
 *
 * Locking: one mutex (fp_retire.lock), a leaf below the pool lock: it may
 * be taken with the pool lock held, never the reverse, and nothing else is
 * taken under it.  Driver calls made under it: cuEventCreate/Record/Query/
 * Synchronize, cuCtxSynchronize and the context switch they need.
 * This file knows nothing of slabs or buffers: it stores pointers, sizes and
 * a class number, and hands blocks back to its caller. */
#ifndef FP_RETIRE_H
#define FP_RETIRE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "counter.h"
#include "driver.h"
#include "lock.h"
#include "fabpool.h"
#include "meta.h"
#include "sizeclass.h"

/* an event after this many frees / bytes freed on one stream without one */
#define FP_PENDING_BATCH_BLOCKS 256u
#define FP_PENDING_BATCH_BYTES (256ull << 20)
/* a poll of every stream on free, once this much is pending in all */
#define FP_PENDING_POLL_BLOCKS 4096u
#define FP_PENDING_POLL_BYTES (2ull << 30)
/* the list index of large blocks (above the slab classes) */
#define FP_PENDING_LARGE FP_NCLASS

typedef struct fp_rstream fp_rstream;

/* What a retired buffer chunk waits for: the event of seq on rs (rs NULL:
 * nothing, the work is done). */
typedef struct fp_rticket {
    fp_rstream *rs;
    uint64_t seq;
} fp_rticket;

/* The GPU work that may still use a piece of memory, on any number of
 * streams: a ticket of each, at most one a stream (a later ticket of a
 * stream covers an earlier one, its work completing in order).  The holder
 * (a buffer chunk) keeps it under its own lock; the tickets' records are the
 * queue's. */
typedef struct fp_rwaits {
    fp_rticket *t;
    uint32_t n;
    size_t cap;
} fp_rwaits;

/* A block freed on a stream, or freed while other streams use it. */
typedef struct fp_rblock {
    uint64_t ptr, usable, seq;
    uint32_t cls;                       /* slab class, or FP_PENDING_LARGE */
    uint8_t traced;                     /* its free is in the trace already (fabpool_free, the owner's free) */
    struct fp_rblock *cnext, *cprev;    /* the stream's list of its class (LIFO) */
    struct fp_rblock *fnext, *fprev;    /* the stream's FIFO, or the list of used blocks; also the chain
                                           fp_pending_poll hands back */
    fp_rstream *rs;                     /* NULL for a used block: it waits for `uses` instead */
    fp_rwaits uses;                     /* a used block: an event of each stream that used it, recorded at its free */
} fp_rblock;

/* The streams a live block is used on besides its own (fabpool_record_stream):
 * a slot of the queue's table, by address. */
typedef struct fp_ruse {
    uint64_t ptr;                       /* 0: an empty slot */
    void **streams;
    uint32_t n;
    size_t cap;
} fp_ruse;

typedef struct fp_revent {
    CUevent ev;
    uint64_t seq;                       /* covers every free numbered <= seq */
} fp_revent;

struct fp_rstream {
    void *stream;                       /* CUstream; NULL: the legacy default stream */
    uint64_t seq;                       /* frees and marks numbered so far */
    uint64_t recorded;                  /* the seq the last event recorded covers */
    uint64_t done;                      /* every free numbered <= done is safe */
    fp_revent *evs;                     /* recorded, not seen complete: evs[ev_head..n_evs) in order */
    uint32_t n_evs, cap_evs, ev_head;
    uint32_t tickets;                   /* buffer chunks waiting on this stream */
    uint64_t fresh_blocks, fresh_bytes; /* freed since the last event */
    uint64_t blocks;                    /* pending on this stream */
    fp_rblock *head, *tail;
    fp_rblock *cls[FP_NCLASS + 1];
};

/* The queue's counters that fp_retire_read_counters copies (counter.h; fabpool_counters, fabpool_stats),
 * read without the lock: blocks and bytes pending, the streams known now; frees,
 * those made at once on the owner (counted after the free), reuses on the same stream and after an event,
 * releases; events recorded and queried, syncs, fences that waited; fabpool_record_stream's records, the frees
 * of blocks other streams used, and the blocks in use by other streams (uses_n). */
#define FP_RETIRE_COUNTERS(X)                                                                                  \
    X(pending_blocks) X(pending_bytes) X(n_streams_now)                                                        \
    X(frees) X(owner_frees) X(reuse_same) X(reuse_after_event) X(releases)                                     \
    X(events_recorded) X(event_queries) X(syncs) X(fences)                                                     \
    X(records) X(used_frees) X(used_blocks)

typedef struct fp_retire {
    fp_lock_t lock;                     /* level FP_LOCK_RETIRE (lock.h): a leaf */
    fp_meta *meta;
    fp_drv_counters *calls;
    CUcontext ctx;
    int device;
    fp_rstream **streams;
    uint32_t n_streams, cap_streams;
    fp_rstream *last;                   /* the last stream looked up */
    fp_rblock *spare;                   /* node free list (through cnext) */
    CUevent *spare_evs;
    uint32_t n_spare_evs, cap_spare_evs;
    FP_RETIRE_COUNTERS(FP_COUNTER_ATOMIC)
    /* streams that use live blocks (fabpool_record_stream): an open-addressing table by address, half full at
     * most; the blocks freed while other streams used them, waiting for their events */
    fp_ruse *uses;
    size_t uses_cap, uses_n;
    fp_rblock *used;                    /* through fnext */
    /* the owner stream */
    _Atomic int owner_mode;             /* FP_OWNER_NONE, _ON or _OFF */
    void *owner;                        /* the owner (set once, before owner_mode becomes ON) */
    _Atomic uint64_t owner_seq;         /* frees of the owner announced (fp_retire_owner_free), all time */
    _Atomic uint64_t owner_fenced;      /* owner_seq the last fence covered */
} fp_retire;

enum { FP_OWNER_NONE = 0, FP_OWNER_ON = 1, FP_OWNER_OFF = 2 };

/* owner != 0: the first stream becomes the owner; 0: never one (stream_owner:off). */
fabpool_status fp_retire_init(fp_retire *r, fp_meta *meta, fp_drv_counters *calls, CUcontext ctx, int device,
                              int owner);
/* Frees every record, node and event.  Nothing may be pending: drain first
 * (fp_pending_poll with wait, and the buffers' tickets dropped).  A queue
 * never set up (zeroed: a pool whose creation stopped before) is left as
 * it is. */
void fp_retire_destroy(fp_retire *r);

/* The queue's lock (a leaf: lock.h), taken and let go from above, where a
 * walk must see the queue hold still (fabpool_check): macros, so that a
 * lock-checked build names the caller. */
#define fp_retire_lock(r) fp_lock(&(r)->lock)
#define fp_retire_unlock(r) fp_unlock(&(r)->lock)

/* What the queue counts (fabpool_counters, fabpool_stats): atomics, read
 * without the lock. */
typedef struct fp_retire_counters {
    FP_RETIRE_COUNTERS(FP_COUNTER_PLAIN)
} fp_retire_counters;
void fp_retire_read_counters(const fp_retire *r, fp_retire_counters *c);

/* ---- the owner stream */

/* 1: `stream` is the owner (it becomes the owner if the pool has none yet):
 * its allocations take memory from the pool directly.  0: it is not, or the
 * owner mode has ended. */
int fp_retire_owner_claim(fp_retire *r, void *stream);
/* Before freeing a block of the owner into the pool at once: announces it
 * (so the next fence waits), then 1 if the owner mode still holds; 0: it
 * ended meanwhile, so the caller queues the block instead. */
int fp_retire_owner_free(fp_retire *r);
/* After such a free succeeded: the counter of fabpool_counters. */
static inline void fp_retire_owner_freed(fp_retire *r)
{
    atomic_fetch_add_explicit(&r->owner_frees, 1, memory_order_relaxed);
}
/* 1: `stream` is the owner and the owner mode holds (a read: it changes nothing). */
static inline int fp_retire_owner_is(fp_retire *r, void *stream)
{
    return atomic_load_explicit(&r->owner_mode, memory_order_acquire) == FP_OWNER_ON && r->owner == stream;
}
/* Whether the owner mode holds (a cheap read, for fabpool_alloc's fast path). */
static inline int fp_retire_owned(fp_retire *r)
{
    return atomic_load_explicit(&r->owner_mode, memory_order_relaxed) == FP_OWNER_ON;
}
/* Whether the owner freed blocks at once that no fence has covered yet: the owner mode ended (or is ending: a
 * disown turns it off before its fence, which may still wait or fail), so an allocation must fence before it
 * takes memory from the pool, not rely on the mode alone. */
static inline int fp_retire_unfenced(fp_retire *r)
{
    return atomic_load_explicit(&r->owner_seq, memory_order_acquire) !=
           atomic_load_explicit(&r->owner_fenced, memory_order_acquire);
}
/* Takes back the claim of a refused call of the stream pair that made
 * `stream` the owner (the mode was FP_OWNER_NONE before it): the pool has no
 * owner again, unless the owner announced a free since owner_seq read `seq`
 * (as the refused call leaves it: its own announced free counted), which
 * may be at once: then the claim stays.  1 if taken back.  The caller
 * tells what follows the owner mode (the allocator's fast path). */
int fp_retire_owner_unclaim(fp_retire *r, void *stream, uint64_t seq);
/* Takes back a refused call's fp_retire_disown of the owner mode of `owner`
 * (which held before it): the mode is on again for the same owner, its fence
 * done.  The caller tells what follows the owner mode. */
void fp_retire_owner_reown(fp_retire *r, void *owner);
/* Ends the owner mode for good, then fences: every block the owner freed
 * is safe for anyone afterwards.  A fence the driver refuses leaves the
 * owner mode on (the caller's refusal changes nothing), so that the next
 * caller fences again. */
fabpool_status fp_retire_disown(fp_retire *r);
/* Before a call that is not the owner's takes memory from the pool: the owner mode on (*disowned = 1), ends it
 * (fp_retire_disown); off with the owner's frees not yet fenced (another thread's disown still waiting, or
 * refused), fences.  On success every block the owner freed is safe for anyone; a refusal leaves the owner mode
 * as it was. */
fabpool_status fp_retire_owner_leave(fp_retire *r, int *disowned);
/* Ends the owner mode for good, and with no owner yet makes sure none comes (fabpool_stream_owner_end), then
 * fp_retire_owner_leave. */
fabpool_status fp_retire_owner_close(fp_retire *r);
/* Waits for the owner's work queued so far if the owner freed a block since
 * the last fence (an event recorded and synchronized; the whole context
 * where the event cannot be made).  Cheap when there is nothing to wait for.
 * Takes the retire lock: may be called with the pool lock held. */
fabpool_status fp_retire_fence(fp_retire *r);

/* ---- buffer chunks */

/* Records an event on `stream` now, for `holders` chunks that wait for it:
 * *t is their ticket.  On failure nothing is recorded and the message names
 * the call (cuEventCreate, cuEventRecord). */
fabpool_status fp_retire_mark(fp_retire *r, void *stream, uint32_t holders, fp_rticket *t);
/* 1: the work t waits for is done (waited for with wait != 0); 0: not yet;
 * -1: the driver failed, *st says how. */
int fp_retire_ticket_done(fp_retire *r, const fp_rticket *t, int wait, fabpool_status *st);
/* A chunk no longer waits on t (unmapped, or its work waited for). */
void fp_retire_ticket_drop(fp_retire *r, fp_rticket *t);

/* Room for one more ticket in w: 0, or -1 without host memory (w as it was). */
int fp_retire_waits_reserve(fp_retire *r, fp_rwaits *w);
/* Adds t (w takes over its hold; room reserved): an older ticket of t's
 * stream in w is dropped.  A ticket of no stream (work done) adds nothing. */
void fp_retire_waits_add(fp_retire *r, fp_rwaits *w, fp_rticket t);
/* 1: the work of every ticket in w is done (waited for with wait != 0), the
 * tickets dropped and the array freed; 0: not yet (the tickets done are
 * dropped); -1: the driver failed, *st says how. */
int fp_retire_waits_done(fp_retire *r, fp_rwaits *w, int wait, fabpool_status *st);
/* Drops every ticket of w and frees the array (the memory is unmapped). */
void fp_retire_waits_drop(fp_retire *r, fp_rwaits *w);
/* The tickets w holds. */
static inline uint32_t fp_retire_waits_count(const fp_rwaits *w) { return w->n; }
/* fabpool_check: w's tickets within its room, none of no stream, at most one
 * a stream (1), or not (0); *n and *room (for the message) its count and room. */
int fp_retire_waits_ok(const fp_rwaits *w, uint32_t *n, size_t *room);

/* ------------------------------------------------------------ the queue's own
 * What retire.c's records and events give pending.c (the queue's lock held
 * unless said; a context current where an event is made or queried). */
/* The counters are written under the queue's lock only: a plain store (no
 * locked read-modify-write) is enough; readers load them without the lock. */
static inline uint64_t fp_rq_bump(_Atomic uint64_t *c, int64_t d)
{
    uint64_t v = atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d;
    atomic_store_explicit(c, v, memory_order_relaxed);
    return v;
}
/* The record of stream, or NULL / made on first use (NULL without host memory). */
fp_rstream *fp_rq_stream_find(fp_retire *r, void *stream);
fp_rstream *fp_rq_stream_get(fp_retire *r, void *stream);
/* Drops the records of streams that hold nothing. */
void fp_rq_forget_idle(fp_retire *r);
/* Block b out of its stream's lists; its record spared for reuse. */
void fp_rq_unlink_block(fp_rstream *rs, fp_rblock *b);
void fp_rq_spare_block(fp_retire *r, fp_rblock *b);
/* Makes the pool's context current: 0, or -1 with *st (st may be NULL) and *saved the pool's context, so that
 * the leave changes nothing (the caller's context is made current again only where it was read); and back. */
int fp_rq_ctx_enter(fp_retire *r, CUcontext *saved, fabpool_status *st);
void fp_rq_ctx_leave(fp_retire *r, CUcontext saved);
/* An event on rs now, covering its frees and marks so far. */
fabpool_status fp_rq_event_record(fp_retire *r, fp_rstream *rs);
/* The context synchronized: every stream's work done; where the driver
 * refuses, nothing is marked done and the status says why. */
fabpool_status fp_rq_sync_all(fp_retire *r);
/* Whether rs's work up to seq `until` is done (waiting, with wait). */
int fp_rq_advance(fp_retire *r, fp_rstream *rs, uint64_t until, int wait, fabpool_status *st);
/* A ticket no longer held. */
void fp_rq_ticket_release(fp_rticket *t);

#endif
