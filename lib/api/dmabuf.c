/* dmabuf.c - dma-buf file descriptors for ranges of growable buffers, which
 * a NIC driver registers (ibv_reg_dmabuf_mr) without peer-memory kernel
 * modules.  (Whether chunks are made GPUDirect RDMA capable is chunk.c's.)
 */
#include <stdint.h>
#include <unistd.h>

#include "buffer.h"
#include "error.h"
#include "handles.h"

fabpool_status fabpool_buffer_dmabuf(fabpool_buffer_t *b, size_t offset, size_t size, int *fd)
{
    if (fd)
        *fd = -1;
    if (!fd)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_dmabuf: the fd output is NULL");
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_dmabuf", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_dmabuf");
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (page == 0 || page == (uint64_t)-1)
        page = 4096;
    fp_lock(&bs->sp->lock);
    uint64_t live = b->live;
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n; i++)
        n += !b->chunks[i].retiring && b->chunks[i].off < offset + size && b->chunks[i].off + b->chunks[i].size > offset;
    if (fp_chunks_asleep(bs->sp->ch))
        st = fp_chunk_asleep_error("fabpool_buffer_dmabuf");
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
    else if (!bs->sp->ch->dmabuf_supported)
        st = fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                      "fabpool_buffer_dmabuf: device %d cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
                      "is 0: it needs Linux 5.12 or newer, the open NVIDIA kernel module and a data-center GPU)",
                      (int)bs->sp->ch->dev);
    if (st != FABPOOL_OK) {
        fp_unlock(&bs->sp->lock);
        return st;
    }
    CUcontext saved;
    st = fp_ctx_push(bs->sp->ch, &saved);
    if (st == FABPOOL_OK) {
        int out = -1;
        CUresult r = FP_CU(&bs->sp->ch->calls, cuMemGetHandleForAddressRange, &out, (CUdeviceptr)(b->base + offset), size,
                           CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (r != CUDA_SUCCESS)
            st = fp_drv_error(r, "cuMemGetHandleForAddressRange", "exporting bytes [%zu, %zu + %zu) of a buffer at "
                              "0x%llx as one dma-buf (the range spans %u chunk%s)", offset, offset, size,
                              (unsigned long long)b->base, n, n == 1 ? "" : "s");
        else
            *fd = out;
        fp_ctx_pop(bs->sp->ch, saved);
    }
    fp_unlock(&bs->sp->lock);
    return st;
}
