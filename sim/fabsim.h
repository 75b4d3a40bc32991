/*
 * fabsim.h - control and inspection API of fabpool's simulated CUDA driver.
 *
 * The simulated driver is built as a drop-in libcuda.so.1.  Besides the CUDA
 * driver API it exports the functions below, which tests look up with
 * dlsym(RTLD_DEFAULT, "fabsim_...") so that the same test binary also runs
 * against the real driver (where the lookup returns NULL and the checks that
 * need the ledger are skipped).
 *
 * Environment variables read at cuInit:
 *   FABSIM_DEVICES=N          number of devices, 0 to 16 (default 1)
 *   FABSIM_MEMORY=SIZE        physical capacity of each device: whole bytes, optionally with a unit of
 *                             powers of 1024 in any case (K, M, G, T, P; KB, KiB ...), e.g. 16GiB
 *                             (default 16GiB)
 *   FABSIM_FABRIC=0|1         1: fabric handles are permitted; 0 (default): cuMemCreate
 *                             with CU_MEM_HANDLE_TYPE_FABRIC answers CUDA_ERROR_NOT_PERMITTED,
 *                             as on a machine without an IMEX channel
 *   FABSIM_RDMA=0|1           1 (default, as the H200): the device attributes
 *                             GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED and DMA_BUF_SUPPORTED
 *                             are 1; 0: both are 0, cuMemCreate with allocFlags.gpuDirectRDMACapable
 *                             answers CUDA_ERROR_NOT_SUPPORTED, and so does
 *                             cuMemGetHandleForAddressRange
 *   FABSIM_HOST_MEMORY=SIZE   capacity of host NUMA node 0 for cuMemCreate of
 *                             CU_MEM_LOCATION_TYPE_HOST_NUMA memory (default 64GiB)
 *   FABSIM_FAULT=SPEC         fault injection, SPEC = name:nth:ERROR[,name:nth:ERROR...]
 *                             e.g. cuMemCreate:3:CUDA_ERROR_OUT_OF_MEMORY makes the 3rd
 *                             call of cuMemCreate (counted from cuInit) fail with that error.
 *                             nth may be '*' (every call from then on).
 *   FABSIM_TRACE=1            print every driver call to stderr
 * A value of FABSIM_DEVICES, FABSIM_MEMORY or FABSIM_HOST_MEMORY that is not
 * one (a size of 0 bytes included) makes cuInit fail with
 * CUDA_ERROR_INVALID_VALUE, saying which on stderr; nothing is set up.
 */
#ifndef FABSIM_H
#define FABSIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FABSIM_MAX_DEVICES 16

/* What the simulated driver holds for this process right now. */
typedef struct fabsim_ledger {
    uint64_t handles;       /* live allocation handles (sum of reference counts) */
    uint64_t allocations;   /* physical allocations alive in this process */
    uint64_t mappings;      /* live cuMemMap mappings */
    uint64_t reservations;  /* live cuMemAddressReserve ranges */
    uint64_t exported_fds;  /* exported POSIX fds still open in this process */
    uint64_t bytes_held;    /* physical device bytes this process keeps alive, all devices: cuMemCreate's,
                               cuMemAlloc's and what cuMemAllocAsync's pools reserve (sim_mem.h's
                               sim_mempool), as cuMemGetInfo counts them */
    uint64_t bytes_mapped;  /* bytes mapped by cuMemMap in this process */
    uint64_t bytes_held_dev[FABSIM_MAX_DEVICES];
    uint64_t legacy_allocs; /* live cuMemAlloc / cuMemAllocAsync blocks */
    uint64_t bytes_held_host; /* physical bytes of host NUMA memory (cuMemCreate of
                                 CU_MEM_LOCATION_TYPE_HOST_NUMA) this process keeps alive;
                                 not part of bytes_held, which counts device memory */
    uint64_t dmabuf_fds;    /* dma-buf fds of cuMemGetHandleForAddressRange still open in this
                               process (each keeps the memory of its range alive until closed) */
} fabsim_ledger;

/* Fills *out.  Returns 0. */
int fabsim_get_ledger(fabsim_ledger *out);

/* Physical bytes of this simulated machine's device `dev` that any process
 * on the host keeps alive (found by scanning /proc for the sim's memory files:
 * what the kernel itself still holds).  Used by cross-process tests. */
uint64_t fabsim_machine_held_bytes(int dev);

/* Fault injection, same meaning as FABSIM_FAULT.  nth counts calls from now
 * (1 = the next call).  `every` 0: call nth fails; 1: every call from the nth
 * on (nth = 0: from now on); k > 1: k calls in a row from the nth, then the
 * entry point works again (2: a call the library tries twice fails both
 * times, and what follows it works).
 * Returns 0, or -1 for an unknown entry point name. */
int fabsim_fault_set(const char *entry, uint64_t nth, int every, int cuda_error);
void fabsim_fault_clear(void);

/* Number of calls of an entry point made so far (by its base name, e.g.
 * "cuMemCreate"), and the sum over all entry points for NULL. */
uint64_t fabsim_calls(const char *entry);
void fabsim_calls_reset(void);

/* POSIX-fd exports (cuMemExportToShareableHandle) made while no fd this
 * process exported was still open.  On the H200 such an export costs about
 * 0.55 ms, against about 35 us while another exported fd is open, and the
 * close of the last open one costs about 0.55 ms too (docs/driver-facts.md). */
uint64_t fabsim_cold_exports(void);

/* Pending GPU work: while a stream is held, work on it does not complete:
 * cuStreamQuery and cuEventQuery of events recorded on it after the hold
 * answer CUDA_ERROR_NOT_READY.  cuStreamSynchronize / cuEventSynchronize /
 * cuCtxSynchronize complete it (as the GPU would, eventually), and so does
 * fabsim_stream_release.  stream NULL is the legacy default stream. */
int fabsim_stream_hold(void *stream);
int fabsim_stream_release(void *stream);
/* As fabsim_stream_hold, but a synchronize of the stream's work (or of the
 * context) waits, blocking its thread, until fabsim_stream_release from
 * another thread: a kernel that runs long. */
int fabsim_stream_hold_long(void *stream);

/* 1 if every byte of [va, va + n) is device memory this process has mapped
 * (cuMemMap, or cuMemAlloc) with read-write access granted to some device,
 * else 0: what a kernel writing the whole range would need.  n = 0 asks
 * about nothing (1). */
int fabsim_range_mapped(const void *va, size_t n);

#ifdef __cplusplus
}
#endif
#endif
