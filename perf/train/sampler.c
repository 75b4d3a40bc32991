/* sampler.c - what the driver holds for a device, sampled from a C thread
 * (libfabpool_sampler.so, loaded by perf/train/train_bench.py with ctypes).
 *
 * The training benchmark measures every allocator's peak the same way: the
 * device's free memory (cuMemGetInfo) at the start less its minimum.  A
 * Python thread that samples every millisecond takes the GIL from the
 * training loop every millisecond, and the loop is bound by Python's launch
 * overhead, so it slowed every step and made step times noisy.  This thread
 * never touches Python.
 *
 *   fabpool_sampler_start(device, period_us)   0, or -1 (no driver, no context, a sampler already running)
 *   fabpool_sampler_stop(&base, &min, &n)      the first sample, the least free memory, the sample count
 *   fabpool_sampler_count()                    samples so far (0: not running)
 *   fabpool_sampler_cost(&total_ns, &max_ns)   what the samples cost: cuMemGetInfo's time, summed and the most
 *                                              (of the last run, once stopped)
 *
 * The driver is the one the process has loaded (dlopen of libcuda.so.1 finds
 * it); the thread makes the device's primary context current. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_dev_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_release_t)(int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_meminfo_t)(size_t *, size_t *);

static struct {
    cu_init_t init;
    cu_dev_get_t dev_get;
    cu_ctx_retain_t retain;
    cu_ctx_release_t release;
    cu_ctx_set_t set;
    cu_meminfo_t meminfo;
} cu;

static pthread_t thread;
static atomic_int running, stop;
static int dev;
static void *ctx;
static unsigned period_us;
static uint64_t base_free, min_free;
static atomic_ullong samples;
static atomic_int failed;
static uint64_t cost_total_ns, cost_max_ns; /* the sampling thread's alone until it is joined */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *sample_loop(void *arg)
{
    (void)arg;
    size_t f = 0, t = 0;
    if (cu.set(ctx) || cu.meminfo(&f, &t)) {
        atomic_store(&failed, 1);
        return NULL;
    }
    base_free = min_free = f; /* the baseline: fabpool_sampler_start returns once it is taken */
    atomic_store(&samples, 1);
    struct timespec ts = {(time_t)(period_us / 1000000u), (long)(period_us % 1000000u) * 1000L};
    while (!atomic_load(&stop)) {
        nanosleep(&ts, NULL);
        uint64_t t0 = now_ns();
        int rc = cu.meminfo(&f, &t);
        uint64_t dt = now_ns() - t0;
        cost_total_ns += dt;
        if (dt > cost_max_ns)
            cost_max_ns = dt;
        if (rc == 0) {
            if (f < min_free)
                min_free = f;
            atomic_fetch_add(&samples, 1);
        }
    }
    return NULL;
}

int fabpool_sampler_start(int device, unsigned period)
{
    if (atomic_load(&running))
        return -1;
    void *l = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!l)
        l = dlopen("libcuda.so.1", RTLD_NOW);
    if (!l)
        return -1;
    *(void **)&cu.init = dlsym(l, "cuInit");
    *(void **)&cu.dev_get = dlsym(l, "cuDeviceGet");
    *(void **)&cu.retain = dlsym(l, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.release = dlsym(l, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu.set = dlsym(l, "cuCtxSetCurrent");
    *(void **)&cu.meminfo = dlsym(l, "cuMemGetInfo_v2");
    if (!cu.init || !cu.dev_get || !cu.retain || !cu.release || !cu.set || !cu.meminfo)
        return -1;
    if (cu.init(0) || cu.dev_get(&dev, device) || cu.retain(&ctx, dev))
        return -1;
    period_us = period ? period : 1000;
    cost_total_ns = cost_max_ns = 0;
    atomic_store(&samples, 0);
    atomic_store(&failed, 0);
    atomic_store(&stop, 0);
    if (pthread_create(&thread, NULL, sample_loop, NULL) != 0) {
        cu.release(dev);
        return -1;
    }
    struct timespec wait = {0, 100000L};
    while (!atomic_load(&samples) && !atomic_load(&failed))
        nanosleep(&wait, NULL);
    if (atomic_load(&failed)) {
        pthread_join(thread, NULL);
        cu.release(dev);
        return -1;
    }
    atomic_store(&running, 1);
    return 0;
}

int fabpool_sampler_stop(uint64_t *base, uint64_t *least, uint64_t *n)
{
    if (!atomic_load(&running))
        return -1;
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    atomic_store(&running, 0);
    cu.release(dev);
    *base = base_free;
    *least = min_free;
    *n = atomic_load(&samples);
    return 0;
}

uint64_t fabpool_sampler_count(void) { return atomic_load(&running) ? (uint64_t)atomic_load(&samples) : 0; }

int fabpool_sampler_cost(uint64_t *total_ns, uint64_t *max_ns)
{
    if (atomic_load(&running))
        return -1; /* the thread still writes them */
    *total_ns = cost_total_ns;
    *max_ns = cost_max_ns;
    return 0;
}
