/* medloop.c - medium blocks alone: fabpool_bench's uniform 1 B..64 KiB shape
 * (perf/shapes.h: up to 10,000 live, 40,000 operations, seed 7) replayed
 * against the libfabpool.so it is given, so that one binary runs every
 * tree's library in turns (as hotloop.c does for the thread-cache hit).
 * Prints ns an operation: the median over batches of 32 (as the bench
 * times them) and the mean over the whole replay (misses and their maps
 * included), each the least over REPS replays, a fresh pool each.
 * POLLUTE bytes of host memory are written between batches, untimed (the
 * bench reads the device's memory use there, which leaves the caches cold).
 *   medloop LIBFABPOOL.so [REPS [POLLUTE]]
 * Build: gcc -O2 -Iinclude -Iperf perf/h200/medloop.c perf/shapes.c -o /tmp/medloop -ldl -lm */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabpool.h"
#include "shapes.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--help")) {
        printf("usage: medloop LIBFABPOOL.so [REPS [POLLUTE]]\n"
               "ns an operation of fabpool_bench's uniform 1 B..64 KiB shape against that library: the median\n"
               "over batches of 32 and the whole replay's mean, the least over REPS (3) replays; POLLUTE (0)\n"
               "bytes written between batches.  Exit status: 0; 1 if the library or a call failed; 2 for a\n"
               "wrong command line.\n");
        return 0;
    }
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: medloop LIBFABPOOL.so [REPS [POLLUTE]]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "medloop: %s\n", dlerror());
        return 1;
    }
    fabpool_status (*create)(const fabpool_options *, fabpool_t **) =
        (fabpool_status(*)(const fabpool_options *, fabpool_t **))dlsym(lib, "fabpool_create");
    fabpool_status (*destroy)(fabpool_t *) = (fabpool_status(*)(fabpool_t *))dlsym(lib, "fabpool_destroy");
    fabpool_status (*alloc)(fabpool_t *, size_t, void **) =
        (fabpool_status(*)(fabpool_t *, size_t, void **))dlsym(lib, "fabpool_alloc");
    fabpool_status (*release)(fabpool_t *, void *) = (fabpool_status(*)(fabpool_t *, void *))dlsym(lib, "fabpool_free");
    const char *(*last_error)(void) = (const char *(*)(void))dlsym(lib, "fabpool_last_error");
    if (!create || !destroy || !alloc || !release || !last_error) {
        fprintf(stderr, "medloop: %s lacks fabpool_create/destroy/alloc/free/last_error\n", argv[1]);
        return 1;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    size_t pollute = argc > 3 ? strtoull(argv[3], NULL, 0) : 0;
    volatile unsigned char *junk = pollute ? calloc(1, pollute) : NULL;
    shape s = {.kind = SHAPE_UNIFORM, .seed = 7, .n_live = 10000, .n_ops = 40000, .max_size = 65536};
    void **live = calloc((size_t)shape_max_live(&s), sizeof *live);
    long nb = shape_ops(&s) / 32 + 2;
    double *v = malloc((size_t)nb * sizeof *v), best_med = 1e30, best_mean = 1e30;
    if (!live || !v || (pollute && !junk)) {
        fprintf(stderr, "medloop: no host memory\n");
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        fabpool_t *p = NULL;
        if (create(NULL, &p) != FABPOOL_OK) {
            fprintf(stderr, "medloop: %s\n", last_error());
            return 1;
        }
        shape_run sr;
        if (shape_start(&sr, &s) != 0) {
            fprintf(stderr, "medloop: no host memory for the shape\n");
            return 1;
        }
        int nlive = 0, nv = 0, j = 0, k;
        long done = 0;
        uint64_t size = 0;
        double total = 0;
        do {
            double t0 = now_ns();
            for (k = 0; k < 32 && shape_next(&sr, &size, &j); k++, done++) {
                fabpool_status st = size ? alloc(p, (size_t)size, &live[nlive++]) : release(p, live[j]);
                if (st != FABPOOL_OK) {
                    fprintf(stderr, "medloop: %s\n", last_error());
                    return 1;
                }
                if (!size)
                    live[j] = live[--nlive];
            }
            double dt = now_ns() - t0;
            total += dt;
            if (k)
                v[nv++] = dt / k;
            for (size_t q = 0; q < pollute; q += 64)
                junk[q]++;
        } while (k);
        qsort(v, (size_t)nv, sizeof *v, cmp_d);
        if (v[nv / 2] < best_med)
            best_med = v[nv / 2];
        if (total / (double)done < best_mean)
            best_mean = total / (double)done;
        for (int i = 0; i < nlive; i++)
            release(p, live[i]);
        destroy(p);
    }
    printf("median %.1f mean %.1f\n", best_med, best_mean);
    return 0;
}
