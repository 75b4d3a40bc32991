/* driver.h - the CUDA driver, loaded at run time.
 *
 * This module is the only one that knows how the driver was found: it
 * dlopens libcuda.so.1 (or $FABPOOL_CUDA_LIBRARY), takes cuGetProcAddress
 * from it and asks for every entry point of driver_entries.h at
 * FP_DRIVER_API_VERSION.
 * The rest of lib/ calls the driver through FP_CU(), which counts the call
 * and hands back the CUresult. */
#ifndef FP_DRIVER_H
#define FP_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdatomic.h>
#include <stdint.h>

#include "driver_entries.h"
#include "fabpool.h"
#include "log.h"

/* Entry points are asked for at the ABI of CUDA 12.0, the oldest driver
 * fabpool supports; a newer driver still answers with these signatures. */
#define FP_DRIVER_API_VERSION 12000

enum fp_drv_index {
#define FP_DRV_ENUM(name, ver, sym) FP_DRV_##name,
    FP_DRIVER_ENTRIES(FP_DRV_ENUM)
#undef FP_DRV_ENUM
    FP_DRV_COUNT
};
/* fabpool_stats has a call count and a name for every entry point */
_Static_assert(FP_DRV_COUNT <= FABPOOL_NUM_DRIVER_CALLS,
               "FABPOOL_NUM_DRIVER_CALLS (fabpool.h) must cover every entry point of driver_entries.h");

typedef struct fp_driver {
#define FP_DRV_FIELD(name, ver, sym) PFN_##name##_v##ver p_##name;
    FP_DRIVER_ENTRIES(FP_DRV_FIELD)
#undef FP_DRV_FIELD
    int version;        /* cuDriverGetVersion */
    char path[256];     /* the library that was loaded */
} fp_driver;

/* Per-owner call counters (one set per pool). */
typedef struct fp_drv_counters {
    _Atomic uint64_t n[FP_DRV_COUNT];
} fp_drv_counters;

extern fp_driver fp_drv;

/* Loads the driver and calls cuInit, once per process.  Thread-safe; every
 * later call returns the first one's outcome (and its message).  In a
 * process forked after that (the child inherits the loaded driver, but
 * CUDA does not carry over a fork: every driver call there fails),
 * FABPOOL_ERR_NOT_SUPPORTED with a message that begins with fn, the public
 * call, and says to start the child with exec or spawn. */
fabpool_status fp_drv_load(const char *fn);

/* Base name of entry point i ("cuMemCreate"). */
const char *fp_drv_name(int i);

/* The log at trace (log.h): a call's start, then a line with its
 * arguments as written, its result and its time. */
void fp_drv_trace_start(void);
void fp_drv_trace_end(int i, const char *args, CUresult r);

static inline CUresult fp_drv_count(fp_drv_counters *c, int i, const char *args, CUresult r)
{
    if (c)
        atomic_fetch_add_explicit(&c->n[i], 1, memory_order_relaxed);
    if (FP_LOG_ON(FP_LOG_TRACE))
        fp_drv_trace_end(i, args, r);
    return r;
}

/* FP_CU(counters, cuMemCreate, &h, size, &prop, 0): the call, counted (and
 * logged at trace: the one place every driver call goes through).  The name
 * is pasted before anything expands it (cuda.h defines some as macros). */
#define FP_CU(cnt, name, ...) FP_CU_CALL(cnt, FP_DRV_##name, fp_drv.p_##name, #__VA_ARGS__, __VA_ARGS__)
#define FP_CU_CALL(cnt, idx, fn, args, ...)                                                                   \
    (FP_LOG_ON(FP_LOG_TRACE) ? fp_drv_trace_start() : (void)0, fp_drv_count((cnt), idx, args, fn(__VA_ARGS__)))
/* A call that gives something back (cuMemRelease, cuMemUnmap, cuMemAddressFree,
 * cuDevicePrimaryCtxRelease), tried once more when it fails: left undone, it
 * would keep device memory or address space alive for the life of the process. */
#define FP_CU_UNDO(cnt, name, ...) FP_CU_TWICE(cnt, FP_DRV_##name, fp_drv.p_##name, #__VA_ARGS__, __VA_ARGS__)
#define FP_CU_TWICE(cnt, idx, fn, args, ...)                                                                  \
    (FP_CU_CALL(cnt, idx, fn, args, __VA_ARGS__) == CUDA_SUCCESS ? CUDA_SUCCESS                               \
                                                                 : FP_CU_CALL(cnt, idx, fn, args, __VA_ARGS__))

/* Turns a failed call into a status and a message:
 * "<call> failed with CUDA_ERROR_X (its description) while <what>".
 * OUT_OF_MEMORY maps to FABPOOL_ERR_OUT_OF_MEMORY, NOT_PERMITTED and
 * NOT_SUPPORTED to FABPOOL_ERR_NOT_SUPPORTED, the rest to FABPOOL_ERR_DRIVER. */
fabpool_status fp_drv_error(CUresult r, const char *call, const char *what_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "CUDA_ERROR_X", whatever the driver knows. */
const char *fp_drv_error_name(CUresult r);

#endif
