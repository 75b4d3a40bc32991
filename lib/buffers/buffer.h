/* buffer.h - growable buffers: an address window of their own, chunks mapped
 * one behind the other, so the base address never changes.  Chunks a shrink
 * gives up retire until the GPU work that may use them is done; chunks an
 * exported buffer drops stay alive (held for peers) until the peers acknowledge.
 *
 * Its chunks come from slab (with the OOM retry).  Counters it owns (written only here):
 * buffer bytes, mapped, count, retiring and held-for-peers bytes.  Export (export.c)
 * and dma-bufs (dmabuf.c) sit above it and read its structures.
 *
 * Locking: the pool lock (bs->sp->lock) guards every buffer and the list.
 * The structures are in bchunk.h. */
#ifndef FP_BUFFER_H
#define FP_BUFFER_H

#include "bchunk.h"

/* fabpool_buffer_create of the pool whose buffers bs are (bs NULL: the pool
 * was NULL). */
fabpool_status fp_buffer_create(fp_buffers *bs, size_t max_size, size_t size, fabpool_buffer_t **out);

/* fabpool_buffer_destroy's work, pool lock held: retires every chunk (after
 * the work on `stream`) and marks b destroyed; the caller collects.  On
 * failure b is as it was. */
fabpool_status fp_buffer_destroy_locked(fp_buffers *bs, struct fabpool_buffer *b, void *stream);
/* Destroys the buffers kept after a release (release.h): every one (all !=
 * 0), or those kept for keep_ms or longer.  Pool lock held; the caller
 * collects. */
void fp_buffers_drop_kept(fp_buffers *bs, int all);


#endif
