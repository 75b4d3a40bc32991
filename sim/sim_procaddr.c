/* sim_procaddr.c - cuGetProcAddress: every entry point of the simulated
 * driver by its base name, in the variant a CUDA version asks for. */
#define _GNU_SOURCE
#include <string.h>

#include "sim.h"

typedef struct proc {
    const char *name;
    int version;   /* the CUDA version that introduced this variant */
    void *fn;
} proc;

#define P(name, ver, fn) {#name, ver, (void *)(fn)},
static const proc procs[] = {
    SIM_ENTRIES(P)
    /* the older variants a caller built against older headers asks for */
    P(cuDeviceGetUuid, 9020, cuDeviceGetUuid)
    P(cuDeviceTotalMem, 2000, cuDeviceTotalMem)
    P(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease)
    P(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset)
    P(cuMemGetAddressRange, 2000, cuMemGetAddressRange)
    P(cuMemGetInfo, 2000, cuMemGetInfo)
    P(cuMemAlloc, 2000, cuMemAlloc)
    P(cuMemFree, 2000, cuMemFree)
    P(cuMemcpyHtoD, 2000, cuMemcpyHtoD)
    P(cuMemcpyDtoH, 2000, cuMemcpyDtoH)
    P(cuMemcpyDtoD, 2000, cuMemcpyDtoD)
    P(cuMemsetD8, 2000, cuMemsetD8)
    P(cuMemsetD32, 2000, cuMemsetD32)
    P(cuStreamDestroy, 2000, cuStreamDestroy)
    P(cuEventDestroy, 2000, cuEventDestroy)
    P(cuEventElapsedTime, 2000, cuEventElapsedTime)
    P(cuGetProcAddress, 11030, cuGetProcAddress)
};
#undef P

static CUresult lookup(const char *symbol, void **pfn, int version, CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    const proc *best = NULL;
    int found = 0;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        found = 1;
        if (procs[i].version <= version && (!best || procs[i].version > best->version))
            best = &procs[i];
    }
    *pfn = best ? best->fn : NULL;
    /* H200: an unknown symbol, or one newer than the version asked, is
     * CUDA_SUCCESS with a NULL pointer; only the status tells */
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                       : found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return status || best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status)
{
    CUresult r = sim_enter(E_cuGetProcAddress, 0);
    if (r != CUDA_SUCCESS)
        return r;
    (void)flags; /* no per-thread default stream variants: the legacy ones serve */
    return lookup(symbol, pfn, version, status);
}

SIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CUresult r = sim_enter(E_cuGetProcAddress, 0);
    if (r != CUDA_SUCCESS)
        return r;
    (void)flags;
    return lookup(symbol, pfn, version, NULL);
}
