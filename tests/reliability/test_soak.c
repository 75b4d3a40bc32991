/* test_soak: a long run of what a MoE dispatch/combine layer does.  Every step
 * draws a token count and resizes a HybridEP-like set of four buffers to it
 * at once (fabpool_buffer_resize_set), and churns size-class blocks (up to 256
 * live, 256 B to 24 MiB).  Each step checks that what the driver holds (the
 * sim's ledger, or the fall of cuMemGetInfo's free memory with slack on a
 * real GPU) never exceeds what the pool says it maps plus what is retiring,
 * and that data written earlier reads back.  At the end everything is freed
 * and the driver holds nothing.
 *   test_soak [steps]          (default 2000)
 *   test_soak --seconds N      run for N seconds */
#include <time.h>

#include "../testutil.h"

#define MB (1ull << 20)
#define NBUF 4
#define NBLK 256

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static void put(uint64_t at, uint64_t v) { CHECK_CU(cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v)); }
static uint64_t get(uint64_t at)
{
    uint64_t v = ~0ull;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)at, sizeof v));
    return v;
}

int main(int argc, char **argv)
{
    long steps = 2000;
    double seconds = 0;
    if (argc > 2 && strcmp(argv[1], "--seconds") == 0)
        seconds = atof(argv[2]);
    else if (argc > 1)
        steps = atol(argv[1]);
    int sim = t_driver_init();
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(NULL, &p));
    if (!p)
        return t_done("test_soak");
    /* bytes per token: bf16 hidden 7168, fp8 hidden + scales, top-k ids and weights */
    static const size_t per_token[NBUF] = {7168 * 2, 7168 + 56 * 4, 8 * 8, 8 * 4};
    const size_t max_tokens = 16384;
    fabpool_buffer_t *bufs[NBUF];
    size_t sizes[NBUF];
    for (int i = 0; i < NBUF; i++) {
        sizes[i] = per_token[i] * 256;
        CHECK_OK(fabpool_buffer_create(p, per_token[i] * max_tokens, sizes[i], &bufs[i]));
        put((uint64_t)(uintptr_t)fabpool_buffer_ptr(bufs[i]), 0x50a0 + (uint64_t)i);
    }
    void *blk[NBLK] = {0};
    uint64_t blk_tag[NBLK] = {0};
    uint64_t seed = 2024, worst_over = 0, max_held = 0, n_resize = 0, n_alloc = 0, errors = 0;
    double t0 = now();
    long step = 0;
    for (;; step++) {
        if (seconds > 0 ? now() - t0 >= seconds : step >= steps)
            break;
        size_t tokens = 1 + rnd(&seed) % max_tokens;
        for (int i = 0; i < NBUF; i++)
            sizes[i] = per_token[i] * tokens;
        if (fabpool_buffer_resize_set(bufs, sizes, NBUF, NULL) != FABPOOL_OK) {
            errors++;
            fprintf(stderr, "step %ld: resize_set to %zu tokens: %s\n", step, tokens, fabpool_last_error());
        }
        n_resize++;
        /* churn: replace a few blocks */
        for (int k = 0; k < 4; k++) {
            int j = (int)(rnd(&seed) % NBLK);
            if (blk[j]) {
                if (get((uint64_t)(uintptr_t)blk[j]) != blk_tag[j])
                    errors++;
                if (fabpool_free(p, blk[j]) != FABPOOL_OK)
                    errors++;
                blk[j] = NULL;
            }
            size_t sz = rnd(&seed) % 8 ? (size_t)256 + rnd(&seed) % (256 << 10) : (size_t)(1 + rnd(&seed) % 24) * MB;
            if (fabpool_alloc(p, sz, &blk[j]) != FABPOOL_OK) {
                errors++;
                blk[j] = NULL;
                continue;
            }
            blk_tag[j] = ((uint64_t)step << 8) | (uint64_t)j;
            put((uint64_t)(uintptr_t)blk[j], blk_tag[j]);
            n_alloc++;
        }
        /* the buffers' first words survive every resize */
        if (step % 16 == 0)
            for (int i = 0; i < NBUF; i++)
                if (get((uint64_t)(uintptr_t)fabpool_buffer_ptr(bufs[i])) != 0x50a0 + (uint64_t)i)
                    errors++;
        /* held by the driver <= mapped + retiring (slack on a real GPU) */
        fabpool_stats s = {.struct_size = sizeof s};
        fabpool_get_stats(p, &s);
        int64_t held = t_held();
        int64_t says = (int64_t)(s.mapped_bytes + s.retiring_bytes);
        if (held > says && (uint64_t)(held - says) > worst_over)
            worst_over = (uint64_t)(held - says);
        if (held > says + t_slack()) {
            errors++;
            fprintf(stderr, "step %ld: the driver holds %lld bytes, the pool says %lld mapped + retiring\n", step,
                    (long long)held, (long long)says);
        }
        if (held > 0 && (uint64_t)held > max_held)
            max_held = (uint64_t)held;
        if (step % 1000 == 0)
            fabpool_trim(p, 256 * MB);
    }
    double dt = now() - t0;
    for (int j = 0; j < NBLK; j++)
        if (blk[j]) {
            CHECK(get((uint64_t)(uintptr_t)blk[j]) == blk_tag[j]);
            CHECK_OK(fabpool_free(p, blk[j]));
        }
    for (int i = 0; i < NBUF; i++)
        CHECK_OK(fabpool_buffer_destroy(bufs[i], NULL));
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(p, &s);
    CHECK(s.blocks == 0 && s.buffers == 0);
    CHECK_OK(fabpool_destroy(p));
    int64_t left = t_held();
    CHECK(t_near(left, 0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
    CHECK(errors == 0);
    printf("test_soak: %ld steps in %.2f s (%.1f us a step), %llu resize_sets, %llu allocations, %llu errors; "
           "peak held %llu MiB, worst held over mapped+retiring %llu bytes, chunks mapped %llu / unmapped %llu, "
           "%lld bytes held at the end (%s)\n",
           step, dt, step ? dt * 1e6 / (double)step : 0.0, (unsigned long long)n_resize, (unsigned long long)n_alloc,
           (unsigned long long)errors, (unsigned long long)(max_held >> 20), (unsigned long long)worst_over,
           (unsigned long long)s.chunks_mapped_total, (unsigned long long)s.chunks_unmapped_total, (long long)left,
           sim ? "sim ledger" : "cuMemGetInfo");
    return t_done("test_soak");
}
