/* fabpool_bench: allocation latency and buffer growth, fabpool side by side
 * with what users would pick instead, in one run, in turns, with warm-up.
 *
 *   fabpool_bench [--quick] [--json FILE] [--workload latency|growth|all]
 *
 * The alternatives are reached through the same driver library fabpool
 * loads ($FABPOOL_CUDA_LIBRARY or libcuda.so.1): cuMemAlloc/cuMemFree (what
 * cudaMalloc is), cuMemAllocAsync/cuMemFreeAsync on the device's default pool
 * with the release threshold raised (what cudaMallocAsync is), and the
 * per-buffer VMM pattern of HybridEP with its leak fixed.  Times mean
 * something only on a real GPU; on the simulated driver this is a smoke run. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabpool.h"

/* ------------------------------------------------------------ driver */

static struct {
    CUresult (*init)(unsigned);
    CUresult (*dev_get)(CUdevice *, int);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_set)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*meminfo)(size_t *, size_t *);
    int sim;
    const char *path;
} cu;

static int load_driver(void)
{
    const char *path = getenv("FABPOOL_CUDA_LIBRARY");
    cu.path = path && *path ? path : "libcuda.so.1";
    void *l = dlopen(cu.path, RTLD_NOW | RTLD_LOCAL);
    if (!l)
        return -1;
#define SYM(f, n) *(void **)&cu.f = dlsym(l, n)
    SYM(init, "cuInit");
    SYM(dev_get, "cuDeviceGet");
    SYM(ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(alloc, "cuMemAlloc_v2");
    SYM(free, "cuMemFree_v2");
    SYM(alloc_async, "cuMemAllocAsync");
    SYM(free_async, "cuMemFreeAsync");
    SYM(stream_sync, "cuStreamSynchronize");
    SYM(default_pool, "cuDeviceGetDefaultMemPool");
    SYM(pool_set, "cuMemPoolSetAttribute");
    SYM(create, "cuMemCreate");
    SYM(release, "cuMemRelease");
    SYM(reserve, "cuMemAddressReserve");
    SYM(addr_free, "cuMemAddressFree");
    SYM(map, "cuMemMap");
    SYM(unmap, "cuMemUnmap");
    SYM(set_access, "cuMemSetAccess");
    SYM(meminfo, "cuMemGetInfo_v2");
#undef SYM
    cu.sim = dlsym(l, "fabsim_get_ledger") != NULL;
    CUdevice d;
    CUcontext c;
    if (!cu.init || cu.init(0) || cu.dev_get(&d, 0) || cu.ctx_retain(&c, d) || cu.ctx_set(c))
        return -1;
    return 0;
}

/* ------------------------------------------------------------ timing */

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct summary {
    double median, p99, p999;
    int n;
} summary;

static summary summarize(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    summary s = {v[n / 2], v[(int)((double)n * 0.99)], v[(int)((double)n * 0.999) < n ? (int)((double)n * 0.999) : n - 1], n};
    return s;
}

static FILE *json;
static int json_first = 1;

static void report(const char *workload, const char *alloc, const char *what, summary s, double ref)
{
    if (ref > 0)
        printf("  %-34s %-14s %12.1f %12.1f %12.1f %9.1fx\n", alloc, what, s.median, s.p99, s.p999, s.median / ref);
    else
        printf("  %-34s %-14s %12.1f %12.1f %12.1f\n", alloc, what, s.median, s.p99, s.p999);
    if (json) {
        fprintf(json, "%s{\"workload\":\"%s\",\"allocator\":\"%s\",\"case\":\"%s\",\"median\":%.3f,\"p99\":%.3f,"
                      "\"p999\":%.3f,\"samples\":%d,\"ratio_to_fabpool\":%.3f}",
                json_first ? "" : ",\n", workload, alloc, what, s.median, s.p99, s.p999, s.n,
                ref > 0 ? s.median / ref : 1.0);
        json_first = 0;
    }
}

/* ------------------------------------------------------------ latency */

#define BATCH 64

typedef struct allocator {
    const char *name;
    int (*pair)(void *ctx, size_t size, int n); /* n alloc+free pairs; 0 on success */
    void *ctx;
} allocator;

static int fab_pair(void *ctx, size_t size, int n)
{
    fabpool_t *p = ctx;
    for (int i = 0; i < n; i++) {
        void *a;
        if (fabpool_alloc(p, size, &a) != FABPOOL_OK || fabpool_free(p, a) != FABPOOL_OK)
            return -1;
    }
    return 0;
}

static int cumem_pair(void *ctx, size_t size, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        CUdeviceptr a;
        if (cu.alloc(&a, size) || cu.free(a))
            return -1;
    }
    return 0;
}

static int async_pair(void *ctx, size_t size, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        CUdeviceptr a;
        if (cu.alloc_async(&a, size, NULL) || cu.free_async(a, NULL))
            return -1;
    }
    return 0;
}

static void latency(fabpool_t *pool, int quick)
{
    static const size_t sizes[] = {256, 4096, 65536, 1 << 20, 16 << 20, 256 << 20};
    allocator al[] = {{"fabpool", fab_pair, pool},
                      {"cuMemAllocAsync (cudaMallocAsync)", async_pair, NULL},
                      {"cuMemAlloc (cudaMalloc)", cumem_pair, NULL}};
    int nal = 3;
    if (cu.default_pool && cu.pool_set) {
        CUmemoryPool mp;
        CUdevice d;
        cu.dev_get(&d, 0);
        if (cu.default_pool(&mp, d) == CUDA_SUCCESS) {
            cuuint64_t thr = UINT64_MAX;
            cu.pool_set(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
        }
    }
    printf("\nlatency: one alloc + free of a cached size, one thread, ns a pair (batches of %d)\n", BATCH);
    printf("  %-34s %-14s %12s %12s %12s %10s\n", "allocator", "size", "median", "p99", "p99.9", "vs fabpool");
    int samples = quick ? 50 : 2000;
    double *v = malloc(sizeof(double) * (size_t)samples);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t size = sizes[si];
        double ref = 0;
        for (int a = 0; a < nal; a++) {
            int reps = size >= (16 << 20) && a == 2 ? 1 : BATCH;
            int n = a == 2 && size >= (16 << 20) ? (quick ? 5 : 50) : samples;
            if (al[a].pair(al[a].ctx, size, reps)) { /* warm-up, and: does it work at all */
                printf("  %-34s %-14zu failed\n", al[a].name, size);
                continue;
            }
            for (int i = 0; i < n; i++) {
                double t0 = now_ns();
                al[a].pair(al[a].ctx, size, reps);
                v[i] = (now_ns() - t0) / reps;
            }
            summary s = summarize(v, n);
            char what[32];
            snprintf(what, sizeof what, "%zu B", size);
            if (a == 0)
                ref = s.median;
            report("latency", al[a].name, what, s, a ? ref : 0);
        }
    }
    free(v);
}

/* ------------------------------------------------------------ growth */

/* HybridEP's pattern, leak fixed: one reservation, one create, one map per
 * buffer; a bigger buffer means freeing it all and allocating anew. */
typedef struct vmm_buf {
    CUdeviceptr va;
    size_t size;
} vmm_buf;

static int vmm_alloc(vmm_buf *b, size_t size)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cu.reserve(&b->va, size, 0, 0, 0) || cu.create(&h, size, &prop, 0) || cu.map(b->va, size, 0, h, 0) ||
        cu.set_access(b->va, size, &acc, 1) || cu.release(h))
        return -1;
    b->size = size;
    return 0;
}

static void vmm_free(vmm_buf *b)
{
    cu.unmap(b->va, b->size);
    cu.addr_free(b->va, b->size);
    b->size = 0;
}

static void growth(fabpool_t *pool, int quick)
{
    size_t from = 256u << 20, to = quick ? (size_t)1 << 30 : (size_t)4 << 30, step = 16u << 20;
    int nsteps = (int)((to - from) / step);
    printf("\ngrowth: one dispatch buffer from %zu MiB to %zu MiB in %zu MiB steps, us a step\n", from >> 20,
           to >> 20, step >> 20);
    printf("  %-34s %-14s %12s %12s %12s %10s\n", "allocator", "", "median", "p99", "p99.9", "vs fabpool");
    double *v = malloc(sizeof(double) * (size_t)nsteps);
    /* fabpool: one buffer, resized in place */
    fabpool_buffer_t *b;
    fabpool_stats s0, s1;
    fabpool_get_stats(pool, &s0);
    double t_all = now_ns();
    if (fabpool_buffer_create(pool, to, from, &b) != FABPOOL_OK) {
        printf("  fabpool: %s\n", fabpool_last_error());
        free(v);
        return;
    }
    void *base = fabpool_buffer_ptr(b);
    int moved = 0;
    for (int i = 0; i < nsteps; i++) {
        double t0 = now_ns();
        fabpool_buffer_resize(b, from + (size_t)(i + 1) * step, NULL);
        v[i] = (now_ns() - t0) / 1000.0;
        moved += fabpool_buffer_ptr(b) != base;
    }
    double amortized = (now_ns() - t_all) / 1000.0 / nsteps;
    fabpool_get_stats(pool, &s1);
    summary fs = summarize(v, nsteps);
    report("growth", "fabpool", "per step", fs, 0);
    printf("  %-34s amortized %.1f us a step; %" PRIu64 " chunks; peak mapped / live %.3f; base moved %d times\n",
           "", amortized, s1.chunks_mapped_total - s0.chunks_mapped_total,
           (double)s1.mapped_bytes_peak / (double)to, moved);
    if (json) {
        fprintf(json, ",\n{\"workload\":\"growth\",\"allocator\":\"fabpool\",\"case\":\"amortized\",\"us_per_step\":%.3f,"
                      "\"chunks\":%" PRIu64 ",\"peak_over_live\":%.4f,\"base_moves\":%d}",
                amortized, s1.chunks_mapped_total - s0.chunks_mapped_total, (double)s1.mapped_bytes_peak / (double)to,
                moved);
    }
    fabpool_buffer_destroy(b, NULL);

    /* HybridEP's pattern: free everything, allocate the new size */
    vmm_buf vb = {0, 0};
    if (vmm_alloc(&vb, from) == 0) {
        for (int i = 0; i < nsteps; i++) {
            double t0 = now_ns();
            vmm_free(&vb);
            if (vmm_alloc(&vb, from + (size_t)(i + 1) * step)) {
                printf("  hybridep pattern failed at step %d\n", i);
                nsteps = i;
                break;
            }
            v[i] = (now_ns() - t0) / 1000.0;
        }
        vmm_free(&vb);
        if (nsteps > 0)
            report("growth", "HybridEP per-buffer VMM (fixed)", "per step", summarize(v, nsteps), fs.median);
    }
    /* cudaMalloc: free, allocate anew */
    CUdeviceptr d = 0;
    if (cu.alloc(&d, from) == 0) {
        int n = (int)((to - from) / step);
        for (int i = 0; i < n; i++) {
            double t0 = now_ns();
            cu.free(d);
            if (cu.alloc(&d, from + (size_t)(i + 1) * step)) {
                n = i;
                break;
            }
            v[i] = (now_ns() - t0) / 1000.0;
        }
        cu.free(d);
        if (n > 0)
            report("growth", "cuMemAlloc (cudaMalloc)", "per step", summarize(v, n), fs.median);
    }
    free(v);
}

int main(int argc, char **argv)
{
    int quick = 0;
    const char *json_path = NULL, *workload = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--workload") && i + 1 < argc)
            workload = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--json FILE] [--workload latency|growth|all]\n", argv[0]);
            return 2;
        }
    }
    if (load_driver()) {
        fprintf(stderr, "cannot load and initialize the driver %s\n", cu.path);
        return 1;
    }
    fabpool_t *pool;
    if (fabpool_create(NULL, &pool) != FABPOOL_OK) {
        fprintf(stderr, "fabpool_create: %s\n", fabpool_last_error());
        return 1;
    }
    printf("fabpool_bench: driver %s (%s)%s\n", cu.path, cu.sim ? "simulated: times are not GPU times" : "real",
           quick ? ", quick run" : "");
    if (json_path && !(json = fopen(json_path, "w"))) {
        perror(json_path);
        return 1;
    }
    if (json)
        fprintf(json, "{\"driver\":\"%s\",\"simulated\":%d,\"results\":[\n", cu.path, cu.sim);
    if (!strcmp(workload, "all") || !strcmp(workload, "latency"))
        latency(pool, quick);
    if (!strcmp(workload, "all") || !strcmp(workload, "growth"))
        growth(pool, quick);
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    fabpool_destroy(pool);
    return 0;
}
