/* oom.h - the message of a chunk the device had no memory for (oom.c). */
#ifndef FP_OOM_H
#define FP_OOM_H

#include <stdint.h>

#include "chunk.h"
#include "fabpool.h"

/* FABPOOL_ERR_OUT_OF_MEMORY with the message of a chunk of size bytes the device had no memory for, after the
 * heap's trim of idle bytes and one more try: what the pool maps (for blocks and for buffers), what of its cache
 * went back, the device's memory, and what to give back by what the pool holds (blocks, buffers, views).  The
 * public call appends its name and the size it was asked for.  Pool lock held. */
fabpool_status fp_oom_error(fp_chunks *ch, uint64_t size, uint64_t idle);

#endif
