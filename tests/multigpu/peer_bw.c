/* peer_bw: copy bandwidth GPU 1 <- GPU 0, three ways, in one run:
 *   mapped   a buffer of a fabpool pool on GPU 0 that gives GPU 1 access
 *            (peers:1), copied with cuMemcpyDtoDAsync in GPU 1's context into
 *            a buffer of a pool on GPU 1;
 *   view     the same from a buffer that another process (on GPU 0) exports
 *            with POSIX fds, mapped here as a view in the pool on GPU 1;
 *   peer     cuMemcpyPeerAsync between two cuMemAlloc buffers (what
 *            cudaMemcpyPeer is), with peer access enabled both ways.
 * Each size is timed with CUDA events on a stream of GPU 1 (cuEventRecord /
 * cuEventElapsedTime), the median of N runs after warm-up; it prints GB/s
 * (10^9 bytes a second) and the ratio to the peer copy, and with --json FILE
 * writes every figure.  Every copy's data is checked (its first and last MiB).
 *
 *   peer_bw [--runs N] [--sizes 64,256,1024 (MiB)] [--json FILE] [--quick]
 *
 * --quick: 64 MiB, 3 runs (the ctest smoke run on the simulated driver,
 * whose figures mean nothing).  Exits 77 with fewer than two GPUs. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fabpool.h"

#define MB (1ull << 20)
#define MAXS 16
#define CHECKW (256u * 1024) /* words checked at each end: 1 MiB */

static int errors;

#define CU(expr)                                                                                      \
    do {                                                                                              \
        CUresult r_ = (expr);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                     \
            const char *n_ = "?";                                                                     \
            cuGetErrorName(r_, &n_);                                                                  \
            fprintf(stderr, "peer_bw: %s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, n_);             \
            errors++;                                                                                 \
        }                                                                                             \
    } while (0)

#define FP(expr)                                                                                      \
    ((expr) == FABPOOL_OK ? 1                                                                         \
                          : (fprintf(stderr, "peer_bw: %s: %s\n", #expr, fabpool_last_error()), errors++, 0))

static CUcontext ctx[2];
static CUstream st1;
static CUevent ev[2];

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static uint32_t pat(uint32_t i, uint32_t seed) { return (i * 2654435761u) ^ seed; }

/* the pattern into the first and last MiB of a buffer (current context) */
static void fill(CUdeviceptr p, size_t size, uint32_t seed)
{
    static uint32_t h[CHECKW];
    for (uint32_t i = 0; i < CHECKW; i++)
        h[i] = pat(i, seed);
    CU(cuMemcpyHtoD(p, h, sizeof h));
    CU(cuMemcpyHtoD(p + size - sizeof h, h, sizeof h));
    CU(cuCtxSynchronize());
}

static int check(CUdeviceptr p, size_t size, uint32_t seed, const char *what)
{
    static uint32_t h[CHECKW];
    int ok = 1;
    for (int end = 0; end < 2; end++) {
        memset(h, 0, sizeof h);
        CU(cuMemcpyDtoH(h, end ? p + size - sizeof h : p, sizeof h));
        for (uint32_t i = 0; i < CHECKW && ok; i++)
            ok = h[i] == pat(i, seed);
    }
    if (!ok) {
        fprintf(stderr, "peer_bw: %s: the copied data differs from the source\n", what);
        errors++;
    }
    return ok;
}

/* median ms of `runs` copies of size bytes (kind 0: DtoD in GPU 1's context,
 * 1: cuMemcpyPeer), on GPU 1's stream; 0 if nothing could be timed */
static float time_copy(int kind, CUdeviceptr dst, CUdeviceptr src, size_t size, int runs)
{
    float t[64];
    int n = 0;
    CU(cuCtxSetCurrent(ctx[1]));
    for (int r = -2; r < runs; r++) { /* two warm-up copies */
        CUresult a = cuEventRecord(ev[0], st1);
        CUresult c = kind == 0 ? cuMemcpyDtoDAsync(dst, src, size, st1)
                               : cuMemcpyPeerAsync(dst, ctx[1], src, ctx[0], size, st1);
        CUresult b = cuEventRecord(ev[1], st1);
        CUresult s = cuEventSynchronize(ev[1]);
        float ms = 0;
        CUresult e = cuEventElapsedTime(&ms, ev[0], ev[1]);
        if (a || b || c || s || e) {
            const char *nm = "?";
            cuGetErrorName(c ? c : a ? a : b ? b : s ? s : e, &nm);
            fprintf(stderr, "peer_bw: %s copy of %zu MiB: %s\n", kind ? "peer" : "mapped", size >> 20, nm);
            errors++;
            return 0;
        }
        if (r >= 0 && n < 64)
            t[n++] = ms;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_f);
    return n ? t[n / 2] : 0;
}

static double gbps(size_t size, float ms) { return ms > 0 ? (double)size / (ms * 1e-3) / 1e9 : 0; }

/* ---------------------------------------------------------------- exporter process (GPU 0) */

static int exporter(const char *name, size_t max)
{
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
        return 2;
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_POSIX_FD;
    fabpool_t *p = NULL;
    fabpool_buffer_t *b = NULL;
    int s = -1;
    if (!FP(fabpool_create(&o, &p)) || !FP(fabpool_buffer_create(p, max, max, &b)) ||
        !FP(fabpool_fd_connect(name, &s, 10000)))
        return 3;
    fill((CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(b), max, 0xe0e0u);
    static uint8_t desc[1 << 16];
    int fds[256];
    size_t len, nfds, n, l;
    if (!FP(fabpool_buffer_export(b, 0, desc, sizeof desc, &len, fds, 256, &nfds)) ||
        !FP(fabpool_fd_send(s, fds, nfds, desc, len)))
        return 4;
    fabpool_buffer_export_done(b);
    char done[8];
    fabpool_fd_recv(s, NULL, 0, &n, done, sizeof done, &l); /* the measurer is done with the view */
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    fabpool_buffer_destroy(b, NULL);
    fabpool_destroy(p);
    close(s);
    return errors ? 1 : 0;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--exporter") == 0)
        return exporter(argv[2], (size_t)strtoull(argv[3], NULL, 10));
    size_t sizes[MAXS] = {64 * MB, 256 * MB, 1024 * MB};
    int nsizes = 3, runs = 20;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            sizes[0] = 64 * MB;
            nsizes = 1;
            runs = 3;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1 || runs > 64) {
                fprintf(stderr, "peer_bw: --runs takes 1 to 64\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *t = strtok(argv[++i], ","); t && nsizes < MAXS; t = strtok(NULL, ","))
                sizes[nsizes++] = (size_t)strtoull(t, NULL, 10) * MB;
            for (int k = 0; k < nsizes; k++)
                if (sizes[k] < 2 * MB || sizes[k] % (2 * MB)) {
                    fprintf(stderr, "peer_bw: sizes are MiB, multiples of 2\n");
                    return 2;
                }
        } else {
            fprintf(stderr, "usage: peer_bw [--runs N] [--sizes MiB,MiB,...] [--json FILE] [--quick]\n");
            return 2;
        }
    }
    CUdevice d[2];
    int n = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS) {
        fprintf(stderr, "peer_bw: no CUDA driver\n");
        return 2;
    }
    if (n < 2) {
        printf("peer_bw: %d GPU%s: needs two: skipped\n", n, n == 1 ? "" : "s");
        return 77;
    }
    int sim = dlsym(RTLD_DEFAULT, "fabsim_get_ledger") != NULL;
    char name0[128] = "", name1[128] = "";
    for (int i = 0; i < 2; i++) {
        CU(cuDeviceGet(&d[i], i));
        CU(cuDevicePrimaryCtxRetain(&ctx[i], d[i]));
    }
    cuDeviceGetName(name0, sizeof name0, d[0]);
    cuDeviceGetName(name1, sizeof name1, d[1]);
    int can = 0;
    CU(cuDeviceCanAccessPeer(&can, d[1], d[0]));
    if (!can) {
        printf("peer_bw: GPU 1 cannot access GPU 0 (cuDeviceCanAccessPeer 0): skipped\n");
        return 77;
    }
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuStreamCreate(&st1, CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&ev[0], CU_EVENT_DEFAULT));
    CU(cuEventCreate(&ev[1], CU_EVENT_DEFAULT));
    /* peer access for the cuMemAlloc buffers (VMM mappings have theirs by cuMemSetAccess) */
    CUresult pa1 = cuCtxEnablePeerAccess(ctx[0], 0);
    CU(cuCtxSetCurrent(ctx[0]));
    CUresult pa0 = cuCtxEnablePeerAccess(ctx[1], 0);
    int peer_on = (pa1 == CUDA_SUCCESS || pa1 == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) &&
                  (pa0 == CUDA_SUCCESS || pa0 == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);

    size_t max = 0;
    for (int k = 0; k < nsizes; k++)
        max = sizes[k] > max ? sizes[k] : max;

    /* pools: GPU 0 with GPU 1 as peer; GPU 1 for the destination and the view */
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = 0;
    o.n_peer_devices = 1;
    o.peer_devices[0] = 1;
    fabpool_t *p0 = NULL, *p1 = NULL;
    fabpool_buffer_t *src = NULL, *dst = NULL;
    if (!FP(fabpool_create(&o, &p0)))
        return 1;
    fabpool_options_init(&o);
    o.device = 1;
    if (!FP(fabpool_create(&o, &p1)) || !FP(fabpool_buffer_create(p0, max, max, &src)) ||
        !FP(fabpool_buffer_create(p1, max, max, &dst)))
        return 1;
    CUdeviceptr srcp = (CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(src);
    CUdeviceptr dstp = (CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(dst);

    /* cuMemAlloc buffers for the peer copy */
    CUdeviceptr a0 = 0, a1 = 0;
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemAlloc(&a0, max));
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&a1, max));

    /* the exporting process, if it works out: a view of its buffer in pool p1 */
    fabpool_view_t *view = NULL;
    int sock = -1, ls = -1;
    pid_t pid = -1;
    char sname[64];
    snprintf(sname, sizeof sname, "fabpool-peerbw-%d", (int)getpid());
    if (fabpool_handle_type_of(p1) != FABPOOL_HANDLE_NONE && FP(fabpool_fd_listen(sname, &ls))) {
        char maxs[32];
        snprintf(maxs, sizeof maxs, "%zu", max);
        pid = fork();
        if (pid == 0) {
            execl(argv[0], argv[0], "--exporter", sname, maxs, (char *)NULL);
            _exit(127);
        }
        static uint8_t desc[1 << 16];
        int fds[256];
        size_t nf = 0, len = 0;
        CU(cuCtxSetCurrent(ctx[1]));
        if (FP(fabpool_fd_accept(ls, &sock)) && FP(fabpool_fd_recv(sock, fds, 256, &nf, desc, sizeof desc, &len)))
            FP(fabpool_view_open(p1, desc, len, fds, nf, &view));
    }

    printf("peer_bw: GPU 1 (%s) <- GPU 0 (%s), driver: %s, median of %d runs, peer access %s\n", name1, name0,
           sim ? "simulated (times mean nothing)" : "real", runs, peer_on ? "enabled" : "NOT enabled");
    printf("%10s %14s %14s %14s %10s %10s\n", "size", "mapped GB/s", "view GB/s", "peer GB/s", "mapped/peer",
           "view/peer");
    double res[MAXS][3];
    for (int k = 0; k < nsizes; k++) {
        size_t sz = sizes[k];
        uint32_t seed = 0x1000u + (uint32_t)k;
        CU(cuCtxSetCurrent(ctx[0]));
        fill(srcp, sz, seed);
        fill(a0, sz, seed);
        float tm = time_copy(0, dstp, srcp, sz, runs);
        CU(cuCtxSynchronize());
        check(dstp, sz, seed, "mapped");
        float tv = 0;
        if (view) {
            CU(cuCtxSetCurrent(ctx[1]));
            CU(cuMemsetD32(dstp, 0, sz / 4));
            tv = time_copy(0, dstp, (CUdeviceptr)(uintptr_t)fabpool_view_ptr(view), sz, runs);
            /* the exporter filled the first and the last MiB of its whole buffer */
            check(dstp, sz == max ? max : CHECKW * 4, 0xe0e0u, "view");
        }
        float tp = time_copy(1, a1, a0, sz, runs);
        CU(cuCtxSetCurrent(ctx[1]));
        check(a1, sz, seed, "peer");
        res[k][0] = gbps(sz, tm);
        res[k][1] = gbps(sz, tv);
        res[k][2] = gbps(sz, tp);
        printf("%7zu MiB %14.1f %14.1f %14.1f %10.3f %10.3f\n", sz >> 20, res[k][0], res[k][1], res[k][2],
               res[k][2] > 0 ? res[k][0] / res[k][2] : 0, res[k][2] > 0 ? res[k][1] / res[k][2] : 0);
    }
    if (!view)
        printf("peer_bw: no view from another process (pool handle type none, or the exporter failed)\n");

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            errors++;
        } else {
            fprintf(f, "{\"tool\":\"peer_bw\",\"driver\":\"%s\",\"gpu0\":\"%s\",\"gpu1\":\"%s\",\"runs\":%d,"
                    "\"peer_access\":%s,\"view\":%s,\"direction\":\"gpu1<-gpu0\",\"unit\":\"GB/s (1e9 B/s)\","
                    "\"results\":[", sim ? "sim" : "real", name0, name1, runs, peer_on ? "true" : "false",
                    view ? "true" : "false");
            for (int k = 0; k < nsizes; k++)
                fprintf(f, "%s{\"bytes\":%zu,\"mapped_gbps\":%.3f,\"view_gbps\":%.3f,\"peer_gbps\":%.3f,"
                        "\"mapped_over_peer\":%.4f,\"view_over_peer\":%.4f}", k ? "," : "", sizes[k], res[k][0],
                        res[k][1], res[k][2], res[k][2] > 0 ? res[k][0] / res[k][2] : 0,
                        res[k][2] > 0 ? res[k][1] / res[k][2] : 0);
            fprintf(f, "],\"errors\":%d}\n", errors);
            fclose(f);
        }
    }

    CU(cuCtxSetCurrent(ctx[1]));
    if (view)
        FP(fabpool_view_close(view));
    if (sock >= 0) {
        fabpool_fd_send(sock, NULL, 0, "done", 4);
        close(sock);
    }
    if (pid > 0) {
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "peer_bw: the exporting process failed (status %d)\n", status);
            errors++;
        }
    }
    if (ls >= 0)
        close(ls);
    FP(fabpool_buffer_destroy(src, NULL));
    FP(fabpool_buffer_destroy(dst, NULL));
    FP(fabpool_destroy(p0));
    FP(fabpool_destroy(p1));
    CU(cuMemFree(a1));
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemFree(a0));
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuEventDestroy(ev[0]));
    CU(cuEventDestroy(ev[1]));
    CU(cuStreamDestroy(st1));
    printf("peer_bw: %s\n", errors ? "ERRORS (see above)" : "ok");
    return errors ? 1 : 0;
}
