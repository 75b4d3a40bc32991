/* nvml_probe.c - what NVML's per-process used memory (tests/held.h) shows for VMM allocations on the real
 * driver: after create + map, after the handle's release, after the unmap; and for a POSIX-fd allocation that a
 * child process imports and maps, whom NVML counts it for while the exporter has let go of it. Prints one line
 * per reading. Not a CTest: built and run by hand on a GPU machine (perf/h200/held-check.sh). */
#include "../held.h"

#include <sys/wait.h>

#define MIB (1ll << 20)
#define DO(x)                                                                                                          \
    do {                                                                                                               \
        CUresult r_ = (x);                                                                                             \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            fprintf(stderr, "%s: %d\n", #x, (int)r_);                                                                  \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static CUdevice dev;

static void show(const char *what, int64_t base)
{
    int whole;
    int64_t u = t_used_bytes(dev, &whole);
    printf("%-58s %+8lld MiB (%s)\n", what, (long long)((u - base) / MIB), whole ? "whole device" : "this process tree");
    fflush(stdout);
}

int main(void)
{
    CUcontext ctx;
    DO(cuInit(0));
    DO(cuDeviceGet(&dev, 0));
    DO(cuDevicePrimaryCtxRetain(&ctx, dev));
    DO(cuCtxSetCurrent(ctx));
    int whole;
    int64_t base = t_used_bytes(dev, &whole);
    printf("baseline: %lld MiB used (%s)\n", (long long)(base / MIB), whole ? "whole device" : "this process tree");

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t sz = 1024 * MIB;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    DO(cuMemAddressReserve(&va, sz, 0, 0, 0));
    DO(cuMemCreate(&h, sz, &prop, 0));
    show("1 GiB created", base);
    DO(cuMemMap(va, sz, 0, h, 0));
    DO(cuMemSetAccess(va, sz, &acc, 1));
    show("mapped", base);
    int fd = -1;
    DO(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    DO(cuMemRelease(h));
    show("handle released, still mapped, fd open", base);

    int up[2], down[2];
    if (pipe(up) || pipe(down))
        return 1;
    pid_t pid = fork();
    if (pid == 0) { /* the peer: a context of its own, imports and maps the exporter's 1 GiB */
        char c = 0;
        CUcontext cc;
        CUdeviceptr pva;
        CUmemGenericAllocationHandle ph;
        DO(cuInit(0));
        DO(cuDevicePrimaryCtxRetain(&cc, dev));
        DO(cuCtxSetCurrent(cc));
        DO(cuMemImportFromShareableHandle(&ph, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        DO(cuMemAddressReserve(&pva, sz, 0, 0, 0));
        DO(cuMemMap(pva, sz, 0, ph, 0));
        DO(cuMemRelease(ph));
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        DO(cuMemUnmap(pva, sz));
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        _exit(0);
    }
    char c = 0;
    if (read(up[0], &c, 1) != 1)
        return 1;
    show("a child context has imported and mapped it", base);
    DO(cuMemUnmap(va, sz));
    close(fd);
    show("exporter unmapped, fd closed; the child still maps it", base);
    if (write(down[1], &c, 1) != 1 || read(up[0], &c, 1) != 1)
        return 1;
    show("child unmapped (its context still open)", base);
    if (write(down[1], &c, 1) != 1)
        return 1;
    int st;
    waitpid(pid, &st, 0);
    show("child exited", base);
    DO(cuMemAddressFree(va, sz));

    /* a child's own allocation is counted in the tree while the child lives */
    if (pipe(up) || pipe(down))
        return 1;
    pid = fork();
    if (pid == 0) {
        CUcontext cc;
        CUdeviceptr cva;
        CUmemGenericAllocationHandle ch;
        DO(cuInit(0));
        DO(cuDevicePrimaryCtxRetain(&cc, dev));
        DO(cuCtxSetCurrent(cc));
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        DO(cuMemAddressReserve(&cva, 512 * MIB, 0, 0, 0));
        DO(cuMemCreate(&ch, 512 * MIB, &prop, 0));
        DO(cuMemMap(cva, 512 * MIB, 0, ch, 0));
        DO(cuMemRelease(ch));
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        _exit(0);
    }
    if (read(up[0], &c, 1) != 1)
        return 1;
    show("a child holds 512 MiB of its own (+ its context)", base);
    if (write(down[1], &c, 1) != 1)
        return 1;
    waitpid(pid, &st, 0);
    show("that child exited", base);
    return 0;
}
