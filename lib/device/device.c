/* device.c - a pool's device opened and closed, its chunks' state set up
 * and read, the copies and waits of a sleep, and the refusal of a pool that
 * a fork left behind (device.h). */
#include "device.h"

#include <stdio.h>

#include "error.h"
#include "counter.h"
#include "log.h"
#include "vmm.h"

void fp_chunks_init(fp_chunks *ch, const fabpool_options *o, fp_meta *meta, const fp_lock_t *lock)
{
    ch->device = o->device;
    ch->log_pool = fp_log_pool_number();
    ch->n_peers = o->n_peer_devices;
    for (int i = 0; i < o->n_peer_devices && i < FABPOOL_MAX_PEERS; i++)
        ch->peers[i] = o->peer_devices[i];
    ch->lock = lock;
    ch->meta = meta;
    fp_mapreg_init(&ch->reg, meta);
}

void fp_chunks_attach(fp_chunks *ch, struct fp_trace *trace, fp_retire *fence)
{
    ch->trace = trace;
    ch->fence = fence;
}

/* Chooses the pool's handle type; why[0..n) says why (for the log). */
static fabpool_status choose_handle_type(fp_chunks *ch, fabpool_handle_type want, char *why, size_t n)
{
    snprintf(why, n, "asked for");
    int posix = 0;
    FP_CU(&ch->calls, cuDeviceGetAttribute, &posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          ch->dev);
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_FABRIC) {
        int fabric = 0;
        FP_CU(&ch->calls, cuDeviceGetAttribute, &fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, ch->dev);
        const char *step = "cuDeviceGetAttribute";
        CUresult r = fabric ? fp_vmm_probe_fabric(ch, &step) : CUDA_ERROR_NOT_SUPPORTED;
        if (r == CUDA_SUCCESS) {
            ch->handle_type = FABPOOL_HANDLE_FABRIC;
            ch->cu_handle_types = CU_MEM_HANDLE_TYPE_FABRIC;
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
                            (int)ch->dev, fabric ? step : "the device attribute HANDLE_TYPE_FABRIC_SUPPORTED",
                            fabric ? fp_drv_error_name(r) : "0", r == CUDA_ERROR_NOT_PERMITTED ?
                            " (the process has no IMEX channel)" : "");
    }
    if (want == FABPOOL_HANDLE_AUTO || want == FABPOOL_HANDLE_POSIX_FD) {
        if (posix) {
            ch->handle_type = FABPOOL_HANDLE_POSIX_FD;
            ch->cu_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            return FABPOOL_OK;
        }
        if (want == FABPOOL_HANDLE_POSIX_FD)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "handle_type:posix_fd was asked for, but device %d does not "
                            "support POSIX file descriptor handles; use handle_type:none", (int)ch->dev);
    }
    ch->handle_type = FABPOOL_HANDLE_NONE;
    ch->cu_handle_types = CU_MEM_HANDLE_TYPE_NONE;
    return FABPOOL_OK;
}

/* The device of o and its peers: there, with VMM, the peers able to reach it; its primary context retained. */
static fabpool_status setup_device(fp_chunks *ch, const fabpool_options *o)
{
    int n = 0;
    CUresult r = FP_CU(&ch->calls, cuDeviceGetCount, &n);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetCount", "counting devices");
    if (o->device < 0 || o->device >= n)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "device %d does not exist: the driver sees %d device%s (check "
                        "CUDA_VISIBLE_DEVICES)", o->device, n, n == 1 ? "" : "s");
    for (int i = 0; i < o->n_peer_devices; i++) {
        int d = o->peer_devices[i];
        if (d < 0 || d >= n || d == o->device)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "peer device %d: not a device other than the pool's own "
                            "(%d) among the %d the driver sees", d, o->device, n);
    }
    r = FP_CU(&ch->calls, cuDeviceGet, &ch->dev, o->device);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGet", "opening device %d", o->device);
    int vmm = 0;
    r = FP_CU(&ch->calls, cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ch->dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetAttribute", "asking whether device %d supports virtual memory management",
                            o->device);
    if (!vmm)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "device %d does not support the virtual memory management API "
                        "(cuMemCreate / cuMemMap), which fabpool is built on", o->device);
    for (int i = 0; i < o->n_peer_devices; i++) {
        int ok = 0;
        CUdevice peer;
        FP_CU(&ch->calls, cuDeviceGet, &peer, o->peer_devices[i]);
        FP_CU(&ch->calls, cuDeviceCanAccessPeer, &ok, peer, ch->dev);
        if (!ok)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "peer device %d cannot access device %d's memory "
                            "(cuDeviceCanAccessPeer answered 0)", o->peer_devices[i], o->device);
    }
    r = FP_CU(&ch->calls, cuDevicePrimaryCtxRetain, &ch->ctx, ch->dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDevicePrimaryCtxRetain", "retaining device %d's primary context", o->device);
    return FABPOOL_OK;
}

/* The granularity chunks are made in (a power of two), and the device's memory. */
static fabpool_status read_sizes(fp_chunks *ch, int device, uint64_t *gran_out)
{
    CUmemAllocationProp prop = fp_chunk_prop(ch);
    size_t gran = 0;
    CUresult r = FP_CU(&ch->calls, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemGetAllocationGranularity", "asking device %d's granularity", device);
    if (gran == 0 || (gran & (gran - 1)))
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "the driver's granularity %zu is not a power of two", gran);
    size_t total = 0;
    r = FP_CU(&ch->calls, cuDeviceTotalMem, &total, ch->dev);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceTotalMem", "asking device %d's memory size", device);
    ch->dev_total = total;
    *gran_out = gran;
    return FABPOOL_OK;
}

fabpool_status fp_device_open(fp_chunks *ch, fp_retire *r, const fabpool_options *o, char *why, size_t n,
                              uint64_t *gran)
{
    fabpool_status st;
    if ((st = setup_device(ch, o)) != FABPOOL_OK ||
        (st = fp_retire_init(r, ch->meta, &ch->calls, ch->ctx, o->device, (int)o->stream_owner)) != FABPOOL_OK ||
        (st = fp_chunk_choose_rdma(ch, o->rdma)) != FABPOOL_OK ||
        (st = choose_handle_type(ch, o->handle_type, why, n)) != FABPOOL_OK)
        return st;
    return read_sizes(ch, o->device, gran);
}

fabpool_status fp_device_close(fp_chunks *ch)
{
    CUresult r;
    if (ch->ctx && (r = FP_CU_UNDO(&ch->calls, cuDevicePrimaryCtxRelease, ch->dev)) != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDevicePrimaryCtxRelease", "releasing the primary context of the pool's device");
    return FABPOOL_OK;
}

void fp_device_set_forked(fp_chunks *ch) { atomic_store(&ch->forked, 1); }

fabpool_status fp_device_forked_error(const fp_chunks *ch, const char *fn)
{
    return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "%s: this pool (device %d) was made before this process was forked "
                    "from its maker: CUDA does not carry over a fork, so the child can use neither the pool nor its "
                    "memory; start the child with exec or spawn (multiprocessing's 'spawn') and make a pool there",
                    fn, (int)ch->dev);
}

fp_chunks_info fp_chunks_get_info(const fp_chunks *ch)
{
    return (fp_chunks_info){ch->handle_type, ch->rdma, ch->dev_total, ch->log_pool};
}


void fp_chunks_read_counters(const fp_chunks *src, fp_chunk_counters *c)
{
    c->mapped_bytes = fp_chunks_mapped(src, &c->chunks_mapped);
    c->mapped_bytes_peak = fp_chunks_mapped_peak(src);
    FP_CHUNKS_COUNTERS(FP_COUNTER_COPY)
    for (int i = 0; i < FP_DRV_COUNT; i++)
        c->calls[i] = fp_counter(&src->calls.n[i]);
}

CUresult fp_device_copy(fp_chunks *ch, uint64_t dst, uint64_t src, uint64_t size, void *stream)
{
    return FP_CU(&ch->calls, cuMemcpyDtoDAsync, (CUdeviceptr)dst, (CUdeviceptr)src, size, (CUstream)stream);
}

CUresult fp_device_sync(fp_chunks *ch, void *stream)
{
    return stream ? FP_CU(&ch->calls, cuStreamSynchronize, (CUstream)stream) : FP_CU(&ch->calls, cuCtxSynchronize);
}
