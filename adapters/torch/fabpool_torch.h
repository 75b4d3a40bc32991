/*
 * fabpool_torch.h - fabpool as PyTorch's CUDA allocator.
 *
 * libfabpool_torch.so is one file to load (fabpool is linked into it) with
 * the two functions torch.cuda.memory.CUDAPluggableAllocator takes:
 *
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *               "libfabpool_torch.so", "fabpool_torch_alloc_raising", "fabpool_torch_free")
 *   torch.cuda.memory.change_current_allocator(alloc)   # before any CUDA allocation
 *
 * fabpool_torch_alloc_raising (below) throws where fabpool_torch_alloc
 * returns NULL: PyTorch takes the pointer of the program's allocator
 * unchecked, so a NULL would reach the next kernel as address 0.  A
 * torch.cuda.MemPool's allocator takes fabpool_torch_alloc: PyTorch checks
 * there, frees what it caches, retries and raises torch.OutOfMemoryError.
 *
 * (or `import fabpool_torch; fabpool_torch.install()`, which does this;
 * install(stats=True) also makes torch.cuda.memory_stats and the functions
 * built on it answer from fabpool_torch_get_memory_stats below, and
 * fabpool_torch.mempool() gives a torch.cuda.MemPool on these functions for
 * programs that keep PyTorch's allocator: docs/integration.md).
 *
 * One pool per device, created on the first allocation for that device.
 *
 * Streams, as PyTorch expects them (fabpool_alloc_on_stream /
 * fabpool_free_on_stream, fabpool.h): a block freed on stream s is given
 * again at once to an allocation on s (stream order makes that safe; no
 * driver call).  An allocation on another stream gets it only once an event
 * that was recorded on s after the free has completed, so no kernel still
 * queued on s can touch it.  Blocks whose event has completed go back to the
 * pool.  The shim is built on fabpool's public API alone.
 * record_stream is not needed for this; work on a stream other than the
 * allocation stream is, as with PyTorch's own allocator, the caller's to
 * order.
 *
 * Streams are `void *` holding a cudaStream_t / CUstream (NULL: the legacy
 * default stream), so this header needs no CUDA header.  All functions are
 * thread-safe.
 */
#ifndef FABPOOL_TORCH_H
#define FABPOOL_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's alloc_fn: size bytes on `device` for work on `stream`.  NULL on
 * failure (size 0 gives NULL too, as PyTorch's own allocator does);
 * fabpool_torch_last_error() then says why.  PyTorch does not check the
 * result, so a failure is also printed to stderr (fabpool_torch_set_verbose). */
FABPOOL_API void *fabpool_torch_alloc(size_t size, int device, void *stream);
/* fabpool_torch_alloc for the whole program's allocator: a failed allocation
 * of one byte or more throws a C++ std::runtime_error with fabpool's message
 * (PyTorch's Python binding raises it as a RuntimeError; an out-of-memory
 * message opens with PyTorch's own sentences) instead of returning NULL.
 * Defined in C++: call it only through PyTorch's pluggable allocator, or from
 * C++. */
FABPOOL_API void *fabpool_torch_alloc_raising(size_t size, int device, void *stream);
/* PyTorch's free_fn: ptr, the size asked, its device and its allocation
 * stream.  NULL is ignored.  The shim keeps every block it has handed out
 * and not taken back (pointer, size asked, block size, stream); a pointer
 * that is not one of them for `device` (never given out, freed already, or
 * given out for another device) is refused: nothing changes, bad_frees
 * counts it (a device without a pool: in the sum over devices, -1) and one
 * message is printed (as for alloc).  The size and stream
 * recorded at the allocation are the ones used. */
FABPOOL_API void fabpool_torch_free(void *ptr, size_t size, int device, void *stream);

/* Returns everything cached to the driver: waits for the events of blocks
 * freed on a stream, gives them back to the pool and trims the pool to 0
 * bytes cached.  device -1: every device with a pool. */
FABPOOL_API fabpool_status fabpool_torch_empty(int device);

/* The device's pool stats and the shim's counters as one JSON object
 * {"device":D,"torch":{counters},"pool":{fabpool_stats_json}} into buf;
 * *needed gets its length + 1 (FABPOOL_ERR_LIMIT if cap is too small).
 * FABPOOL_ERR_NOT_FOUND while the device has no pool yet. */
FABPOOL_API fabpool_status fabpool_torch_stats_json(int device, char *buf, size_t cap, size_t *needed);

/* Every counter of fabpool_torch_counters, in its order: X(name).  The shim
 * sums, reports (fabpool_torch_stats_json) and describes
 * (fabpool_torch_struct_layout) them from this list, and the Python module
 * builds its structure from that description. */
#define FABPOOL_TORCH_COUNTERS(X)                                                                             \
    X(allocs)            /* allocations given out (non-NULL results) */                                      \
    X(frees)             /* frees of non-NULL pointers taken */                                               \
    X(alloc_failures)    /* NULL results for a size > 0 */                                                    \
    X(blocks_live)       /* given to the caller and not freed */                                              \
    X(bytes_live)        /* sizes asked of those */                                                           \
    X(usable_bytes_live) /* their block sizes (the pool's size classes) */                                    \
    X(bytes_live_peak)                                                                                        \
    X(reuse_same_stream) /* served from the stream's own freed blocks, no driver call */                      \
    X(reuse_after_event) /* a block of another stream, once its event completed */                            \
    X(pool_allocs)       /* fabpool_alloc calls that succeeded */                                             \
    X(pool_frees)        /* blocks given back to the pool (after their event, or at once on the owner) */      \
    /* cached_*: PyTorch's word for blocks freed and held for their stream: fabpool_counters' stream_pending_*,  \
     * not fabpool_stats' cached (memory mapped but free) */                                                 \
    X(cached_blocks)     /* freed blocks the pool holds for their stream (pending, fabpool_counters) */       \
    X(cached_bytes)      /* their block sizes */                                                              \
    X(events_recorded)   /* one per stream per batch of frees */                                              \
    X(event_queries)                                                                                          \
    X(syncs)             /* waits: empty, out of memory, a context sync for a failed event */                 \
    X(streams)           /* streams the pool keeps records for */                                             \
    X(empties)                                                                                                \
    X(bad_frees)         /* frees refused: a pointer not live (never given out, or freed already) */          \
    X(owner_frees)       /* frees on the pool's owner stream: to the pool at once (fabpool.h) */              \
    X(fences)            /* waits for the owner stream's work before an unmap or another stream's use */

#define FABPOOL_TORCH_COUNTER_FIELD(name) uint64_t name;
typedef struct fabpool_torch_counters {
    size_t struct_size; /* set by the caller: sizeof(fabpool_torch_counters) (fabpool.h) */
    FABPOOL_TORCH_COUNTERS(FABPOOL_TORCH_COUNTER_FIELD)
} fabpool_torch_counters;
#undef FABPOOL_TORCH_COUNTER_FIELD

/* Fills *out for one device (-1: the sum over every device); out->struct_size must be set. */
FABPOOL_API fabpool_status fabpool_torch_get_counters(int device, fabpool_torch_counters *out);

/* PyTorch's allocator statistics (torch.cuda.memory_stats), kept by the
 * shim per device, with PyTorch's meanings: `current` now, `peak` the most
 * since the last fabpool_torch_reset_peak_stats, `allocated` / `freed` the
 * total increase / decrease since the last
 * fabpool_torch_reset_accumulated_stats.  Arrays are indexed by
 * FABPOOL_TORCH_ALL, _SMALL_POOL (sizes asked up to 1 MiB, PyTorch's small
 * pool) and _LARGE_POOL. */
typedef struct fabpool_torch_stat {
    int64_t current, peak, allocated, freed;
} fabpool_torch_stat;

enum { FABPOOL_TORCH_ALL = 0, FABPOOL_TORCH_SMALL_POOL = 1, FABPOOL_TORCH_LARGE_POOL = 2 };
#define FABPOOL_TORCH_SMALL_SIZE (1u << 20)

typedef struct fabpool_torch_mem_stats {
    size_t struct_size;                    /* set by the caller: sizeof(fabpool_torch_mem_stats) (fabpool.h) */
    fabpool_torch_stat allocation[3];      /* blocks handed to PyTorch and not freed ("allocation", "active") */
    fabpool_torch_stat allocated_bytes[3]; /* their block sizes ("allocated_bytes", "active_bytes") */
    fabpool_torch_stat requested_bytes[3]; /* the sizes PyTorch asked for them ("requested_bytes") */
    fabpool_torch_stat segment;            /* chunks the device's pool has mapped */
    fabpool_torch_stat reserved_bytes;     /* bytes the device's pool has mapped: all that the driver holds for it */
    int64_t num_alloc_retries;             /* out of memory answered by a trim and a retry (shim and pool) */
    int64_t num_ooms;                      /* allocations the pool failed (out of memory, or too large) */
    int64_t num_sync_all_streams;          /* waits for the device (the shim's syncs) */
    int64_t num_device_alloc;              /* chunks mapped (cuMemCreate + cuMemMap) */
    int64_t num_device_free;               /* chunks unmapped */
} fabpool_torch_mem_stats;

/* Fills *out for one device (0 to 63); zeros for a device without a pool.
 * out->struct_size must be set.
 * reserved_bytes and segment are read from the pool: `current` exactly,
 * `peak` exactly (memory is mapped only inside an allocation, after which
 * the shim looks), `allocated` / `freed` as the sum of the changes seen
 * between the shim's looks. */
FABPOOL_API fabpool_status fabpool_torch_get_memory_stats(int device, fabpool_torch_mem_stats *out);
/* Every `peak` to its `current` (torch.cuda.reset_peak_memory_stats), and the pool's own marks
 * (fabpool_reset_peak); -1: every device. */
FABPOOL_API fabpool_status fabpool_torch_reset_peak_stats(int device);
/* Every `allocated` / `freed` and the num_* counts to 0 (torch.cuda.reset_accumulated_memory_stats). */
FABPOOL_API fabpool_status fabpool_torch_reset_accumulated_stats(int device);

/* The pool of a device (NULL while it has none), for fabpool.h's calls made
 * by code linked into this same library (the C++ allocator is).  The
 * library keeps fabpool's own symbols inside, so a program that loads it and
 * libfabpool.so has two copies of fabpool, each with its own driver and
 * thread caches: a pool of one must not be passed to the other (fabpool.h's
 * calls of libfabpool.so on this pool read a driver that copy never loaded).
 * From outside, use the fabpool_torch_* calls. */
FABPOOL_API fabpool_t *fabpool_torch_pool(int device);

/* The handle type the devices' pools are made with from now on (a pool made
 * already keeps its own); returns the old one.  FABPOOL_HANDLE_NONE by
 * default: local tensors, the cheapest chunks.  FABPOOL_HANDLE_POSIX_FD
 * makes their blocks shareable with other processes (fabpool_block_export;
 * the C++ allocator sets it for torch.multiprocessing), and falls back to
 * none on a device without POSIX fd handles.  FABPOOL_CONF=handle_type:...
 * overrides either. */
FABPOOL_API fabpool_handle_type fabpool_torch_set_handle_type(fabpool_handle_type type);

/* The calling thread's message for the last failure ("" if none). */
FABPOOL_API const char *fabpool_torch_last_error(void);

/* The version of fabpool inside this library (fabpool_version(), fabpool.h). */
FABPOOL_API const char *fabpool_torch_version(void);

/* The build this library comes from: an id made once per build folder
 * (-DFABPOOL_TORCH_BUILD_ID= sets it), which the Python module configured by
 * the same build also carries; the module refuses a library whose version or
 * build id differs from its own. */
FABPOOL_API const char *fabpool_torch_build_id(void);

/* The layout of every struct this library fills, as the compiler laid it out,
 * for bindings that build their own from it (the Python module's ctypes
 * classes are made from it at load): one JSON object
 * {"fabpool_sleep_info": {"size": N, "fields": {"struct_size": [offset, size,
 * type], ...}}, ...} with every field of fabpool_sleep_info,
 * fabpool_torch_counters, fabpool_torch_mem_stats, fabpool_torch_stat and
 * fabpool_torch_symm_info (symm.h), in their order.  A type is "i32", "u32", "i64" or "u64" (size_t is "u64"),
 * the name of another struct of the list, or that name followed by "[]" for
 * an array of them (size / its size elements). */
FABPOOL_API const char *fabpool_torch_struct_layout(void);

/* 1 (default): print failures to stderr, since PyTorch drops them; 0: quiet.
 * FABPOOL_TORCH_QUIET=1 in the environment sets 0.  Returns the old value. */
FABPOOL_API int fabpool_torch_set_verbose(int on);

/* Empties and destroys every pool (for tests and for the end of a program,
 * once PyTorch has freed everything): each device's (fabpool_torch_alloc)
 * and each tag's (fabpool_torch_tag_slot, the MemPools of
 * fabpool_torch.mempool(tag=...)), once the work on their streams is done.
 * A pool that still has live blocks stays as it is, its memory and data
 * with it, and keeps working; the others are destroyed, and the answer is
 * FABPOOL_ERR_BUSY with a message that names each device and tag left.
 * Afterwards fabpool_torch_alloc makes a new pool for its device; a
 * destroyed tag's slot is unbound, so its allocator pair answers NULL
 * (fabpool_torch_tag_last_error says why) until fabpool_torch_tag_slot
 * binds a tag to it again: a MemPool made before the shutdown must not be
 * used after it (make a new one).  No other thread may use the allocator
 * meanwhile. */
FABPOOL_API fabpool_status fabpool_torch_shutdown(void);

/* The report of every pool (the devices' and the tags') whose option
 * stats_print asks for one (FABPOOL_CONF=stats_print:text or json), to
 * stderr, as fabpool_destroy prints it: PyTorch never destroys its
 * allocator, so the Python module calls this at exit (atexit).  A pool
 * fabpool_torch_shutdown destroyed printed its report then. */
FABPOOL_API void fabpool_torch_print_stats_at_exit(void);

#ifdef __cplusplus
}
#endif
#endif
