/* refit.h - a shrink's refit: a buffer's last needed chunk, which holds more
 * than the hysteresis allows, replaced by a smaller chunk at the same
 * address (refit.c).  Pool lock held. */
#ifndef FP_REFIT_H
#define FP_REFIT_H

#include "bchunk.h"

/* Waits for the GPU work on `stream` (NULL: the whole context); `why` ends
 * the message. */
fabpool_status fp_buffers_sync(fp_buffers *bs, void *stream, const char *why);

/* Chunk j of b, the last that a size of `target` bytes needs, is replaced by
 * a chunk of rs bytes at the same address, the data below target copied on
 * `stream`; every chunk after j (all retiring) is unmapped.  The copy and
 * the swap wait for the GPU work on `stream` (NULL: the context) and for the
 * retired chunks' tickets.  The memory of a chunk that a peer may still
 * import is kept for it.  On failure the buffer keeps its chunks as they
 * were (its data too), unless the driver refused to map the old chunk back
 * after unmapping it (*lost = 1: the message says which bytes went): then
 * chunk j and the chunks after it are gone, the buffer's live bytes end at
 * chunk j's offset (its size is the caller's to set), and its generation is
 * new; chunks after j that failed to unmap stay retired for
 * fabpool_collect.  The pool's context is current. */
fabpool_status fp_buffer_refit(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs, uint64_t target,
                               void *stream, int *lost);

#endif
