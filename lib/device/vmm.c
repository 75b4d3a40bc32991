/* vmm.c - reservations, the fabric probe, host mappings and uncounted
 * unmaps (vmm.h). */
#include <string.h>

#include "vmm.h"

CUresult fp_vmm_reserve(fp_chunks *ch, uint64_t size, uint64_t align, uint64_t *va)
{
    CUdeviceptr base = 0;
    CUresult r = FP_CU(&ch->calls, cuMemAddressReserve, &base, size, align, 0, 0);
    *va = r == CUDA_SUCCESS ? (uint64_t)base : 0;
    return r;
}

CUresult fp_vmm_unreserve(fp_chunks *ch, uint64_t va, uint64_t size)
{
    return FP_CU_UNDO(&ch->calls, cuMemAddressFree, (CUdeviceptr)va, size);
}

CUresult fp_vmm_probe_fabric(fp_chunks *ch, const char **step)
{
    CUmemAllocationProp prop = fp_chunk_prop(ch);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    size_t gran = 0;
    CUresult r = FP_CU(&ch->calls, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    *step = "cuMemGetAllocationGranularity";
    if (r != CUDA_SUCCESS)
        return r;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    *step = "cuMemCreate";
    r = FP_CU(&ch->calls, cuMemCreate, &h, gran, &prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemFabricHandle fh;
    *step = "cuMemExportToShareableHandle";
    r = FP_CU(&ch->calls, cuMemExportToShareableHandle, &fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    if (r == CUDA_SUCCESS) {
        *step = "cuMemImportFromShareableHandle";
        r = FP_CU(&ch->calls, cuMemImportFromShareableHandle, &h2, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
        if (r == CUDA_SUCCESS)
            FP_CU_UNDO(&ch->calls, cuMemRelease, h2);
    }
    FP_CU_UNDO(&ch->calls, cuMemRelease, h);
    return r;
}

CUresult fp_vmm_host_prop(fp_chunks *ch, CUmemAllocationProp *prop, size_t *gran)
{
    int numa = -1;
    if (FP_CU(&ch->calls, cuDeviceGetAttribute, &numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, ch->dev) != CUDA_SUCCESS ||
        numa < 0)
        numa = 0;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop->location.id = numa;
    *gran = 0;
    return FP_CU(&ch->calls, cuMemGetAllocationGranularity, gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

CUresult fp_vmm_map_new(fp_chunks *ch, uint64_t va, uint64_t size, const CUmemAllocationProp *prop,
                        fp_map_kind kind, const char **call, int *stuck)
{
    fp_lock_assert_held(ch->lock);
    *stuck = 0;
    *call = "the registry of mappings (no host memory for one more)";
    if (fp_mapreg_reserve(&ch->reg) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = ch->dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemGenericAllocationHandle h = 0;
    *call = "cuMemCreate";
    CUresult cr = FP_CU(&ch->calls, cuMemCreate, &h, size, prop, 0);
    if (cr != CUDA_SUCCESS)
        return cr;
    *call = "cuMemMap";
    cr = FP_CU(&ch->calls, cuMemMap, (CUdeviceptr)va, size, 0, h, 0);
    if (cr == CUDA_SUCCESS) {
        *call = "cuMemSetAccess";
        cr = FP_CU(&ch->calls, cuMemSetAccess, (CUdeviceptr)va, size, &acc, 1);
        if (cr == CUDA_SUCCESS) {
            *call = "cuMemRelease";
            cr = FP_CU_UNDO(&ch->calls, cuMemRelease, h);
            if (cr == CUDA_SUCCESS)
                h = 0;
        }
        if (cr != CUDA_SUCCESS && FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size) != CUDA_SUCCESS) {
            /* the driver keeps the mapping: listed as stuck (room reserved above), so that the collects and
             * the free of the reservation it lies in unmap it, and the reservation is not freed under it */
            fp_mapreg_add(&ch->reg, va, size, FP_MAP_STUCK, NULL);
            *stuck = 1;
        }
    }
    if (cr != CUDA_SUCCESS && h)
        FP_CU_UNDO(&ch->calls, cuMemRelease, h);
    if (cr == CUDA_SUCCESS)
        fp_mapreg_add(&ch->reg, va, size, kind, NULL);
    return cr;
}

CUresult fp_vmm_unmap(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(ch->lock);
    fp_chunk_anchor_leave(ch, va, size);
    CUresult r = FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size);
    if (r == CUDA_SUCCESS)
        fp_mapreg_remove(&ch->reg, va, size, NULL);
    return r;
}
