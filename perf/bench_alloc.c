/* bench_alloc.c - the driver and the allocators fabpool_bench compares.
 *
 * Every allocator but PyTorch's is reached through the driver library that
 * fabpool itself loads ($FABPOOL_CUDA_LIBRARY or libcuda.so.1).  PyTorch's
 * caching allocator lives in libfabpool_bench_torch.so (perf/torch_backend.cpp)
 * and runs in child processes of the bench, one per PYTORCH_CUDA_ALLOC_CONF
 * setting, because that setting is read once, when the allocator starts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "torch_load.h"

bdriver cu;
balloc allocs[A_MAX];

double bench_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int bench_load_driver(void)
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
    SYM(pool_trim, "cuMemPoolTrimTo");
    SYM(create, "cuMemCreate");
    SYM(release, "cuMemRelease");
    SYM(reserve, "cuMemAddressReserve");
    SYM(addr_free, "cuMemAddressFree");
    SYM(map, "cuMemMap");
    SYM(unmap, "cuMemUnmap");
    SYM(set_access, "cuMemSetAccess");
    SYM(retain, "cuMemRetainAllocationHandle");
    SYM(export_fd, "cuMemExportToShareableHandle");
    SYM(import_fd, "cuMemImportFromShareableHandle");
    SYM(meminfo, "cuMemGetInfo_v2");
    SYM(sim_calls, "fabsim_calls");
#undef SYM
    cu.sim = cu.sim_calls != NULL;
    if (!cu.init || !cu.dev_get || !cu.ctx_retain || !cu.ctx_set || !cu.alloc || !cu.free || !cu.create ||
        !cu.map || !cu.meminfo)
        return -1;
    if (cu.init(0) || cu.dev_get(&cu.dev, 0) || cu.ctx_retain(&cu.ctx, cu.dev) || cu.ctx_set(cu.ctx))
        return -1;
    return 0;
}

uint64_t bench_device_used(void)
{
    size_t f = 0, t = 0;
    if (cu.meminfo(&f, &t) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(t - f);
}

#define OWN_CALLS(a, n) atomic_fetch_add_explicit((_Atomic uint64_t *)&(a)->own_calls, (n), memory_order_relaxed)

static uint64_t own_calls(balloc *a)
{
    return atomic_load((_Atomic uint64_t *)&a->own_calls);
}

static uint64_t no_figure(balloc *a)
{
    (void)a;
    return UINT64_MAX;
}


typedef int (*alloc_fn)(balloc *, size_t, void **);
typedef int (*free_fn)(balloc *, void *);
typedef void (*void_fn)(balloc *);
typedef uint64_t (*fig_fn)(balloc *);

static void set_ops(balloc *a, alloc_fn al, free_fn fr, void_fn cold, fig_fn calls, fig_fn held)
{
    a->alloc = al;
    a->free = fr;
    a->cold = cold;
    a->release = cold;
    a->calls = calls;
    a->held = held;
}

/* ---------------------------------------------------------------- fabpool */

static int fab_alloc(balloc *a, size_t n, void **p)
{
    return fabpool_alloc(a->pool, n, p) == FABPOOL_OK ? 0 : -1;
}

static int fab_free(balloc *a, void *p)
{
    return fabpool_free(a->pool, p) == FABPOOL_OK ? 0 : -1;
}

static void fab_cold(balloc *a)
{
    fabpool_trim(a->pool, 0);
}

static uint64_t fab_calls(balloc *a)
{
    static fabpool_stats s = {.struct_size = sizeof s}; /* large; called from one thread at a time */
    if (fabpool_get_stats(a->pool, &s) != FABPOOL_OK)
        return UINT64_MAX;
    uint64_t n = 0;
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS; i++)
        n += s.driver_calls[i];
    if (a->peer_pool && fabpool_get_stats(a->peer_pool, &s) == FABPOOL_OK)
        for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS; i++)
            n += s.driver_calls[i];
    return n;
}

static uint64_t fab_maps(balloc *a)
{
    fabpool_counters k = {.struct_size = sizeof k};
    if (fabpool_get_counters(a->pool, &k) != FABPOOL_OK)
        return UINT64_MAX;
    return k.chunks_mapped_total + k.chunks_unmapped_total;
}

static uint64_t fab_held(balloc *a)
{
    static fabpool_stats s = {.struct_size = sizeof s};
    if (fabpool_get_stats(a->pool, &s) != FABPOOL_OK)
        return UINT64_MAX;
    return s.mapped_bytes;
}

/* ------------------------------------------------------- cuMemAllocAsync */

static CUmemoryPool async_pool;

static int async_alloc(balloc *a, size_t n, void **p)
{
    CUdeviceptr d;
    OWN_CALLS(a, 1);
    if (cu.alloc_async(&d, n, NULL)) {
        /* out of memory with the pool's cache full: give the cache back and
         * try once more, as a cudaMallocAsync user (or PyTorch) would */
        OWN_CALLS(a, 3);
        cu.stream_sync(NULL);
        cu.pool_trim(async_pool, 0);
        if (cu.alloc_async(&d, n, NULL))
            return -1;
    }
    *p = (void *)(uintptr_t)d;
    return 0;
}

static int async_free(balloc *a, void *p)
{
    OWN_CALLS(a, 1);
    return cu.free_async((CUdeviceptr)(uintptr_t)p, NULL) ? -1 : 0;
}

static void async_cold(balloc *a)
{
    OWN_CALLS(a, 2);
    cu.stream_sync(NULL);
    cu.pool_trim(async_pool, 0);
}

/* ------------------------------------------------------------- cuMemAlloc */

static int cumem_alloc(balloc *a, size_t n, void **p)
{
    CUdeviceptr d;
    OWN_CALLS(a, 1);
    if (cu.alloc(&d, n))
        return -1;
    *p = (void *)(uintptr_t)d;
    return 0;
}

static int cumem_free(balloc *a, void *p)
{
    OWN_CALLS(a, 1);
    return cu.free((CUdeviceptr)(uintptr_t)p) ? -1 : 0;
}

/* ------------------------------------------------ HybridEP per-buffer VMM */

/* HybridEP's allocator (csrc/hybrid_ep/allocator) with its leak fixed: every
 * buffer is a reservation of its own, one cuMemCreate of the whole size
 * rounded to the granularity, one map, one set-access, and the handle
 * released right after the map; freeing unmaps and frees the reservation.
 * The sizes of live buffers are kept in an open-addressing table. */
typedef struct hyb_entry {
    uintptr_t va;
    size_t size;
} hyb_entry;

static struct {
    pthread_mutex_t lock;
    hyb_entry *tab;
    size_t cap, n;
    uint64_t held;
} hyb = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

static size_t hyb_slot(uintptr_t va, size_t cap)
{
    return (size_t)((va >> 21) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

static int hyb_put(uintptr_t va, size_t size)
{
    if ((hyb.n + 1) * 2 > hyb.cap) {
        size_t nc = hyb.cap ? hyb.cap * 2 : 1024;
        hyb_entry *nt = calloc(nc, sizeof *nt);
        if (!nt)
            return -1;
        for (size_t i = 0; i < hyb.cap; i++)
            if (hyb.tab[i].va) {
                size_t s = hyb_slot(hyb.tab[i].va, nc);
                while (nt[s].va)
                    s = (s + 1) & (nc - 1);
                nt[s] = hyb.tab[i];
            }
        free(hyb.tab);
        hyb.tab = nt;
        hyb.cap = nc;
    }
    size_t s = hyb_slot(va, hyb.cap);
    while (hyb.tab[s].va)
        s = (s + 1) & (hyb.cap - 1);
    hyb.tab[s].va = va;
    hyb.tab[s].size = size;
    hyb.n++;
    return 0;
}

static size_t hyb_take(uintptr_t va)
{
    if (!hyb.cap)
        return 0;
    size_t s = hyb_slot(va, hyb.cap);
    while (hyb.tab[s].va && hyb.tab[s].va != va)
        s = (s + 1) & (hyb.cap - 1);
    if (!hyb.tab[s].va)
        return 0;
    size_t size = hyb.tab[s].size;
    hyb.tab[s].va = 0;
    hyb.n--;
    /* re-insert the rest of the cluster */
    for (size_t j = (s + 1) & (hyb.cap - 1); hyb.tab[j].va; j = (j + 1) & (hyb.cap - 1)) {
        hyb_entry e = hyb.tab[j];
        hyb.tab[j].va = 0;
        size_t k = hyb_slot(e.va, hyb.cap);
        while (hyb.tab[k].va)
            k = (k + 1) & (hyb.cap - 1);
        hyb.tab[k] = e;
    }
    return size;
}

static void hyb_prop(CUmemAllocationProp *prop, CUmemAccessDesc *acc)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = cu.dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    memset(acc, 0, sizeof *acc);
    acc->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc->location.id = cu.dev;
    acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

#define GRAN ((size_t)2 << 20)

static int hyb_alloc(balloc *a, size_t n, void **p)
{
    size_t size = (n + GRAN - 1) & ~(GRAN - 1);
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    hyb_prop(&prop, &acc);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    OWN_CALLS(a, 1);
    if (cu.reserve(&va, size, 0, 0, 0))
        return -1;
    OWN_CALLS(a, 1);
    if (cu.create(&h, size, &prop, 0))
        goto unreserve;
    OWN_CALLS(a, 1);
    if (cu.map(va, size, 0, h, 0))
        goto release;
    OWN_CALLS(a, 1);
    if (cu.set_access(va, size, &acc, 1))
        goto unmap;
    OWN_CALLS(a, 1);
    cu.release(h); /* the fix: the mapping alone keeps the memory */
    pthread_mutex_lock(&hyb.lock);
    int bad = hyb_put((uintptr_t)va, size);
    if (!bad)
        hyb.held += size;
    pthread_mutex_unlock(&hyb.lock);
    if (bad) {
        cu.unmap(va, size);
        cu.addr_free(va, size);
        return -1;
    }
    *p = (void *)(uintptr_t)va;
    return 0;
unmap:
    cu.unmap(va, size);
release:
    cu.release(h);
unreserve:
    cu.addr_free(va, size);
    return -1;
}

static int hyb_free(balloc *a, void *p)
{
    pthread_mutex_lock(&hyb.lock);
    size_t size = hyb_take((uintptr_t)p);
    hyb.held -= size;
    pthread_mutex_unlock(&hyb.lock);
    if (!size)
        return -1;
    OWN_CALLS(a, 2);
    int bad = cu.unmap((CUdeviceptr)(uintptr_t)p, size) != CUDA_SUCCESS;
    bad |= cu.addr_free((CUdeviceptr)(uintptr_t)p, size) != CUDA_SUCCESS;
    return bad ? -1 : 0;
}

static uint64_t hyb_held(balloc *a)
{
    (void)a;
    pthread_mutex_lock(&hyb.lock);
    uint64_t h = hyb.held;
    pthread_mutex_unlock(&hyb.lock);
    return h;
}

/* HybridEP's sharing, per buffer: export the whole buffer's handle as an fd,
 * and on the peer import it, reserve, map, set access (what open_handle
 * does), releasing every handle (the fix).  The peer here is this process. */
int bench_hyb_share(balloc *a, void *ptr, size_t n, uintptr_t *peer_va, size_t *peer_size)
{
    size_t size = (n + GRAN - 1) & ~(GRAN - 1);
    CUmemGenericAllocationHandle h = 0, imp = 0;
    int fd = -1;
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    hyb_prop(&prop, &acc);
    OWN_CALLS(a, 3);
    if (cu.retain(&h, ptr))
        return -1;
    CUresult e = cu.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    cu.release(h);
    if (e)
        return -1;
    OWN_CALLS(a, 1);
    e = cu.import_fd(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (e)
        return -1;
    CUdeviceptr va = 0;
    OWN_CALLS(a, 4);
    if (cu.reserve(&va, size, 0, 0, 0)) {
        cu.release(imp);
        return -1;
    }
    if (cu.map(va, size, 0, imp, 0)) {
        cu.release(imp);
        cu.addr_free(va, size);
        return -1;
    }
    cu.release(imp);
    if (cu.set_access(va, size, &acc, 1)) {
        cu.unmap(va, size);
        cu.addr_free(va, size);
        return -1;
    }
    *peer_va = (uintptr_t)va;
    *peer_size = size;
    return 0;
}

void bench_hyb_unshare(balloc *a, uintptr_t va, size_t size)
{
    OWN_CALLS(a, 2);
    cu.unmap((CUdeviceptr)va, size);
    cu.addr_free((CUdeviceptr)va, size);
}

/* ---------------------------------------------------------------- PyTorch */

static fbt_api tb;

static int torch_alloc(balloc *a, size_t n, void **p)
{
    (void)a;
    return tb.alloc(n, p, NULL, 0);
}

static int torch_free(balloc *a, void *p)
{
    (void)a;
    tb.del(p);
    return 0;
}

static void torch_cold(balloc *a)
{
    (void)a;
    tb.empty_cache();
}

static uint64_t torch_held(balloc *a)
{
    (void)a;
    uint64_t cur = 0, peak = 0;
    tb.reserved(&cur, &peak);
    return cur;
}

static int load_torch(const char *self, char *err, size_t cap)
{
    return fbt_load(self, &tb, err, cap);
}

/* The parent's side of a PyTorch column: a child process of this very
 * program, in --child mode, with PYTORCH_CUDA_ALLOC_CONF set (or unset). */
static void spawn_child(balloc *a, const char *self, int kind)
{
    static char why[A_MAX][300];
    char probe[300];
    char buf[4200];
    if (access(fbt_path(self, buf, sizeof buf), R_OK) != 0) {
        snprintf(why[kind], sizeof why[kind], "PyTorch not present (libfabpool_bench_torch.so was not built: "
                                              "no torch found when configuring)");
        a->unavailable = why[kind];
        return;
    }
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) {
        snprintf(why[kind], sizeof why[kind], "pipe: %s", strerror(errno));
        a->unavailable = why[kind];
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        fcntl(down[0], F_SETFD, 0); /* the child's own ends survive the exec, no other */
        fcntl(up[1], F_SETFD, 0);
        dup2(2, 1); /* the child's prints go to stderr, the table stays clean */
        if (a->child_conf && *a->child_conf) {
            setenv("PYTORCH_CUDA_ALLOC_CONF", a->child_conf, 1);
            setenv("PYTORCH_ALLOC_CONF", a->child_conf, 1);
        } else {
            unsetenv("PYTORCH_CUDA_ALLOC_CONF");
            unsetenv("PYTORCH_ALLOC_CONF");
        }
        char k[16], fi[16], fo[16];
        snprintf(k, sizeof k, "%d", kind);
        snprintf(fi, sizeof fi, "%d", down[0]);
        snprintf(fo, sizeof fo, "%d", up[1]);
        execl("/proc/self/exe", self, "--child", k, fi, fo, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    if (pid < 0) {
        close(down[1]);
        close(up[0]);
        snprintf(why[kind], sizeof why[kind], "fork: %s", strerror(errno));
        a->unavailable = why[kind];
        return;
    }
    a->child_pid = pid;
    a->child_in = up[0];
    a->child_out = down[1];
    /* the child answers its start with a status and a message */
    int st = -1;
    memset(probe, 0, sizeof probe);
    if (read(a->child_in, &st, sizeof st) != (ssize_t)sizeof st ||
        read(a->child_in, probe, sizeof probe) != (ssize_t)sizeof probe)
        snprintf(probe, sizeof probe, "the PyTorch child process died at start");
    probe[sizeof probe - 1] = 0;
    if (st != 0) {
        snprintf(why[kind], sizeof why[kind], "%s", probe);
        a->unavailable = why[kind];
        close(a->child_in);
        close(a->child_out);
        waitpid(pid, NULL, 0);
        a->child_pid = 0;
    }
}

int bench_torch_local(int kind, char *msg, size_t cap)
{
    if (bench_load_driver()) {
        snprintf(msg, cap, "the PyTorch child cannot load the driver %s", cu.path);
        return -1;
    }
    int st = load_torch(NULL, msg, cap);
    if (st)
        return st;
    balloc *a = &allocs[kind];
    set_ops(a, torch_alloc, torch_free, torch_cold, no_figure, torch_held);
    a->remote = 0;
    return 0;
}

/* ------------------------------------------------------------------ setup */

static int make_pool(fabpool_t **p, const char *conf, char *err, size_t cap)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = conf;
    if (fabpool_create(&o, p) != FABPOOL_OK) {
        snprintf(err, cap, "fabpool_create(%s): %s", conf ? conf : "defaults", fabpool_last_error());
        *p = NULL;
        return -1;
    }
    return 0;
}

fabpool_t *bench_share_pool, *bench_share_peer;

static balloc *fab_column(int k, const char *key, const char *name)
{
    balloc *a = &allocs[k];
    a->key = key;
    a->name = name;
    a->cold_means = "fabpool_trim(pool, 0) before each alloc: the block's slab or span is mapped anew "
                    "(cuMemCreate + cuMemMap + cuMemSetAccess)";
    set_ops(a, fab_alloc, fab_free, fab_cold, fab_calls, fab_held);
    a->maps = fab_maps;
    a->grows_in_place = 1;
    return a;
}

int bench_setup_allocators(const char *self, int with_torch)
{
    static char err[4][300];
    balloc *a;

    a = fab_column(A_FABPOOL, "fabpool", "fabpool");
    if (make_pool(&a->pool, NULL, err[0], sizeof err[0]))
        return -1;
    /* the sharing figures: an exporting pool with POSIX fds and an importer */
    if (make_pool(&bench_share_pool, "handle_type:posix_fd", err[1], sizeof err[1]) ||
        make_pool(&bench_share_peer, "handle_type:posix_fd", err[1], sizeof err[1])) {
        fprintf(stderr, "fabpool_bench: no sharing figures: %s\n", err[1]);
        if (bench_share_pool)
            fabpool_destroy(bench_share_pool);
        bench_share_pool = NULL;
    }

    a = fab_column(A_FABPOOL_NOTC, "fabpool_notc", "fabpool thread_cache:0");
    if (make_pool(&a->pool, "thread_cache:0", err[2], sizeof err[2]))
        a->unavailable = err[2];

    a = &allocs[A_ASYNC];
    a->key = "cuMemAllocAsync";
    a->name = "cudaMallocAsync";
    a->cold_means = "cuStreamSynchronize + cuMemPoolTrimTo(default pool, 0) before each alloc";
    set_ops(a, async_alloc, async_free, async_cold, own_calls, no_figure);
    if (!cu.alloc_async || !cu.free_async || !cu.default_pool || !cu.pool_set || !cu.pool_trim ||
        cu.default_pool(&async_pool, cu.dev)) {
        a->unavailable = "the driver has no stream-ordered allocator";
    } else {
        cuuint64_t thr = UINT64_MAX; /* keep freed memory: what a tuned cudaMallocAsync user does */
        cu.pool_set(async_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
    }

    a = &allocs[A_CUMEM];
    a->key = "cuMemAlloc";
    a->name = "cudaMalloc";
    a->cold_means = "no cache: every call goes to the driver";
    set_ops(a, cumem_alloc, cumem_free, NULL, own_calls, no_figure);

    a = &allocs[A_HYBRIDEP];
    a->key = "hybridep";
    a->name = "HybridEP VMM (fixed)";
    a->cold_means = "no cache: every alloc is reserve + create + map + set access, every free unmap + free";
    set_ops(a, hyb_alloc, hyb_free, NULL, own_calls, hyb_held);
    if (!cu.reserve || !cu.addr_free || !cu.unmap || !cu.set_access || !cu.release)
        a->unavailable = "the driver has no VMM entry points";

    static const char *tkey[] = {"torch", "torch_expandable"};
    static const char *tname[] = {"PyTorch caching", "PyTorch expandable_segments"};
    static const char *tconf[] = {"", "expandable_segments:True"};
    for (int k = A_TORCH; k <= A_TORCH_EXP; k++) {
        a = &allocs[k];
        a->key = tkey[k - A_TORCH];
        a->name = tname[k - A_TORCH];
        a->cold_means = "c10::cuda::CUDACachingAllocator::emptyCache() before each alloc";
        a->remote = 1;
        a->child_conf = tconf[k - A_TORCH];
        if (with_torch)
            spawn_child(&allocs[k], self, k);
        else
            allocs[k].unavailable = "not asked for (--no-torch)";
    }
    return 0;
}

void bench_teardown_allocators(void)
{
    fflush(NULL);
    for (int k = 0; k < A_MAX; k++) /* every child sees its end of input, then is waited for */
        if (allocs[k].remote && allocs[k].child_pid) {
            close(allocs[k].child_out);
            close(allocs[k].child_in);
        }
    for (int k = 0; k < A_MAX; k++) {
        balloc *a = &allocs[k];
        if (a->remote && a->child_pid) {
            waitpid(a->child_pid, NULL, 0);
            a->child_pid = 0;
        }
        if (a->pool)
            fabpool_destroy(a->pool);
        a->pool = NULL;
    }
    if (bench_share_pool)
        fabpool_destroy(bench_share_pool);
    if (bench_share_peer)
        fabpool_destroy(bench_share_peer);
    bench_share_pool = bench_share_peer = NULL;
    free(hyb.tab);
    hyb.tab = NULL;
    hyb.cap = hyb.n = 0;
}
