/* held.h - how much device memory this process holds, for the tests that run against the real driver.
 *
 * cuMemGetInfo tells how much of the whole device is free: any other process that allocates while a test runs
 * moves it, so a test that compared it before and after would fail on a GPU that others use. NVML tells each
 * process's used memory (nvmlDeviceGetComputeRunningProcesses), but on the H200 its count leaves out memory
 * that no mapping holds any more and that an open exported fd or dma-buf keeps alive, which the tests must see
 * (the driver facts of test_conformance, leaks of exported handles). So the tests read the device's used memory
 * less what NVML says every other process uses: this process and its children (the peers that multi-process
 * tests fork or exec), fd-kept memory included, whatever the other processes do. NVML is loaded at run time
 * (libnvidia-ml.so.1, part of the driver), like the driver itself.
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
#include <poll.h>
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

/* NVML's list of the processes that use the CUDA device dev: their number, or -1 where NVML cannot say. The
 * list is NVML's own records (t_nvml_proc), in a static array that the next call overwrites. */
static inline int t_nvml_list(CUdevice dev, const t_nvml_proc **out)
{
    static void *h;
    static CUdevice h_dev = -1;
    /* room for twice the entries asked for: a newer NVML with a longer record stays in bounds */
    static t_nvml_proc procs[512];
    if (!t_nvml_load())
        return -1;
    if (h_dev != dev) { /* NVML names the device by the UUID the driver gives it */
        CUuuid u;
        char id[64];
        if (cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS)
            return -1;
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(id, sizeof id, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        if (t_nvml.by_uuid(id, &h) != 0)
            return -1;
        h_dev = dev;
    }
    unsigned n = 256;
    if (t_nvml.procs(h, &n, procs) != 0)
        return -1;
    *out = procs;
    return (int)(n < 256 ? n : 256);
}

/* What NVML says every process outside this process tree uses on the device, in bytes; -1 where NVML cannot
 * say it (no NVML, or it does not list this process: its PIDs are then not ours to compare). */
static inline int64_t t_nvml_others(CUdevice dev)
{
    const t_nvml_proc *procs;
    int n = t_nvml_list(dev, &procs);
    if (n < 0)
        return -1;
    int64_t others = 0;
    int self = 0;
    unsigned me = (unsigned)getpid();
    for (int i = 0; i < n; i++) {
        if (t_pid_under(procs[i].pid, me))
            self |= procs[i].pid == me;
        else
            others += (int64_t)procs[i].used;
    }
    return self ? others : -1;
}

/* Device memory in use on dev, in bytes, less what NVML says the processes outside this process tree use: what
 * this process and its children hold, including memory that no process maps any more but that one of them keeps
 * alive (an open exported fd or dma-buf, which NVML's per-process count leaves out). The device's used memory
 * (cuMemGetInfo, in a context of dev, which must be current) is read between two NVML readings that agree, so
 * that another process's allocation in between is not counted. *whole = 1 where NVML cannot say: then it is
 * the whole device's use. Compare two readings; the value includes the contexts' own memory. */
static inline int64_t t_used_bytes(CUdevice dev, int *whole)
{
    size_t f = 0, t = 0;
    for (int tries = 0; tries < 200; tries++) {
        int64_t before = t_nvml_others(dev);
        if (before < 0)
            break;
        cuMemGetInfo(&f, &t);
        if (t_nvml_others(dev) == before) {
            *whole = 0;
            return (int64_t)t - (int64_t)f - before;
        }
        poll(NULL, 0, 1); /* another process allocated or freed meanwhile: read again after 1 ms */
    }
    *whole = 1;
    if (!t_nvml.warned) {
        t_nvml.warned = 1;
        fprintf(stderr, "held.h: NVML cannot tell other processes' memory here; measuring the whole device's "
                        "(the test needs a GPU that no other process uses meanwhile)\n");
    }
    cuMemGetInfo(&f, &t);
    return (int64_t)t - (int64_t)f;
}

#endif
