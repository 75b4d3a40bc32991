/* device.h - a pool's device as the pool sees it: its fp_chunks set up
 * and the device opened (the device and its peers checked, the primary
 * context retained, the stream queue set up on it, GPUDirect RDMA and the
 * shareable handle type chosen, the granularity read) and closed; what
 * the top layer reads of it (how chunks are made, the counters of what the
 * driver holds and did); the copies and waits on its streams that a
 * sleep makes; and whether a fork left the pool behind, which every layer's
 * entry points ask.  The top layer reads fp_chunks through these alone. */
#ifndef FP_DEVICE_H
#define FP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "chunk.h"
#include "retire.h"

struct fp_trace;

/* Sets ch up for o's device and peers, nothing of the driver yet: meta for
 * its lists, lock the pool lock that every map and unmap holds (asserted). */
void fp_chunks_init(fp_chunks *ch, const fabpool_options *o, fp_meta *meta, const fp_lock_t *lock);
/* The trace every map and unmap is recorded in, and the stream queue
 * waited for before every unmap (retire.h); NULL: none. */
void fp_chunks_attach(fp_chunks *ch, struct fp_trace *trace, fp_retire *fence);

/* Opens device o->device for ch: checks it and its peers, retains its
 * primary context, sets up r, the pool's stream queue, on it, chooses
 * rdma and the handle type (why[0..n) says why, for the log) and reads
 * the granularity chunks and the reservation are made in (*gran). */
fabpool_status fp_device_open(fp_chunks *ch, fp_retire *r, const fabpool_options *o, char *why, size_t n,
                              uint64_t *gran);
/* Releases the primary context, if it was retained (tried twice). */
fabpool_status fp_device_close(fp_chunks *ch);

/* How the pool's chunks are made, and where the log puts them (set at
 * creation: no lock needed). */
typedef struct fp_chunks_info {
    fabpool_handle_type handle_type;
    int rdma;                          /* chunks are GPUDirect RDMA capable */
    uint64_t dev_total;                /* the device's memory */
    unsigned log_pool;                 /* the pool's number in the log's lines */
} fp_chunks_info;
fp_chunks_info fp_chunks_get_info(const fp_chunks *ch);

/* What the driver holds and did for the pool: the registry's sums of the
 * counted kinds (mapped bytes and chunks, under the pool lock as exact as
 * the layers' own counts), its counters, and every driver call made for
 * it.  Atomics: no lock needed. */
typedef struct fp_chunk_counters {
    uint64_t mapped_bytes, mapped_bytes_peak, chunks_mapped;
    FP_CHUNKS_COUNTERS(FP_COUNTER_PLAIN)
    uint64_t calls[FP_DRV_COUNT];
} fp_chunk_counters;
void fp_chunks_read_counters(const fp_chunks *ch, fp_chunk_counters *c);

/* Whether the pool was made before this process was forked from its maker (fp_device_set_forked, from the
 * registry's fork hook in the child): CUDA did not carry the device's context over the fork, and the pool's
 * locks may have been held at the fork by threads the child does not have, so a lock taken there may never be
 * free.  Every entry point on the pool, its buffers and its views asks first, before any lock or driver call,
 * and answers fp_device_forked_error.  A plain read: set once, in the child while it has one thread. */
static inline int fp_device_forked(const fp_chunks *ch)
{
    return atomic_load_explicit(&((fp_chunks *)ch)->forked, memory_order_relaxed) != 0;
}
void fp_device_set_forked(fp_chunks *ch);
/* The refusal of fn in such a child: FABPOOL_ERR_NOT_SUPPORTED, saying why and what to do instead. */
fabpool_status fp_device_forked_error(const fp_chunks *ch, const char *fn);

/* Copies size bytes from src to dst on stream (cuMemcpyDtoDAsync). */
CUresult fp_device_copy(fp_chunks *ch, uint64_t dst, uint64_t src, uint64_t size, void *stream);
/* Waits for the GPU work on stream (NULL: the whole context). */
CUresult fp_device_sync(fp_chunks *ch, void *stream);

#endif
