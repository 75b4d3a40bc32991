/* test_two_gpus_one_process: two GPUs driven by one process, a pool on each.
 * Pool 0 (device 0) gives device 1 access to every chunk it maps (peers:1),
 * pool 1 (device 1) gives device 0 access (peers:0).  Work issued in one
 * device's context (a cuMemcpyDtoD from its own memory, a cuMemsetD32) writes
 * into the other device's growable buffer; the owner reads the data back;
 * the buffer grows over several chunks and the other device still writes
 * into the new chunks, and into the old ones.  Both ways.  At the end each
 * device holds what it held at the start (sim: the ledger per device; real
 * driver: cuMemGetInfo in each device's context, within testutil.h's slack).
 *
 * test_peers (tests/) covers the pool options and cuMemGetAccess of one pool;
 * this test covers the copy engines of both devices, both directions.
 *
 * Fewer than two devices, or two that cannot reach each other: says so and
 * exits 77 (ctest: skipped).
 *
 * --probe-no-access: the real driver's answer to a cuMemsetD32 issued on
 * device 1 into device 0 memory that device 1 has no access to (run on its
 * own: a fault there may spoil the context).  The simulated driver answers
 * CUDA_ERROR_INVALID_VALUE, which the normal run checks. */
#include "mgpu.h"

#define MB (1ull << 20)
#define PAT_WORDS (2u << 20) /* 8 MiB of source pattern */

static void use(int d) { CHECK_CU(cuCtxSetCurrent(mg_ctx[d])); }

static uint32_t pat(uint32_t i, uint32_t seed) { return (i * 2654435761u) ^ seed; }

static fabpool_t *make_pool(int dev, int peer)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = dev;
    o.n_peer_devices = 1;
    o.peer_devices[0] = peer;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    return p;
}

static uint32_t word_at(int d, char *at)
{
    uint32_t v = 0;
    use(d);
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)at, 4));
    return v;
}

/* Device `w` writes into a buffer of device `o` (pool po, peers: w); the source
 * of its copies is a block of its own pool pw. */
static void one_way(fabpool_t *po, int o, fabpool_t *pw, int w)
{
    int fails0 = t_failures;
    uint32_t seed = 0x5eed0000u + (uint32_t)(o * 16 + w);
    int64_t h_o = mg_used(o), h_w = mg_used(w);

    /* the source, in the writer's own memory (pool pw: device w) */
    void *src = NULL;
    CHECK_OK(fabpool_alloc(pw, (size_t)PAT_WORDS * 4, &src));
    if (!src)
        return;
    uint32_t *host = malloc((size_t)PAT_WORDS * 4), *back = malloc((size_t)PAT_WORDS * 4);
    for (uint32_t i = 0; i < PAT_WORDS; i++)
        host[i] = pat(i, seed);
    use(w);
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)src, host, (size_t)PAT_WORDS * 4));
    CHECK_CU(cuCtxSynchronize());

    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(po, 2048 * MB, 64 * MB, &b));
    if (!b) {
        fabpool_free(pw, src);
        free(host);
        free(back);
        return;
    }
    char *base = fabpool_buffer_ptr(b);
    static const size_t sizes[] = {64 * MB, 200 * MB, 520 * MB, 1100 * MB};
    size_t prev = 0;
    uint32_t prev_chunks = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t size = sizes[s];
        CHECK_OK(fabpool_buffer_resize(b, size, NULL));
        fabpool_buffer_info bi = {.struct_size = sizeof bi};
        CHECK_OK(fabpool_buffer_get_info(b, &bi));
        CHECK(bi.base == base && bi.mapped >= size);
        CHECK(bi.n_chunks > prev_chunks); /* a grow maps new chunks behind the old ones */
        prev_chunks = bi.n_chunks;
        /* the writer has read-write access to every granule just mapped */
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = w};
        for (size_t off = prev; off < bi.mapped; off += 2 * MB) {
            unsigned long long fl = 0;
            CHECK_CU(cuMemGetAccess(&fl, &loc, (CUdeviceptr)(uintptr_t)(base + off)));
            if (fl != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
                CHECK(!"writer's access missing on a new chunk");
                break;
            }
        }
        /* the buffer's memory is the owner's: device o holds it */
        CHECK(mg_used(o) - h_o + t_slack() >= (int64_t)size);

        /* device w's context: a copy from its own memory into the new part of
         * o's buffer (its first and last 8 MiB), and a memset in between */
        size_t cp1 = prev, cp2 = size - (size_t)PAT_WORDS * 4;
        size_t ms = prev + (size - prev) / 2, ms_words = 256 * 1024;
        uint32_t mv = 0xa5000000u + (uint32_t)s;
        use(w);
        CHECK_CU(cuMemcpyDtoD((CUdeviceptr)(uintptr_t)(base + cp1), (CUdeviceptr)(uintptr_t)src, (size_t)PAT_WORDS * 4));
        CHECK_CU(cuMemcpyDtoD((CUdeviceptr)(uintptr_t)(base + cp2), (CUdeviceptr)(uintptr_t)src, (size_t)PAT_WORDS * 4));
        CHECK_CU(cuMemsetD32((CUdeviceptr)(uintptr_t)(base + ms), mv, ms_words));
        /* and into the first chunk, mapped before this grow: access kept */
        if (s > 0)
            CHECK_CU(cuMemsetD32((CUdeviceptr)(uintptr_t)(base + 4096), mv, 16));
        CHECK_CU(cuCtxSynchronize());

        /* device o reads it all back */
        use(o);
        CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)(base + cp1), (size_t)PAT_WORDS * 4));
        CHECK(memcmp(back, host, (size_t)PAT_WORDS * 4) == 0);
        CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)(base + cp2), (size_t)PAT_WORDS * 4));
        CHECK(memcmp(back, host, (size_t)PAT_WORDS * 4) == 0);
        CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)(base + ms), ms_words * 4));
        int ok = 1;
        for (size_t i = 0; i < ms_words; i++)
            ok &= back[i] == mv;
        CHECK(ok);
        /* what earlier rounds wrote stays (a grow never moves data), and the old
         * chunk took this round's write */
        if (s > 0) {
            CHECK(word_at(o, base + 4096 + 60) == mv);
            CHECK(word_at(o, base + 4096 + 64) == pat((4096 + 64) / 4, seed));
            CHECK(word_at(o, base + sizes[s - 1] - 4) == pat(PAT_WORDS - 1, seed));
        }
        prev = size;
    }
    /* the last round's figures on each side */
    int64_t grown_o = mg_used(o) - h_o, grown_w = mg_used(w) - h_w;
    printf("device %d -> device %d's buffer: %u chunks, %zu MiB; device %d holds +%lld MiB, device %d +%lld MiB\n", w,
           o, prev_chunks, prev >> 20, o, (long long)(grown_o >> 20), w, (long long)(grown_w >> 20));
    if (t_ledger_p) /* the writer's device holds only its source block */
        CHECK(grown_w < (int64_t)(64 * MB));

    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_free(pw, src));
    CHECK_OK(fabpool_trim(pw, 0));
    CHECK_OK(fabpool_trim(po, 0));
    CHECK(t_near(mg_used(o), h_o));
    CHECK(t_near(mg_used(w), h_w));
    free(host);
    free(back);
    printf("device %d writes into device %d's buffer: %s\n", w, o, t_failures == fails0 ? "ok" : "FAILED");
}

/* A pool without peers: device 1 may not write into it.  Returns the CUresult. */
static CUresult no_access_write(int check)
{
    fabpool_t *solo = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK_OK(fabpool_create(&o, &solo));
    if (!solo)
        return CUDA_ERROR_UNKNOWN;
    void *blk = NULL;
    CHECK_OK(fabpool_alloc(solo, 4 * MB, &blk));
    use(0);
    CHECK_CU(cuMemsetD32((CUdeviceptr)(uintptr_t)blk, 0x11111111u, 1024));
    CHECK_CU(cuCtxSynchronize());
    use(1);
    CUresult r = cuMemsetD32((CUdeviceptr)(uintptr_t)blk, 0x22222222u, 1024);
    CUresult r2 = cuCtxSynchronize();
    const char *n1 = "?", *n2 = "?";
    cuGetErrorName(r, &n1);
    cuGetErrorName(r2, &n2);
    printf("no access: cuMemsetD32 on device 1 into device 0 memory without access: %s, then cuCtxSynchronize: %s\n",
           n1, n2);
    if (check) {
        CHECK(r == CUDA_ERROR_INVALID_VALUE);
        CHECK(word_at(0, blk) == 0x11111111u); /* nothing was written */
    } else {
        printf("no access: device 0 reads %#x (0x11111111: the write did not land)\n", word_at(0, blk));
    }
    fabpool_free(solo, blk);
    CHECK_OK(fabpool_destroy(solo));
    return r;
}

int main(int argc, char **argv)
{
    int sim = t_driver_init();
    mg_two_devices("test_two_gpus_one_process");
    int64_t h0 = mg_used(0), h1 = mg_used(1);
    printf("%s driver; held at start: device 0 %lld MiB, device 1 %lld MiB\n", sim ? "simulated" : "real",
           (long long)(h0 >> 20), (long long)(h1 >> 20));

    if (argc > 1 && strcmp(argv[1], "--probe-no-access") == 0) {
        no_access_write(0);
        return 0;
    }

    fabpool_t *p0 = make_pool(0, 1), *p1 = make_pool(1, 0);
    if (p0 && p1) {
        one_way(p0, 0, p1, 1); /* GPU 1 writes into GPU 0's buffer */
        one_way(p1, 1, p0, 0); /* GPU 0 writes into GPU 1's buffer */
        fabpool_stats s = {.struct_size = sizeof s};
        CHECK_OK(fabpool_get_stats(p0, &s));
        CHECK(s.mapped_bytes == 0 && s.handles_outstanding == 0);
    }
    if (p0)
        CHECK_OK(fabpool_destroy(p0));
    if (p1)
        CHECK_OK(fabpool_destroy(p1));
    if (sim) /* the simulated driver refuses what the real one must not be asked here */
        no_access_write(1);

    int64_t e0 = mg_used(0), e1 = mg_used(1);
    printf("held at end: device 0 %lld MiB, device 1 %lld MiB\n", (long long)(e0 >> 20), (long long)(e1 >> 20));
    CHECK(t_near(e0, h0));
    CHECK(t_near(e1, h1));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
    use(0);
    cuDevicePrimaryCtxRelease(1);
    return t_done("test_two_gpus_one_process");
}
