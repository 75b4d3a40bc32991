/* sim_alloc.c - the simulated driver's cuMemAlloc blocks and the memory pools
 * of cuMemAllocAsync (one default pool per device). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>

#include "sim_mem.h"

/* ------------------------------------------------------------ cuMemAlloc and pools */

static CUresult legacy_alloc(uint64_t *out, size_t size, int dev)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rsize = (size + 4095) & ~(uint64_t)4095;
    pthread_mutex_lock(&sim_lock);
    if (sim_held_dev(dev) + rsize > sim_capacity) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *m = mmap(NULL, rsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    legacy *l = m == MAP_FAILED ? NULL : calloc(1, sizeof *l);
    if (!l) {
        if (m != MAP_FAILED)
            munmap(m, rsize);
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    l->va = (uint64_t)(uintptr_t)m;
    l->size = rsize;
    l->dev = dev;
    l->next = legacies;
    legacies = l;
    pthread_mutex_unlock(&sim_lock);
    *out = l->va;
    return CUDA_SUCCESS;
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
    pthread_mutex_unlock(&sim_lock);
    if (!l)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)l->va, l->size);
    free(l);
    return CUDA_SUCCESS;
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

static void pool_trim(sim_mempool *m, uint64_t keep)
{
    while (m->cached_bytes > keep && m->cache) {
        legacy *l = m->cache;
        m->cache = l->next;
        m->cached_bytes -= l->size;
        munmap((void *)(uintptr_t)l->va, l->size);
        free(l);
    }
}

SIM_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER(cuMemPoolSetAttribute);
    sim_mempool *m = get_pool(pool);
    if (!m || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        m->threshold = *(cuuint64_t *)value;
        pool_trim(m, m->threshold);
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
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = m->cached_bytes + m->used_bytes; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = m->used_bytes; break;
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
    for (legacy **pp = &m->cache; *pp; pp = &(*pp)->next)
        if ((*pp)->size == rsize) {
            legacy *l = *pp;
            *pp = l->next;
            m->cached_bytes -= l->size;
            m->used_bytes += l->size;
            l->next = legacies;
            legacies = l;
            *p = l->va;
            pthread_mutex_unlock(&sim_lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&sim_lock);
    uint64_t va;
    CUresult r = legacy_alloc(&va, size, c->dev);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&sim_lock);
        m->used_bytes += rsize;
        pthread_mutex_unlock(&sim_lock);
        *p = va;
    }
    return r;
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
    if (!l) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_mempool *m = &mempools[l->dev];
    m->used_bytes -= l->size;
    l->next = m->cache;
    m->cache = l;
    m->cached_bytes += l->size;
    pool_trim(m, m->threshold);
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}
