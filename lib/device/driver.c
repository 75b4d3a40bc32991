/* driver.c - loads the CUDA driver at run time and owns its entry points. */
#define _GNU_SOURCE
#include "driver.h"

#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

fp_driver fp_drv;

/* load() fills the entry points as an array of pointers. */
_Static_assert(offsetof(fp_driver, version) == FP_DRV_COUNT * sizeof(void *), "fp_driver starts with the entry points");

static const char *const entry_names[] = {
#define FP_DRV_NAME(name, ver, sym) #name,
    FP_DRIVER_ENTRIES(FP_DRV_NAME)
#undef FP_DRV_NAME
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static fabpool_status load_status;
static char load_msg[1024];
static pid_t load_pid; /* the process that initialized the driver */

const char *fp_drv_name(int i) { return (i >= 0 && i < FP_DRV_COUNT) ? entry_names[i] : "?"; }

/* The two ABIs of cuGetProcAddress: CUDA 12.0 added a status argument. */
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);

static _Thread_local struct timespec trace_t0;

void fp_drv_trace_start(void) { clock_gettime(CLOCK_MONOTONIC, &trace_t0); }

void fp_drv_trace_end(int i, const char *args, CUresult r)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = (double)(t1.tv_sec - trace_t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - trace_t0.tv_nsec) / 1e3;
    fp_log(FP_LOG_TRACE, "%s(%s) -> %s, %.1f us", fp_drv_name(i), args,
           r == CUDA_SUCCESS ? "CUDA_SUCCESS" : fp_drv_error_name(r), us);
}

static void load(void)
{
    int lvl;
    if (fp_log_env(&lvl) == FABPOOL_OK && lvl > 0) /* a bad value: pool creation says so */
        fp_log_raise(lvl);
    const char *path = secure_getenv("FABPOOL_CUDA_LIBRARY");
    if (!path || !*path)
        path = "libcuda.so.1";
    snprintf(fp_drv.path, sizeof fp_drv.path, "%s", path);

    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        load_status = fp_error(FABPOOL_ERR_NO_DRIVER,
                               "cannot load the CUDA driver library '%s': %s. Install the NVIDIA driver, or set "
                               "FABPOOL_CUDA_LIBRARY to the path of libcuda.so.1 (the simulated driver lives in "
                               "<build>/sim/libcuda.so.1)%s",
                               path, dlerror(),
                               getenv("FABPOOL_CUDA_LIBRARY") && path != getenv("FABPOOL_CUDA_LIBRARY")
                                   ? "; FABPOOL_CUDA_LIBRARY is ignored in a process that runs with raised "
                                     "privileges (setuid, setgid or file capabilities), as every FABPOOL_ variable is"
                                   : "");
        return;
    }
    proc_v2_fn proc2 = (proc_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    proc_v1_fn proc1 = proc2 ? NULL : (proc_v1_fn)dlsym(lib, "cuGetProcAddress");
    if (!proc2 && !proc1) {
        load_status = fp_error(FABPOOL_ERR_NO_DRIVER,
                               "'%s' has no cuGetProcAddress: the driver is older than CUDA 11.3; fabpool needs a "
                               "driver of CUDA 12.0 or newer",
                               path);
        return;
    }
    void **slots = (void **)&fp_drv;
    for (int i = 0; i < FP_DRV_COUNT; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult r = proc2 ? proc2(entry_names[i], &fn, FP_DRIVER_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st)
                           : proc1(entry_names[i], &fn, FP_DRIVER_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT);
        /* The real driver answers CUDA_SUCCESS for a missing symbol and says so
         * only in the status (tests/probe/h200-answers.txt): check all three. */
        if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
            load_status = fp_error(FABPOOL_ERR_NO_DRIVER,
                                   "the CUDA driver '%s' has no entry point %s for CUDA %d.%d (cuGetProcAddress "
                                   "answered %d, status %d): update the NVIDIA driver",
                                   path, entry_names[i], FP_DRIVER_API_VERSION / 1000,
                                   FP_DRIVER_API_VERSION % 1000 / 10, (int)r, (int)st);
            return;
        }
        slots[i] = fn;
    }
    CUresult r = FP_CU(NULL, cuInit, 0);
    if (r != CUDA_SUCCESS) {
        load_status = fp_drv_error(r, "cuInit", "initializing the driver '%s' (is a GPU visible? check "
                                   "nvidia-smi and CUDA_VISIBLE_DEVICES)", path);
        return;
    }
    load_pid = getpid();
    FP_CU(NULL, cuDriverGetVersion, &fp_drv.version);
    FP_LOG(FP_LOG_INFO, "fabpool %s: driver '%s' loaded, CUDA driver %d.%d", fabpool_version(), path,
           fp_drv.version / 1000, fp_drv.version % 1000 / 10);
    load_status = FABPOOL_OK;
}

static void load_once_fn(void)
{
    load();
    if (load_status != FABPOOL_OK)
        snprintf(load_msg, sizeof load_msg, "%s", fabpool_last_error());
}

fabpool_status fp_drv_load(const char *fn)
{
    pthread_once(&load_once, load_once_fn);
    if (load_status != FABPOOL_OK)
        return fp_error(load_status, "%s", load_msg);
    if (getpid() != load_pid)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "%s: this process was forked from process %ld after that one "
                        "had initialized the CUDA driver, and CUDA does not carry over a fork: no driver call works "
                        "in the child. Start the child with exec or spawn (multiprocessing's 'spawn') and make the "
                        "pool there", fn, (long)load_pid);
    return FABPOOL_OK;
}

const char *fp_drv_error_name(CUresult r)
{
    const char *s = NULL;
    if (fp_drv.p_cuGetErrorName && fp_drv.p_cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "an unknown CUDA error";
}

fabpool_status fp_drv_error(CUresult r, const char *call, const char *what_fmt, ...)
{
    const char *desc = NULL;
    if (!fp_drv.p_cuGetErrorString || fp_drv.p_cuGetErrorString(r, &desc) != CUDA_SUCCESS || !desc)
        desc = "no description";
    fabpool_status s = FABPOOL_ERR_DRIVER;
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        s = FABPOOL_ERR_OUT_OF_MEMORY;
    else if (r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED)
        s = FABPOOL_ERR_NOT_SUPPORTED;
    fp_error(s, "%s failed with %s (%d: %s) while ", call, fp_drv_error_name(r), (int)r, desc);
    va_list ap;
    va_start(ap, what_fmt);
    char what[512];
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    fp_error_append("%s", what);
    return s;
}
