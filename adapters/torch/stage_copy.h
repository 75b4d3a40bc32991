/* stage_copy.h - host copies of device memory through a small pinned staging
 * ring (fabpool_memory_saver's pause and resume; docs/rl-serving.md).
 *
 * A pause copies device memory into pageable host memory: DMA into a pinned
 * buffer of the ring, then a host memcpy out of it, several lanes (threads,
 * each with its own stream and two buffers) at once, so that the DMA of one
 * buffer overlaps the memcpy of the other.  A resume runs the reverse.  The
 * ring is pinned once per device and kept for the process; the host copies
 * are plain anonymous mappings (fabpool_torch_stage_host_map), given back to
 * the kernel with munmap, so that no pinning or unpinning is paid per pause.
 *
 * The driver is reached through the entry points the caller passes (the
 * Python module's ctypes handles of libcuda): the library never links
 * libcuda.  Every function returns 0 or an error (a CUresult, or -errno) and
 * writes what went wrong and what to do into err (errlen bytes). */
#ifndef FABPOOL_TORCH_STAGE_COPY_H
#define FABPOOL_TORCH_STAGE_COPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The driver's entry points, by address (cuMemHostAlloc, ...). */
typedef struct fabpool_torch_stage_driver {
    void *mem_host_alloc;        /* cuMemHostAlloc */
    void *mem_free_host;         /* cuMemFreeHost */
    void *device_get;            /* cuDeviceGet */
    void *primary_ctx_retain;    /* cuDevicePrimaryCtxRetain */
    void *primary_ctx_release;   /* cuDevicePrimaryCtxRelease_v2 */
    void *ctx_get_current;       /* cuCtxGetCurrent */
    void *ctx_set_current;       /* cuCtxSetCurrent */
    void *stream_create;         /* cuStreamCreate */
    void *stream_destroy;        /* cuStreamDestroy_v2 */
    void *stream_synchronize;    /* cuStreamSynchronize */
    void *event_create;          /* cuEventCreate */
    void *event_destroy;         /* cuEventDestroy_v2 */
    void *event_record;          /* cuEventRecord */
    void *event_synchronize;     /* cuEventSynchronize */
    void *memcpy_dtoh_async;     /* cuMemcpyDtoHAsync_v2 */
    void *memcpy_htod_async;     /* cuMemcpyHtoDAsync_v2 */
} fabpool_torch_stage_driver;

/* One copy: `bytes` between host address `host` and device address `dev`. */
typedef struct fabpool_torch_stage_item {
    uint64_t host, dev, bytes;
} fabpool_torch_stage_item;

typedef struct fabpool_torch_stage fabpool_torch_stage;

#define FABPOOL_TORCH_STAGE_MAX_LANES 16
#define FABPOOL_TORCH_STAGE_MIN_BUFFER (64u << 10)
#define FABPOOL_TORCH_STAGE_MAX_BUFFER (1u << 30)

/* A ring for `device`: `lanes` (1..16) threads, each with a stream and two
 * pinned buffers of `buffer_bytes` (64 KiB..1 GiB): 2 * lanes * buffer_bytes
 * pinned bytes, held until fabpool_torch_stage_destroy.  The calling
 * thread's current context is left as it was. */
int fabpool_torch_stage_create(const fabpool_torch_stage_driver *drv, int device, unsigned lanes,
                               size_t buffer_bytes, fabpool_torch_stage **out, char *err, size_t errlen);
/* Frees the ring's buffers, streams and events (NULL: nothing). */
int fabpool_torch_stage_destroy(fabpool_torch_stage *s, char *err, size_t errlen);
/* Copies every item (to_host: device to host, else host to device) through
 * the ring and returns when all are done.  On an error every lane stops,
 * waits for its DMA in flight, and the first error is returned: the bytes
 * of the items are then partly copied. One copy runs at a time per ring. */
int fabpool_torch_stage_copy(fabpool_torch_stage *s, const fabpool_torch_stage_item *items, size_t n, int to_host,
                             char *err, size_t errlen);
/* Pinned bytes the ring holds. */
uint64_t fabpool_torch_stage_pinned_bytes(const fabpool_torch_stage *s);

/* Pageable host memory for copies: an anonymous private mapping of `bytes`
 * (rounded up to the page), 2 MiB aligned and advised for huge pages where
 * the kernel offers them.  *out is 0 for 0 bytes. */
int fabpool_torch_stage_host_map(uint64_t bytes, uint64_t *out, char *err, size_t errlen);
/* Gives a mapping of fabpool_torch_stage_host_map back to the kernel. */
int fabpool_torch_stage_host_unmap(uint64_t addr, uint64_t bytes, char *err, size_t errlen);
/* Host bytes the lanes of copies to the host have faulted in ahead of their
 * memcpy (MADV_POPULATE_WRITE, Linux 5.14 and later), since the process
 * began: 0 where the kernel refuses it (the memcpy then faults the pages). */
uint64_t fabpool_torch_stage_populated_bytes(void);
/* Bytes of fabpool_torch_stage_host_map mappings held now by the process. */
uint64_t fabpool_torch_stage_host_bytes(void);
/* Host bytes the copies to the host installed by UFFDIO_COPY, without the
 * kernel zeroing them first (FABPOOL_STAGE_UFFD=1 at the ring's creation:
 * fresh pages of a copy are registered with a userfaultfd for its length;
 * where the kernel refuses one, the copies populate and memcpy as without). */
uint64_t fabpool_torch_stage_uffd_bytes(void);

/* Internal to the library (not exported): the pages of [a, a + len), page
 * aligned, given back by n threads (at most 16) with MADV_DONTNEED on pieces
 * of it side by side, the mapping kept (fabpool_torch_stage_host_unmap does
 * this before its munmap for a large copy).  The threads that ran. */
unsigned stage_host_zap(char *a, size_t len, unsigned n);

#ifdef __cplusplus
}
#endif
#endif
