/* test_large_chunks.c - large_chunks:whole, a pool that maps the growth for a
 * block above 256 KiB as one chunk (up to max_chunk), as the PyTorch
 * adapter's tag pools do: the first fill of an RL region maps about a chunk
 * per block where the grid maps several, holds no more than the grid, and
 * everything a pool does with chunks (trim, decay, trade, sleep with offload
 * and wake, destroy) keeps the data and gives every byte back.
 *
 *   test_large_chunks fill    the RL region's first fill on a whole pool and a grid pool
 *   test_large_chunks split   a growth above max_chunk: equal chunks of at most max_chunk; the largest
 *                             max_chunk (1 PiB) maps a block as one chunk, and a larger one is refused
 *   test_large_chunks churn   frees and allocations of mixed sizes, trim, decay, sleep and wake, destroy
 */
#include <time.h>

#include "testutil.h"

#define MB (1ull << 20)
#define GB (1ull << 30)

/* The weights of perf/rl_pause_resume.py's region (weight_sizes(3 GiB), seed 1: 139 tensors of 4 KiB to
 * 256 MiB, log-uniform), each rounded up to 2 MiB as PyTorch's segments are, in MiB. */
static const unsigned weights_mb[] = {
    2,   2,  20, 6,  2,   80, 2,  10, 12, 4,  86, 2,  2,   8,   14, 2,  132, 2,  8,  152, 2,  110, 2,  2,
    82,  128, 2, 2,  192, 48, 2,  2,  2,  2,  2,  2,  2,   2,   2,  10, 4,   6,  2,  22,  106, 2, 2,  2,
    6,   160, 2, 32, 22,  2,  2,  4,  134, 2, 2,  2,  24,  2,   30, 2,  56,  28, 2,  2,   2,  2,  28, 2,
    2,   2,   6, 2,  2,   2,  2,  2,  86, 198, 2, 2,  2,   2,   8,  40, 2,   6,  8,  6,   2,  2,  66, 2,
    2,   16,  4, 2,  4,   170, 2, 2,  2,  2,  4,  2,  2,   2,   62, 2,  54,  24, 2,  8,   122, 100, 2, 2,
    2,   2,   2, 4,  2,   2,  60, 24, 2,  22, 2,  2,  40,  2,   24, 2,  2,   152, 32};
#define NWEIGHTS (sizeof weights_mb / sizeof weights_mb[0])
#define KV_BYTES (2 * GB)

typedef struct fill_result {
    uint64_t chunks, mapped, held, calls_create;
} fill_result;

/* The region's first fill on a pool made with conf: the weights, then the KV cache; each block tagged at
 * both ends and read back.  Destroyed after, the ledger back where it was. */
static fill_result rl_fill(const char *conf)
{
    fill_result r = {0, 0, 0, 0};
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool(conf);
    if (!p)
        return r;
    void *w[NWEIGHTS + 1];
    memset(w, 0, sizeof w);
    uint64_t c0 = t_stats(p).chunks_mapped_total;
    for (size_t i = 0; i < NWEIGHTS; i++) {
        CHECK_OK(fabpool_alloc(p, (size_t)weights_mb[i] * MB, &w[i]));
        if (w[i])
            t_put_tag(w[i], (size_t)weights_mb[i] * MB, 0x1000 + i);
    }
    CHECK_OK(fabpool_alloc(p, KV_BYTES, &w[NWEIGHTS]));
    if (w[NWEIGHTS])
        t_put_tag(w[NWEIGHTS], KV_BYTES, 0x2000);
    for (size_t i = 0; i < NWEIGHTS; i++)
        CHECK(w[i] && t_tag_ok(w[i], (size_t)weights_mb[i] * MB, 0x1000 + i));
    CHECK(w[NWEIGHTS] && t_tag_ok(w[NWEIGHTS], KV_BYTES, 0x2000));
    CHECK_OK(fabpool_check(p));
    fabpool_stats s = t_stats(p);
    r.chunks = s.chunks_mapped_total - c0;
    r.mapped = s.mapped_bytes;
    r.held = (uint64_t)t_held() - l0.bytes_held;
    r.calls_create = t_calls(&s, "cuMemCreate");
    CHECK(s.chunks_mapped == r.chunks); /* nothing unmapped on the way */
    for (size_t i = 0; i <= NWEIGHTS; i++)
        CHECK_OK(fabpool_free(p, w[i]));
    CHECK_OK(fabpool_destroy(p));
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held && l.mappings == l0.mappings && l.allocations == l0.allocations);
    }
    return r;
}

static void test_fill(void)
{
    uint64_t sum = KV_BYTES;
    for (size_t i = 0; i < NWEIGHTS; i++)
        sum += (uint64_t)weights_mb[i] * MB;
    /* handle type none, as the tag pools make theirs */
    fill_result whole = rl_fill("handle_type:none,large_chunks:whole");
    fill_result grid = rl_fill("handle_type:none,large_chunks:grid");
    printf("RL fill, %zu blocks, %llu MiB: whole %llu chunks, %llu MiB mapped; grid %llu chunks, %llu MiB mapped\n",
           NWEIGHTS + 1, (unsigned long long)(sum / MB), (unsigned long long)whole.chunks,
           (unsigned long long)(whole.mapped / MB), (unsigned long long)grid.chunks,
           (unsigned long long)(grid.mapped / MB));
    /* about a chunk per block: the 2 GiB cache is two of max_chunk (1 GiB), and the map-ahead of the small
     * blocks' misses may add one here and there */
    CHECK(whole.chunks <= NWEIGHTS + 1 + 8);
    CHECK(whole.chunks >= 2);
    /* the grid cuts the same fill into several times as many */
    CHECK(grid.chunks >= 3 * whole.chunks);
    /* no more held than the sizes, and no more than the grid holds */
    CHECK(whole.mapped >= sum);
    CHECK(whole.mapped <= grid.mapped);
    CHECK(whole.mapped <= sum + sum / 50);
    if (t_ledger_p)
        CHECK(whole.held == whole.mapped && grid.held == grid.mapped);
}

/* A growth above max_chunk (64 MiB here): equal chunks of at most that, each unmapped when the block goes. */
static void test_split(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("handle_type:none,large_chunks:whole,max_chunk:64MiB,decay_ms:0");
    if (!p)
        return;
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK_OK(fabpool_get_options(p, &o));
    CHECK(o.large_chunks == FABPOOL_LARGE_CHUNKS_WHOLE && o.max_chunk_bytes == 64 * MB);
    const struct {
        uint64_t size, chunks;
    } cases[] = {
        {64 * MB, 1},  /* at the cap: one */
        {66 * MB, 2},  /* 2 x 33 MiB */
        {200 * MB, 4}, /* 4 x 50 MiB */
        {130 * MB, 3}, /* 44 + 44 + 42 MiB */
        {12 * MB, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fabpool_stats s0 = t_stats(p);
        void *b = NULL;
        CHECK_OK(fabpool_alloc(p, cases[i].size, &b));
        fabpool_stats s1 = t_stats(p);
        CHECK(s1.chunks_mapped_total - s0.chunks_mapped_total == cases[i].chunks);
        CHECK(s1.mapped_bytes - s0.mapped_bytes == cases[i].size);
        if (s1.chunks_mapped_total - s0.chunks_mapped_total != cases[i].chunks)
            fprintf(stderr, "split: a block of %llu MiB mapped %llu chunks, expected %llu\n",
                    (unsigned long long)(cases[i].size / MB),
                    (unsigned long long)(s1.chunks_mapped_total - s0.chunks_mapped_total),
                    (unsigned long long)cases[i].chunks);
        if (!b)
            continue;
        t_put_tag(b, cases[i].size, 0x3000 + i);
        CHECK(t_tag_ok(b, cases[i].size, 0x3000 + i));
        /* decay_ms:0: its chunks lie wholly in the freed range and all go back at once */
        CHECK_OK(fabpool_free(p, b));
        fabpool_stats s2 = t_stats(p);
        CHECK(s2.mapped_bytes == s0.mapped_bytes && s2.chunks_mapped == s0.chunks_mapped);
    }
    CHECK_OK(fabpool_destroy(p));
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
}

/* max_chunk at its maximum, 1 PiB: a block's growth is one chunk (its part count computed without overflow);
 * above it, as a FABPOOL_CONF value or a field set directly, the pool is refused before it maps anything. */
static void test_largest_max_chunk(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("handle_type:none,large_chunks:whole,max_chunk:1PiB,decay_ms:0");
    if (p) {
        fabpool_stats s0 = t_stats(p);
        void *b = NULL;
        CHECK_OK(fabpool_alloc(p, 64 * MB, &b));
        CHECK(t_stats(p).chunks_mapped_total - s0.chunks_mapped_total == 1);
        if (b) {
            t_put_tag(b, 64 * MB, 0x4000);
            CHECK(t_tag_ok(b, 64 * MB, 0x4000));
            CHECK_OK(fabpool_free(p, b));
        }
        CHECK_OK(fabpool_destroy(p));
    }
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = "handle_type:none,large_chunks:whole";
    o.max_chunk_bytes = UINT64_MAX - (2 * MB - 1); /* a multiple of 2 MiB near 2^64: "no limit" */
    fabpool_t *q = (fabpool_t *)&o;
    CHECK_STATUS(fabpool_create(&o, &q), FABPOOL_ERR_CONFIG);
    CHECK(q == NULL && strstr(fabpool_last_error(), "max_chunk_bytes") && strstr(fabpool_last_error(), "1PiB"));
    if (q) { /* refused neither: what it maps for a block is the check */
        void *b = NULL;
        CHECK_OK(fabpool_alloc(q, 64 * MB, &b));
        CHECK_OK(fabpool_free(q, b));
        CHECK_OK(fabpool_destroy(q));
    }
    fabpool_options_init(&o);
    o.conf = "handle_type:none,large_chunks:whole,max_chunk:18446744073707454464";
    q = (fabpool_t *)&o;
    CHECK_STATUS(fabpool_create(&o, &q), FABPOOL_ERR_CONFIG);
    CHECK(q == NULL && strstr(fabpool_last_error(), "'max_chunk'") && strstr(fabpool_last_error(), "1PiB"));
    if (q)
        CHECK_OK(fabpool_destroy(q));
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
}

/* ------------------------------------------------------------ churn */

/* Knuth's MMIX LCG, its high bits */
static uint64_t rng_state = 1;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 33;
}

#define NSLOT 48
typedef struct slot {
    void *p;
    size_t size;
    uint64_t tag;
} slot;

/* Every live block's pattern (both ends and its middle word) reads back. */
static int all_intact(const slot *s)
{
    int ok = 1;
    for (int i = 0; i < NSLOT; i++)
        if (s[i].p) {
            uint64_t mid = 0;
            ok &= t_tag_ok(s[i].p, s[i].size, s[i].tag);
            ok &= cuMemcpyDtoH(&mid, (CUdeviceptr)(uintptr_t)s[i].p + s[i].size / 2 / 8 * 8, sizeof mid) ==
                  CUDA_SUCCESS && mid == s[i].tag * 3;
        }
    return ok;
}

static void put(slot *s, void *p, size_t size, uint64_t tag)
{
    s->p = p;
    s->size = size;
    s->tag = tag;
    t_put_tag(p, size, tag);
    t_put_word((char *)p + size / 2 / 8 * 8, tag * 3);
}

/* Sizes from 300 KiB to 96 MiB (odd ones among them), some above max_chunk (32 MiB here). */
static size_t churn_size(void)
{
    static const size_t base[] = {300 << 10, 1 * MB, 2 * MB, 3 * MB + 4096, 6 * MB, 20 * MB, 40 * MB, 96 * MB};
    size_t b = base[rnd() % (sizeof base / sizeof base[0])];
    return b + (size_t)(rnd() % 3) * 256 * 1024;
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static void test_churn(void)
{
    fabsim_ledger l0 = t_ledger();
    /* a small slack: misses trade free chunks; decay 100 ms, checked below (no thread cache: the ticks of the
     * decay check reach the pool) */
    fabpool_t *p = t_pool("handle_type:none,large_chunks:whole,max_chunk:32MiB,large_slack:1,decay_ms:100,thread_cache:0");
    if (!p)
        return;
    slot s[NSLOT];
    memset(s, 0, sizeof s);
    uint64_t tag = 1;
    for (int step = 0; step < 1500; step++) {
        int i = (int)(rnd() % NSLOT);
        if (s[i].p) {
            CHECK_OK(fabpool_free(p, s[i].p));
            s[i].p = NULL;
            continue;
        }
        size_t n = churn_size();
        void *b = NULL;
        CHECK_OK(fabpool_alloc(p, n, &b));
        if (b)
            put(&s[i], b, n, tag++);
        if (step % 250 == 0) {
            CHECK(all_intact(s));
            CHECK_OK(fabpool_check(p));
        }
    }
    CHECK(all_intact(s));
    CHECK_OK(fabpool_check(p));
    fabpool_stats a = t_stats(p);
    CHECK(a.traded_bytes > 0 || a.chunks_unmapped_total > 0); /* free chunks went back on the way */

    /* sleep with offload and wake: every block's bytes back, at the same addresses */
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK(t_stats(p).mapped_bytes == 0);
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK(all_intact(s));
    CHECK_OK(fabpool_check(p));

    /* half freed, then trim: what is held goes down, to no more than the chunks the live blocks lie in */
    uint64_t live = 0;
    for (int i = 0; i < NSLOT; i++)
        if (s[i].p && (i & 1)) {
            CHECK_OK(fabpool_free(p, s[i].p));
            s[i].p = NULL;
        } else if (s[i].p) {
            live += s[i].size;
        }
    uint64_t before = t_stats(p).mapped_bytes;
    CHECK_OK(fabpool_trim(p, 0));
    fabpool_stats t = t_stats(p);
    CHECK(t.mapped_bytes < before);
    CHECK(t.mapped_bytes >= live);
    CHECK(t.cached_bytes < t.mapped_bytes);
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held - l0.bytes_held == t.mapped_bytes);
    CHECK(all_intact(s));
    printf("churn: %llu MiB live, %llu MiB held after trim (%llu chunks), %llu MiB traded, %llu chunks mapped in "
           "all\n", (unsigned long long)(live / MB), (unsigned long long)(t.mapped_bytes / MB),
           (unsigned long long)t.chunks_mapped, (unsigned long long)(a.traded_bytes / MB),
           (unsigned long long)t.chunks_mapped_total);

    /* the decay: a block freed goes back to the driver once idle for a period (the pool's calls drive it);
     * larger than all the free memory left in the chunks live blocks keep, it maps chunks of its own (a free
     * range at a run's end may be part of it), and they go back */
    void *big = NULL, *tick = NULL;
    CHECK_OK(fabpool_alloc(p, 1000, &tick)); /* the slab of the ticks below, mapped before the base is read */
    CHECK_OK(fabpool_free(p, tick));
    uint64_t base = t_stats(p).mapped_bytes;
    CHECK_OK(fabpool_alloc(p, 160 * MB, &big));
    uint64_t with = t_stats(p).mapped_bytes;
    CHECK(with >= base + 160 * MB - t.cached_bytes);
    CHECK_OK(fabpool_free(p, big));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t m = with;
    while (ms_since(&t0) < 5000 && m > base) {
        struct timespec d = {0, 5 * 1000 * 1000};
        nanosleep(&d, NULL);
        CHECK_OK(fabpool_alloc(p, 1000, &tick));
        CHECK_OK(fabpool_free(p, tick));
        m = t_stats(p).mapped_bytes;
    }
    printf("churn: %llu MiB mapped with the 160 MiB block, %llu MiB %.0f ms after its free\n",
           (unsigned long long)(with / MB), (unsigned long long)(m / MB), ms_since(&t0));
    CHECK(m <= base);
    CHECK(all_intact(s));

    /* everything freed and trimmed: nothing mapped; destroyed: nothing held */
    for (int i = 0; i < NSLOT; i++)
        if (s[i].p)
            CHECK_OK(fabpool_free(p, s[i].p));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_stats(p).mapped_bytes <= 2 * MB); /* at most the slab of the ticks */
    CHECK_OK(fabpool_destroy(p));
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held && l.bytes_held_host == l0.bytes_held_host &&
              l.mappings == l0.mappings && l.allocations == l0.allocations);
    }
}

int main(int argc, char **argv)
{
    t_driver_init();
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "fill"))
        test_fill();
    if (!only || !strcmp(only, "split")) {
        test_split();
        test_largest_max_chunk();
    }
    if (!only || !strcmp(only, "churn"))
        test_churn();
    return t_done("test_large_chunks");
}
