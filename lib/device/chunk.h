/* chunk.h - physical chunks of one device: created, mapped, given access,
 * released at once (so that the mapping alone keeps the memory and an unmap
 * frees it), exported and imported as shareable handles.  The layer that
 * owns a pool's device: its context, its driver-call counters, what its
 * chunks are made as, the registry of every mapping it made (mapreg.h:
 * the mapped bytes and chunks are its sums) and the counters of what else
 * the driver holds for it (handles, exported fds), which only chunk.c and
 * vmm.c write.
 *
 * No retry here: a cuMemCreate that fails with
 * CUDA_ERROR_OUT_OF_MEMORY returns FABPOOL_ERR_OUT_OF_MEMORY, and the
 * callers that hold cached memory (slab.c) trim and try again.
 *
 * Callers hold the pool lock (ch->lock, given at fp_chunks_init) to create,
 * map, unmap and release (the page map and address space they go with are
 * under it); each of those asserts it (lock.h).  The counters are atomics. */
#ifndef FP_CHUNK_H
#define FP_CHUNK_H

#include <stdatomic.h>
#include <stdint.h>

#include "counter.h"
#include "driver.h"
#include "fabpool.h"
#include "lock.h"
#include "meta.h"
#include "mapreg.h"
#include "walk.h"

struct fabpool_buffer;

/* A mapping of the registry put to sleep (fabpool_sleep, sleep.c): MAPPED
 * (awake), ASLEEP (unmapped, its memory released, maybe with a host copy;
 * out of the registry), UNRESTORED (mapped again by a wake whose copy back
 * from the host failed and whose unmap then failed too: in the registry,
 * its host copy still to be copied in by the next wake) or GONE (freed
 * while asleep: fp_chunk_unmap forgets it instead of calling the driver, or
 * an UNRESTORED one once it has unmapped it).  m is its registry entry,
 * which wake adds again; above this layer it is read through the inlines
 * below. */
enum { FP_SL_MAPPED = 0, FP_SL_ASLEEP = 1, FP_SL_GONE = 2, FP_SL_UNRESTORED = 3 };
typedef struct fp_slept {
    uint64_t va, size;
    uint64_t host_va, host_size;       /* its host copy (host_va 0: none) */
    fp_mapping m;                      /* m.owner, a buffer's, is valid while the chunk is not GONE */
    uint8_t state, copy;               /* copy: offload its bytes */
} fp_slept;
/* Its registry entry's kind, owner, and say whether a sleep with offload copies its bytes. */
static inline fp_map_kind fp_slept_kind(const fp_slept *e) { return (fp_map_kind)e->m.kind; }
static inline void *fp_slept_owner(const fp_slept *e) { return e->m.owner; }
static inline int fp_slept_copies(const fp_slept *e) { return e->m.copy; }

struct fp_retire;

/* A chunk exported for a block (fabpool_block_export): its shareable handle
 * kept while the chunk stays mapped, so that each chunk is exported once;
 * fp_chunk_unmap closes its fd. */
typedef struct fp_xchunk {
    uint64_t va, size;
    int fd;                            /* posix_fd: the pool's copy (counted in exported_fds); else -1 */
    CUmemFabricHandle fabric;          /* fabric: the handle's bytes */
} fp_xchunk;

/* The counters of what else the driver holds and did for the pool that fp_chunks_read_counters copies
 * (counter.h): chunks mapped and unmapped, all time; the handles the pool holds; the exported fds open; the
 * export anchor's moves or closes because its chunk was unmapped (chunk.c), all time. */
#define FP_CHUNKS_COUNTERS(X)                                                                                  \
    X(chunks_mapped_total) X(chunks_unmapped_total) X(handles_outstanding) X(exported_fds) X(export_anchor_moves)

typedef struct fp_chunks {
    fp_drv_counters calls;             /* every driver call made for the pool */
    const fp_lock_t *lock;             /* held around every map, unmap, create and release (asserted) */
    int device;                        /* the ordinal, as the options give it */
    unsigned log_pool;                 /* the pool's number in the log's lines (log.h) */
    struct fp_trace *trace;            /* the pool's trace (NULL: none): every map and unmap is recorded */
    CUdevice dev;
    uint64_t dev_total;                /* the device's memory (cuDeviceTotalMem): no block can be larger */
    CUcontext ctx;                     /* the device's primary context (retained) */
    fabpool_handle_type handle_type;   /* chosen at creation */
    CUmemAllocationHandleType cu_handle_types;
    unsigned char rdma;                /* chunks made with allocFlags.gpuDirectRDMACapable */
    int dmabuf_supported;              /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
    int n_peers;                       /* devices given access too */
    int peers[FABPOOL_MAX_PEERS];
    /* what the driver holds for the pool: every mapping (pool lock), and the counters of what else it holds */
    fp_mapreg reg;
    FP_CHUNKS_COUNTERS(FP_COUNTER_ATOMIC)
    /* sleep (sleep.c sets these through fp_chunk_set_asleep / fp_chunk_set_slept) */
    _Atomic int asleep;                /* no chunk may be made or exported: every layer refuses */
    _Atomic int forked;                /* made before this process was forked from its maker (device.h) */
    fp_slept *slept;                   /* the sleeping chunks, sorted by va (NULL: none); pool lock */
    size_t n_slept;
    struct fp_retire *fence;           /* waited for before every unmap (retire.h, the owner stream); may be NULL */
    fp_meta *meta;                     /* for the list below */
    fp_xchunk *kept;                   /* chunks exported for blocks, sorted by va (pool lock) */
    size_t n_kept, cap_kept;
    /* the export anchor (chunk.c): an exported fd of a chunk mapped at [anchor_va, +anchor_size), kept open so
     * that the pool's other fd exports and closes are cheap; anchor_size 0: none.  Pool lock. */
    int anchor_fd;
    uint64_t anchor_va, anchor_size;
} fp_chunks;

/* Bytes (and, into *count if not NULL, chunks) the pool maps: the registry's counted kinds.  No lock needed. */
static inline uint64_t fp_chunks_mapped(const fp_chunks *ch, uint64_t *count)
{
    return fp_mapreg_mapped(&ch->reg, count);
}
static inline uint64_t fp_chunks_mapped_peak(const fp_chunks *ch) { return fp_mapreg_peak(&ch->reg); }

/* Whether the pool is asleep (a cheap read: every layer refuses to map then). */
static inline int fp_chunks_asleep(const fp_chunks *ch)
{
    return atomic_load_explicit(&((fp_chunks *)ch)->asleep, memory_order_relaxed) != 0;
}
void fp_chunk_set_asleep(fp_chunks *ch, int asleep);
/* The record of a sleep (NULL, 0: none), which fp_chunk_unmap consults:
 * unmapping a chunk that sleeps only marks it GONE.  Pool lock held. */
void fp_chunk_set_slept(fp_chunks *ch, fp_slept *e, size_t n);
/* FABPOOL_ERR_ASLEEP with a message naming fn. */
fabpool_status fp_chunk_asleep_error(const char *fn);
/* FABPOOL_OK, or FABPOOL_ERR_OUT_OF_MEMORY when bytes are more than the whole device has (they can never be
 * mapped: a caller says so before mapping any of it, rather than take every free byte of the device from its
 * other users until the driver refuses).  `what` begins the message. */
fabpool_status fp_chunk_too_large(const fp_chunks *ch, uint64_t bytes, const char *what);
static inline fabpool_status fp_chunk_fits_device(const fp_chunks *ch, uint64_t bytes, const char *what)
{
    return !ch->dev_total || bytes <= ch->dev_total ? FABPOOL_OK : fp_chunk_too_large(ch, bytes, what);
}

/* What every chunk is made as: pinned device memory of the device, with its
 * shareable handle types, GPUDirect RDMA capable if rdma chose it. */
CUmemAllocationProp fp_chunk_prop(const fp_chunks *ch);

/* Decides ch->rdma from the rdma option and the device's attributes (rdma:on
 * on a device without GPUDirect RDMA with VMM fails), and reads whether the
 * device exports dma-bufs. */
fabpool_status fp_chunk_choose_rdma(fp_chunks *ch, fabpool_rdma want);

/* cuMemCreate of a chunk; the handle is counted in handles_outstanding.
 * FABPOOL_ERR_OUT_OF_MEMORY when the device has no memory left: no retry. */
fabpool_status fp_chunk_create(fp_chunks *ch, uint64_t size, CUmemGenericAllocationHandle *out);
/* Maps handle h at va and gives the device and its peers access, and adds
 * the mapping to the registry as kind's, owner's (mapreg.h); on failure
 * nothing stays mapped for the caller: a mapping whose undo the driver
 * refused is listed as stuck (FP_MAP_STUCK), for fp_space_unstick.  Stuck
 * mappings in the way are unmapped first.  h is left as it was (not
 * released). */
fabpool_status fp_chunk_map_access(fp_chunks *ch, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   fp_map_kind kind, void *owner, const char *what);
/* Maps handle h (counted) at va with access and releases it at once; h is
 * released whatever the outcome, and on failure nothing stays mapped for the
 * caller (what the driver would not unmap is listed as stuck, as above). */
fabpool_status fp_chunk_map_handle(fp_chunks *ch, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   fp_map_kind kind, void *owner, const char *what);
/* Counts a mapping of size bytes at va that the pool now keeps in its totals and trace (map_access does not);
 * the log (info) says what it is. */
void fp_chunk_count_mapped(fp_chunks *ch, uint64_t va, uint64_t size, const char *what);
/* Whether a sleep with offload copies the bytes of the mapping at va (its
 * owner's say: a buffer's retired chunk holds nothing to keep); asleep, the
 * one wake adds again.  Pool lock held. */
void fp_chunk_set_copy(fp_chunks *ch, uint64_t va, int copy);
/* The owner of the mapping at va is now `owner` (a buffer moved to new memory, buffers/bchunk.c); not while
 * the pool sleeps (a sleep gives the buffers it could move back first).  Pool lock held. */
static inline void fp_chunk_set_owner(fp_chunks *ch, uint64_t va, void *owner)
{
    fp_lock_assert_held(ch->lock);
    fp_mapping *m = fp_mapreg_find(&ch->reg, va);
    if (m)
        m->owner = owner;
}
/* The identity of the memory mapped at va (mapreg.h: new for every mapping, so new memory at an old address
 * has a new one), or 0 where no mapping starts there.  Pool lock held. */
uint64_t fp_chunk_ident(const fp_chunks *ch, uint64_t va);
/* The mapping over va, or NULL where the pool maps nothing there (pool lock held): whose memory an address is. */
static inline const fp_mapping *fp_chunk_mapping_over(const fp_chunks *ch, uint64_t va)
{
    fp_lock_assert_held(ch->lock);
    return fp_mapreg_over(&ch->reg, va);
}
/* The registry's mappings, sorted by address (read-only; pool lock held). */
const fp_mapping *fp_chunk_mappings(const fp_chunks *ch, size_t *n);
/* The registry's sums per kind (count and bytes, FP_MAP_KINDS each). */
void fp_chunk_map_sums(const fp_chunks *ch, uint64_t *count, uint64_t *bytes);
/* mapped_peak starts again from what is mapped now (fabpool_reset_peak). */
void fp_chunk_reset_peak(fp_chunks *ch);
/* Releases h (counted in handles_outstanding), tried twice. */
CUresult fp_chunk_release(fp_chunks *ch, CUmemGenericAllocationHandle h);
/* The stuck mappings (mapreg.h: mappings given up that the driver would not unmap): their count; one unmapped
 * (tried twice) and taken off the list; the mapping at va of size bytes listed as stuck instead of its kind
 * (its user gives it up after the driver refused its unmap); the one at va marked held (its user gave its range
 * back, space.c frees it with the mapping).  Pool lock held but for the count. */
static inline uint64_t fp_chunks_stuck(const fp_chunks *ch)
{
    return atomic_load_explicit(&((fp_chunks *)ch)->reg.count[FP_MAP_STUCK], memory_order_relaxed);
}
CUresult fp_chunk_unmap_stuck(fp_chunks *ch, uint64_t va, uint64_t size);
/* The stuck mappings in [va, va + size) (one that begins before va and reaches into it too) unmapped, each tried
 * twice: CUDA_SUCCESS once none is left there, else the first refusal, that mapping (still listed) in *refused;
 * go_on: the others are tried all the same (a reservation to free), else none after it (a range to map). */
CUresult fp_chunk_unstick_range(fp_chunks *ch, uint64_t va, uint64_t size, int go_on, fp_mapping *refused);
void fp_chunk_stick(fp_chunks *ch, uint64_t va, uint64_t size);
void fp_chunk_stuck_hold(fp_chunks *ch, uint64_t va);
/* Unmaps a chunk the pool counted as mapped (one that sleeps: forgets it,
 * so that wake does not map it again). */
fabpool_status fp_chunk_unmap(fp_chunks *ch, uint64_t va, uint64_t size);
/* What the calling thread unmaps through fp_chunk_unmap during a step, for the log's lines (trim, decay, a
 * peer's ack): fp_chunk_tally_begin() before it, fp_chunk_tally_end() after it gives the bytes and chunks.
 * With the log below info, begin costs one branch and end gives zeros (on: whether begin counted). */
typedef struct fp_chunk_tally {
    uint64_t bytes, chunks;
    int on;
} fp_chunk_tally;
fp_chunk_tally fp_chunk_tally_now(void);
static inline fp_chunk_tally fp_chunk_tally_begin(void)
{
    fp_chunk_tally t = {0, 0, 0};
    return FP_LOG_ON(FP_LOG_INFO) ? fp_chunk_tally_now() : t;
}
fp_chunk_tally fp_chunk_tally_end(fp_chunk_tally begun);

/* A line of the log about the pool of ch (log.h). */
#define FP_LOG_CH(lvl, ch, ...) FP_LOG_POOL(lvl, (ch)->log_pool, (ch)->device, __VA_ARGS__)

/* A handle of the chunk mapped at va (cuMemRetainAllocationHandle), counted. */
fabpool_status fp_chunk_retain(fp_chunks *ch, uint64_t va, CUmemGenericAllocationHandle *out, const char *what);

/* Exports the chunk mapped at va as the pool's shareable handle type: for
 * fabric into *fabric (FP_DESC_FABRIC_BYTES), else an fd into *fd, counted
 * in exported_fds until fp_chunk_close_fd.  The handle taken for it is
 * released at once (the mapping and the fd keep the memory). */
fabpool_status fp_chunk_export(fp_chunks *ch, uint64_t va, uint64_t size, int *fd, CUmemFabricHandle *fabric);
/* Closes an fd fp_chunk_export gave, if *fd >= 0, and sets it to -1. */
void fp_chunk_close_fd(fp_chunks *ch, int *fd);
/* Closes *fd, an fd fp_chunk_export gave for the chunk mapped at [va, va + size) that stays mapped, if
 * *fd >= 0, and sets it to -1; but when the pool holds no export anchor the fd becomes it instead of closing
 * (chunk.c says why).  Pool lock held. */
void fp_chunk_close_export(fp_chunks *ch, uint64_t va, uint64_t size, int *fd);
/* Closes the export anchor, if held (sleep, destroy: nothing is exported until the next export takes one; a
 * teardown that unmaps chunk after chunk would otherwise move it from each to the next).  Pool lock held. */
void fp_chunk_anchor_close(fp_chunks *ch);
/* [va, va + size) is about to be unmapped: if the export anchor lies there, it moves to another chunk of the
 * pool's own, or is closed.  Pool lock held. */
void fp_chunk_anchor_leave(fp_chunks *ch, uint64_t va, uint64_t size);
/* The chunk mapped over va: its base and size.  The driver answers the one
 * mapping there, not a run of neighbouring ones (cuMemGetAddressRange; the
 * H200 and the sim alike, tests/test_conformance.c).  FABPOOL_ERR_NOT_FOUND
 * where nothing is mapped.  Pool lock held, the context current. */
fabpool_status fp_chunk_range(fp_chunks *ch, uint64_t va, uint64_t *base, uint64_t *size);
/* The shareable handle of the chunk mapped at [va, va + size), exported once
 * and kept with the chunk until fp_chunk_unmap (*fresh: 1 if this call
 * exported it, 0 if it was kept from an earlier one).  The fd stays the
 * pool's.  Pool lock held. */
fabpool_status fp_chunk_export_kept(fp_chunks *ch, uint64_t va, uint64_t size, int *fd, CUmemFabricHandle *fabric,
                                    int *fresh);
/* Forgets what fp_chunk_export_kept kept for the chunk at va, its fd closed
 * (a failed export undoes the ones it made).  Pool lock held. */
void fp_chunk_export_drop(fp_chunks *ch, uint64_t va);
/* Pool destroy: every kept export dropped (what an unmap the driver
 * refused left) and the list freed, and the registry freed.  Pool lock
 * held. */
void fp_chunks_destroy(fp_chunks *ch);

/* Imports a peer's handle (an fd, or a fabric handle), counted. */
CUresult fp_chunk_import(fp_chunks *ch, fabpool_handle_type type, int fd, const CUmemFabricHandle *fabric,
                         CUmemGenericAllocationHandle *out);

/* Makes the device's primary context current; *saved to give back to fp_ctx_pop. */
fabpool_status fp_ctx_push(fp_chunks *ch, CUcontext *saved);
void fp_ctx_pop(fp_chunks *ch, CUcontext saved);
/* The driver's free and total bytes of the device (cuMemGetInfo in its primary context); 0 and 0 on an error. */
fabpool_status fp_chunks_device_memory(fp_chunks *ch, size_t *free_bytes, size_t *total_bytes);

#endif
