/* export.h - a buffer out to other processes: descriptors of its chunks
 * (full, or a delta since a generation), the pool's copies of their fds, and
 * the peers' acknowledgements that let dropped chunks go.
 *
 * Calls: buffer (fp_collect_locked), chunk (export, close fd), desc, error.
 * The fabpool_buffer_export* and fabpool_buffer_peers_ack entry points are
 * here; fabpool_peers_ack (by export id) reaches here from lifecycle.c. */
#ifndef FP_EXPORT_H
#define FP_EXPORT_H

#include <stdint.h>

#include "buffer.h"

/* fabpool_peers_ack of the pool whose buffers bs are (bs NULL: the pool was NULL). */
fabpool_status fp_buffers_peers_ack(fp_buffers *bs, uint64_t export_id, uint64_t generation);

#endif
