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

#include "fabsim.h"

#define SIM_API __attribute__((visibility("default")))
#define SIM_GRAN (2ull << 20)

/* every entry point, by base name: calls are counted and faults injected by it */
#define SIM_ENTRIES(X)                                                                                       \
    X(cuInit) X(cuDriverGetVersion) X(cuGetProcAddress) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)  \
    X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceGetAttribute) X(cuDeviceTotalMem)    \
    X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                        \
    X(cuDevicePrimaryCtxReset) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)   \
    X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxEnablePeerAccess) X(cuMemGetAllocationGranularity)         \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)      \
    X(cuMemSetAccess) X(cuMemGetAccess) X(cuMemRetainAllocationHandle) X(cuMemGetAddressRange)               \
    X(cuMemGetAllocationPropertiesFromHandle) X(cuMemGetInfo) X(cuMemExportToShareableHandle)                \
    X(cuMemImportFromShareableHandle) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync)        \
    X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute)     \
    X(cuMemPoolTrimTo) X(cuMemcpy) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyPeer)           \
    X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpyPeerAsync)     \
    X(cuMemsetD8) X(cuMemsetD32) X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuStreamCreate)                    \
    X(cuStreamCreateWithPriority) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)                 \
    X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)                 \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuMemGetHandleForAddressRange)

enum sim_entry {
#define SIM_ENUM(n) E_##n,
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
