/* The staging ring (stage_copy.c) on the simulated driver: bytes bitwise
 * through device memory and back for many sizes (tails of 0 and 1 byte past
 * a buffer, items smaller than a buffer packed together), every lane count;
 * the pinned buffers counted and freed; a failed pinned allocation, a failed
 * DMA and a failed event wait each return the error with nothing left held
 * and the ring usable again; pageable host copies mapped, aligned, counted
 * and given back; fresh host pages faulted in ahead of the copies, or filled by UFFDIO_COPY; a ring made before
 * a fork refuses a copy in the child. */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "../../sim/fabsim.h"
#include "../../tests/unit.h"
#include "stage_copy.h"

/* pinned host memory: malloc, counted, failing on request (the sim has none) */
static long live_pinned, fail_pinned_at;
static int fake_host_alloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    if (fail_pinned_at && --fail_pinned_at == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = malloc(n);
    if (!*p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&live_pinned, 1, __ATOMIC_SEQ_CST);
    return 0;
}
static int fake_free_host(void *p)
{
    free(p);
    __atomic_sub_fetch(&live_pinned, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static fabpool_torch_stage_driver driver(void)
{
    fabpool_torch_stage_driver d = {0};
#define SET(f, fn) d.f = (void *)(uintptr_t)(fn)
    SET(mem_host_alloc, fake_host_alloc);
    SET(mem_free_host, fake_free_host);
    SET(device_get, cuDeviceGet);
    SET(primary_ctx_retain, cuDevicePrimaryCtxRetain);
    SET(primary_ctx_release, cuDevicePrimaryCtxRelease_v2);
    SET(ctx_get_current, cuCtxGetCurrent);
    SET(ctx_set_current, cuCtxSetCurrent);
    SET(stream_create, cuStreamCreate);
    SET(stream_destroy, cuStreamDestroy_v2);
    SET(stream_synchronize, cuStreamSynchronize);
    SET(event_create, cuEventCreate);
    SET(event_destroy, cuEventDestroy_v2);
    SET(event_record, cuEventRecord);
    SET(event_synchronize, cuEventSynchronize);
    SET(memcpy_dtoh_async, cuMemcpyDtoHAsync_v2);
    SET(memcpy_htod_async, cuMemcpyHtoDAsync_v2);
#undef SET
    return d;
}

static unsigned char pat(size_t i, unsigned seed)
{
    return (unsigned char)((i * 131u + seed * 7u + (i >> 11)) % 251u);
}

#define BUF (64u << 10)
#define NITEMS 14
static const uint64_t sizes[NITEMS] = {0, 1, BUF - 1, BUF, BUF + 1, 3 * BUF + 7, 4096, 1, 0, 100, 2 * BUF,
                                       5 * BUF - 1, 12345, 7};

/* device items filled with a pattern, copied out to host copies (pageable
 * mappings), the device cleared, copied back: every byte compared */
static void round_trip(fabpool_torch_stage *s, unsigned seed)
{
    fabpool_torch_stage_item it[NITEMS];
    char err[256] = "";
    for (int i = 0; i < NITEMS; i++) {
        CUdeviceptr d = 0;
        CUresult cr = cuMemAlloc_v2(&d, sizes[i] ? sizes[i] : 1);
        CHECK(cr == CUDA_SUCCESS);
        if (cr != CUDA_SUCCESS)
            abort();
        unsigned char *dp = (unsigned char *)(uintptr_t)d;
        for (size_t k = 0; k < sizes[i]; k++)
            dp[k] = pat(k, seed + (unsigned)i);
        uint64_t h = 0;
        CHECK(fabpool_torch_stage_host_map(sizes[i], &h, err, sizeof err) == 0);
        CHECK((sizes[i] == 0) == (h == 0));
        it[i] = (fabpool_torch_stage_item){h, d, sizes[i]};
    }
    CHECK(fabpool_torch_stage_copy(s, it, NITEMS, 1, err, sizeof err) == 0);
    int same = 1;
    for (int i = 0; i < NITEMS; i++) {
        unsigned char *hp = (unsigned char *)(uintptr_t)it[i].host;
        for (size_t k = 0; k < sizes[i] && same; k++)
            same = hp[k] == pat(k, seed + (unsigned)i);
        memset((void *)(uintptr_t)it[i].dev, 0xee, sizes[i]);
    }
    CHECK(same);
    CHECK(fabpool_torch_stage_copy(s, it, NITEMS, 0, err, sizeof err) == 0);
    for (int i = 0; i < NITEMS; i++) {
        unsigned char *dp = (unsigned char *)(uintptr_t)it[i].dev;
        for (size_t k = 0; k < sizes[i] && same; k++)
            same = dp[k] == pat(k, seed + (unsigned)i);
        CHECK(fabpool_torch_stage_host_unmap(it[i].host, it[i].bytes, err, sizeof err) == 0);
        CHECK(cuMemFree_v2(it[i].dev) == CUDA_SUCCESS);
    }
    CHECK(same);
    if (!same)
        fprintf(stderr, "round trip with %llu pinned bytes: bytes differ\n",
                (unsigned long long)fabpool_torch_stage_pinned_bytes(s));
}

static void test_bytes_bitwise_every_lane_count(const fabpool_torch_stage_driver *d)
{
    char err[256] = "";
    for (unsigned lanes = 1; lanes <= 5; lanes++) {
        fabpool_torch_stage *s = NULL;
        CHECK(fabpool_torch_stage_create(d, 0, lanes, BUF, &s, err, sizeof err) == 0 && s);
        if (!s) {
            fprintf(stderr, "create: %s\n", err);
            continue;
        }
        CHECK(fabpool_torch_stage_pinned_bytes(s) == 2ull * lanes * BUF);
        CHECK(live_pinned == 2 * (long)lanes);
        round_trip(s, lanes);
        round_trip(s, lanes + 10);   /* the ring again: kept, nothing new pinned */
        CHECK(live_pinned == 2 * (long)lanes);
        CHECK(fabpool_torch_stage_copy(s, NULL, 0, 1, err, sizeof err) == 0);
        CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
        CHECK(live_pinned == 0);
    }
    CHECK(fabpool_torch_stage_host_bytes() == 0);
}

static void test_refusals(const fabpool_torch_stage_driver *d)
{
    char err[256] = "";
    fabpool_torch_stage *s = (fabpool_torch_stage *)1;
    CHECK(fabpool_torch_stage_create(d, 0, 0, BUF, &s, err, sizeof err) != 0 && s == NULL && strstr(err, "lanes"));
    CHECK(fabpool_torch_stage_create(d, 0, 17, BUF, &s, err, sizeof err) != 0);
    CHECK(fabpool_torch_stage_create(d, 0, 2, 100, &s, err, sizeof err) != 0 && strstr(err, "buffers"));
    fabpool_torch_stage_driver part = *d;
    part.event_record = NULL;
    CHECK(fabpool_torch_stage_create(&part, 0, 2, BUF, &s, err, sizeof err) != 0 && strstr(err, "missing"));
    CHECK(fabpool_torch_stage_create(d, 99, 2, BUF, &s, err, sizeof err) != 0 && s == NULL);
    CHECK(live_pinned == 0);
    CHECK(fabpool_torch_stage_copy(NULL, NULL, 0, 1, err, sizeof err) != 0);
}

static void test_failed_pinned_allocation_frees_the_rest(const fabpool_torch_stage_driver *d)
{
    char err[256] = "";
    CUcontext before = NULL, after = NULL;
    cuCtxGetCurrent(&before);
    for (long at = 1; at <= 6; at++) {
        fail_pinned_at = at;
        fabpool_torch_stage *s = NULL;
        int r = fabpool_torch_stage_create(d, 0, 3, BUF, &s, err, sizeof err);
        CHECK(r == CUDA_ERROR_OUT_OF_MEMORY && s == NULL && strstr(err, "cuMemHostAlloc"));
        CHECK(live_pinned == 0);
    }
    fail_pinned_at = 0;
    cuCtxGetCurrent(&after);
    CHECK(before == after);   /* the caller's context as it was */
}

static void test_failed_copy_returns_and_ring_stays_usable(const fabpool_torch_stage_driver *d)
{
    char err[256] = "";
    fabpool_torch_stage *s = NULL;
    CHECK(fabpool_torch_stage_create(d, 0, 3, BUF, &s, err, sizeof err) == 0);
    if (!s)
        return;
    const uint64_t n = 20 * BUF + 3;
    CUdeviceptr dv = 0;
    CHECK(cuMemAlloc_v2(&dv, n) == CUDA_SUCCESS);
    uint64_t h = 0;
    CHECK(fabpool_torch_stage_host_map(n, &h, err, sizeof err) == 0);
    fabpool_torch_stage_item it = {h, dv, n};
    const char *entries[] = {"cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync", "cuEventSynchronize", "cuEventRecord"};
    for (int e = 0; e < 4; e++) {
        for (uint64_t nth = 1; nth <= 9; nth += 4) {
            int to_host = e != 1;
            CHECK(fabsim_fault_set(entries[e], nth, 0, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
            err[0] = 0;
            int r = fabpool_torch_stage_copy(s, &it, 1, to_host, err, sizeof err);
            fabsim_fault_clear();
            CHECK(r == CUDA_ERROR_ILLEGAL_ADDRESS && strstr(err, "CUDA error"));
            if (r != CUDA_ERROR_ILLEGAL_ADDRESS)
                fprintf(stderr, "%s #%llu: %d %s\n", entries[e], (unsigned long long)nth, r, err);
        }
    }
    CHECK(live_pinned == 6);
    /* the ring works after the failures */
    unsigned char *dp = (unsigned char *)(uintptr_t)dv;
    for (uint64_t k = 0; k < n; k++)
        dp[k] = pat(k, 3);
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);
    CHECK(memcmp((void *)(uintptr_t)h, dp, n) == 0);
    CHECK(fabpool_torch_stage_host_unmap(h, n, err, sizeof err) == 0);
    CHECK(cuMemFree_v2(dv) == CUDA_SUCCESS);
    CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
    CHECK(live_pinned == 0);
}

static void test_host_copies_mapped_and_given_back(void)
{
    char err[256] = "";
    uint64_t a = 0, b = 0, z = 1;
    CHECK(fabpool_torch_stage_host_map(0, &z, err, sizeof err) == 0 && z == 0);
    CHECK(fabpool_torch_stage_host_map(5u << 20, &a, err, sizeof err) == 0 && a);
    CHECK(a % (2u << 20) == 0);
    CHECK(fabpool_torch_stage_host_map(1, &b, err, sizeof err) == 0 && b);
    CHECK(fabpool_torch_stage_host_bytes() == (5u << 20) + 4096);
    memset((void *)(uintptr_t)a, 0x5a, 5u << 20);
    ((volatile char *)(uintptr_t)b)[0] = 1;
    CHECK(fabpool_torch_stage_host_unmap(a, 5u << 20, err, sizeof err) == 0);
    CHECK(fabpool_torch_stage_host_unmap(b, 1, err, sizeof err) == 0);
    CHECK(fabpool_torch_stage_host_bytes() == 0);
    CHECK(fabpool_torch_stage_host_map(UINT64_MAX, &a, err, sizeof err) != 0 && strstr(err, "address space"));
}

static uint64_t resident_bytes(void)
{
    unsigned long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* A large host copy is given back whole, and a copy mapped beside it keeps
 * its bytes: through fabpool_torch_stage_host_unmap (several threads where
 * the process may run on four CPUs or more), and through the threads' part
 * alone on four threads whatever the CPUs: every page of the copy leaves the
 * process's resident memory before any munmap, the mapping stays (its pages
 * read back as zeros), the last piece ends at the copy's end. */
static void test_large_host_copy_given_back_whole(void)
{
    char err[256] = "";
    uint64_t n = (200ull << 20) + 12345, a = 0, b = 0, big = (uint64_t)(5u << 20);
    CHECK(fabpool_torch_stage_host_map(n, &a, err, sizeof err) == 0 && a);
    CHECK(fabpool_torch_stage_host_map(big, &b, err, sizeof err) == 0 && b);
    memset((void *)(uintptr_t)a, 0x33, n);
    memset((void *)(uintptr_t)b, 0x7e, big);
    uint64_t before = resident_bytes();
    CHECK(stage_host_zap((char *)(uintptr_t)a, (size_t)((n + 4095) & ~4095ull), 4) == 4);
    uint64_t zapped = resident_bytes();
    CHECK(before + (2u << 20) >= zapped + n);   /* (the slack: pages the process touched meanwhile) */
    const unsigned char *pa = (const unsigned char *)(uintptr_t)a, *pb = (const unsigned char *)(uintptr_t)b;
    CHECK(pa[0] == 0 && pa[n / 2] == 0 && pa[n - 1] == 0);
    memset((void *)(uintptr_t)a, 0x44, n);
    before = resident_bytes();
    CHECK(fabpool_torch_stage_host_unmap(a, n, err, sizeof err) == 0);
    uint64_t after = resident_bytes();
    CHECK(before + (2u << 20) >= after + n);
    size_t bad = 0;
    for (size_t i = 0; i < big; i++)
        bad += pb[i] != 0x7e;
    CHECK(bad == 0);
    CHECK(fabpool_torch_stage_host_unmap(b, big, err, sizeof err) == 0);
    CHECK(fabpool_torch_stage_host_bytes() == 0);
    CHECK(fabpool_torch_stage_host_unmap(a + 1, 4096, err, sizeof err) != 0 && strstr(err, "host copy"));
    printf("a host copy of %llu bytes given back: by four threads' MADV_DONTNEED, then by host_unmap: resident "
           "memory %llu -> %llu MiB\n", (unsigned long long)n, (unsigned long long)(before >> 20),
           (unsigned long long)(after >> 20));
}

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);   /* the lanes' threads included once they have ended */
    return ru.ru_minflt;
}

/* A copy to the host into pages never touched: the lanes fault every page
 * of it in ahead of their memcpy (MADV_POPULATE_WRITE: the populated bytes
 * count them); a second copy into the same pages (a host copy kept across a
 * resume) takes no page fault.  Small pages (no THP), so that a fault per
 * page is counted; the bytes compared. */
static void test_fresh_host_pages_faulted_in_ahead(const fabpool_torch_stage_driver *d)
{
#ifdef MADV_POPULATE_WRITE
    char err[256] = "";
    const size_t n = 8u << 20, pages = n / 4096;
    char *probe = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int have = probe != MAP_FAILED && madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
    if (probe != MAP_FAILED)
        munmap(probe, 4096);
    if (!have) {
        printf("test_fresh_host_pages_faulted_in_ahead: the kernel lacks MADV_POPULATE_WRITE; skipped\n");
        return;
    }
    fabpool_torch_stage *s = NULL;
    CHECK(fabpool_torch_stage_create(d, 0, 2, BUF, &s, err, sizeof err) == 0);
    CUdeviceptr dv = 0;
    CHECK(cuMemAlloc_v2(&dv, n) == CUDA_SUCCESS);
    char *h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(h != MAP_FAILED);
    if (!s || !dv || h == MAP_FAILED)
        abort();
#ifdef MADV_NOHUGEPAGE
    madvise(h, n, MADV_NOHUGEPAGE);
#endif
    unsigned char *dp = (unsigned char *)(uintptr_t)dv;
    for (size_t k = 0; k < n; k++)
        dp[k] = pat(k, 9);
    fabpool_torch_stage_item it = {(uint64_t)(uintptr_t)h, dv, n};
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);   /* lanes and buffers warm */
    CHECK(munmap(h, n) == 0);
    h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(h != MAP_FAILED);
    if (h == MAP_FAILED)
        abort();
#ifdef MADV_NOHUGEPAGE
    madvise(h, n, MADV_NOHUGEPAGE);
#endif
    it.host = (uint64_t)(uintptr_t)h;
    long f0 = minor_faults();
    uint64_t p0 = fabpool_torch_stage_populated_bytes();
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);
    long fresh = minor_faults() - f0;
    uint64_t ahead = fabpool_torch_stage_populated_bytes() - p0;
    CHECK(memcmp(h, dp, n) == 0);
    f0 = minor_faults();
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);
    long kept = minor_faults() - f0;
    CHECK(memcmp(h, dp, n) == 0);
    printf("copy to the host, %zu pages: %ld page faults into fresh pages (%llu bytes faulted in ahead), %ld into "
           "kept ones\n", pages, fresh, (unsigned long long)ahead, kept);
    CHECK(ahead >= n);
    CHECK(kept < (long)pages / 16);
    munmap(h, n);
    CHECK(cuMemFree_v2(dv) == CUDA_SUCCESS);
    CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
#else
    (void)d;
    printf("test_fresh_host_pages_faulted_in_ahead: no MADV_POPULATE_WRITE in the headers; skipped\n");
#endif
}

/* FABPOOL_STAGE_UFFD=1: a copy to the host fills fresh pages by UFFDIO_COPY
 * (no zeroing, no page fault: the installed bytes count them, the faults stay
 * few), bitwise for items cut anywhere (pages shared by two lanes' spans,
 * the bytes around a part zero); a second copy into the same pages writes
 * them in place; the pages answer plain faults after the copy; a value
 * other than 0 or 1 is refused.  Where the kernel gives no userfaultfd the
 * copies are the populate path's, still bitwise. */
static void test_uffd_fills_fresh_pages(const fabpool_torch_stage_driver *d)
{
    char err[256] = "";
    fabpool_torch_stage *s = NULL;
    setenv("FABPOOL_STAGE_UFFD", "2", 1);
    CHECK(fabpool_torch_stage_create(d, 0, 3, BUF, &s, err, sizeof err) != 0 && !s &&
          strstr(err, "FABPOOL_STAGE_UFFD"));
    setenv("FABPOOL_STAGE_UFFD", "1", 1);
    CHECK(fabpool_torch_stage_create(d, 0, 3, BUF, &s, err, sizeof err) == 0 && s);
    unsetenv("FABPOOL_STAGE_UFFD");
    if (!s)
        abort();
#ifdef SYS_userfaultfd
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */);
#else
    int fd = -1;
#endif
    int have = fd >= 0;
    if (fd >= 0)
        close(fd);
    uint64_t u0 = fabpool_torch_stage_uffd_bytes();
    round_trip(s, 31);
    CHECK(!have || fabpool_torch_stage_uffd_bytes() > u0);
    const size_t n = 8u << 20, pages = n / 4096;
    CUdeviceptr dv = 0;
    CHECK(cuMemAlloc_v2(&dv, n) == CUDA_SUCCESS);
    char *h = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!dv || h == MAP_FAILED)
        abort();
    unsigned char *dp = (unsigned char *)(uintptr_t)dv;
    for (size_t k = 0; k < n; k++)
        dp[k] = pat(k, 41);
    fabpool_torch_stage_item it = {(uint64_t)(uintptr_t)h + 100, dv, n - 200};   /* a part of its first page */
    u0 = fabpool_torch_stage_uffd_bytes();
    uint64_t p0 = fabpool_torch_stage_populated_bytes();
    long f0 = minor_faults();
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);
    long fresh = minor_faults() - f0;
    uint64_t installed = fabpool_torch_stage_uffd_bytes() - u0, pop = fabpool_torch_stage_populated_bytes() - p0;
    CHECK(memcmp(h + 100, dp, n - 200) == 0);
    CHECK(h[0] == 0 && h[99] == 0 && h[n - 100] == 0 && h[n + 10] == 0);   /* around the part; past the copy */
    f0 = minor_faults();
    u0 = fabpool_torch_stage_uffd_bytes();
    for (size_t k = 0; k < n; k++)
        dp[k] = pat(k, 43);
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);   /* the pages kept: in place */
    long kept = minor_faults() - f0;
    CHECK(memcmp(h + 100, dp, n - 200) == 0);
    CHECK(fabpool_torch_stage_uffd_bytes() == u0);
    printf("copy to the host with FABPOOL_STAGE_UFFD=1, %zu pages (userfaultfd %s): %llu bytes installed, %llu "
           "populated, %ld page faults into fresh pages, %ld into kept ones\n", pages, have ? "given" : "refused",
           (unsigned long long)installed, (unsigned long long)pop, fresh, kept);
    /* the same copy into fresh pages by a ring without it: a fault per page (and, under a sanitizer, its shadow
     * pages' faults, which the installed pages do not take: ASan about 500 against 2,100, TSan 500-850 against
     * 18,500; without one 3 against 2,048) */
    fabpool_torch_stage *plain = NULL;
    CHECK(fabpool_torch_stage_create(d, 0, 3, BUF, &plain, err, sizeof err) == 0 && plain);
    char *g = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!plain || g == MAP_FAILED)
        abort();
    fabpool_torch_stage_item git = {(uint64_t)(uintptr_t)g + 100, dv, n - 200};
    f0 = minor_faults();
    CHECK(fabpool_torch_stage_copy(plain, &git, 1, 1, err, sizeof err) == 0);
    long fresh_plain = minor_faults() - f0;
    CHECK(memcmp(g + 100, dp, n - 200) == 0);
    munmap(g, n);
    CHECK(fabpool_torch_stage_destroy(plain, err, sizeof err) == 0);
    printf("the same copy without it: %ld page faults\n", fresh_plain);
    if (have) {
        CHECK(installed >= n - 4096);
        CHECK(fresh < fresh_plain / 2);
        CHECK(pop == 0);
    }
    CHECK(kept < (long)pages / 4);
    munmap(h, n + 4096);
    CHECK(cuMemFree_v2(dv) == CUDA_SUCCESS);
    CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
}

static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

/* A host copy the kernel will not register with a userfaultfd (a shared file
 * mapping): the copy falls back to populate + memcpy for it, bitwise, and no
 * descriptor is left open; the next copy into anonymous memory still uses
 * UFFDIO_COPY where the kernel gives it. */
static void test_uffd_refused_range_falls_back(const fabpool_torch_stage_driver *d)
{
    char err[256] = "", path[] = "stage_uffd_file_XXXXXX";
    const size_t n = 1u << 20;
    fabpool_torch_stage *s = NULL;
    setenv("FABPOOL_STAGE_UFFD", "1", 1);
    CHECK(fabpool_torch_stage_create(d, 0, 2, BUF, &s, err, sizeof err) == 0 && s);
    unsetenv("FABPOOL_STAGE_UFFD");
    int fd = mkstemp(path);
    CUdeviceptr dv = 0;
    CHECK(fd >= 0 && ftruncate(fd, (off_t)n) == 0 && cuMemAlloc_v2(&dv, n) == CUDA_SUCCESS);
    char *h = fd >= 0 ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (!s || !dv || h == MAP_FAILED)
        abort();
    unsigned char *dp = (unsigned char *)(uintptr_t)dv;
    for (size_t k = 0; k < n; k++)
        dp[k] = pat(k, 51);
    int fds = open_fds();
    fabpool_torch_stage_item it = {(uint64_t)(uintptr_t)h, dv, n};
    CHECK(fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err) == 0);
    CHECK(memcmp(h, dp, n) == 0);
    CHECK(open_fds() == fds);
    munmap(h, n);
    close(fd);
    unlink(path);
    uint64_t u0 = fabpool_torch_stage_uffd_bytes();
    round_trip(s, 53);
#ifdef SYS_userfaultfd
    int probe = (int)syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */);
#else
    int probe = -1;
#endif
    CHECK(probe < 0 || fabpool_torch_stage_uffd_bytes() > u0);
    if (probe >= 0)
        close(probe);
    CHECK(cuMemFree_v2(dv) == CUDA_SUCCESS);
    CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
}

/* Copies in both directions mixed by seeded random sequences, through a ring with FABPOOL_STAGE_UFFD=1 and one
 * without, on items made, refilled and given back at random steps, with a driver fault armed before some copies
 * (a copy's, a record's or a wait's failure at a random call): after every copy that succeeds, the bytes it
 * moved are the source's, bitwise; one that fails returns the driver's error and leaves its items' destination
 * unspecified (the test stops trusting it) and the ring usable; at the end no host copy and no pinned buffer
 * beyond the two rings' is left. */
#define RMAX 6
typedef struct {
    CUdeviceptr dev;
    uint64_t host, bytes;
    unsigned seed;        /* the pattern the device holds */
    int host_good;        /* the host copy holds it too */
} ritem;

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void fill_dev(ritem *t, unsigned seed)
{
    unsigned char *dp = (unsigned char *)(uintptr_t)t->dev;
    for (size_t k = 0; k < t->bytes; k++)
        dp[k] = pat(k, seed);
    t->seed = seed;
    t->host_good = 0;
}

static int holds(uint64_t at, uint64_t bytes, unsigned seed)
{
    const unsigned char *q = (const unsigned char *)(uintptr_t)at;
    for (size_t k = 0; k < bytes; k++)
        if (q[k] != pat(k, seed))
            return 0;
    return 1;
}

static void test_random_copies_both_rings(const fabpool_torch_stage_driver *d)
{
    static const char *faults[] = {"cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync", "cuEventSynchronize", "cuEventRecord"};
    char err[256] = "";
    fabpool_torch_stage *ring[2] = {NULL, NULL};
    CHECK(fabpool_torch_stage_create(d, 0, 2, BUF, &ring[0], err, sizeof err) == 0 && ring[0]);
    setenv("FABPOOL_STAGE_UFFD", "1", 1);
    CHECK(fabpool_torch_stage_create(d, 0, 3, BUF, &ring[1], err, sizeof err) == 0 && ring[1]);
    unsetenv("FABPOOL_STAGE_UFFD");
    if (!ring[0] || !ring[1])
        abort();
    long pinned = live_pinned, copies = 0, failed = 0, checked = 0;
    for (uint64_t seed = 1; seed <= 10; seed++) {
        uint64_t x = seed * 0x9e3779b97f4a7c15ull;
        ritem it[RMAX];
        int n = 0;
        for (int step = 0; step < 40; step++) {
            unsigned op = (unsigned)(rnd(&x) % 8);
            if (n < RMAX && (op < 2 || n == 0)) {   /* a new item: 0..256 KiB, often a ring's multiple or near one */
                uint64_t b = rnd(&x) % 3 ? rnd(&x) % (256u << 10) : (rnd(&x) % 5) * BUF + rnd(&x) % 3;
                ritem *t = &it[n];
                *t = (ritem){0, 0, b, 0, 0};
                CHECK(cuMemAlloc_v2(&t->dev, b ? b : 1) == CUDA_SUCCESS);
                CHECK(fabpool_torch_stage_host_map(b, &t->host, err, sizeof err) == 0);
                if (!t->dev || (b && !t->host))
                    abort();
                fill_dev(t, (unsigned)rnd(&x));
                n++;
            } else if (op == 2) {                  /* one given back */
                int i = (int)(rnd(&x) % (unsigned)n);
                CHECK(fabpool_torch_stage_host_unmap(it[i].host, it[i].bytes, err, sizeof err) == 0);
                CHECK(cuMemFree_v2(it[i].dev) == CUDA_SUCCESS);
                it[i] = it[--n];
            } else if (op == 3) {                  /* the device refilled: its host copy no longer matches */
                fill_dev(&it[rnd(&x) % (unsigned)n], (unsigned)rnd(&x));
            } else {                               /* a copy of some items, one way, through either ring */
                int to_host = op < 6;
                fabpool_torch_stage_item items[RMAX];
                int pick[RMAX], k = 0;
                for (int i = 0; i < n; i++)
                    if ((rnd(&x) & 1) && (to_host || it[i].host_good)) {
                        pick[k] = i;
                        items[k++] = (fabpool_torch_stage_item){it[i].host, it[i].dev, it[i].bytes};
                    }
                if (!to_host)                      /* the device cleared first: what comes back is the host's */
                    for (int j = 0; j < k; j++)
                        memset((void *)(uintptr_t)it[pick[j]].dev, 0xee, it[pick[j]].bytes);
                int fault = rnd(&x) % 5 == 0;
                if (fault)
                    CHECK(fabsim_fault_set(faults[rnd(&x) % 4], 1 + rnd(&x) % 6, 0, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
                int r = fabpool_torch_stage_copy(ring[rnd(&x) & 1], items, (size_t)k, to_host, err, sizeof err);
                if (fault)
                    fabsim_fault_clear();
                copies++;
                CHECK(r == 0 || (fault && r == CUDA_ERROR_ILLEGAL_ADDRESS));
                if (r)
                    failed++;
                for (int j = 0; j < k; j++) {
                    ritem *t = &it[pick[j]];
                    if (r == 0 && to_host) {
                        CHECK(holds(t->host, t->bytes, t->seed));
                        t->host_good = 1;
                        checked++;
                    } else if (r == 0) {
                        CHECK(holds(t->dev, t->bytes, t->seed));
                        checked++;
                    } else if (to_host) {
                        t->host_good = 0;
                    } else {
                        fill_dev(t, (unsigned)rnd(&x));   /* the device's bytes unknown: a new pattern */
                    }
                }
            }
        }
        while (n--) {
            CHECK(fabpool_torch_stage_host_unmap(it[n].host, it[n].bytes, err, sizeof err) == 0);
            CHECK(cuMemFree_v2(it[n].dev) == CUDA_SUCCESS);
        }
        CHECK(fabpool_torch_stage_host_bytes() == 0);
        CHECK(live_pinned == pinned);
    }
    CHECK(fabpool_torch_stage_destroy(ring[0], err, sizeof err) == 0);
    CHECK(fabpool_torch_stage_destroy(ring[1], err, sizeof err) == 0);
    CHECK(live_pinned == 0);
    CHECK(failed > 0 && checked > 100);
    printf("random copies through both rings: %ld copies, %ld failed by a fault, %ld items' bytes checked\n", copies,
           failed, checked);
}

/* A ring made before a fork refuses a copy in the child, before it takes the ring's lock (a copy of the parent's
 * may have held it at the fork) and before any driver call on the parent's buffers and streams. */
static void test_forked_child_copy_refused(const fabpool_torch_stage_driver *d)
{
    static unsigned char host[4096];
    fabpool_torch_stage_item it = {(uint64_t)(uintptr_t)host, 0, sizeof host};
    char err[256] = "";
    fabpool_torch_stage *s = NULL;
    int made = fabpool_torch_stage_create(d, 0, 2, BUF, &s, err, sizeof err) == 0 && s;
    CHECK(made);
    if (!made)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        int r = fabpool_torch_stage_copy(s, &it, 1, 1, err, sizeof err);
        _exit(r == -ENOTSUP && strstr(err, "forked") ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(fabpool_torch_stage_destroy(s, err, sizeof err) == 0);
    CHECK(live_pinned == 0);
}

int main(void)
{
    if (cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "cuInit failed\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    fabpool_torch_stage_driver d = driver();
    test_bytes_bitwise_every_lane_count(&d);
    test_refusals(&d);
    test_failed_pinned_allocation_frees_the_rest(&d);
    test_failed_copy_returns_and_ring_stays_usable(&d);
    test_host_copies_mapped_and_given_back();
    test_large_host_copy_given_back_whole();
    test_fresh_host_pages_faulted_in_ahead(&d);
    test_uffd_fills_fresh_pages(&d);
    test_uffd_refused_range_falls_back(&d);
    test_random_copies_both_rings(&d);
    test_forked_child_copy_refused(&d);
    return unit_result("test_stage_copy");
}
