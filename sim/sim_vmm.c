/* sim_vmm.c - the simulated driver's memory: physical allocations as memfds,
 * reservations as PROT_NONE host address space, mappings as MAP_SHARED
 * views of the memfds at the reserved addresses, with the real driver's
 * reference counting and answers (tests/probe/h200-answers.txt).
 *
 * Every misuse answer is in this file, marked "H200:" where it was measured
 * and "sim:" where the real driver crashes or was not asked. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

typedef struct phys {
    int fd;                  /* the sim's own reference: open while handles or mappings exist */
    uint64_t size;
    int dev;
    dev_t st_dev;
    ino_t ino;
    int refs;                /* handle references, all handles */
    int maps;
    int dmabufs;             /* open dma-buf fds whose range covers this allocation */
    int host;                /* 1: host memory of NUMA node `numa` (dev is HOST_DEV) */
    int numa;
    unsigned char rdma;      /* allocFlags.gpuDirectRDMACapable it was created with */
    int *exp;                /* exported fds this process may still hold */
    int nexp, capexp;
    struct phys *next;
} phys;

typedef struct handle {
    uint64_t value;
    phys *ph;
    int refs;
    unsigned types;          /* requestedHandleTypes (0 for an imported handle, as on the H200) */
    struct handle *next;
} handle;

typedef struct mapping {
    uint64_t va, size;
    handle *h;
    unsigned long long access[FABSIM_MAX_DEVICES];
    unsigned long long host_access; /* CU_MEM_LOCATION_TYPE_HOST_NUMA access (host memory only) */
} mapping;

/* A dma-buf fd of cuMemGetHandleForAddressRange: a sim memfd of the range's
 * size (so lseek(fd, 0, SEEK_END) is the size), and a reference on every
 * allocation of the range while the program keeps it open. */
typedef struct dmabuf {
    int fd;
    dev_t st_dev;
    ino_t ino;
    struct phys **ph;
    int nph;
    struct dmabuf *next;
} dmabuf;

#define HOST_DEV (-1) /* phys.dev of host memory */

typedef struct range {
    uint64_t va, size;
} range;

typedef struct legacy {
    uint64_t va, size;
    int dev;
    struct legacy *next;
} legacy;

typedef struct fabric_blob {
    uint32_t magic, pid;
    int32_t fd, dev;
    uint64_t ino, size;
    char machine[24];
} fabric_blob;
_Static_assert(sizeof(fabric_blob) <= sizeof(CUmemFabricHandle), "fabric handle fits in 64 bytes");
#define FABRIC_MAGIC 0xfab51b0bu

static phys *physs;
static handle *handles;
static uint64_t next_handle = 0x7f5a00001000ull;
static mapping *maps;
static size_t nmaps, capmaps;
static range *resv;
static size_t nresv, capresv;
static legacy *legacies;
static dmabuf *dmabufs;

/* memory pools for cuMemAllocAsync: one default pool per device */
typedef struct sim_mempool {
    int dev;
    uint64_t threshold, cached_bytes, used_bytes;
    legacy *cache;
} sim_mempool;
static sim_mempool mempools[FABSIM_MAX_DEVICES];

void sim_vmm_init(void)
{
    for (int i = 0; i < FABSIM_MAX_DEVICES; i++)
        mempools[i].dev = i;
}

/* ------------------------------------------------------------ bookkeeping */

static int fd_is(int fd, const phys *p)
{
    struct stat st;
    return fcntl(fd, F_GETFD) != -1 && fstat(fd, &st) == 0 && st.st_ino == p->ino && st.st_dev == p->st_dev;
}

/* forgets exported fds the program has closed (the sim cannot see close()) */
static void check_exports(phys *p)
{
    int k = 0;
    for (int i = 0; i < p->nexp; i++)
        if (fd_is(p->exp[i], p))
            p->exp[k++] = p->exp[i];
    p->nexp = k;
}

/* The kernel just gave out fd again: an earlier export's fd of that number
 * was closed since, whatever it now refers to (a record of a chunk exported
 * twice would otherwise count the new fd twice). */
static void forget_fd(int fd)
{
    for (phys *p = physs; p; p = p->next) {
        int k = 0;
        for (int i = 0; i < p->nexp; i++)
            if (p->exp[i] != fd)
                p->exp[k++] = p->exp[i];
        p->nexp = k;
    }
}

/* An fd the sim just got from the kernel: any export recorded under its
 * number was closed since (the sim cannot see close()), whatever the number
 * refers to now (the same memory again, say: then it would count twice). */
static int fresh_fd(int fd)
{
    for (phys *p = physs; fd >= 0 && p; p = p->next) {
        int k = 0;
        for (int i = 0; i < p->nexp; i++)
            if (p->exp[i] != fd)
                p->exp[k++] = p->exp[i];
        p->nexp = k;
    }
    return fd;
}

static void phys_unlink(phys *p)
{
    for (phys **pp = &physs; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (handle **hp = &handles; *hp;) {
        if ((*hp)->ph == p) {
            handle *h = *hp;
            *hp = h->next;
            free(h);
        } else {
            hp = &(*hp)->next;
        }
    }
    free(p->exp);
    free(p);
}

/* Drops the sim's own fd once no handle or mapping is left, and the record
 * once no exported fd is left either. */
static void phys_settle(phys *p)
{
    if (p->refs > 0 || p->maps > 0 || p->dmabufs > 0)
        return;
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
        /* handles die with the last reference and mapping (the real driver
         * frees them: using one afterwards crashes it) */
        for (handle **hp = &handles; *hp;) {
            if ((*hp)->ph == p) {
                handle *h = *hp;
                *hp = h->next;
                free(h);
            } else {
                hp = &(*hp)->next;
            }
        }
    }
    check_exports(p);
    if (p->nexp == 0)
        phys_unlink(p);
}

/* forgets dma-bufs the program has closed, dropping their references */
static void check_dmabufs(void)
{
    for (dmabuf **dp = &dmabufs; *dp;) {
        dmabuf *d = *dp;
        struct stat st;
        if (fcntl(d->fd, F_GETFD) != -1 && fstat(d->fd, &st) == 0 && st.st_ino == d->ino && st.st_dev == d->st_dev) {
            dp = &d->next;
            continue;
        }
        *dp = d->next;
        for (int i = 0; i < d->nph; i++) {
            d->ph[i]->dmabufs--;
            phys_settle(d->ph[i]);
        }
        free(d->ph);
        free(d);
    }
}

static void settle_all(void)
{
    check_dmabufs();
    for (phys *p = physs, *n; p; p = n) {
        n = p->next;
        if (p->refs == 0 && p->maps == 0)
            phys_settle(p);
    }
}

uint64_t sim_held_dev(int dev)
{
    settle_all();
    uint64_t s = 0;
    for (phys *p = physs; p; p = p->next)
        if (p->dev == dev)
            s += p->size;
    for (legacy *l = legacies; l; l = l->next)
        if (l->dev == dev)
            s += l->size;
    for (legacy *l = mempools[dev].cache; l; l = l->next)
        s += l->size;
    return s;
}

static uint64_t held_host(void)
{
    uint64_t s = 0;
    for (phys *p = physs; p; p = p->next)
        if (p->host)
            s += p->size;
    return s;
}

static handle *find_handle(CUmemGenericAllocationHandle v)
{
    for (handle *h = handles; h; h = h->next)
        if (h->value == v)
            return h;
    return NULL;
}

static handle *new_handle(phys *p, unsigned types)
{
    handle *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->value = next_handle;
    next_handle += 0x40;
    h->ph = p;
    h->refs = 1;
    h->types = types;
    h->next = handles;
    handles = h;
    p->refs++;
    return h;
}

/* index of the first mapping with va + size > addr */
static size_t map_lower(uint64_t addr)
{
    size_t lo = 0, hi = nmaps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (maps[mid].va + maps[mid].size <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static mapping *map_at(uint64_t addr)
{
    size_t i = map_lower(addr);
    return i < nmaps && maps[i].va <= addr ? &maps[i] : NULL;
}

static range *resv_at(uint64_t addr)
{
    for (size_t i = 0; i < nresv; i++)
        if (resv[i].va <= addr && addr < resv[i].va + resv[i].size)
            return &resv[i];
    return NULL;
}

/* [va, va+n) inside reservations (possibly adjacent ones) */
static int reserved(uint64_t va, uint64_t n)
{
    uint64_t cur = va;
    while (cur < va + n) {
        range *r = resv_at(cur);
        if (!r)
            return 0;
        cur = r->va + r->size;
    }
    return 1;
}

static legacy *legacy_at(uint64_t addr)
{
    for (legacy *l = legacies; l; l = l->next)
        if (l->va <= addr && addr < l->va + l->size)
            return l;
    return NULL;
}

int sim_check_range(uint64_t va, size_t n, int write, int dev)
{
    uint64_t cur = va, end = va + n;
    if (end < va)
        return -1;
    while (cur < end) {
        mapping *m = map_at(cur);
        if (m) {
            /* a mapping is usable from a device only with access granted to that
             * device (cuMemSetAccess), whichever device holds its memory */
            unsigned long long acc = 0;
            for (int d = 0; d < FABSIM_MAX_DEVICES; d++)
                if (dev < 0 || d == dev)
                    acc |= m->access[d];
            if (!(acc & (write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ)))
                return -1;
            cur = m->va + m->size;
            continue;
        }
        legacy *l = legacy_at(cur);
        if (!l)
            return -1;
        cur = l->va + l->size;
    }
    return 0;
}

/* an address the program treats as device memory: reserved or cuMemAlloc'ed */
static int is_device_addr(uint64_t va) { return resv_at(va) || legacy_at(va); }

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
        /* H200, 2026-12-03: HOST (no NUMA node) works.  sim: the id is
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
    if (host_desc && dev_mem) { /* H200, 2026-12-03: HOST_NUMA access to device memory, NOT_SUPPORTED */
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

/* ------------------------------------------------------------ export, import */

static phys *phys_by_inode(dev_t d, ino_t ino)
{
    for (phys *p = physs; p; p = p->next)
        if (p->ino == ino && p->st_dev == d)
            return p;
    return NULL;
}

SIM_API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle v,
                                              CUmemAllocationHandleType type, unsigned long long flags)
{
    ENTER(cuMemExportToShareableHandle);
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    handle *h = find_handle(v);
    CUresult r = CUDA_SUCCESS;
    /* H200: a type the handle was not created with (NONE, or FABRIC of a
     * POSIX_FD handle, or POSIX_FD of a NONE handle): INVALID_VALUE */
    if (!h || h->ph->fd < 0 || type == CU_MEM_HANDLE_TYPE_NONE || !(h->types & (unsigned)type))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        phys *p = h->ph;
        int fd = fresh_fd(fcntl(p->fd, F_DUPFD_CLOEXEC, 0));
        if (fd < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else if (p->nexp == p->capexp) {
            int cap = p->capexp ? p->capexp * 2 : 4;
            int *n = realloc(p->exp, (size_t)cap * sizeof *n);
            if (!n) {
                close(fd);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                p->exp = n;
                p->capexp = cap;
            }
        }
        if (r == CUDA_SUCCESS) {
            forget_fd(fd);
            p->exp[p->nexp++] = fd;
            *(int *)out = fd;
        }
    } else if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        fabric_blob b;
        memset(&b, 0, sizeof b);
        b.magic = FABRIC_MAGIC;
        b.pid = (uint32_t)getpid();
        b.fd = h->ph->fd;
        b.dev = h->ph->dev;
        b.ino = (uint64_t)h->ph->ino;
        b.size = h->ph->size;
        memcpy(b.machine, sim_machine, sizeof b.machine);
        b.machine[sizeof b.machine - 1] = 0;
        memset(out, 0, sizeof(CUmemFabricHandle));
        memcpy(out, &b, sizeof b);
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* a handle on the memfd `fd` (which the caller keeps): the local record if
 * this process knows it, else a new one.  Lock held. */
static CUresult import_fd(int fd, int dev, CUmemGenericAllocationHandle *out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return CUDA_ERROR_UNKNOWN;
    phys *p = phys_by_inode(st.st_dev, st.st_ino);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p)
            return CUDA_ERROR_OUT_OF_MEMORY;
        p->fd = -1;
        p->size = (uint64_t)st.st_size;
        p->dev = dev;
        p->host = dev == HOST_DEV;
        p->st_dev = st.st_dev;
        p->ino = st.st_ino;
        p->next = physs;
        physs = p;
    }
    if (p->fd < 0 && (p->fd = fresh_fd(fcntl(fd, F_DUPFD_CLOEXEC, 0))) < 0) {
        phys_settle(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    handle *h = new_handle(p, 0); /* H200: an imported handle is new, with requestedHandleTypes 0 */
    if (!h) {
        phys_settle(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = h->value;
    return CUDA_SUCCESS;
}

/* "fabsim:<machine>:dev<N>" of a sim memfd: N; "fabsim:<machine>:host<N>":
 * HOST_DEV (node 0 is the only one); else -2 */
static int memfd_device(int fd)
{
    char path[64], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
        return -2;
    link[n] = '\0';
    const char *pre = "/memfd:fabsim:";
    if (strncmp(link, pre, strlen(pre)) != 0)
        return -2;
    if (strstr(link + strlen(pre), ":host"))
        return HOST_DEV;
    const char *d = strstr(link + strlen(pre), ":dev");
    return d ? atoi(d + 4) : -2;
}

SIM_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *out, void *os_handle,
                                                CUmemAllocationHandleType type)
{
    ENTER(cuMemImportFromShareableHandle);
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    pthread_mutex_lock(&sim_lock);
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        int fd = (int)(intptr_t)os_handle;
        int dev = memfd_device(fd);
        /* H200: /dev/null or a closed fd, UNKNOWN */
        r = dev < HOST_DEV ? CUDA_ERROR_UNKNOWN : import_fd(fd, dev, out);
    } else if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        fabric_blob b;
        memcpy(&b, os_handle, sizeof b);
        r = CUDA_ERROR_NOT_SUPPORTED; /* H200: garbage fabric bytes, NOT_SUPPORTED */
        if (!os_handle || b.magic != FABRIC_MAGIC || strncmp(b.machine, sim_machine, sizeof b.machine) != 0) {
            /* not a handle of this machine */
        } else if (!sim_fabric) {
            r = CUDA_ERROR_NOT_PERMITTED;
        } else if (b.pid == (uint32_t)getpid()) {
            phys *p = NULL;
            for (phys *q = physs; q; q = q->next)
                if ((uint64_t)q->ino == b.ino && (q->refs > 0 || q->maps > 0))
                    p = q;
            if (p)
                r = import_fd(p->fd, p->dev, out);
        } else {
            /* another process: the exporter's own reference is its open fd
             * (a fabric handle holds none of its own) */
            char path[64];
            snprintf(path, sizeof path, "/proc/%u/fd/%d", b.pid, b.fd);
            int fd = open(path, O_RDWR | O_CLOEXEC);
            struct stat st;
            if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_ino == b.ino && memfd_device(fd) == b.dev)
                r = import_fd(fd, b.dev, out);
            if (fd >= 0)
                close(fd);
        }
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* ------------------------------------------------------------ dma-buf */

/* cuMemGetHandleForAddressRange(DMA_BUF_FD).  The docs: dptr and size
 * aligned to the host page size, the range fully mapped, every allocation
 * of it on one device with identical properties.  H200, 2026-12-03
 * (test_conformance): one fd over one chunk, two chunks, a range inside two
 * chunks or one 4 KiB page inside a chunk, its lseek size the range's; an
 * address or size off the page, size 0, a hole or unmapped space:
 * INVALID_VALUE; chunks with and without the RDMA flag mixed: SUCCESS; the
 * PCIE mapping flag: NOT_SUPPORTED; host NUMA memory: INVALID_VALUE; an
 * open fd keeps the memory after unmap and release until it is closed.
 * What is not measured is marked "sim:". */
SIM_API CUresult cuMemGetHandleForAddressRange(void *out, CUdeviceptr dptr, size_t size,
                                               CUmemRangeHandleType type, unsigned long long flags)
{
    ENTER(cuMemGetHandleForAddressRange);
    if (!out || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_rdma)
        return CUDA_ERROR_NOT_SUPPORTED; /* a device without DMA_BUF_SUPPORTED */
    if (flags & CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE)
        return CUDA_ERROR_NOT_SUPPORTED; /* H200, 2026-12-03: over a mapped chunk, NOT_SUPPORTED */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (size == 0 || dptr % page || size % page || dptr + size < dptr) /* docs: host page size */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = CUDA_SUCCESS;
    uint64_t end = dptr + size, cur = dptr;
    size_t first = map_lower(dptr), i = first;
    phys *p0 = NULL;
    /* every byte mapped (H200: a hole is INVALID_VALUE), one device, one kind of allocation */
    for (; cur < end && r == CUDA_SUCCESS; i++) {
        if (i >= nmaps || maps[i].va > cur) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        phys *p = maps[i].h->ph;
        if (!p0)
            p0 = p;
        else if (p->dev != p0->dev || p->host != p0->host || maps[i].h->types != maps[first].h->types)
            r = CUDA_ERROR_INVALID_VALUE; /* sim: mixed devices or handle types (H200, 2026-12-03: chunks with
                                           * and without the RDMA flag in one range: SUCCESS) */
        cur = maps[i].va + maps[i].size;
    }
    if (r == CUDA_SUCCESS && p0->host)
        r = CUDA_ERROR_INVALID_VALUE; /* H200, 2026-12-03: host NUMA memory through VMM, INVALID_VALUE */
    dmabuf *d = NULL;
    int fd = -1;
    if (r == CUDA_SUCCESS) {
        d = calloc(1, sizeof *d);
        d->ph = d ? calloc(i - first, sizeof *d->ph) : NULL;
        char name[64];
        snprintf(name, sizeof name, "fabsim-dmabuf:%s", sim_machine);
        fd = d && d->ph ? fresh_fd((int)syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */)) : -1;
        struct stat st;
        /* the fd's size is the range's: lseek(fd, 0, SEEK_END) answers it, as for a real dma-buf */
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fstat(fd, &st) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            d->fd = fd;
            d->st_dev = st.st_dev;
            d->ino = st.st_ino;
            for (size_t k = first; k < i; k++) {
                phys *p = maps[k].h->ph;
                int seen = 0;
                for (int j = 0; j < d->nph; j++)
                    seen |= d->ph[j] == p;
                if (!seen) {
                    d->ph[d->nph++] = p;
                    p->dmabufs++; /* H200: the fd keeps the memory alive until it is closed */
                }
            }
            d->next = dmabufs;
            dmabufs = d;
            *(int *)out = fd;
        }
    }
    if (r != CUDA_SUCCESS && d) {
        if (fd >= 0)
            close(fd);
        free(d->ph);
        free(d);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* ------------------------------------------------------------ info, ledger */

SIM_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    ENTER(cuMemGetInfo);
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT; /* H200: without a context, INVALID_CONTEXT */
    pthread_mutex_lock(&sim_lock);
    uint64_t held = sim_held_dev(c->dev);
    pthread_mutex_unlock(&sim_lock);
    *total = sim_capacity;
    *free_b = held > sim_capacity ? 0 : sim_capacity - held;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS && free_b && total) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

void sim_vmm_ledger(fabsim_ledger *l)
{
    settle_all();
    for (phys *p = physs; p; p = p->next) {
        check_exports(p);
        l->allocations++;
        l->exported_fds += (uint64_t)p->nexp;
        if (p->host) {
            l->bytes_held_host += p->size;
            continue;
        }
        l->bytes_held += p->size;
        if (p->dev >= 0 && p->dev < FABSIM_MAX_DEVICES)
            l->bytes_held_dev[p->dev] += p->size;
    }
    for (handle *h = handles; h; h = h->next)
        l->handles += (uint64_t)h->refs;
    l->mappings = nmaps;
    for (size_t i = 0; i < nmaps; i++)
        l->bytes_mapped += maps[i].size;
    l->reservations = nresv;
    for (dmabuf *d = dmabufs; d; d = d->next)
        l->dmabuf_fds++;
    for (legacy *x = legacies; x; x = x->next)
        l->legacy_allocs++;
    for (int d = 0; d < FABSIM_MAX_DEVICES; d++)
        for (legacy *x = mempools[d].cache; x; x = x->next)
            l->legacy_allocs++;
}

SIM_API uint64_t fabsim_machine_held_bytes(int dev)
{
    char pre[128];
    snprintf(pre, sizeof pre, "/memfd:fabsim:%s:dev%d", sim_machine, dev);
    size_t prelen = strlen(pre);
    enum { MAXI = 65536 };
    static uint64_t inos[MAXI], sizes[MAXI];
    size_t n = 0;
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    struct dirent *pe;
    while ((pe = readdir(proc))) {
        if (pe->d_name[0] < '0' || pe->d_name[0] > '9')
            continue;
        char path[300], link[300];
        snprintf(path, sizeof path, "/proc/%s/fd", pe->d_name);
        DIR *fds = opendir(path);
        if (fds) {
            struct dirent *fe;
            while ((fe = readdir(fds))) {
                char fp[600];
                snprintf(fp, sizeof fp, "%s/%s", path, fe->d_name);
                ssize_t k = readlink(fp, link, sizeof link - 1);
                if (k <= 0)
                    continue;
                link[k] = '\0';
                if (strncmp(link, pre, prelen) != 0 || (link[prelen] != ' ' && link[prelen] != '\0'))
                    continue;
                struct stat st;
                if (stat(fp, &st) != 0)
                    continue;
                size_t i = 0;
                while (i < n && inos[i] != (uint64_t)st.st_ino)
                    i++;
                if (i == n && n < MAXI)
                    inos[n] = (uint64_t)st.st_ino, sizes[n++] = (uint64_t)st.st_size;
            }
            closedir(fds);
        }
        snprintf(path, sizeof path, "/proc/%s/maps", pe->d_name);
        FILE *m = fopen(path, "r");
        if (!m)
            continue;
        char line[512];
        while (fgets(line, sizeof line, m)) {
            char *at = strstr(line, pre);
            if (!at || (at[prelen] != ' ' && at[prelen] != '\n' && at[prelen] != '\0'))
                continue;
            unsigned long long lo, hi, off, ino;
            char perms[8], devs[16];
            if (sscanf(line, "%llx-%llx %7s %llx %15s %llu", &lo, &hi, perms, &off, devs, &ino) != 6)
                continue;
            size_t i = 0;
            while (i < n && inos[i] != ino)
                i++;
            if (i == n && n < MAXI)
                inos[n] = ino, sizes[n++] = hi - lo;
            else if (i < n && sizes[i] < hi - lo)
                sizes[i] = hi - lo;
        }
        fclose(m);
    }
    closedir(proc);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    return total;
}

void sim_vmm_after_fork(void)
{
    for (dmabuf *d = dmabufs, *nx; d; d = nx) {
        nx = d->next;
        free(d->ph);
        free(d);
    }
    dmabufs = NULL;
    for (phys *p = physs, *nx; p; p = nx) {
        nx = p->next;
        if (p->fd >= 0)
            close(p->fd);
        free(p->exp);
        free(p);
    }
    physs = NULL;
    for (handle *h = handles, *nx; h; h = nx) {
        nx = h->next;
        free(h);
    }
    handles = NULL;
    for (size_t i = 0; i < nresv; i++)
        munmap((void *)(uintptr_t)resv[i].va, resv[i].size);
    nresv = 0;
    nmaps = 0;
    for (legacy *l = legacies, *nx; l; l = nx) {
        nx = l->next;
        munmap((void *)(uintptr_t)l->va, l->size);
        free(l);
    }
    legacies = NULL;
    memset(mempools, 0, sizeof mempools);
}

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
