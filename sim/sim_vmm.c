/* sim_vmm.c - the simulated driver's VMM calls: granularity, reserving and
 * freeing address space (PROT_NONE host address space), creating and
 * releasing physical allocations (memfds), mapping them at reserved
 * addresses (MAP_SHARED views), access, and the address queries, with the
 * real driver's reference counting and answers (tests/probe/h200-answers.txt).
 *
 * Every misuse answer of the simulated memory calls is in sim_vmm.c,
 * sim_share.c, sim_ledger.c, sim_alloc.c and sim_copy.c, marked "H200:"
 * where it was measured and "sim:" where the real driver crashes or was not
 * asked. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim_mem.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* ------------------------------------------------------------ granularity, reserve */

SIM_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags opt)
{
    ENTER(cuMemGetAllocationGranularity);
    (void)opt;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA || prop->location.type == CU_MEM_LOCATION_TYPE_HOST) {
        if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && prop->location.id != 0) /* sim: one NUMA node */
            return CUDA_ERROR_INVALID_VALUE;
        *g = SIM_GRAN; /* H200: host NUMA 0, 2 MiB; sim: HOST (no node) the same */
        return CUDA_SUCCESS;
    }
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    *g = SIM_GRAN; /* H200: 2 MiB, minimum and recommended, every handle type */
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                     unsigned long long flags)
{
    ENTER(cuMemAddressReserve);
    if (!ptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % SIM_GRAN)       /* H200: INVALID_VALUE for 0 and for 1 MiB */
        return CUDA_ERROR_INVALID_VALUE;
    if (align && (align & (align - 1)))     /* H200: 3 MiB alignment, INVALID_VALUE */
        return CUDA_ERROR_INVALID_VALUE;
    if (align < SIM_GRAN)
        align = SIM_GRAN;
    void *at = MAP_FAILED;
    int prot = PROT_NONE, fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (addr && addr % align == 0) {
        at = mmap((void *)(uintptr_t)addr, size, prot, fl | MAP_FIXED_NOREPLACE, -1, 0);
        if (at != MAP_FAILED && at != (void *)(uintptr_t)addr) {
            munmap(at, size);
            at = MAP_FAILED;
        }
    }
    if (at == MAP_FAILED) {
        if (size + align < size)
            return CUDA_ERROR_OUT_OF_MEMORY;
        void *raw = mmap(NULL, size + align, prot, fl, -1, 0);
        if (raw == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        uint64_t r = (uint64_t)(uintptr_t)raw, a = (r + align - 1) & ~(uint64_t)(align - 1);
        if (a > r)
            munmap(raw, a - r);
        if (r + size + align > a + size)
            munmap((void *)(uintptr_t)(a + size), r + size + align - (a + size));
        at = (void *)(uintptr_t)a;
    }
    pthread_mutex_lock(&sim_lock);
    if (nresv == capresv) {
        size_t cap = capresv ? capresv * 2 : 16;
        range *n = realloc(resv, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&sim_lock);
            munmap(at, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        resv = n;
        capresv = cap;
    }
    resv[nresv++] = (range){(uint64_t)(uintptr_t)at, size};
    pthread_mutex_unlock(&sim_lock);
    *ptr = (CUdeviceptr)(uintptr_t)at;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemAddressFree);
    pthread_mutex_lock(&sim_lock);
    size_t i = 0;
    while (i < nresv && resv[i].va != ptr)
        i++;
    CUresult r = CUDA_SUCCESS;
    if (i == nresv || resv[i].size != size) /* H200: partial, wrong size, twice: INVALID_VALUE */
        r = CUDA_ERROR_INVALID_VALUE;
    else {
        size_t k = map_lower(ptr);
        if (k < nmaps && maps[k].va < ptr + size) /* H200: while mapped, INVALID_VALUE */
            r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        munmap((void *)(uintptr_t)ptr, size);
        resv[i] = resv[--nresv];
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* ------------------------------------------------------------ create, release */

static CUresult check_prop(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
        /* H200: host NUMA node 0 works.  sim: one NUMA node, any other id is
         * INVALID_VALUE; the flag asks for GPUDirect RDMA to device memory,
         * so host memory with it is INVALID_VALUE (driver_probe records both) */
        if (prop->location.id != 0 || prop->allocFlags.gpuDirectRDMACapable)
            return CUDA_ERROR_INVALID_VALUE;
    } else if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST) {
        /* H200 (driver 580.159.04): HOST (no NUMA node) works.  sim: the id is
         * ignored (docs), it is host memory of node 0, and the RDMA flag is
         * refused as for HOST_NUMA (not measured for HOST) */
        if (prop->allocFlags.gpuDirectRDMACapable)
            return CUDA_ERROR_INVALID_VALUE;
    } else if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE; /* H200: HOST_NUMA_CURRENT, INVALID_VALUE */
    } else if (!sim_valid_device(prop->location.id)) {
        return CUDA_ERROR_INVALID_DEVICE; /* H200: location 99, INVALID_DEVICE */
    }
    if (prop->allocFlags.gpuDirectRDMACapable && !sim_rdma)
        return CUDA_ERROR_NOT_SUPPORTED; /* sim: a device without GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
    unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
    if (prop->requestedHandleTypes & ~known)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    ENTER(cuMemCreate);
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop); /* H200: NULL prop, INVALID_VALUE */
    if (r != CUDA_SUCCESS)
        return r;
    if (size == 0 || size % SIM_GRAN) /* H200: 0, 1 MiB, 3 MiB: INVALID_VALUE */
        return CUDA_ERROR_INVALID_VALUE;
    if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && !sim_fabric)
        return CUDA_ERROR_NOT_PERMITTED; /* H200 without an IMEX channel */
    int host = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
               prop->location.type == CU_MEM_LOCATION_TYPE_HOST;
    int numa = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? prop->location.id : 0;
    int dev = host ? HOST_DEV : prop->location.id;
    pthread_mutex_lock(&sim_lock);
    uint64_t cap = host ? sim_host_capacity : sim_capacity;
    if (size > cap || (host ? (settle_all(), held_host()) : sim_held_dev(dev)) + size > cap) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char name[128];
    if (host)
        snprintf(name, sizeof name, "fabsim:%s:host%d", sim_machine, numa);
    else
        snprintf(name, sizeof name, "fabsim:%s:dev%d", sim_machine, dev);
    int fd = fresh_fd((int)syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */));
    struct stat st;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    phys *p = calloc(1, sizeof *p);
    if (!p) {
        close(fd);
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->fd = fd;
    p->size = size;
    p->dev = dev;
    p->host = host;
    p->numa = numa;
    p->rdma = prop->allocFlags.gpuDirectRDMACapable ? 1 : 0;
    p->st_dev = st.st_dev;
    p->ino = st.st_ino;
    p->next = physs;
    physs = p;
    handle *h = new_handle(p, (unsigned)prop->requestedHandleTypes);
    if (!h) {
        phys_unlink(p);
        close(fd);
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = h->value;
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle v)
{
    ENTER(cuMemRelease);
    if (v == 0)
        return CUDA_ERROR_INVALID_VALUE; /* H200 */
    pthread_mutex_lock(&sim_lock);
    handle *h = find_handle(v);
    /* sim: a bogus handle is INVALID_VALUE (the H200 segfaults); H200: a
     * second release of a freed handle answered INVALID_VALUE */
    if (!h || h->refs == 0) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    h->refs--;
    h->ph->refs--;
    phys_settle(h->ph);
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle v)
{
    ENTER(cuMemGetAllocationPropertiesFromHandle);
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    handle *h = find_handle(v);
    if (h) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = h->ph->host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = h->ph->host ? h->ph->numa : h->ph->dev;
        prop->requestedHandleTypes = (CUmemAllocationHandleType)h->types;
        prop->allocFlags.gpuDirectRDMACapable = h->ph->rdma; /* kept per allocation, also for imports */
    }
    pthread_mutex_unlock(&sim_lock);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------ map, unmap, access */

SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle v,
                          unsigned long long flags)
{
    ENTER(cuMemMap);
    if (flags) /* H200: flags 1, INVALID_VALUE */
        return CUDA_ERROR_INVALID_VALUE;
    if (ptr % SIM_GRAN || size == 0) /* H200: an unaligned address, INVALID_VALUE */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = CUDA_SUCCESS;
    handle *h = find_handle(v);
    if (!h) /* sim: the H200 segfaults on a freed handle */
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!resv_at(ptr)) /* H200: an unreserved address, INVALID_VALUE */
        r = CUDA_ERROR_INVALID_VALUE;
    else if (offset != 0 || size != h->ph->size) /* H200: whole handles only, NOT_SUPPORTED */
        r = CUDA_ERROR_NOT_SUPPORTED;
    else if (!reserved(ptr, size)) /* sim: the H200 maps past a reservation's end; the sim will not */
        r = CUDA_ERROR_INVALID_VALUE;
    else {
        size_t i = map_lower(ptr);
        if (i < nmaps && maps[i].va < ptr + size) /* H200: over a mapping, INVALID_VALUE */
            r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS && nmaps == capmaps) {
        size_t cap = capmaps ? capmaps * 2 : 64;
        mapping *n = realloc(maps, cap * sizeof *n);
        if (!n)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            maps = n, capmaps = cap;
    }
    if (r == CUDA_SUCCESS &&
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->ph->fd, 0) == MAP_FAILED)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        size_t i = map_lower(ptr);
        memmove(&maps[i + 1], &maps[i], (nmaps - i) * sizeof *maps);
        memset(&maps[i], 0, sizeof maps[i]);
        maps[i].va = ptr;
        maps[i].size = size;
        maps[i].h = h;
        nmaps++;
        h->ph->maps++;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemUnmap);
    pthread_mutex_lock(&sim_lock);
    uint64_t end = ptr + size;
    size_t first = map_lower(ptr), last = first;
    /* H200: a range that cuts a mapping is INVALID_VALUE; one that covers
     * whole mappings (and empty space, or nothing at all) succeeds */
    while (last < nmaps && maps[last].va < end) {
        if (maps[last].va < ptr || maps[last].va + maps[last].size > end) {
            pthread_mutex_unlock(&sim_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
        last++;
    }
    for (size_t i = first; i < last; i++) {
        mapping *m = &maps[i];
        mmap((void *)(uintptr_t)m->va, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
        phys *p = m->h->ph;
        p->maps--;
        phys_settle(p);
    }
    memmove(&maps[first], &maps[last], (nmaps - last) * sizeof *maps);
    nmaps -= last - first;
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    ENTER(cuMemSetAccess);
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int host_desc = 0;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
            host_desc = 1; /* the CPU's access; the id is ignored (docs) */
            continue;
        }
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (!sim_valid_device(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&sim_lock);
    static int under_valgrind = -1; /* its preload libraries are in the client's LD_PRELOAD */
    if (under_valgrind < 0) {
        const char *pre = getenv("LD_PRELOAD");
        under_valgrind = pre && strstr(pre, "vgpreload") != NULL;
    }
    uint64_t end = ptr + size, cur = ptr;
    size_t first = map_lower(ptr), i = first;
    /* H200: the range must be whole, adjacent mappings (unmapped or partial: INVALID_VALUE) */
    int dev_mem = 0;
    for (; cur < end; i++) {
        if (i >= nmaps || maps[i].va != cur || maps[i].va + maps[i].size > end) {
            pthread_mutex_unlock(&sim_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
        dev_mem |= !maps[i].h->ph->host;
        cur = maps[i].va + maps[i].size;
    }
    if (size == 0) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (host_desc && dev_mem) { /* H200 (driver 580.159.04): HOST_NUMA access to device memory, NOT_SUPPORTED */
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    for (size_t k = first; k < i; k++) {
        mapping *m = &maps[k];
        unsigned long long all = 0;
        for (size_t d = 0; d < count; d++) {
            if (desc[d].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
                m->host_access = desc[d].flags;
            else
                m->access[desc[d].location.id] = desc[d].flags;
        }
        all = m->host_access;
        for (int d = 0; d < FABSIM_MAX_DEVICES; d++)
            all |= m->access[d];
        int prot = (all & CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                       ? PROT_READ | PROT_WRITE
                   : all & CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ
                                                         : PROT_NONE;
        /* Under valgrind the memfd is mapped again in place at the new protection: the same pages, and
         * memcheck marks an mmap'ed range in 64 KiB steps but walks an mprotect'ed one byte by byte (a 100 MiB
         * buffer's map took it about a second; .ci/reliability runs the pool tests under it).  Elsewhere
         * mprotect, which costs the kernel less (the soak: 10% less system time). */
        if (under_valgrind)
            mmap((void *)(uintptr_t)m->va, m->size, prot, MAP_SHARED | MAP_FIXED, m->h->ph->fd, 0);
        else
            mprotect((void *)(uintptr_t)m->va, m->size, prot);
    }
    pthread_mutex_unlock(&sim_lock);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr ptr)
{
    ENTER(cuMemGetAccess);
    int host = loc && loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    if (!flags || !loc || (loc->type != CU_MEM_LOCATION_TYPE_DEVICE && !host))
        return CUDA_ERROR_INVALID_VALUE;
    if (!host && !sim_valid_device(loc->id))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_lock);
    mapping *m = map_at(ptr);
    if (m)
        *flags = host ? m->host_access : m->access[loc->id];
    pthread_mutex_unlock(&sim_lock);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* H200: unmapped, INVALID_VALUE */
}

SIM_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *out, void *addr)
{
    ENTER(cuMemRetainAllocationHandle);
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    mapping *m = map_at((uint64_t)(uintptr_t)addr);
    if (m) { /* H200: the same handle as the creator's, at the base or inside */
        m->h->refs++;
        m->h->ph->refs++;
        *out = m->h->value;
    }
    pthread_mutex_unlock(&sim_lock);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult address_range(uint64_t *base, uint64_t *size, uint64_t ptr)
{
    pthread_mutex_lock(&sim_lock);
    mapping *m = map_at(ptr);
    legacy *l = m ? NULL : legacy_at(ptr);
    CUresult r = CUDA_ERROR_NOT_FOUND; /* H200: unmapped, NOT_FOUND */
    if (m)
        *base = m->va, *size = m->size, r = CUDA_SUCCESS; /* H200: the one mapping, not the run */
    else if (l)
        *base = l->va, *size = l->size, r = CUDA_SUCCESS;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr ptr)
{
    ENTER(cuMemGetAddressRange);
    uint64_t b = 0, s = 0;
    CUresult r = address_range(&b, &s, ptr);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = b;
        if (psize)
            *psize = s;
    }
    return r;
}

SIM_API CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 ptr)
{
    ENTER(cuMemGetAddressRange);
    uint64_t b = 0, s = 0;
    CUresult r = address_range(&b, &s, ptr);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = (CUdeviceptr_v1)b;
        if (psize)
            *psize = (unsigned)s;
    }
    return r;
}
