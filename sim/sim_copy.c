/* sim_copy.c - the simulated driver's copies (cuMemcpy*) and sets (cuMemset*)
 * between host memory and mappings, on the current context's device. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "sim_mem.h"

/* ------------------------------------------------------------ copies and sets */

/* dst_dev / src_dev: 1 if that side is device memory.  The copy runs on the
 * current context's device, which must have access to both sides;
 * dst_acc / src_acc >= 0 name another device for that side (cuMemcpyPeer). */
/* Copies n bytes between two mappings' memory files without touching what
 * was never written: a hole of the source (SEEK_DATA/SEEK_HOLE on its memfd)
 * becomes a hole of the destination (punched, or already one), only data is
 * copied.  The result is the same as memmove's; the cost follows the bytes
 * written, so that a program that moves mostly untouched chunks (a refit, a
 * copy of a fresh buffer) does not make the kernel allocate and zero every
 * page.  sim_lock held; [dst, dst+n) and [src, src+n) do not overlap. */
static void sparse_piece(int dfd, uint64_t doff, int sfd, uint64_t soff, uint64_t n, char *dp, const char *sp)
{
    const uint64_t page = 4096;
    uint64_t k = 0;
    while (k < n) {
        off_t d = lseek(sfd, (off_t)(soff + k), SEEK_DATA);
        uint64_t data = d < 0 ? n : (uint64_t)d - soff;
        if (data > n)
            data = n;
        if (data > k) { /* [k, data) reads as zeros */
            off_t dd = lseek(dfd, (off_t)(doff + k), SEEK_DATA);
            if (dd >= 0 && (uint64_t)dd < doff + data) {
                /* the destination holds data there: whole pages punched, the edges cleared */
                uint64_t a = (doff + k + page - 1) / page * page, b = (doff + data) / page * page;
                if (b > a && fallocate(dfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, (off_t)(b - a)) == 0) {
                    memset(dp + k, 0, a - doff - k);
                    memset(dp + (b - doff), 0, doff + data - b);
                } else {
                    memset(dp + k, 0, data - k);
                }
            }
            k = data;
            if (k >= n)
                break;
        }
        off_t h = lseek(sfd, (off_t)(soff + k), SEEK_HOLE);
        uint64_t end = h < 0 ? n : (uint64_t)h - soff;
        if (end > n || end <= k)
            end = n;
        memcpy(dp + k, sp + k, end - k);
        k = end;
    }
}

static int sparse_copy(uint64_t dst, uint64_t src, size_t n)
{
    if (!(dst + n <= src || src + n <= dst))
        return 0;
    /* every piece must lie in mappings (not legacy allocations) */
    for (uint64_t k = 0; k < n;) {
        mapping *ms = map_at(src + k), *md = map_at(dst + k);
        if (!ms || !md || ms->h->ph->fd < 0 || md->h->ph->fd < 0)
            return 0;
        uint64_t len = n - k;
        if (ms->va + ms->size - (src + k) < len)
            len = ms->va + ms->size - (src + k);
        if (md->va + md->size - (dst + k) < len)
            len = md->va + md->size - (dst + k);
        k += len;
    }
    for (uint64_t k = 0; k < n;) {
        mapping *ms = map_at(src + k), *md = map_at(dst + k);
        uint64_t len = n - k;
        if (ms->va + ms->size - (src + k) < len)
            len = ms->va + ms->size - (src + k);
        if (md->va + md->size - (dst + k) < len)
            len = md->va + md->size - (dst + k);
        sparse_piece(md->h->ph->fd, dst + k - md->va, ms->h->ph->fd, src + k - ms->va, len,
                     (char *)(uintptr_t)(dst + k), (const char *)(uintptr_t)(src + k));
        k += len;
    }
    return 1;
}

static CUresult copy_on(uint64_t dst, uint64_t src, size_t n, int dst_dev, int src_dev, int dst_acc, int src_acc)
{
    if (n == 0)
        return CUDA_SUCCESS;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    int bad = (dst_dev && sim_check_range(dst, n, 1, dst_acc >= 0 ? dst_acc : c->dev)) ||
              (src_dev && sim_check_range(src, n, 0, src_acc >= 0 ? src_acc : c->dev));
    if (bad) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (dst_dev && src_dev && n >= (1u << 20) && sparse_copy(dst, src, n)) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_lock);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult copy(uint64_t dst, uint64_t src, size_t n, int dst_dev, int src_dev)
{
    return copy_on(dst, src, n, dst_dev, src_dev, -1, -1);
}

SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER(cuMemcpyHtoD);
    return copy(dst, (uint64_t)(uintptr_t)src, n, 1, 0);
}

SIM_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    ENTER(cuMemcpyDtoH);
    return copy((uint64_t)(uintptr_t)dst, src, n, 0, 1);
}

SIM_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    ENTER(cuMemcpyDtoD);
    return copy(dst, src, n, 1, 1);
}

SIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    ENTER(cuMemcpy);
    pthread_mutex_lock(&sim_lock);
    int dd = is_device_addr(dst), sd = is_device_addr(src);
    pthread_mutex_unlock(&sim_lock);
    return copy(dst, src, n, dd, sd);
}

SIM_API CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n)
{
    ENTER(cuMemcpyPeer);
    if (!dctx || !sctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    int dd = sim_ctx_device(dctx), sd = sim_ctx_device(sctx);
    if (dd < 0 || sd < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy_on(dst, src, n, 1, 1, dd, sd);
}

SIM_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    ENTER(cuMemcpyHtoDAsync);
    (void)s;
    return copy(dst, (uint64_t)(uintptr_t)src, n, 1, 0);
}

SIM_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER(cuMemcpyDtoHAsync);
    (void)s;
    return copy((uint64_t)(uintptr_t)dst, src, n, 0, 1);
}

SIM_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER(cuMemcpyDtoDAsync);
    (void)s;
    return copy(dst, src, n, 1, 1);
}

SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER(cuMemcpyAsync);
    (void)s;
    pthread_mutex_lock(&sim_lock);
    int dd = is_device_addr(dst), sd = is_device_addr(src);
    pthread_mutex_unlock(&sim_lock);
    return copy(dst, src, n, dd, sd);
}

SIM_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n,
                                   CUstream s)
{
    ENTER(cuMemcpyPeerAsync);
    (void)s;
    if (!dctx || !sctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    int dd = sim_ctx_device(dctx), sd = sim_ctx_device(sctx);
    if (dd < 0 || sd < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy_on(dst, src, n, 1, 1, dd, sd);
}

/* legacy 32-bit forms of the copies */
SIM_API CUresult cuMemcpyHtoD(CUdeviceptr_v1 dst, const void *src, unsigned int n)
{
    return cuMemcpyHtoD_v2(dst, src, n);
}
SIM_API CUresult cuMemcpyDtoH(void *dst, CUdeviceptr_v1 src, unsigned int n) { return cuMemcpyDtoH_v2(dst, src, n); }
SIM_API CUresult cuMemcpyDtoD(CUdeviceptr_v1 dst, CUdeviceptr_v1 src, unsigned int n)
{
    return cuMemcpyDtoD_v2(dst, src, n);
}

static CUresult set(uint64_t dst, uint32_t v, size_t n, int width)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!sim_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (width == 4 && dst % 4)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    int bad = sim_check_range(dst, n * (size_t)width, 1, sim_current()->dev);
    pthread_mutex_unlock(&sim_lock);
    if (bad)
        return CUDA_ERROR_INVALID_VALUE;
    if (width == 1)
        memset((void *)(uintptr_t)dst, (int)(v & 0xff), n);
    else
        for (size_t i = 0; i < n; i++)
            ((uint32_t *)(uintptr_t)dst)[i] = v;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    ENTER(cuMemsetD8);
    return set(dst, v, n, 1);
}

SIM_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
    ENTER(cuMemsetD32);
    return set(dst, v, n, 4);
}

SIM_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    ENTER(cuMemsetD8Async);
    (void)s;
    return set(dst, v, n, 1);
}

SIM_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
    ENTER(cuMemsetD32Async);
    (void)s;
    return set(dst, v, n, 4);
}

SIM_API CUresult cuMemsetD8(CUdeviceptr_v1 dst, unsigned char v, unsigned int n) { return cuMemsetD8_v2(dst, v, n); }
SIM_API CUresult cuMemsetD32(CUdeviceptr_v1 dst, unsigned int v, unsigned int n) { return cuMemsetD32_v2(dst, v, n); }
