/* fabpool_demo: replays a variable-length dispatch-buffer trace and prints
 * what the pool did.  Runs on the real driver where a GPU is, else on the
 * simulated driver built beside it.
 *
 *   fabpool_demo [--steps N] [--seed N]   (--help says more; bare numbers are steps, then seed)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../perf/cli.h"
#include "fabpool.h"

#ifndef FABPOOL_SIM_PATH
#define FABPOOL_SIM_PATH ""
#endif

typedef int (*init_fn)(unsigned);
typedef int (*count_fn)(int *);
typedef int (*meminfo_fn)(size_t *, size_t *);
typedef int (*ctx_retain_fn)(void **, int);
typedef int (*ctx_set_fn)(void *);

/* The real driver if it loads and sees a device, else the simulated one. */
static const char *pick_driver(int *real)
{
    const char *forced = getenv("FABPOOL_CUDA_LIBRARY");
    if (forced && *forced) {
        *real = strstr(forced, "/sim/") == NULL;
        return forced;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        init_fn init = (init_fn)dlsym(lib, "cuInit");
        count_fn count = (count_fn)dlsym(lib, "cuDeviceGetCount");
        int n = 0;
        if (init && count && init(0) == 0 && count(&n) == 0 && n > 0 && !dlsym(lib, "fabsim_get_ledger")) {
            *real = 1;
            return "libcuda.so.1";
        }
    }
    *real = 0;
    setenv("FABPOOL_CUDA_LIBRARY", FABPOOL_SIM_PATH, 1);
    return FABPOOL_SIM_PATH;
}

/* What the driver itself says is in use on device 0, in bytes. */
static long long driver_used(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return -1;
    ctx_retain_fn retain = (ctx_retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    ctx_set_fn set = (ctx_set_fn)dlsym(lib, "cuCtxSetCurrent");
    meminfo_fn info = (meminfo_fn)dlsym(lib, "cuMemGetInfo_v2");
    void *ctx = NULL;
    size_t f = 0, t = 0;
    if (!retain || !set || !info || retain(&ctx, 0) != 0 || set(ctx) != 0 || info(&f, &t) != 0)
        return -1;
    return (long long)(t - f);
}

static uint64_t rng;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#define NBUF 6
#define MiB (1024.0 * 1024.0)

static const char usage_line[] = "usage: fabpool_demo [--steps N] [--seed N]\n";

static void help(void)
{
    printf("%s\n"
           "Replays a variable-length dispatch-buffer trace (six HybridEP-like buffers sized from a token count\n"
           "that rises and falls) and prints what the pool did: chunks mapped and unmapped, driver calls, peak\n"
           "mapped over live bytes, base-address changes, and what the driver holds at the end.  Uses the real\n"
           "driver where a GPU is, else the simulated one built beside it (FABPOOL_CUDA_LIBRARY chooses).\n\n"
           "  --steps N   resize steps, 1 to 100000000 (default 2000)\n"
           "  --seed N    the token counts' random seed, 1 and up (default 42)\n"
           "  --help      this text\n\n"
           "Exit status: 0; 1 if the pool or a buffer fails; 2 for a wrong command line.\n",
           usage_line);
}

int main(int argc, char **argv)
{
    uint64_t steps_arg = 2000, seed = 42;
    static const struct option opts[] = {{"steps", required_argument, NULL, 's'}, {"seed", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'}, {0}};
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        if (c == 's' && cli_u64("fabpool_demo", "--steps", optarg, 1, 100000000, &steps_arg) == 0)
            continue;
        if (c == 'r' && cli_u64("fabpool_demo", "--seed", optarg, 1, UINT64_MAX, &seed) == 0)
            continue;
        if (c == 'h') {
            help();
            return CLI_OK;
        }
        return cli_usage_error(usage_line);
    }
    if (argc - optind > 2 ||
        (optind < argc && cli_u64("fabpool_demo", "steps", argv[optind], 1, 100000000, &steps_arg) != 0) ||
        (optind + 1 < argc && cli_u64("fabpool_demo", "seed", argv[optind + 1], 1, UINT64_MAX, &seed) != 0))
        return cli_usage_error(usage_line);
    long steps = (long)steps_arg;
    rng = seed;
    int real = 0;
    const char *path = pick_driver(&real);
    printf("fabpool demo: %s driver (%s)\n", real ? "the real" : "the simulated", path);

    fabpool_t *pool;
    fabpool_status st = fabpool_create(NULL, &pool);
    if (st != FABPOOL_OK) {
        fprintf(stderr, "fabpool_create: %s: %s\n", fabpool_status_name(st), fabpool_last_error());
        return 1;
    }
    long long used0 = driver_used(path);

    /* HybridEP-like: six buffers sized from one token count (hidden 7168, bf16) */
    const char *names[NBUF] = {"dispatch x", "dispatch x fp8", "probs", "combine x", "routing map", "counters"};
    const uint64_t per_token[NBUF] = {14336, 7168 + 224, 256, 14336, 256, 8};
    const uint64_t max_tokens = 16384;
    fabpool_buffer_t *b[NBUF];
    uint64_t tokens = 1024;
    for (int i = 0; i < NBUF; i++) {
        st = fabpool_buffer_create(pool, max_tokens * per_token[i], tokens * per_token[i], &b[i]);
        if (st != FABPOOL_OK) {
            fprintf(stderr, "fabpool_buffer_create(%s): %s\n", names[i], fabpool_last_error());
            return 1;
        }
    }
    void *base0 = fabpool_buffer_ptr(b[0]);
    uint64_t peak_tokens = tokens, peak_live = 0;
    long moved = 0;
    for (long s = 0; s < steps; s++) {
        if (next_rand() % 40 == 0)
            tokens = 256 + next_rand() % (max_tokens - 256);
        else {
            long t = (long)tokens + (long)(next_rand() % 1025) - 512;
            tokens = (uint64_t)(t < 256 ? 256 : t > (long)max_tokens ? (long)max_tokens : t);
        }
        size_t sizes[NBUF];
        uint64_t live = 0;
        for (int i = 0; i < NBUF; i++)
            live += sizes[i] = tokens * per_token[i];
        st = fabpool_buffer_resize_set(b, sizes, NBUF, NULL);
        if (st != FABPOOL_OK) {
            fprintf(stderr, "step %ld: resize: %s\n", s, fabpool_last_error());
            return 1;
        }
        moved += fabpool_buffer_ptr(b[0]) != base0;
        if (tokens > peak_tokens)
            peak_tokens = tokens;
        if (live > peak_live)
            peak_live = live;
    }
    fabpool_stats ps = {.struct_size = sizeof ps};
    fabpool_get_stats(pool, &ps);
    unsigned long long calls = 0;
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && ps.driver_call_names[i]; i++)
        calls += ps.driver_calls[i];
    printf("steps:                 %ld (token count 256..%llu, peak %llu)\n", steps,
           (unsigned long long)max_tokens, (unsigned long long)peak_tokens);
    printf("chunks mapped:         %llu, unmapped: %llu, mapped now: %llu\n",
           (unsigned long long)ps.chunks_mapped_total, (unsigned long long)ps.chunks_unmapped_total,
           (unsigned long long)ps.chunks_mapped);
    printf("driver calls:          %llu in all (%.2f a step)\n", calls, (double)calls / (double)steps);
    printf("peak mapped / live:    %.1f MiB / %.1f MiB (%.2fx)\n", (double)ps.mapped_bytes_peak / MiB,
           (double)peak_live / MiB, (double)ps.mapped_bytes_peak / (double)peak_live);
    printf("base address changes:  %ld\n", moved);
    for (int i = 0; i < NBUF; i++)
        fabpool_buffer_destroy(b[i], NULL);
    fabpool_get_stats(pool, &ps);
    printf("after the buffers:     the pool maps %llu bytes, holds %llu handles\n",
           (unsigned long long)ps.mapped_bytes, (unsigned long long)ps.handles_outstanding);
    fabpool_destroy(pool);
    long long used1 = driver_used(path);
    if (used0 >= 0 && used1 >= 0)
        printf("driver's used memory:  %.1f MiB before the trace's buffers, %.1f MiB after destroy\n",
               (double)used0 / MiB, (double)used1 / MiB);
    return 0;
}
