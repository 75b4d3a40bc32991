/* fabpool_torch.c - PyTorch's pluggable-allocator ABI on fabpool.
 *
 * Per device: a fabpool pool (thread caches off: the device lock already
 * serializes the shim's calls, and a trim must reach every block) and the
 * blocks freed on each stream.  A freed block goes to its stream's list of
 * its size class and to the tail of the stream's FIFO, with no event yet
 * ("fresh").  An allocation on the same stream pops the class list: no
 * driver call.  When an allocation misses its own list, the shim polls:
 * it records one event on every stream that has fresh blocks (an event
 * recorded after a free covers every kernel queued before the free), and
 * walks each FIFO from its head while the events have completed, giving
 * those blocks back to the pool (the first of the class asked for goes
 * straight to the caller).  Events on one stream complete in order, so a
 * FIFO is never walked past a pending event.
 *
 * Every block handed to PyTorch is in the device's live table (pointer ->
 * size asked, block size, stream), an open-addressing hash table.  A free
 * must find its pointer there, so a double free or a pointer the shim never
 * gave out is refused before anything changes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "error.h"
#include "fabpool_torch.h"
#include "pool.h"
#include "sizeclass.h"
#include "trace.h"

#define FT_MAX_DEVICES 64
/* a poll on free too, once this much is held for streams */
#define FT_POLL_BLOCKS 4096u
#define FT_POLL_BYTES (2ull << 30)

typedef struct ft_ev {
    CUevent ev;          /* NULL: none could be made; `done` was set after a context sync */
    uint32_t refs;       /* blocks that wait on it */
    int done;
    struct ft_ev *next;  /* the device's spare events */
} ft_ev;

struct ft_stream;

typedef struct ft_blk {
    void *ptr;
    uint64_t usable;
    unsigned cls;
    struct ft_stream *st;
    ft_ev *ev;                     /* NULL while fresh */
    struct ft_blk *cnext, *cprev;  /* the stream's list of this class (LIFO) */
    struct ft_blk *fnext, *fprev;  /* the stream's FIFO, in free order */
} ft_blk;

typedef struct ft_stream {
    void *stream;
    ft_blk *cls[FP_NCLASS];
    ft_blk *head, *tail;
    uint64_t n_fresh;
} ft_stream;

/* A block given to PyTorch and not taken back: a slot of the live table. */
typedef struct ft_live {
    void *ptr;                     /* NULL: an empty slot */
    void *stream;                  /* the allocation stream */
    uint64_t size;                 /* asked */
    uint64_t usable;               /* the block's size */
} ft_live;

typedef struct ft_dev {
    pthread_mutex_t lock;
    int device;
    CUdevice cudev;
    CUcontext ctx;
    fabpool_t *pool;
    ft_stream **streams;
    size_t n_streams, cap_streams;
    ft_blk *spare_blks;            /* node free list (through cnext) */
    ft_ev *spare_evs;
    ft_live *live;                 /* the live table: a power of two slots, at most half full */
    size_t live_cap;
    fabpool_torch_counters c;      /* c.blocks_live: the table's entries */
    /* PyTorch's statistics (fabpool_torch_mem_stats) */
    fabpool_torch_stat st_count[3], st_bytes[3], st_req[3];
    fabpool_torch_stat reserved, segment; /* sampled from the pool: gauge_sample */
    uint64_t num_alloc_retries, num_ooms;
    uint64_t base_maps, base_unmaps, base_pool_retries, base_syncs; /* at the last reset of accumulated stats */
} ft_dev;

static _Atomic(ft_dev *) ft_devs[FT_MAX_DEVICES];
static pthread_mutex_t ft_init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int ft_verbose = -1;   /* -1: not read from the environment yet */
static _Atomic uint64_t ft_failures_nodev; /* failures before a device had a pool */

/* ----------------------------------------------------------- messages */

static int verbose(void)
{
    int v = atomic_load(&ft_verbose);
    if (v < 0) {
        const char *q = getenv("FABPOOL_TORCH_QUIET");
        v = !(q && q[0] == '1');
        atomic_store(&ft_verbose, v);
    }
    return v;
}

static void report(void)
{
    if (verbose())
        fprintf(stderr, "fabpool_torch: %s\n", fabpool_last_error());
}

int fabpool_torch_set_verbose(int on)
{
    int old = verbose();
    atomic_store(&ft_verbose, on ? 1 : 0);
    return old;
}

const char *fabpool_torch_last_error(void) { return fabpool_last_error(); }

/* ------------------------------------------------------------ context */

static CUcontext ctx_enter(ft_dev *d)
{
    CUcontext saved = NULL;
    if (FP_CU(NULL, cuCtxGetCurrent, &saved) != CUDA_SUCCESS)
        saved = NULL;
    if (saved != d->ctx)
        FP_CU(NULL, cuCtxSetCurrent, d->ctx);
    return saved;
}

static void ctx_leave(ft_dev *d, CUcontext saved)
{
    if (saved != d->ctx && saved)
        FP_CU(NULL, cuCtxSetCurrent, saved);
}

/* ------------------------------------------------------------- devices */

static void dev_free(ft_dev *d)
{
    free(d->live);
    for (size_t i = 0; i < d->n_streams; i++)
        free(d->streams[i]);
    free(d->streams);
    for (ft_blk *b = d->spare_blks, *n; b; b = n) {
        n = b->cnext;
        free(b);
    }
    for (ft_ev *e = d->spare_evs, *n; e; e = n) {
        n = e->next;
        if (e->ev)
            FP_CU(NULL, cuEventDestroy, e->ev);
        free(e);
    }
    if (d->pool)
        fabpool_destroy(d->pool);
    if (d->ctx)
        FP_CU(NULL, cuDevicePrimaryCtxRelease, d->cudev);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static fabpool_status dev_create(int device, ft_dev **out)
{
    fabpool_status st = fp_drv_load();
    if (st != FABPOOL_OK)
        return st;
    int count = 0;
    CUresult r = FP_CU(NULL, cuDeviceGetCount, &count);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetCount", "counting devices for the PyTorch allocator");
    if (device >= count)
        return fp_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch: device %d does not exist: the driver sees %d device(s) (0 to %d); check "
                        "CUDA_VISIBLE_DEVICES and the device the tensor was asked on",
                        device, count, count - 1);
    ft_dev *d = calloc(1, sizeof *d);
    if (!d)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch: no host memory for device %d's state", device);
    pthread_mutex_init(&d->lock, NULL);
    d->device = device;
    r = FP_CU(NULL, cuDeviceGet, &d->cudev, device);
    if (r == CUDA_SUCCESS)
        r = FP_CU(NULL, cuDevicePrimaryCtxRetain, &d->ctx, d->cudev);
    if (r != CUDA_SUCCESS) {
        st = fp_drv_error(r, "cuDevicePrimaryCtxRetain", "retaining device %d's primary context for PyTorch", device);
        d->ctx = NULL;
        dev_free(d);
        return st;
    }
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = device;
    o.handle_type = FABPOOL_HANDLE_NONE; /* local tensors; FABPOOL_CONF=handle_type:... overrides */
    o.thread_cache = 0;
    st = fabpool_create(&o, &d->pool);
    if (st != FABPOOL_OK) {
        fp_error_append(" (creating device %d's pool for PyTorch)", device);
        d->pool = NULL;
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", fabpool_last_error());
        dev_free(d);
        fp_error(st, "%s", keep);
        return st;
    }
    *out = d;
    return FABPOOL_OK;
}

static ft_dev *dev_get(int device)
{
    if (device < 0 || device >= FT_MAX_DEVICES) {
        fp_error(FABPOOL_ERR_INVALID_ARG,
                 "fabpool_torch: device %d is out of range (0 to %d): pass the CUDA device index the tensor is on",
                 device, FT_MAX_DEVICES - 1);
        return NULL;
    }
    ft_dev *d = atomic_load_explicit(&ft_devs[device], memory_order_acquire);
    if (d)
        return d;
    pthread_mutex_lock(&ft_init_lock);
    d = atomic_load_explicit(&ft_devs[device], memory_order_acquire);
    if (!d && dev_create(device, &d) == FABPOOL_OK)
        atomic_store_explicit(&ft_devs[device], d, memory_order_release);
    else if (!d)
        d = NULL;
    pthread_mutex_unlock(&ft_init_lock);
    return d;
}

/* ------------------------------------------------------ streams, nodes */

static ft_stream *stream_find(ft_dev *d, void *stream)
{
    for (size_t i = 0; i < d->n_streams; i++)
        if (d->streams[i]->stream == stream)
            return d->streams[i];
    return NULL;
}

static ft_stream *stream_get(ft_dev *d, void *stream)
{
    ft_stream *s = stream_find(d, stream);
    if (s)
        return s;
    if (d->n_streams == d->cap_streams) {
        size_t cap = d->cap_streams ? d->cap_streams * 2 : 8;
        ft_stream **n = realloc(d->streams, cap * sizeof *n);
        if (!n)
            return NULL;
        d->streams = n;
        d->cap_streams = cap;
    }
    s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->stream = stream;
    d->streams[d->n_streams++] = s;
    d->c.streams = d->n_streams;
    return s;
}

static ft_blk *blk_new(ft_dev *d)
{
    ft_blk *b = d->spare_blks;
    if (b) {
        d->spare_blks = b->cnext;
        memset(b, 0, sizeof *b);
        return b;
    }
    return calloc(1, sizeof *b);
}

static void ev_unref(ft_dev *d, ft_ev *e)
{
    if (e && --e->refs == 0) {
        if (!e->ev) {
            free(e);
            return;
        }
        e->done = 0;
        e->next = d->spare_evs;
        d->spare_evs = e;
    }
}

/* Unlinks b from its stream's lists and recycles its node; returns its pointer. */
static void *blk_take(ft_dev *d, ft_blk *b)
{
    ft_stream *s = b->st;
    if (b->cprev)
        b->cprev->cnext = b->cnext;
    else
        s->cls[b->cls] = b->cnext;
    if (b->cnext)
        b->cnext->cprev = b->cprev;
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        s->head = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    else
        s->tail = b->fprev;
    if (b->ev)
        ev_unref(d, b->ev);
    else
        s->n_fresh--;
    d->c.cached_blocks--;
    d->c.cached_bytes -= b->usable;
    void *p = b->ptr;
    b->cnext = d->spare_blks;
    d->spare_blks = b;
    return p;
}

static void give_back(ft_dev *d, void *p)
{
    if (fabpool_free(d->pool, p) == FABPOOL_OK)
        d->c.pool_frees++;
    else
        report();
}

/* ------------------------------------------------------------- events */

/* Waits for all of the device's work (the fallback when an event cannot be
 * made or recorded, e.g. on a stream the program has destroyed). */
static void ctx_sync(ft_dev *d)
{
    d->c.syncs++;
    CUresult r = FP_CU(NULL, cuCtxSynchronize);
    if (r != CUDA_SUCCESS) {
        fp_drv_error(r, "cuCtxSynchronize", "waiting for device %d's work before reusing freed blocks", d->device);
        report();
    }
}

/* One event on s after its fresh blocks, shared by all of them. */
static void record_fresh(ft_dev *d, ft_stream *s)
{
    if (!s->n_fresh)
        return;
    ft_ev *e = d->spare_evs;
    if (e) {
        d->spare_evs = e->next;
    } else {
        e = calloc(1, sizeof *e);
        if (e && FP_CU(NULL, cuEventCreate, &e->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            e->ev = NULL;
    }
    if (!e) {
        /* no host memory even for an event: make the blocks safe by waiting */
        ctx_sync(d);
        for (ft_blk *b = s->head, *n; b; b = n) {
            n = b->fnext;
            if (!b->ev)
                give_back(d, blk_take(d, b));
        }
        return;
    }
    e->refs = 0;
    e->done = 0;
    e->next = NULL;
    if (!e->ev || FP_CU(NULL, cuEventRecord, e->ev, (CUstream)s->stream) != CUDA_SUCCESS) {
        ctx_sync(d);
        e->done = 1;
    } else {
        d->c.events_recorded++;
    }
    for (ft_blk *b = s->tail; b && !b->ev; b = b->fprev) {
        b->ev = e;
        e->refs++;
    }
    s->n_fresh = 0;
}

static int ev_done(ft_dev *d, ft_ev *e, int wait)
{
    if (e->done)
        return 1;
    d->c.event_queries++;
    CUresult r = wait ? FP_CU(NULL, cuEventSynchronize, e->ev) : FP_CU(NULL, cuEventQuery, e->ev);
    if (r == CUDA_ERROR_NOT_READY)
        return 0;
    if (r != CUDA_SUCCESS)
        ctx_sync(d);
    e->done = 1;
    return 1;
}

/* Records events for fresh blocks and gives back every block whose event has
 * completed (wait: all of them, waiting).  The first block of class `want`
 * (FP_NCLASS: none) is returned instead of given back. */
static void *poll_dev(ft_dev *d, unsigned want, int wait)
{
    void *handed = NULL;
    for (size_t i = 0; i < d->n_streams; i++)
        record_fresh(d, d->streams[i]);
    for (size_t i = 0; i < d->n_streams; i++) {
        ft_stream *s = d->streams[i];
        while (s->head && s->head->ev && ev_done(d, s->head->ev, wait)) {
            ft_blk *b = s->head;
            int mine = !handed && b->cls == want;
            void *p = blk_take(d, b);
            if (mine)
                handed = p;
            else
                give_back(d, p);
        }
    }
    return handed;
}

/* ------------------------------------------------ PyTorch's statistics */

static void stat_add(fabpool_torch_stat *s, int64_t n)
{
    s->current += n;
    if (n > 0)
        s->allocated += n;
    else
        s->freed -= n;
    if (s->current > s->peak)
        s->peak = s->current;
}

/* A block of `size` asked, `usable` given, counted in (sign 1) or out (-1). */
static void stat_block(ft_dev *d, uint64_t size, uint64_t usable, int sign)
{
    int k = size <= FABPOOL_TORCH_SMALL_SIZE ? FABPOOL_TORCH_SMALL_POOL : FABPOOL_TORCH_LARGE_POOL;
    int idx[2] = {FABPOOL_TORCH_ALL, k};
    for (int i = 0; i < 2; i++) {
        stat_add(&d->st_count[idx[i]], sign);
        stat_add(&d->st_bytes[idx[i]], sign * (int64_t)usable);
        stat_add(&d->st_req[idx[i]], sign * (int64_t)size);
    }
}

/* The pool's gauges, read without its lock.  The one place the shim reads
 * the pool's internals (lib/pool.h): fabpool_get_stats would do, but it
 * walks every class under the pool's lock, too slow after each miss. */
typedef struct ft_gauges {
    uint64_t mapped, chunks, maps, unmaps, oom_retries;
} ft_gauges;

static ft_gauges pool_gauges(struct fabpool *p)
{
    ft_gauges g;
    g.mapped = atomic_load_explicit(&p->ch.mapped_bytes, memory_order_relaxed);
    g.chunks = atomic_load_explicit(&p->ch.chunks_mapped, memory_order_relaxed);
    g.maps = atomic_load_explicit(&p->ch.chunks_mapped_total, memory_order_relaxed);
    g.unmaps = atomic_load_explicit(&p->ch.chunks_unmapped_total, memory_order_relaxed);
    g.oom_retries = atomic_load_explicit(&p->heap.oom_retries, memory_order_relaxed);
    return g;
}

/* Follows what the pool maps.  Called (under the device lock) after every
 * call into the pool that may map: memory is mapped only inside
 * fabpool_alloc, so the peaks are exact. */
static void gauge_sample(ft_dev *d)
{
    ft_gauges g = pool_gauges(d->pool);
    stat_add(&d->reserved, (int64_t)g.mapped - d->reserved.current);
    stat_add(&d->segment, (int64_t)g.chunks - d->segment.current);
}

/* ---------------------------------------------------------- live table */

static size_t live_slot(const void *p, size_t cap)
{
    uint64_t h = ((uint64_t)(uintptr_t)p >> 8) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 24) & (cap - 1);
}

/* Makes room for one more entry (the table stays at most half full).
 * Nonzero, and a message, when no host memory is left for it. */
static int live_reserve(ft_dev *d)
{
    if ((d->c.blocks_live + 1) * 2 <= d->live_cap)
        return 0;
    size_t cap = d->live_cap ? d->live_cap * 2 : 1024;
    ft_live *t = calloc(cap, sizeof *t);
    if (!t) {
        fp_error(FABPOOL_ERR_HOST_MEMORY,
                 "fabpool_torch: no host memory to track %llu live blocks on device %d; nothing was allocated",
                 (unsigned long long)d->c.blocks_live + 1, d->device);
        return -1;
    }
    for (size_t i = 0; i < d->live_cap; i++) {
        if (!d->live[i].ptr)
            continue;
        size_t j = live_slot(d->live[i].ptr, cap);
        while (t[j].ptr)
            j = (j + 1) & (cap - 1);
        t[j] = d->live[i];
    }
    free(d->live);
    d->live = t;
    d->live_cap = cap;
    return 0;
}

/* After live_reserve. */
static void live_put(ft_dev *d, void *ptr, uint64_t size, uint64_t usable, void *stream)
{
    size_t j = live_slot(ptr, d->live_cap);
    while (d->live[j].ptr)
        j = (j + 1) & (d->live_cap - 1);
    d->live[j] = (ft_live){ptr, stream, size, usable};
}

/* The slot of ptr, or SIZE_MAX when it is not live. */
static size_t live_find(const ft_dev *d, const void *ptr)
{
    if (!d->live_cap)
        return SIZE_MAX;
    for (size_t j = live_slot(ptr, d->live_cap);; j = (j + 1) & (d->live_cap - 1)) {
        if (d->live[j].ptr == ptr)
            return j;
        if (!d->live[j].ptr)
            return SIZE_MAX;
    }
}

/* Empties slot i, moving back the entries of its probe run (no tombstones). */
static void live_remove(ft_dev *d, size_t i)
{
    size_t mask = d->live_cap - 1;
    for (size_t j = (i + 1) & mask; d->live[j].ptr; j = (j + 1) & mask) {
        size_t home = live_slot(d->live[j].ptr, d->live_cap);
        /* the entry at j may fill the hole at i if i lies on its probe path (home..j, cyclic) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            d->live[i] = d->live[j];
            i = j;
        }
    }
    d->live[i].ptr = NULL;
}

/* -------------------------------------------------------------- the ABI */

/* A block handed out: into the live table (room was made by live_reserve). */
static void count_alloc(ft_dev *d, void *p, size_t size, uint64_t usable, void *stream)
{
    live_put(d, p, size, usable, stream);
    stat_block(d, size, usable, 1);
    d->c.allocs++;
    d->c.blocks_live++;
    d->c.bytes_live += size;
    d->c.usable_bytes_live += usable;
    if (d->c.bytes_live > d->c.bytes_live_peak)
        d->c.bytes_live_peak = d->c.bytes_live;
}

void *fabpool_torch_alloc(size_t size, int device, void *stream)
{
    if (size == 0) {
        fp_error(FABPOOL_OK, "fabpool_torch_alloc: size 0: nothing allocated (NULL is the empty allocation)");
        return NULL;
    }
    ft_dev *d = dev_get(device);
    if (!d) {
        atomic_fetch_add(&ft_failures_nodev, 1);
        report();
        return NULL;
    }
    unsigned cls = (uint64_t)size <= (1ull << 40) ? fp_class_of(size) : FP_NCLASS;
    pthread_mutex_lock(&d->lock);
    if (live_reserve(d) != 0) {
        d->c.alloc_failures++;
        pthread_mutex_unlock(&d->lock);
        report();
        return NULL;
    }
    ft_stream *s = cls < FP_NCLASS ? stream_find(d, stream) : NULL;
    ft_blk *b = s ? s->cls[cls] : NULL;
    if (b) {
        uint64_t usable = b->usable;
        void *p = blk_take(d, b);
        d->c.reuse_same_stream++;
        count_alloc(d, p, size, usable, stream);
        FP_TRACE(d->pool->trace, FABPOOL_TR_APP_ALLOC, p, size, stream);
        pthread_mutex_unlock(&d->lock);
        return p;
    }
    /* Events need the device's context; the pool's own calls do not (VMM
     * calls take none, and the pool makes its context current where it
     * waits on events).  So the context is entered only when blocks wait
     * for their streams. */
    int polling = d->c.cached_blocks != 0;
    CUcontext saved = polling ? ctx_enter(d) : d->ctx;
    void *p = polling && cls < FP_NCLASS ? poll_dev(d, cls, 0) : NULL;
    if (p) {
        d->c.reuse_after_event++;
    } else {
        fabpool_status st = fabpool_alloc(d->pool, size, &p);
        if (st == FABPOOL_ERR_OUT_OF_MEMORY && d->c.cached_blocks) {
            /* the blocks held for streams may be what is missing */
            d->num_alloc_retries++;
            d->c.syncs++;
            poll_dev(d, FP_NCLASS, 1);
            fabpool_trim(d->pool, 0);
            st = fabpool_alloc(d->pool, size, &p);
        }
        gauge_sample(d);
        if (st != FABPOOL_OK) {
            d->num_ooms++; /* PyTorch raises its OutOfMemoryError for every failed device allocation */
            fp_error_append(" (PyTorch asked for %zu bytes on device %d; %llu bytes are live in its tensors)", size,
                            device, (unsigned long long)d->c.bytes_live);
            d->c.alloc_failures++;
            ctx_leave(d, saved);
            pthread_mutex_unlock(&d->lock);
            report();
            return NULL;
        }
        d->c.pool_allocs++;
    }
    size_t usable = size;
    fabpool_usable_size(d->pool, p, &usable);
    count_alloc(d, p, size, usable, stream);
    FP_TRACE(d->pool->trace, FABPOOL_TR_APP_ALLOC, p, size, stream);
    ctx_leave(d, saved);
    pthread_mutex_unlock(&d->lock);
    return p;
}

void fabpool_torch_free(void *ptr, size_t size, int device, void *stream)
{
    if (!ptr)
        return;
    ft_dev *d = device >= 0 && device < FT_MAX_DEVICES ? atomic_load_explicit(&ft_devs[device], memory_order_acquire)
                                                       : NULL;
    if (!d) {
        fp_error(FABPOOL_ERR_NOT_FOUND,
                 "fabpool_torch_free(%p, device %d): that device has no fabpool pool, so the pointer is not "
                 "fabpool's; free it with the allocator that gave it out",
                 ptr, device);
        report();
        return;
    }
    pthread_mutex_lock(&d->lock);
    size_t at = live_find(d, ptr);
    if (at == SIZE_MAX) {
        d->c.bad_frees++;
        fp_error(FABPOOL_ERR_INVALID_ARG,
                 "fabpool_torch_free(%p, %zu bytes, device %d): refused, nothing changed: the pointer is not a live "
                 "allocation of this device (it was not given out by fabpool_torch_alloc for this device, or it was "
                 "freed already: a double free)",
                 ptr, size, device);
        pthread_mutex_unlock(&d->lock);
        report();
        return;
    }
    /* what was recorded at the allocation counts, not what the caller says */
    ft_live e = d->live[at];
    live_remove(d, at);
    FP_TRACE(d->pool->trace, FABPOOL_TR_APP_FREE, ptr, e.size, e.stream);
    uint64_t usable = e.usable;
    stream = e.stream;
    size_t key = e.size && e.size <= usable ? (size_t)e.size : (size_t)usable;
    stat_block(d, e.size, usable, -1);
    d->c.frees++;
    d->c.blocks_live--;
    d->c.bytes_live -= e.size;
    d->c.usable_bytes_live -= usable;
    ft_stream *s = stream_get(d, stream);
    ft_blk *b = s ? blk_new(d) : NULL;
    if (!b) {
        /* no host memory to remember it: wait for the stream, then give it back */
        CUcontext saved = ctx_enter(d);
        ctx_sync(d);
        give_back(d, ptr);
        ctx_leave(d, saved);
        pthread_mutex_unlock(&d->lock);
        return;
    }
    b->ptr = ptr;
    b->usable = usable;
    b->cls = fp_class_of(key);
    /* a large block is its size rounded to the granularity, which may be
     * below its class's size: list it under a class it fills, so that every
     * request of that class fits in it */
    if (fp_class_size(b->cls) > usable)
        b->cls = fp_class_floor(usable);
    b->st = s;
    b->cnext = s->cls[b->cls];
    if (b->cnext)
        b->cnext->cprev = b;
    s->cls[b->cls] = b;
    b->fprev = s->tail;
    if (s->tail)
        s->tail->fnext = b;
    else
        s->head = b;
    s->tail = b;
    s->n_fresh++;
    d->c.cached_blocks++;
    d->c.cached_bytes += usable;
    if (d->c.cached_blocks > FT_POLL_BLOCKS || d->c.cached_bytes > FT_POLL_BYTES) {
        CUcontext saved = ctx_enter(d);
        poll_dev(d, FP_NCLASS, 0);
        ctx_leave(d, saved);
    }
    pthread_mutex_unlock(&d->lock);
}

/* --------------------------------------------------------------- helpers */

static fabpool_status empty_dev(ft_dev *d)
{
    pthread_mutex_lock(&d->lock);
    FP_TRACE(d->pool->trace, FABPOOL_TR_APP_EMPTY, 0, 0, 0);
    CUcontext saved = ctx_enter(d);
    poll_dev(d, FP_NCLASS, 1);
    /* the stream lists are empty now: forget the streams (some may be gone) */
    for (size_t i = 0; i < d->n_streams; i++)
        free(d->streams[i]);
    d->n_streams = 0;
    d->c.streams = 0;
    d->c.empties++;
    fabpool_status st = fabpool_trim(d->pool, 0);
    gauge_sample(d);
    ctx_leave(d, saved);
    pthread_mutex_unlock(&d->lock);
    return st;
}

fabpool_status fabpool_torch_empty(int device)
{
    if (device < -1 || device >= FT_MAX_DEVICES)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_empty: device %d is out of range (-1 for all, 0 to %d)",
                        device, FT_MAX_DEVICES - 1);
    fabpool_status st = FABPOOL_OK;
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? FT_MAX_DEVICES : device + 1); i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (d) {
            fabpool_status s = empty_dev(d);
            if (s != FABPOOL_OK)
                st = s;
        }
    }
    return st;
}

fabpool_t *fabpool_torch_pool(int device)
{
    if (device < 0 || device >= FT_MAX_DEVICES)
        return NULL;
    ft_dev *d = atomic_load_explicit(&ft_devs[device], memory_order_acquire);
    return d ? d->pool : NULL;
}

fabpool_status fabpool_torch_get_counters(int device, fabpool_torch_counters *out)
{
    if (!out || device < -1 || device >= FT_MAX_DEVICES)
        return fp_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch_get_counters: out is NULL or device %d is out of range (-1 for all)", device);
    memset(out, 0, sizeof *out);
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? FT_MAX_DEVICES : device + 1); i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (!d)
            continue;
        pthread_mutex_lock(&d->lock);
        const uint64_t *src = (const uint64_t *)&d->c;
        uint64_t *dst = (uint64_t *)out;
        for (size_t k = 0; k < sizeof *out / sizeof(uint64_t); k++)
            dst[k] += src[k];
        pthread_mutex_unlock(&d->lock);
    }
    if (device < 0)
        out->alloc_failures += atomic_load(&ft_failures_nodev);
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_get_memory_stats(int device, fabpool_torch_mem_stats *out)
{
    if (!out || device < 0 || device >= FT_MAX_DEVICES)
        return fp_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch_get_memory_stats: out is NULL or device %d is out of range (0 to %d)", device,
                        FT_MAX_DEVICES - 1);
    memset(out, 0, sizeof *out);
    ft_dev *d = atomic_load_explicit(&ft_devs[device], memory_order_acquire);
    if (!d)
        return FABPOOL_OK;
    pthread_mutex_lock(&d->lock);
    gauge_sample(d);
    ft_gauges g = pool_gauges(d->pool);
    memcpy(out->allocation, d->st_count, sizeof out->allocation);
    memcpy(out->allocated_bytes, d->st_bytes, sizeof out->allocated_bytes);
    memcpy(out->requested_bytes, d->st_req, sizeof out->requested_bytes);
    out->segment = d->segment;
    out->reserved_bytes = d->reserved;
    out->num_alloc_retries = (int64_t)(d->num_alloc_retries + g.oom_retries - d->base_pool_retries);
    out->num_ooms = (int64_t)d->num_ooms;
    out->num_sync_all_streams = (int64_t)(d->c.syncs - d->base_syncs);
    out->num_device_alloc = (int64_t)(g.maps - d->base_maps);
    out->num_device_free = (int64_t)(g.unmaps - d->base_unmaps);
    pthread_mutex_unlock(&d->lock);
    return FABPOOL_OK;
}

static void reset_peak(fabpool_torch_stat *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s[i].peak = s[i].current;
}

static void reset_accumulated(fabpool_torch_stat *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s[i].allocated = s[i].freed = 0;
}

/* what: 0 peaks, 1 accumulated */
static fabpool_status reset_stats(int device, int what, const char *fn)
{
    if (device < -1 || device >= FT_MAX_DEVICES)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: device %d is out of range (-1 for all, 0 to %d)", fn, device,
                        FT_MAX_DEVICES - 1);
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? FT_MAX_DEVICES : device + 1); i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (!d)
            continue;
        pthread_mutex_lock(&d->lock);
        gauge_sample(d);
        void (*fn_reset)(fabpool_torch_stat *, size_t) = what ? reset_accumulated : reset_peak;
        fn_reset(d->st_count, 3);
        fn_reset(d->st_bytes, 3);
        fn_reset(d->st_req, 3);
        fn_reset(&d->segment, 1);
        fn_reset(&d->reserved, 1);
        if (what) {
            ft_gauges g = pool_gauges(d->pool);
            d->num_alloc_retries = d->num_ooms = 0;
            d->base_maps = g.maps;
            d->base_unmaps = g.unmaps;
            d->base_pool_retries = g.oom_retries;
            d->base_syncs = d->c.syncs;
        } else {
            d->c.bytes_live_peak = d->c.bytes_live;
        }
        pthread_mutex_unlock(&d->lock);
    }
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_reset_peak_stats(int device)
{
    return reset_stats(device, 0, "fabpool_torch_reset_peak_stats");
}

fabpool_status fabpool_torch_reset_accumulated_stats(int device)
{
    return reset_stats(device, 1, "fabpool_torch_reset_accumulated_stats");
}

#define FT_COUNTER_FIELDS(X)                                                                                  \
    X(allocs) X(frees) X(alloc_failures) X(blocks_live) X(bytes_live) X(usable_bytes_live) X(bytes_live_peak)  \
    X(reuse_same_stream) X(reuse_after_event) X(pool_allocs) X(pool_frees) X(cached_blocks) X(cached_bytes)    \
    X(events_recorded) X(event_queries) X(syncs) X(streams) X(empties) X(bad_frees)

fabpool_status fabpool_torch_stats_json(int device, char *buf, size_t cap, size_t *needed)
{
    fabpool_t *pool = fabpool_torch_pool(device);
    if (!pool)
        return fp_error(FABPOOL_ERR_NOT_FOUND,
                        "fabpool_torch_stats_json: device %d has no pool yet (it is made by the first allocation on "
                        "that device)",
                        device);
    size_t plen = 0;
    fabpool_stats_json(pool, NULL, 0, &plen);
    char *pj = plen ? malloc(plen) : NULL;
    if (!pj)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch_stats_json: no host memory for the report");
    fabpool_status st = fabpool_stats_json(pool, pj, plen, &plen);
    if (st != FABPOOL_OK) {
        free(pj);
        return st;
    }
    size_t n = strlen(pj);
    while (n && (pj[n - 1] == '\n' || pj[n - 1] == ' '))
        pj[--n] = '\0';
    fabpool_torch_counters c;
    fabpool_torch_get_counters(device, &c);
    char head[2048];
    int h = snprintf(head, sizeof head, "{\"device\":%d,\"torch\":{", device);
    const char *sep = "";
#define FT_JSON_FIELD(f)                                                                                      \
    h += snprintf(head + h, sizeof head - (size_t)h, "%s\"" #f "\":%llu", sep, (unsigned long long)c.f);       \
    sep = ",";
    FT_COUNTER_FIELDS(FT_JSON_FIELD)
#undef FT_JSON_FIELD
    h += snprintf(head + h, sizeof head - (size_t)h, "},\"pool\":");
    size_t total = (size_t)h + n + 2; /* "}" and NUL */
    if (needed)
        *needed = total;
    if (!buf || cap < total) {
        free(pj);
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_torch_stats_json: the report takes %zu bytes, the buffer has %zu",
                        total, cap);
    }
    memcpy(buf, head, (size_t)h);
    memcpy(buf + h, pj, n);
    buf[(size_t)h + n] = '}';
    buf[(size_t)h + n + 1] = '\0';
    free(pj);
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_shutdown(void)
{
    fabpool_status st = FABPOOL_OK;
    pthread_mutex_lock(&ft_init_lock);
    for (int i = 0; i < FT_MAX_DEVICES; i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (!d)
            continue;
        empty_dev(d);
        if (d->c.blocks_live) {
            st = fp_error(FABPOOL_ERR_BUSY,
                          "fabpool_torch_shutdown: device %d still has %llu live blocks (%llu bytes); free the "
                          "tensors first (del, gc.collect(), torch.cuda.synchronize())",
                          i, (unsigned long long)d->c.blocks_live, (unsigned long long)d->c.bytes_live);
            continue;
        }
        atomic_store_explicit(&ft_devs[i], NULL, memory_order_release);
        dev_free(d);
    }
    pthread_mutex_unlock(&ft_init_lock);
    return st;
}
