/* buffer_sleep.h - what a pool's sleep asks of its buffers (buffer_sleep.c):
 * whether one forbids it, and what changes in a chunk that the registry
 * lists as a buffer's (mapreg.h: its owner is the buffer) when sleep
 * unmaps it and when wake maps new memory behind it.  Pool lock held. */
#ifndef FP_BUFFER_SLEEP_H
#define FP_BUFFER_SLEEP_H

#include "bchunk.h"

/* FABPOOL_ERR_BUSY with its message when a buffer was exported and its
 * peers may still map it (their views would read memory that sleep takes
 * away), else FABPOOL_OK. */
fabpool_status fp_buffers_sleep_refused(const fp_buffers *bs);
/* Before sleep unmaps the chunk at va of buffer owner: the pool's copy of
 * its exported fd is closed (it would keep the memory). */
void fp_buffer_chunk_slept(void *owner, uint64_t va);
/* Wake mapped new memory behind the chunk at va of buffer owner: an export
 * names it anew. */
void fp_buffer_chunk_renewed(void *owner, uint64_t va);

#endif
