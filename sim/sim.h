/* sim.h - internal state of the simulated CUDA driver. */
#ifndef FABSIM_SIM_H
#define FABSIM_SIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "driver_entries.h"
#include "fabsim.h"

#define SIM_API __attribute__((visibility("default")))
#define SIM_GRAN (2ull << 20)

/* X(name, version, symbol), as in driver_entries.h: the entry points the
 * simulator has beside the library's, which the tests call (their newest
 * variant; older ones: sim_procaddr.c) */
#define SIM_TEST_ENTRIES(X)                                                                                   \
    X(cuGetProcAddress, 12000, cuGetProcAddress_v2)                                                           \
    X(cuDeviceGetName, 2000, cuDeviceGetName)                                                                 \
    X(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2)                                                             \
    X(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2)                                             \
    X(cuCtxGetDevice, 2000, cuCtxGetDevice)                                                                   \
    X(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)                                                            \
    X(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)                                                              \
    X(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess)                                                     \
    X(cuMemGetAccess, 10020, cuMemGetAccess)                                                                  \
    X(cuMemAlloc, 3020, cuMemAlloc_v2)                                                                        \
    X(cuMemFree, 3020, cuMemFree_v2)                                                                          \
    X(cuMemAllocAsync, 11020, cuMemAllocAsync)                                                                \
    X(cuMemFreeAsync, 11020, cuMemFreeAsync)                                                                  \
    X(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool)                                            \
    X(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool)                                                          \
    X(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute)                                                    \
    X(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute)                                                    \
    X(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo)                                                                \
    X(cuMemcpy, 4000, cuMemcpy)                                                                               \
    X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2)                                                                    \
    X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)                                                                    \
    X(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2)                                                                    \
    X(cuMemcpyPeer, 4000, cuMemcpyPeer)                                                                       \
    X(cuMemcpyAsync, 4000, cuMemcpyAsync)                                                                     \
    X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2)                                                          \
    X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2)                                                          \
    X(cuMemcpyPeerAsync, 4000, cuMemcpyPeerAsync)                                                             \
    X(cuMemsetD8, 3020, cuMemsetD8_v2)                                                                        \
    X(cuMemsetD32, 3020, cuMemsetD32_v2)                                                                      \
    X(cuMemsetD8Async, 3020, cuMemsetD8Async)                                                                 \
    X(cuMemsetD32Async, 3020, cuMemsetD32Async)                                                               \
    X(cuStreamCreate, 2000, cuStreamCreate)                                                                   \
    X(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority)                                           \
    X(cuStreamDestroy, 4000, cuStreamDestroy_v2)                                                              \
    X(cuStreamQuery, 2000, cuStreamQuery)                                                                     \
    X(cuStreamWaitEvent, 3020, cuStreamWaitEvent)                                                             \
    X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2)

/* every entry point, by base name: calls are counted and faults injected by it */
#define SIM_ENTRIES(X) FP_DRIVER_ENTRIES(X) SIM_TEST_ENTRIES(X)

enum sim_entry {
#define SIM_ENUM(n, ver, sym) E_##n,
    SIM_ENTRIES(SIM_ENUM)
#undef SIM_ENUM
    E_COUNT
};

/* the simulated driver's lock: one, held by every call */
extern pthread_mutex_t sim_lock;
extern int sim_inited;
extern int sim_ndev;
extern uint64_t sim_capacity;
extern int sim_fabric;
extern int sim_rdma;              /* FABSIM_RDMA: GPUDirect RDMA with VMM and dma-buf supported */
extern uint64_t sim_host_capacity; /* FABSIM_HOST_MEMORY: host NUMA node 0, for cuMemCreate of host memory */
extern char sim_machine[24];
extern int sim_trace;              /* FABSIM_TRACE: every call on stderr */

/* Checks initialization, counts the call, injects a fault. Returns
 * CUDA_SUCCESS to go on.  The caller holds no lock. */
CUresult sim_enter(int entry, int needs_init);
#define ENTER(name)                                                                                            \
    do {                                                                                                       \
        CUresult e_ = sim_enter(E_##name, 1);                                                                  \
        if (e_ != CUDA_SUCCESS)                                                                                \
            return e_;                                                                                         \
    } while (0)

int sim_parse_error(const char *name, CUresult *out);
/* arms the faults of FABSIM_FAULT=name:nth:ERROR[,...] */
void sim_parse_faults(const char *spec);
const char *sim_entry_name(int e);

/* contexts (sim_core.c) */
typedef struct sim_ctx {
    int dev;
    int retains;
    int magic;
} sim_ctx;
sim_ctx *sim_current(void);          /* NULL if none */
int sim_ctx_device(CUcontext c);    /* the device of a valid context, else -1 */
int sim_valid_device(int dev);

/* memory records (sim_records.c, sim_mem.h) */
void sim_vmm_init(void);
uint64_t sim_held_dev(int dev);       /* lock held */
/* 0 if [va, va+n) is device memory this process may access from device dev
 * (write: with RW; dev < 0: from any device) */
int sim_check_range(uint64_t va, size_t n, int write, int dev);
void sim_vmm_after_fork(void);

/* streams (sim_core.c) */
void sim_complete_all(void);

#endif
