/* test_alloc: size-class blocks.  Every class boundary, alignment, data,
 * reuse, the cache and trim, large spans, bad input, and many threads. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

static fabpool_t *pool;

static void boundaries(void)
{
    /* sizes at, just below and just above each class, up to 64 MiB */
    size_t prev_usable = 0, prev_size = 0;
    for (size_t size = 1; size <= 64 * MB; size = size < 1024 ? size + 255 : size + size / 7) {
        for (int d = -1; d <= 1; d++) {
            size_t s = size + (size_t)d;
            if (s == 0)
                continue;
            void *a = NULL;
            CHECK_OK(fabpool_alloc(pool, s, &a));
            if (!a)
                continue;
            /* 256-aligned from 256 bytes, the size rounded up to a power of two below (fabpool.h) */
            CHECK(((uintptr_t)a & (s > 128 ? 255 : s > 64 ? 127 : 63)) == 0);
            size_t u = 0;
            CHECK_OK(fabpool_usable_size(pool, a, &u));
            CHECK(u >= s);
            /* bounded waste: classes 4 per doubling, spans rounded to 2 MiB */
            CHECK(s <= 1024 ? u - s < 256 : s <= 4 * MB ? u <= s + s / 4 + 256 : u <= s + s / 4 + 2 * MB);
            /* the whole block is writable and reads back */
            unsigned char x = (unsigned char)(s * 31), y = 0;
            CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)a, x, u));
            CHECK_CU(cuMemcpyDtoH(&y, (CUdeviceptr)(uintptr_t)a + u - 1, 1));
            CHECK(y == x);
            CHECK_OK(fabpool_free(pool, a));
            prev_usable = u;
            prev_size = s;
        }
    }
    CHECK(prev_size > 56 * MB && prev_usable >= prev_size);
    /* the exact class sizes below 4 KiB */
    size_t want[] = {256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        void *a;
        size_t u = 0;
        CHECK_OK(fabpool_alloc(pool, want[i] - 1, &a));
        fabpool_usable_size(pool, a, &u);
        CHECK(u == want[i]);
        fabpool_free(pool, a);
    }
}

static void reuse_and_trim(void)
{
    CHECK_OK(fabpool_trim(pool, 0));
    uint64_t m0 = t_mapped(pool);
    void *a[1000];
    for (int i = 0; i < 1000; i++)
        CHECK_OK(fabpool_alloc(pool, 4096, &a[i]));
    /* distinct, non-overlapping blocks */
    for (int i = 1; i < 1000; i++)
        CHECK(a[i] != a[i - 1]);
    uint64_t m1 = t_mapped(pool);
    CHECK(m1 > m0 && m1 - m0 <= 4 * MB); /* 4 MB of blocks in slabs, mapped in granules */
    CHECK(t_near(t_held(), (int64_t)m1));
    for (int i = 0; i < 1000; i++)
        CHECK_OK(fabpool_free(pool, a[i]));
    /* freed blocks stay cached: same memory comes back, nothing new mapped */
    void *b = NULL;
    CHECK_OK(fabpool_alloc(pool, 4096, &b));
    CHECK(b == a[999]);
    CHECK(t_mapped(pool) == m1);
    fabpool_free(pool, b);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(pool, &s);
    CHECK(s.cached_bytes >= 1000 * 4096);
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == m0);
    CHECK(t_near(t_held(), (int64_t)m0));

    /* large blocks are cached and reused: a smaller block is cut from the free range */
    void *l = NULL, *l2 = NULL;
    CHECK_OK(fabpool_alloc(pool, 100 * MB, &l));
    uint64_t ml = t_mapped(pool);
    CHECK(ml - m0 >= 100 * MB && ml - m0 <= 125 * MB);
    CHECK_OK(fabpool_free(pool, l));
    CHECK(t_mapped(pool) == ml);
    CHECK_OK(fabpool_alloc(pool, 99 * MB, &l2));
    CHECK((char *)l2 >= (char *)l && (char *)l2 + 99 * MB <= (char *)l + 100 * MB); /* cut from the free range */
    CHECK(t_mapped(pool) == ml);
    CHECK_OK(fabpool_free(pool, l2));
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == m0);
    CHECK(t_near(t_held(), (int64_t)m0));
}

static void bad_input(void)
{
    void *a = NULL, *b = NULL;
    CHECK_STATUS(fabpool_alloc(NULL, 16, &a), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "NULL") != NULL);
    CHECK_STATUS(fabpool_alloc(pool, 16, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_alloc(pool, 0, &a)); /* cudaMalloc's answer: test_cuda_conventions */
    CHECK(a == NULL);
    /* more than the device holds: out of memory, as cudaMalloc answers it, whatever the reservation */
    CHECK_STATUS(fabpool_alloc(pool, SIZE_MAX, &a), FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK(a == NULL && strstr(fabpool_last_error(), "more than device") != NULL); /* not "raise reserve" */
    CHECK_STATUS(fabpool_alloc(pool, SIZE_MAX - 4096, &a), FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK_OK(fabpool_free(pool, NULL));
    CHECK_STATUS(fabpool_free(NULL, &a), FABPOOL_ERR_INVALID_ARG);
    int host;
    CHECK_STATUS(fabpool_free(pool, &host), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "did not give out") != NULL);
    CHECK_OK(fabpool_alloc(pool, 1000, &a));
    CHECK_OK(fabpool_alloc(pool, 1000, &b));
    CHECK_STATUS(fabpool_free(pool, (char *)a + 256), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_free(pool, (char *)a + 1), FABPOOL_ERR_NOT_FOUND);
    CHECK_OK(fabpool_free(pool, a));
    CHECK_STATUS(fabpool_free(pool, a), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(strstr(fabpool_last_error(), "double free") != NULL);
    /* a freed block has no usable size, whatever its size: slab, medium arena, large */
    size_t sizes[] = {64, 4096, 5000, 100000, 3 * MB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *x = NULL;
        size_t u = 0;
        CHECK_OK(fabpool_alloc(pool, sizes[i], &x));
        CHECK_OK(fabpool_usable_size(pool, x, &u));
        CHECK(u >= sizes[i]);
        CHECK_OK(fabpool_free(pool, x));
        CHECK_STATUS(fabpool_usable_size(pool, x, &u), FABPOOL_ERR_NOT_FOUND);
        CHECK(u == 0 && strstr(fabpool_last_error(), "free") != NULL);
        if (u != 0 || !strstr(fabpool_last_error(), "free"))
            fprintf(stderr, "  usable_size of a freed %zu-byte block: %zu, %s\n", sizes[i], u, fabpool_last_error());
    }
    /* the neighbour is untouched by all that */
    CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)b, 3, 1000));
    CHECK_OK(fabpool_free(pool, b));
    void *l = NULL;
    CHECK_OK(fabpool_alloc(pool, 10 * MB, &l));
    CHECK_STATUS(fabpool_free(pool, (char *)l + MB), FABPOOL_ERR_NOT_FOUND);
    CHECK_OK(fabpool_free(pool, l));
    CHECK_STATUS(fabpool_free(pool, l), FABPOOL_ERR_DOUBLE_FREE);
}

#define NTHREADS 8
#define ITERS 20000

static void *worker(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 2654435761u + 1;
    void *live[64] = {0};
    size_t sizes[64] = {0};
    int bad = 0;
    /* a thread of the program needs a current context for its copies */
    if (cuCtxSetCurrent(t_ctx) != CUDA_SUCCESS)
        return (void *)(uintptr_t)1;
    for (int i = 0; i < ITERS; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        int k = (int)(seed % 64);
        if (live[k]) {
            /* the first byte still holds what this thread wrote */
            unsigned char x = 0;
            bad += cuMemcpyDtoH(&x, (CUdeviceptr)(uintptr_t)live[k], 1) != CUDA_SUCCESS;
            if (x != (unsigned char)(sizes[k] & 0xff)) {
                fprintf(stderr, "thread: block %p of %zu bytes lost its first byte\n", live[k], sizes[k]);
                bad++;
            }
            if (fabpool_free(pool, live[k]) != FABPOOL_OK) {
                fprintf(stderr, "thread: free: %s\n", fabpool_last_error());
                bad++;
            }
            live[k] = NULL;
        } else {
            size_t s = 1 + (size_t)(seed >> 20) % (seed % 7 == 0 ? 3 * MB : 65536);
            if (fabpool_alloc(pool, s, &live[k]) != FABPOOL_OK) {
                fprintf(stderr, "thread: alloc(%zu): %s\n", s, fabpool_last_error());
                bad++;
                continue;
            }
            sizes[k] = s;
            unsigned char x = (unsigned char)(s & 0xff);
            bad += cuMemcpyHtoD((CUdeviceptr)(uintptr_t)live[k], &x, 1) != CUDA_SUCCESS;
        }
    }
    for (int k = 0; k < 64; k++)
        if (live[k])
            bad += fabpool_free(pool, live[k]) != FABPOOL_OK;
    return (void *)(uintptr_t)bad;
}

static void threads(void)
{
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    uintptr_t bad = 0;
    for (int i = 0; i < NTHREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (uintptr_t)r;
    }
    CHECK(bad == 0);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(pool, &s);
    CHECK(s.blocks == 0);
    CHECK(s.in_use_bytes == 0);
    /* the threads are gone: their caches went back, so a trim unmaps all */
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == 0);
    CHECK(t_near(t_held(), 0));
}

/* A block the device cannot hold: the message gives what the device has free and in all (cuMemGetInfo). */
static void out_of_memory_says_device_memory(void)
{
    size_t free_b = 0, total = 0;
    CHECK_CU(cuMemGetInfo(&free_b, &total));
    void *a = NULL, *b = NULL;
    size_t big = total / 10 * 6; /* two do not fit */
    CHECK_OK(fabpool_alloc(pool, big, &a));
    CHECK_STATUS(fabpool_alloc(pool, big, &b), FABPOOL_ERR_OUT_OF_MEMORY);
    char want[64];
    snprintf(want, sizeof want, " free of %.2f GiB", (double)total / (double)(1ull << 30));
    CHECK(strstr(fabpool_last_error(), "the device has ") && strstr(fabpool_last_error(), want));
    if (!strstr(fabpool_last_error(), want))
        fprintf(stderr, "  out of memory, without '%s': %s\n", want, fabpool_last_error());
    CHECK(b == NULL);
    CHECK_OK(fabpool_free(pool, a));
    CHECK_OK(fabpool_trim(pool, 0));
    /* a buffer whose first size is more than the device has: refused before anything is mapped */
    int64_t held = t_held();
    fabpool_buffer_t *buf = NULL;
    CHECK_STATUS(fabpool_buffer_create(pool, 2 * total, 2 * total, &buf), FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK(buf == NULL && strstr(fabpool_last_error(), "more than device") != NULL);
    CHECK(t_near(t_held(), held));
}

/* fabpool_device_memory: the driver's own figures for the pool's device, from any context, the caller's left
 * current; the bytes the pool maps come off the free figure (exactly on the simulated driver, which no other
 * process shares); NULL arguments refused. */
static void device_memory_is_the_drivers(int sim)
{
    size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0, cf = 0, ct = 0;
    CUcontext before = NULL, after = NULL;
    CHECK_CU(cuCtxGetCurrent(&before));
    CHECK_OK(fabpool_device_memory(pool, &f0, &t0));
    CHECK_CU(cuCtxGetCurrent(&after));
    CHECK(after == before);
    CHECK_CU(cuMemGetInfo(&cf, &ct));
    CHECK(t0 == ct && t0 > 0 && f0 <= t0);
    CHECK_OK(fabpool_trim(pool, 0));
    int64_t held0 = t_held();
    void *a = NULL;
    CHECK_OK(fabpool_alloc(pool, 48u << 20, &a));
    int64_t grew = t_held() - held0;
    CHECK(grew >= (48 << 20));
    CHECK_OK(fabpool_device_memory(pool, &f1, &t1));
    CHECK(t1 == t0);
    if (sim)
        CHECK((int64_t)f0 - (int64_t)f1 == grew);
    else
        CHECK(f1 < f0);
    CHECK_OK(fabpool_free(pool, a));
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK_STATUS(fabpool_device_memory(NULL, &f1, &t1), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "must not be NULL") != NULL);
    CHECK_STATUS(fabpool_device_memory(pool, NULL, &t1), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_device_memory(pool, &f1, NULL), FABPOOL_ERR_INVALID_ARG);
}

/* A child forked after the pool was made: CUDA does not carry over a fork, so every allocation and free of the
 * pool there is refused (FABPOOL_ERR_NOT_SUPPORTED, the message naming the fork), the thread cache's hits
 * included; the parent goes on as before. */
static void forked_child_refused(void)
{
    void *x = NULL, *y = NULL, *m = NULL;
    CHECK_OK(fabpool_alloc(pool, 256, &x));
    CHECK_OK(fabpool_alloc(pool, 256, &y));
    CHECK_OK(fabpool_free(pool, y)); /* in this thread's cache: the child's next 256 bytes would be a hit */
    CHECK_OK(fabpool_alloc(pool, 16 << 10, &m));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        void *z = (void *)1;
        const size_t sizes[] = {256, 16 << 10, 3 << 20};
        for (size_t i = 0; i < 3; i++, z = (void *)1)
            bad += fabpool_alloc(pool, sizes[i], &z) != FABPOOL_ERR_NOT_SUPPORTED || z != NULL ||
                   !strstr(fabpool_last_error(), "forked");
        bad += fabpool_free(pool, x) != FABPOOL_ERR_NOT_SUPPORTED;
        bad += fabpool_free(pool, m) != FABPOOL_ERR_NOT_SUPPORTED;
        bad += fabpool_alloc_on_stream(pool, 256, NULL, &z) != FABPOOL_ERR_NOT_SUPPORTED;
        bad += fabpool_free_on_stream(pool, x, NULL) != FABPOOL_ERR_NOT_SUPPORTED;
        _exit(bad);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws));
    CHECK(WEXITSTATUS(ws) == 0);
    void *again = NULL;
    CHECK_OK(fabpool_alloc(pool, 256, &again)); /* the parent: its cache as before */
    CHECK(again == y);
    CHECK_OK(fabpool_free(pool, again));
    CHECK_OK(fabpool_free(pool, x));
    CHECK_OK(fabpool_free(pool, m));
}

/* cache_limit:0 keeps nothing cached, with the thread cache too: once every block is freed and the thread's cache
 * flushed, no chunk stays mapped (a thread's exit gives the same back, and a pool without caches at each free). */
static void cache_limit_zero_after_flush(void)
{
    const char *confs[] = {"cache_limit:0,thread_cache:false", "cache_limit:0"};
    for (int i = 0; i < 2; i++) {
        fabpool_t *p = t_pool(confs[i]);
        if (!p)
            continue;
        void *large = NULL, *small = NULL, *medium = NULL;
        CHECK_OK(fabpool_alloc(p, 10 * MB, &large));
        CHECK_OK(fabpool_alloc(p, 100, &small));
        CHECK_OK(fabpool_alloc(p, 100000, &medium));
        CHECK_OK(fabpool_free(p, large));
        CHECK_OK(fabpool_free(p, medium));
        CHECK_OK(fabpool_free(p, small));
        CHECK_OK(fabpool_thread_flush(p));
        fabpool_stats st = t_stats(p);
        CHECK(st.in_use_bytes == 0 && st.mapped_bytes == 0 && st.cached_bytes == 0);
        if (t_ledger_p)
            CHECK(t_ledger().bytes_held == 0);
        /* and after small blocks that come and go through the cache */
        for (int k = 0; k < 32; k++) {
            void *q = NULL;
            CHECK_OK(fabpool_alloc(p, 64, &q));
            CHECK_OK(fabpool_free(p, q));
        }
        CHECK_OK(fabpool_thread_flush(p));
        CHECK(t_stats(p).mapped_bytes == 0);
        if (t_ledger_p)
            CHECK(t_ledger().bytes_held == 0);
        if (t_stats(p).mapped_bytes != 0)
            fprintf(stderr, "cache_limit_zero_after_flush: %s: %llu bytes mapped after the flush\n", confs[i],
                    (unsigned long long)t_stats(p).mapped_bytes);
        CHECK_OK(fabpool_destroy(p));
    }
}

int main(void)
{
    int sim = t_driver_init();
    cache_limit_zero_after_flush(); /* first: the driver holds nothing else yet */
    CHECK_OK(fabpool_create(NULL, &pool));
    if (!pool)
        return t_done("test_alloc");
    boundaries();
    reuse_and_trim();
    bad_input();
    out_of_memory_says_device_memory();
    device_memory_is_the_drivers(sim);
    threads();
    forked_child_refused();
    if (getenv("FABPOOL_TEST_STATS"))
        fabpool_print_stats(pool, stdout, 0);
    CHECK_OK(fabpool_destroy(pool));
    CHECK(t_near(t_held(), 0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
    return t_done("test_alloc");
}
