/* chunk.c - physical chunks: created, mapped, given access, and released at
 * once, so that the mapping is the only thing keeping the memory alive and
 * an unmap frees it; exported and imported; the pool's context. */
#include "chunk.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "array.h"
#include "error.h"
#include "retire.h"
#include "trace.h"

/* What this thread unmapped, all time (fp_chunk_tally_begin / _end). */
static _Thread_local fp_chunk_tally unmapped_tl;

CUmemAllocationProp fp_chunk_prop(const fp_chunks *ch)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ch->dev;
    prop.requestedHandleTypes = ch->cu_handle_types;
    prop.allocFlags.gpuDirectRDMACapable = ch->rdma;
    return prop;
}

/* fabpool_options stores the rdma key as an int (conf.c) */
_Static_assert(sizeof(fabpool_rdma) == sizeof(int), "fabpool_rdma is stored through an int");

fabpool_status fp_chunk_choose_rdma(fp_chunks *ch, fabpool_rdma want)
{
    int vmm_rdma = 0, dmabuf = 0;
    ch->rdma = 0;
    ch->dmabuf_supported = 0;
    if (want != FABPOOL_RDMA_OFF) {
        CUresult r = FP_CU(&ch->calls, cuDeviceGetAttribute, &vmm_rdma,
                           CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, ch->dev);
        if (r != CUDA_SUCCESS)
            return fp_drv_error(r, "cuDeviceGetAttribute", "asking whether device %d supports GPUDirect RDMA with "
                                "VMM allocations (for rdma:%s; rdma:off skips the question)", (int)ch->dev,
                                want == FABPOOL_RDMA_ON ? "on" : "auto");
        if (!vmm_rdma && want == FABPOOL_RDMA_ON)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                            "rdma:on was asked for, but device %d does not support GPUDirect RDMA with VMM "
                            "allocations (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0; it needs "
                            "a data-center GPU and a driver that supports it). Use rdma:auto, which makes ordinary "
                            "chunks there, or rdma:off",
                            (int)ch->dev);
        ch->rdma = vmm_rdma ? 1 : 0;
    }
    /* dma-buf export works for chunks with or without the RDMA flag; a failed
     * question only means fabpool_buffer_dmabuf will say it is unsupported */
    if (FP_CU(&ch->calls, cuDeviceGetAttribute, &dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, ch->dev) !=
        CUDA_SUCCESS)
        dmabuf = 0;
    ch->dmabuf_supported = dmabuf != 0;
    return FABPOOL_OK;
}

fabpool_status fp_chunk_create(fp_chunks *ch, uint64_t size, CUmemGenericAllocationHandle *out)
{
    fp_lock_assert_held(ch->lock);
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = fp_chunk_prop(ch);
    CUresult r = FP_CU(&ch->calls, cuMemCreate, &h, size, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        FP_LOG_CH(FP_LOG_INFO, ch, "out of memory: cuMemCreate of %llu bytes failed while the pool maps %llu",
                  (unsigned long long)size, (unsigned long long)fp_chunks_mapped(ch, NULL));
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemCreate", "creating a chunk of %llu bytes on device %d",
                            (unsigned long long)size, (int)ch->dev);
    atomic_fetch_add(&ch->handles_outstanding, 1);
    *out = h;
    return FABPOOL_OK;
}

CUresult fp_chunk_unmap_stuck(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(ch->lock);
    CUresult r = FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size);
    if (r == CUDA_SUCCESS)
        fp_mapreg_remove(&ch->reg, va, size, NULL);
    return r;
}

void fp_chunk_stick(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(ch->lock);
    fp_mapping m;
    if (fp_mapreg_remove(&ch->reg, va, size, &m) == 0) /* its room is free again: the add cannot fail */
        fp_mapreg_add(&ch->reg, va, size, FP_MAP_STUCK, NULL);
}

void fp_chunk_stuck_hold(fp_chunks *ch, uint64_t va)
{
    fp_lock_assert_held(ch->lock);
    fp_mapping *m = fp_mapreg_find(&ch->reg, va);
    if (m && m->kind == FP_MAP_STUCK)
        m->held = 1;
}

CUresult fp_chunk_unstick_range(fp_chunks *ch, uint64_t va, uint64_t size, int go_on, fp_mapping *refused)
{
    fp_lock_assert_held(ch->lock);
    CUresult first = CUDA_SUCCESS;
    size_t i = FP_ARRAY_LOWER(ch->reg.m, ch->reg.n, fp_mapping, va, va);
    i -= i > 0 && ch->reg.m[i - 1].va + ch->reg.m[i - 1].size > va; /* one that begins before va */
    while (fp_chunks_stuck(ch) && i < ch->reg.n && ch->reg.m[i].va < va + size) {
        fp_mapping m = ch->reg.m[i];
        CUresult r = m.kind == FP_MAP_STUCK ? fp_chunk_unmap_stuck(ch, m.va, m.size) : CUDA_SUCCESS;
        if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) {
            first = r;
            *refused = m;
        }
        if (r != CUDA_SUCCESS && !go_on)
            break;
        i += m.kind != FP_MAP_STUCK || r != CUDA_SUCCESS; /* an unmapped one left the list: i is the next already */
    }
    return first;
}

fabpool_status fp_chunk_map_access(fp_chunks *ch, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   fp_map_kind kind, void *owner, const char *what)
{
    fp_lock_assert_held(ch->lock);
    if (fp_mapreg_reserve(&ch->reg) != 0)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the registry of mappings (mapping %s of %llu "
                        "bytes); nothing was mapped", what, (unsigned long long)size);
    /* stuck mappings in the way first (only where the range's user kept it: space.c holds one given back) */
    fp_mapping m;
    CUresult r = fp_chunk_unstick_range(ch, va, size, 0, &m);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemUnmap", "unmapping a mapping of %llu bytes at 0x%llx that the driver would not "
                            "unmap before and that lies where %s of %llu bytes goes; nothing was mapped: try again "
                            "(fabpool_collect unmaps it too)", (unsigned long long)m.size, (unsigned long long)m.va,
                            what, (unsigned long long)size);
    r = FP_CU(&ch->calls, cuMemMap, (CUdeviceptr)va, size, 0, h, 0);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemMap", "mapping %s of %llu bytes at 0x%llx", what, (unsigned long long)size,
                            (unsigned long long)va);
    CUmemAccessDesc acc[1 + FABPOOL_MAX_PEERS];
    int n = 0;
    memset(acc, 0, sizeof acc);
    acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[n].location.id = ch->dev;
    acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < ch->n_peers; i++) {
        acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[n].location.id = ch->peers[i];
        acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    r = FP_CU(&ch->calls, cuMemSetAccess, (CUdeviceptr)va, size, acc, (size_t)n);
    if (r != CUDA_SUCCESS) {
        fabpool_status st = fp_drv_error(r, "cuMemSetAccess", "giving device %d%s access to %s of %llu bytes at "
                                         "0x%llx", (int)ch->dev, n > 1 ? " and its peers" : "", what,
                                         (unsigned long long)size, (unsigned long long)va);
        if (FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size) != CUDA_SUCCESS) {
            /* the driver keeps the mapping: listed (room reserved above), so that the pool unmaps it later and
             * no range is handed out again under it */
            fp_mapreg_add(&ch->reg, va, size, FP_MAP_STUCK, NULL);
            fp_error_append(" (its undo, cuMemUnmap, was refused twice too: the mapping stays, unused, until "
                            "fabpool_collect, fabpool_trim or fabpool_destroy unmaps it)");
        }
        return st;
    }
    fp_mapreg_add(&ch->reg, va, size, kind, owner);
    return FABPOOL_OK;
}

/* Unmaps a mapping of the registry that no one got to use (tried twice) and removes it there; one the driver
 * keeps stays listed as stuck, for a later collect. */
static int unmap_unused(fp_chunks *ch, uint64_t va, uint64_t size)
{
    if (FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size) == CUDA_SUCCESS)
        return fp_mapreg_remove(&ch->reg, va, size, NULL);
    fp_chunk_stick(ch, va, size);
    return -1;
}

void fp_chunk_count_mapped(fp_chunks *ch, uint64_t va, uint64_t size, const char *what)
{
    fp_lock_assert_held(ch->lock);
    uint64_t m = fp_chunks_mapped(ch, NULL);
    atomic_fetch_add(&ch->chunks_mapped_total, 1);
    FP_TRACE_F(ch->trace, 0u, FABPOOL_TR_MAP, va, size, 0, FABPOOL_OK);
    FP_LOG_CH(FP_LOG_INFO, ch, "grow: mapped %llu bytes at 0x%llx (%s); the pool maps %llu", (unsigned long long)size,
              (unsigned long long)va, what, (unsigned long long)m);
}

void fp_chunk_reset_peak(fp_chunks *ch) { fp_mapreg_reset_peak(&ch->reg); }

uint64_t fp_chunk_ident(const fp_chunks *ch, uint64_t va)
{
    fp_lock_assert_held(ch->lock);
    const fp_mapping *m = fp_mapreg_find((fp_mapreg *)&ch->reg, va);
    return m ? m->ident : 0;
}

void fp_chunk_set_copy(fp_chunks *ch, uint64_t va, int copy)
{
    fp_lock_assert_held(ch->lock);
    if (fp_mapreg_set_copy(&ch->reg, va, copy) == 0 || !ch->slept)
        return;
    size_t i = FP_ARRAY_LOWER(ch->slept, ch->n_slept, fp_slept, va, va);
    if (i < ch->n_slept && ch->slept[i].va == va)
        ch->slept[i].m.copy = copy != 0;
}

const fp_mapping *fp_chunk_mappings(const fp_chunks *ch, size_t *n)
{
    fp_lock_assert_held(ch->lock);
    *n = ch->reg.n;
    return ch->reg.m;
}

void fp_chunk_map_sums(const fp_chunks *ch, uint64_t *count, uint64_t *bytes)
{
    for (int k = 0; k < FP_MAP_KINDS; k++) {
        count[k] = atomic_load(&ch->reg.count[k]);
        bytes[k] = atomic_load(&ch->reg.bytes[k]);
    }
}

CUresult fp_chunk_release(fp_chunks *ch, CUmemGenericAllocationHandle h)
{
    fp_lock_assert_held(ch->lock);
    CUresult r = FP_CU_UNDO(&ch->calls, cuMemRelease, h);
    if (r == CUDA_SUCCESS)
        atomic_fetch_sub(&ch->handles_outstanding, 1);
    return r;
}

fabpool_status fp_chunk_map_handle(fp_chunks *ch, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   fp_map_kind kind, void *owner, const char *what)
{
    fp_lock_assert_held(ch->lock);
    fabpool_status st = fp_chunk_map_access(ch, va, size, h, kind, owner, what);
    if (st != FABPOOL_OK) {
        fp_chunk_release(ch, h);
        return st;
    }
    /* Eager release: from here on the mapping alone keeps the memory. */
    CUresult r = fp_chunk_release(ch, h);
    if (r != CUDA_SUCCESS) {
        int kept = unmap_unused(ch, va, size) != 0;
        return fp_drv_error(r, "cuMemRelease", "releasing the handle of %s just mapped at 0x%llx (tried twice; "
                            "%s, its handle may still hold %llu bytes)", what, (unsigned long long)va,
                            kept ? "its unmap was refused too: it stays mapped, unused, until fabpool_collect "
                            "unmaps it" : "it was unmapped", (unsigned long long)size);
    }
    fp_chunk_count_mapped(ch, va, size, what);
    return FABPOOL_OK;
}

void fp_chunk_set_asleep(fp_chunks *ch, int asleep)
{
    if (asleep)
        fp_chunk_anchor_close(ch); /* a sleeping pool exports nothing, and its chunks go */
    atomic_store(&ch->asleep, asleep);
}

void fp_chunk_set_slept(fp_chunks *ch, fp_slept *e, size_t n)
{
    fp_lock_assert_held(ch->lock);
    ch->slept = e;
    ch->n_slept = n;
}

fabpool_status fp_chunk_asleep_error(const char *fn)
{
    return fp_error(FABPOOL_ERR_ASLEEP, "%s: the pool is asleep (fabpool_sleep): its memory was given back to the "
                    "driver; call fabpool_wake first", fn);
}

fabpool_status fp_chunk_too_large(const fp_chunks *ch, uint64_t bytes, const char *what)
{
    return fp_error(FABPOOL_ERR_OUT_OF_MEMORY, "%s %llu bytes: more than device %d has in all (%llu bytes); nothing "
                    "was mapped", what, (unsigned long long)bytes, ch->device, (unsigned long long)ch->dev_total);
}

/* The sleeping record's entry of [va, va + size), or NULL. */
static fp_slept *slept_at(fp_chunks *ch, uint64_t va, uint64_t size)
{
    size_t lo = FP_ARRAY_LOWER(ch->slept, ch->n_slept, fp_slept, va, va);
    fp_slept *e = lo < ch->n_slept && ch->slept[lo].va == va ? &ch->slept[lo] : NULL;
    return e && e->size == size ? e : NULL;
}

/* A chunk that sleeps, freed while asleep (a trim, a buffer's unmap): marked
 * GONE, so that wake does not map it again.  1 if [va, va + size) was one. */
static int forget_slept(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_slept *e = slept_at(ch, va, size);
    if (!e || e->state != FP_SL_ASLEEP)
        return 0;
    e->state = FP_SL_GONE;
    return 1;
}

fabpool_status fp_chunk_unmap(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(ch->lock);
    if (ch->slept && forget_slept(ch, va, size))
        return FABPOOL_OK; /* asleep: unmapped already (sleep.c) */
    if (ch->fence) { /* memory the owner stream freed at once: its queued work first */
        fabpool_status st = fp_retire_fence(ch->fence);
        if (st != FABPOOL_OK) {
            fp_error_append(" (before unmapping a chunk of %llu bytes at 0x%llx, left mapped)",
                            (unsigned long long)size, (unsigned long long)va);
            return st;
        }
    }
    fp_chunk_anchor_leave(ch, va, size);
    CUresult r = FP_CU_UNDO(&ch->calls, cuMemUnmap, (CUdeviceptr)va, size);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemUnmap", "unmapping a chunk of %llu bytes at 0x%llx",
                            (unsigned long long)size, (unsigned long long)va);
    /* an fd kept for a block's export would keep the memory alive: it goes with the mapping */
    for (size_t i = FP_ARRAY_LOWER(ch->kept, ch->n_kept, fp_xchunk, va, va); i < ch->n_kept && ch->kept[i].va < va + size;)
        fp_chunk_export_drop(ch, ch->kept[i].va);
    fp_mapreg_remove(&ch->reg, va, size, NULL);
    fp_slept *e = ch->slept ? slept_at(ch, va, size) : NULL;
    if (e && e->state == FP_SL_UNRESTORED) /* freed before a wake restored it: no wake copies into it */
        e->state = FP_SL_GONE;
    uint64_t m = fp_chunks_mapped(ch, NULL);
    atomic_fetch_add(&ch->chunks_unmapped_total, 1);
    unmapped_tl.bytes += size;
    unmapped_tl.chunks++;
    FP_TRACE_F(ch->trace, 0u, FABPOOL_TR_UNMAP, va, size, 0, FABPOOL_OK);
    FP_LOG_CH(FP_LOG_INFO, ch, "release: unmapped %llu bytes at 0x%llx; the pool maps %llu",
              (unsigned long long)size, (unsigned long long)va, (unsigned long long)m);
    return FABPOOL_OK;
}

fp_chunk_tally fp_chunk_tally_now(void) { return (fp_chunk_tally){unmapped_tl.bytes, unmapped_tl.chunks, 1}; }

fp_chunk_tally fp_chunk_tally_end(fp_chunk_tally begun)
{
    if (!begun.on)
        return (fp_chunk_tally){0, 0, 0};
    return (fp_chunk_tally){unmapped_tl.bytes - begun.bytes, unmapped_tl.chunks - begun.chunks, 1};
}

fabpool_status fp_chunk_retain(fp_chunks *ch, uint64_t va, CUmemGenericAllocationHandle *out, const char *what)
{
    CUresult r = FP_CU(&ch->calls, cuMemRetainAllocationHandle, out, (void *)(uintptr_t)va);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemRetainAllocationHandle", "%s", what);
    atomic_fetch_add(&ch->handles_outstanding, 1);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ the export anchor */

/* On the H200 a POSIX-fd export costs about 0.55 ms, and so does the close of
 * the process's last open exported fd; while another exported fd stays open
 * an export costs about 35 us and a close 11 us (docs/driver-facts.md).  So
 * the pool keeps one open: the first fd it would close of a chunk it still
 * maps (fp_chunk_close_export) stays open instead.  Before that chunk is
 * unmapped the anchor moves to another chunk the pool maps (one cheap export,
 * then the old fd closed), or is closed when none is left: it never keeps
 * alive memory the pool gave back.  Still counted in exported_fds (the driver
 * holds it as any other). */

/* Retain, export and release the handle of the chunk mapped at va: the driver's result, and in *call the call
 * that failed.  Silent: the callers say what failed, or (the anchor's move) that it does not matter. */
static CUresult export_raw(fp_chunks *ch, uint64_t va, int *fd, CUmemFabricHandle *fabric, const char **call)
{
    CUmemGenericAllocationHandle h = 0;
    *call = "cuMemRetainAllocationHandle";
    CUresult r = FP_CU(&ch->calls, cuMemRetainAllocationHandle, &h, (void *)(uintptr_t)va);
    if (r != CUDA_SUCCESS)
        return r;
    atomic_fetch_add(&ch->handles_outstanding, 1);
    *call = "cuMemExportToShareableHandle";
    if (fabric)
        r = FP_CU(&ch->calls, cuMemExportToShareableHandle, fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    else
        r = FP_CU(&ch->calls, cuMemExportToShareableHandle, fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r == CUDA_SUCCESS && !fabric) {
        atomic_fetch_add(&ch->exported_fds, 1);
        /* a program that runs another (fork and exec) must not hand it the pool's memory: the driver's fd
         * carries no close-on-exec of its own (a cost of a system call an export, beside a driver call) */
        (void)fcntl(*fd, F_SETFD, fcntl(*fd, F_GETFD) | FD_CLOEXEC);
    } else if (r != CUDA_SUCCESS && !fabric)
        *fd = -1;
    /* the handle goes at once: the mapping (and the fd) keep the memory */
    fp_chunk_release(ch, h);
    return r;
}

/* The anchor moved to the chunk mapped at [va, va + size): an fd exported for it (a dup of an fd would do on
 * the driver, but the sim counts only the fds it handed out).  0 if taken. */
static int anchor_take(fp_chunks *ch, uint64_t va, uint64_t size)
{
    int fd = -1;
    const char *call;
    if (export_raw(ch, va, &fd, NULL, &call) != CUDA_SUCCESS)
        return -1;
    int old = ch->anchor_size ? ch->anchor_fd : -1; /* closed after the new one is open, so that its close is cheap */
    ch->anchor_fd = fd;
    ch->anchor_va = va;
    ch->anchor_size = size;
    fp_chunk_close_fd(ch, &old);
    return 0;
}

void fp_chunk_close_export(fp_chunks *ch, uint64_t va, uint64_t size, int *fd)
{
    fp_lock_assert_held(ch->lock);
    if (*fd < 0 || ch->anchor_size) {
        fp_chunk_close_fd(ch, fd);
        return;
    }
    ch->anchor_fd = *fd; /* still counted in exported_fds */
    ch->anchor_va = va;
    ch->anchor_size = size;
    *fd = -1;
}

void fp_chunk_anchor_close(fp_chunks *ch)
{
    fp_lock_assert_held(ch->lock);
    if (!ch->anchor_size)
        return;
    fp_chunk_close_fd(ch, &ch->anchor_fd);
    ch->anchor_va = ch->anchor_size = 0;
}

/* Where the anchor moves when [va, va + size) goes: a chunk of the pool's own
 * outside it, a buffer's before an arena's (buffers live longest), the
 * highest first (a teardown in address order meets it last). */
static const fp_mapping *anchor_successor(const fp_chunks *ch, uint64_t va, uint64_t size)
{
    const fp_mapping *arena = NULL;
    for (size_t i = ch->reg.n; i-- > 0;) {
        const fp_mapping *m = &ch->reg.m[i];
        if (!FP_MAP_SLEEPS(m->kind) || (m->va < va + size && va < m->va + m->size))
            continue;
        if (m->kind == FP_MAP_BUFFER)
            return m;
        if (!arena)
            arena = m;
    }
    return arena;
}

void fp_chunk_anchor_leave(fp_chunks *ch, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(ch->lock);
    if (!ch->anchor_size || ch->anchor_va < va || ch->anchor_va >= va + size)
        return;
    atomic_fetch_add(&ch->export_anchor_moves, 1);
    const fp_mapping *m = anchor_successor(ch, va, size);
    if (!m || anchor_take(ch, m->va, m->size) != 0)
        fp_chunk_anchor_close(ch); /* nowhere to go: later exports cost their full price, the unmap goes on */
}

fabpool_status fp_chunk_export(fp_chunks *ch, uint64_t va, uint64_t size, int *fd, CUmemFabricHandle *fabric)
{
    fp_lock_assert_held(ch->lock);
    const char *call;
    CUresult r = export_raw(ch, va, fd, fabric, &call);
    if (r == CUDA_SUCCESS)
        return FABPOOL_OK;
    if (strcmp(call, "cuMemRetainAllocationHandle") == 0)
        return fp_drv_error(r, call, "taking the handle of a chunk at 0x%llx to export it", (unsigned long long)va);
    return fp_drv_error(r, call, "exporting a chunk of %llu bytes as a %s handle", (unsigned long long)size,
                        fabric ? "fabric" : "POSIX fd");
}

fabpool_status fp_chunk_range(fp_chunks *ch, uint64_t va, uint64_t *base, uint64_t *size)
{
    fp_lock_assert_held(ch->lock);
    CUdeviceptr b = 0;
    size_t s = 0;
    CUresult r = FP_CU(&ch->calls, cuMemGetAddressRange, &b, &s, (CUdeviceptr)va);
    if (r == CUDA_ERROR_NOT_FOUND)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "nothing is mapped at 0x%llx", (unsigned long long)va);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemGetAddressRange", "asking which chunk is mapped at 0x%llx",
                            (unsigned long long)va);
    *base = (uint64_t)b;
    *size = (uint64_t)s;
    return FABPOOL_OK;
}

fabpool_status fp_chunk_export_kept(fp_chunks *ch, uint64_t va, uint64_t size, int *fd, CUmemFabricHandle *fabric,
                                    int *fresh)
{
    fp_lock_assert_held(ch->lock);
    size_t i = FP_ARRAY_LOWER(ch->kept, ch->n_kept, fp_xchunk, va, va);
    *fresh = 0;
    if (i < ch->n_kept && ch->kept[i].va == va && ch->kept[i].size == size) {
        *fd = ch->kept[i].fd;
        if (fabric)
            *fabric = ch->kept[i].fabric;
        return FABPOOL_OK;
    }
    if (FP_ARRAY_RESERVE(ch->meta, ch->kept, ch->n_kept, ch->cap_kept, ch->n_kept + 1, 8) != 0)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of exported chunks");
    fp_xchunk x;
    memset(&x, 0, sizeof x);
    x.va = va;
    x.size = size;
    x.fd = -1;
    fabpool_status st = fp_chunk_export(ch, va, size, &x.fd, fabric ? &x.fabric : NULL);
    if (st != FABPOOL_OK)
        return st;
    memmove(ch->kept + i + 1, ch->kept + i, (ch->n_kept - i) * sizeof *ch->kept);
    ch->kept[i] = x;
    ch->n_kept++;
    *fd = x.fd;
    if (fabric)
        *fabric = x.fabric;
    *fresh = 1;
    return FABPOOL_OK;
}

void fp_chunk_export_drop(fp_chunks *ch, uint64_t va)
{
    fp_lock_assert_held(ch->lock);
    size_t i = FP_ARRAY_LOWER(ch->kept, ch->n_kept, fp_xchunk, va, va);
    if (i == ch->n_kept || ch->kept[i].va != va)
        return;
    fp_chunk_close_fd(ch, &ch->kept[i].fd);
    memmove(ch->kept + i, ch->kept + i + 1, (ch->n_kept - i - 1) * sizeof *ch->kept);
    ch->n_kept--;
}

void fp_chunks_destroy(fp_chunks *ch)
{
    fp_lock_assert_held(ch->lock);
    while (ch->n_kept)
        fp_chunk_export_drop(ch, ch->kept[ch->n_kept - 1].va);
    FP_ARRAY_FREE(ch->meta, ch->kept, ch->cap_kept);
    fp_mapreg_free(&ch->reg);
}

void fp_chunk_close_fd(fp_chunks *ch, int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
        atomic_fetch_sub(&ch->exported_fds, 1);
    }
}

CUresult fp_chunk_import(fp_chunks *ch, fabpool_handle_type type, int fd, const CUmemFabricHandle *fabric,
                         CUmemGenericAllocationHandle *out)
{
    CUresult r;
    if (type == FABPOOL_HANDLE_POSIX_FD)
        r = FP_CU(&ch->calls, cuMemImportFromShareableHandle, out, (void *)(intptr_t)fd,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    else
        r = FP_CU(&ch->calls, cuMemImportFromShareableHandle, out, (void *)fabric, CU_MEM_HANDLE_TYPE_FABRIC);
    if (r == CUDA_SUCCESS)
        atomic_fetch_add(&ch->handles_outstanding, 1);
    return r;
}

fabpool_status fp_ctx_push(fp_chunks *ch, CUcontext *saved)
{
    *saved = NULL;
    CUresult r = FP_CU(&ch->calls, cuCtxGetCurrent, saved);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuCtxGetCurrent", "asking which context is current before switching to device %d's",
                            (int)ch->dev);
    if (*saved != ch->ctx)
        r = FP_CU(&ch->calls, cuCtxSetCurrent, ch->ctx);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuCtxSetCurrent", "making device %d's primary context current", (int)ch->dev);
    return FABPOOL_OK;
}

void fp_ctx_pop(fp_chunks *ch, CUcontext saved)
{
    if (saved != ch->ctx)
        FP_CU(&ch->calls, cuCtxSetCurrent, saved);
}

fabpool_status fp_chunks_device_memory(fp_chunks *ch, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    CUcontext saved = NULL;
    fabpool_status st = fp_ctx_push(ch, &saved);
    if (st != FABPOOL_OK)
        return st;
    CUresult r = FP_CU(&ch->calls, cuMemGetInfo, free_bytes, total_bytes);
    fp_ctx_pop(ch, saved);
    if (r != CUDA_SUCCESS) {
        *free_bytes = *total_bytes = 0;
        return fp_drv_error(r, "cuMemGetInfo", "asking device %d's free and total memory", (int)ch->dev);
    }
    return FABPOOL_OK;
}
