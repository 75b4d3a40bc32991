/* driver_probe: prints what the CUDA driver answers to each VMM misuse case.
 * Used once on the H200 to learn the real driver's answers, which the
 * simulated driver and tests/conformance then match.  Plain driver API. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *en(CUresult r) { const char *s = NULL; cuGetErrorName(r, &s); return s ? s : "?"; }
#define P(name, expr) do { CUresult r_ = (expr); printf("%-44s %s (%d)\n", name, en(r_), (int)r_); } while (0)
/* Cases that may crash the real driver (handles are pointers inside it) run
 * only when named on the command line, each in a process of its own. */
static const char *only;
#define D(name, expr) do { if (!only) printf("%-44s skipped: run alone\n", name); \
    else if (!strcmp(only, name)) { P(name, expr); exit(0); } } while (0)
#define MB (1ull << 20)
static CUdevice dev;
static CUmemAllocationProp prop_of(CUmemAllocationHandleType t) {
    CUmemAllocationProp p; memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev; p.requestedHandleTypes = t; return p;
}
static CUresult mk(CUmemGenericAllocationHandle *h, size_t sz, CUmemAllocationHandleType t) {
    CUmemAllocationProp p = prop_of(t); return cuMemCreate(h, sz, &p, 0);
}
static CUresult acc(CUdeviceptr a, size_t sz) {
    CUmemAccessDesc d; memset(&d, 0, sizeof d); d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; return cuMemSetAccess(a, sz, &d, 1);
}
static long long heldmb(size_t base_free) { size_t f, t; cuMemGetInfo(&f, &t); return ((long long)base_free - (long long)f) / (long long)MB; }

int main(int argc, char **argv) {
    only = argc > 1 ? argv[1] : NULL;
    CUresult r; int v; CUcontext ctx;
    setvbuf(stdout, NULL, _IONBF, 0);
    P("cuInit", cuInit(0));
    cuDriverGetVersion(&v); printf("driver version %d\n", v);
    cuDeviceGet(&dev, 0);
    cuCtxGetCurrent(&ctx); printf("current ctx before set: %p\n", (void *)ctx);
    { size_t g = 0; CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_NONE);
      P("granularity without ctx", cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
      CUmemGenericAllocationHandle h = 0; P("create without ctx", mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE));
      if (h) P("release without ctx", cuMemRelease(h));
      CUdeviceptr a = 0; P("reserve without ctx", cuMemAddressReserve(&a, 2 * MB, 0, 0, 0)); if (a) cuMemAddressFree(a, 2 * MB);
      size_t f, t; P("meminfo without ctx", cuMemGetInfo(&f, &t)); }
    cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
    { int attrs[] = { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                      CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED };
      for (int i = 0; i < 4; i++) { int x = -1; cuDeviceGetAttribute(&x, attrs[i], dev); printf("attr %d = %d\n", attrs[i], x); } }
    size_t f0, tot; cuMemGetInfo(&f0, &tot); printf("total %zu MiB free %zu MiB\n", tot >> 20, f0 >> 20);

    CUmemGenericAllocationHandle h = 0, h2 = 0;
    P("create 1 MiB (unaligned)", mk(&h, 1 * MB, CU_MEM_HANDLE_TYPE_NONE));
    P("create 3 MiB (unaligned)", mk(&h, 3 * MB, CU_MEM_HANDLE_TYPE_NONE));
    P("create 0 bytes", mk(&h, 0, CU_MEM_HANDLE_TYPE_NONE));
    P("create 1 TiB (oom)", mk(&h, 1ull << 40, CU_MEM_HANDLE_TYPE_NONE));
    P("create fabric", mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_FABRIC));
    P("create NULL prop", cuMemCreate(&h, 2 * MB, NULL, 0));
    { CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_NONE); p.location.id = 99; P("create bad device", cuMemCreate(&h, 2 * MB, &p, 0)); }
    P("release handle 0", cuMemRelease(0));
    D("release bogus handle", cuMemRelease((CUmemGenericAllocationHandle)0x1234567));
    P("create 2 MiB", mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE));
    P("release", cuMemRelease(h));
    D("double release", cuMemRelease(h));

    CUdeviceptr base = 0;
    P("reserve 1 MiB (unaligned)", cuMemAddressReserve(&base, 1 * MB, 0, 0, 0)); if (base) { printf("  got %llx\n", (unsigned long long)base); cuMemAddressFree(base, 1 * MB); base = 0; }
    P("reserve 0", cuMemAddressReserve(&base, 0, 0, 0, 0));
    base = 0;
    P("reserve align 3MiB (non-pow2)", cuMemAddressReserve(&base, 6 * MB, 3 * MB, 0, 0)); if (base) { cuMemAddressFree(base, 6 * MB); base = 0; }
    P("reserve 64 MiB", cuMemAddressReserve(&base, 64 * MB, 0, 0, 0));
    printf("  base %% 2MiB = %llu, base %% 64MiB = %llu\n", (unsigned long long)(base % (2 * MB)), (unsigned long long)(base % (64 * MB)));
    { CUdeviceptr b2 = 0; P("reserve at occupied hint", cuMemAddressReserve(&b2, 2 * MB, 0, base, 0)); printf("  hint honoured: %d\n", b2 == base); if (b2) cuMemAddressFree(b2, 2 * MB); }
    P("address free partial", cuMemAddressFree(base, 2 * MB));
    P("address free wrong size", cuMemAddressFree(base, 128 * MB));

    P("create 4 MiB", mk(&h, 4 * MB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    P("map offset 2MiB size 2MiB", cuMemMap(base, 2 * MB, 2 * MB, h, 0));
    P("map offset 0 size 2MiB of 4MiB", cuMemMap(base, 2 * MB, 0, h, 0));
    cuMemUnmap(base, 2 * MB);
    P("map unaligned address", cuMemMap(base + 4096, 4 * MB, 0, h, 0));
    r = cuMemMap(base + 62 * MB, 4 * MB, 0, h, 0); printf("%-44s %s (%d)\n", "map across reservation end", en(r), (int)r);
    if (r == CUDA_SUCCESS) P("  unmap it", cuMemUnmap(base + 62 * MB, 4 * MB));
    P("map unreserved address", cuMemMap((CUdeviceptr)0x100000000000ull, 4 * MB, 0, h, 0));
    P("map size larger than handle", cuMemMap(base, 6 * MB, 0, h, 0));
    P("map flags 1", cuMemMap(base, 4 * MB, 0, h, 1));
    P("set access unmapped", acc(base, 4 * MB));
    P("map whole", cuMemMap(base, 4 * MB, 0, h, 0));
    P("map over mapping", cuMemMap(base, 4 * MB, 0, h, 0));
    P("map same handle elsewhere", cuMemMap(base + 8 * MB, 4 * MB, 0, h, 0));
    P("unmap alias", cuMemUnmap(base + 8 * MB, 4 * MB));
    P("set access", acc(base, 4 * MB));
    { CUmemLocation l; memset(&l, 0, sizeof l); l.type = CU_MEM_LOCATION_TYPE_DEVICE; l.id = dev; unsigned long long fl = 99;
      P("get access", cuMemGetAccess(&fl, &l, base)); printf("  flags %llu\n", fl);
      P("get access unmapped", cuMemGetAccess(&fl, &l, base + 32 * MB)); }
    P("set access partial (first 2MiB)", acc(base, 2 * MB));
    { CUdeviceptr b = 0; size_t s = 0; P("get address range mid", cuMemGetAddressRange(&b, &s, base + 3 * MB));
      printf("  base ok %d size %zu MiB\n", b == base, s >> 20);
      P("get address range unmapped", cuMemGetAddressRange(&b, &s, base + 32 * MB)); }
    { CUmemGenericAllocationHandle hr = 0; P("retain at base", cuMemRetainAllocationHandle(&hr, (void *)base)); printf("  same handle as create: %d\n", hr == h);
      if (hr) cuMemRelease(hr);
      P("retain interior", cuMemRetainAllocationHandle(&hr, (void *)(base + 3 * MB))); printf("  same handle: %d\n", hr == h); if (hr) cuMemRelease(hr);
      P("retain unmapped", cuMemRetainAllocationHandle(&hr, (void *)(base + 32 * MB))); }
    { CUmemAllocationProp p; memset(&p, 0xff, sizeof p); P("props from handle", cuMemGetAllocationPropertiesFromHandle(&p, h));
      printf("  type %d loc.type %d loc.id %d handletypes %d\n", (int)p.type, (int)p.location.type, p.location.id, (int)p.requestedHandleTypes); }
    P("export fabric of posix handle", ({ char fb[64]; cuMemExportToShareableHandle(fb, h, CU_MEM_HANDLE_TYPE_FABRIC, 0); }));
    P("export NONE type", ({ int fd; cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_NONE, 0); }));
    { int fd1 = -1, fd2 = -1; P("export fd", cuMemExportToShareableHandle(&fd1, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      P("export fd again", cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); printf("  fds %d %d\n", fd1, fd2);
      CUmemGenericAllocationHandle hi = 0;
      P("import own fd", cuMemImportFromShareableHandle(&hi, (void *)(long)fd1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); printf("  import == create handle: %d\n", hi == h);
      { CUmemAllocationProp p; memset(&p, 0, sizeof p); cuMemGetAllocationPropertiesFromHandle(&p, hi); printf("  imported handletypes %d\n", (int)p.requestedHandleTypes); }
      if (hi) P("release imported", cuMemRelease(hi));
      close(fd1); close(fd2);
      int dn = open("/dev/null", O_RDWR);
      P("import /dev/null fd", cuMemImportFromShareableHandle(&hi, (void *)(long)dn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); close(dn);
      P("import closed fd", cuMemImportFromShareableHandle(&hi, (void *)(long)fd1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      char junk[64]; memset(junk, 0x5a, sizeof junk);
      P("import garbage fabric", cuMemImportFromShareableHandle(&hi, junk, CU_MEM_HANDLE_TYPE_FABRIC)); }
    { CUmemGenericAllocationHandle hn = 0; mk(&hn, 2 * MB, CU_MEM_HANDLE_TYPE_NONE); int fd;
      P("export fd of NONE handle", cuMemExportToShareableHandle(&fd, hn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); cuMemRelease(hn); }
    P("unmap partial (2 of 4 MiB)", cuMemUnmap(base, 2 * MB));
    P("unmap unaligned start while mapped", cuMemUnmap(base + 4096, 4 * MB));
    P("unmap 8 MiB over 4 MiB mapping", cuMemUnmap(base, 8 * MB));
    { CUdeviceptr b = 0; size_t s = 0; r = cuMemGetAddressRange(&b, &s, base); printf("  mapping still there: %s\n", en(r)); }
    P("remap whole", cuMemMap(base, 4 * MB, 0, h, 0));
    P("address free while mapped", cuMemAddressFree(base, 64 * MB));
    P("release while mapped", cuMemRelease(h));
    D("map released handle", cuMemMap(base + 16 * MB, 4 * MB, 0, h, 0));
    P("unmap", cuMemUnmap(base, 4 * MB));
    D("unmap again", cuMemUnmap(base, 4 * MB));
    P("unmap never-mapped range", cuMemUnmap(base + 32 * MB, 4 * MB));
    D("map freed handle (no mapping left)", cuMemMap(base, 4 * MB, 0, h, 0));
    /* two chunks, one unmap / one set access across both */
    mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE); mk(&h2, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
    cuMemMap(base, 2 * MB, 0, h, 0); cuMemMap(base + 2 * MB, 2 * MB, 0, h2, 0);
    P("set access across 2 mappings", acc(base, 4 * MB));
    P("memset across 2 mappings", cuMemsetD8(base, 7, 4 * MB));
    { CUdeviceptr b = 0; size_t s = 0; cuMemGetAddressRange(&b, &s, base + 3 * MB); printf("  range of 2nd: base+%llu MiB size %zu MiB\n", (unsigned long long)((b - base) >> 20), s >> 20); }
    P("unmap across 2 mappings", cuMemUnmap(base, 4 * MB));
    cuMemRelease(h); cuMemRelease(h2);
    P("address free", cuMemAddressFree(base, 64 * MB));
    D("address free again", cuMemAddressFree(base, 64 * MB));

    /* release semantics, 1 GiB */
#define C(e) do { CUresult r_ = (e); if (r_) printf("  FAILED %s: %s\n", #e, en(r_)); } while (0)
    size_t G = 1ull << 30;
    cuMemGetInfo(&f0, &tot);
    C(cuMemAddressReserve(&base, G, 0, 0, 0));
    C(mk(&h, G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); printf("held after create: %lld MiB\n", heldmb(f0));
    C(cuMemMap(base, G, 0, h, 0)); C(acc(base, G)); printf("held mapped, handle kept: %lld MiB\n", heldmb(f0));
    C(cuMemUnmap(base, G)); printf("held after unmap, handle kept: %lld MiB\n", heldmb(f0));
    C(cuMemRelease(h)); printf("held after release: %lld MiB\n", heldmb(f0));
    C(mk(&h, G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); C(cuMemMap(base, G, 0, h, 0)); C(acc(base, G)); C(cuMemRelease(h));
    printf("held mapped after eager release: %lld MiB\n", heldmb(f0));
    { int fd = -1; CUmemGenericAllocationHandle hr = 0; C(cuMemRetainAllocationHandle(&hr, (void *)base));
      C(cuMemExportToShareableHandle(&fd, hr, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); C(cuMemRelease(hr));
      C(cuMemUnmap(base, G)); printf("held after unmap, fd open: %lld MiB\n", heldmb(f0));
      CUmemGenericAllocationHandle hi = 0; r = cuMemImportFromShareableHandle(&hi, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      printf("reimport after all released: %s\n", en(r)); if (hi) C(cuMemRelease(hi));
      close(fd); printf("held after close: %lld MiB\n", heldmb(f0)); }
    C(mk(&h, G, CU_MEM_HANDLE_TYPE_NONE)); C(cuMemMap(base, G, 0, h, 0)); C(acc(base, G));
    { CUmemGenericAllocationHandle hr = 0; C(cuMemRetainAllocationHandle(&hr, (void *)base)); C(cuMemRelease(h));
      C(cuMemUnmap(base, G)); printf("held after unmap, retained never released: %lld MiB\n", heldmb(f0)); C(cuMemRelease(hr));
      printf("held after releasing the retained: %lld MiB\n", heldmb(f0)); }
    C(cuMemAddressFree(base, G));
    /* cuGetProcAddress */
    { void *p = NULL; CUdriverProcAddressQueryResult st = -1;
      P("procaddr cuMemGetInfo@12000", cuGetProcAddress("cuMemGetInfo", &p, 12000, 0, &st));
      void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      printf("  == dlsym cuMemGetInfo_v2: %d, status %d\n", lib && p == dlsym(lib, "cuMemGetInfo_v2"), (int)st);
      P("procaddr cuMemGetInfo@3000", cuGetProcAddress("cuMemGetInfo", &p, 3000, 0, &st));
      printf("  == dlsym cuMemGetInfo: %d, status %d\n", lib && p == dlsym(lib, "cuMemGetInfo"), (int)st);
      P("procaddr cuMemCreate@12000", cuGetProcAddress("cuMemCreate", &p, 12000, 0, &st)); printf("  status %d\n", (int)st);
      P("procaddr cuMemCreate@10000", cuGetProcAddress("cuMemCreate", &p, 10000, 0, &st)); printf("  status %d\n", (int)st);
      P("procaddr nonexistent", cuGetProcAddress("cuNoSuchThing", &p, 12000, 0, &st)); printf("  status %d p %p\n", (int)st, p);
      P("procaddr cuGetProcAddress@12000", cuGetProcAddress("cuGetProcAddress", &p, 12000, 0, &st));
      printf("  == v2: %d\n", lib && p == dlsym(lib, "cuGetProcAddress_v2"));
      P("procaddr cuMemcpyHtoD@12000", cuGetProcAddress("cuMemcpyHtoD", &p, 12000, 0, &st));
      printf("  == v2: %d\n", lib && p == dlsym(lib, "cuMemcpyHtoD_v2"));
      P("procaddr cuEventElapsedTime@12000", cuGetProcAddress("cuEventElapsedTime", &p, 12000, 0, &st));
      printf("  == plain: %d  == v2: %d\n", lib && p == dlsym(lib, "cuEventElapsedTime"), lib && p == dlsym(lib, "cuEventElapsedTime_v2"));
      P("procaddr cuCtxCreate@12000", cuGetProcAddress("cuCtxCreate", &p, 12000, 0, &st));
      printf("  == v2: %d  == v3 %d\n", lib && p == dlsym(lib, "cuCtxCreate_v2"), lib && p == dlsym(lib, "cuCtxCreate_v3"));
      P("procaddr cuStreamGetCaptureInfo@12000 ptds", cuGetProcAddress("cuMemcpyHtoD", &p, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
      printf("  == v2_ptds: %d\n", lib && p == dlsym(lib, "cuMemcpyHtoD_v2_ptds"));
    }
    { const char *s; P("error name of 999999", cuGetErrorName((CUresult)999999, &s)); P("error string of 2", cuGetErrorString((CUresult)2, &s)); printf("  '%s'\n", s); }
    return 0;
}
