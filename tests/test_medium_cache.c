/* test_medium_cache: blocks above slab_max up to 64 KiB through the calling
 * thread's cache.  A freed block of such a size comes back to the next
 * allocation of its size; a double free of a cached block is refused, from
 * its own thread and from another, and so are pointers into it; an aligned
 * allocation never takes a cached block; and the cache gives its blocks
 * back at a trim, a thread flush, a thread's exit, sleep, the decay and an
 * out-of-memory retry, so that what it holds is never lost to the pool.
 * White-box: it includes lib/pool.h to read what the calling thread's
 * cache holds. */
#include "testutil.h"

#include <pthread.h>
#include <unistd.h>

#include "pool.h"

#define KB (1ull << 10)
#define MB (1ull << 20)

static fabpool_t *pool;

/* The bytes of medium blocks the calling thread's cache of p holds. */
/* What they hold back (tcache.h, mdef): freed while their bins rest, given back at the next allocation. */
static uint64_t my_held_back(fabpool_t *p)
{
    uint64_t n = 0;
    fp_lock(&p->sp.lock);
    for (fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next)
        if (fp_tcache_mine(&p->alloc, tc))
            for (unsigned i = 0; i < tc->mdn; i++)
                n += fp_tcache_defer_bytes(&p->alloc, tc->mdef[i]);
    fp_unlock(&p->sp.lock);
    return n;
}

static uint64_t my_cached(fabpool_t *p)
{
    uint64_t n = 0;
    fp_lock(&p->sp.lock);
    for (fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next)
        if (fp_tcache_mine(&p->alloc, tc))
            n += atomic_load(&tc->mbytes);
    fp_unlock(&p->sp.lock);
    return n;
}

/* The bytes of medium blocks the other threads' caches of p hold (they count them in atomics). */
static uint64_t others_cached(fabpool_t *p)
{
    uint64_t n = 0;
    fp_lock(&p->sp.lock);
    for (fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next)
        if (!fp_tcache_mine(&p->alloc, tc))
            n += atomic_load(&tc->mbytes);
    fp_unlock(&p->sp.lock);
    return n;
}

static void reuse_of_the_same_size(void)
{
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(pool, 16 * KB, &a));
    fabpool_stats s0 = t_stats(pool);
    t_put_tag(a, 16 * KB, 7);
    CHECK_OK(fabpool_free(pool, a));
    CHECK(my_cached(pool) == 16 * KB);
    /* a cached block is free to its caller: not in use, not counted as a live block of its class */
    fabpool_stats s1 = t_stats(pool);
    CHECK(s1.in_use_bytes + 16 * KB == s0.in_use_bytes);
    CHECK(s1.blocks + 1 == s0.blocks);
    CHECK_OK(fabpool_alloc(pool, 16 * KB - 100, &b)); /* the same quanta: the same block */
    CHECK(b == a);
    CHECK(my_cached(pool) == 0);
    CHECK(t_tag_ok(b, 16 * KB, 7)); /* its memory as it was: nothing moved */
    fabpool_stats s2 = t_stats(pool);
    CHECK(s2.in_use_bytes == s0.in_use_bytes);
    CHECK_OK(fabpool_free(pool, b));
    CHECK_OK(fabpool_check(pool));
}

static void *free_from_another_thread(void *ptr)
{
    fabpool_status st = fabpool_free(pool, ptr);
    return (void *)(intptr_t)st;
}

static void double_frees_and_strays(void)
{
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(pool, 20 * KB, &a));
    CHECK_OK(fabpool_alloc(pool, 20 * KB, &b));
    /* pointers into a live block, the first inside its first quantum */
    CHECK_STATUS(fabpool_free(pool, (char *)a + 8), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_free(pool, (char *)a + 256), FABPOOL_ERR_NOT_FOUND);
    uint64_t c0 = my_cached(pool);
    CHECK_OK(fabpool_free(pool, a));
    CHECK(my_cached(pool) == c0 + 20 * KB);
    /* the cached block: freed again here, from another thread, on a stream, and pointers into it */
    CHECK_STATUS(fabpool_free(pool, a), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(strstr(fabpool_last_error(), "double free") != NULL);
    pthread_t t;
    void *ret = NULL;
    CHECK(pthread_create(&t, NULL, free_from_another_thread, a) == 0);
    CHECK(pthread_join(t, &ret) == 0);
    CHECK((fabpool_status)(intptr_t)ret == FABPOOL_ERR_DOUBLE_FREE);
    CUstream stream;
    CHECK_CU(cuStreamCreate(&stream, 0));
    CHECK_STATUS(fabpool_free_on_stream(pool, a, stream), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_STATUS(fabpool_free(pool, (char *)a + 8), FABPOOL_ERR_NOT_FOUND);
    size_t usable = 0;
    CHECK_STATUS(fabpool_usable_size(pool, a, &usable), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_record_stream(pool, a, stream), FABPOOL_ERR_NOT_FOUND);
    CHECK(my_cached(pool) == c0 + 20 * KB); /* the refusals changed nothing */
    CHECK_OK(fabpool_check(pool));
    /* and the block is still whole: it comes back once, and b is untouched */
    void *c = NULL, *d = NULL;
    CHECK_OK(fabpool_alloc(pool, 20 * KB, &c));
    CHECK(c == a);
    CHECK_OK(fabpool_alloc(pool, 20 * KB, &d));
    CHECK(d != a && d != b);
    CHECK_OK(fabpool_free(pool, c));
    CHECK_OK(fabpool_free(pool, d));
    CHECK_OK(fabpool_free(pool, b));
    /* after the cache gave it back, a double free still is one */
    CHECK_OK(fabpool_thread_flush(pool));
    CHECK(my_cached(pool) == 0);
    CHECK_STATUS(fabpool_free(pool, a), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_OK(fabpool_check(pool));
}

/* fabpool_alloc_aligned's block is aligned whatever the cache holds of its size */
static void aligned_never_cached(void)
{
    enum { N = 8 };
    void *a[N];
    for (int i = 0; i < N; i++)
        CHECK_OK(fabpool_alloc(pool, 12 * KB, &a[i]));
    for (int i = 0; i < N; i++)
        CHECK_OK(fabpool_free(pool, a[i]));
    CHECK(my_cached(pool) > 0);
    for (int i = 0; i < N; i++) {
        CHECK_OK(fabpool_alloc_aligned(pool, 12 * KB, 64 * KB, &a[i]));
        CHECK(((uintptr_t)a[i] & (64 * KB - 1)) == 0);
    }
    for (int i = 0; i < N; i++)
        CHECK_OK(fabpool_free(pool, a[i]));
    CHECK_OK(fabpool_thread_flush(pool));
    CHECK_OK(fabpool_check(pool));
}

/* Medium blocks of sizes that repeat allocated and freed: some stay in the calling thread's cache. */
static void churn(fabpool_t *p)
{
    void *a[16];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 16; i++)
            CHECK_OK(fabpool_alloc(p, (size_t)(2 + i % 4) * 4 * KB + 100, &a[i]));
        for (int i = 0; i < 16; i++)
            CHECK_OK(fabpool_free(p, a[i]));
    }
}

/* Sizes that never repeat: the cache stops taking medium blocks, gives back what it holds, and takes them
 * again after a rest. */
static void sizes_that_never_repeat(void)
{
    churn(pool);
    CHECK(my_cached(pool) > 0);
    int stopped = 0;
    for (int i = 0; i < 200 && !stopped; i++) {
        void *x = NULL;
        CHECK_OK(fabpool_alloc(pool, 4 * KB + 256 + (size_t)(i % 200) * 256, &x));
        CHECK_OK(fabpool_free(pool, x));
        stopped = my_cached(pool) == my_held_back(pool);
    }
    CHECK(stopped);
    /* while it rests, a free is held back until the thread's next allocation gives it to the arena, and a
     * double free is refused both while it waits and after */
    void *y = NULL, *z = NULL;
    CHECK_OK(fabpool_alloc(pool, 30 * KB, &y));
    CHECK(my_cached(pool) == 0);
    CHECK_OK(fabpool_free(pool, y));
    CHECK(my_cached(pool) == 30 * KB && my_held_back(pool) == 30 * KB);
    CHECK_STATUS(fabpool_free(pool, y), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_OK(fabpool_check(pool));
    CHECK_OK(fabpool_alloc(pool, 20 * KB, &z));
    CHECK(my_cached(pool) == 0);
    if (z != y)   /* (y's range may hold z now) */
        CHECK_STATUS(fabpool_free(pool, y), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_OK(fabpool_free(pool, z));
    int again = 0;
    for (int i = 0; i < (int)(FP_MC_WINDOW * (FP_MC_REST + 2)) && !again; i++) {
        void *x = NULL;
        CHECK_OK(fabpool_alloc(pool, 4 * KB + 256 + (size_t)(i % 200) * 256, &x));
        CHECK_OK(fabpool_free(pool, x));
        again = my_cached(pool) > my_held_back(pool);
    }
    CHECK(again);
    CHECK_OK(fabpool_thread_flush(pool));
    CHECK_OK(fabpool_check(pool));
}

static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;
static int park_stage;

static void park_wait(int stage)
{
    pthread_mutex_lock(&park_mu);
    while (park_stage < stage)
        pthread_cond_wait(&park_cv, &park_mu);
    pthread_mutex_unlock(&park_mu);
}

static void park_set(int stage)
{
    pthread_mutex_lock(&park_mu);
    park_stage = stage;
    pthread_cond_broadcast(&park_cv);
    pthread_mutex_unlock(&park_mu);
}

/* Churns, says so, waits; then allocates once more (its next call) and exits. */
static void *parked(void *arg)
{
    (void)arg;
    churn(pool);
    park_set(1);
    park_wait(2);
    void *x = NULL;
    CHECK_OK(fabpool_alloc(pool, 300, &x)); /* its next call gives its medium blocks back */
    CHECK_OK(fabpool_free(pool, x));
    park_set(3);
    park_wait(4);
    churn(pool); /* and at its exit, what it cached since */
    return NULL;
}

static void given_back_at_trim_flush_and_exit(void)
{
    /* a live block keeps a slab of 300-byte blocks, so that the other thread's call below makes no memory */
    void *keep = NULL;
    CHECK_OK(fabpool_alloc(pool, 300, &keep));
    CHECK_OK(fabpool_trim(pool, 0));
    uint64_t m0 = t_mapped(pool);
    churn(pool);
    CHECK(my_cached(pool) > 0);
    CHECK_OK(fabpool_trim(pool, 0)); /* the caller's own cache at once */
    CHECK(my_cached(pool) == 0);
    CHECK(t_mapped(pool) == m0);
    churn(pool);
    CHECK_OK(fabpool_thread_flush(pool));
    CHECK(my_cached(pool) == 0);
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == m0);

    /* another thread's: at its next call after the trim, and at its exit */
    park_stage = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, parked, NULL) == 0);
    park_wait(1);
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(others_cached(pool) > 0); /* asked to give back, at its next call */
    park_set(2);
    park_wait(3);
    CHECK(others_cached(pool) == 0);
    park_set(4);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(others_cached(pool) == 0 && pool->alloc.tcaches && !pool->alloc.tcaches->next); /* its cache closed */
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == m0);
    CHECK_OK(fabpool_free(pool, keep));
    CHECK_OK(fabpool_check(pool));
}

static void given_back_at_sleep(void)
{
    CHECK_OK(fabpool_trim(pool, 0));
    uint64_t m0 = t_mapped(pool);
    void *live = NULL;
    CHECK_OK(fabpool_alloc(pool, 24 * KB, &live));
    t_put_tag(live, 24 * KB, 11);
    churn(pool);
    CHECK(my_cached(pool) > 0);
    /* sleep flushes the caller's cache under the pool lock (a cache that took the lock again would hang
     * here), so the cached blocks are free memory, not offloaded: the live block alone comes back */
    CHECK_OK(fabpool_sleep(pool, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK(my_cached(pool) == 0);
    CHECK_OK(fabpool_wake(pool, NULL));
    CHECK(t_tag_ok(live, 24 * KB, 11));
    CHECK_OK(fabpool_free(pool, live));
    CHECK_OK(fabpool_trim(pool, 0));
    CHECK(t_mapped(pool) == m0);
    CHECK_OK(fabpool_check(pool));
}

static void given_back_at_decay(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.decay_ms = 40;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    if (!p)
        return;
    churn(p);
    CHECK(my_cached(p) > 0);
    /* the decay is read on slow paths (every 16th block from the arenas): misses of sizes the cache holds
     * none of, until one finds the cache given back */
    uint64_t left = my_cached(p);
    for (int i = 0; i < 200 && left; i++) {
        usleep(10 * 1000);
        void *x = NULL;
        CHECK_OK(fabpool_alloc(p, 5 * KB + (size_t)i * 256, &x));
        left = my_cached(p);
        CHECK_OK(fabpool_free(p, x));
    }
    CHECK(left == 0);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

static void given_back_out_of_memory(void)
{
    size_t free_b = 0, total = 0;
    CHECK_CU(cuMemGetInfo(&free_b, &total));
    void *held = NULL, *big = NULL;
    CHECK_OK(fabpool_alloc(pool, 64 * MB, &held));
    churn(pool);
    CHECK(my_cached(pool) > 0);
    /* more than the device has free, less than it has: out of memory after the caches gave back */
    CHECK_STATUS(fabpool_alloc(pool, total - 32 * MB, &big), FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK(my_cached(pool) == 0);
    CHECK_OK(fabpool_free(pool, held));
    CHECK_OK(fabpool_check(pool));
    CHECK_OK(fabpool_trim(pool, 0));
}

int main(void)
{
    int sim = t_driver_init();
    CHECK_OK(fabpool_create(NULL, &pool));
    if (!pool)
        return t_done("test_medium_cache");
    reuse_of_the_same_size();
    double_frees_and_strays();
    aligned_never_cached();
    given_back_at_trim_flush_and_exit();
    given_back_at_sleep();
    given_back_at_decay();
    given_back_out_of_memory();
    sizes_that_never_repeat();
    CHECK_OK(fabpool_destroy(pool));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
    return t_done("test_medium_cache");
}
