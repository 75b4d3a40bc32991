/* test_layout: what fabpool holds over what is live, on the shapes of
 * fabpool_bench (perf/shapes.h: uniform, normal and log-uniform random live
 * sets, training steps of activations) with their sizes, counts and lengths
 * drawn at random, so that the bounds the bench checks at its own settings
 * are seen to be the layout's, not one run's.
 *
 *   test_layout [seed]
 *
 * Each draw replays a shape on a fresh pool (thread caches on, defaults
 * otherwise) and reads what the driver holds every 32 operations (the
 * simulated driver's ledger, or the device on a real GPU): the peak of that
 * over the peak of the bytes asked for must stay under the shape's bound.
 * The first draw of each family runs ten times as long: over its second
 * half the ratio may climb by at most 0.03 and a granule (nothing creeps
 * once the live set has settled; fabpool_bench --long checks the bench's own
 * shapes against their first tenth).  Each bound is
 * the bench's (docs/performance.md, at its own seeds) plus what other seeds
 * give there (uniform up to 1.042, normal 1.062, log-uniform 1.11 over
 * twelve seeds each), plus a fixed cost over the live peak: two granules,
 * and what an arena maps ahead of a live set that grows fast (4 MiB for the
 * medium arena, 64 MiB for the large one, fabpool.h): a live set of a few
 * hundred MiB carries it, a large one spreads it out. */
#include "testutil.h"

#include "../perf/shapes.h"

#define KB (1ull << 10)
#define MB (1ull << 20)

static uint64_t draw_state;
static uint64_t draw(uint64_t lo, uint64_t hi) { return lo + shape_rng(&draw_state) % (hi - lo + 1); }

typedef struct outcome {
    double ratio, half;
    uint64_t peak_live;
} outcome;

/* Replays s on a fresh pool: peak held over peak live, over the whole run and over its first half. */
static outcome replay(const shape *s)
{
    outcome o = {0, 0, 0};
    fabpool_t *p = t_pool("reserve:32GiB"); /* valgrind cannot reserve 8x a 12 GiB device */
    if (!p)
        return o;
    int cap = shape_max_live(s);
    void **live = calloc((size_t)cap, sizeof *live);
    uint64_t *size = calloc((size_t)cap, sizeof *size);
    uint64_t live_bytes = 0, peak_live = 0, peak_held = 0, base = (uint64_t)t_held(), sz;
    long done = 0, half = shape_ops(s) / 2;
    int n = 0, j;
    shape_run r;
    CHECK(shape_start(&r, s) == 0);
    while (shape_next(&r, &sz, &j)) {
        if (sz) {
            fabpool_status st = fabpool_alloc(p, sz, &live[n]);
            CHECK_OK(st);
            if (st != FABPOOL_OK)
                break;
            size[n++] = sz;
            live_bytes += sz;
            peak_live = live_bytes > peak_live ? live_bytes : peak_live;
        } else {
            CHECK_OK(fabpool_free(p, live[j]));
            live_bytes -= size[j];
            live[j] = live[--n];
            size[j] = size[n];
        }
        if (++done % 32 == 0) {
            uint64_t held = (uint64_t)t_held() - base;
            peak_held = held > peak_held ? held : peak_held;
            if (done / 32 == half / 32)
                o.half = (double)peak_held / (double)peak_live;
        }
    }
    shape_end(&r);
    for (int i = 0; i < n; i++)
        CHECK_OK(fabpool_free(p, live[i]));
    CHECK_OK(fabpool_destroy(p));
    free(live);
    free(size);
    o.ratio = peak_live ? (double)peak_held / (double)peak_live : 0;
    o.peak_live = peak_live;
    return o;
}

static double worst[4];

/* Replays s and checks its peak held / peak live against bound plus a
 * fixed cost over the live peak: two granules, and `ahead` (what an arena
 * maps ahead of a fast-growing live set: fabpool.h). */
static void one(const char *what, const shape *s, double bound, uint64_t ahead, int creep)
{
    outcome o = replay(s);
    bound += (double)(4 * MB + ahead) / (double)(o.peak_live ? o.peak_live : 1);
    if (o.ratio > worst[s->kind])
        worst[s->kind] = o.ratio;
    if (o.ratio > bound || o.ratio < 1.0)
        fprintf(stderr, "%s: peak held / peak live %.4f, bound %.3f (live peak %llu MiB; seed %llu, %d live, %ld ops, "
                "sizes %llu..%llu, %d steps of %d layers x %d (%d %d %d %d %d %d) x %llu B x %d..%d)\n", what, o.ratio,
                bound, (unsigned long long)(o.peak_live >> 20), (unsigned long long)s->seed, s->n_live, s->n_ops,
                (unsigned long long)s->min_size, (unsigned long long)s->max_size, s->steps, s->layers, s->n_factors,
                s->factors[0], s->factors[1], s->factors[2], s->factors[3], s->factors[4], s->factors[5],
                (unsigned long long)s->unit, s->len_lo, s->len_hi);
    CHECK(o.ratio >= 1.0 && o.ratio <= bound);
    if (creep) { /* the ratio may fall as the live set reaches new peaks later; it may not climb */
        double room = 0.03 + (double)(2 * MB) / (double)(o.peak_live ? o.peak_live : 1);
        if (o.ratio > o.half + room)
            fprintf(stderr, "%s: %.4f over the first half, %.4f over the whole run (seed %llu, %d live, sizes up to "
                    "%llu)\n", what, o.half, o.ratio, (unsigned long long)s->seed, s->n_live,
                    (unsigned long long)s->max_size);
        CHECK(o.ratio <= o.half + room);
    }
    printf("  %-12s %.4f%s (live peak %4llu MiB)\n", what, o.ratio, creep ? " (ten times as long)" : "",
           (unsigned long long)(o.peak_live >> 20));
}

int main(int argc, char **argv)
{
    t_driver_init();
    draw_state = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x1a70u;
    printf("test_layout: seed %llu\n", (unsigned long long)draw_state);
    for (int d = 0; d < 4; d++) {
        int creep = d == 0;
        long x = creep ? 10 : 1;
        /* uniform 1 B .. 16-64 KiB, 2,000-10,000 live (bench: 1.04 at 64 KiB and 10,000) */
        shape u = {.kind = SHAPE_UNIFORM, .seed = draw(1, 1u << 30), .n_live = (int)draw(2000, 10000),
                   .max_size = draw(16 * KB, 64 * KB)};
        u.n_ops = 4L * u.n_live * x;
        one("uniform", &u, 1.05, 4 * MB, creep);
        /* normal around 1-4 MiB, 500-2,000 live (bench: 1.05 at 4 MiB and 2,000) */
        shape nm = {.kind = SHAPE_NORMAL, .seed = draw(1, 1u << 30), .n_live = (int)draw(500, 2000),
                    .max_size = draw(2 * MB, 8 * MB)};
        nm.n_ops = 4L * nm.n_live * x;
        one("normal", &nm, 1.07, 64 * MB, creep);
        /* log-uniform from 4-64 KiB to 4-32 MiB, 300-1,500 live (bench: 1.10 at 4 KiB..16 MiB and 1,500) */
        shape lg = {.kind = SHAPE_LOGU, .seed = draw(1, 1u << 30), .n_live = (int)draw(300, 1500),
                    .min_size = draw(4 * KB, 64 * KB), .max_size = draw(4 * MB, 32 * MB)};
        lg.n_ops = 20L * lg.n_live * x;
        one("log-uniform", &lg, 1.13, 64 * MB, creep);
        /* steps of 16-32 layers, 2-6 activations each of 1-4 x a length x 4-16 KiB, the lengths such that
         * blocks are about 2 to 128 MiB (bench: 1.02 at 24 layers of 1, 4, 2, 1 x 256..4096 x 8 KiB) */
        shape st = {.kind = SHAPE_STEPS, .seed = draw(1, 1u << 30), .steps = (int)(draw(10, 30) * x),
                    .layers = (int)draw(16, 32), .n_factors = (int)draw(2, 6), .unit = draw(2, 8) * 2 * KB};
        int fmax = 1;
        for (int f = 0; f < st.n_factors; f++) {
            st.factors[f] = (int)draw(1, 4);
            fmax = st.factors[f] > fmax ? st.factors[f] : fmax;
        }
        int fsum = 0;
        for (int f = 0; f < st.n_factors; f++)
            fsum += st.factors[f];
        uint64_t hi = 128 * MB / st.unit / (uint64_t)fmax, step_hi = 4096 * MB / st.unit / (uint64_t)(st.layers * fsum);
        st.len_lo = (int)(2 * MB / st.unit);
        st.len_hi = (int)(hi < step_hi ? hi : step_hi); /* a step of at most 4 GiB: the test's device is 12 GiB */
        st.len_lo = (int)draw((uint64_t)st.len_lo, (uint64_t)st.len_lo * 4);
        if (st.len_lo > st.len_hi)
            st.len_lo = st.len_hi;
        one("steps", &st, 1.02, 64 * MB, creep);
    }
    printf("test_layout: worst peak held / peak live: uniform %.4f, normal %.4f, log-uniform %.4f, steps %.4f\n",
           worst[SHAPE_UNIFORM], worst[SHAPE_NORMAL], worst[SHAPE_LOGU], worst[SHAPE_STEPS]);
    return t_done("test_layout");
}
