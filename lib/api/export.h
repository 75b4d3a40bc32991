/* export.h - memory out to other processes.  A buffer: descriptors of its
 * chunks (full, or a delta since a generation), the pool's copies of their
 * fds, and the peers' acknowledgements that let dropped chunks go.  A block:
 * a descriptor of the chunks mapped under it (fabpool_block_export), their
 * handles kept by the chunk layer while they stay mapped.
 *
 * The fabpool_buffer_export*
 * and fabpool_buffer_peers_ack entry points are here; fabpool_peers_ack (by
 * export id) and fabpool_block_export reach here from lifecycle.c. */
#ifndef FP_EXPORT_H
#define FP_EXPORT_H

#include <stdint.h>

#include "alloc.h"
#include "buffer.h"

/* fabpool_block_export of the pool whose allocator a is (a NULL: the pool was NULL). */
fabpool_status fp_block_export(fp_alloc *a, const void *ptr, void *desc, size_t cap, size_t *len, int *fds,
                               size_t fd_cap, size_t *nfds, size_t *offset);

/* fabpool_peers_ack of the pool whose buffers bs are (bs NULL: the pool was NULL). */
fabpool_status fp_buffers_peers_ack(fp_buffers *bs, uint64_t export_id, uint64_t generation);

#endif
