/* chunk.c - physical chunks: created, mapped, given access, and released at
 * once, so that the mapping is the only thing keeping the memory alive and
 * an unmap frees it. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"

static void human(char *buf, size_t n, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
}

static void stat_max(_Atomic uint64_t *peak, uint64_t v)
{
    uint64_t old = atomic_load_explicit(peak, memory_order_relaxed);
    while (v > old && !atomic_compare_exchange_weak_explicit(peak, &old, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

static CUresult create(struct fabpool *p, CUmemGenericAllocationHandle *h, uint64_t size)
{
    CUmemAllocationProp prop = fp_alloc_prop(p);
    return FP_CU(&p->calls, cuMemCreate, h, size, &prop, 0);
}

fabpool_status fp_chunk_create(struct fabpool *p, uint64_t size, CUmemGenericAllocationHandle *out)
{
    fp_lock_assert_held(&p->lock);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = create(p, &h, size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        uint64_t idle = atomic_load(&p->idle_bytes);
        if (idle) {
            fp_trim_locked(p, 0);
            atomic_fetch_add(&p->oom_retries, 1);
            r = create(p, &h, size);
        }
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            char a[32], m[32], c[32];
            human(a, sizeof a, size);
            human(m, sizeof m, atomic_load(&p->mapped_bytes));
            human(c, sizeof c, idle);
            return fp_error(FABPOOL_ERR_OUT_OF_MEMORY,
                            "device %d is out of memory: cuMemCreate of a %s chunk failed with "
                            "CUDA_ERROR_OUT_OF_MEMORY; this pool maps %s, of which %s were cached and %s "
                            "returned to the driver before one more try. Free or shrink buffers, or lower "
                            "other users of the device",
                            (int)p->dev, a, m, c, idle ? "were" : "none could be");
        }
    }
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemCreate", "creating a chunk of %llu bytes on device %d",
                            (unsigned long long)size, (int)p->dev);
    atomic_fetch_add(&p->handles_outstanding, 1);
    *out = h;
    return FABPOOL_OK;
}

fabpool_status fp_chunk_map(struct fabpool *p, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    CUmemGenericAllocationHandle h = 0;
    fabpool_status st = fp_chunk_create(p, size, &h);
    if (st != FABPOOL_OK)
        return st;
    return fp_chunk_map_handle(p, va, size, h, "a chunk");
}

/* Maps handle h at va and gives the pool's device and its peers access; on
 * failure nothing stays mapped.  h is left as it was (not released). */
fabpool_status fp_chunk_map_access(struct fabpool *p, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   const char *what)
{
    fp_lock_assert_held(&p->lock);
    CUresult r = FP_CU(&p->calls, cuMemMap, (CUdeviceptr)va, size, 0, h, 0);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemMap", "mapping %s of %llu bytes at 0x%llx", what, (unsigned long long)size,
                            (unsigned long long)va);
    CUmemAccessDesc acc[1 + FABPOOL_MAX_PEERS];
    int n = 0;
    memset(acc, 0, sizeof acc);
    acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[n].location.id = p->dev;
    acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < p->opt.n_peer_devices; i++) {
        acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[n].location.id = p->opt.peer_devices[i];
        acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    r = FP_CU(&p->calls, cuMemSetAccess, (CUdeviceptr)va, size, acc, (size_t)n);
    if (r != CUDA_SUCCESS) {
        fabpool_status st = fp_drv_error(r, "cuMemSetAccess", "giving device %d%s access to %s of %llu bytes at 0x%llx",
                                         (int)p->dev, n > 1 ? " and its peers" : "", what, (unsigned long long)size,
                                         (unsigned long long)va);
        FP_CU_UNDO(&p->calls, cuMemUnmap, (CUdeviceptr)va, size);
        return st;
    }
    return FABPOOL_OK;
}

/* Counts a mapping of size bytes that the pool now keeps. */
void fp_chunk_count_mapped(struct fabpool *p, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    uint64_t m = atomic_fetch_add(&p->mapped_bytes, size) + size;
    stat_max(&p->mapped_peak, m);
    atomic_fetch_add(&p->chunks_mapped, 1);
    atomic_fetch_add(&p->chunks_mapped_total, 1);
}

/* Releases h (counted in handles_outstanding), tried twice. */
CUresult fp_chunk_release(struct fabpool *p, CUmemGenericAllocationHandle h)
{
    fp_lock_assert_held(&p->lock);
    CUresult r = FP_CU_UNDO(&p->calls, cuMemRelease, h);
    if (r == CUDA_SUCCESS)
        atomic_fetch_sub(&p->handles_outstanding, 1);
    return r;
}

/* Maps handle h (counted in handles_outstanding) at va, gives the pool's
 * device and its peers access, and releases h at once: from then on the
 * mapping alone keeps the memory.  h is released whatever the outcome; on
 * failure nothing stays mapped. */
fabpool_status fp_chunk_map_handle(struct fabpool *p, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   const char *what)
{
    fp_lock_assert_held(&p->lock);
    fabpool_status st = fp_chunk_map_access(p, va, size, h, what);
    if (st != FABPOOL_OK) {
        fp_chunk_release(p, h);
        return st;
    }
    /* Eager release: from here on the mapping alone keeps the memory. */
    CUresult r = fp_chunk_release(p, h);
    if (r != CUDA_SUCCESS) {
        st = fp_drv_error(r, "cuMemRelease", "releasing the handle of %s just mapped at 0x%llx (tried twice; "
                          "it was unmapped, its handle may still hold %llu bytes)",
                          what, (unsigned long long)va, (unsigned long long)size);
        FP_CU_UNDO(&p->calls, cuMemUnmap, (CUdeviceptr)va, size);
        return st;
    }
    fp_chunk_count_mapped(p, size);
    return FABPOOL_OK;
}

fabpool_status fp_chunk_unmap(struct fabpool *p, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    if (p->sleep && fp_sleep_forget(p, va, size))
        return FABPOOL_OK; /* asleep: unmapped already (sleep.c) */
    CUresult r = FP_CU_UNDO(&p->calls, cuMemUnmap, (CUdeviceptr)va, size);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemUnmap", "unmapping a chunk of %llu bytes at 0x%llx",
                            (unsigned long long)size, (unsigned long long)va);
    atomic_fetch_sub(&p->mapped_bytes, size);
    atomic_fetch_sub(&p->chunks_mapped, 1);
    atomic_fetch_add(&p->chunks_unmapped_total, 1);
    return FABPOOL_OK;
}

fabpool_status fp_ctx_push(struct fabpool *p, CUcontext *saved)
{
    *saved = NULL;
    CUresult r = FP_CU(&p->calls, cuCtxGetCurrent, saved);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuCtxGetCurrent", "asking which context is current before switching to device %d's",
                            (int)p->dev);
    if (*saved != p->ctx)
        r = FP_CU(&p->calls, cuCtxSetCurrent, p->ctx);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuCtxSetCurrent", "making device %d's primary context current", (int)p->dev);
    return FABPOOL_OK;
}

void fp_ctx_pop(struct fabpool *p, CUcontext saved)
{
    if (saved != p->ctx)
        FP_CU(&p->calls, cuCtxSetCurrent, saved);
}
