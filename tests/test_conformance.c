/* test_conformance: driver-API sequences whose answers were measured on the
 * H200 (tests/probe/h200-answers.txt).  It runs against the simulated driver
 * in CI and against the real driver on a GPU machine; where they differ,
 * the sim is wrong.  Cases that crash the real driver (a bogus handle, a
 * handle whose memory is already freed) are asked of the sim only. */
#include <fcntl.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)
#define GB (1ull << 30)

static CUdevice dev;
static int sim;

static CUmemAllocationProp prop_of(CUmemAllocationHandleType t)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = t;
    return p;
}

static CUresult mk(CUmemGenericAllocationHandle *h, size_t sz, CUmemAllocationHandleType t)
{
    CUmemAllocationProp p = prop_of(t);
    return cuMemCreate(h, sz, &p, 0);
}

static CUresult acc(CUdeviceptr a, size_t sz)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(a, sz, &d, 1);
}

#define EXPECT(expr, want)                                                                            \
    do {                                                                                              \
        CUresult r_ = (expr);                                                                         \
        t_checks++;                                                                                   \
        if (r_ != (want)) {                                                                           \
            const char *n_ = "?";                                                                     \
            cuGetErrorName(r_, &n_);                                                                  \
            t_failures++;                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s, the H200 answers %s\n", __FILE__, __LINE__, #expr, n_, #want); \
        }                                                                                             \
    } while (0)

static void misuse(void)
{
    CUmemGenericAllocationHandle h = 0;
    EXPECT(mk(&h, 1 * MB, CU_MEM_HANDLE_TYPE_NONE), CUDA_ERROR_INVALID_VALUE);
    EXPECT(mk(&h, 3 * MB, CU_MEM_HANDLE_TYPE_NONE), CUDA_ERROR_INVALID_VALUE);
    EXPECT(mk(&h, 0, CU_MEM_HANDLE_TYPE_NONE), CUDA_ERROR_INVALID_VALUE);
    EXPECT(mk(&h, 1ull << 40, CU_MEM_HANDLE_TYPE_NONE), CUDA_ERROR_OUT_OF_MEMORY);
    if (!getenv("FABSIM_FABRIC"))
        EXPECT(mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_FABRIC), CUDA_ERROR_NOT_PERMITTED);
    EXPECT(cuMemCreate(&h, 2 * MB, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    {
        CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_NONE);
        p.location.id = 99;
        EXPECT(cuMemCreate(&h, 2 * MB, &p, 0), CUDA_ERROR_INVALID_DEVICE);
    }
    EXPECT(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    if (sim)
        EXPECT(cuMemRelease((CUmemGenericAllocationHandle)0x1234567), CUDA_ERROR_INVALID_VALUE); /* real: segfault */
    EXPECT(mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE), CUDA_SUCCESS);
    EXPECT(cuMemRelease(h), CUDA_SUCCESS);
    if (sim)
        EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE); /* real: INVALID_VALUE once seen; can crash */

    CUdeviceptr base = 0, b2 = 0;
    EXPECT(cuMemAddressReserve(&base, 1 * MB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressReserve(&base, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressReserve(&base, 6 * MB, 3 * MB, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressReserve(&base, 64 * MB, 0, 0, 0), CUDA_SUCCESS);
    CHECK(base % (2 * MB) == 0);
    EXPECT(cuMemAddressReserve(&b2, 2 * MB, 0, base, 0), CUDA_SUCCESS);
    CHECK(b2 != base); /* an occupied hint is not honoured */
    EXPECT(cuMemAddressFree(b2, 2 * MB), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(base, 2 * MB), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressFree(base, 128 * MB), CUDA_ERROR_INVALID_VALUE);

    EXPECT(mk(&h, 4 * MB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_SUCCESS);
    EXPECT(cuMemMap(base, 2 * MB, 2 * MB, h, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemMap(base, 2 * MB, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemMap(base + 4096, 4 * MB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap((CUdeviceptr)0x100000000000ull, 4 * MB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(base, 6 * MB, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemMap(base, 4 * MB, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(acc(base, 4 * MB), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(base, 4 * MB, 0, h, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base, 4 * MB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(base + 8 * MB, 4 * MB, 0, h, 0), CUDA_SUCCESS);
    EXPECT(cuMemUnmap(base + 8 * MB, 4 * MB), CUDA_SUCCESS);
    EXPECT(acc(base, 2 * MB), CUDA_ERROR_INVALID_VALUE);
    EXPECT(acc(base, 4 * MB), CUDA_SUCCESS);
    {
        CUmemLocation l;
        memset(&l, 0, sizeof l);
        l.type = CU_MEM_LOCATION_TYPE_DEVICE;
        l.id = dev;
        unsigned long long fl = 0;
        EXPECT(cuMemGetAccess(&fl, &l, base), CUDA_SUCCESS);
        CHECK(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        EXPECT(cuMemGetAccess(&fl, &l, base + 32 * MB), CUDA_ERROR_INVALID_VALUE);
    }
    {
        CUdeviceptr b = 0;
        size_t s = 0;
        EXPECT(cuMemGetAddressRange(&b, &s, base + 3 * MB), CUDA_SUCCESS);
        CHECK(b == base && s == 4 * MB);
        EXPECT(cuMemGetAddressRange(&b, &s, base + 32 * MB), CUDA_ERROR_NOT_FOUND);
    }
    {
        CUmemGenericAllocationHandle hr = 0;
        EXPECT(cuMemRetainAllocationHandle(&hr, (void *)base), CUDA_SUCCESS);
        CHECK(hr == h);
        cuMemRelease(hr);
        EXPECT(cuMemRetainAllocationHandle(&hr, (void *)(base + 3 * MB)), CUDA_SUCCESS);
        CHECK(hr == h);
        cuMemRelease(hr);
        EXPECT(cuMemRetainAllocationHandle(&hr, (void *)(base + 32 * MB)), CUDA_ERROR_INVALID_VALUE);
    }
    {
        CUmemAllocationProp p;
        memset(&p, 0xff, sizeof p);
        EXPECT(cuMemGetAllocationPropertiesFromHandle(&p, h), CUDA_SUCCESS);
        CHECK(p.type == CU_MEM_ALLOCATION_TYPE_PINNED && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
              p.location.id == dev && p.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    }
    {
        char fb[64];
        int fd1 = -1, fd2 = -1;
        EXPECT(cuMemExportToShareableHandle(fb, h, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemExportToShareableHandle(&fd1, h, CU_MEM_HANDLE_TYPE_NONE, 0), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemExportToShareableHandle(&fd1, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
        EXPECT(cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
        CHECK(fd1 >= 0 && fd2 >= 0 && fd1 != fd2);
        CUmemGenericAllocationHandle hi = 0;
        EXPECT(cuMemImportFromShareableHandle(&hi, (void *)(long)fd1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               CUDA_SUCCESS);
        CHECK(hi != 0 && hi != h); /* a new handle, not the creator's */
        {
            CUmemAllocationProp p;
            memset(&p, 0xff, sizeof p);
            cuMemGetAllocationPropertiesFromHandle(&p, hi);
            CHECK(p.requestedHandleTypes == 0);
        }
        EXPECT(cuMemRelease(hi), CUDA_SUCCESS);
        close(fd1);
        close(fd2);
        int dn = open("/dev/null", O_RDWR);
        EXPECT(cuMemImportFromShareableHandle(&hi, (void *)(long)dn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               CUDA_ERROR_UNKNOWN);
        close(dn);
        EXPECT(cuMemImportFromShareableHandle(&hi, (void *)(long)fd1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               CUDA_ERROR_UNKNOWN);
        memset(fb, 0x5a, sizeof fb);
        EXPECT(cuMemImportFromShareableHandle(&hi, fb, CU_MEM_HANDLE_TYPE_FABRIC), CUDA_ERROR_NOT_SUPPORTED);
    }
    {
        CUmemGenericAllocationHandle hn = 0;
        int fd;
        mk(&hn, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
        EXPECT(cuMemExportToShareableHandle(&fd, hn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               CUDA_ERROR_INVALID_VALUE);
        cuMemRelease(hn);
    }
    EXPECT(cuMemUnmap(base, 2 * MB), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemUnmap(base + 4096, 4 * MB), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemUnmap(base, 8 * MB), CUDA_SUCCESS); /* covers the whole mapping and empty space */
    {
        CUdeviceptr b = 0;
        size_t s = 0;
        EXPECT(cuMemGetAddressRange(&b, &s, base), CUDA_ERROR_NOT_FOUND);
    }
    EXPECT(cuMemMap(base, 4 * MB, 0, h, 0), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(base, 64 * MB), CUDA_ERROR_INVALID_VALUE); /* while mapped */
    EXPECT(cuMemRelease(h), CUDA_SUCCESS);                           /* eager release */
    EXPECT(cuMemMap(base + 16 * MB, 4 * MB, 0, h, 0), CUDA_SUCCESS);  /* alive through its mapping */
    EXPECT(cuMemUnmap(base + 16 * MB, 4 * MB), CUDA_SUCCESS);
    EXPECT(cuMemUnmap(base, 4 * MB), CUDA_SUCCESS);
    EXPECT(cuMemUnmap(base, 4 * MB), CUDA_SUCCESS);          /* nothing mapped: no error */
    EXPECT(cuMemUnmap(base + 32 * MB, 4 * MB), CUDA_SUCCESS);
    if (sim)
        EXPECT(cuMemMap(base, 4 * MB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* real: segfault */

    /* one set-access, memset and unmap across two adjacent mappings */
    CUmemGenericAllocationHandle h2 = 0;
    mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
    mk(&h2, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
    EXPECT(cuMemMap(base, 2 * MB, 0, h, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base + 2 * MB, 2 * MB, 0, h2, 0), CUDA_SUCCESS);
    EXPECT(acc(base, 4 * MB), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(base, 7, 4 * MB), CUDA_SUCCESS);
    {
        unsigned char x[2] = {0, 0};
        cuMemcpyDtoH(&x[0], base + 1, 1);
        cuMemcpyDtoH(&x[1], base + 4 * MB - 1, 1);
        CHECK(x[0] == 7 && x[1] == 7);
        CUdeviceptr b = 0;
        size_t s = 0;
        cuMemGetAddressRange(&b, &s, base + 3 * MB);
        CHECK(b == base + 2 * MB && s == 2 * MB);
    }
    EXPECT(cuMemUnmap(base, 4 * MB), CUDA_SUCCESS);
    cuMemRelease(h);
    cuMemRelease(h2);
    EXPECT(cuMemAddressFree(base, 64 * MB), CUDA_SUCCESS);
    if (sim)
        EXPECT(cuMemAddressFree(base, 64 * MB), CUDA_ERROR_INVALID_VALUE);
}

/* docs/driver-facts.md, "When memory goes back to the driver": a handle
 * never released keeps its memory after the unmap; eager release frees it. */
static void release_semantics(void)
{
    CUdeviceptr base = 0;
    CUmemGenericAllocationHandle h = 0, hr = 0;
    int64_t h0 = t_held();
    CHECK_CU(cuMemAddressReserve(&base, GB, 0, 0, 0));
    CHECK_CU(mk(&h, GB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK(t_near(t_held() - h0, (int64_t)GB));
    CHECK_CU(cuMemMap(base, GB, 0, h, 0));
    CHECK_CU(acc(base, GB));
    CHECK_CU(cuMemUnmap(base, GB));
    CHECK(t_near(t_held() - h0, (int64_t)GB)); /* the seed's leak: the handle keeps it */
    CHECK_CU(cuMemRelease(h));
    CHECK(t_near(t_held() - h0, 0));

    CHECK_CU(mk(&h, GB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK_CU(cuMemMap(base, GB, 0, h, 0));
    CHECK_CU(acc(base, GB));
    CHECK_CU(cuMemRelease(h)); /* eager release */
    CHECK(t_near(t_held() - h0, (int64_t)GB));
    {
        int fd = -1;
        CHECK_CU(cuMemRetainAllocationHandle(&hr, (void *)base));
        CHECK_CU(cuMemExportToShareableHandle(&fd, hr, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        CHECK_CU(cuMemRelease(hr));
        CHECK_CU(cuMemUnmap(base, GB));
        CHECK(t_near(t_held() - h0, (int64_t)GB)); /* the open fd keeps it */
        CUmemGenericAllocationHandle hi = 0;
        CHECK_CU(cuMemImportFromShareableHandle(&hi, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        if (hi)
            CHECK_CU(cuMemRelease(hi));
        close(fd);
        CHECK(t_near(t_held() - h0, 0));
    }
    CHECK_CU(mk(&h, GB, CU_MEM_HANDLE_TYPE_NONE));
    CHECK_CU(cuMemMap(base, GB, 0, h, 0));
    CHECK_CU(acc(base, GB));
    CHECK_CU(cuMemRetainAllocationHandle(&hr, (void *)base));
    CHECK_CU(cuMemRelease(h));
    CHECK_CU(cuMemUnmap(base, GB));
    CHECK(t_near(t_held() - h0, (int64_t)GB)); /* the retained reference, never released */
    CHECK_CU(cuMemRelease(hr));
    CHECK(t_near(t_held() - h0, 0));
    CHECK_CU(cuMemAddressFree(base, GB));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
}

static void proc_address(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    if (!lib)
        return;
    void *p = NULL;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
    EXPECT(cuGetProcAddress("cuMemGetInfo", &p, 12000, 0, &st), CUDA_SUCCESS);
    CHECK(p == dlsym(lib, "cuMemGetInfo_v2") && st == CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT(cuGetProcAddress("cuMemGetInfo", &p, 3000, 0, &st), CUDA_SUCCESS);
    CHECK(p == dlsym(lib, "cuMemGetInfo"));
    EXPECT(cuGetProcAddress("cuMemCreate", &p, 12000, 0, &st), CUDA_SUCCESS);
    CHECK(p == dlsym(lib, "cuMemCreate") && st == CU_GET_PROC_ADDRESS_SUCCESS);
    p = (void *)1;
    cuGetProcAddress("cuMemCreate", &p, 10000, 0, &st);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && p == NULL);
    p = (void *)1;
    EXPECT(cuGetProcAddress("cuNoSuchThing", &p, 12000, 0, &st), CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && p == NULL);
    cuGetProcAddress("cuGetProcAddress", &p, 12000, 0, &st);
    CHECK(p == dlsym(lib, "cuGetProcAddress_v2"));
    cuGetProcAddress("cuMemcpyHtoD", &p, 12000, 0, &st);
    CHECK(p == dlsym(lib, "cuMemcpyHtoD_v2"));
    const char *s = NULL;
    EXPECT(cuGetErrorName((CUresult)999999, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    CHECK(s && strcmp(s, "out of memory") == 0);
}

static void attributes(void)
{
    int v = -1;
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    CHECK(v == 1);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
    CHECK(v == 1);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev);
    CHECK(v == 1);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
    CHECK(v == 1);
    size_t g = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    EXPECT(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    CHECK(g == 2 * MB);
    EXPECT(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
    CHECK(g == 2 * MB);
    int ver = 0;
    cuDriverGetVersion(&ver);
    CHECK(ver >= 12000);
}

/* A number the H200 answered (checked on the sim and the real driver) */
#define EXPECT_NUM(got, want)                                                                                 \
    do {                                                                                                      \
        long long g_ = (long long)(got), w_ = (long long)(want);                                              \
        t_checks++;                                                                                           \
        if (g_ != w_) {                                                                                       \
            t_failures++;                                                                                     \
            fprintf(stderr, "%s:%d: %s -> %lld, the H200 answers %lld\n", __FILE__, __LINE__, #got, g_, w_);   \
        }                                                                                                     \
    } while (0)

/* Answers not yet measured on the H200 (none at present: the RDMA ones were
 * settled on the H200 and are EXPECTs): on the sim, the sim's answer is
 * checked; on the real driver the answer is printed as a RECORD line for
 * the H200 run to settle (a difference is flagged, not failed: the sim is
 * then updated to the driver's answer and the case becomes an EXPECT). */
static int n_differ;
#define RECORD(what, expr, sim_answer)                                                                        \
    do {                                                                                                      \
        CUresult r_ = (expr);                                                                                 \
        const char *n_ = "?", *s_ = "?";                                                                      \
        cuGetErrorName(r_, &n_);                                                                              \
        cuGetErrorName((sim_answer), &s_);                                                                    \
        int same_ = r_ == (sim_answer);                                                                       \
        printf("RECORD %-58s %s%s%s\n", what, n_, same_ ? "" : "   <- the sim answers ", same_ ? "" : s_);    \
        n_differ += !same_;                                                                                   \
        if (sim) {                                                                                            \
            t_checks++;                                                                                       \
            t_failures += !same_;                                                                             \
        }                                                                                                     \
    } while (0)
/* a number the sim must match (on the real driver: printed) */
#define RECORD_NUM(what, got, sim_value)                                                                      \
    do {                                                                                                      \
        long long g_ = (long long)(got), w_ = (long long)(sim_value);                                         \
        printf("RECORD %-58s %lld%s\n", what, g_, g_ == w_ ? "" : "   <- the sim differs");                    \
        n_differ += g_ != w_;                                                                                 \
        if (sim) {                                                                                            \
            t_checks++;                                                                                       \
            t_failures += g_ != w_;                                                                           \
        }                                                                                                     \
    } while (0)

static CUresult mk_rdma(CUmemGenericAllocationHandle *h, size_t sz, int rdma)
{
    CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    p.allocFlags.gpuDirectRDMACapable = (unsigned char)rdma;
    return cuMemCreate(h, sz, &p, 0);
}

/* a dma-buf of [a, a+n): the answer, and the fd's size (lseek SEEK_END) or -1 */
static CUresult dmabuf_of(CUdeviceptr a, size_t n, unsigned long long flags, long long *size)
{
    int fd = -1;
    CUresult r = cuMemGetHandleForAddressRange(&fd, a, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags);
    *size = -1;
    if (r == CUDA_SUCCESS && fd >= 0) {
        *size = (long long)lseek(fd, 0, SEEK_END);
        close(fd);
    }
    return r;
}

/* the RDMA flag, dma-buf export over one and several chunks, and
 * host NUMA memory through VMM.  Every answer here was measured on the
 * H200 (driver 580.159.04; tests/probe/h200-rdma.sh). */
static void rdma_dmabuf(void)
{
    int v = -1;
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
    CHECK(v == 1); /* H200: 1 */
    CUdeviceptr base = 0;
    long long sz = 0;
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
    CHECK_CU(cuMemAddressReserve(&base, 64 * MB, 0, 0, 0));
    EXPECT(mk_rdma(&h1, 2 * MB, 1), CUDA_SUCCESS); /* H200: created and mapped normally */
    EXPECT(mk_rdma(&h2, 2 * MB, 1), CUDA_SUCCESS);
    EXPECT(mk_rdma(&h3, 2 * MB, 0), CUDA_SUCCESS);
    {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        cuMemGetAllocationPropertiesFromHandle(&p, h1);
        EXPECT_NUM(p.allocFlags.gpuDirectRDMACapable, 1); /* props of a chunk made with the RDMA flag: flag */
        memset(&p, 0, sizeof p);
        cuMemGetAllocationPropertiesFromHandle(&p, h3);
        EXPECT_NUM(p.allocFlags.gpuDirectRDMACapable, 0); /* props of a chunk made without it: flag */
    }
    EXPECT(cuMemMap(base, 2 * MB, 0, h1, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base + 2 * MB, 2 * MB, 0, h2, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base + 8 * MB, 2 * MB, 0, h3, 0), CUDA_SUCCESS);
    EXPECT(acc(base, 4 * MB), CUDA_SUCCESS);
    EXPECT(acc(base + 8 * MB, 2 * MB), CUDA_SUCCESS);
    {
        CUmemGenericAllocationHandle hr = 0;
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        cuMemRetainAllocationHandle(&hr, (void *)(base + 3 * MB));
        cuMemGetAllocationPropertiesFromHandle(&p, hr);
        cuMemRelease(hr);
        /* props from a retained handle of a mapped RDMA chunk: flag */
        EXPECT_NUM(p.allocFlags.gpuDirectRDMACapable, 1);
    }
    EXPECT(dmabuf_of(base, 2 * MB, 0, &sz), CUDA_SUCCESS); /* dma-buf of one chunk */
    EXPECT_NUM(sz, 2 * MB); /* its lseek size */
    EXPECT(dmabuf_of(base, 4 * MB, 0, &sz), CUDA_SUCCESS); /* H200: one fd over two separate chunks */
    EXPECT_NUM(sz, 4 * MB); /* dma-buf of two chunks: lseek size */
    EXPECT(dmabuf_of(base + MB, 2 * MB, 0, &sz), CUDA_SUCCESS); /* dma-buf inside two chunks (base+1MiB, 2 MiB) */
    EXPECT_NUM(sz, 2 * MB); /* its lseek size */
    /* dma-buf of one page inside a chunk (base+64KiB, 4 KiB) */
    EXPECT(dmabuf_of(base + 65536, 4096, 0, &sz), CUDA_SUCCESS);
    EXPECT_NUM(sz, 4096); /* its lseek size */
    /* dma-buf at an address off the page (base+100) */
    EXPECT(dmabuf_of(base + 100, 2 * MB, 0, &sz), CUDA_ERROR_INVALID_VALUE);
    /* dma-buf of a size off the page (2 MiB + 100) */
    EXPECT(dmabuf_of(base, 2 * MB + 100, 0, &sz), CUDA_ERROR_INVALID_VALUE);
    EXPECT(dmabuf_of(base, 0, 0, &sz), CUDA_ERROR_INVALID_VALUE); /* dma-buf of size 0 */
    /* dma-buf over a hole (chunk, 2 MiB unmapped, chunk) */
    EXPECT(dmabuf_of(base + 2 * MB, 8 * MB, 0, &sz), CUDA_ERROR_INVALID_VALUE);
    EXPECT_NUM(sz, -1); /* its lseek size (-1: no fd) */
    /* dma-buf of unmapped reserved space */
    EXPECT(dmabuf_of(base + 16 * MB, 2 * MB, 0, &sz), CUDA_ERROR_INVALID_VALUE);
    EXPECT(dmabuf_of(base + 8 * MB, 2 * MB, 0, &sz), CUDA_SUCCESS); /* dma-buf of a chunk made without the RDMA flag */
    {
        CUmemGenericAllocationHandle h4 = 0;
        mk_rdma(&h4, 2 * MB, 0);
        cuMemMap(base + 10 * MB, 2 * MB, 0, h4, 0);
        acc(base + 10 * MB, 2 * MB);
        cuMemRelease(h4);
        /* dma-buf over two chunks made without the flag */
        EXPECT(dmabuf_of(base + 8 * MB, 4 * MB, 0, &sz), CUDA_SUCCESS);
        cuMemUnmap(base + 10 * MB, 2 * MB);
        mk_rdma(&h4, 2 * MB, 1);
        cuMemMap(base + 10 * MB, 2 * MB, 0, h4, 0);
        acc(base + 10 * MB, 2 * MB);
        cuMemRelease(h4);
        EXPECT(dmabuf_of(base + 8 * MB, 4 * MB, 0, &sz), CUDA_SUCCESS); /* an unflagged and a flagged chunk (mixed) */
        cuMemUnmap(base + 10 * MB, 2 * MB);
    }
    EXPECT(dmabuf_of(base, 2 * MB, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE, &sz), CUDA_ERROR_NOT_SUPPORTED);
    {
        int fd = -1;
        /* range handle of an unknown type (2) */
        EXPECT(cuMemGetHandleForAddressRange(&fd, base, 2 * MB, (CUmemRangeHandleType)2, 0), CUDA_ERROR_INVALID_VALUE);
        if (fd >= 0)
            close(fd);
    }
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.dmabuf_fds == 0);
    }
    cuMemUnmap(base, 16 * MB);
    cuMemRelease(h1);
    cuMemRelease(h2);
    cuMemRelease(h3);

    /* an open dma-buf after unmap and release: does it keep the memory? (256 MiB, to see it in cuMemGetInfo) */
    {
        CUmemGenericAllocationHandle h = 0;
        int fd = -1;
        int64_t h0 = t_held();
        CHECK_CU(mk_rdma(&h, 256 * MB, 1));
        CUdeviceptr big = 0;
        CHECK_CU(cuMemAddressReserve(&big, 256 * MB, 0, 0, 0));
        CHECK_CU(cuMemMap(big, 256 * MB, 0, h, 0));
        CHECK_CU(acc(big, 256 * MB));
        CHECK_CU(cuMemRelease(h));
        CHECK_CU(cuMemGetHandleForAddressRange(&fd, big, 256 * MB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
        if (sim)
            CHECK(t_ledger().dmabuf_fds == 1);
        CHECK_CU(cuMemUnmap(big, 256 * MB));
        /* held after unmap and release, dma-buf open, in 16 MiB (other processes on the GPU move the reading
         * by a MiB or so: held.h) */
        EXPECT_NUM((t_held() - h0 + 8 * (int64_t)MB) / (16 * (int64_t)MB), 16);
        if (fd >= 0)
            close(fd);
        EXPECT_NUM((t_held() - h0 + 8 * (int64_t)MB) / (16 * (int64_t)MB), 0); /* 16 MiB held after its close */
        if (sim)
            CHECK(t_ledger().dmabuf_fds == 0 && t_ledger().bytes_held == 0);
        CHECK_CU(cuMemAddressFree(big, 256 * MB));
    }

    /* host NUMA memory through VMM: an offload target mapped with the same calls */
    {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        p.location.id = 0;
        size_t g = 0;
        EXPECT(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
        CHECK(g == 2 * MB); /* H200: 2 MiB */
        int64_t d0 = t_held();
        CUmemGenericAllocationHandle hh = 0;
        EXPECT(cuMemCreate(&hh, 4 * MB, &p, 0), CUDA_SUCCESS); /* H200: works */
        CHECK(t_near(t_held() - d0, 0));                       /* not device memory */
        if (sim)
            CHECK(t_ledger().bytes_held_host == 4 * MB);
        {
            CUmemAllocationProp q;
            memset(&q, 0, sizeof q);
            cuMemGetAllocationPropertiesFromHandle(&q, hh);
            EXPECT_NUM(q.location.type, 3); /* props of host NUMA memory: location type (3: HOST_NUMA) */
        }
        EXPECT(cuMemMap(base, 4 * MB, 0, hh, 0), CUDA_SUCCESS); /* map host NUMA memory */
        EXPECT(acc(base, 4 * MB), CUDA_SUCCESS); /* device access to it */
        {
            CUmemAccessDesc d;
            memset(&d, 0, sizeof d);
            d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            d.location.id = 0;
            d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            EXPECT(cuMemSetAccess(base, 4 * MB, &d, 1), CUDA_SUCCESS); /* host (HOST_NUMA) access to it */
        }
        uint64_t in[4] = {1, 2, 3, 0xfab}, out[4] = {0, 0, 0, 0};
        /* copy host -> host NUMA memory (cuMemcpyHtoD) */
        EXPECT(cuMemcpyHtoD(base + 4 * MB - sizeof in, in, sizeof in), CUDA_SUCCESS);
        /* copy it back (cuMemcpyDtoH) */
        EXPECT(cuMemcpyDtoH(out, base + 4 * MB - sizeof out, sizeof out), CUDA_SUCCESS);
        EXPECT_NUM(memcmp(in, out, sizeof in) == 0, 1); /* the data read back intact */
        EXPECT(cuMemsetD8(base, 0x5a, 4 * MB), CUDA_SUCCESS); /* memset of it (cuMemsetD8) */
        {
            unsigned char c = 0;
            cuMemcpyDtoH(&c, base + 3 * MB, 1);
            EXPECT_NUM(c, 0x5a); /* a byte read back */
        }
        {
            /* device memory <-> host NUMA memory by device-to-device copies: the copies of fabpool_sleep's
             * offload and of fabpool_wake (lib/sleep.c).  Not measured on the H200 yet: perf/h200/sleep.sh runs
             * this test there. */
            CUmemGenericAllocationHandle hd = 0;
            mk(&hd, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
            cuMemMap(base + 16 * MB, 2 * MB, 0, hd, 0);
            cuMemRelease(hd);
            acc(base + 16 * MB, 2 * MB);
            uint64_t sv[4] = {7, 8, 9, 0xdead}, sw[4] = {0, 0, 0, 0};
            cuMemcpyHtoD(base + 16 * MB, sv, sizeof sv);
            /* copy device -> host NUMA memory (cuMemcpyDtoDAsync) */
            EXPECT(cuMemcpyDtoDAsync(base + 4096, base + 16 * MB, sizeof sv, NULL), CUDA_SUCCESS);
            cuCtxSynchronize();
            cuMemsetD8(base + 16 * MB, 0, sizeof sv);
            /* copy host NUMA memory -> device (cuMemcpyDtoDAsync) */
            EXPECT(cuMemcpyDtoDAsync(base + 16 * MB, base + 4096, sizeof sv, NULL), CUDA_SUCCESS);
            cuCtxSynchronize();
            cuMemcpyDtoH(sw, base + 16 * MB, sizeof sw);
            EXPECT_NUM(memcmp(sv, sw, sizeof sv) == 0, 1); /* the data came back through host NUMA memory */
            cuMemUnmap(base + 16 * MB, 2 * MB);
        }
        EXPECT(dmabuf_of(base, 4 * MB, 0, &sz), CUDA_ERROR_INVALID_VALUE); /* dma-buf of host NUMA memory */
        {
            CUmemAccessDesc d;
            memset(&d, 0, sizeof d);
            d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CUmemGenericAllocationHandle hd = 0;
            mk(&hd, 2 * MB, CU_MEM_HANDLE_TYPE_NONE);
            cuMemMap(base + 8 * MB, 2 * MB, 0, hd, 0);
            cuMemRelease(hd);
            /* HOST_NUMA access to device memory */
            EXPECT(cuMemSetAccess(base + 8 * MB, 2 * MB, &d, 1), CUDA_ERROR_NOT_SUPPORTED);
            cuMemUnmap(base + 8 * MB, 2 * MB);
        }
        EXPECT(cuMemUnmap(base, 4 * MB), CUDA_SUCCESS);
        EXPECT(cuMemRelease(hh), CUDA_SUCCESS);
        if (sim)
            CHECK(t_ledger().bytes_held_host == 0);
        p.allocFlags.gpuDirectRDMACapable = 1;
        hh = 0;
        /* create host NUMA memory with the RDMA flag */
        EXPECT(cuMemCreate(&hh, 2 * MB, &p, 0), CUDA_ERROR_INVALID_VALUE);
        if (hh)
            cuMemRelease(hh);
        p.allocFlags.gpuDirectRDMACapable = 0;
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
        hh = 0;
        EXPECT(cuMemCreate(&hh, 2 * MB, &p, 0), CUDA_ERROR_INVALID_VALUE); /* create HOST_NUMA_CURRENT memory */
        if (hh)
            cuMemRelease(hh);
        p.location.type = CU_MEM_LOCATION_TYPE_HOST;
        hh = 0;
        EXPECT(cuMemCreate(&hh, 2 * MB, &p, 0), CUDA_SUCCESS); /* create HOST memory (no NUMA node) */
        if (sim)
            CHECK(t_ledger().bytes_held_host == 2 * MB); /* host memory, not the device's */
        if (hh)
            EXPECT(cuMemRelease(hh), CUDA_SUCCESS);
    }
    CHECK_CU(cuMemAddressFree(base, 64 * MB));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.bytes_held == 0 && l.bytes_held_host == 0 && l.dmabuf_fds == 0);
    }
}

/* Device-to-device copies between mappings of several chunks, with unaligned
 * ends, where the source was written in two places only and the destination
 * everywhere: every byte reads back as memmove would leave it (the sim copies
 * only what was written and turns the rest into holes). */
static void sparse_copies(void)
{
    CUdeviceptr base = 0;
    EXPECT(cuMemAddressReserve(&base, 16 * MB, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h[3] = {0, 0, 0};
    static const uint64_t at[3] = {0, 2 * MB, 8 * MB}, sz[3] = {2 * MB, 2 * MB, 4 * MB};
    for (int i = 0; i < 3; i++) {
        EXPECT(mk(&h[i], sz[i], CU_MEM_HANDLE_TYPE_NONE), CUDA_SUCCESS);
        EXPECT(cuMemMap(base + at[i], sz[i], 0, h[i], 0), CUDA_SUCCESS);
        EXPECT(cuMemRelease(h[i]), CUDA_SUCCESS);
    }
    EXPECT(acc(base, 4 * MB), CUDA_SUCCESS);
    EXPECT(acc(base + 8 * MB, 4 * MB), CUDA_SUCCESS);
    unsigned char *buf = malloc(4 * MB), *want = malloc(4 * MB);
    if (!buf || !want) {
        CHECK(0);
    } else {
        memset(buf, 0xab, 4 * MB);
        EXPECT(cuMemcpyHtoD(base + 8 * MB, buf, 4 * MB), CUDA_SUCCESS);
        memset(buf, 0, 4 * MB);
        if (!sim) /* a fresh chunk's bytes are unspecified on a GPU; the sim's read as zeros, never written */
            EXPECT(cuMemcpyHtoD(base, buf, 4 * MB), CUDA_SUCCESS);
        uint64_t v = 0x0123456789abcdefull, w = 0xfedcba9876543210ull;
        EXPECT(cuMemcpyHtoD(base + 3 * 4096 + 7, &v, 8), CUDA_SUCCESS);
        EXPECT(cuMemcpyHtoD(base + 2 * MB - 4, &w, 8), CUDA_SUCCESS); /* across the two source chunks */
        EXPECT(cuMemcpyDtoD(base + 8 * MB + 100, base + 100, 4 * MB - 300), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(buf, base + 8 * MB, 4 * MB), CUDA_SUCCESS);
        memset(want, 0xab, 4 * MB);
        memset(want + 100, 0, 4 * MB - 300);
        memcpy(want + 3 * 4096 + 7, &v, 8);
        memcpy(want + 2 * MB - 4, &w, 8);
        CHECK(memcmp(buf, want, 4 * MB) == 0);
    }
    free(buf);
    free(want);
    EXPECT(cuMemUnmap(base, 4 * MB), CUDA_SUCCESS);
    EXPECT(cuMemUnmap(base + 8 * MB, 4 * MB), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(base, 16 * MB), CUDA_SUCCESS);
}

/* The sim's own hooks (sim only): fabsim_range_mapped answers what a kernel writing the range would find;
 * the ledger counts an exported fd while the fd the sim handed out is open, and forgets it once the
 * kernel hands its number out again (here to the sim itself, for the same memory). */
static void sim_hooks(void)
{
    int (*mapped)(const void *, size_t) = NULL;
    *(void **)&mapped = dlsym(RTLD_DEFAULT, "fabsim_range_mapped");
    CHECK(mapped != NULL);
    if (!mapped)
        return;
    CUdeviceptr base = 0;
    CUmemGenericAllocationHandle h = 0, hi = 0;
    CHECK_CU(cuMemAddressReserve(&base, 8 * MB, 0, 0, 0));
    CHECK_CU(mk(&h, 4 * MB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK_CU(cuMemMap(base, 4 * MB, 0, h, 0));
    CHECK(!mapped((void *)base, 4 * MB)); /* no access granted yet */
    CHECK_CU(acc(base, 4 * MB));
    CHECK(mapped((void *)base, 4 * MB) && mapped((void *)(base + MB), 10) && mapped((void *)(base + 8 * MB), 0));
    CHECK(!mapped((void *)base, 4 * MB + 1) && !mapped((void *)(base + 4 * MB), 1));
    int fd = -1;
    CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int copy = dup(fd), fill[64], nfill = 0;
    CHECK_CU(cuMemUnmap(base, 4 * MB));
    CHECK_CU(cuMemRelease(h)); /* the sim closes its own fd; the exported one keeps the memory */
    CHECK(!mapped((void *)base, 1));
    close(fd); /* now the copy does */
    /* every free number below fd taken, so that the import's own fd of the memory gets fd's number */
    for (int x; nfill < 64 && (x = open("/dev/null", O_RDONLY)) >= 0;) {
        if (x >= fd) {
            close(x);
            break;
        }
        fill[nfill++] = x;
    }
    CHECK_CU(cuMemImportFromShareableHandle(&hi, (void *)(long)copy, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK(t_ledger().exported_fds == 0);
    if (hi)
        CHECK_CU(cuMemRelease(hi));
    close(copy);
    while (nfill)
        close(fill[--nfill]);
    CHECK_CU(cuMemAddressFree(base, 8 * MB));
    fabsim_ledger l = t_ledger();
    CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
}

int main(void)
{
    /* VMM calls need no current context; cuMemGetInfo does */
    CHECK_CU(cuInit(0));
    CUcontext c = (CUcontext)1;
    cuCtxGetCurrent(&c);
    CHECK(c == NULL);
    size_t f, t;
    EXPECT(cuMemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    cuDeviceGet(&dev, 0);
    {
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr a = 0;
        EXPECT(mk(&h, 2 * MB, CU_MEM_HANDLE_TYPE_NONE), CUDA_SUCCESS);
        EXPECT(cuMemRelease(h), CUDA_SUCCESS);
        EXPECT(cuMemAddressReserve(&a, 2 * MB, 0, 0, 0), CUDA_SUCCESS);
        EXPECT(cuMemAddressFree(a, 2 * MB), CUDA_SUCCESS);
    }
    sim = t_driver_init();
    printf("driver: %s\n", sim ? "simulated" : "real");
    attributes();
    misuse();
    release_semantics();
    proc_address();
    rdma_dmabuf();
    sparse_copies();
    if (sim)
        sim_hooks();
    if (!sim)
        printf("RECORD: %d answer%s differ from the sim's: update sim/ and make them EXPECTs\n", n_differ,
               n_differ == 1 ? "" : "s");
    return t_done("test_conformance");
}
