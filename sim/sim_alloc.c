/* sim_alloc.c - the simulated driver's cuMemAlloc blocks and the memory pools
 * of cuMemAllocAsync (one default pool per device). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>

#include "sim_mem.h"

/* ------------------------------------------------------------ cuMemAlloc and pools */

/* A new block of rsize bytes (a multiple of 4 KiB) on dev, linked into legacies; NULL if no mapping could be
 * made.  Lock held. */
static legacy *legacy_link(uint64_t rsize, int dev, int pooled)
{
    void *m = mmap(NULL, rsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    legacy *l = m == MAP_FAILED ? NULL : calloc(1, sizeof *l);
    if (!l) {
        if (m != MAP_FAILED)
            munmap(m, rsize);
        return NULL;
    }
    l->va = (uint64_t)(uintptr_t)m;
    l->size = rsize;
    l->dev = dev;
    l->pooled = pooled;
    l->next = legacies;
    legacies = l;
    return l;
}

static CUresult legacy_alloc(uint64_t *out, size_t size, int dev)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rsize = (size + 4095) & ~(uint64_t)4095;
    pthread_mutex_lock(&sim_lock);
    legacy *l = sim_held_dev(dev) + rsize > sim_capacity ? NULL : legacy_link(rsize, dev, 0);
    pthread_mutex_unlock(&sim_lock);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = l->va;
    return CUDA_SUCCESS;
}

static void pool_trim(sim_mempool *m, uint64_t keep);

/* A block unlinked from legacies is gone: its mapping, and its bytes, to the driver or (pooled) to its pool,
 * which keeps them up to its release threshold; lock held. */
static void legacy_release(legacy *l)
{
    if (l->pooled) {
        sim_mempool *m = &mempools[l->dev];
        m->used_bytes -= l->size;
        pool_trim(m, m->threshold);
    }
    munmap((void *)(uintptr_t)l->va, l->size);
    free(l);
}

/* unlinks the block at va from the list; lock held */
static legacy *legacy_take(legacy **list, uint64_t va)
{
    for (legacy **pp = list; *pp; pp = &(*pp)->next)
        if ((*pp)->va == va) {
            legacy *l = *pp;
            *pp = l->next;
            return l;
        }
    return NULL;
}

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    ENTER(cuMemAlloc);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t va;
    CUresult r = legacy_alloc(&va, size, c->dev);
    if (r == CUDA_SUCCESS)
        *p = va;
    return r;
}

SIM_API CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER(cuMemFree);
    if (!sim_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (p == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_lock);
    legacy *l = legacy_take(&legacies, p);
    if (l)
        legacy_release(l);
    pthread_mutex_unlock(&sim_lock);
    return l ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int size)
{
    CUdeviceptr v = 0;
    CUresult r = cuMemAlloc_v2(&v, size);
    if (r == CUDA_SUCCESS && p)
        *p = (CUdeviceptr_v1)v;
    return r;
}

SIM_API CUresult cuMemFree(CUdeviceptr_v1 p) { return cuMemFree_v2(p); }

/* The device's pool: the sim has no cuDeviceSetMemPool, so the current pool
 * is always the default one. */
static CUresult device_pool(CUmemoryPool *pool, CUdevice d)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)&mempools[d];
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER(cuDeviceGetDefaultMemPool);
    return device_pool(pool, d);
}

SIM_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER(cuDeviceGetMemPool);
    return device_pool(pool, d);
}

static sim_mempool *get_pool(CUmemoryPool p)
{
    sim_mempool *m = (sim_mempool *)p;
    return m >= mempools && m < mempools + FABSIM_MAX_DEVICES ? m : NULL;
}

/* the high-water marks after the pool's bytes grew; lock held */
static void pool_marks(sim_mempool *m)
{
    if (m->used_bytes > m->used_high)
        m->used_high = m->used_bytes;
    if (m->reserved_bytes > m->reserved_high)
        m->reserved_high = m->reserved_bytes;
}

/* What the pool reserves down to keep bytes, never below its live blocks; lock held. */
static void pool_trim(sim_mempool *m, uint64_t keep)
{
    uint64_t floor = (m->used_bytes + SIM_POOL_SEGMENT - 1) / SIM_POOL_SEGMENT * SIM_POOL_SEGMENT;
    if (m->reserved_bytes > keep)
        m->reserved_bytes = keep > floor ? keep : floor;
}

SIM_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER(cuMemPoolSetAttribute);
    sim_mempool *m = get_pool(pool);
    if (!m || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    /* the high marks may only be reset, by a value of 0 (CUDA's documentation), to what the pool has now */
    int high = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    if (high && *(cuuint64_t *)value != 0) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        m->threshold = *(cuuint64_t *)value;
        pool_trim(m, m->threshold);
    } else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
        m->reserved_high = m->reserved_bytes;
    } else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        m->used_high = m->used_bytes;
    }
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER(cuMemPoolGetAttribute);
    sim_mempool *m = get_pool(pool);
    if (!m || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = m->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = m->reserved_bytes; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = m->used_bytes; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = m->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = m->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    ENTER(cuMemPoolTrimTo);
    sim_mempool *m = get_pool(pool);
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    pool_trim(m, keep);
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s)
{
    ENTER(cuMemAllocAsync);
    (void)s;
    if (!p || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_mempool *m = &mempools[c->dev];
    uint64_t rsize = (size + 4095) & ~(uint64_t)4095;
    pthread_mutex_lock(&sim_lock);
    /* the pool reserves another segment or more only when its live blocks outgrow what it holds */
    uint64_t need = m->used_bytes + rsize, grow = 0;
    if (need > m->reserved_bytes)
        grow = (need + SIM_POOL_SEGMENT - 1) / SIM_POOL_SEGMENT * SIM_POOL_SEGMENT - m->reserved_bytes;
    legacy *l = sim_held_dev(c->dev) + grow > sim_capacity ? NULL : legacy_link(rsize, c->dev, 1);
    if (l) {
        m->reserved_bytes += grow;
        m->used_bytes += rsize;
        pool_marks(m);
        *p = l->va;
    }
    pthread_mutex_unlock(&sim_lock);
    return l ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

SIM_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    ENTER(cuMemFreeAsync);
    (void)s;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    legacy *l = legacy_take(&legacies, p);
    if (l)
        legacy_release(l);
    pthread_mutex_unlock(&sim_lock);
    return l ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
