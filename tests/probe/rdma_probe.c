/* rdma_probe: what the CUDA driver answers for RDMA-ready VMM memory and host
 * NUMA memory.  Prints one line per question; the simulated
 * driver (sim/sim_share.c) and tests/test_conformance.c (its RECORD lines)
 * follow these answers.  Plain driver API:
 *     gcc -std=gnu11 -O1 -I/usr/local/cuda/include rdma_probe.c -o /tmp/rdma_probe -lcuda
 *     /tmp/rdma_probe
 * The same binary runs on the simulated driver with
 *     LD_LIBRARY_PATH=<build>/sim /tmp/rdma_probe */
#define _GNU_SOURCE
#include <cuda.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB (1ull << 20)
static CUdevice dev;
static const char *en(CUresult r) { const char *s = NULL; cuGetErrorName(r, &s); return s ? s : "?"; }
#define P(name, expr) do { CUresult r_ = (expr); printf("%-58s %s (%d)\n", name, en(r_), (int)r_); } while (0)

static CUmemAllocationProp dprop(int rdma, CUmemAllocationHandleType t)
{
    CUmemAllocationProp p; memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = dev;
    p.requestedHandleTypes = t; p.allocFlags.gpuDirectRDMACapable = (unsigned char)rdma; return p;
}
static CUmemAllocationProp hprop(CUmemLocationType lt, int id)
{
    CUmemAllocationProp p; memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = lt; p.location.id = id; return p;
}
static CUresult acc(CUdeviceptr a, size_t n)
{
    CUmemAccessDesc d; memset(&d, 0, sizeof d); d.location.type = CU_MEM_LOCATION_TYPE_DEVICE; d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; return cuMemSetAccess(a, n, &d, 1);
}
/* create + map + access of one chunk at va; the handle is released (eager) */
static CUresult chunk_at(CUdeviceptr va, size_t n, int rdma)
{
    CUmemGenericAllocationHandle h = 0; CUmemAllocationProp p = dprop(rdma, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUresult r = cuMemCreate(&h, n, &p, 0); if (r) return r;
    r = cuMemMap(va, n, 0, h, 0); cuMemRelease(h); if (r) return r;
    return acc(va, n);
}
static void props_of(const char *what, CUdeviceptr va)
{
    CUmemGenericAllocationHandle h = 0; CUmemAllocationProp p; memset(&p, 0, sizeof p);
    CUresult r = cuMemRetainAllocationHandle(&h, (void *)va);
    if (r == CUDA_SUCCESS) { r = cuMemGetAllocationPropertiesFromHandle(&p, h); cuMemRelease(h); }
    printf("%-58s %s: loc.type %d loc.id %d handletypes %d gpuDirectRDMACapable %d usage %d\n", what, en(r),
           (int)p.location.type, p.location.id, (int)p.requestedHandleTypes, p.allocFlags.gpuDirectRDMACapable,
           p.allocFlags.usage);
}
/* a dma-buf of [a, a+n): the answer and the fd's size */
static void dmabuf(const char *what, CUdeviceptr a, size_t n, unsigned long long flags)
{
    int fd = -1;
    CUresult r = cuMemGetHandleForAddressRange(&fd, a, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags);
    long long sz = r == CUDA_SUCCESS && fd >= 0 ? (long long)lseek(fd, 0, SEEK_END) : -1;
    printf("%-58s %s (%d)  fd %d  lseek size %lld  asked %zu%s\n", what, en(r), (int)r, fd, sz, n,
           r == CUDA_SUCCESS ? (sz == (long long)n ? "  (= the range)" : "  (NOT the range)") : "");
    if (fd >= 0) close(fd);
}
static long long heldmb(size_t f0) { size_t f, t; cuMemGetInfo(&f, &t); return ((long long)f0 - (long long)f) / (long long)MB; }

static sigjmp_buf jb;
static void on_segv(int s) { (void)s; siglongjmp(jb, 1); }
/* a CPU load and store through va: "ok" or "SIGSEGV" */
static const char *cpu_touch(CUdeviceptr va)
{
    struct sigaction sa, old_segv, old_bus; memset(&sa, 0, sizeof sa); sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, &old_segv); sigaction(SIGBUS, &sa, &old_bus);
    const char *res = "ok";
    if (sigsetjmp(jb, 1) == 0) { volatile uint64_t *q = (volatile uint64_t *)(uintptr_t)va; uint64_t x = q[1]; q[1] = x + 1; if (q[1] != x + 1) res = "store not seen"; }
    else res = "SIGSEGV/SIGBUS";
    sigaction(SIGSEGV, &old_segv, NULL); sigaction(SIGBUS, &old_bus, NULL);
    return res;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    CUcontext ctx; int v;
    P("cuInit", cuInit(0));
    cuDriverGetVersion(&v); printf("driver version %d\n", v);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
    { static const struct { int a; const char *n; } attrs[] = {
          {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED"},
          {CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "DMA_BUF_SUPPORTED"},
          {CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED, "HOST_ALLOC_DMA_BUF_SUPPORTED"},
          {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, "GPU_DIRECT_RDMA_SUPPORTED"},
          {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS"},
          {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, "GPU_DIRECT_RDMA_WRITES_ORDERING"},
          {CU_DEVICE_ATTRIBUTE_NUMA_CONFIG, "NUMA_CONFIG"},
          {CU_DEVICE_ATTRIBUTE_NUMA_ID, "NUMA_ID"},
          {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, "HOST_NUMA_ID"}};
      for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
          int x = -1; CUresult r = cuDeviceGetAttribute(&x, attrs[i].a, dev);
          printf("attr %-50s = %d (%s)\n", attrs[i].n, x, en(r)); } }
    size_t f0, tot; cuMemGetInfo(&f0, &tot); printf("total %zu MiB free %zu MiB\n", tot >> 20, f0 >> 20);

    /* --- device chunks with the RDMA flag --- */
    CUdeviceptr base = 0; P("reserve 64 MiB", cuMemAddressReserve(&base, 64 * MB, 0, 0, 0));
    { size_t g = 0; CUmemAllocationProp p = dprop(1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      P("granularity, RDMA flag", cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM)); printf("  %zu MiB\n", g >> 20);
      CUmemGenericAllocationHandle h = 0; p = dprop(1, CU_MEM_HANDLE_TYPE_NONE);
      P("create RDMA flag, handle type NONE", cuMemCreate(&h, 2 * MB, &p, 0)); if (h) cuMemRelease(h); }
    P("chunk A (RDMA flag) at base", chunk_at(base, 2 * MB, 1));
    P("chunk B (RDMA flag, created separately) at base+2MiB", chunk_at(base + 2 * MB, 2 * MB, 1));
    P("chunk C (no flag) at base+8MiB", chunk_at(base + 8 * MB, 2 * MB, 0));
    P("chunk D (no flag) at base+10MiB", chunk_at(base + 10 * MB, 2 * MB, 0));
    P("chunk E (RDMA flag) at base+12MiB", chunk_at(base + 12 * MB, 2 * MB, 1));
    props_of("props of chunk A", base);
    props_of("props of chunk C", base + 8 * MB);
    P("memset across A and B", cuMemsetD8(base, 7, 4 * MB));
    { unsigned char x = 0; cuMemcpyDtoH(&x, base + 3 * MB, 1); printf("  read back %d\n", x); }

    dmabuf("dma-buf of chunk A", base, 2 * MB, 0);
    dmabuf("dma-buf of A+B (two chunks)", base, 4 * MB, 0);
    dmabuf("dma-buf inside A+B (base+1MiB, 2 MiB)", base + MB, 2 * MB, 0);
    dmabuf("dma-buf of one page (base+64KiB, 4 KiB)", base + 65536, 4096, 0);
    dmabuf("dma-buf at base+100 (off the page)", base + 100, 2 * MB, 0);
    dmabuf("dma-buf of 2 MiB + 100 (size off the page)", base, 2 * MB + 100, 0);
    dmabuf("dma-buf at base+64KiB, 64 KiB (64K-aligned)", base + 65536, 65536, 0);
    dmabuf("dma-buf of size 0", base, 0, 0);
    dmabuf("dma-buf over a hole: B, [4,8) unmapped, C", base + 2 * MB, 8 * MB, 0);
    dmabuf("dma-buf of unmapped reserved space", base + 32 * MB, 2 * MB, 0);
    dmabuf("dma-buf of chunk C (no flag)", base + 8 * MB, 2 * MB, 0);
    dmabuf("dma-buf of C+D (two chunks, no flag)", base + 8 * MB, 4 * MB, 0);
    dmabuf("dma-buf of D+E (no flag, then flag: mixed)", base + 10 * MB, 4 * MB, 0);
    dmabuf("dma-buf of A with flag DMA_BUF_MAPPING_TYPE_PCIE", base, 2 * MB, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    { int fd = -1; P("range handle of unknown type 2", cuMemGetHandleForAddressRange(&fd, base, 2 * MB, (CUmemRangeHandleType)2, 0)); if (fd >= 0) close(fd); }
    { CUdeviceptr m = 0; P("cuMemAlloc 4 MiB", cuMemAlloc(&m, 4 * MB)); if (m) { dmabuf("dma-buf of a cuMemAlloc block", m, 4 * MB, 0); cuMemFree(m); } }
    { int fd1 = -1, fd2 = -1;
      CUresult r1 = cuMemGetHandleForAddressRange(&fd1, base, 2 * MB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      CUresult r2 = cuMemGetHandleForAddressRange(&fd2, base, 2 * MB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      printf("%-58s %s %s fds %d %d (distinct: %d)\n", "the same range twice", en(r1), en(r2), fd1, fd2, fd1 != fd2);
      if (fd1 >= 0) close(fd1);
      if (fd2 >= 0) close(fd2); }
    P("unmap all", cuMemUnmap(base, 64 * MB));

    /* an open dma-buf after unmap and release (256 MiB) */
    { CUmemGenericAllocationHandle h = 0; CUmemAllocationProp p = dprop(1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      CUdeviceptr big = 0; int fd = -1; cuMemGetInfo(&f0, &tot);
      cuMemAddressReserve(&big, 256 * MB, 0, 0, 0); cuMemCreate(&h, 256 * MB, &p, 0); cuMemMap(big, 256 * MB, 0, h, 0); acc(big, 256 * MB);
      cuMemRelease(h);
      P("dma-buf of 256 MiB", cuMemGetHandleForAddressRange(&fd, big, 256 * MB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
      printf("held mapped, dma-buf open: %lld MiB\n", heldmb(f0));
      cuMemUnmap(big, 256 * MB);
      printf("held after unmap (handle released), dma-buf open: %lld MiB\n", heldmb(f0));
      if (fd >= 0) close(fd);
      printf("held after closing the dma-buf: %lld MiB\n", heldmb(f0));
      cuMemAddressFree(big, 256 * MB); }

    /* --- host NUMA memory through VMM --- */
    { size_t g = 0; CUmemAllocationProp p = hprop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
      P("granularity host NUMA 0, minimum", cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM)); printf("  %zu KiB\n", g >> 10);
      P("granularity host NUMA 0, recommended", cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)); printf("  %zu KiB\n", g >> 10);
      CUmemGenericAllocationHandle h = 0;
      cuMemGetInfo(&f0, &tot);
      P("create host NUMA 0, 64 MiB", cuMemCreate(&h, 64 * MB, &p, 0));
      printf("  device memory held by it: %lld MiB\n", heldmb(f0));
      if (h) {
          CUmemAllocationProp q; memset(&q, 0, sizeof q); cuMemGetAllocationPropertiesFromHandle(&q, h);
          printf("  props: loc.type %d loc.id %d handletypes %d\n", (int)q.location.type, q.location.id, (int)q.requestedHandleTypes);
          P("map it", cuMemMap(base, 64 * MB, 0, h, 0));
          props_of("props by address (retain)", base);
          printf("  CPU access before any set-access: skipped (would fault)\n");
          P("device access to it", acc(base, 64 * MB));
          printf("  CPU load/store with device access only: %s\n", cpu_touch(base));
          { CUmemAccessDesc d; memset(&d, 0, sizeof d); d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; d.location.id = 0;
            d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; P("host (HOST_NUMA) access to it", cuMemSetAccess(base, 64 * MB, &d, 1));
            unsigned long long fl = 99; CUmemLocation l; memset(&l, 0, sizeof l); l.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            P("get HOST_NUMA access", cuMemGetAccess(&fl, &l, base)); printf("  flags %llu\n", fl); }
          printf("  CPU load/store with host access: %s\n", cpu_touch(base));
          uint64_t in[4] = {1, 2, 3, 0xfab}, out[4] = {0, 0, 0, 0};
          P("cuMemcpyHtoD into it", cuMemcpyHtoD(base + 64 * MB - sizeof in, in, sizeof in));
          P("cuMemcpyDtoH back", cuMemcpyDtoH(out, base + 64 * MB - sizeof out, sizeof out));
          printf("  intact: %d\n", memcmp(in, out, sizeof in) == 0);
          P("cuMemsetD8 of it", cuMemsetD8(base, 0x5a, 64 * MB));
          { unsigned char c = 0; cuMemcpyDtoH(&c, base + 33 * MB, 1); printf("  read back 0x%x\n", c); }
          { CUdeviceptr d = 0; CUmemGenericAllocationHandle hd = 0; CUmemAllocationProp dp = dprop(0, CU_MEM_HANDLE_TYPE_NONE);
            cuMemAddressReserve(&d, 64 * MB, 0, 0, 0); cuMemCreate(&hd, 64 * MB, &dp, 0); cuMemMap(d, 64 * MB, 0, hd, 0); acc(d, 64 * MB); cuMemRelease(hd);
            cuMemsetD8(d, 0x33, 64 * MB);
            P("cuMemcpyDtoD device -> host NUMA, 64 MiB", cuMemcpyDtoD(base, d, 64 * MB));
            P("cuMemcpyDtoD host NUMA -> device, 64 MiB", cuMemcpyDtoD(d, base, 64 * MB));
            { unsigned char c = 0; cuMemcpyDtoH(&c, base + 5 * MB, 1); printf("  host copy holds 0x%x\n", c); }
            { CUmemAccessDesc dd; memset(&dd, 0, sizeof dd); dd.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
              dd.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; P("HOST_NUMA access to device memory", cuMemSetAccess(d, 64 * MB, &dd, 1)); }
            cuMemUnmap(d, 64 * MB); cuMemAddressFree(d, 64 * MB); }
          dmabuf("dma-buf of host NUMA memory", base, 64 * MB, 0);
          P("unmap it", cuMemUnmap(base, 64 * MB));
          P("release it", cuMemRelease(h));
      }
      h = 0; p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      P("create host NUMA 0, POSIX_FD handle type", cuMemCreate(&h, 2 * MB, &p, 0));
      if (h) { int fd = -1; P("  export it as POSIX fd", cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); if (fd >= 0) close(fd); cuMemRelease(h); }
      h = 0; p.requestedHandleTypes = 0; p.allocFlags.gpuDirectRDMACapable = 1;
      P("create host NUMA 0 with the RDMA flag", cuMemCreate(&h, 2 * MB, &p, 0)); if (h) cuMemRelease(h);
      p.allocFlags.gpuDirectRDMACapable = 0;
      h = 0; P("create host NUMA 0, 1 MiB", cuMemCreate(&h, 1 * MB, &p, 0)); if (h) cuMemRelease(h);
      h = 0; p.location.id = 999; P("create host NUMA 999", cuMemCreate(&h, 2 * MB, &p, 0)); if (h) cuMemRelease(h);
      h = 0; p = hprop(CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0); P("create HOST_NUMA_CURRENT", cuMemCreate(&h, 2 * MB, &p, 0)); if (h) cuMemRelease(h);
      h = 0; p = hprop(CU_MEM_LOCATION_TYPE_HOST, 0); P("create HOST", cuMemCreate(&h, 2 * MB, &p, 0)); if (h) cuMemRelease(h);
    }
    P("address free", cuMemAddressFree(base, 64 * MB));
    printf("exit 0\n");
    return 0;
}
