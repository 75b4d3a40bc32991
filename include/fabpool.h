/*
 * fabpool.h - a size-class memory pool for CUDA device memory, built on the
 * driver's virtual memory management API.
 *
 * One pool per device.  The pool reserves its virtual address space once and
 * maps physical chunks into it; every physical handle is released right after
 * it is mapped, so unmapping a chunk frees its memory and no handle can leak.
 *
 * Every function that can fail returns a fabpool_status.  On anything but
 * FABPOOL_OK, fabpool_last_error() returns a message for the calling thread
 * that names the call, says what went wrong and what to do about it.  A
 * call that succeeds leaves the message as it was (errno's rule): it stays
 * the last failed call's.  The few that cannot
 * fail return their answer instead: fabpool_version, fabpool_build_info, fabpool_status_name,
 * fabpool_last_error, fabpool_options_init, fabpool_handle_type_of, fabpool_buffer_ptr,
 * fabpool_view_ptr and fabpool_desc_size (each says what it returns for a
 * NULL argument, where it takes one).
 *
 * Device pointers are `void *` (as cudaMalloc gives them); streams and events
 * are `void *` holding a CUstream / CUevent, so this header needs no CUDA
 * header.  All functions are thread-safe unless a comment says otherwise.
 *
 * Structs the library fills (fabpool_options through fabpool_get_options,
 * fabpool_buffer_info, fabpool_sleep_info, fabpool_stats, fabpool_counters,
 * and fabpool_torch.h's) begin with `struct_size`: the caller sets it to the
 * sizeof of the struct it was compiled with before the call
 * (`fabpool_stats s = {.struct_size = sizeof s};`; fabpool_options_init does
 * it for the options).  Each struct is taken at its current size and at the
 * sizes of older headers that this one names (FABPOOL_OPTIONS_SIZE_0_3: the
 * options are the only struct that has grown); any other size is refused
 * with FABPOOL_ERR_INVALID_ARG and the struct is left as it was.  A version
 * that grows a struct adds fields only at the end, names the old size here
 * and fills an older caller's struct up to it, so a program built against
 * an older fabpool.h keeps working.
 *
 * Sizes of 0 and NULL, as cudaMalloc, cudaMallocAsync, cudaFree and free()
 * answer them: fabpool_alloc and fabpool_alloc_on_stream of size 0 return
 * FABPOOL_OK and set *out to NULL (nothing is mapped, counted or traced, even
 * while the pool sleeps); fabpool_free, fabpool_free_on_stream and
 * fabpool_record_stream of a NULL pointer do nothing and return FABPOOL_OK;
 * fabpool_destroy(NULL) does nothing and returns FABPOOL_OK.  A NULL pool
 * (other than fabpool_destroy's) or a NULL output pointer is a caller's bug
 * and is refused with FABPOOL_ERR_INVALID_ARG, as are NULL buffers and views.
 *
 * Alignment: a block of 256 bytes or more (fabpool_alloc,
 * fabpool_alloc_on_stream) starts on a multiple of 256 bytes, as cudaMalloc
 * and RMM promise (CUDA_ALLOCATION_ALIGNMENT); a smaller one, unlike theirs,
 * on a multiple of its size rounded up to a power of two, at least 64 (a
 * 48-byte block is 64-byte aligned, a 200-byte one 256-byte aligned): ask
 * for 256 bytes, or fabpool_alloc_aligned, where a kernel needs more.  The
 * PyTorch adapters give every tensor at least 256.  fabpool_alloc_aligned
 * gives any larger power of two up to the pool's allocation granularity.
 *
 * fork: CUDA does not carry over a fork, so a child forked after a pool was
 * made can use neither the pool nor its memory.  There every call on the
 * pool or on its buffers and views (allocations and frees, the thread
 * cache's hits too, the stream pair, fabpool_record_stream, stats, counters
 * and options, fabpool_check, trim, collect, sleep, wake and sleep state,
 * buffers, views, exports and acknowledgements) answers
 * FABPOOL_ERR_NOT_SUPPORTED, saying so, before it takes any lock: a thread
 * of the parent may have held one at the fork, and no thread of the child
 * would ever let it go.  fabpool_handle_type_of, fabpool_buffer_ptr and
 * fabpool_view_ptr answer as in the parent (what was set at creation).
 * fabpool_destroy answers FABPOOL_ERR_NOT_SUPPORTED too and does nothing:
 * no lock, no driver call, no free; the pool's host memory (the parent's
 * pages, shared until written) goes when the child exits or execs.  A thread
 * of the child that exits leaves its caches of such a pool as they are.
 * fabpool_create and fabpool_device_count in a child forked after the
 * driver was initialized (a pool made, or the devices counted, before the
 * fork) answer FABPOOL_ERR_NOT_SUPPORTED too, saying so: the driver the
 * child inherited answers nothing.  Start the child with exec or spawn and
 * make a pool there.
 */
#ifndef FABPOOL_H
#define FABPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fabpool_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- version
 *
 * The version of this header; fabpool_version() says the library's (the two
 * differ when a program runs with another libfabpool.so than it was built
 * against).  The project's CMake version is these three numbers (CMake
 * refuses to configure otherwise); CHANGELOG.md says what each one brought. */
#define FABPOOL_VERSION_MAJOR 0
#define FABPOOL_VERSION_MINOR 4
#define FABPOOL_VERSION_PATCH 0
#define FABPOOL_VERSION_STRING "0.4.0"
/* One number that orders versions: 10000 * major + 100 * minor + patch (0.2.0 is 200). */
#define FABPOOL_VERSION (FABPOOL_VERSION_MAJOR * 10000 + FABPOOL_VERSION_MINOR * 100 + FABPOOL_VERSION_PATCH)

/* The library's version, "MAJOR.MINOR.PATCH" (FABPOOL_VERSION_STRING of the
 * fabpool.h it was built from). */
FABPOOL_API const char *fabpool_version(void);

/* The build the library comes from, one line made when it was built:
 * "fabpool <version> commit <commit> build <type> driver <sim|real>", the
 * commit being the source tree's git commit (12 hex digits, "-dirty" after it
 * when the tree had changes; "unknown" outside a git clone), the type CMake's
 * build type (Release, RelWithDebInfo, Debug, ...; "none" if unset) and the
 * driver the build's tests run against (FABPOOL_TEST_DRIVER; the library
 * itself loads whichever driver FABPOOL_CUDA_LIBRARY names).  For bug
 * reports; never NULL. */
FABPOOL_API const char *fabpool_build_info(void);

/* ----------------------------------------------------------------- options */

typedef enum fabpool_handle_type {
    FABPOOL_HANDLE_AUTO = 0,     /* fabric where a real probe works, else POSIX fd, else none */
    FABPOOL_HANDLE_NONE = 1,     /* local memory, not shareable */
    FABPOOL_HANDLE_POSIX_FD = 2, /* shareable between processes of one host */
    FABPOOL_HANDLE_FABRIC = 3    /* shareable across an NVLink fabric (needs an IMEX channel) */
} fabpool_handle_type;

typedef enum fabpool_metadata {
    FABPOOL_METADATA_AUTO = 0,     /* jemalloc if the process already has it, else libc */
    FABPOOL_METADATA_JEMALLOC = 1, /* jemalloc, loaded if the process lacks it; fail if impossible */
    FABPOOL_METADATA_LIBC = 2
} fabpool_metadata;

typedef enum fabpool_rdma {
    FABPOOL_RDMA_AUTO = 0, /* GPUDirect RDMA capable chunks where the device supports them (with VMM) */
    FABPOOL_RDMA_ON = 1,   /* always; pool creation fails on a device without the support */
    FABPOOL_RDMA_OFF = 2   /* never */
} fabpool_rdma;

/* How a pool maps the growth for a block above 256 KiB (large_chunks; docs/design.md, "Blocks above
 * slab_max"). */
typedef enum fabpool_large_chunks {
    FABPOOL_LARGE_CHUNKS_GRID = 0,  /* in chunks of a quarter of the block, 2 to 32 MiB (up to a 64th of the
                                       arena): once the block is freed, the chunks of its range that smaller
                                       blocks do not land in go back to the driver */
    FABPOOL_LARGE_CHUNKS_WHOLE = 1  /* as one chunk of up to max_chunk (larger: equal chunks of at most that):
                                       one driver call per block, for blocks that live long (PyTorch's segments
                                       of a region that sleeps); a smaller block later cut from a freed one's
                                       range keeps all of its chunk mapped */
} fabpool_large_chunks;

/* The log (FABPOOL_DEBUG, option debug): off; warn: what went wrong that a caller may not see; info: pool
 * creation (version, device, handle type and why, reservation, options other than the defaults), every chunk
 * mapped and unmapped, trims, decay, out-of-memory retries, sleep and wake, peers' acknowledgements; trace:
 * also every driver call, with its result and time. */
typedef enum fabpool_log_level {
    FABPOOL_LOG_NONE = 0,
    FABPOOL_LOG_WARN = 1,
    FABPOOL_LOG_INFO = 2,
    FABPOOL_LOG_TRACE = 3
} fabpool_log_level;

#define FABPOOL_MAX_PEERS 16
#define FABPOOL_TRACE_PATH_MAX 512  /* bytes of fabpool_options.trace_path, its NUL included */

typedef struct fabpool_options {
    uint32_t struct_size;          /* set by fabpool_options_init: sizeof(fabpool_options); fabpool_create and
                                      fabpool_get_options also take FABPOOL_OPTIONS_SIZE_0_3 (an older fabpool.h's:
                                      the fields after keep_ms taken as their defaults) and refuse any other */
    int device;                    /* CUDA device ordinal (conf key: device) */
    uint64_t reserve_bytes;        /* virtual address space reserved once; 0: 8x device memory (reserve) */
    fabpool_handle_type handle_type;   /* (handle_type: auto|none|posix_fd|fabric) */
    uint32_t max_waste_percent;    /* chunk rounding: at most this much over what was asked (max_waste) */
    uint64_t max_chunk_bytes;      /* largest physical chunk a growable buffer maps at once, and a large
                                      block's growth with large_chunks whole; 2 MiB to 1 PiB (max_chunk) */
    uint64_t slab_max_bytes;       /* sizes up to this (rounded up to a class) come from slabs; above, blocks cut
                                      by best fit, their size rounded up to 256 bytes (slab_max) */
    uint64_t cache_limit_bytes;    /* most free memory kept mapped for reuse (cache_limit); see decay_ms */
    uint32_t shrink_hysteresis_percent; /* a shrunk buffer keeps up to this much over its size mapped (shrink_hysteresis) */
    uint32_t thread_cache;         /* 1: per-thread caches of small blocks (thread_cache) */
    int stats_at_destroy;          /* 0 none, 1 text, 2 JSON report to stderr at destroy (stats_print) */
    fabpool_metadata metadata;     /* host metadata allocator (metadata: auto|jemalloc|libc) */
    int n_peer_devices;            /* local devices also given access to every chunk (peers: 1;2;3) */
    int peer_devices[FABPOOL_MAX_PEERS];
    char trace_path[FABPOOL_TRACE_PATH_MAX]; /* "" (default): no trace; else the file every allocation, free
                                      and buffer change is recorded to (trace; FABPOOL_TRACE wins over all):
                                      %p is replaced by the pid, %h by the host name, %d by the device, %% by %
                                      (docs/config.md) */
    fabpool_rdma rdma;             /* chunks made with allocFlags.gpuDirectRDMACapable (rdma: auto|on|off);
                                      fabpool_get_options answers on or off */
    const char *conf;              /* a FABPOOL_CONF-syntax string applied after these fields and
                                      before the FABPOOL_CONF environment variable (may be NULL) */
    uint32_t decay_ms;             /* free memory not reused for this long goes back to the driver;
                                      0: at once (decay_ms) */
    uint32_t large_slack_percent;  /* free memory a miss leaves mapped in each arena, in percent of that
                                      arena's live blocks, counted in free ranges that recent blocks would
                                      fit; beyond it a miss trades free chunks for the new block's
                                      (large_slack) */
    uint32_t sleep_keep_host;      /* 1: wake keeps the pinned host copies for the next sleep with offload,
                                      which reuses them when every chunk finds a piece of its size
                                      (sleep_keep_host); fabpool_trim frees them */
    uint32_t stream_owner;         /* 1: the first stream of the stream pair owns the pool: its frees go to the
                                      pool at once (docs/design.md, "Stream-ordered free"); 0: every stream's
                                      frees wait in the queue (stream_owner) */
    int debug;                     /* the log's level, a fabpool_log_level (debug: none|warn|info|trace);
                                      FABPOOL_DEBUG wins over it.  The log is the process's: its level is the
                                      highest any pool or FABPOOL_DEBUG asked for (docs/config.md, "Log") */
    uint32_t keep_ms;              /* a buffer or view given up with fabpool_buffer_release or
                                      fabpool_view_release keeps its window and chunks this long for the next
                                      fabpool_buffer_reuse or fabpool_view_open_peer of it; 0: given back at once
                                      (keep_ms) */
    /* fields from 0.4 on: a struct of FABPOOL_OPTIONS_SIZE_0_3 bytes ends above */
    fabpool_large_chunks large_chunks; /* how the growth for a block above 256 KiB is mapped
                                      (large_chunks: grid|whole) */
} fabpool_options;

/* The struct_size of fabpool_options in the fabpool.h of 0.3 (the offset of large_chunks). */
#define FABPOOL_OPTIONS_SIZE_0_3 680u

/* Fills *o with the defaults (docs/config.md lists them). */
FABPOOL_API void fabpool_options_init(fabpool_options *o);

/* Applies a "key:value,key:value" string to *o (what pool creation does with
 * o->conf and with FABPOOL_CONF).  FABPOOL_ERR_CONFIG names the bad key or value. */
FABPOOL_API fabpool_status fabpool_options_parse(fabpool_options *o, const char *conf);

/* -------------------------------------------------------------------- pool */

typedef struct fabpool fabpool_t;

/* Creates a pool.  opts may be NULL for the defaults.  The environment
 * variable FABPOOL_CONF overrides opts.  FABPOOL_CUDA_LIBRARY names the
 * driver library to load (default libcuda.so.1). */
FABPOOL_API fabpool_status fabpool_create(const fabpool_options *opts, fabpool_t **out);

/* Destroys a pool: waits for pending retirements, unmaps everything, frees the
 * reservation.  Buffers and allocations still live are unmapped too (their
 * count is reported in the message, and the status is FABPOOL_ERR_BUSY, but
 * the pool is gone either way).  No other thread may use the pool meanwhile.
 * The pool pointer is freed memory after it (a call with it is undefined);
 * the handles of its buffers and views are refused (the handles paragraph
 * under "growable buffers").  A NULL pool: nothing is done and the answer is FABPOOL_OK.  A pool made
 * before this process was forked: nothing is done, FABPOOL_ERR_NOT_SUPPORTED
 * (the fork paragraph at the top of this file). */
FABPOOL_API fabpool_status fabpool_destroy(fabpool_t *pool);

/* The options in force (after FABPOOL_CONF), and the handle type chosen
 * (fabpool_handle_type_of returns it: FABPOOL_HANDLE_NONE for a NULL pool).
 * out->struct_size must be set (fabpool_options_init sets it). */
FABPOOL_API fabpool_status fabpool_get_options(const fabpool_t *pool, fabpool_options *out);
FABPOOL_API fabpool_handle_type fabpool_handle_type_of(const fabpool_t *pool);

/* ------------------------------------------------------ size-class blocks */

/* Allocates size bytes of device memory.  Sizes up to slab_max (4 KiB by
 * default) come from slabs of size classes (64 and 128 bytes, the multiples
 * of 256 up to 1024, then four per doubling), cached per thread; larger ones
 * are cut by best fit from an arena of blocks (up to 256 KiB, the medium
 * arena; above, the large one), their size rounded up to 256 bytes, free
 * neighbours merged.
 * The worst case of this layout, per block: a block of size s gets s rounded
 * up to a power of two (at least 64) up to 256 bytes, s rounded up to 256
 * bytes from 257 to 1024 (at most 2 s: 257 bytes get 512), at most 1.25 s
 * from 1025 to slab_max (its class: 2^k + 1 bytes get 1.25 x 2^k), and s
 * rounded up to 256 bytes above slab_max (at most s + 255: at most 1.06 s).
 * A block alone in its pool maps at most s rounded up to the granularity
 * (2 MiB) plus one granule.  Beyond the blocks, a pool
 * maps the free ranges that best fit leaves between live blocks (on
 * fabpool_bench's shapes 3-7 % of the live bytes, docs/performance.md), up
 * to large_slack of free chunks per arena that no miss traded away, and,
 * while an arena grows fast, what a miss maps ahead of it: at most 4 MiB
 * in the medium arena, 64 MiB in the large one for blocks under 8 MiB
 * (docs/design.md, "Blocks above slab_max").
 * Alignment: 256 bytes (what cudaMalloc promises) for every size of 256 or
 * more; a smaller size gets its size rounded up to a power of two, at least
 * 64 (the conventions at the top of this file).
 * The block is for use at once: freeing it makes it reusable at once, so the
 * caller must not free a block that GPU work may still touch (see
 * fabpool_free_on_stream). */
FABPOOL_API fabpool_status fabpool_alloc(fabpool_t *pool, size_t size, void **out);
/* fabpool_alloc with the block's base a multiple of `alignment`, a power of
 * two from 1 to the pool's allocation granularity (the driver's, 2 MiB on
 * the GPUs fabpool targets): any other alignment is refused with
 * FABPOOL_ERR_INVALID_ARG, the message giving the granularity.  An alignment
 * the block gets anyway (fabpool_alloc's, above) is fabpool_alloc's block; a
 * larger one up to slab_max is a size class that is a multiple of it (a
 * 100-byte block aligned to 4 KiB is a 4 KiB block), and above slab_max (or
 * above the 64 KiB of a slab's page) a block of the arenas placed on a
 * multiple of it.  An alignment that is not a power of two up to the
 * granularity is refused (FABPOOL_ERR_INVALID_ARG) whatever the size; then
 * size 0 returns FABPOOL_OK with *out NULL.  The block is a
 * block as fabpool_alloc's: fabpool_free, fabpool_free_on_stream,
 * fabpool_record_stream, fabpool_usable_size (>= size) and the export calls
 * take it.  A trace records the fabpool_alloc it makes: of that class, or of
 * slab_max + 1 bytes for a size up to slab_max placed in the arenas. */
FABPOOL_API fabpool_status fabpool_alloc_aligned(fabpool_t *pool, size_t size, size_t alignment, void **out);
FABPOOL_API fabpool_status fabpool_free(fabpool_t *pool, void *ptr);

/* Stream-ordered blocks (docs/design.md, "Stream-ordered free").  `stream`
 * is a CUstream; NULL is the legacy default stream (not "no stream").
 * fabpool_free_on_stream frees a block (from fabpool_alloc or
 * fabpool_alloc_on_stream) that work queued on `stream` may still use: an
 * allocation on the same stream may get it back at once (stream order makes
 * that safe: no driver call), while fabpool_alloc and other streams get it
 * only after an event recorded on `stream` at or after the free has
 * completed.  Until then it stays a live block for the pool: no trim, decay
 * or out-of-memory retry unmaps its memory.  The pool records one event per
 * stream for any number of frees, lazily: when other allocations miss, at
 * trim, collect and destroy, or after 256 frees / 256 MiB on the stream.
 * Work on other streams that uses the block is the caller's to order before
 * the free (record an event and make `stream` wait on it), as with
 * cudaFreeAsync.
 * fabpool_alloc_on_stream allocates for work on `stream`: a block freed on
 * `stream` of the same size class (above slab_max: of at least the size
 * rounded up to 256 bytes and at most 1.25x the size) first, else as
 * fabpool_alloc does.  The same alignment and size rules as fabpool_alloc.
 * A foreign, interior or already freed pointer is refused
 * (FABPOOL_ERR_NOT_FOUND, FABPOOL_ERR_DOUBLE_FREE) and nothing changes;
 * fabpool_free of a block already freed on a stream is a double free too.
 * The check sees frees one after another, as a host allocator's does: two
 * threads that free the same block at the same instant (a race in the
 * program) may both get FABPOOL_OK, and the block is then given out twice;
 * fabpool_check reports the damage.  The frees' fast paths take no lock and
 * no atomic exchange (one would add about a quarter to a small block's
 * alloc + free pair).
 * The owner stream (option stream_owner, on by default): the first stream
 * given to either call owns the pool, and a block it frees goes to the pool
 * at once, so its next allocations reuse that memory in any shape (no
 * pending state, stream_owner_frees).  Any unmap, and the first
 * fabpool_alloc or use of another stream, first wait for the owner's queued
 * work (stream_fences); the latter ends the owner mode for good, and from
 * then on every stream works as described above.
 * fabpool_collect(pool, 1) waits for every stream and gives every pending
 * block back to the pool; fabpool_destroy does the same.
 * The per-thread default stream (CU_STREAM_PER_THREAD) names a different
 * stream in every thread, which no record of the handle tells apart: an
 * allocation on it is fabpool_alloc's, and a free on it waits for the
 * calling thread's stream, then frees as fabpool_free does (it never owns
 * the pool); fabpool_record_stream refuses it.  CU_STREAM_LEGACY
 * ((void *)0x1, cudaStreamLegacy) is the legacy default stream NULL names:
 * the pair and fabpool_record_stream take the two as the same stream. */
FABPOOL_API fabpool_status fabpool_alloc_on_stream(fabpool_t *pool, size_t size, void *stream, void **out);
FABPOOL_API fabpool_status fabpool_free_on_stream(fabpool_t *pool, void *ptr, void *stream);
/* Ends the owner mode now, for good: waits for the owner stream's work
 * queued so far (one event, made now) and from then on every stream's frees
 * wait for their events; a pool with no owner yet gets none.  For a caller
 * about to capture a CUDA graph, during which no event may be recorded on
 * the capturing stream (were it the owner, another stream's allocation would
 * end the mode then).  A wait the driver refuses leaves the mode as it was. */
FABPOOL_API fabpool_status fabpool_stream_owner_end(fabpool_t *pool);
/* Another stream uses a block (what PyTorch's Tensor.record_stream says).
 * `stream` (a CUstream; NULL is the legacy default stream, which PyTorch
 * passes as 0, not "no stream") uses the live block at ptr (from
 * fabpool_alloc or fabpool_alloc_on_stream) beside the stream the block will
 * be freed on.  At the block's free (fabpool_free, or fabpool_free_on_stream
 * on any stream) the pool records an event on each recorded stream, and on
 * the stream of a fabpool_free_on_stream, and the block is reused (by any
 * stream, the one it was freed on included) or unmapped only once all of
 * them have completed: the work queued on those streams up to the free.
 * Until then it is a pending block, as after fabpool_free_on_stream.  A
 * stream is recorded once however often it is given, and a recorded stream
 * that is the stream of the free adds nothing: a block recorded only on the
 * stream it is then freed on (the owner stream included) is freed as without
 * the call.  The records go with the free; a block given out again has none.
 * Refused, nothing changed: a NULL pool or pointer (FABPOOL_ERR_INVALID_ARG);
 * a pointer this pool did not give out, an interior one, or a block already
 * freed, also one freed on a stream and pending (FABPOOL_ERR_NOT_FOUND); no
 * host memory for the record (FABPOOL_ERR_HOST_MEMORY).
 * Sleep and destroy: the call works while the pool sleeps (it changes only
 * records); fabpool_sleep and fabpool_destroy wait for the blocks freed with
 * recorded streams, as for blocks freed on a stream; a live block keeps its
 * streams across a sleep and a wake; destroy forgets those of blocks still
 * live.  A block with no recorded stream is allocated and freed as before:
 * the fast paths make no extra check (a slab block's free flag marks a
 * recorded block, a large block's free asks the records only while any
 * block has them). */
FABPOOL_API fabpool_status fabpool_record_stream(fabpool_t *pool, void *ptr, void *stream);
/* The size a block was given (>= the size asked; its class up to slab_max, <= 1.25x it above 1 KiB; the size
 * rounded up to 256 B above slab_max, or up to 1.25x it for a block fabpool_alloc_on_stream took back from its
 * stream; more for fabpool_alloc_aligned's larger alignments).  A block freed on a stream whose work is not known
 * done yet is still given out (its memory is the stream's until then): its size is answered too.  A freed block
 * and a pointer the pool did not give out: FABPOOL_ERR_NOT_FOUND. */
FABPOOL_API fabpool_status fabpool_usable_size(fabpool_t *pool, const void *ptr, size_t *out);

/* Returns free cached memory to the driver until at most keep_bytes of it stay
 * mapped (0: all).  Flushes the calling thread's cache first; other threads'
 * caches are flushed when they next call the pool or exit.  Memory is
 * unmapped by whole chunks: free memory that shares a slab with live blocks,
 * or a chunk with a live block, stays mapped until they are freed (a chunk
 * is up to 64 MiB where an arena grew fast, else a quarter of the block it
 * was mapped for, capped at the largest of four granules, a 64th of what
 * its arena held and a 64th of the block).  Without a call, free memory
 * goes back by itself once unused for decay_ms (docs/config.md). */
FABPOOL_API fabpool_status fabpool_trim(fabpool_t *pool, size_t keep_bytes);
/* Returns the calling thread's cached blocks to the pool; cache_limit and decay_ms then apply to the memory they
 * free, as to any free (cache_limit 0: slabs left empty are unmapped at once). */
FABPOOL_API fabpool_status fabpool_thread_flush(fabpool_t *pool);

/* Writes what every trace of the process (option trace, FABPOOL_TRACE) holds in its buffer to its file, so that
 * fabpool_trace can read the run so far while it goes on (as a trace its writer has not completed yet).
 * FABPOOL_ERR_IO if a write failed (the message names the file; that trace stops, as on any failed write). */
FABPOOL_API fabpool_status fabpool_trace_flush(void);

/* --------------------------------------------------------- growable buffers */

typedef struct fabpool_buffer fabpool_buffer_t;

/* Handles.  A buffer's handle is the caller's from fabpool_buffer_create or
 * fabpool_buffer_reuse until fabpool_buffer_destroy or fabpool_buffer_release
 * answers FABPOOL_OK, or the pool is destroyed; a view's (fabpool_view_t,
 * below) from fabpool_view_open or fabpool_view_open_peer until
 * fabpool_view_close or fabpool_view_release answers FABPOOL_OK, or its pool
 * is destroyed.  After that, every call that takes the handle refuses it with
 * FABPOOL_ERR_INVALID_ARG and a message naming the call (fabpool_buffer_ptr
 * and fabpool_view_ptr answer NULL) and changes nothing: the library reads
 * nothing of what the handle named, and no new buffer or view gets the same
 * handle before at least 1024 more of the process's buffers and views have
 * been freed after it (a reused buffer and a view taken back come under new
 * handles too).  A view's handle given as a buffer's, or the reverse, and a
 * pointer that never was a handle are refused the same way.  Undefined: a
 * handle that one thread uses while another destroys, releases or closes it
 * (the caller's race, as for free()), and a stale handle used after 1024 more
 * were freed (it may name a new buffer or view by then). */

/* A buffer with its own address window of max_size bytes (rounded up to the
 * granularity) and size bytes mapped at its start.  Its address never changes.
 * While the pool sleeps: FABPOOL_ERR_ASLEEP (whatever the sizes).  No free
 * range of max_size in the pool's reservation: FABPOOL_ERR_LIMIT.  On any
 * failure nothing of the buffer is left. */
FABPOOL_API fabpool_status fabpool_buffer_create(fabpool_t *pool, size_t max_size, size_t size,
                                                fabpool_buffer_t **out);
/* Grows or shrinks the buffer to `size` bytes (0 < size <= max_size).
 * Growing maps only the missing chunks behind the mapped ones: data already
 * there stays.  Shrinking keeps chunks mapped up to the hysteresis limit and
 * retires the rest: they are unmapped only once the GPU work that may use
 * them is done.  `stream` (a CUstream or NULL) says which work: with a
 * stream, the pool records an event on it and unmaps after the event has
 * completed; with NULL, the pool synchronizes the context before it unmaps.
 * A grow on another stream that takes a retired chunk back keeps that
 * stream's event: a later shrink or replacement of the chunk unmaps it only
 * once the work of every stream it was retired on is done.  A chunk only
 * partly needed is replaced by a smaller one; where no device memory or
 * address space is left for that, or the driver refuses a step of it, it
 * stays mapped whole until a later shrink (the shrink succeeds: the
 * replacement comes after the resize and only saves memory).
 * All or nothing, as fabpool_buffer_resize_set. */
FABPOOL_API fabpool_status fabpool_buffer_resize(fabpool_buffer_t *buf, size_t size, void *stream);
/* Resizes n buffers of one pool at once (HybridEP grows its buffer set from
 * one token count).  All or nothing: whatever fails (host memory, a driver
 * call of any step: a grow's create or map, the context synchronize or the
 * event of a shrink), the call answers an error and changes nothing a
 * caller can see: every buffer keeps its size, its data, its mapped bytes,
 * its chunk count and its generation (so its peers get no delta), and the
 * chunks retired earlier stay retired.  Every step that can fail is done for
 * every buffer first, in a form that can be undone, and only then does any
 * buffer change.  Only a driver that refuses the undo itself as well (a
 * second fault) can leave something behind: a chunk it would not unmap
 * stays retired, unseen, until fabpool_collect unmaps it.  One second fault
 * is not all or nothing: a shrink's replacement chunk (above) and then its
 * old chunk mapped back both refused lose that chunk.  The call answers
 * FABPOOL_ERR_PARTIAL: every other buffer has its new size, and that buffer
 * ends where the lost chunk began (its size and mapped bytes, possibly 0:
 * it never counts bytes it does not map), its data below kept, its
 * generation new; resize it to use more. */
FABPOOL_API fabpool_status fabpool_buffer_resize_set(fabpool_buffer_t *const *bufs, const size_t *sizes,
                                                    size_t n, void *stream);
/* Unmaps everything (after the work on `stream`, as for resize) and frees the
 * window.  After FABPOOL_OK, buf is refused (handles, above); on failure it
 * is live as before. */
FABPOOL_API fabpool_status fabpool_buffer_destroy(fabpool_buffer_t *buf, void *stream);
/* Gives the buffer up but keeps its window, its chunks and their exported
 * handles for keep_ms (an option, 1000 ms by default), so that the next
 * fabpool_buffer_reuse maps only what it lacks: code that frees a buffer set
 * and allocates it again larger (HybridEP's update_buffer) pays for the
 * growth alone, and its peers import only the new chunks.  As with
 * fabpool_free, no GPU work may still use the buffer, nor any peer (POSIX fds:
 * a peer's view keeps its own mapping; fabric: acknowledge the peers first,
 * fabpool_buffer_peers_ack).  A kept buffer is destroyed when keep_ms has
 * passed (at the pool's next release, reuse or collect), by a reuse that
 * finds none that fits, by fabpool_trim, by an out-of-memory retry, by sleep
 * and at pool destroy; fabpool_stats.kept_bytes counts what they map.  With
 * keep_ms 0 this is fabpool_buffer_destroy(buf, NULL), and so it is while the
 * pool sleeps (whose sleep gave back what was kept, and a reuse is refused
 * until the wake): nothing is kept, and the wake does not map the buffer
 * again; a driver call refused there leaves the buffer live, as that
 * destroy does.  After it, buf is refused (handles, above): a reuse hands
 * the buffer out under a new handle. */
FABPOOL_API fabpool_status fabpool_buffer_release(fabpool_buffer_t *buf);
/* A buffer of `size` bytes made from a released one: the kept buffer whose
 * window holds size and whose mapped bytes are nearest to it, resized to size
 * (growing maps only the missing chunks; shrinking retires after the work on
 * `stream`, as fabpool_buffer_resize).  Its base address and export id are
 * the released buffer's, its bytes whatever it held; *out is a new handle
 * (the released one stays refused).  FABPOOL_ERR_NOT_FOUND
 * when no kept buffer's window holds size: every kept buffer is then given
 * back (a miss ends the reuse, so that kept memory never adds to new
 * memory), and the caller creates one.  While the pool sleeps (which gave
 * the kept buffers back): FABPOOL_ERR_ASLEEP.  A resize that fails (device
 * memory, the driver) hands nothing out and gives the buffer back, with the
 * resize's status (FABPOOL_ERR_DRIVER where two driver faults made it lose
 * a chunk: its FABPOOL_ERR_PARTIAL); where the driver refuses giving it
 * back too, the buffer stays kept. */
FABPOOL_API fabpool_status fabpool_buffer_reuse(fabpool_t *pool, size_t size, void *stream, fabpool_buffer_t **out);

typedef struct fabpool_buffer_info {
    size_t struct_size;   /* set by the caller: sizeof(fabpool_buffer_info) (see the top of this header) */
    void *base;           /* never changes */
    size_t size;          /* the size asked last */
    size_t mapped;        /* bytes mapped: >= size */
    size_t max_size;      /* the address window */
    uint32_t n_chunks;    /* chunks mapped */
    uint64_t generation;  /* grows by one at every change of the mapped chunks */
    uint64_t export_id;   /* names the buffer in its descriptors, the same in every process
                             (fabpool_peers_ack takes it) */
} fabpool_buffer_info;
FABPOOL_API fabpool_status fabpool_buffer_get_info(const fabpool_buffer_t *buf, fabpool_buffer_info *out);
/* The buffer's base address; it never changes.  NULL for a NULL buffer and
 * for one refused (handles, above; the message says why). */
FABPOOL_API void *fabpool_buffer_ptr(const fabpool_buffer_t *buf);

/* A dma-buf file descriptor for bytes [offset, offset + size) of the
 * buffer (cuMemGetHandleForAddressRange, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD),
 * for registering the memory with a NIC (ibv_reg_dmabuf_mr) or another
 * driver.  The range must lie in the buffer's mapped bytes (info.mapped) and
 * offset and size must be multiples of the host page size; it may span
 * several chunks (docs/design.md says what the driver does then).  The
 * caller owns *fd and closes it; an open fd keeps the range's memory alive
 * after a shrink or a destroy.  A resize changes the chunks behind the
 * range, and so does a sleep: take a new fd after the resize or the wake (an
 * fd from before names the memory given up, which the driver keeps for it
 * until it is closed, not the buffer's).  FABPOOL_ERR_NOT_SUPPORTED where the
 * device has no dma-buf support.  On failure *fd is -1. */
FABPOOL_API fabpool_status fabpool_buffer_dmabuf(fabpool_buffer_t *buf, size_t offset, size_t size, int *fd);

/* The stream queue: unmaps the retired buffer chunks whose GPU work has
 * completed and gives back to the pool the stream-pending blocks (freed on a stream) whose
 * event has completed (recording one event on each stream with frees no
 * event covers yet); with wait != 0, waits for all of it first.  Resize,
 * trim and destroy also do this (destroy waits). */
FABPOOL_API fabpool_status fabpool_collect(fabpool_t *pool, int wait);

/* ----------------------------------------------------------- sleep and wake
 *
 * A pool can give its device memory back between phases of a program (an RL
 * trainer and an inference server sharing one GPU) and get it back at the
 * same addresses.  The tag is the pool: make one pool per kind of memory
 * (weights, KV cache, ...) and sleep each with the mode it needs
 * (docs/design.md says why).
 *
 * fabpool_sleep waits for the GPU work on `stream` (a CUstream; NULL: the
 * whole context) to finish, returns the free cached memory to the driver (as
 * fabpool_trim(pool, 0)), and then, for every chunk still mapped (the chunks
 * of the arenas of slabs and blocks, the chunks of growable buffers), copies its bytes to
 * pinned host memory first (FABPOOL_SLEEP_OFFLOAD; VMM host NUMA memory of
 * the node next to the device), unmaps it and releases its physical memory.
 * Every address stays reserved, every block and buffer stays allocated.
 * While asleep, fabpool_alloc, fabpool_alloc_on_stream (whatever its
 * stream freed meanwhile), buffer create, resize and reuse, export,
 * fabpool_buffer_dmabuf and view open/apply answer FABPOOL_ERR_ASLEEP;
 * frees (fabpool_free, fabpool_buffer_destroy, and fabpool_buffer_release,
 * which keeps nothing then: a destroy) work and only change the pool's
 * records.  Views of other processes' buffers stay mapped (their
 * memory is the exporter's).  A pool with an exported buffer whose peers
 * have not all acknowledged with UINT64_MAX (views may read it) is refused
 * with FABPOOL_ERR_BUSY, as is a second sleep (FABPOOL_ERR_ASLEEP).
 * A dma-buf fd still open keeps its range's memory alive (fabpool_buffer_dmabuf),
 * the old memory: after the wake the buffer is new memory, so close such an fd
 * (deregister it from the NIC) before the sleep and take a new one after.
 * On failure (host memory, a driver call) the pool is as before the call
 * (awake, data in place); only the cached memory trimmed stays returned.
 * The one exception, FABPOOL_ERR_PARTIAL, leaves the pool asleep
 * (fabpool_sleep_state says so) for fabpool_wake to complete: a discard
 * sleep whose unmap of a chunk the driver refuses (twice) after it has
 * unmapped others has dropped their contents, and mapping fresh memory back
 * under live blocks would hand them out changed, so it goes on: the other
 * chunks go, the refused ones stay mapped (their memory still held), and
 * discarded_bytes counts what was dropped.  A sleep that rolled back (the
 * chunks unmapped mapped again: offload, or a discard's first chunk
 * refused) and whose rollback failed too answers it as well, its host
 * copies kept for the wake.
 *
 * fabpool_wake maps fresh device memory at the same addresses in the same
 * chunks, restores the offloaded bytes (copied on `stream`, then waited for),
 * and frees the host copies.  Discarded memory comes back with unspecified
 * contents.  Memory freed while asleep is not mapped again.  On failure
 * (device out of memory) the pool stays asleep with what was restored kept:
 * call fabpool_wake again once memory is free; nothing is lost.
 * Neither may run while another thread allocates from the pool. */
typedef enum fabpool_sleep_mode {
    FABPOOL_SLEEP_DISCARD = 0,   /* contents dropped */
    FABPOOL_SLEEP_OFFLOAD = 1    /* contents copied to pinned host memory and restored at wake */
} fabpool_sleep_mode;

FABPOOL_API fabpool_status fabpool_sleep(fabpool_t *pool, fabpool_sleep_mode mode, void *stream);
FABPOOL_API fabpool_status fabpool_wake(fabpool_t *pool, void *stream);

typedef struct fabpool_sleep_info {
    size_t struct_size;          /* set by the caller: sizeof(fabpool_sleep_info) */
    int asleep;                  /* 1 from a successful fabpool_sleep until fabpool_wake completes */
    fabpool_sleep_mode mode;     /* the last sleep's mode */
    uint64_t offloaded_bytes;    /* the last sleep: device bytes copied to host (restored at its wake) */
    uint64_t discarded_bytes;    /* the last sleep: device bytes dropped (discard mode, or retired buffer
                                    chunks no one can read) */
    uint64_t host_bytes;         /* pinned host memory held now for the copies (with sleep_keep_host: also
                                    after a wake, until the next sleep reuses it or fabpool_trim frees it) */
    uint64_t host_copies;        /* pieces of it (one per chunk offloaded), each mapped once */
    uint64_t sleeps, wakes;      /* all time: sleeps that went to the end (a discard sleep's
                                    FABPOOL_ERR_PARTIAL too), wakes that completed */
    uint64_t host_reused_bytes;  /* the last sleep: host memory kept from the last wake and used again (no
                                    cuMemCreate), 0 where it was made anew */
} fabpool_sleep_info;
FABPOOL_API fabpool_status fabpool_sleep_state(fabpool_t *pool, fabpool_sleep_info *out);

/* ------------------------------------------------------------------- stats */

#define FABPOOL_NUM_CLASSES 128  /* slab classes and classes of larger blocks reported */
#define FABPOOL_NUM_DRIVER_CALLS 40

/* One row per slab class in use, then one per class of the grid that blocks
 * above slab_max fall in: such a row counts the blocks whose size (a
 * multiple of 256 bytes) is above the class below and at most `size`; they
 * have no cached blocks or slabs of their own (their free memory is merged
 * into free ranges, counted in cached_bytes). */
typedef struct fabpool_class_stats {
    uint64_t size;        /* class size in bytes; 0 ends the list */
    uint64_t in_use;      /* blocks given out */
    uint64_t cached;      /* slab classes: free blocks kept mapped (slabs, thread caches); others: 0 */
    uint64_t slabs;       /* slab classes: slabs mapped; others: 0 */
    uint64_t allocs;      /* allocations served, all time */
} fabpool_class_stats;

typedef struct fabpool_stats {
    size_t struct_size;             /* set by the caller: sizeof(fabpool_stats) */
    uint64_t reserved_bytes;        /* virtual address space reserved */
    uint64_t mapped_bytes;          /* physical bytes mapped by this pool (what the driver holds for it) */
    uint64_t mapped_bytes_peak;     /* the most mapped_bytes since creation or fabpool_reset_peak: exact (kept as
                                       each chunk is mapped) */
    uint64_t in_use_bytes;          /* bytes of blocks given out (size classes) + buffer sizes asked */
    uint64_t in_use_bytes_peak;     /* the most bytes in use since creation or fabpool_reset_peak, kept as
                                       allocations happen (never below the true high-water mark of in_use_bytes).
                                       Blocks above slab_max and buffers are counted when they are given out or grow;
                                       slab blocks when they leave their class: without a thread cache
                                       (thread_cache:0, the PyTorch shim) that is when each is given out, so the
                                       mark is exact; with one, a cache takes up to half a bin at a refill, so the
                                       mark may exceed the true one by the free blocks thread caches held at its
                                       moment: at most, per thread and slab class, a bin of min(64, max(2, 8 MiB /
                                       class size)) blocks (64 blocks, 256 KiB at most, for the default slab_max
                                       of 4 KiB), no matter how long the run.  The thread-cache hit of fabpool_alloc / fabpool_free
                                       counts nothing.  fabpool_print_stats says which it is (the JSON's
                                       in_use_bytes_peak_exact). */
    uint64_t cached_bytes;          /* mapped but free: slabs, the arenas' free ranges, buffer hysteresis */
    uint64_t retiring_bytes;        /* buffer chunks waiting for GPU work before unmap */
    uint64_t stream_pending_bytes;  /* blocks freed on a stream, waiting for its work (fabpool_free_on_stream);
                                       part of in_use_bytes: the pool counts them live until then */
    uint64_t stream_pending_blocks; /* their number; part of blocks */
    uint64_t view_bytes;            /* mapped from peers' buffers (views); part of mapped_bytes */
    uint64_t held_for_peers_bytes;  /* left an exported buffer's window, kept by a handle until the peers ack;
                                       not part of mapped_bytes */
    uint64_t buffers;               /* live growable buffers */
    uint64_t blocks;                /* live size-class blocks */
    uint64_t chunks_mapped;         /* chunks mapped now */
    uint64_t chunks_mapped_total;   /* all time */
    uint64_t chunks_unmapped_total;
    uint64_t handles_outstanding;   /* physical handles the pool holds now (0 except mid-export, and one per
                                       chunk held for peers: held_for_peers_bytes) */
    uint64_t exported_fds_open;     /* exported fds the pool still holds, its export anchor among them (one fd
                                       kept open while a chunk of the pool's is mapped, so that fd exports stay
                                       cheap: docs/design.md) */
    uint64_t oom_retries;           /* out of memory answered by a trim (or a wait for the blocks pending on
                                       streams) and a retry */
    uint64_t metadata_bytes;        /* host metadata in use */
    int metadata_jemalloc;          /* 1: host metadata lives in a private jemalloc arena */
    unsigned metadata_arena;        /* its arena index */
    uint64_t driver_calls[FABPOOL_NUM_DRIVER_CALLS];  /* per entry point, indexed as names[] */
    const char *driver_call_names[FABPOOL_NUM_DRIVER_CALLS];  /* NULL ends */
    fabpool_class_stats classes[FABPOOL_NUM_CLASSES];
    uint64_t traded_bytes;          /* free memory unmapped by misses of blocks above slab_max, to map the new
                                       block's instead (beyond large_slack), all time: a figure that grows
                                       with every step says the slack is too small for the workload's shapes */
    uint64_t kept_bytes;            /* mapped by buffers and views released and kept for reuse (keep_ms); part
                                       of mapped_bytes (and of view_bytes for views) */
    uint64_t export_anchor_moves;   /* times the export anchor (exported_fds_open) moved to another chunk of
                                       the pool's (one export) or closed, none being left, because its chunk
                                       was unmapped, all time; its closes at sleep and destroy are not counted */
} fabpool_stats;

FABPOOL_API fabpool_status fabpool_get_stats(fabpool_t *pool, fabpool_stats *out);
/* Starts both high-water marks again (torch.cuda.reset_peak_memory_stats): mapped_bytes_peak from the bytes
 * mapped now, in_use_bytes_peak from the bytes in use now, after the calling thread's cached blocks went back
 * to their classes (other threads' cached blocks still count, as in_use_bytes_peak says). */
FABPOOL_API fabpool_status fabpool_reset_peak(fabpool_t *pool);

/* The pool's running counters, read without a lock: cheap enough to call
 * after every allocation (fabpool_get_stats walks every class under the
 * pool's lock).  Each field is exact when read; together they are not one
 * snapshot while other threads use the pool. */
typedef struct fabpool_counters {
    size_t struct_size;                           /* set by the caller: sizeof(fabpool_counters) */
    uint64_t mapped_bytes, mapped_bytes_peak;     /* as in fabpool_stats */
    uint64_t chunks_mapped, chunks_mapped_total, chunks_unmapped_total, oom_retries;
    uint64_t stream_pending_blocks;    /* freed on a stream, waiting for its work */
    uint64_t stream_pending_bytes;
    uint64_t stream_frees;             /* fabpool_free_on_stream calls taken, all time */
    uint64_t stream_reuse_same;        /* fabpool_alloc_on_stream served by its own stream's freed blocks */
    uint64_t stream_reuse_after_event; /* ... by another stream's, once their event completed */
    uint64_t stream_releases;          /* pending blocks given back to the pool */
    uint64_t stream_events_recorded;   /* one per stream per batch of frees, and one per shrink on a stream */
    uint64_t stream_event_queries;     /* cuEventQuery / cuEventSynchronize of those events */
    uint64_t stream_syncs;             /* cuCtxSynchronize where an event could not be made or recorded */
    uint64_t streams;                  /* streams the pool keeps records for now */
    uint64_t stream_owner_frees;       /* fabpool_free_on_stream calls of the owner stream, freed at once */
    uint64_t stream_fences;            /* waits for the owner's work before an unmap or another user's allocation */
    uint64_t stream_records;           /* streams recorded on blocks (fabpool_record_stream), all time */
    uint64_t stream_record_waits;      /* blocks freed while recorded streams used them, queued for their events */
    uint64_t stream_recorded_blocks;   /* live blocks with recorded streams now */
} fabpool_counters;
FABPOOL_API fabpool_status fabpool_get_counters(fabpool_t *pool, fabpool_counters *out);

/* The number of CUDA devices the driver sees (loads the driver on first use). */
FABPOOL_API fabpool_status fabpool_device_count(int *out);
/* The driver's free and total bytes of the pool's device now (cuMemGetInfo in the device's primary context,
 * cudaMemGetInfo's figures): every process's use counted, this pool's mapped chunks included. */
FABPOOL_API fabpool_status fabpool_device_memory(fabpool_t *pool, size_t *free_bytes, size_t *total_bytes);
/* A readable report (json = 0) or one JSON object (json = 1): the stats, and the options in force (as a
 * FABPOOL_CONF string in the text, an object "options" in the JSON, with the handle type and rdma chosen and
 * the reservation made).  The report is flushed to `out`; a write that fails (a full device, a closed pipe, a
 * FILE not open for writing) answers FABPOOL_ERR_IO, the report cut short or missing. */
FABPOOL_API fabpool_status fabpool_print_stats(fabpool_t *pool, FILE *out, int json);
/* Walks the pool's structures under its locks and verifies their invariants
 * (slabs' free counts, flags and stacks; class lists; the page map; the
 * arenas' runs, bins, blocks and chunks; buffers' chunks; the address space; the pool's
 * counters against what the walk adds up), like TLSF's tlsf_check.
 * FABPOOL_OK, or FABPOOL_ERR_CORRUPT with a message that names the first
 * broken invariant in brackets ("[slab.flags] ...").  It takes time in
 * proportion to what the pool holds (a debugging and testing aid, not for a
 * hot loop).  Other threads may use the pool meanwhile: what they change
 * without a lock is not read, or read as atomics, and what work in flight
 * may leave half done is not reported.  So the blocks in other threads'
 * caches are not checked, and the free flags of blocks outside the free
 * stacks are counted exactly only while no other thread holds a cache of
 * the pool (one exists from a thread's first allocation or free until it
 * exits); a count of blocks freed on streams that does not match is
 * checked again for up to half a second before it is reported. */
FABPOOL_API fabpool_status fabpool_check(fabpool_t *pool);
/* The JSON report into buf (NUL-terminated); *needed gets its length + 1
 * (needed may be NULL: the one output that is optional, for a caller whose
 * buffer is large).  FABPOOL_ERR_LIMIT if cap is too small (nothing is
 * written then).  For callers without a FILE (Python's ctypes). */
FABPOOL_API fabpool_status fabpool_stats_json(fabpool_t *pool, char *buf, size_t cap, size_t *needed);

/* ------------------------------------------------------------- sharing */

/* A buffer of a pool with a shareable handle type (posix_fd or fabric) can
 * be mapped by other processes.  The exporter writes a descriptor: flat,
 * versioned bytes that the caller moves through its own bootstrap
 * (MPI_Allgather, torch.distributed.all_gather); a peer opens a view of the
 * buffer from it, at the same offsets, and later applies newer descriptors
 * that carry only what changed.  POSIX fds cannot travel in bytes: they go
 * beside the descriptor (fabpool_fd_send / fabpool_fd_recv, fabpool_fdpass.h), in the
 * order the descriptor numbers them.
 *
 * Lifetime (docs/design.md): a fabric handle holds no reference of its own,
 * so once a buffer has been exported, chunks a shrink drops stay held
 * (mapped, or by a handle where a refit replaced them) until
 * fabpool_buffer_peers_ack() says every peer has applied a descriptor of the
 * shrink's generation or later.  Until then a peer may open the descriptor
 * of the acknowledged generation (or a later one) again, with either handle
 * type. */

#define FABPOOL_DESC_VERSION 1
#define FABPOOL_DESC_HEADER_BYTES 96u
#define FABPOOL_DESC_RECORD_BYTES 96u

/* Bytes a descriptor of n chunks takes (SIZE_MAX for an n whose bytes size_t cannot hold). */
FABPOOL_API size_t fabpool_desc_size(size_t n_chunks);

/* Writes the descriptor of buf's chunks mapped after generation `since` (0:
 * all of them, for a peer's first view) into desc[0..*len).  For posix_fd,
 * fds[0..*nfds) get the chunks' file descriptors; they stay the pool's, and
 * stay open until fabpool_buffer_export_done or until their chunk is
 * unmapped (an open fd keeps the memory alive).  Each chunk is exported once
 * and its handle cached while it is mapped.  FABPOOL_ERR_LIMIT if cap or
 * fd_cap is too small (*len and *nfds then say what is needed).
 * Threads: a fabpool_buffer_export_done of the buffer on any thread closes
 * these fds too, as does a resize that unmaps their chunks; their numbers
 * may then name other files.  A program that exports one buffer on several
 * threads, or resizes it on another, makes the export, the send (or dup)
 * of the fds and fabpool_buffer_export_done one step under a lock of its
 * own. */
FABPOOL_API fabpool_status fabpool_buffer_export(fabpool_buffer_t *buf, uint64_t since, void *desc, size_t cap,
                                                size_t *len, int *fds, size_t fd_cap, size_t *nfds);
/* The fds of the last exports have been handed to every peer: close the
 * pool's copies. */
FABPOOL_API fabpool_status fabpool_buffer_export_done(fabpool_buffer_t *buf);
/* Every peer has applied a descriptor of `generation` or later: chunks
 * dropped at `generation` or before may now be unmapped (those live at
 * `generation` stay: a peer may still open its descriptor).  UINT64_MAX: no
 * peer is left.  The acknowledgement always takes effect: a chunk whose
 * unmap the driver refuses now is unmapped by a later collect.
 * A generation above the buffer's current one is refused (FABPOOL_ERR_INVALID_ARG).
 * Not for a destroyed buffer: use fabpool_peers_ack. */
FABPOOL_API fabpool_status fabpool_buffer_peers_ack(fabpool_buffer_t *buf, uint64_t generation);
/* The same by the buffer's export id (fabpool_buffer_info.export_id, also in
 * its views' info), valid after fabpool_buffer_destroy too: a destroyed
 * exported buffer unmaps at once every chunk that no descriptor past the
 * acknowledged generation names (no descriptor of a destroyed buffer is
 * opened any more), and the rest when the peers acknowledge or at pool
 * destroy.  FABPOOL_ERR_NOT_FOUND once nothing of the buffer is left. */
FABPOOL_API fabpool_status fabpool_peers_ack(fabpool_t *pool, uint64_t export_id, uint64_t generation);

/* A block of a pool with a shareable handle type (posix_fd or fabric), for
 * another process: `ptr` is a live block that fabpool_alloc or
 * fabpool_alloc_on_stream of this pool gave out (not freed, not freed on a
 * stream).  Writes a full descriptor (since 0) of the chunks mapped under
 * the block, the first at offset 0, which a peer opens with
 * fabpool_view_open; the block is then at fabpool_view_ptr(view) + *offset
 * in the peer, fabpool_usable_size bytes long.  The driver maps whole
 * chunks only, so the view holds the whole chunks, with the other blocks
 * that share them (a slab's neighbours, the ends of large neighbours): the
 * peer uses the block's bytes alone.
 *
 * For posix_fd, fds[0..*nfds) get one fd per chunk, in the order the
 * descriptor numbers them.  They stay the pool's (do not close them): each
 * chunk is exported once (an fd export costs 622 us on the H200) and its fd
 * kept while the chunk stays mapped, at least as long as the block is live,
 * so a later export of a block in the same chunks makes no export call.
 * Send them (fabpool_fd_send, which copies them into the peer) or let the
 * peer copy them (fabpool_fd_from_pid) while the block is live; a view in
 * this process gets dup()s of them (fabpool_view_open closes the fds it is
 * given).  For fabric the handles are in the descriptor and *nfds is 0.
 *
 * Lifetime.  With POSIX fds, a peer's view (and any fd it still holds) keeps
 * the chunks' memory alive by itself: the owner may free the block, and the
 * pool may unmap its chunks (closing its fds), while the peer reads; the
 * memory goes back to the driver once both have let go.  But a block freed
 * here is reused by this pool's next allocations: the caller frees it only
 * once no peer writes or reads it any more (PyTorch's IPC reference counts
 * do this for fabpool's PyTorch allocator).  A fabric handle holds no
 * reference: a peer can import a chunk only while this pool maps it, so
 * keep the block live until every peer has opened its view.  A pool that
 * sleeps (fabpool_sleep) gives back its own mappings only; a peer's view
 * keeps the old memory while the block wakes up in new memory: peers close
 * their views before a sleep and open them again after the wake.
 *
 * Identity.  Each record names its chunk's memory (its generation is the
 * chunk's identity, new whenever new memory is mapped at that address: the
 * block freed, trimmed and allocated again, or the pool woken), and the
 * header's generation is the newest of them.  So a peer's view released and
 * kept (fabpool_view_release) is taken back for a later export of the same
 * addresses only for the chunks that are the same memory; the others are
 * imported anew.
 *
 * Refused with nothing changed: a NULL argument (FABPOOL_ERR_INVALID_ARG), a
 * pool of handle type none (FABPOOL_ERR_NOT_SUPPORTED), a pointer that is
 * not a live block of this pool: another pool's, an interior pointer, a
 * block freed or freed on a stream, a buffer's memory
 * (FABPOOL_ERR_NOT_FOUND; export buffers with fabpool_buffer_export), a pool
 * asleep (FABPOOL_ERR_ASLEEP), cap or fd_cap too small (FABPOOL_ERR_LIMIT:
 * *len and *nfds then say what is needed), a driver call (the fds this call
 * made are closed again). */
FABPOOL_API fabpool_status fabpool_block_export(fabpool_t *pool, const void *ptr, void *desc, size_t cap,
                                               size_t *len, int *fds, size_t fd_cap, size_t *nfds, size_t *offset);

typedef struct fabpool_view fabpool_view_t;

/* Maps a peer's buffer from a full descriptor (since 0), in an address
 * window of the pool's own reservation, at the descriptor's offsets.  fabpool
 * takes the fds: they are closed once imported, whatever the outcome.  A
 * descriptor that is malformed, truncated, of another version, or names
 * ranges outside its window is refused with FABPOOL_ERR_DESCRIPTOR and maps
 * nothing. */
FABPOOL_API fabpool_status fabpool_view_open(fabpool_t *pool, const void *desc, size_t len, const int *fds,
                                            size_t nfds, fabpool_view_t **out);
/* fabpool_view_open of a descriptor and fds that the caller knows came from
 * process peer_pid: it checked the socket's peer (fabpool_fd_accept_peer,
 * fabpool_fd_connect_peer, SO_PEERCRED) or copied the fds out of that process
 * through a pidfd.  Only such a view is kept by fabpool_view_release, and
 * taken back only by a fabpool_view_open_peer with the same peer_pid: a kept
 * view's chunks are not imported again, so the fds that come with a reopen
 * are never looked at, and every field of a descriptor that names a buffer
 * is the sender's word; any peer could name another's buffer.  A peer_pid
 * of 0 or less: FABPOOL_ERR_INVALID_ARG (the fds closed). */
FABPOOL_API fabpool_status fabpool_view_open_peer(fabpool_t *pool, int peer_pid, const void *desc, size_t len,
                                                 const int *fds, size_t nfds, fabpool_view_t **out);
/* Applies a newer descriptor: maps only the new chunks and unmaps the
 * dropped ones.  Import handles are released right after the map. */
FABPOOL_API fabpool_status fabpool_view_apply(fabpool_view_t *view, const void *desc, size_t len, const int *fds,
                                             size_t nfds);
FABPOOL_API fabpool_status fabpool_view_get_info(const fabpool_view_t *view, fabpool_buffer_info *out);
/* The view's base address in this process.  NULL for a NULL view and for
 * one refused (the handles paragraph above fabpool_buffer_create). */
FABPOOL_API void *fabpool_view_ptr(const fabpool_view_t *view);
/* Unmaps everything and frees the view's window.  The caller makes sure no
 * GPU work still reads the view.  After FABPOOL_OK, view is refused (the
 * handles paragraph above fabpool_buffer_create); on failure it stays open
 * with the chunks it still maps (those before the refused one may be gone):
 * close it again. */
FABPOOL_API fabpool_status fabpool_view_close(fabpool_view_t *view);
/* Closes the view but keeps its mappings for keep_ms: a fabpool_view_open_peer
 * from the same peer (peer_pid) of a descriptor of the same buffer (its
 * export id, process and window) within that time takes the kept view, at
 * the same address, and imports and maps only the chunks it does not map yet
 * (a chunk is the same when its offset, size and generation are).  A kept
 * view holds its exporter's memory (POSIX fds) until then: it is closed when
 * keep_ms has passed (at the pool's next view open or release), by
 * fabpool_trim, by sleep and at pool destroy; not by an out-of-memory retry,
 * which gives back kept buffers: a kept view's memory is its exporter's, and
 * closing it frees device memory only where the exporter has let its chunks
 * go (fabpool_trim then).  With keep_ms 0, and for a
 * view that fabpool_view_open opened (no peer vouched for: no open could
 * take it back), this is fabpool_view_close.  After it, view is refused (the
 * handles paragraph above fabpool_buffer_create): an open that takes the
 * kept view back answers a new handle. */
FABPOOL_API fabpool_status fabpool_view_release(fabpool_view_t *view);

#ifdef __cplusplus
}
#endif

/* fd passing (fabpool_fd_send / fabpool_fd_recv ...): a header of its own
 * that needs nothing of a pool, included here so that one include gives the
 * whole API. */
#include "fabpool_fdpass.h"

#endif
