/* stage_probe.c - what bounds an offload of device memory into fresh pageable host memory, measured directly
 * against the driver (no fabpool), each way on the same bytes in the same run:
 *   pinned      cuMemcpyDtoH into memory of cuMemHostAlloc (the plain pinned copy), and that allocation's cost
 *   populate    MADV_POPULATE_WRITE of fresh anonymous memory (transparent huge pages asked for) by T threads
 *   memcpy      T threads copying from a pinned buffer each into populated memory
 *   ring        the staging ring's shape: T lanes, two pinned buffers each, DMA into one while the other is
 *               copied into fresh memory (populated ahead)
 *   register    fresh memory registered whole (cuMemHostRegister), one DMA, unregistered
 *   pieces      fresh memory in pieces of P MiB, T threads: each registers a piece, DMAs into it on its own
 *               stream, unregisters it (the data stays in the pageable pages)
 * Every figure is GB/s of the offloaded bytes (10^9 bytes a second), the median of R runs.
 * Build and run on the GPU machine:
 *   gcc -O2 -pthread -I/usr/local/cuda/include perf/h200/stage_probe.c -o /tmp/stage_probe -lcuda
 *   /tmp/stage_probe [GiB [R [all|v2|uffd]]]
 * v2: with and without huge pages, populate against faults in the memcpy, ring buffers of 0.5-2 MiB, and the ring
 * into pages already there; uffd: fresh pages filled by UFFDIO_COPY (a userfaultfd over them, user-mode faults
 * only), which skips their zeroing, against memcpy, alone and as the ring's lanes; free: giving a filled host
 * copy back, munmap alone against MADV_DONTNEED on pieces by T threads first, with and without huge pages
 * (milliseconds, not GB/s). */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s: CUDA error %d\n", __FILE__, __LINE__, #x, (int)r_); exit(1); } } while (0)
#define MiB (1ull << 20)

static CUcontext ctx;
static CUdeviceptr dev;
static size_t total;
static int thp = 1;   /* ask for transparent huge pages */
static int uffd = -1; /* a userfaultfd over the fresh memory: UFFDIO_COPY fills its pages without zeroing them */

/* Copies n bytes to fresh (registered) memory at dst: UFFDIO_COPY where uffd is open, else memcpy. */
static void put(char *dst, const void *src, size_t n)
{
    if (uffd < 0) {
        memcpy(dst, src, n);
        return;
    }
    struct uffdio_copy c = {.dst = (unsigned long)dst, .src = (unsigned long)src, .len = n, .mode = 0};
    if (ioctl(uffd, UFFDIO_COPY, &c) != 0) {
        perror("UFFDIO_COPY");
        exit(1);
    }
}

/* Registers [p, p + n) for UFFDIO_COPY (on: 1) or gives it back to plain faults (on: 0). */
static void uffd_range(char *p, size_t n, int on)
{
    if (on) {
        uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
        struct uffdio_api api = {.api = UFFD_API};
        struct uffdio_register reg = {.range = {(unsigned long)p, n}, .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) != 0 || ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
            perror("userfaultfd");
            exit(1);
        }
    } else {
        struct uffdio_range r = {(unsigned long)p, n};
        ioctl(uffd, UFFDIO_UNREGISTER, &r);
        close(uffd);
        uffd = -1;
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *fresh(size_t n)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    if (thp)
        madvise(p, n, MADV_HUGEPAGE);
    return p;
}

typedef struct work {
    int kind, id, nthreads;
    char *host;
    size_t piece;
    double t_reg, t_dma, t_unreg, t_pop, t_cpy;
} work;

static void *run(void *arg)
{
    work *w = arg;
    CK(cuCtxSetCurrent(ctx));
    size_t per = total / (size_t)w->nthreads, lo = per * (size_t)w->id, hi = lo + per;
    if (w->kind == 0) {                          /* populate */
        madvise(w->host + lo, hi - lo, MADV_POPULATE_WRITE);
    } else if (w->kind == 1) {                   /* memcpy from a pinned buffer */
        void *buf;
        CK(cuMemHostAlloc(&buf, 4 * MiB, 0));
        memset(buf, 1, 4 * MiB);
        for (size_t at = lo; at < hi; at += 4 * MiB)
            put(w->host + at, buf, hi - at < 4 * MiB ? hi - at : 4 * MiB);
        CK(cuMemFreeHost(buf));
    } else if (w->kind == 2 || w->kind == 4) {   /* ring lane (4: no populate of its own) */
        CUstream s;
        CUevent ev[2];
        void *buf[2];
        size_t bb = w->piece;
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        for (int b = 0; b < 2; b++) {
            CK(cuEventCreate(&ev[b], CU_EVENT_DISABLE_TIMING));
            CK(cuMemHostAlloc(&buf[b], bb, CU_MEMHOSTALLOC_PORTABLE));
        }
        /* fills interleaved across lanes as the ring does: fill f = lane + k * nthreads */
        size_t nf = (total + bb - 1) / bb;
        size_t f0 = (size_t)w->id, st = (size_t)w->nthreads;
        for (int k = 0; k < 2 && f0 + (size_t)k * st < nf; k++) {
            size_t f = f0 + (size_t)k * st, n = total - f * bb < bb ? total - f * bb : bb;
            CK(cuMemcpyDtoHAsync(buf[k], dev + f * bb, n, s));
            CK(cuEventRecord(ev[k], s));
        }
        for (size_t k = 0, f = f0; f < nf; k++, f += st) {
            int b = (int)(k & 1);
            size_t n = total - f * bb < bb ? total - f * bb : bb;
            double t0 = now();
            if (w->kind == 2)
                madvise(w->host + f * bb, n, MADV_POPULATE_WRITE);
            double t1 = now();
            CK(cuEventSynchronize(ev[b]));
            double t2 = now();
            put(w->host + f * bb, buf[b], n);
            w->t_pop += t1 - t0;
            w->t_cpy += now() - t2;
            size_t g = f + 2 * st;
            if (g < nf) {
                size_t m = total - g * bb < bb ? total - g * bb : bb;
                CK(cuMemcpyDtoHAsync(buf[b], dev + g * bb, m, s));
                CK(cuEventRecord(ev[b], s));
            }
        }
        CK(cuStreamSynchronize(s));
        for (int b = 0; b < 2; b++) {
            CK(cuMemFreeHost(buf[b]));
            CK(cuEventDestroy(ev[b]));
        }
        CK(cuStreamDestroy(s));
    } else {                                     /* pieces: register, DMA, unregister */
        CUstream s;
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        size_t np = (total + w->piece - 1) / w->piece;
        for (size_t p = (size_t)w->id; p < np; p += (size_t)w->nthreads) {
            size_t at = p * w->piece, n = total - at < w->piece ? total - at : w->piece;
            double t0 = now();
            CK(cuMemHostRegister(w->host + at, n, 0));
            double t1 = now();
            CK(cuMemcpyDtoHAsync(w->host + at, dev + at, n, s));
            CK(cuStreamSynchronize(s));
            double t2 = now();
            CK(cuMemHostUnregister(w->host + at));
            w->t_reg += t1 - t0;
            w->t_dma += t2 - t1;
            w->t_unreg += now() - t2;
        }
        CK(cuStreamDestroy(s));
    }
    return NULL;
}

/* Runs kind on T threads over fresh (or given) memory; returns seconds. */
static double threads(int kind, int T, char *host, size_t piece, work *sum)
{
    pthread_t th[64];
    work w[64];
    double t0 = now();
    for (int i = 0; i < T; i++) {
        w[i] = (work){.kind = kind, .id = i, .nthreads = T, .host = host, .piece = piece};
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    double t = now() - t0;
    if (sum) {
        memset(sum, 0, sizeof *sum);
        for (int i = 0; i < T; i++) {
            sum->t_reg += w[i].t_reg / T;
            sum->t_dma += w[i].t_dma / T;
            sum->t_unreg += w[i].t_unreg / T;
            sum->t_pop += w[i].t_pop / T;
            sum->t_cpy += w[i].t_cpy / T;
        }
    }
    return t;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static int check(const char *h, const char *what)
{
    /* the device holds byte (i / 1 MiB) & 0xff at offset i */
    for (size_t at = 0; at < total; at += 7 * MiB + 4093)
        if ((unsigned char)h[at] != (unsigned char)((at / MiB) & 0xff)) {
            printf("  %s: WRONG byte at %zu\n", what, at);
            return 1;
        }
    return 0;
}

#define GBS(t) ((double)total / (t) / 1e9)

typedef struct zap_arg {
    char *at;
    size_t len;
} zap_arg;

static void *zap_one(void *p)
{
    zap_arg *z = p;
    madvise(z->at, z->len, MADV_DONTNEED);
    return NULL;
}

/* ms to give back n filled bytes at h: T threads' MADV_DONTNEED on pieces, then munmap (T 1: munmap alone) */
static double give_back(char *h, size_t n, int T)
{
    double t0 = now();
    if (T > 1) {
        pthread_t th[16];
        zap_arg z[16];
        size_t piece = (n / T + 2 * MiB - 1) & ~(2 * MiB - 1);
        for (int i = 0; i < T; i++) {
            size_t off = (size_t)i * piece;
            z[i] = (zap_arg){h + off, off >= n ? 0 : (n - off < piece ? n - off : piece)};
            pthread_create(&th[i], NULL, zap_one, &z[i]);
        }
        for (int i = 0; i < T; i++)
            pthread_join(th[i], NULL);
    }
    munmap(h, n);
    return (now() - t0) * 1e3;
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 3.0;
    int R = argc > 2 ? atoi(argv[2]) : 3;
    if (R < 1 || R > 15 || gib <= 0 || gib > 64)
        return 2;
    total = (size_t)(gib * 1024) * MiB;
    CUdevice d;
    CK(cuInit(0));
    CK(cuDeviceGet(&d, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, d));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc(&dev, total));
    for (size_t at = 0; at < total; at += MiB)
        CK(cuMemsetD8(dev + at, (unsigned char)((at / MiB) & 0xff), MiB));
    CK(cuCtxSynchronize());
    printf("stage_probe: %.2f GiB, median of %d runs, GB/s of the offloaded bytes\n", gib, R);
    double v[16], a[16], b[16], c[16];
    int bad = 0;

    const char *mode = argc > 3 ? argv[3] : "all";
    if (!strcmp(mode, "free")) {
        int T5[] = {1, 2, 4, 8, 16};
        for (thp = 1; thp >= 0; thp--)
            for (int i = 0; i < 5; i++) {
                for (int r = 0; r < R; r++) {
                    char *h = fresh(total);
                    memset(h, 0x5a, total);
                    v[r] = give_back(h, total, T5[i]);
                }
                printf("thp %d free %.2f GiB filled: %s%2d threads %.1f ms\n", thp, gib,
                       T5[i] == 1 ? "munmap alone, " : "MADV_DONTNEED + munmap, ", T5[i], median(v, R));
            }
        CK(cuMemFree(dev));
        CK(cuDevicePrimaryCtxRelease(d));
        return 0;
    }
    if (!strcmp(mode, "uffd")) {
        int T3[] = {1, 4, 8, 16};
        for (thp = 1; thp >= 0; thp--)
            for (int i = 0; i < 4; i++) {
                for (int r = 0; r < R; r++) {
                    char *h = fresh(total);
                    a[r] = threads(1, T3[i], h, 0, NULL);   /* memcpy, the faults zeroing each page */
                    munmap(h, total);
                    h = fresh(total);
                    uffd_range(h, total, 1);
                    v[r] = threads(1, T3[i], h, 0, NULL);   /* UFFDIO_COPY: no zeroing */
                    uffd_range(h, total, 0);
                    munmap(h, total);
                }
                printf("thp %d T=%2d into fresh pages: memcpy %.1f GB/s, UFFDIO_COPY %.1f GB/s\n", thp, T3[i],
                       GBS(median(a, R)), GBS(median(v, R)));
            }
        thp = 1;
        size_t bb[] = {MiB, 2 * MiB, 4 * MiB};
        for (int T = 8; T <= 16; T += 8)
            for (int k = 0; k < 3; k++) {
                work s;
                for (int r = 0; r < R; r++) {
                    char *h = fresh(total);
                    a[r] = threads(2, T, h, bb[k], &s);   /* today's lanes: populate, then memcpy */
                    munmap(h, total);
                    h = fresh(total);
                    uffd_range(h, total, 1);
                    v[r] = threads(4, T, h, bb[k], &s);   /* lanes that UFFDIO_COPY each fill */
                    uffd_range(h, total, 0);
                    if (r == 0)
                        bad |= check(h, "uffd ring");
                    munmap(h, total);
                }
                printf("ring T=%2d buffers %zu MiB: populate + memcpy %.1f GB/s, UFFDIO_COPY %.1f GB/s\n", T,
                       (size_t)(bb[k] >> 20), GBS(median(a, R)), GBS(median(v, R)));
            }
        CK(cuMemFree(dev));
        CK(cuDevicePrimaryCtxRelease(d));
        printf("data %s\n", bad ? "WRONG" : "checked");
        return bad;
    }
    if (!strcmp(mode, "v2")) {
        int T2[] = {1, 2, 4, 8, 16};
        for (thp = 1; thp >= 0; thp--)
            for (int i = 0; i < 5; i++) {
                for (int r = 0; r < R; r++) {
                    char *h = fresh(total);
                    v[r] = threads(0, T2[i], h, 0, NULL);
                    munmap(h, total);
                    h = fresh(total);
                    a[r] = threads(1, T2[i], h, 0, NULL);
                    munmap(h, total);
                }
                printf("thp %d T=%2d populate %.1f GB/s, memcpy into fresh pages %.1f GB/s\n", thp, T2[i],
                       GBS(median(v, R)), GBS(median(a, R)));
            }
        size_t bb[] = {MiB / 2, MiB, 2 * MiB};
        for (thp = 1; thp >= 0; thp--)
            for (int T = 8; T <= 16; T += 8)
                for (int k = 0; k < 3; k++) {
                    work s;
                    for (int r = 0; r < R; r++) {
                        char *h = fresh(total);
                        v[r] = threads(2, T, h, bb[k], &s);
                        if (r == 0)
                            bad |= check(h, "ring");
                        munmap(h, total);
                        h = fresh(total);
                        a[r] = threads(4, T, h, bb[k], &s);   /* the lanes fault the pages in as they copy */
                        munmap(h, total);
                        h = fresh(total);
                        threads(0, 4, h, 0, NULL);
                        b[r] = threads(4, T, h, bb[k], &s);   /* the pages there: the ceiling */
                        munmap(h, total);
                    }
                    printf("thp %d ring T=%2d buffers %4zu KiB: populate in the lane %.1f GB/s, faults in the "
                           "memcpy %.1f GB/s, pages there %.1f GB/s\n", thp, T, (size_t)(bb[k] >> 10),
                           GBS(median(v, R)), GBS(median(a, R)), GBS(median(b, R)));
                }
        thp = 1;
        CK(cuMemFree(dev));
        CK(cuDevicePrimaryCtxRelease(d));
        printf("data %s\n", bad ? "WRONG" : "checked");
        return bad;
    }
    for (int r = 0; r < R; r++) {
        void *pin;
        double t0 = now();
        CK(cuMemHostAlloc(&pin, total, 0));
        a[r] = now() - t0;
        t0 = now();
        CK(cuMemcpyDtoH(pin, dev, total));
        v[r] = now() - t0;
        if (r == 0)
            bad |= check(pin, "pinned");
        t0 = now();
        CK(cuMemFreeHost(pin));
        b[r] = now() - t0;
    }
    printf("pinned copy %.1f GB/s; cuMemHostAlloc of it %.1f ms, cuMemFreeHost %.1f ms\n", GBS(median(v, R)),
           median(a, R) * 1e3, median(b, R) * 1e3);

    int Ts[] = {1, 4, 8, 16};
    for (int i = 0; i < 4; i++) {
        for (int r = 0; r < R; r++) {
            char *h = fresh(total);
            v[r] = threads(0, Ts[i], h, 0, NULL);
            a[r] = threads(1, Ts[i], h, 0, NULL);
            munmap(h, total);
        }
        printf("T=%2d populate %.1f GB/s, memcpy into populated %.1f GB/s\n", Ts[i], GBS(median(v, R)),
               GBS(median(a, R)));
    }
    size_t bufs[] = {1 * MiB, 4 * MiB};
    for (int i = 1; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            work s;
            for (int r = 0; r < R; r++) {
                char *h = fresh(total);
                v[r] = threads(2, Ts[i], h, bufs[k], &s);
                a[r] = s.t_pop;
                b[r] = s.t_cpy;
                if (r == 0)
                    bad |= check(h, "ring");
                munmap(h, total);
            }
            printf("ring T=%2d buffers %zu MiB: %.1f GB/s (pinning included; a lane's populate %.0f ms, memcpy "
                   "%.0f ms)\n", Ts[i], (size_t)(bufs[k] / MiB), GBS(median(v, R)), median(a, R) * 1e3, median(b, R) * 1e3);
        }
    for (int r = 0; r < R; r++) {
        char *h = fresh(total);
        double t0 = now();
        CK(cuMemHostRegister(h, total, 0));
        a[r] = now() - t0;
        t0 = now();
        CK(cuMemcpyDtoH(h, dev, total));
        b[r] = now() - t0;
        t0 = now();
        CK(cuMemHostUnregister(h));
        c[r] = now() - t0;
        v[r] = a[r] + b[r] + c[r];
        if (r == 0)
            bad |= check(h, "register");
        munmap(h, total);
    }
    printf("register whole: %.1f GB/s (register %.0f ms, copy %.0f ms, unregister %.0f ms)\n", GBS(median(v, R)),
           median(a, R) * 1e3, median(b, R) * 1e3, median(c, R) * 1e3);
    for (int r = 0; r < R; r++) {
        char *h = fresh(total);
        threads(0, 16, h, 0, NULL);
        double t0 = now();
        CK(cuMemHostRegister(h, total, 0));
        a[r] = now() - t0;
        CK(cuMemcpyDtoH(h, dev, total));
        CK(cuMemHostUnregister(h));
        munmap(h, total);
    }
    printf("register whole, populated first by 16 threads: register %.0f ms\n", median(a, R) * 1e3);
    size_t pieces[] = {16 * MiB, 64 * MiB, 256 * MiB};
    for (int i = 1; i < 4; i++)
        for (int k = 0; k < 3; k++) {
            work s;
            for (int r = 0; r < R; r++) {
                char *h = fresh(total);
                v[r] = threads(3, Ts[i], h, pieces[k], &s);
                a[r] = s.t_reg;
                b[r] = s.t_dma;
                c[r] = s.t_unreg;
                if (r == 0)
                    bad |= check(h, "pieces");
                munmap(h, total);
            }
            printf("pieces T=%2d of %3zu MiB: %.1f GB/s (a thread's register %.0f ms, DMA %.0f ms, unregister "
                   "%.0f ms)\n", Ts[i], (size_t)(pieces[k] / MiB), GBS(median(v, R)), median(a, R) * 1e3,
                   median(b, R) * 1e3, median(c, R) * 1e3);
        }
    CK(cuMemFree(dev));
    CK(cuDevicePrimaryCtxRelease(d));
    printf("data %s\n", bad ? "WRONG" : "checked");
    return bad;
}
