/* block_state.h - what a block's record says, for the calls beside
 * fabpool_alloc / fabpool_free (block_state.c): a block's size and
 * liveness, the free of a block with recorded streams, and the refusals
 * that fabpool_free shares with them. */
#ifndef FP_BLOCK_STATE_H
#define FP_BLOCK_STATE_H

#include "tcache.h"

/* FABPOOL_OK with *usable its size where addr is the start of a block given
 * out and not freed (nor freed on a stream); else FABPOOL_ERR_NOT_FOUND with
 * a message that says which (fn names the call).  The block may be freed
 * meanwhile by another thread: callers hold the pool lock for what only it
 * guards (large blocks) and rely on the caller of the public call for the
 * rest. */
fabpool_status fp_alloc_live_block(fp_alloc *a, uint64_t addr, uint64_t *usable, const char *fn);

/* A block with recorded streams is freed (block_state.c says how). */
fabpool_status fp_alloc_free_recorded(fp_alloc *a, fp_span *s, uint64_t addr, const char *fn, int on_stream,
                                      void *stream, int traced, int *queued);
/* A stream-pending block becomes a block given out again. */
void fp_alloc_unpend(fp_alloc *a, uint64_t ptr);
/* The refusal of a free (or a use) of a slab block whose flag f says it is not given out. */
fabpool_status fp_alloc_already_free(const char *fn, uint64_t addr, uint64_t obj, uint8_t f);
/* The refusal of a pointer that no block of this pool holds (fn names the call): FABPOOL_ERR_NOT_FOUND with a
 * message that says whose memory it is where the pool maps it (a growable buffer's: give it back with
 * fabpool_buffer_destroy; a view's), else that this pool did not give it out.  locked: the caller holds the
 * pool lock (the registry of mappings is read under it).  Only a refusal's path comes here. */
fabpool_status fp_alloc_not_ours(const fp_alloc *a, const char *fn, const void *ptr, int locked);

#endif
