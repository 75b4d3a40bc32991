/* release.h - a buffer's end: destroyed, or released and kept for reuse
 * (fabpool_buffer_release, fabpool_buffer_reuse; release.c says what bounds
 * the kept memory). */
#ifndef FP_RELEASE_H
#define FP_RELEASE_H

#include "buffer.h"

/* fabpool_buffer_reuse of the pool whose buffers bs are (bs NULL: the pool was NULL). */
fabpool_status fp_buffer_reuse(fp_buffers *bs, size_t size, void *stream, fabpool_buffer_t **out);
/* Pool destroy: unmaps and frees every buffer, kept ones too, peer holds
 * released.  Pool lock held (each function that needs it asserts it: lock.h). */
void fp_buffers_destroy(fp_buffers *bs);
/* A block allocation out of device memory: every buffer released and kept goes back now (what a buffer's grow
 * does at its own out of memory), so that one more try may find the memory.  Whether any went; the calling
 * thread's message stays as it was.  No lock held. */
int fp_buffers_give_back_kept(fp_buffers *bs);

#endif
