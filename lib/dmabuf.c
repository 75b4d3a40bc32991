/* dmabuf.c - RDMA-ready memory: whether the pool's chunks are made
 * GPUDirect RDMA capable (the rdma option), and dma-buf file descriptors for
 * ranges of growable buffers, which a NIC driver registers
 * (ibv_reg_dmabuf_mr) without peer-memory kernel modules. */
#include <stdint.h>
#include <unistd.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"

/* conf.c stores the rdma key as an int */
_Static_assert(sizeof(fabpool_rdma) == sizeof(int), "fabpool_rdma is stored through an int");

fabpool_status fp_rdma_choose(struct fabpool *p)
{
    int vmm_rdma = 0, dmabuf = 0;
    p->rdma = 0;
    p->dmabuf_supported = 0;
    if (p->opt.rdma != FABPOOL_RDMA_OFF) {
        CUresult r = FP_CU(&p->calls, cuDeviceGetAttribute, &vmm_rdma,
                           CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, p->dev);
        if (r != CUDA_SUCCESS)
            return fp_drv_error(r, "cuDeviceGetAttribute", "asking whether device %d supports GPUDirect RDMA with "
                                "VMM allocations (for rdma:%s; rdma:off skips the question)", (int)p->dev,
                                p->opt.rdma == FABPOOL_RDMA_ON ? "on" : "auto");
        if (!vmm_rdma && p->opt.rdma == FABPOOL_RDMA_ON)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                            "rdma:on was asked for, but device %d does not support GPUDirect RDMA with VMM "
                            "allocations (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0; it needs "
                            "a data-center GPU and a driver that supports it). Use rdma:auto, which makes ordinary "
                            "chunks there, or rdma:off",
                            (int)p->dev);
        p->rdma = vmm_rdma ? 1 : 0;
    }
    /* dma-buf export works for chunks with or without the RDMA flag; a failed
     * question only means fabpool_buffer_dmabuf will say it is unsupported */
    if (FP_CU(&p->calls, cuDeviceGetAttribute, &dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, p->dev) != CUDA_SUCCESS)
        dmabuf = 0;
    p->dmabuf_supported = dmabuf != 0;
    return FABPOOL_OK;
}

fabpool_status fabpool_buffer_dmabuf(fabpool_buffer_t *b, size_t offset, size_t size, int *fd)
{
    if (fd)
        *fd = -1;
    if (!b || !fd)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_dmabuf: the buffer or the fd output is NULL");
    struct fabpool *p = b->pool;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (page == 0 || page == (uint64_t)-1)
        page = 4096;
    fp_lock(&p->lock);
    fabpool_status st = FABPOOL_OK;
    uint64_t live = b->live;
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n; i++)
        n += !b->chunks[i].retiring && b->chunks[i].off < offset + size && b->chunks[i].off + b->chunks[i].size > offset;
    if (b->destroyed)
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_dmabuf: the buffer was destroyed");
    else if (fp_asleep(p))
        st = fp_asleep_error("fabpool_buffer_dmabuf");
    else if (size == 0)
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_dmabuf: the size is 0; give the bytes to export");
    else if (offset > live || size > live - offset)
        st = fp_error(FABPOOL_ERR_INVALID_ARG,
                      "fabpool_buffer_dmabuf: bytes [%zu, %zu + %zu) lie outside the buffer's %llu mapped bytes "
                      "(fabpool_buffer_get_info: mapped); grow the buffer first or export a smaller range",
                      offset, offset, size, (unsigned long long)live);
    else if (offset % page || size % page)
        st = fp_error(FABPOOL_ERR_INVALID_ARG,
                      "fabpool_buffer_dmabuf: offset %zu and size %zu must be multiples of the host page size (%llu "
                      "bytes), as cuMemGetHandleForAddressRange requires; round the range out to pages",
                      offset, size, (unsigned long long)page);
    else if (!p->dmabuf_supported)
        st = fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                      "fabpool_buffer_dmabuf: device %d cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
                      "is 0: it needs Linux 5.12 or newer, the open NVIDIA kernel module and a data-center GPU)",
                      (int)p->dev);
    if (st != FABPOOL_OK) {
        fp_unlock(&p->lock);
        return st;
    }
    CUcontext saved;
    st = fp_ctx_push(p, &saved);
    if (st == FABPOOL_OK) {
        int out = -1;
        CUresult r = FP_CU(&p->calls, cuMemGetHandleForAddressRange, &out, (CUdeviceptr)(b->base + offset), size,
                           CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (r != CUDA_SUCCESS)
            st = fp_drv_error(r, "cuMemGetHandleForAddressRange", "exporting bytes [%zu, %zu + %zu) of a buffer at "
                              "0x%llx as one dma-buf (the range spans %u chunk%s)", offset, offset, size,
                              (unsigned long long)b->base, n, n == 1 ? "" : "s");
        else
            *fd = out;
        fp_ctx_pop(p, saved);
    }
    fp_unlock(&p->lock);
    return st;
}
