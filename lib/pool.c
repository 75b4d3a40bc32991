/* pool.c - a pool per device: creation (options, driver, handle type,
 * the one address reservation), the page map, trim and destroy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "error.h"
#include "pool.h"
#include "sleep.h"
#include "trace.h"

/* ------------------------------------------------------------ page map */

int fp_map_set(struct fabpool *p, uint64_t addr, uint64_t size, fp_span *s)
{
    fp_lock_assert_held(&p->lock);
    uint64_t g0 = (addr - p->va_base) >> p->gran_shift, n = size >> p->gran_shift;
    for (uint64_t g = g0; g < g0 + n; g++) {
        _Atomic(fp_span *) *leaf = atomic_load_explicit(&p->map_l1[g >> FP_MAP_LEAF_SHIFT], memory_order_acquire);
        if (!leaf) {
            if (!s)
                continue;
            leaf = fp_meta_alloc(&p->meta, FP_MAP_LEAF * sizeof *leaf);
            if (!leaf) {
                if (g > g0)
                    fp_map_set(p, addr, (g - g0) << p->gran_shift, NULL);
                return -1;
            }
            atomic_store_explicit(&p->map_l1[g >> FP_MAP_LEAF_SHIFT], leaf, memory_order_release);
        }
        atomic_store_explicit(&leaf[g & (FP_MAP_LEAF - 1)], s, memory_order_release);
    }
    return 0;
}

static void map_destroy(struct fabpool *p)
{
    if (!p->map_l1)
        return;
    for (uint64_t i = 0; i < p->map_l1_n; i++) {
        _Atomic(fp_span *) *leaf = atomic_load(&p->map_l1[i]);
        if (leaf)
            fp_meta_free(&p->meta, (void *)leaf, FP_MAP_LEAF * sizeof *leaf);
    }
    fp_meta_free(&p->meta, (void *)p->map_l1, p->map_l1_n * sizeof *p->map_l1);
    p->map_l1 = NULL;
}

/* ------------------------------------------------------------ handle type */

static const char *handle_type_name(fabpool_handle_type t)
{
    switch (t) {
    case FABPOOL_HANDLE_AUTO: return "auto";
    case FABPOOL_HANDLE_NONE: return "none";
    case FABPOOL_HANDLE_POSIX_FD: return "posix_fd";
    case FABPOOL_HANDLE_FABRIC: return "fabric";
    }
    return "?";
}

/* A real create, export and import of a fabric handle: the device attribute
 * alone says nothing about the IMEX channel (driver-facts.md). */
static CUresult probe_fabric(struct fabpool *p, const char **step)
{
    CUmemAllocationProp prop = fp_alloc_prop(p);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    size_t gran = 0;
    CUresult r = FP_CU(&p->calls, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    *step = "cuMemGetAllocationGranularity";
    if (r != CUDA_SUCCESS)
        return r;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    *step = "cuMemCreate";
    r = FP_CU(&p->calls, cuMemCreate, &h, gran, &prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemFabricHandle fh;
    *step = "cuMemExportToShareableHandle";
    r = FP_CU(&p->calls, cuMemExportToShareableHandle, &fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    if (r == CUDA_SUCCESS) {
        *step = "cuMemImportFromShareableHandle";
        r = FP_CU(&p->calls, cuMemImportFromShareableHandle, &h2, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
        if (r == CUDA_SUCCESS)
            FP_CU_UNDO(&p->calls, cuMemRelease, h2);
    }
    FP_CU_UNDO(&p->calls, cuMemRelease, h);
    return r;
}

static fabpool_status choose_handle_type(struct fabpool *p)
{
    fabpool_handle_type want = p->opt.handle_type;
    int posix = 0;
    FP_CU(&p->calls, cuDeviceGetAttribute, &posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          p->dev);
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_FABRIC) {
        int fabric = 0;
        FP_CU(&p->calls, cuDeviceGetAttribute, &fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, p->dev);
        const char *step = "cuDeviceGetAttribute";
        CUresult r = fabric ? probe_fabric(p, &step) : CUDA_ERROR_NOT_SUPPORTED;
        if (r == CUDA_SUCCESS) {
            p->handle_type = FABPOOL_HANDLE_FABRIC;
            p->cu_handle_types = CU_MEM_HANDLE_TYPE_FABRIC;
            return FABPOOL_OK;
        }
        if (want == FABPOOL_HANDLE_FABRIC)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                            "handle_type:fabric was asked for, but device %d cannot share fabric handles: %s "
                            "answered %s%s. Fabric handles need an IMEX channel (/dev/nvidia-caps-imex-channels/"
                            "channelN, made by the nvidia-imex service on an NVLink-fabric system such as GB200 "
                            "NVL72); without one, use handle_type:posix_fd (shareable between processes of one "
                            "host) or handle_type:auto, which falls back by itself",
                            (int)p->dev, fabric ? step : "the device attribute HANDLE_TYPE_FABRIC_SUPPORTED",
                            fabric ? fp_drv_error_name(r) : "0", r == CUDA_ERROR_NOT_PERMITTED ?
                            " (the process has no IMEX channel)" : "");
    }
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_POSIX_FD) {
        if (posix) {
            p->handle_type = FABPOOL_HANDLE_POSIX_FD;
            p->cu_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            return FABPOOL_OK;
        }
        if (want == FABPOOL_HANDLE_POSIX_FD)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "handle_type:posix_fd was asked for, but device %d does not "
                            "support POSIX file descriptor handles; use handle_type:none", (int)p->dev);
    }
    p->handle_type = FABPOOL_HANDLE_NONE;
    p->cu_handle_types = CU_MEM_HANDLE_TYPE_NONE;
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
    return fp_trace_env(o);
}

static fabpool_status setup_device(struct fabpool *p)
{
    int n = 0;
    CUresult r = FP_CU(&p->calls, cuDeviceGetCount, &n);
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
    r = FP_CU(&p->calls, cuDeviceGet, &p->dev, p->opt.device);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGet", "opening device %d", p->opt.device);
    int vmm = 0;
    r = FP_CU(&p->calls, cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p->dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetAttribute", "asking whether device %d supports virtual memory management",
                            p->opt.device);
    if (!vmm)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "device %d does not support the virtual memory management API "
                        "(cuMemCreate / cuMemMap), which fabpool is built on", p->opt.device);
    for (int i = 0; i < p->opt.n_peer_devices; i++) {
        int ok = 0;
        CUdevice peer;
        FP_CU(&p->calls, cuDeviceGet, &peer, p->opt.peer_devices[i]);
        FP_CU(&p->calls, cuDeviceCanAccessPeer, &ok, peer, p->dev);
        if (!ok)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "peer device %d cannot access device %d's memory "
                            "(cuDeviceCanAccessPeer answered 0)", p->opt.peer_devices[i], p->opt.device);
    }
    r = FP_CU(&p->calls, cuDevicePrimaryCtxRetain, &p->ctx, p->dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDevicePrimaryCtxRetain", "retaining device %d's primary context", p->opt.device);
    return FABPOOL_OK;
}

static fabpool_status reserve(struct fabpool *p)
{
    CUmemAllocationProp prop = fp_alloc_prop(p);
    size_t gran = 0;
    CUresult r = FP_CU(&p->calls, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemGetAllocationGranularity", "asking device %d's granularity", p->opt.device);
    if (gran == 0 || (gran & (gran - 1)))
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "the driver's granularity %zu is not a power of two", gran);
    p->gran = gran;
    p->gran_shift = fp_log2_floor(gran);

    uint64_t size = p->opt.reserve_bytes;
    if (!size) {
        size_t total = 0;
        r = FP_CU(&p->calls, cuDeviceTotalMem, &total, p->dev);
        if (r != CUDA_SUCCESS)
            return fp_drv_error(r, "cuDeviceTotalMem", "asking device %d's memory size", p->opt.device);
        size = 8ull * total;
    }
    size = fp_round_up(size, gran);
    CUdeviceptr base = 0;
    r = FP_CU(&p->calls, cuMemAddressReserve, &base, size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemAddressReserve", "reserving %llu bytes of address space (lower it with "
                            "FABPOOL_CONF=reserve:...)", (unsigned long long)size);
    p->va_base = base;
    p->va_size = size;
    return FABPOOL_OK;
}

static void set_thread_cache_caps(struct fabpool *p)
{
    size_t bytes = 0;
    for (unsigned c = 0; c < p->n_slab_classes; c++) {
        uint64_t sz = fp_class_size(c);
        /* up to 64 blocks and 8 MiB a bin, and never fewer than 2, so that a
         * thread that frees and allocates a block of the largest slab class
         * takes no lock either (8 threads on one 4 MiB class contended on its
         * lock at 5.6 us a pair on the H200 without this) */
        uint64_t cap = (8ull << 20) / sz;
        p->tc_cap[c] = (uint32_t)(cap > 64 ? 64 : cap < 2 ? 2 : cap);
        bytes += p->tc_cap[c] * sizeof(fp_item);
    }
    p->tcache_bytes = bytes;
}

static fabpool_status teardown(struct fabpool *p);

fabpool_status fabpool_create(const fabpool_options *opts, fabpool_t **out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: the output pointer is NULL");
    *out = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    if (opts) {
        if (opts->struct_size != sizeof(fabpool_options))
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: options.struct_size is %u, this library "
                            "expects %zu: call fabpool_options_init() first, and build against this fabpool.h",
                            opts->struct_size, sizeof(fabpool_options));
        o = *opts;
    }
    fabpool_status st = apply_conf(&o);
    if (st == FABPOOL_OK)
        st = fp_options_check(&o);
    if (st != FABPOOL_OK)
        return st;
    st = fp_drv_load();
    if (st != FABPOOL_OK)
        return st;

    fp_meta meta;
    st = fp_meta_init(&meta, o.metadata);
    if (st != FABPOOL_OK)
        return st;
    struct fabpool *p = fp_meta_alloc(&meta, sizeof *p);
    if (!p) {
        fp_meta_destroy(&meta);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a pool (%zu bytes)", sizeof(struct fabpool));
    }
    p->meta = meta;
    p->opt = o;
    p->opt.conf = NULL;   /* not ours to keep */
    fp_lock_init(&p->lock, FP_LOCK_POOL, 0, "pool");
    for (unsigned c = 0; c < FP_NCLASS; c++)
        fp_lock_init(&p->classes[c].lock, FP_LOCK_CLASS, c, "class");

    if ((st = setup_device(p)) != FABPOOL_OK ||
        (st = fp_retire_init(&p->retire, &p->meta, &p->calls, p->ctx, p->opt.device)) != FABPOOL_OK ||
        (st = fp_rdma_choose(p)) != FABPOOL_OK ||
        (st = choose_handle_type(p)) != FABPOOL_OK || (st = reserve(p)) != FABPOOL_OK ||
        (st = fp_trace_open(p)) != FABPOOL_OK)
        goto fail;
    fp_classes_init(p);
    set_thread_cache_caps(p);
    p->map_l1_n = ((p->va_size >> p->gran_shift) + FP_MAP_LEAF - 1) >> FP_MAP_LEAF_SHIFT;
    p->map_l1 = fp_meta_alloc(&p->meta, p->map_l1_n * sizeof *p->map_l1);
    if (!p->map_l1 || fp_va_init(&p->va, &p->meta, p->va_base, p->va_size) != 0) {
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of %llu bytes of address space",
                      (unsigned long long)p->va_size);
        goto fail;
    }
    if (fp_registry_add(p) != 0) {
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the pool registry");
        goto fail;
    }
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
    fp_trace_close(p);
    if (p->retire.meta)
        fp_retire_destroy(&p->retire);
    fp_lock(&p->lock);   /* the unmaps assert it (lock.h); no other thread uses the pool any more */
    fp_classes_destroy(p);
    fp_sleep_free(p);
    fp_unlock(&p->lock);
    fp_tcaches_destroy(p);
    map_destroy(p);
    if (p->va.free)
        fp_va_destroy(&p->va);
    CUresult r;
    if (p->va_base && (r = FP_CU_UNDO(&p->calls, cuMemAddressFree, (CUdeviceptr)p->va_base, p->va_size)) != CUDA_SUCCESS)
        st = fp_drv_error(r, "cuMemAddressFree", "freeing the pool's reservation of %llu bytes (tried twice; the "
                          "address range stays reserved)", (unsigned long long)p->va_size);
    if (p->ctx && (r = FP_CU_UNDO(&p->calls, cuDevicePrimaryCtxRelease, p->dev)) != CUDA_SUCCESS && st == FABPOOL_OK)
        st = fp_drv_error(r, "cuDevicePrimaryCtxRelease", "releasing the primary context of the pool's device");
    fp_lock_destroy(&p->lock);
    fp_meta meta = p->meta;
    fp_meta_free(&meta, p, sizeof *p);
    fp_meta_destroy(&meta);
    return st;
}

fabpool_status fabpool_destroy(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_destroy: the pool is NULL");
    fp_registry_remove(p);
    if (p->opt.stats_at_destroy)
        fabpool_print_stats(p, stderr, p->opt.stats_at_destroy == 2);
    /* blocks freed on streams: waited for and given back to the pool, so
     * that they count neither as live nor as leaked */
    fp_retire_drain(p, 1, 1);
    fp_lock(&p->lock);
    fabpool_status st = fp_collect_locked(p, 1);
    uint64_t live_buffers = atomic_load(&p->buffer_count);
    fp_views_destroy(p);
    fp_buffers_destroy(p);
    fp_unlock(&p->lock);
    fabpool_stats s;
    fabpool_get_stats(p, &s);
    uint64_t live_blocks = s.blocks;
    fabpool_status tst = teardown(p);
    if (st == FABPOOL_OK)
        st = tst;
    if (st == FABPOOL_OK && (live_buffers || live_blocks))
        st = fp_error(FABPOOL_ERR_BUSY, "fabpool_destroy: %llu buffer%s and %llu block%s were still live; their "
                      "memory was unmapped and the pool destroyed",
                      (unsigned long long)live_buffers, live_buffers == 1 ? "" : "s",
                      (unsigned long long)live_blocks, live_blocks == 1 ? "" : "s");
    return st;
}

/* ------------------------------------------------------------ misc */

fabpool_status fabpool_trim(fabpool_t *p, size_t keep)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_trim: the pool is NULL");
    FP_TRACE(p, FABPOOL_TR_TRIM, 0, keep, 0);
    /* other threads flush their caches at their next call */
    atomic_fetch_add(&p->flush_epoch, 1);
    /* what was freed on streams and whose work is done can go too (an event
     * is recorded on every stream with uncovered frees); what the GPU may
     * still use stays: it is live for the pool until then */
    fp_retire_drain(p, 0, 1);
    fabpool_thread_flush(p);
    fp_lock(&p->lock);
    fabpool_status st = fp_collect_locked(p, 0);
    fp_trim_locked(p, keep);
    fp_unlock(&p->lock);
    return st;
}

fabpool_status fabpool_get_options(const fabpool_t *p, fabpool_options *out)
{
    if (!p || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_options: the pool or the output is NULL");
    *out = p->opt;
    out->handle_type = p->handle_type;
    out->rdma = p->rdma ? FABPOOL_RDMA_ON : FABPOOL_RDMA_OFF;
    out->reserve_bytes = p->va_size;
    return FABPOOL_OK;
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

fabpool_handle_type fabpool_handle_type_of(const fabpool_t *p) { return p ? p->handle_type : FABPOOL_HANDLE_NONE; }

const char *fp_handle_type_name(fabpool_handle_type t) { return handle_type_name(t); }
