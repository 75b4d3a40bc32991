/* hotloop.c - the thread-cache hit alone: fabpool_alloc + fabpool_free of one
 * size in a tight loop, ns a pair (the minimum over REPS runs of N pairs).
 * Loads the libfabpool.so it is given (so that one binary runs every tree's
 * library: hotloop.sh, in turns), so that a change to the hot path shows apart
 * from fabpool_bench's batches and other allocators.
 *   hotloop LIBFABPOOL.so [SIZE [PAIRS [REPS]]] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabpool.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--help")) {
        printf("usage: hotloop LIBFABPOOL.so [SIZE [PAIRS [REPS]]]\n"
               "ns an alloc + free of SIZE bytes (256) from that library's thread cache: the least over REPS (5)\n"
               "runs of PAIRS (10,000,000) pairs.  Exit status: 0; 1 if the library or a call failed; 2 for a\n"
               "wrong command line.\n");
        return 0;
    }
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: hotloop LIBFABPOOL.so [SIZE [PAIRS [REPS]]]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "hotloop: %s\n", dlerror());
        return 1;
    }
    fabpool_status (*create)(const fabpool_options *, fabpool_t **) = (fabpool_status(*)(const fabpool_options *, fabpool_t **))dlsym(lib, "fabpool_create");
    fabpool_status (*alloc)(fabpool_t *, size_t, void **) = (fabpool_status(*)(fabpool_t *, size_t, void **))dlsym(lib, "fabpool_alloc");
    fabpool_status (*release)(fabpool_t *, void *) = (fabpool_status(*)(fabpool_t *, void *))dlsym(lib, "fabpool_free");
    const char *(*last_error)(void) = (const char *(*)(void))dlsym(lib, "fabpool_last_error");
    if (!create || !alloc || !release || !last_error) {
        fprintf(stderr, "hotloop: %s lacks fabpool_create/alloc/free/last_error\n", argv[1]);
        return 1;
    }
    size_t size = argc > 2 ? strtoull(argv[2], NULL, 0) : 256;
    long n = argc > 3 ? atol(argv[3]) : 10000000L;
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    fabpool_t *p = NULL;
    if (create(NULL, &p) != FABPOOL_OK) {
        fprintf(stderr, "hotloop: %s\n", last_error());
        return 1;
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        void *x = NULL;
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (alloc(p, size, &x) != FABPOOL_OK || release(p, x) != FABPOOL_OK) {
                fprintf(stderr, "hotloop: %s\n", last_error());
                return 1;
            }
        }
        double ns = (now_ns() - t0) / (double)n;
        if (ns < best)
            best = ns;
    }
    printf("%.2f\n", best);
    return 0;   /* the pool goes with the process */
}
