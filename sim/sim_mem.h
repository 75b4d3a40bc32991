/* sim_mem.h - the simulated driver's memory records, shared by the files
 * that serve the memory entry points: physical allocations (phys) as memfds,
 * handles on them, mappings of reserved address space, dma-buf fds, cuMemAlloc
 * blocks and the per-device pools of cuMemAllocAsync.  The records and the
 * functions that keep them are in sim_records.c; every function here expects
 * sim_lock held. */
#ifndef FABSIM_SIM_MEM_H
#define FABSIM_SIM_MEM_H

#include <sys/types.h>

#include "sim.h"


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

/* A block of cuMemAlloc, or of cuMemAllocAsync (pooled): an anonymous mapping of its own, its bytes held by
 * itself, or for a pooled block counted in its device's pool (sim_mempool.reserved_bytes). */
typedef struct legacy {
    uint64_t va, size;
    int dev;
    int pooled;
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

/* memory pools for cuMemAllocAsync: one default pool per device */
/* A device's default pool of cuMemAllocAsync.  A real pool cuts blocks from segments it reserves and reuses
 * freed bytes for any size; the sim keeps only the count: reserved_bytes grows in 2 MiB segments when the live
 * blocks (used_bytes) outgrow it and shrinks to the release threshold at a free (and at cuMemPoolTrimTo), never
 * below the live blocks.  So what it holds is what a pool without fragmentation would hold. */
typedef struct sim_mempool {
    int dev;
    uint64_t threshold, reserved_bytes, used_bytes;
    uint64_t reserved_high, used_high; /* RESERVED_MEM_HIGH, USED_MEM_HIGH: since the pool began or a reset */
} sim_mempool;

#define SIM_POOL_SEGMENT ((uint64_t)2 << 20)

/* the records (sim_records.c) */
extern phys *physs;
extern handle *handles;
extern uint64_t next_handle;
extern mapping *maps;
extern size_t nmaps, capmaps;
extern range *resv;
extern size_t nresv, capresv;
extern legacy *legacies;
extern dmabuf *dmabufs;
extern sim_mempool mempools[FABSIM_MAX_DEVICES];

/* the bookkeeping (sim_records.c) */
void check_exports(phys *p);
void forget_fd(int fd);
int fresh_fd(int fd);
void phys_unlink(phys *p);
void phys_settle(phys *p);
void settle_all(void);
uint64_t held_host(void);
handle *find_handle(CUmemGenericAllocationHandle v);
handle *new_handle(phys *p, unsigned types);
size_t map_lower(uint64_t addr);
mapping *map_at(uint64_t addr);
range *resv_at(uint64_t addr);
int reserved(uint64_t va, uint64_t n);
legacy *legacy_at(uint64_t addr);
int is_device_addr(uint64_t va);

#endif
