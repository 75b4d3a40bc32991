/* alloc.h - the blocks' API: fabpool_alloc / fabpool_free, their hot path
 * through per-thread caches and the slow path to the heap's classes and large
 * blocks (alloc.c), the thread caches' life (tcache.c, their hit inline in
 * tcache.h), and the stream-ordered pair fabpool_alloc_on_stream /
 * fabpool_free_on_stream / fabpool_record_stream (stream.c).
 *
 * Counters the layer owns (fp_alloc, tcache.h): blocks given out and taken
 * back per class, with and without a thread cache, and the bytes
 * of slab blocks out of their classes in the pool's in-use mark (usage.h:
 * counted when a cache is refilled or flushed, never on its hit).
 *
 * fabpool_t, to this layer, is its fp_alloc: struct fabpool begins with one
 * (lifecycle.c asserts it), so that the public entry points of this file reach
 * their state with a cast, with neither a call nor the pool's header on the
 * hot path.
 *
 * Locking: the pool lock (a->sp->lock) guards the list of caches; the registry
 * of live pools has its own lock, taken before the pool lock (a thread that
 * exits closes its caches under it). */
#ifndef FP_ALLOC_H
#define FP_ALLOC_H

#include "block_state.h"
#include "tcache.h"

/* The block paths that stream.c shares with alloc.c.  fabpool_alloc's work
 * for the owner stream; fabpool_alloc after a poll of the caller's own (not
 * the application's call in the trace). */
fabpool_status fp_alloc_block(fp_alloc *a, size_t size, void **out);
fabpool_status fp_alloc_polled(fp_alloc *a, size_t size, void **out);
/* fabpool_free's work once the block's span s is looked up, its free in the
 * trace already; fn names the call in messages.  A block with recorded
 * streams waits for them (and for `stream`, with on_stream): *queued (if not
 * NULL) is set to 1 then, and left as it is otherwise. */
fabpool_status fp_alloc_free_block(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                   void *stream, int *queued);
/* Blocks freed on streams whose work is done go back to the pool
 * (with wait: all of them, after waiting; forget: streams that hold nothing
 * are dropped).  No lock held. */
void fp_alloc_drain(fp_alloc *a, int wait, int forget);
/* Gives a chain of blocks the queue handed back to the pool (one whose free
 * is in the trace already is not traced again), and recycles its records. */
void fp_alloc_release_chain(fp_alloc *a, fp_rblock *chain);

#endif
