/* fabpool_torch.c - PyTorch's pluggable-allocator ABI on fabpool's public API.
 *
 * Per device: a fabpool pool (thread caches off: the device lock already
 * serializes the shim's calls, and a trim must reach every block).  The
 * stream-ordered reuse PyTorch expects is the pool's own:
 * fabpool_alloc_on_stream / fabpool_free_on_stream (fabpool.h,
 * docs/design.md).  A block freed on a stream is given again at once to an
 * allocation on that stream; another stream, or the pool, gets it once an
 * event recorded on the first stream after the free has completed.  The
 * shim makes no driver call of its own and includes fabpool's public
 * headers only.
 *
 * Every block handed to PyTorch is in the device's live table (pointer ->
 * size asked, block size, stream), an open-addressing hash table.  A free
 * must find its pointer there, so a double free or a pointer the shim never
 * gave out is refused before anything changes.
 *
 * fork: a forked child has one thread, the one that called fork, and every
 * pool made before the fork refuses there (FABPOOL_ERR_NOT_SUPPORTED,
 * fabpool.h) before it takes a lock.  The shim's own locks are taken afresh
 * in the child (ft_fork_child), so that its calls answer there, with that
 * refusal, even where a thread of the parent held one at the fork. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabpool.h"
#include "fabpool_torch.h"
#include "symm.h"
#include "torch_min_block.h"
#include "torch_tags.h"

#define FT_MAX_DEVICES 64

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
    fabpool_t *pool;
    ft_live *live;                 /* the live table: a power of two slots, at most half full */
    size_t live_cap;
    fabpool_torch_counters c;      /* the shim's own counters; the stream ones are the pool's (counters_of) */
    uint64_t waits;                /* the shim's waits for the device: empty, an out-of-memory retry */
    /* PyTorch's statistics (fabpool_torch_mem_stats) */
    fabpool_torch_stat st_count[3], st_bytes[3], st_req[3];
    fabpool_torch_stat reserved, segment; /* sampled from the pool: gauge_sample */
    uint64_t num_alloc_retries, num_ooms;
    uint64_t base_maps, base_unmaps, base_pool_retries, base_syncs; /* at the last reset of accumulated stats */
} ft_dev;

static _Atomic(ft_dev *) ft_devs[FT_MAX_DEVICES];
static pthread_mutex_t ft_init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int ft_verbose = -1;   /* -1: not read from the environment yet */
static atomic_int ft_handle_type = FABPOOL_HANDLE_NONE; /* what the devices' pools are made with */
static _Atomic uint64_t ft_failures_nodev; /* failures before a device had a pool */
static _Atomic uint64_t ft_bad_frees_nodev; /* frees refused for a device without a pool (or none at all) */

/* ----------------------------------------------------------- messages */

/* The calling thread's message: the shim's own, or the pool's that it
 * passes on (fabpool_last_error, with what the shim was doing appended). */
static _Thread_local char ft_msg[2048];

static fabpool_status ft_error(fabpool_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fabpool_status ft_error(fabpool_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ft_msg, sizeof ft_msg, fmt, ap);
    va_end(ap);
    return st;
}

/* The pool's message for its failed call st, then " ..." of the shim's. */
static fabpool_status ft_error_pool(fabpool_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fabpool_status ft_error_pool(fabpool_status st, const char *fmt, ...)
{
    snprintf(ft_msg, sizeof ft_msg, "%s", fabpool_last_error());
    size_t n = strlen(ft_msg);
    va_list ap;
    va_start(ap, fmt);
    if (n + 1 < sizeof ft_msg)
        vsnprintf(ft_msg + n, sizeof ft_msg - n, fmt, ap);
    va_end(ap);
    return st;
}

static int verbose(void)
{
    int v = atomic_load(&ft_verbose);
    if (v < 0) {
        const char *q = secure_getenv("FABPOOL_TORCH_QUIET");
        v = !(q && q[0] == '1');
        atomic_store(&ft_verbose, v);
    }
    return v;
}

static void report(void)
{
    if (verbose())
        fprintf(stderr, "fabpool_torch: %s\n", ft_msg);
}

fabpool_handle_type fabpool_torch_set_handle_type(fabpool_handle_type type)
{
    return (fabpool_handle_type)atomic_exchange(&ft_handle_type, (int)type);
}

int fabpool_torch_set_verbose(int on)
{
    int old = verbose();
    atomic_store(&ft_verbose, on ? 1 : 0);
    return old;
}

const char *fabpool_torch_last_error(void) { return ft_msg; }

const char *fabpool_torch_version(void) { return fabpool_version(); }

/* ------------------------------------------------------------- devices */

/* In a forked child.  A thread of the parent may have held the init lock or a device's lock at the fork, inside
 * a pool call that waits for streams (an out-of-memory retry, empty, shutdown) or makes a pool; that thread does
 * not exist here, so the child would wait for the lock for ever.  The child's only thread is this one, which
 * holds none of them: each starts again unlocked.  What a lock guards stays as the parent's thread left it; the
 * waits that hold a lock are all inside pool calls, where the shim's state is whole, and the child's calls reach
 * only pools that refuse.  The tags' lock too (torch_tags.c); the symmetric buffers and staging rings are
 * refused by their own calls (symm.c, stage_copy.c); fabpool_torch_struct_layout's pthread_once is glibc's,
 * which starts a once that a fork cut off again in the child. */
static void ft_fork_child(void)
{
    pthread_mutex_init(&ft_init_lock, NULL);
    for (int i = 0; i < FT_MAX_DEVICES; i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_relaxed);
        if (d)
            pthread_mutex_init(&d->lock, NULL);
    }
    ft_tags_fork_child();
}

/* At load, so that no lock of the shim is ever taken before the hook is in place. */
__attribute__((constructor)) static void ft_fork_hook(void) { (void)pthread_atfork(NULL, NULL, ft_fork_child); }

static void dev_free(ft_dev *d)
{
    free(d->live);
    if (d->pool)
        fabpool_destroy(d->pool);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static fabpool_status dev_create(int device, ft_dev **out)
{
    int count = 0;
    fabpool_status st = fabpool_device_count(&count);
    if (st != FABPOOL_OK)
        return ft_error_pool(st, " (counting devices for the PyTorch allocator)");
    if (device >= count)
        return ft_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch: device %d does not exist: the driver sees %d device(s) (0 to %d); check "
                        "CUDA_VISIBLE_DEVICES and the device the tensor was asked on",
                        device, count, count - 1);
    ft_dev *d = calloc(1, sizeof *d);
    if (!d)
        return ft_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch: no host memory for device %d's state", device);
    pthread_mutex_init(&d->lock, NULL);
    d->device = device;
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = device;
    o.handle_type = (fabpool_handle_type)atomic_load(&ft_handle_type); /* FABPOOL_CONF=handle_type:... overrides */
    o.thread_cache = 0;
    st = fabpool_create(&o, &d->pool);
    if (st == FABPOOL_ERR_NOT_SUPPORTED && o.handle_type == FABPOOL_HANDLE_POSIX_FD) {
        o.handle_type = FABPOOL_HANDLE_NONE; /* a device without POSIX fd handles: local memory */
        st = fabpool_create(&o, &d->pool);
    }
    if (st != FABPOOL_OK) {
        ft_error_pool(st, " (creating device %d's pool for PyTorch)", device);
        d->pool = NULL;
        dev_free(d);
        return st;
    }
    *out = d;
    return FABPOOL_OK;
}

static ft_dev *dev_get(int device)
{
    if (device < 0 || device >= FT_MAX_DEVICES) {
        ft_error(FABPOOL_ERR_INVALID_ARG,
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

/* The pool's gauges: fabpool_get_counters, read without the pool's lock. */
typedef struct ft_gauges {
    uint64_t mapped, chunks, maps, unmaps, oom_retries;
} ft_gauges;

static ft_gauges pool_gauges(fabpool_t *p)
{
    fabpool_counters k = {.struct_size = sizeof k};
    ft_gauges g;
    memset(&g, 0, sizeof g);
    if (fabpool_get_counters(p, &k) == FABPOOL_OK) {
        g.mapped = k.mapped_bytes;
        g.chunks = k.chunks_mapped;
        g.maps = k.chunks_mapped_total;
        g.unmaps = k.chunks_unmapped_total;
        g.oom_retries = k.oom_retries;
    }
    return g;
}

/* Follows what the pool maps.  Called (under the device lock) after every
 * call into the pool that may map: memory is mapped only inside an
 * allocation, so the peaks are exact. */
static void gauge_sample(ft_dev *d)
{
    ft_gauges g = pool_gauges(d->pool);
    stat_add(&d->reserved, (int64_t)g.mapped - d->reserved.current);
    stat_add(&d->segment, (int64_t)g.chunks - d->segment.current);
}

/* The device's counters: the shim's own, and those of the pool's
 * stream-ordered pair (the shim is the pool's only user).  Device lock held.
 * Where the pool refuses (made before this process was forked), the shim's
 * own only, and the pool's status. */
static fabpool_status counters_of(ft_dev *d, fabpool_torch_counters *out)
{
    fabpool_torch_counters c = d->c;
    fabpool_counters k = {.struct_size = sizeof k};
    fabpool_status st = fabpool_get_counters(d->pool, &k);
    *out = c;
    if (st != FABPOOL_OK)
        return st;
    c.reuse_same_stream = k.stream_reuse_same;
    c.reuse_after_event = k.stream_reuse_after_event;
    c.pool_allocs = c.allocs - k.stream_reuse_same - k.stream_reuse_after_event;
    c.pool_frees = k.stream_releases + k.stream_owner_frees;
    c.owner_frees = k.stream_owner_frees;
    c.fences = k.stream_fences;
    c.cached_blocks = k.stream_pending_blocks;
    c.cached_bytes = k.stream_pending_bytes;
    c.events_recorded = k.stream_events_recorded;
    c.event_queries = k.stream_event_queries;
    c.syncs = k.stream_syncs + d->waits;
    c.streams = k.streams;
    *out = c;
    return FABPOOL_OK;
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
        ft_error(FABPOOL_ERR_HOST_MEMORY,
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
    /* the old table goes last: a child forked meanwhile finds no freed table in d->live (ft_fork_child) */
    ft_live *old = d->live;
    d->live = t;
    d->live_cap = cap;
    free(old);
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
        ft_error(FABPOOL_OK, "fabpool_torch_alloc: size 0: nothing allocated (NULL is the empty allocation)");
        return NULL;
    }
    ft_dev *d = dev_get(device);
    if (!d) {
        atomic_fetch_add(&ft_failures_nodev, 1);
        report();
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    if (live_reserve(d) != 0) {
        d->c.alloc_failures++;
        pthread_mutex_unlock(&d->lock);
        report();
        return NULL;
    }
    void *p = NULL;
    size_t ask = size < FT_MIN_BLOCK ? FT_MIN_BLOCK : size; /* a tensor's base aligned as cudaMalloc's */
    fabpool_status st = fabpool_alloc_on_stream(d->pool, ask, stream, &p);
    if (st == FABPOOL_ERR_OUT_OF_MEMORY) {
        /* the pool has waited for the blocks freed on streams already; what
         * other streams' work still holds after that, a full wait frees */
        fabpool_counters k = {.struct_size = sizeof k};
        if (fabpool_get_counters(d->pool, &k) == FABPOOL_OK && k.stream_pending_blocks) {
            d->num_alloc_retries++;
            d->waits++;
            fabpool_collect(d->pool, 1);
            fabpool_trim(d->pool, 0);
            st = fabpool_alloc_on_stream(d->pool, ask, stream, &p);
        }
    }
    if (st != FABPOOL_OK) {
        d->num_ooms++; /* PyTorch raises its OutOfMemoryError for every failed device allocation */
        /* the message first: the sample's own calls would leave theirs in its place */
        ft_error_pool(st, " (PyTorch asked for %zu bytes on device %d; %llu bytes are live in its tensors)", size,
                      device, (unsigned long long)d->c.bytes_live);
        gauge_sample(d);
        d->c.alloc_failures++;
        pthread_mutex_unlock(&d->lock);
        report();
        return NULL;
    }
    gauge_sample(d);
    size_t usable = size;
    fabpool_usable_size(d->pool, p, &usable);
    count_alloc(d, p, size, usable, stream);
    pthread_mutex_unlock(&d->lock);
    return p;
}

void fabpool_torch_free(void *ptr, size_t size, int device, void *stream)
{
    (void)stream; /* the allocation stream recorded in the live table is the one used */
    if (!ptr)
        return;
    ft_dev *d = device >= 0 && device < FT_MAX_DEVICES ? atomic_load_explicit(&ft_devs[device], memory_order_acquire)
                                                       : NULL;
    if (!d) {
        atomic_fetch_add(&ft_bad_frees_nodev, 1);
        ft_error(FABPOOL_ERR_NOT_FOUND,
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
        ft_error(FABPOOL_ERR_INVALID_ARG,
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
    fabpool_status st = fabpool_free_on_stream(d->pool, ptr, e.stream);
    if (st != FABPOOL_OK) {
        /* the pool refused (it cannot, for a live block, but for a driver
         * failure): the block stays live, as PyTorch will not free it again */
        ft_error_pool(st, " (fabpool_torch_free(%p, device %d))", ptr, device);
        pthread_mutex_unlock(&d->lock);
        report();
        return;
    }
    live_remove(d, at);
    stat_block(d, e.size, e.usable, -1);
    d->c.frees++;
    d->c.blocks_live--;
    d->c.bytes_live -= e.size;
    d->c.usable_bytes_live -= e.usable;
    pthread_mutex_unlock(&d->lock);
}

/* --------------------------------------------------------------- helpers */

static fabpool_status empty_dev(ft_dev *d)
{
    pthread_mutex_lock(&d->lock);
    d->waits++;
    d->c.empties++;
    /* every stream waited for, its blocks back to the pool and its record forgotten */
    fabpool_status st = fabpool_collect(d->pool, 1);
    fabpool_status s2 = fabpool_trim(d->pool, 0);
    if (st == FABPOOL_OK)
        st = s2;
    if (st != FABPOOL_OK)
        ft_error_pool(st, " (emptying device %d's pool)", d->device);
    gauge_sample(d);
    pthread_mutex_unlock(&d->lock);
    return st;
}

fabpool_status fabpool_torch_empty(int device)
{
    if (device < -1 || device >= FT_MAX_DEVICES)
        return ft_error(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_empty: device %d is out of range (-1 for all, 0 to %d)",
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

/* A struct the caller hands in to be filled says the size this library knows (fabpool.h, struct_size). */
static fabpool_status size_check(const char *fn, const char *type, size_t got, size_t want)
{
    if (got == want)
        return FABPOOL_OK;
    return ft_error(FABPOOL_ERR_INVALID_ARG, "%s: the %s's struct_size is %zu, but this libfabpool_torch.so (fabpool "
                    "%s) knows %s of %zu bytes only: set struct_size = sizeof(%s) before the call, and build against "
                    "the fabpool_torch.h of the library the program loads", fn, type, got, fabpool_version(), type,
                    want, type);
}

fabpool_status fabpool_torch_get_counters(int device, fabpool_torch_counters *out)
{
    if (!out || device < -1 || device >= FT_MAX_DEVICES)
        return ft_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch_get_counters: out is NULL or device %d is out of range (-1 for all)", device);
    fabpool_status st = size_check("fabpool_torch_get_counters", "fabpool_torch_counters", out->struct_size,
                                   sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    /* a pool that refuses (in a forked child) is answered, after the shim's own counts are added up */
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? FT_MAX_DEVICES : device + 1); i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (!d)
            continue;
        pthread_mutex_lock(&d->lock);
        fabpool_torch_counters c;
        fabpool_status s = counters_of(d, &c);
#define FT_ADD_FIELD(f) out->f += c.f;
        FABPOOL_TORCH_COUNTERS(FT_ADD_FIELD)
#undef FT_ADD_FIELD
        pthread_mutex_unlock(&d->lock);
        if (s != FABPOOL_OK && st == FABPOOL_OK)
            st = ft_error_pool(s, " (fabpool_torch_get_counters: device %d's pool)", i);
    }
    if (device < 0) {
        out->alloc_failures += atomic_load(&ft_failures_nodev);
        out->bad_frees += atomic_load(&ft_bad_frees_nodev);
    }
    return st;
}

fabpool_status fabpool_torch_get_memory_stats(int device, fabpool_torch_mem_stats *out)
{
    if (!out || device < 0 || device >= FT_MAX_DEVICES)
        return ft_error(FABPOOL_ERR_INVALID_ARG,
                        "fabpool_torch_get_memory_stats: out is NULL or device %d is out of range (0 to %d)", device,
                        FT_MAX_DEVICES - 1);
    fabpool_status st = size_check("fabpool_torch_get_memory_stats", "fabpool_torch_mem_stats", out->struct_size,
                                   sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    ft_dev *d = atomic_load_explicit(&ft_devs[device], memory_order_acquire);
    if (!d)
        return FABPOOL_OK;
    pthread_mutex_lock(&d->lock);
    fabpool_torch_counters c;
    st = counters_of(d, &c);
    if (st != FABPOOL_OK) { /* the pool refuses (in a forked child): nothing it would say is known */
        pthread_mutex_unlock(&d->lock);
        return ft_error_pool(st, " (fabpool_torch_get_memory_stats: device %d's pool)", device);
    }
    gauge_sample(d);
    ft_gauges g = pool_gauges(d->pool);
    memcpy(out->allocation, d->st_count, sizeof out->allocation);
    memcpy(out->allocated_bytes, d->st_bytes, sizeof out->allocated_bytes);
    memcpy(out->requested_bytes, d->st_req, sizeof out->requested_bytes);
    out->segment = d->segment;
    out->reserved_bytes = d->reserved;
    out->num_alloc_retries = (int64_t)(d->num_alloc_retries + g.oom_retries - d->base_pool_retries);
    out->num_ooms = (int64_t)d->num_ooms;
    out->num_sync_all_streams = (int64_t)(c.syncs - d->base_syncs);
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
        return ft_error(FABPOOL_ERR_INVALID_ARG, "%s: device %d is out of range (-1 for all, 0 to %d)", fn, device,
                        FT_MAX_DEVICES - 1);
    fabpool_status st = FABPOOL_OK;
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? FT_MAX_DEVICES : device + 1); i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (!d)
            continue;
        pthread_mutex_lock(&d->lock);
        fabpool_torch_counters c;
        fabpool_status s = counters_of(d, &c);
        if (s != FABPOOL_OK) { /* the pool refuses (in a forked child): nothing of this device is reset */
            pthread_mutex_unlock(&d->lock);
            if (st == FABPOOL_OK)
                st = ft_error_pool(s, " (%s: device %d's pool)", fn, i);
            continue;
        }
        gauge_sample(d);
        void (*fn_reset)(fabpool_torch_stat *, size_t) = what ? reset_accumulated : reset_peak;
        if (!what)
            fabpool_reset_peak(d->pool); /* the pool's own marks (fabpool_torch_stats_json) too */
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
            d->base_syncs = c.syncs;
        } else {
            d->c.bytes_live_peak = d->c.bytes_live;
        }
        pthread_mutex_unlock(&d->lock);
    }
    return st;
}

fabpool_status fabpool_torch_reset_peak_stats(int device)
{
    return reset_stats(device, 0, "fabpool_torch_reset_peak_stats");
}

fabpool_status fabpool_torch_reset_accumulated_stats(int device)
{
    return reset_stats(device, 1, "fabpool_torch_reset_accumulated_stats");
}

/* ----------------------------------------------------------- layout */

/* Every field of the structs this library fills, for fabpool_torch_struct_layout: X(struct, field), each
 * struct's fields in their order; the counters come from their list (X##_COUNTER(field)). */
#define FT_LAYOUT_SLEEP_INFO(X)                                                                               \
    X(fabpool_sleep_info, struct_size) X(fabpool_sleep_info, asleep) X(fabpool_sleep_info, mode)              \
    X(fabpool_sleep_info, offloaded_bytes) X(fabpool_sleep_info, discarded_bytes)                             \
    X(fabpool_sleep_info, host_bytes) X(fabpool_sleep_info, host_copies) X(fabpool_sleep_info, sleeps)        \
    X(fabpool_sleep_info, wakes) X(fabpool_sleep_info, host_reused_bytes)
#define FT_LAYOUT_COUNTERS(X) X(fabpool_torch_counters, struct_size) FABPOOL_TORCH_COUNTERS(X##_COUNTER)
#define FT_LAYOUT_STAT(X)                                                                                     \
    X(fabpool_torch_stat, current) X(fabpool_torch_stat, peak) X(fabpool_torch_stat, allocated)               \
    X(fabpool_torch_stat, freed)
#define FT_LAYOUT_MEM_STATS(X)                                                                                \
    X(fabpool_torch_mem_stats, struct_size) X(fabpool_torch_mem_stats, allocation)                            \
    X(fabpool_torch_mem_stats, allocated_bytes) X(fabpool_torch_mem_stats, requested_bytes)                   \
    X(fabpool_torch_mem_stats, segment) X(fabpool_torch_mem_stats, reserved_bytes)                            \
    X(fabpool_torch_mem_stats, num_alloc_retries) X(fabpool_torch_mem_stats, num_ooms)                        \
    X(fabpool_torch_mem_stats, num_sync_all_streams) X(fabpool_torch_mem_stats, num_device_alloc)             \
    X(fabpool_torch_mem_stats, num_device_free)
#define FT_LAYOUT_SYMM_INFO(X)                                                                                \
    X(fabpool_torch_symm_info, struct_size) X(fabpool_torch_symm_info, rank)                                  \
    X(fabpool_torch_symm_info, nranks) X(fabpool_torch_symm_info, device)                                     \
    X(fabpool_torch_symm_info, handle_type) X(fabpool_torch_symm_info, fd_transport)                          \
    X(fabpool_torch_symm_info, size) X(fabpool_torch_symm_info, max_bytes) X(fabpool_torch_symm_info, mapped) \
    X(fabpool_torch_symm_info, generation) X(fabpool_torch_symm_info, acked)                                  \
    X(fabpool_torch_symm_info, exchanges) X(fabpool_torch_symm_info, records_exported)                        \
    X(fabpool_torch_symm_info, records_imported) X(fabpool_torch_symm_info, last_exported)                    \
    X(fabpool_torch_symm_info, last_imported) X(fabpool_torch_symm_info, desc_bytes)                          \
    X(fabpool_torch_symm_info, fds_sent) X(fabpool_torch_symm_info, view_bytes)                               \
    X(fabpool_torch_symm_info, last_ns)
/* a struct before the structs that hold it */
#define FT_LAYOUT(X)                                                                                          \
    FT_LAYOUT_SLEEP_INFO(X) FT_LAYOUT_COUNTERS(X) FT_LAYOUT_STAT(X) FT_LAYOUT_MEM_STATS(X) FT_LAYOUT_SYMM_INFO(X)

/* A field left out of its list would leave a hole in the layout the Python module builds from: each list's
 * fields fill their struct (none of these has padding; fabpool_torch_symm_info is left to the Python module's
 * check of every offset at load). */
#define FT_FIELD_SIZE(T, f) +sizeof(((T *)0)->f)
#define FT_FIELD_SIZE_COUNTER(f) FT_FIELD_SIZE(fabpool_torch_counters, f)
_Static_assert(0 FT_LAYOUT_SLEEP_INFO(FT_FIELD_SIZE) == sizeof(fabpool_sleep_info), "every field listed");
_Static_assert(0 FT_LAYOUT_COUNTERS(FT_FIELD_SIZE) == sizeof(fabpool_torch_counters), "every field listed");
_Static_assert(0 FT_LAYOUT_STAT(FT_FIELD_SIZE) == sizeof(fabpool_torch_stat), "every field listed");
_Static_assert(0 FT_LAYOUT_MEM_STATS(FT_FIELD_SIZE) == sizeof(fabpool_torch_mem_stats), "every field listed");
#undef FT_FIELD_SIZE_COUNTER
#undef FT_FIELD_SIZE

/* The type of a field, as the layout names it; an array of structs has decayed to a pointer. */
#define FT_TYPE(e)                                                                                            \
    _Generic((e), int: "i32", unsigned: "u32", int64_t: "i64", uint64_t: "u64",                              \
             fabpool_torch_stat: "fabpool_torch_stat", fabpool_torch_stat *: "fabpool_torch_stat[]")

typedef struct ft_field {
    const char *type, *field, *field_type;
    size_t offset, size, type_size;
} ft_field;

#define FT_FIELD(T, f) {#T, #f, FT_TYPE(((T *)0)->f), offsetof(T, f), sizeof(((T *)0)->f), sizeof(T)},
#define FT_FIELD_COUNTER(f) FT_FIELD(fabpool_torch_counters, f)
static const ft_field ft_fields[] = {FT_LAYOUT(FT_FIELD)};
#undef FT_FIELD_COUNTER
#undef FT_FIELD

static char ft_layout_json[8192];
static pthread_once_t ft_layout_once = PTHREAD_ONCE_INIT;

static void layout_build(void)
{
    size_t n = 0, cap = sizeof ft_layout_json;
    const char *type = NULL;
    n += (size_t)snprintf(ft_layout_json, cap, "{");
    for (size_t i = 0; i < sizeof ft_fields / sizeof ft_fields[0] && n < cap; i++) {
        const ft_field *f = &ft_fields[i];
        if (!type || strcmp(type, f->type)) {
            n += (size_t)snprintf(ft_layout_json + n, cap - n, "%s\"%s\":{\"size\":%zu,\"fields\":{",
                                  type ? "}}," : "", f->type, f->type_size);
            type = f->type;
        } else if (n < cap) {
            n += (size_t)snprintf(ft_layout_json + n, cap - n, ",");
        }
        if (n < cap)
            n += (size_t)snprintf(ft_layout_json + n, cap - n, "\"%s\":[%zu,%zu,\"%s\"]", f->field, f->offset,
                                  f->size, f->field_type);
    }
    if (n < cap)
        snprintf(ft_layout_json + n, cap - n, "}}}");
}

const char *fabpool_torch_struct_layout(void)
{
    pthread_once(&ft_layout_once, layout_build);
    return ft_layout_json;
}

fabpool_status fabpool_torch_stats_json(int device, char *buf, size_t cap, size_t *needed)
{
    if (device < 0 || device >= FT_MAX_DEVICES)
        return ft_error(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_stats_json: device %d is not a device (0 to %d)",
                        device, FT_MAX_DEVICES - 1);
    fabpool_t *pool = fabpool_torch_pool(device);
    if (!pool)
        return ft_error(FABPOOL_ERR_NOT_FOUND,
                        "fabpool_torch_stats_json: device %d has no pool yet (it is made by the first allocation on "
                        "that device)",
                        device);
    size_t plen = 0;
    fabpool_status st = fabpool_stats_json(pool, NULL, 0, &plen);
    if (st != FABPOOL_OK && st != FABPOOL_ERR_LIMIT) /* the pool refuses (in a forked child) */
        return ft_error_pool(st, " (fabpool_torch_stats_json: device %d's pool)", device);
    char *pj = plen ? malloc(plen) : NULL;
    if (!pj)
        return ft_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch_stats_json: no host memory for the report");
    st = fabpool_stats_json(pool, pj, plen, &plen);
    if (st != FABPOOL_OK) {
        free(pj);
        return st;
    }
    size_t n = strlen(pj);
    while (n && (pj[n - 1] == '\n' || pj[n - 1] == ' '))
        pj[--n] = '\0';
    fabpool_torch_counters c = {.struct_size = sizeof c};
    fabpool_torch_get_counters(device, &c);
    char head[2048];
    int h = snprintf(head, sizeof head, "{\"device\":%d,\"torch\":{", device);
    const char *sep = "";
#define FT_JSON_FIELD(f)                                                                                      \
    h += snprintf(head + h, sizeof head - (size_t)h, "%s\"" #f "\":%llu", sep, (unsigned long long)c.f);       \
    sep = ",";
    FABPOOL_TORCH_COUNTERS(FT_JSON_FIELD)
#undef FT_JSON_FIELD
    h += snprintf(head + h, sizeof head - (size_t)h, "},\"pool\":");
    size_t total = (size_t)h + n + 2; /* "}" and NUL */
    if (needed)
        *needed = total;
    if (!buf || cap < total) {
        free(pj);
        return ft_error(FABPOOL_ERR_LIMIT, "fabpool_torch_stats_json: the report takes %zu bytes, the buffer has %zu",
                        total, cap);
    }
    memcpy(buf, head, (size_t)h);
    memcpy(buf + h, pj, n);
    buf[(size_t)h + n] = '}';
    buf[(size_t)h + n + 1] = '\0';
    free(pj);
    return FABPOOL_OK;
}

void ft_report(fabpool_t *p)
{
    fabpool_options o;
    fabpool_options_init(&o);
    if (p && fabpool_get_options(p, &o) == FABPOOL_OK && o.stats_at_destroy)
        fabpool_print_stats(p, stderr, o.stats_at_destroy == 2);
}

void fabpool_torch_print_stats_at_exit(void)
{
    pthread_mutex_lock(&ft_init_lock);
    for (int i = 0; i < FT_MAX_DEVICES; i++) {
        ft_dev *d = atomic_load_explicit(&ft_devs[i], memory_order_acquire);
        if (d) {
            pthread_mutex_lock(&d->lock);
            ft_report(d->pool);
            pthread_mutex_unlock(&d->lock);
        }
    }
    pthread_mutex_unlock(&ft_init_lock);
    ft_tags_report();
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
            st = ft_error(FABPOOL_ERR_BUSY,
                          "fabpool_torch_shutdown: device %d still has %llu live blocks (%llu bytes); free the "
                          "tensors first (del, gc.collect(), torch.cuda.synchronize())",
                          i, (unsigned long long)d->c.blocks_live, (unsigned long long)d->c.bytes_live);
            continue;
        }
        atomic_store_explicit(&ft_devs[i], NULL, memory_order_release);
        dev_free(d);
    }
    char tmsg[1024];
    if (ft_tags_shutdown(tmsg, sizeof tmsg) != FABPOOL_OK) {
        char dmsg[sizeof ft_msg]; /* a device's message first, where one was busy too */
        snprintf(dmsg, sizeof dmsg, "%s", st == FABPOOL_OK ? "fabpool_torch_shutdown: " : ft_msg);
        st = ft_error(FABPOOL_ERR_BUSY, "%s%s%s", dmsg, st == FABPOOL_OK ? "" : "; ", tmsg);
    }
    pthread_mutex_unlock(&ft_init_lock);
    return st;
}
