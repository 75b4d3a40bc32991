/* held.h - how much device memory this process holds, for the tests that run against the real driver.
 *
 * cuMemGetInfo tells how much of the whole device is free: any other process that allocates while a test runs
 * moves it, so a test that compared it before and after would fail on a GPU that others use. NVML answers per
 * process (nvmlDeviceGetComputeRunningProcesses: each process's used memory on the device), so the tests
 * compare what this process and its children hold (children: the peers that multi-process tests fork or
 * exec). NVML is loaded at run time (libnvidia-ml.so.1, part of the driver), like the driver itself.
 *
 * Where NVML is missing, or does not list this process (a PID namespace hides it), t_used_bytes falls back to
 * the device's used memory (total - free) and says so once on stderr: then the test needs a GPU that nobody
 * else uses while it runs (the real-driver build also takes a CTest resource lock: cmake/testing.cmake).
 *
 * On the simulated driver none of this is used: the sim's ledger counts each test's own machine. */
#ifndef FABPOOL_TESTS_HELD_H
#define FABPOOL_TESTS_HELD_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* NVML's own types, as its ABI defines them (no nvml.h is needed to build) */
typedef struct t_nvml_proc {
    unsigned int pid;
    unsigned long long used; /* bytes */
    unsigned int gpu_instance, compute_instance;
} t_nvml_proc;
typedef int (*t_nvml_init_fn)(void);
typedef int (*t_nvml_by_uuid_fn)(const char *, void **);
typedef int (*t_nvml_procs_fn)(void *, unsigned int *, t_nvml_proc *);

static struct {
    int tried, ok, warned;
    t_nvml_by_uuid_fn by_uuid;
    t_nvml_procs_fn procs;
} t_nvml;

static inline int t_nvml_load(void)
{
    if (t_nvml.tried)
        return t_nvml.ok;
    t_nvml.tried = 1;
    if (getenv("FABPOOL_TEST_NO_NVML"))
        return 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    t_nvml_init_fn init = (t_nvml_init_fn)dlsym(lib, "nvmlInit_v2");
    t_nvml.by_uuid = (t_nvml_by_uuid_fn)dlsym(lib, "nvmlDeviceGetHandleByUUID");
    t_nvml.procs = (t_nvml_procs_fn)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    t_nvml.ok = init && t_nvml.by_uuid && t_nvml.procs && init() == 0;
    return t_nvml.ok;
}

/* 1 if pid is `root` or a descendant of it (its parent chain in /proc reaches root) */
static inline int t_pid_under(unsigned pid, unsigned root)
{
    for (int depth = 0; depth < 64 && pid > 1; depth++) {
        if (pid == root)
            return 1;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%u/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            return 0;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
        unsigned ppid;
        char state;
        if (!rp || sscanf(rp + 1, " %c %u", &state, &ppid) != 2)
            return 0;
        pid = ppid;
    }
    return 0;
}

/* Device memory in use, in bytes: by this process and its descendants where NVML answers (*whole = 0), else
 * by the whole device (*whole = 1). Compare two readings; the absolute value includes the context's own. */
static inline int64_t t_used_bytes(CUdevice dev, int *whole)
{
    *whole = 1;
    if (t_nvml_load()) {
        CUuuid u;
        char id[64];
        void *h;
        if (cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS) {
            const unsigned char *b = (const unsigned char *)u.bytes;
            snprintf(id, sizeof id, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                     b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
            if (t_nvml.by_uuid(id, &h) == 0) {
                /* room for twice the entries asked for: a newer NVML with a longer record stays in bounds */
                static t_nvml_proc procs[512];
                unsigned n = 256;
                if (t_nvml.procs(h, &n, procs) == 0) {
                    int64_t sum = 0;
                    int self = 0;
                    unsigned me = (unsigned)getpid();
                    for (unsigned i = 0; i < n && i < 256; i++)
                        if (t_pid_under(procs[i].pid, me)) {
                            sum += (int64_t)procs[i].used;
                            self |= procs[i].pid == me;
                        }
                    if (self) {
                        *whole = 0;
                        return sum;
                    }
                }
            }
        }
    }
    if (!t_nvml.warned) {
        t_nvml.warned = 1;
        fprintf(stderr, "held.h: NVML does not list this process's memory; measuring the whole device's "
                        "(the test needs a GPU that no other process uses meanwhile)\n");
    }
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return (int64_t)t - (int64_t)f;
}

#endif
