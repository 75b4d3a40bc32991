/* test_sleep_race: a pool that sleeps answers every allocation with FABPOOL_ERR_ASLEEP, whatever another thread
 * does meanwhile that the API allows beside a sleep.  A thread calls fabpool_trim (which allocates nothing but asks
 * every thread cache to flush and gives the pool's caches a new key) without pause while the main thread sleeps
 * the pool, frees a small block into its cache, allocates one of the same size and wakes the pool, again and
 * again for a bounded time.  A key drawn from a state read before the sleep and stored after it turned the caches
 * off reopened them: the free installed it and the allocation came from the cache, FABPOOL_OK and a block in
 * unmapped memory.  The window is a few instructions wide, so the test runs many cycles (one trimmer: 1 to 35 in
 * 100,000 cycles hit it on a 2-core machine, every run; two trimmers hit it less often) and also checks that every block it was given is mapped and nothing is left after the
 * destroy.  Needs the simulated driver for the ledger; on a real device the statuses alone are checked. */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

enum { TRIMMERS = 1 };

static fabpool_t *P;
static _Atomic int stop;
static int sim;
static t_sim_hooks hooks;

static void *trimmer(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(t_ctx);
    while (!atomic_load(&stop))
        (void)fabpool_trim(P, SIZE_MAX); /* keeps everything: only the flush request and the new key */
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Cycles of sleep, free, allocate, wake for `seconds` (at most max_cycles) with the trimmers running; the
 * number of allocations served while the pool slept. */
static long sleep_beside_trims(const char *conf, double seconds, long max_cycles)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK_OK(fabpool_options_parse(&o, conf));
    o.reserve_bytes = 1ull << 30;
    CHECK_OK(fabpool_create(&o, &P));
    if (!P)
        return 0;
    void *keep = NULL;
    CHECK_OK(fabpool_alloc(P, 256, &keep)); /* a slab of the class stays mapped */
    atomic_store(&stop, 0);
    pthread_t th[TRIMMERS];
    for (int i = 0; i < TRIMMERS; i++)
        pthread_create(&th[i], NULL, trimmer, NULL);
    long served = 0, cycles = 0;
    double end = now_s() + seconds;
    for (; cycles < max_cycles && (cycles & 255 || now_s() < end); cycles++) {
        void *x = NULL, *y = NULL;
        if (fabpool_alloc(P, 256, &x) != FABPOOL_OK) {
            CHECK(!"an allocation of the awake pool failed");
            break;
        }
        fabpool_status st = fabpool_sleep(P, FABPOOL_SLEEP_DISCARD, NULL);
        if (st != FABPOOL_OK) {
            CHECK_OK(st);
            fabpool_free(P, x);
            break;
        }
        if (fabpool_free(P, x) != FABPOOL_OK) /* frees work while asleep: into the thread's cache */
            CHECK(!"a free while asleep failed");
        st = fabpool_alloc(P, 256, &y);
        if (st != FABPOOL_ERR_ASLEEP) {
            served++;
            fprintf(stderr, "cycle %ld: fabpool_alloc while asleep -> %s, block %p mapped: %d\n", cycles,
                    fabpool_status_name(st), y, st == FABPOOL_OK && hooks.range_mapped ? hooks.range_mapped(y, 256) : -1);
            if (st == FABPOOL_OK)
                fabpool_free(P, y);
        }
        CHECK_OK(fabpool_wake(P, NULL));
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < TRIMMERS; i++)
        pthread_join(th[i], NULL);
    CHECK_OK(fabpool_free(P, keep));
    CHECK_OK(fabpool_check(P));
    CHECK_OK(fabpool_destroy(P));
    P = NULL;
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.mappings == l0.mappings && l.reservations == l0.reservations && l.handles == l0.handles);
    }
    printf("test_sleep_race: %s: %ld cycles, %ld allocations served asleep\n", conf, cycles, served);
    return served;
}

int main(void)
{
    sim = t_driver_init();
    hooks = t_sim_hooks_get();
    CHECK(sleep_beside_trims("handle_type:none", 3.0, 400000) == 0);
    /* the medium blocks' caches too: their decay draws a new key from any thread's slow path */
    CHECK(sleep_beside_trims("handle_type:none,decay_ms:1", 1.0, 100000) == 0);
    return t_done("test_sleep_race");
}
