/* driver_entries.h - every CUDA driver entry point the library calls: one
 * list for the library (driver.c asks cuGetProcAddress for each), the
 * simulated driver (sim/: it counts calls and injects faults by these names
 * and answers cuGetProcAddress with these variants) and the fault test
 * (tests/reliability/test_faults.c fails each call in turn).  Needs nothing
 * but the preprocessor, so that sim/ and tests/ include it as it is.
 *
 * X(name, version, symbol): the entry point's base name, the CUDA version
 * whose variant the library asks for (its PFN_<name>_v<version> type in
 * cudaTypedefs.h; entry points are asked for at the ABI of CUDA 12.0, and
 * a newer driver still answers with these), and the driver's symbol of that
 * variant. */
#ifndef FP_DRIVER_ENTRIES_H
#define FP_DRIVER_ENTRIES_H

#define FP_DRIVER_ENTRIES(X)                                                                                  \
    X(cuInit, 2000, cuInit)                                                                                   \
    X(cuDriverGetVersion, 2020, cuDriverGetVersion)                                                           \
    X(cuGetErrorName, 6000, cuGetErrorName)                                                                   \
    X(cuGetErrorString, 6000, cuGetErrorString)                                                               \
    X(cuDeviceGet, 2000, cuDeviceGet)                                                                         \
    X(cuDeviceGetCount, 2000, cuDeviceGetCount)                                                               \
    X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)                                                       \
    X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)                                                            \
    X(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer)                                                     \
    X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)                                               \
    X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)                                         \
    X(cuCtxGetCurrent, 4000, cuCtxGetCurrent)                                                                 \
    X(cuCtxSetCurrent, 4000, cuCtxSetCurrent)                                                                 \
    X(cuCtxSynchronize, 2000, cuCtxSynchronize)                                                               \
    X(cuMemGetInfo, 3020, cuMemGetInfo_v2)                                                                    \
    X(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity)                                    \
    X(cuMemAddressReserve, 10020, cuMemAddressReserve)                                                        \
    X(cuMemAddressFree, 10020, cuMemAddressFree)                                                              \
    X(cuMemCreate, 10020, cuMemCreate)                                                                        \
    X(cuMemRelease, 10020, cuMemRelease)                                                                      \
    X(cuMemMap, 10020, cuMemMap)                                                                              \
    X(cuMemUnmap, 10020, cuMemUnmap)                                                                          \
    X(cuMemSetAccess, 10020, cuMemSetAccess)                                                                  \
    X(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle)                                        \
    X(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2)                                                    \
    X(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle)                  \
    X(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle)                                      \
    X(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle)                                  \
    X(cuEventCreate, 2000, cuEventCreate)                                                                     \
    X(cuEventDestroy, 4000, cuEventDestroy_v2)                                                                \
    X(cuEventRecord, 2000, cuEventRecord)                                                                     \
    X(cuEventQuery, 2000, cuEventQuery)                                                                       \
    X(cuEventSynchronize, 2000, cuEventSynchronize)                                                           \
    X(cuStreamSynchronize, 2000, cuStreamSynchronize)                                                         \
    X(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2)                                                          \
    X(cuMemGetHandleForAddressRange, 11070, cuMemGetHandleForAddressRange)

#endif
