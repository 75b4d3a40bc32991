/* vmm_probe.c - two facts of the real driver that fabpool's sharing depends on, measured directly against the
 * driver (no fabpool):
 *   offset   whether cuMemMap maps a piece of a chunk at a non-zero offset (its documentation says the offset
 *            "currently must be zero"), for the creating process and through an exported/imported POSIX fd:
 *            pieces of one chunk in several windows, written through each, read back through a whole mapping;
 *   export   what one POSIX-fd export costs in different sequences: chunks exported one after another (fd
 *            closed, or kept), with pauses between, the same chunk twice, right after create+map+set-access,
 *            and after an import; every call timed;
 *   anchor   the same exports while one exported fd (or a plain open of /dev/nvidiactl) stays open.
 * Build and run on the GPU machine:
 *   gcc -O2 -I/usr/local/cuda/include perf/h200/vmm_probe.c -o /tmp/vmm_probe -lcuda && /tmp/vmm_probe */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static const char *err_name(CUresult r)
{
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define CK(call)                                                                                                     \
    do {                                                                                                             \
        CUresult r_ = (call);                                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                                    \
            printf("FAIL %s: %s (line %d)\n", #call, err_name(r_), __LINE__);                                        \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;
static size_t gran;

static CUmemGenericAllocationHandle create(size_t size)
{
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, size, &prop, 0));
    return h;
}

static CUdeviceptr reserve(size_t size)
{
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, size, gran, 0, 0));
    return p;
}

/* Maps size bytes of h from offset at va; prints the driver's answer; 0 when mapped and accessible. */
static int try_map(const char *what, CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h)
{
    CUresult r = cuMemMap(va, size, offset, h, 0);
    printf("offset: %-44s cuMemMap(size %zu MiB, offset %zu MiB) -> %s\n", what, size >> 20, offset >> 20,
           err_name(r));
    if (r != CUDA_SUCCESS)
        return 1;
    CK(cuMemSetAccess(va, size, &access_desc, 1));
    return 0;
}

static uint32_t read_word(CUdeviceptr p)
{
    uint32_t v = 0;
    CK(cuMemcpyDtoH(&v, p, sizeof v));
    return v;
}

static void probe_offset(void)
{
    size_t g = gran;
    CUmemGenericAllocationHandle h = create(3 * g);
    CUdeviceptr a = reserve(2 * g), b = reserve(2 * g), whole = reserve(3 * g), imp = reserve(2 * g);
    int fa = try_map("piece 0 into window A", a, g, 0, h);
    int fb = try_map("piece 1 into window B", b, g, g, h);
    int fc = try_map("pieces 1-2 into window B+1", b + g, g, 2 * g, h) == 0 ? 0 : 1;
    int fw = try_map("whole chunk into a third window", whole, 3 * g, 0, h);
    if (!fa && !fb && !fw) {
        CK(cuMemsetD32(a, 0xA0A0A0A0u, g / 4));
        CK(cuMemsetD32(b, 0xB1B1B1B1u, g / 4));
        if (!fc)
            CK(cuMemsetD32(b + g, 0xC2C2C2C2u, g / 4));
        CK(cuCtxSynchronize());
        printf("offset: through the whole mapping: piece0 %08x piece1 %08x piece2 %08x (expect a0a0a0a0 b1b1b1b1 "
               "%s)\n",
               read_word(whole), read_word(whole + g), read_word(whole + 2 * g), fc ? "unset" : "c2c2c2c2");
        int fd = -1;
        double t0 = now_us();
        CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        double t1 = now_us();
        CUmemGenericAllocationHandle ih;
        CK(cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        double t2 = now_us();
        printf("offset: export %.1f us, import %.1f us (same process)\n", t1 - t0, t2 - t1);
        if (try_map("imported handle, piece 1 at offset", imp, g, g, ih) == 0) {
            printf("offset: imported piece 1 reads %08x (expect b1b1b1b1)\n", read_word(imp));
            CK(cuMemUnmap(imp, g));
        }
        CK(cuMemRelease(ih));
        close(fd);
    }
    if (!fa)
        CK(cuMemUnmap(a, g));
    if (!fb)
        CK(cuMemUnmap(b, g));
    if (!fc)
        CK(cuMemUnmap(b + g, g));
    if (!fw)
        CK(cuMemUnmap(whole, 3 * g));
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(a, 2 * g));
    CK(cuMemAddressFree(b, 2 * g));
    CK(cuMemAddressFree(whole, 3 * g));
    CK(cuMemAddressFree(imp, 2 * g));
}

enum { N = 12 };

/* Exports each chunk once, pause_us apart; closes each fd at once or after all; prints each export's time. */
static void export_run(const char *name, CUmemGenericAllocationHandle *h, int n, int pause_us, int keep_open)
{
    int fds[N];
    double t[N], close_t = 0;
    for (int i = 0; i < n; i++) {
        if (pause_us)
            usleep((useconds_t)pause_us);
        double t0 = now_us();
        CK(cuMemExportToShareableHandle(&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        t[i] = now_us() - t0;
        if (!keep_open) {
            double c0 = now_us();
            close(fds[i]);
            close_t += now_us() - c0;
        }
    }
    if (keep_open) {
        double c0 = now_us();
        for (int i = 0; i < n; i++)
            close(fds[i]);
        close_t = now_us() - c0;
    }
    printf("export: %-34s", name);
    for (int i = 0; i < n; i++)
        printf(" %6.0f", t[i]);
    printf("   closes %.0f us in all\n", close_t);
}

static void probe_export(void)
{
    size_t g = gran;
    CUmemGenericAllocationHandle h[N];
    for (int i = 0; i < N; i++)
        h[i] = create(g);
    printf("export: us per cuMemExportToShareableHandle (POSIX fd), %d chunks of %zu MiB each, in order\n", N,
           g >> 20);
    export_run("burst, each fd closed", h, N, 0, 0);
    export_run("burst, fds kept open", h, N, 0, 1);
    export_run("1 ms apart, closed", h, N, 1000, 0);
    export_run("10 ms apart, closed", h, N, 10000, 0);
    export_run("100 ms apart, closed", h, 6, 100000, 0);
    /* the same chunk over and over */
    CUmemGenericAllocationHandle same[N];
    for (int i = 0; i < N; i++)
        same[i] = h[0];
    export_run("one chunk again and again", same, N, 0, 0);
    export_run("one chunk, 10 ms apart", same, 6, 10000, 0);
    /* a chunk created, mapped and made accessible, then exported at once (the pool's sequence) */
    printf("export: %-34s", "create+map+access, then export");
    CUdeviceptr va = reserve((size_t)N * g);
    CUmemGenericAllocationHandle fresh[N];
    double tc = 0, tm = 0;
    for (int i = 0; i < N; i++) {
        double t0 = now_us();
        fresh[i] = create(g);
        double t1 = now_us();
        CK(cuMemMap(va + (size_t)i * g, g, 0, fresh[i], 0));
        CK(cuMemSetAccess(va + (size_t)i * g, g, &access_desc, 1));
        double t2 = now_us();
        int fd;
        CK(cuMemExportToShareableHandle(&fd, fresh[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        printf(" %6.0f", now_us() - t2);
        close(fd);
        tc += t1 - t0;
        tm += t2 - t1;
    }
    printf("   (create %.0f, map+access %.0f us a chunk)\n", tc / N, tm / N);
    /* one export followed by an import of the same fd, then the next export */
    printf("export: %-34s", "export, import, export, ...");
    for (int i = 0; i < N; i++) {
        int fd;
        double t0 = now_us();
        CK(cuMemExportToShareableHandle(&fd, fresh[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        double t1 = now_us();
        CUmemGenericAllocationHandle ih;
        CK(cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        double t2 = now_us();
        printf(" %4.0f/%-4.0f", t1 - t0, t2 - t1);
        CK(cuMemRelease(ih));
        close(fd);
    }
    printf("   (export/import us)\n");
    /* a kernel-free device operation between exports */
    printf("export: %-34s", "memset+sync between exports");
    for (int i = 0; i < N; i++) {
        CK(cuMemsetD32(va, (unsigned)i, g / 4));
        CK(cuCtxSynchronize());
        int fd;
        double t0 = now_us();
        CK(cuMemExportToShareableHandle(&fd, fresh[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        printf(" %6.0f", now_us() - t0);
        close(fd);
    }
    printf("\n");
    /* an unmap/release between exports (what a shrinking pool does) */
    printf("export: %-34s", "unmap+release between exports");
    for (int i = 0; i < N; i++) {
        CK(cuMemUnmap(va + (size_t)i * g, g));
        CK(cuMemRelease(fresh[i]));
        if (i + 1 < N) {
            int fd;
            double t0 = now_us();
            CK(cuMemExportToShareableHandle(&fd, fresh[i + 1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            printf(" %6.0f", now_us() - t0);
            close(fd);
        }
    }
    printf("\n");
    CK(cuMemAddressFree(va, (size_t)N * g));
    for (int i = 0; i < N; i++)
        CK(cuMemRelease(h[i]));
}


/* Exports and closes each chunk while an anchor is held open: an exported fd of another chunk (whose handle is
 * released), or a plain open of /dev/nvidiactl; prints each export's and each close's time. */
static void anchored_run(const char *name, CUmemGenericAllocationHandle *h, int n, int anchor_fd)
{
    double te[N], tcl[N];
    for (int i = 0; i < n; i++) {
        int fd;
        double t0 = now_us();
        CK(cuMemExportToShareableHandle(&fd, h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        double t1 = now_us();
        close(fd);
        te[i] = t1 - t0;
        tcl[i] = now_us() - t1;
    }
    printf("anchor: %-34s export", name);
    for (int i = 0; i < n; i++)
        printf(" %5.0f", te[i]);
    printf("  | close");
    for (int i = 0; i < n; i++)
        printf(" %5.0f", tcl[i]);
    double t0 = now_us();
    if (anchor_fd >= 0)
        close(anchor_fd);
    printf("  | anchor's close %.0f us\n", now_us() - t0);
}

static void probe_anchor(void)
{
    CUmemGenericAllocationHandle h[N];
    for (int i = 0; i < N; i++)
        h[i] = create(gran);
    anchored_run("none", h, N, -1);
    CUmemGenericAllocationHandle a = create(gran);
    int afd;
    double t0 = now_us();
    CK(cuMemExportToShareableHandle(&afd, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("anchor: exported fd of a 2 MiB chunk: export %.0f us\n", now_us() - t0);
    CK(cuMemRelease(a));
    anchored_run("exported fd, its handle released", h, N, afd);
    anchored_run("none, after the anchor closed", h, 4, -1);
    int cfd = open("/dev/nvidiactl", O_RDWR | O_CLOEXEC);
    printf("anchor: open /dev/nvidiactl -> %d\n", cfd);
    anchored_run("a plain open of /dev/nvidiactl", h, N, cfd);
    a = create(gran);
    CK(cuMemExportToShareableHandle(&afd, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int dfd = dup(afd);
    close(afd);
    CK(cuMemRelease(a));
    anchored_run("a dup of an exported fd", h, N, dfd);
    /* the anchor is one of the chunks' own fds, kept while that chunk lives */
    int own;
    CK(cuMemExportToShareableHandle(&own, h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    anchored_run("the first chunk's own fd kept", h + 1, N - 1, own);
    for (int i = 0; i < N; i++)
        CK(cuMemRelease(h[i]));
}

int main(void)
{
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    access_desc.location = prop.location;
    access_desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    int drv = 0;
    cuDriverGetVersion(&drv);
    printf("vmm_probe: driver API %d, granularity %zu KiB\n", drv, gran >> 10);
    probe_offset();
    probe_export();
    probe_anchor();
    printf("vmm_probe: done\n");
    return 0;
}
