/* pending.h - stream-pending blocks: blocks freed on a stream that wait in
 * the stream queue (retire.h) for its work, and the streams recorded on
 * live blocks whose work their free waits for (pending.c). */
#ifndef FP_PENDING_H
#define FP_PENDING_H

#include "retire.h"

/* ---- blocks freed on a stream */

/* Queues a block (already checked and marked pending by the caller) on
 * `stream`.  *poll is set to 1 when so much is pending that the caller
 * should poll.  FABPOOL_ERR_HOST_MEMORY (nothing queued) without host
 * memory for the record; the caller then waits and frees it itself. */
fabpool_status fp_pending_free(fp_retire *r, void *stream, uint64_t ptr, uint64_t usable, uint32_t cls, int *poll);
/* A block freed on `stream` that fits: of class cls, or for cls ==
 * FP_PENDING_LARGE one of at least need and at most max bytes.  0: none.
 * *usable gets its size. */
uint64_t fp_pending_take(fp_retire *r, void *stream, uint32_t cls, uint64_t need, uint64_t max, uint64_t *usable);
/* Records an event on every stream with frees not covered by one, then
 * detaches every block whose event has completed (wait != 0: every block,
 * waiting for the GPU) and returns them as a chain through fnext; the
 * caller gives them to the pool and hands the nodes back with
 * fp_pending_recycle.  forget != 0 also drops the records of streams that
 * hold nothing any more (trim, collect with wait, destroy). */
fp_rblock *fp_pending_poll(fp_retire *r, int wait, int forget);
void fp_pending_recycle(fp_retire *r, fp_rblock *chain);
/* A block fp_pending_poll handed back went to the pool (released) or
 * straight to an allocation of another stream (reused after its event): the
 * caller says so, and the queue counts it (its counters are its own). */
static inline void fp_pending_released(fp_retire *r) { atomic_fetch_add_explicit(&r->releases, 1, memory_order_relaxed); }
static inline void fp_pending_reused_after_event(fp_retire *r)
{
    atomic_fetch_add_explicit(&r->reuse_after_event, 1, memory_order_relaxed);
}

/* ---- streams that use a block (fabpool_record_stream)
 *
 * A live block used on other streams than its own has a slot in the
 * table: the streams, each once.  When it is freed, an event is recorded on
 * each of them (and on the stream it is freed on), and the block waits
 * among the used blocks, apart from every stream's lists (no stream may
 * take it back at once), until all of them have completed; fp_pending_poll
 * then hands it back as any pending block.  The caller marks the block (a
 * slab flag) so that only its slow path looks here; the table is read by
 * address otherwise (large blocks, while fp_retire_any_used says any block
 * has a slot). */

/* Records that `stream` uses the live block at ptr (a stream recorded
 * already: nothing).  FABPOOL_ERR_HOST_MEMORY: nothing changed. */
fabpool_status fp_retire_use(fp_retire *r, uint64_t ptr, void *stream);
/* Whether any block has recorded streams (a cheap read). */
static inline int fp_retire_any_used(fp_retire *r)
{
    return atomic_load_explicit(&r->used_blocks, memory_order_relaxed) != 0;
}
/* Whether the block at ptr has recorded streams. */
int fp_retire_used(fp_retire *r, uint64_t ptr);
/* The same with r's lock held (fabpool_check holds it over its whole walk). */
int fp_retire_used_locked(fp_retire *r, uint64_t ptr);
/* The block at ptr (already checked and marked pending by the caller) is
 * freed: on `stream` (on_stream != 0) or by fabpool_free.  If a stream
 * other than `stream` was recorded on it, an event is recorded now on each
 * recorded stream and on `stream`, the block waits for them and *queued is
 * 1; else (no slot, or `stream` alone) *queued is 0 and the caller frees it
 * as any block.  The slot goes either way.  An event that cannot be made or
 * recorded: the context is synchronized instead.  traced: the block's free
 * is in the trace already (the block says so when it comes back).
 * FABPOOL_ERR_HOST_MEMORY, or a driver error making the context current or
 * synchronizing it where an event failed: nothing changed. */
fabpool_status fp_pending_free_used(fp_retire *r, uint64_t ptr, uint64_t usable, uint32_t cls, int on_stream,
                                    void *stream, int traced, int *queued);
/* Slots in the table now (fabpool_check). */
static inline uint64_t fp_retire_used_blocks(fp_retire *r)
{
    return atomic_load_explicit(&r->used_blocks, memory_order_relaxed);
}

/* Whether anything is pending (a cheap read). */
static inline int fp_pending_any(fp_retire *r)
{
    return atomic_load_explicit(&r->pending_blocks, memory_order_relaxed) != 0;
}

/* Blocks in the queue now (fabpool_check). */
static inline uint64_t fp_retire_queued(fp_retire *r)
{
    return atomic_load(&r->pending_blocks);
}

/* What the queue has done, all time: blocks queued, taken back, given back
 * to the pool, streams recorded, recorded blocks freed (fabpool_check: a
 * count that moved means work in flight). */
static inline uint64_t fp_retire_activity(fp_retire *r)
{
    return atomic_load(&r->frees) + atomic_load(&r->reuse_same) + atomic_load(&r->reuse_after_event) +
           atomic_load(&r->releases) + atomic_load(&r->records) + atomic_load(&r->used_frees);
}

#endif
