/* grow_ahead.c - fabpool_grow_ahead: what a live set that grows fast from
 * nothing maps, and how many driver calls its growth costs
 * (docs/performance.md, "A small live set that grows fast").
 *
 * Each case is a fresh pool with the default options that allocates blocks
 * one after another until n are live: of 1 MiB each, or of sizes drawn
 * log-uniformly from 0.5 to 4 MiB (seeded); "with frees" frees a block drawn
 * at random among the live ones after every third allocation.  It prints the
 * peak of the bytes the pool mapped (fabpool_stats.mapped_bytes_peak: what
 * the driver holds for it) over the peak of the bytes asked for and live, and
 * the cuMemCreate and cuMemMap calls the pool made (its driver_calls), which
 * cost about 50 us each on an H100 (docs/driver-facts.md).  The last lines
 * grow far larger sets, where the calls of the ramp add up.  It runs against
 * whichever libcuda.so.1 is loaded (FABPOOL_CUDA_LIBRARY for the sim). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabpool.h"

#define MIB (1ull << 20)
#define MAX_BLOCKS 4000

typedef struct result {
    uint64_t live_peak, mapped_peak, creates, maps;
} result;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A size from 0.5 to 4 MiB, log-uniform, a multiple of 256 bytes. */
static uint64_t mixed_size(uint64_t *s)
{
    double u = (double)(rng_next(s) >> 11) / 9007199254740992.0; /* [0, 1) */
    return (uint64_t)(524288.0 * exp2(3.0 * u)) & ~255ull;
}

static int count_call(const fabpool_stats *st, const char *name)
{
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && st->driver_call_names[i]; i++)
        if (strcmp(st->driver_call_names[i], name) == 0)
            return i;
    return -1;
}

/* n blocks live, grown one after another (frees: a random one freed after every third allocation). */
static int run_case(unsigned n, int mixed, int frees, uint64_t seed, result *r)
{
    static void *ptr[MAX_BLOCKS];
    static uint64_t size[MAX_BLOCKS];
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_NONE;
    fabpool_t *p = NULL;
    if (fabpool_create(&o, &p) != FABPOOL_OK) {
        fprintf(stderr, "fabpool_grow_ahead: fabpool_create: %s\n", fabpool_last_error());
        return -1;
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1, live = 0;
    unsigned k = 0, made = 0;
    memset(r, 0, sizeof *r);
    int rc = 0;
    while (k < n) {
        uint64_t b = mixed ? mixed_size(&s) : MIB;
        if (fabpool_alloc(p, b, &ptr[k]) != FABPOOL_OK) {
            fprintf(stderr, "fabpool_grow_ahead: fabpool_alloc(%" PRIu64 "): %s\n", b, fabpool_last_error());
            rc = -1;
            break;
        }
        size[k++] = b;
        live += b;
        r->live_peak = live > r->live_peak ? live : r->live_peak;
        if (frees && ++made % 3 == 0) {
            unsigned v = (unsigned)(rng_next(&s) % k);
            if (fabpool_free(p, ptr[v]) != FABPOOL_OK) {
                fprintf(stderr, "fabpool_grow_ahead: fabpool_free: %s\n", fabpool_last_error());
                rc = -1;
                break;
            }
            live -= size[v];
            ptr[v] = ptr[--k];
            size[v] = size[k];
        }
    }
    fabpool_stats st = {.struct_size = sizeof st};
    if (rc == 0 && fabpool_get_stats(p, &st) == FABPOOL_OK) {
        int c = count_call(&st, "cuMemCreate"), m = count_call(&st, "cuMemMap");
        r->mapped_peak = st.mapped_bytes_peak;
        r->creates = c >= 0 ? st.driver_calls[c] : 0;
        r->maps = m >= 0 ? st.driver_calls[m] : 0;
    } else if (rc == 0) {
        fprintf(stderr, "fabpool_grow_ahead: fabpool_get_stats: %s\n", fabpool_last_error());
        rc = -1;
    }
    for (unsigned i = 0; i < k; i++)
        fabpool_free(p, ptr[i]);
    if (fabpool_destroy(p) != FABPOOL_OK && rc == 0) {
        fprintf(stderr, "fabpool_grow_ahead: fabpool_destroy: %s\n", fabpool_last_error());
        rc = -1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    uint64_t seeds = 8;
    if (argc > 1) {
        char *end;
        unsigned long long v = strtoull(argv[1], &end, 10);
        if (*end || v == 0 || v > 1000) {
            fprintf(stderr, "usage: fabpool_grow_ahead [seeds: 1..1000, default 8]\n");
            return 2;
        }
        seeds = v;
    }
    static const unsigned counts[] = {20, 60, 100, 1000, 4000};
    printf("%-36s %10s %10s %9s %9s %11s\n", "live set (blocks grown one by one)", "live MiB", "mapped MiB",
           "mapped/live", "", "create+map");
    double worst_small = 0;
    for (int frees = 0; frees < 2; frees++)
        for (int mixed = 0; mixed < 2; mixed++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                unsigned n = counts[c];
                uint64_t runs = mixed ? seeds : 1, calls = 0;
                double worst = 0, live = 0, mapped = 0;
                for (uint64_t sd = 1; sd <= runs; sd++) {
                    result r;
                    if (run_case(n, mixed, frees, sd, &r) != 0)
                        return 1;
                    double q = (double)r.mapped_peak / (double)r.live_peak;
                    if (q > worst) {
                        worst = q;
                        live = (double)r.live_peak / MIB;
                        mapped = (double)r.mapped_peak / MIB;
                    }
                    calls = r.creates + r.maps > calls ? r.creates + r.maps : calls;
                }
                if (n <= 100 && worst > worst_small)
                    worst_small = worst;
                char name[64];
                snprintf(name, sizeof name, "%u x %s%s", n, mixed ? "0.5-4 MiB" : "1 MiB", frees ? ", frees" : "");
                printf("%-36s %10.1f %10.1f %9.3fx %9s %11" PRIu64 "\n", name, live, mapped, worst,
                       runs > 1 ? "(worst)" : "", calls);
            }
    printf("worst mapped/live of the sets of 20 to 100 blocks: %.3fx\n", worst_small);
    return 0;
}
