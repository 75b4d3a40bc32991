/* buffer_check.h - fabpool_check's walk of the buffers (walk.h), pool lock
 * held: each adds its window to w's address space in use, its chunks to w's
 * mappings and their fds to w->fds; the sums against the buffers' counters. */
#ifndef FP_BUFFER_CHECK_H
#define FP_BUFFER_CHECK_H

#include "buffer.h"
#include "walk.h"

fabpool_status fp_buffers_check(const fp_buffers *bs, fp_walk *w);
/* The shrinks' copies the driver would not unmap: in use in w's address space, and counted as its mappings (the
 * registry's staging kind). */
fabpool_status fp_buffers_check_stuck(const fp_buffers *bs, fp_walk *w);

#endif
