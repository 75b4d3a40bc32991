/* test_buffers: the seed scenario.  A HybridEP-like set of six dispatch
 * buffers grows and shrinks with a variable token count over many steps.
 * At every step the driver holds exactly what the pool says it maps; base
 * addresses never change; data written before a grow reads back after it;
 * after destroy the driver holds nothing.  Besides: a buffer the pool's
 * reservation has no room for is refused with a message naming its window,
 * and nothing of it is left. */
#include "testutil.h"

#define NBUF 6
#define MB (1ull << 20)

/* bytes per token of each buffer: hidden 7168 in bf16, fp8 + scales, probs,
 * routing map (HybridEP's dispatch/combine buffers, roughly) */
static const uint64_t per_token[NBUF] = {14336, 7168 + 224, 64 * 4, 14336, 256, 8};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void put(CUdeviceptr at, uint64_t v)
{
    uint64_t buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = v + (uint64_t)i;
    CHECK_CU(cuMemcpyHtoD(at, buf, sizeof buf));
}

static int got(CUdeviceptr at, uint64_t v)
{
    uint64_t buf[8];
    if (cuMemcpyDtoH(buf, at, sizeof buf) != CUDA_SUCCESS)
        return 0;
    for (int i = 0; i < 8; i++)
        if (buf[i] != v + (uint64_t)i)
            return 0;
    return 1;
}

/* A create that finds no free range in the reservation: FABPOOL_ERR_LIMIT, its message naming the window
 * asked for (the buffer's record is gone by then), and the pool goes on. */
static void create_without_room(void)
{
    /* the pool's records in libc's heap, which the ctest entry has scribble over freed memory
     * (MALLOC_PERTURB_, no per-thread cache): a record read after its free gives a wrong size */
    fabpool_t *p = t_pool("reserve:256MiB,metadata:libc");
    if (!p)
        return;
    fabpool_buffer_t *a = NULL, *b = (fabpool_buffer_t *)1;
    CHECK_OK(fabpool_buffer_create(p, 160 * MB, 2 * MB, &a));
    CHECK_STATUS(fabpool_buffer_create(p, 160 * MB, 2 * MB, &b), FABPOOL_ERR_LIMIT);
    CHECK(b == NULL);
    char want[64];
    snprintf(want, sizeof want, "no free address range of %llu bytes", 160ull * MB);
    CHECK(strstr(fabpool_last_error(), want) != NULL);
    CHECK(t_stats(p).buffers == 1);
    CHECK_OK(fabpool_check(p));
    if (a)
        CHECK_OK(fabpool_buffer_destroy(a, NULL));
    CHECK_OK(fabpool_buffer_create(p, 160 * MB, 2 * MB, &b));
    if (b)
        CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* A window larger than the reservation: FABPOOL_ERR_LIMIT, whose advice is a larger reserve only where one
 * (at most 1 PiB) would hold it. */
static void create_beyond_any_reservation(void)
{
    fabpool_t *p = t_pool("reserve:256MiB");
    if (!p)
        return;
    const struct {
        size_t max_size;
        const char *says, *never;
    } cases[] = {
        {512 * MB, "raise reserve", "beyond any reservation"},
        {(size_t)1 << 49, "raise reserve", "beyond any reservation"},
        {((size_t)1 << 50) + 1, "beyond any reservation", "raise reserve"},
        {SIZE_MAX, "beyond any reservation", "raise reserve"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fabpool_buffer_t *b = (fabpool_buffer_t *)1;
        CHECK_STATUS(fabpool_buffer_create(p, cases[i].max_size, 2 * MB, &b), FABPOOL_ERR_LIMIT);
        CHECK(b == NULL && strstr(fabpool_last_error(), cases[i].says) && !strstr(fabpool_last_error(),
                                                                                   cases[i].never));
    }
    CHECK(t_stats(p).buffers == 0);
    CHECK_OK(fabpool_destroy(p));
}

int main(int argc, char **argv)
{
    int sim = t_driver_init();
    create_without_room();
    create_beyond_any_reservation();
    long steps = argc > 1 ? atol(argv[1]) : 10000;
    uint64_t max_tokens = 16384;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(NULL, &p));
    if (!p)
        return t_done("test_buffers");
    fabpool_buffer_t *b[NBUF];
    void *base[NBUF];
    size_t size[NBUF];
    uint64_t tokens = 512;
    for (int i = 0; i < NBUF; i++) {
        size[i] = tokens * per_token[i];
        CHECK_OK(fabpool_buffer_create(p, max_tokens * per_token[i], size[i], &b[i]));
        base[i] = fabpool_buffer_ptr(b[i]);
    }
    int64_t worst = 0;
    long grows = 0, shrinks = 0, mismatches = 0;
    for (long step = 0; step < steps; step++) {
        /* a random walk with jumps: rises and falls */
        uint64_t r = next_rand();
        if (r % 50 == 0)
            tokens = 128 + next_rand() % (max_tokens - 128);
        else {
            int64_t d = (int64_t)(next_rand() % 513) - 256;
            int64_t t = (int64_t)tokens + d;
            tokens = (uint64_t)(t < 128 ? 128 : t > (int64_t)max_tokens ? (int64_t)max_tokens : t);
        }
        size_t want[NBUF];
        for (int i = 0; i < NBUF; i++) {
            want[i] = tokens * per_token[i];
            /* markers at the start and at the end of what is there now */
            put((CUdeviceptr)(uintptr_t)base[i], (uint64_t)step * 16 + (uint64_t)i);
            put((CUdeviceptr)(uintptr_t)base[i] + size[i] - 64, (uint64_t)step * 16 + (uint64_t)i + 8);
        }
        CHECK_OK(fabpool_buffer_resize_set(b, want, NBUF, NULL));
        for (int i = 0; i < NBUF; i++) {
            fabpool_buffer_info in = {.struct_size = sizeof in};
            fabpool_buffer_get_info(b[i], &in);
            CHECK(in.base == base[i]);
            CHECK(in.size == want[i] && in.mapped >= want[i]);
            CHECK(got((CUdeviceptr)(uintptr_t)base[i], (uint64_t)step * 16 + (uint64_t)i));
            if (want[i] >= size[i]) {
                CHECK(got((CUdeviceptr)(uintptr_t)base[i] + size[i] - 64, (uint64_t)step * 16 + (uint64_t)i + 8));
                grows += want[i] > size[i];
            } else {
                shrinks++;
            }
            /* the whole new size is usable: write and read its last bytes */
            put((CUdeviceptr)(uintptr_t)base[i] + want[i] - 64, 77);
            CHECK(got((CUdeviceptr)(uintptr_t)base[i] + want[i] - 64, 77));
            size[i] = want[i];
        }
        int64_t d = t_held() - (int64_t)t_mapped(p);
        if (d < 0)
            d = -d;
        if (d > worst)
            worst = d;
        if (!t_near(t_held(), (int64_t)t_mapped(p)) && mismatches++ < 5)
            fprintf(stderr, "step %ld: driver holds %lld, pool maps %llu\n", step, (long long)t_held(),
                    (unsigned long long)t_mapped(p));
    }
    CHECK(mismatches == 0);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(p, &s);
    printf("%ld steps (%s driver): %ld grows, %ld shrinks, %llu chunks mapped and %llu unmapped in all, "
           "peak mapped %.1f MiB, worst |held - mapped| %lld bytes, cuMemCreate %llu cuMemMap %llu cuMemUnmap %llu\n",
           steps, sim ? "simulated" : "real", grows, shrinks, (unsigned long long)s.chunks_mapped_total,
           (unsigned long long)s.chunks_unmapped_total, (double)s.mapped_bytes_peak / (double)MB, (long long)worst,
           (unsigned long long)t_calls(&s, "cuMemCreate"), (unsigned long long)t_calls(&s, "cuMemMap"),
           (unsigned long long)t_calls(&s, "cuMemUnmap"));
    CHECK(s.handles_outstanding == 0);
    for (int i = 0; i < NBUF; i++)
        CHECK_OK(fabpool_buffer_destroy(b[i], NULL));
    CHECK(t_mapped(p) == 0);
    CHECK(t_near(t_held(), 0));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_near(t_held(), 0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
    return t_done("test_buffers");
}
