/* test_sampler: libfabpool_sampler.so (perf/train/sampler.c) sees memory a
 * pool maps while it runs: the least free memory it saw is at least 64 MiB
 * below its baseline; refused twice; stop without start refused; what the
 * samples cost (cuMemGetInfo timed) is reported. */
#include <time.h>

#include "testutil.h"

int main(int argc, char **argv)
{
    t_driver_init();
    void *l = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
    CHECK(l != NULL);
    if (!l)
        return t_done("test_sampler");
    int (*start)(int, unsigned);
    int (*stop)(uint64_t *, uint64_t *, uint64_t *);
    uint64_t (*count)(void);
    *(void **)&start = dlsym(l, "fabpool_sampler_start");
    *(void **)&stop = dlsym(l, "fabpool_sampler_stop");
    *(void **)&count = dlsym(l, "fabpool_sampler_count");
    CHECK(start && stop && count);
    if (!start || !stop || !count)
        return t_done("test_sampler");
    uint64_t base = 0, least = 0, n = 0;
    CHECK(stop(&base, &least, &n) == -1); /* not running */
    CHECK(start(0, 200) == 0);
    CHECK(start(0, 200) == -1);           /* one at a time */
    fabpool_t *p = t_pool("handle_type:none");
    void *x = NULL;
    CHECK_OK(fabpool_alloc(p, 64u << 20, &x));
    uint64_t c0 = count();
    for (int i = 0; i < 100000 && count() < c0 + 3; i++) /* at least two samples while x is mapped */
        nanosleep(&(struct timespec){0, 100000L}, NULL);
    CHECK(count() >= c0 + 3);
    CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_destroy(p));
    CHECK(stop(&base, &least, &n) == 0);
    CHECK(n >= 3 && base >= least + (64u << 20));
    printf("sampler: %llu samples, baseline %llu MiB free, least %llu MiB\n", (unsigned long long)n,
           (unsigned long long)(base >> 20), (unsigned long long)(least >> 20));
    CHECK(count() == 0);
    int (*cost)(uint64_t *, uint64_t *);
    *(void **)&cost = dlsym(l, "fabpool_sampler_cost");
    uint64_t tot = 0, most = 0;
    CHECK(cost && cost(&tot, &most) == 0);
    CHECK(most > 0 && most <= tot); /* every sample took some time, none more than all of them */
    printf("sampler: cuMemGetInfo %.2f us a sample, %.2f us at most\n", tot / 1e3 / (double)(n > 1 ? n - 1 : 1),
           most / 1e3);
    return t_done("test_sampler");
}
