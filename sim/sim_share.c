/* sim_share.c - sharing the simulated driver's memory: export and import of
 * shareable handles (POSIX fds and fabric handles) and dma-buf fds of address
 * ranges (cuMemGetHandleForAddressRange). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim_mem.h"

/* ------------------------------------------------------------ export, import */

static phys *phys_by_inode(dev_t d, ino_t ino)
{
    for (phys *p = physs; p; p = p->next)
        if (p->ino == ino && p->st_dev == d)
            return p;
    return NULL;
}

/* POSIX-fd exports made while no fd this process exported was open (fabsim.h). */
static uint64_t cold_exports;

SIM_API uint64_t fabsim_cold_exports(void)
{
    pthread_mutex_lock(&sim_lock);
    uint64_t n = cold_exports;
    pthread_mutex_unlock(&sim_lock);
    return n;
}

/* Whether an fd this process exported is still open.  Lock held. */
static int an_export_open(void)
{
    for (phys *p = physs; p; p = p->next) {
        check_exports(p);
        if (p->nexp)
            return 1;
    }
    return 0;
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
        cold_exports += !an_export_open();
        /* no close-on-exec: nothing says the driver's export sets it, so the caller must */
        int fd = fresh_fd(fcntl(p->fd, F_DUPFD, 0));
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
 * of it on one device with identical properties.  H200 (driver 580.159.04)
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
        return CUDA_ERROR_NOT_SUPPORTED; /* H200 (driver 580.159.04): over a mapped chunk, NOT_SUPPORTED */
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
            r = CUDA_ERROR_INVALID_VALUE; /* sim: mixed devices or handle types (the H200, driver 580.159.04:
                                           * chunks with and without the RDMA flag in one range: SUCCESS) */
        cur = maps[i].va + maps[i].size;
    }
    if (r == CUDA_SUCCESS && p0->host)
        r = CUDA_ERROR_INVALID_VALUE; /* H200 (driver 580.159.04): host NUMA memory through VMM, INVALID_VALUE */
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
