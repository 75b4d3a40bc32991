/* fabpool_bench_stream: the cost of the stream-ordered pair
 * (fabpool_alloc_on_stream / fabpool_free_on_stream) against fabpool's own
 * hot path and the driver's stream-ordered allocator.  One thread, one
 * device; every figure is the median over 7 rounds of ns per alloc+free pair.
 *
 *   fabpool_bench_stream [--pairs N] [--json FILE]   (--help says more; a bare N is --pairs N)
 *
 * Cases: fabpool_alloc + fabpool_free (256 B, the hot path); the pair on one
 * stream (256 B and 16 MiB: a block freed on a stream comes back to it, no
 * driver call); cuMemAllocAsync + cuMemFreeAsync on one stream (256 B, the
 * driver's default pool as it is); and 64 KiB allocated on s2 and freed on
 * s1 (every allocation misses s2's lists: one event recorded on s1 and
 * queried per pair, so this is the cost of a cross-stream reuse).  The driver is the one fabpool loads (FABPOOL_CUDA_LIBRARY or
 * libcuda.so.1); the figures only mean something on a real GPU. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../lib/base/json.h"
#include "cli.h"
#include "fabpool.h"

#define ROUNDS 7

static const char usage_line[] = "usage: fabpool_bench_stream [--pairs N] [--json FILE]\n";

static void help(void)
{
    printf("%s\n"
           "The cost of the stream-ordered pair (fabpool_alloc_on_stream / fabpool_free_on_stream) beside\n"
           "fabpool's hot path and cuMemAllocAsync: ns per alloc + free pair, the median of %d rounds.  The\n"
           "driver is the one fabpool loads (FABPOOL_CUDA_LIBRARY or libcuda.so.1); times mean something only\n"
           "on a GPU.\n\n"
           "  --pairs N    pairs per round (default 200000; a bare number says the same)\n"
           "  --json FILE  the figures as one JSON object into FILE\n"
           "  --help       this text\n\n"
           "Exit status: 0; 1 if the pool, the driver or the JSON file could not be had; 2 for a wrong command\n"
           "line.\n",
           usage_line, ROUNDS);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef int (*pair_fn)(void *ctx);

static double median_ns(pair_fn f, void *ctx, long n)
{
    double v[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        if (f(ctx) != 0) /* warm-up, and a check that the case works */
            return -1;
        double t0 = now();
        for (long i = 0; i < n; i++)
            if (f(ctx) != 0)
                return -1;
        v[r] = (now() - t0) / (double)n;
    }
    qsort(v, ROUNDS, sizeof v[0], cmp);
    return v[ROUNDS / 2];
}

typedef struct {
    fabpool_t *p;
    CUstream s1, s2;
    size_t size;
} ctx_t;

static int plain(void *c_)
{
    ctx_t *c = c_;
    void *x;
    return fabpool_alloc(c->p, c->size, &x) || fabpool_free(c->p, x);
}

static int same_stream(void *c_)
{
    ctx_t *c = c_;
    void *x;
    return fabpool_alloc_on_stream(c->p, c->size, c->s1, &x) || fabpool_free_on_stream(c->p, x, c->s1);
}

static int ping_pong(void *c_)
{
    ctx_t *c = c_;
    void *x;
    /* wanted on s2, freed on s1: every allocation misses s2's own lists, records an event on s1 and polls */
    return fabpool_alloc_on_stream(c->p, c->size, c->s2, &x) || fabpool_free_on_stream(c->p, x, c->s1);
}

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
static alloc_async_fn alloc_async;
static free_async_fn free_async;

static int async_pair(void *c_)
{
    ctx_t *c = c_;
    CUdeviceptr d;
    return alloc_async(&d, c->size, c->s1) != CUDA_SUCCESS || free_async(d, c->s1) != CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
    uint64_t pairs = 200000;
    const char *json = NULL, *me = "fabpool_bench_stream";
    static const struct option opts[] = {{"pairs", required_argument, NULL, 'n'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'}, {0}};
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        if (c == 'n' && cli_u64(me, "--pairs", optarg, 10, UINT32_MAX, &pairs) == 0)
            continue;
        if (c == 'j') {
            json = optarg;
            continue;
        }
        if (c == 'h') {
            help();
            return CLI_OK;
        }
        return cli_usage_error(usage_line);
    }
    if (optind < argc && (optind + 1 < argc || cli_u64(me, "pairs", argv[optind], 10, UINT32_MAX, &pairs) != 0))
        return cli_usage_error(usage_line);
    long n = (long)pairs;
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_NONE;
    ctx_t c = {0};
    if (fabpool_create(&o, &c.p) != FABPOOL_OK) {
        fprintf(stderr, "fabpool_bench_stream: %s\n", fabpool_last_error());
        return 1;
    }
    /* the driver fabpool loaded, for streams and the driver's own allocator */
    const char *lib = getenv("FABPOOL_CUDA_LIBRARY");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    CUresult (*ctx_retain)(CUcontext *, CUdevice) = h ? (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain") : NULL;
    CUresult (*ctx_set)(CUcontext) = h ? (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent") : NULL;
    CUresult (*stream_create)(CUstream *, unsigned) = h ? (CUresult(*)(CUstream *, unsigned))dlsym(h, "cuStreamCreate") : NULL;
    CUresult (*ctx_sync)(void) = h ? (CUresult(*)(void))dlsym(h, "cuCtxSynchronize") : NULL;
    CUcontext ctx;
    if (!ctx_retain || !ctx_set || !stream_create || ctx_retain(&ctx, 0) != CUDA_SUCCESS || ctx_set(ctx) != CUDA_SUCCESS ||
        stream_create(&c.s1, 0) != CUDA_SUCCESS || stream_create(&c.s2, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "fabpool_bench_stream: no driver, context or streams\n");
        return 1;
    }
    alloc_async = (alloc_async_fn)dlsym(h, "cuMemAllocAsync");
    free_async = (free_async_fn)dlsym(h, "cuMemFreeAsync");

    struct {
        const char *name;
        pair_fn f;
        size_t size;
        long n;
        double ns;
    } cases[] = {
        {"fabpool_alloc + fabpool_free, 256 B", plain, 256, n, 0},
        {"alloc_on_stream + free_on_stream, same stream, 256 B", same_stream, 256, n, 0},
        {"alloc_on_stream + free_on_stream, same stream, 16 MiB", same_stream, 16u << 20, n, 0},
        {"cuMemAllocAsync + cuMemFreeAsync, same stream, 256 B", async_pair, 256, n, 0},
        {"allocated on s2, freed on s1, 64 KiB (an event each)", ping_pong, 64u << 10, n / 10, 0},
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    printf("fabpool_bench_stream: %ld pairs a round, median of %d rounds\n", n, ROUNDS);
    for (int i = 0; i < nc; i++) {
        c.size = cases[i].size;
        if (cases[i].f == async_pair && (!alloc_async || !free_async)) {
            cases[i].ns = -1;
        } else {
            cases[i].ns = median_ns(cases[i].f, &c, cases[i].n);
            if (ctx_sync)
                ctx_sync();
        }
        if (cases[i].ns < 0)
            printf("  %-58s  n/a (%s)\n", cases[i].name, fabpool_last_error());
        else
            printf("  %-58s %10.1f ns\n", cases[i].name, cases[i].ns);
    }
    fabpool_counters k = {.struct_size = sizeof k};
    fabpool_get_counters(c.p, &k);
    printf("  pool: %llu frees on streams, %llu same-stream reuses, %llu after an event, %llu events recorded, "
           "%llu queries, %llu context syncs\n", (unsigned long long)k.stream_frees,
           (unsigned long long)k.stream_reuse_same, (unsigned long long)k.stream_reuse_after_event,
           (unsigned long long)k.stream_events_recorded, (unsigned long long)k.stream_event_queries,
           (unsigned long long)k.stream_syncs);
    int json_failed = 0;
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"pairs_per_round\":%ld,\"cases\":[", n);
            for (int i = 0; i < nc; i++) {
                fprintf(f, "%s{\"name\":", i ? "," : "");
                fp_json_str(f, cases[i].name);
                fprintf(f, ",\"ns\":");
                fp_json_double(f, cases[i].ns < 0 ? NAN : cases[i].ns, 1); /* n/a: null */
                fprintf(f, "}");
            }
            fprintf(f, "]}\n");
            json_failed = fclose(f) != 0;
        }
        if (!f || json_failed) {
            fprintf(stderr, "fabpool_bench_stream: cannot write %s\n", json);
            json_failed = 1;
        }
    }
    fabpool_status st = fabpool_collect(c.p, 1);
    if (st == FABPOOL_OK)
        st = fabpool_destroy(c.p);
    if (st != FABPOOL_OK)
        fprintf(stderr, "fabpool_bench_stream: %s\n", fabpool_last_error());
    return st == FABPOOL_OK && !json_failed ? CLI_OK : CLI_FAILED;
}
