/* lifecycle.c - a pool per device: creation (options, driver, handle type, the
 * one address reservation, every layer's part set up), trim and destroy,
 * and the public entry points that take a pool and belong to a layer below
 * (buffers, views, acknowledgements by export id). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#include "conf_options.h"
#include "error.h"
#include "export.h"
#include "log.h"
#include "sleep.h"
#include "trace.h"
#include "vmm.h"

_Static_assert(offsetof(struct fabpool, alloc) == 0, "alloc.c reaches its state by a cast of the pool (alloc.h)");

/* ------------------------------------------------------------ handle type */

/* Chooses the pool's handle type; why[0..n) says why (for the log). */
static fabpool_status choose_handle_type(struct fabpool *p, char *why, size_t n)
{
    fabpool_handle_type want = p->opt.handle_type;
    snprintf(why, n, "asked for");
    int posix = 0;
    FP_CU(&p->ch.calls, cuDeviceGetAttribute, &posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          p->ch.dev);
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_FABRIC) {
        int fabric = 0;
        FP_CU(&p->ch.calls, cuDeviceGetAttribute, &fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, p->ch.dev);
        const char *step = "cuDeviceGetAttribute";
        CUresult r = fabric ? fp_vmm_probe_fabric(&p->ch, &step) : CUDA_ERROR_NOT_SUPPORTED;
        if (r == CUDA_SUCCESS) {
            p->ch.handle_type = FABPOOL_HANDLE_FABRIC;
            p->ch.cu_handle_types = CU_MEM_HANDLE_TYPE_FABRIC;
            if (want == FABPOOL_HANDLE_AUTO)
                snprintf(why, n, "auto: a fabric handle was made, exported and imported");
            return FABPOOL_OK;
        }
        if (want == FABPOOL_HANDLE_AUTO)
            snprintf(why, n, "auto: no fabric handles (%s answered %s), POSIX fds %ssupported",
                     fabric ? step : "the device attribute HANDLE_TYPE_FABRIC_SUPPORTED",
                     fabric ? fp_drv_error_name(r) : "0", posix ? "" : "not ");
        if (want == FABPOOL_HANDLE_FABRIC)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                            "handle_type:fabric was asked for, but device %d cannot share fabric handles: %s "
                            "answered %s%s. Fabric handles need an IMEX channel (/dev/nvidia-caps-imex-channels/"
                            "channelN, made by the nvidia-imex service on an NVLink-fabric system such as GB200 "
                            "NVL72); without one, use handle_type:posix_fd (shareable between processes of one "
                            "host) or handle_type:auto, which falls back by itself",
                            (int)p->ch.dev, fabric ? step : "the device attribute HANDLE_TYPE_FABRIC_SUPPORTED",
                            fabric ? fp_drv_error_name(r) : "0", r == CUDA_ERROR_NOT_PERMITTED ?
                            " (the process has no IMEX channel)" : "");
    }
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_POSIX_FD) {
        if (posix) {
            p->ch.handle_type = FABPOOL_HANDLE_POSIX_FD;
            p->ch.cu_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            return FABPOOL_OK;
        }
        if (want == FABPOOL_HANDLE_POSIX_FD)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "handle_type:posix_fd was asked for, but device %d does not "
                            "support POSIX file descriptor handles; use handle_type:none", (int)p->ch.dev);
    }
    p->ch.handle_type = FABPOOL_HANDLE_NONE;
    p->ch.cu_handle_types = CU_MEM_HANDLE_TYPE_NONE;
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ create */

static fabpool_status apply_conf(fabpool_options *o)
{
    if (o->conf) {
        fabpool_status st = fabpool_options_parse(o, o->conf);
        if (st != FABPOOL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fabpool_last_error());
            return fp_error(st, "options.conf: %s", msg);
        }
    }
    const char *env = getenv("FABPOOL_CONF");
    if (env) {
        fabpool_status st = fabpool_options_parse(o, env);
        if (st != FABPOOL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fabpool_last_error());
            return fp_error(st, "FABPOOL_CONF='%s': %s", env, msg);
        }
    }
    int lvl;
    fabpool_status st = fp_log_env(&lvl); /* FABPOOL_DEBUG wins over the debug key */
    if (st != FABPOOL_OK)
        return st;
    if (lvl >= 0)
        o->debug = lvl;
    return fp_trace_env(o);
}

static fabpool_status setup_device(struct fabpool *p)
{
    int n = 0;
    CUresult r = FP_CU(&p->ch.calls, cuDeviceGetCount, &n);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetCount", "counting devices");
    if (p->opt.device < 0 || p->opt.device >= n)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "device %d does not exist: the driver sees %d device%s (check "
                        "CUDA_VISIBLE_DEVICES)", p->opt.device, n, n == 1 ? "" : "s");
    for (int i = 0; i < p->opt.n_peer_devices; i++) {
        int d = p->opt.peer_devices[i];
        if (d < 0 || d >= n || d == p->opt.device)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "peer device %d: not a device other than the pool's own "
                            "(%d) among the %d the driver sees", d, p->opt.device, n);
    }
    r = FP_CU(&p->ch.calls, cuDeviceGet, &p->ch.dev, p->opt.device);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGet", "opening device %d", p->opt.device);
    int vmm = 0;
    r = FP_CU(&p->ch.calls, cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p->ch.dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetAttribute", "asking whether device %d supports virtual memory management",
                            p->opt.device);
    if (!vmm)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "device %d does not support the virtual memory management API "
                        "(cuMemCreate / cuMemMap), which fabpool is built on", p->opt.device);
    for (int i = 0; i < p->opt.n_peer_devices; i++) {
        int ok = 0;
        CUdevice peer;
        FP_CU(&p->ch.calls, cuDeviceGet, &peer, p->opt.peer_devices[i]);
        FP_CU(&p->ch.calls, cuDeviceCanAccessPeer, &ok, peer, p->ch.dev);
        if (!ok)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "peer device %d cannot access device %d's memory "
                            "(cuDeviceCanAccessPeer answered 0)", p->opt.peer_devices[i], p->opt.device);
    }
    r = FP_CU(&p->ch.calls, cuDevicePrimaryCtxRetain, &p->ch.ctx, p->ch.dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDevicePrimaryCtxRetain", "retaining device %d's primary context", p->opt.device);
    return FABPOOL_OK;
}

static fabpool_status reserve(struct fabpool *p)
{
    CUmemAllocationProp prop = fp_chunk_prop(&p->ch);
    size_t gran = 0;
    CUresult r = FP_CU(&p->ch.calls, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemGetAllocationGranularity", "asking device %d's granularity", p->opt.device);
    if (gran == 0 || (gran & (gran - 1)))
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "the driver's granularity %zu is not a power of two", gran);
    p->sp.gran = gran;
    p->sp.gran_shift = fp_log2_floor(gran);
    p->sp.page_shift = p->sp.gran_shift < FP_PAGE_SHIFT ? p->sp.gran_shift : FP_PAGE_SHIFT;

    size_t total = 0;
    r = FP_CU(&p->ch.calls, cuDeviceTotalMem, &total, p->ch.dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceTotalMem", "asking device %d's memory size", p->opt.device);
    p->ch.dev_total = total;
    uint64_t size = p->opt.reserve_bytes;
    if (!size)
        size = 8ull * total;
    size = fp_round_up(size, gran);
    uint64_t base = 0;
    r = fp_vmm_reserve(&p->ch, size, 0, &base);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemAddressReserve", "reserving %llu bytes of address space (lower it with "
                            "FABPOOL_CONF=reserve:...)", (unsigned long long)size);
    p->sp.va.base = base;
    p->sp.va.size = size;
    return FABPOOL_OK;
}

/* The log's line for a new pool: version, device, handle type and why, reservation, the options asked for
 * that differ from the defaults (o: before the pool rounded any). */
static void log_created(struct fabpool *p, const fabpool_options *o, const char *why)
{
    char *opts = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&opts, &len);
    if (f) {
        fp_options_print(f, o, 1, 0);
        fclose(f);
    }
    FP_LOG_POOL(FP_LOG_INFO, p->ch.log_pool, p->opt.device,
                "fabpool %s: pool created on device %d (%.1f GiB, granularity %llu KiB), handle type %s (%s), rdma "
                "%s, reservation %.1f GiB at 0x%llx, options %s%s", fabpool_version(), p->opt.device,
                (double)p->ch.dev_total / (double)(1ull << 30), (unsigned long long)(p->sp.gran >> 10),
                fp_handle_type_name(p->ch.handle_type), why, p->ch.rdma ? "on" : "off",
                (double)p->sp.va.size / (double)(1ull << 30), (unsigned long long)p->sp.va.base,
                opts && len ? "other than the defaults: " : "", opts && len ? opts : "the defaults");
    free(opts);
}

static fabpool_status teardown(struct fabpool *p);

/* The options a pool is made with: opts (or the defaults), then the
 * configuration string over them, checked. */
static fabpool_status resolve_options(const fabpool_options *opts, fabpool_options *o)
{
    fabpool_options_init(o);
    if (opts) {
        if (opts->struct_size != sizeof(fabpool_options))
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: options.struct_size is %u, this library "
                            "expects %zu: call fabpool_options_init() first, and build against this fabpool.h",
                            opts->struct_size, sizeof(fabpool_options));
        *o = *opts;
    }
    fabpool_status st = apply_conf(o);
    if (st == FABPOOL_OK)
        st = fp_options_check(o);
    return st;
}

/* The pool's struct, in its own metadata arena, with its options and the
 * device fields that the layers below read; nothing of the driver yet. */
static fabpool_status pool_new(const fabpool_options *o, struct fabpool **out)
{
    fp_meta meta;
    fabpool_status st = fp_meta_init(&meta, o->metadata);
    if (st != FABPOOL_OK)
        return st;
    struct fabpool *p = fp_meta_alloc(&meta, sizeof *p);
    if (!p) {
        fp_meta_destroy(&meta);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a pool (%zu bytes)", sizeof(struct fabpool));
    }
    p->meta = meta;
    p->opt = *o;
    p->opt.conf = NULL;   /* not ours to keep */
    p->ch.device = o->device;
    p->ch.log_pool = fp_log_pool_number();
    p->ch.n_peers = o->n_peer_devices;
    for (int i = 0; i < o->n_peer_devices && i < FABPOOL_MAX_PEERS; i++)
        p->ch.peers[i] = o->peer_devices[i];
    fp_lock_init(&p->sp.lock, FP_LOCK_POOL, 0, "pool");
    p->ch.lock = &p->sp.lock;
    p->ch.meta = &p->meta;
    fp_mapreg_init(&p->ch.reg, &p->meta);
    p->sp.ch = &p->ch;
    p->sp.meta = &p->meta;
    *out = p;
    return FABPOOL_OK;
}

/* The address space's page map and range allocator over the reservation. */
static fabpool_status space_init(struct fabpool *p)
{
    uint64_t va_base = p->sp.va.base, va_size = p->sp.va.size;
    if (fp_map_init(&p->sp.map, &p->meta, &p->sp.lock, va_base, va_size, p->sp.page_shift) != 0 ||
        fp_va_init(&p->sp.va, &p->meta, va_base, va_size) != 0) {
        p->sp.va.base = va_base; /* teardown frees the reservation */
        p->sp.va.size = va_size;
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of %llu bytes of address space",
                        (unsigned long long)va_size);
    }
    return FABPOOL_OK;
}

/* The layers above the space, each given what it shares with the others. */
static void layers_init(struct fabpool *p)
{
    fp_heap_init(&p->heap, &p->sp, &p->opt);
    p->opt.slab_max_bytes = p->heap.slab_max;
    fp_alloc_init(&p->alloc, &p->heap, &p->retire, p->opt.thread_cache);
    p->use.large = &p->heap.large_in_use_bytes;
    p->use.buffers = &p->bufs.bytes;
    p->alloc.use = &p->use;
    p->ch.fence = &p->retire;
    p->alloc.trace = p->trace;
    fp_buffers_init(&p->bufs, &p->heap, &p->retire, &p->opt);
    p->bufs.trace = p->trace;
    p->bufs.use = &p->use;
    fp_views_init(&p->views, &p->sp, p->opt.keep_ms);
}

fabpool_status fabpool_create(const fabpool_options *opts, fabpool_t **out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: the output pointer is NULL");
    *out = NULL;
    fabpool_options o;
    fabpool_status st = resolve_options(opts, &o);
    if (st != FABPOOL_OK)
        return st;
    fp_log_raise(o.debug); /* before the driver loads: its calls are logged at trace */
    struct fabpool *p = NULL;
    if ((st = fp_drv_load()) != FABPOOL_OK || (st = pool_new(&o, &p)) != FABPOOL_OK)
        return st;

    char why[256];
    if ((st = setup_device(p)) != FABPOOL_OK ||
        (st = fp_retire_init(&p->retire, &p->meta, &p->ch.calls, p->ch.ctx, p->opt.device, (int)p->opt.stream_owner)) !=
            FABPOOL_OK ||
        (st = fp_chunk_choose_rdma(&p->ch, p->opt.rdma)) != FABPOOL_OK ||
        (st = choose_handle_type(p, why, sizeof why)) != FABPOOL_OK || (st = reserve(p)) != FABPOOL_OK ||
        (st = fp_trace_open(&p->opt, p->sp.gran, &p->trace)) != FABPOOL_OK)
        goto fail;
    p->ch.trace = p->trace; /* before anything is mapped, so that every unmap in the file follows its map */
    if ((st = space_init(p)) != FABPOOL_OK)
        goto fail;
    layers_init(p);
    if (fp_registry_add(&p->alloc) != 0) {
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the pool registry");
        goto fail;
    }
    if (FP_LOG_ON(FP_LOG_INFO))
        log_created(p, &o, why);
    fp_error_clear();
    *out = p;
    return FABPOOL_OK;

fail: {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    (void)teardown(p);
    return fp_error(st, "%s", msg);
}
}

/* Frees whatever creation got to; also the end of destroy. */
static fabpool_status teardown(struct fabpool *p)
{
    fabpool_status st = FABPOOL_OK;
    fp_trace_close(p->trace);
    p->trace = p->alloc.trace = p->bufs.trace = p->ch.trace = NULL;
    p->ch.fence = NULL;
    if (p->retire.meta)
        fp_retire_destroy(&p->retire);
    fp_lock(&p->sp.lock); /* the unmaps assert it (lock.h); no other thread uses the pool any more */
    fp_heap_destroy(&p->heap);
    fp_sleep_free(p);
    fp_chunk_exports_free(&p->ch); /* what an unmap the driver refused left */
    fp_mapreg_free(&p->ch.reg);
    fp_unlock(&p->sp.lock);
    fp_tcaches_destroy(&p->alloc);
    fp_map_destroy(&p->sp.map);
    uint64_t va_base = p->sp.va.base, va_size = p->sp.va.size;
    if (p->sp.va.free)
        fp_va_destroy(&p->sp.va);
    CUresult r;
    if (va_base && (r = fp_vmm_unreserve(&p->ch, va_base, va_size)) != CUDA_SUCCESS)
        st = fp_drv_error(r, "cuMemAddressFree", "freeing the pool's reservation of %llu bytes (tried twice; the "
                          "address range stays reserved)", (unsigned long long)va_size);
    if (p->ch.ctx && (r = FP_CU_UNDO(&p->ch.calls, cuDevicePrimaryCtxRelease, p->ch.dev)) != CUDA_SUCCESS && st == FABPOOL_OK)
        st = fp_drv_error(r, "cuDevicePrimaryCtxRelease", "releasing the primary context of the pool's device");
    fp_lock_destroy(&p->sp.lock);
    fp_meta meta = p->meta;
    fp_meta_free(&meta, p, sizeof *p);
    fp_meta_destroy(&meta);
    return st;
}

fabpool_status fabpool_destroy(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_destroy: the pool is NULL");
    fp_registry_remove(&p->alloc);
    if (p->opt.stats_at_destroy)
        fabpool_print_stats(p, stderr, p->opt.stats_at_destroy == 2);
    /* blocks freed on streams: waited for and given back to the pool, so
     * that they count neither as live nor as leaked */
    fp_alloc_drain(&p->alloc, 1, 1);
    fp_lock(&p->sp.lock);
    fp_chunk_anchor_close(&p->ch); /* before the chunks go one by one */
    fabpool_status st = fp_collect_locked(&p->bufs, 1);
    uint64_t live_buffers = atomic_load(&p->bufs.count);
    fp_views_destroy(&p->views);
    fp_buffers_destroy(&p->bufs);
    fp_unlock(&p->sp.lock);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(p, &s);
    uint64_t live_blocks = s.blocks;
    unsigned log_pool = p->ch.log_pool; /* for the log, once p is gone */
    int device = p->opt.device;
    fabpool_status tst = teardown(p);
    if (st == FABPOOL_OK)
        st = tst;
    if (st == FABPOOL_OK && (live_buffers || live_blocks))
        st = fp_error(FABPOOL_ERR_BUSY, "fabpool_destroy: %llu buffer%s and %llu block%s were still live; their "
                      "memory was unmapped and the pool destroyed",
                      (unsigned long long)live_buffers, live_buffers == 1 ? "" : "s",
                      (unsigned long long)live_blocks, live_blocks == 1 ? "" : "s");
    if (st != FABPOOL_OK)
        FP_LOG_POOL(FP_LOG_WARN, log_pool, device, "%s", fabpool_last_error());
    else
        FP_LOG_POOL(FP_LOG_INFO, log_pool, device, "destroyed");
    return st;
}

/* ------------------------------------------------------------ misc */

fabpool_status fabpool_trim(fabpool_t *p, size_t keep)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_trim: the pool is NULL");
    FP_TRACE(p->trace, FABPOOL_TR_TRIM, 0, keep, 0);
    fp_chunk_tally t = fp_chunk_tally_begin();
    /* what was freed on streams and whose work is done can go too (an event
     * is recorded on every stream with uncovered frees); what the GPU may
     * still use stays: it is live for the pool until then */
    fp_alloc_drain(&p->alloc, 0, 1);
    fp_alloc_flush_all(&p->alloc);
    fp_lock(&p->sp.lock);
    fp_buffers_drop_kept(&p->bufs, 1); /* released buffers and views kept for reuse go too */
    fp_views_drop_kept(&p->views, 1);
    fabpool_status st = fp_collect_locked(&p->bufs, 0);
    fp_heap_trim_locked(&p->heap, keep);
    fabpool_status hst = fp_sleep_host_trim(p); /* and sleep's kept host copies (sleep_keep_host) */
    fp_unlock(&p->sp.lock);
    t = fp_chunk_tally_end(t);
    FP_LOG_CH(FP_LOG_INFO, &p->ch, "trim (keep %zu bytes cached): %llu bytes in %llu chunks back to the driver; the "
              "pool maps %llu", keep, (unsigned long long)t.bytes, (unsigned long long)t.chunks,
              (unsigned long long)fp_chunks_mapped(&p->ch, NULL));
    return st != FABPOOL_OK ? st : hst;
}

fabpool_status fabpool_device_count(int *out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_device_count: the output is NULL");
    *out = 0;
    fabpool_status st = fp_drv_load();
    if (st != FABPOOL_OK)
        return st;
    CUresult r = FP_CU(NULL, cuDeviceGetCount, out);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetCount", "counting devices");
    return FABPOOL_OK;
}

fabpool_handle_type fabpool_handle_type_of(const fabpool_t *p) { return p ? p->ch.handle_type : FABPOOL_HANDLE_NONE; }

/* ------------------------------------------------------------ entry points of the layers below */

fabpool_status fabpool_buffer_create(fabpool_t *p, size_t max_size, size_t size, fabpool_buffer_t **out)
{
    return fp_buffer_create(p ? &p->bufs : NULL, max_size, size, out);
}

fabpool_status fabpool_buffer_reuse(fabpool_t *p, size_t size, void *stream, fabpool_buffer_t **out)
{
    return fp_buffer_reuse(p ? &p->bufs : NULL, size, stream, out);
}

fabpool_status fabpool_collect(fabpool_t *p, int wait)
{
    if (p) {
        fp_alloc_drain(&p->alloc, wait, wait); /* blocks freed on streams whose work is done go back to the pool */
        fp_lock(&p->sp.lock);
        fp_buffers_drop_kept(&p->bufs, 0); /* and what was released and kept for keep_ms */
        fp_views_drop_kept(&p->views, 0);
        fp_unlock(&p->sp.lock);
    }
    return fp_buffers_collect(p ? &p->bufs : NULL, wait);
}

fabpool_status fabpool_peers_ack(fabpool_t *p, uint64_t export_id, uint64_t generation)
{
    return fp_buffers_peers_ack(p ? &p->bufs : NULL, export_id, generation);
}

fabpool_status fabpool_block_export(fabpool_t *p, const void *ptr, void *desc, size_t cap, size_t *len, int *fds,
                                    size_t fd_cap, size_t *nfds, size_t *offset)
{
    return fp_block_export(p ? &p->alloc : NULL, ptr, desc, cap, len, fds, fd_cap, nfds, offset);
}

fabpool_status fabpool_view_open(fabpool_t *p, const void *desc, size_t len, const int *fds, size_t nfds,
                                 fabpool_view_t **out)
{
    return fp_view_open(p ? &p->views : NULL, desc, len, fds, nfds, out);
}
