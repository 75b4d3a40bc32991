/* test_sleep: fabpool_sleep / fabpool_wake.
 *   - slabs, large blocks and buffers written with patterns; a sleep with
 *     offload gives every device byte of the pool back (the sim's ledger),
 *     keeps every address; wake brings every byte back at the same pointers;
 *   - discard: the memory comes back, the state says it was discarded;
 *   - two pools as two tags (one offloaded, one discarded) beside one awake;
 *   - while asleep: allocation, buffer create / resize, export and dma-buf
 *     answer FABPOOL_ERR_ASLEEP, frees work, another thread's cache serves
 *     nothing; bad input (NULL, unknown mode, sleep twice, wake without
 *     sleep, an exported buffer with peers) is refused and changes nothing;
 *   - (sim) every driver call of sleep and of wake made to fail, one at a
 *     time: the pool is as before (sleep) or a second wake completes (wake),
 *     the data reads back, and after destroy the driver holds nothing; a
 *     wake's copy back refused with the unmap that would undo it: the next
 *     wake copies it in; every unmap of a sleep refused from a chunk on: an
 *     exact rollback leaves the pool awake with its data, a discard that
 *     dropped contents goes on and answers FABPOOL_ERR_PARTIAL asleep. */
#include <pthread.h>

#include "testutil.h"
#include "pattern.h"

#define MB (1ull << 20)

typedef int (*fault_set_fn)(const char *, uint64_t, int, int);
typedef void (*fault_clear_fn)(void);
typedef uint64_t (*calls_fn)(const char *);
static fault_set_fn fault_set;
static fault_clear_fn fault_clear;
static calls_fn calls;

/* the sim's hooks into the three above (NULL on the real driver) */
static void sim_hooks(void)
{
    t_sim_hooks h = t_sim_hooks_get();
    fault_set = h.fault_set;
    fault_clear = h.fault_clear;
    calls = h.calls;
}
static int sim;

/* ------------------------------------------------------------ patterns */

/* ------------------------------------------------------------ a populated pool */

#define NSMALL 40
#define NLARGE 3
#define NBUF 2

typedef struct world {
    fabpool_t *p;
    void *small[NSMALL];
    size_t small_size[NSMALL];
    void *large[NLARGE];
    size_t large_size[NLARGE];
    fabpool_buffer_t *buf[NBUF];
    void *buf_base[NBUF];
    size_t buf_size[NBUF];
    uint64_t seed;
} world;

/* every block and buffer of w filled with the patterns of seed (w->seed becomes seed) */
static void fill_all(world *w, uint64_t seed)
{
    w->seed = seed;
    for (int i = 0; i < NSMALL; i++)
        if (w->small[i])
            pattern_fill(w->small[i], w->small_size[i], seed + 1 + (uint64_t)i);
    for (int i = 0; i < NLARGE; i++)
        if (w->large[i])
            pattern_fill(w->large[i], w->large_size[i], seed + 100 + (uint64_t)i);
    for (int i = 0; i < NBUF; i++)
        pattern_fill(w->buf_base[i], w->buf_size[i], seed + 200 + (uint64_t)i);
}

/* scale 1: tens of MiB; scale 0: a few chunks (the fault sweep) */
static int populate(world *w, const char *conf, uint64_t seed, int scale)
{
    memset(w, 0, sizeof *w);
    w->seed = seed;
    fabpool_options o;
    fabpool_options_init(&o);
    o.reserve_bytes = 4ull << 30; /* several pools at once, also under valgrind (it limits address space) */
    o.conf = conf;
    if (fabpool_create(&o, &w->p) != FABPOOL_OK)
        return -1;
    static const size_t small_sizes[] = {256, 1000, 4096, 65536, 300000, 3 * MB};
    int nsmall = scale ? NSMALL : 3;
    for (int i = 0; i < nsmall; i++) {
        w->small_size[i] = small_sizes[i % 6] + (size_t)(i / 6) * 512;
        if (fabpool_alloc(w->p, w->small_size[i], &w->small[i]) != FABPOOL_OK)
            return -1;
    }
    static const size_t large_sizes[] = {9 * MB + 4096, 20 * MB, 34 * MB};
    for (int i = 0; i < (scale ? NLARGE : 1); i++) {
        w->large_size[i] = scale ? large_sizes[i] : 1 * MB + 4096; /* scale 0 has slab_max:1MiB */
        if (fabpool_alloc(w->p, w->large_size[i], &w->large[i]) != FABPOOL_OK)
            return -1;
    }
    for (int i = 0; i < NBUF; i++) {
        w->buf_size[i] = scale ? (i ? 24 * MB : 6 * MB) : 2 * MB + 4096;
        if (fabpool_buffer_create(w->p, 256 * MB, w->buf_size[i] / 2, &w->buf[i]) != FABPOOL_OK ||
            fabpool_buffer_resize(w->buf[i], w->buf_size[i], NULL) != FABPOOL_OK) /* two chunks or more */
            return -1;
        w->buf_base[i] = fabpool_buffer_ptr(w->buf[i]);
    }
    /* some cache: freed blocks and a freed large block */
    void *tmp[8];
    for (int i = 0; i < 8; i++)
        if (fabpool_alloc(w->p, 70000, &tmp[i]) != FABPOOL_OK)
            return -1;
    for (int i = 0; i < 8; i++)
        fabpool_free(w->p, tmp[i]);
    void *big = NULL;
    if (scale && fabpool_alloc(w->p, 20 * MB, &big) == FABPOOL_OK)
        fabpool_free(w->p, big);
    fill_all(w, seed);
    return 0;
}

/* every block and buffer reads back its pattern, at the same address */
static int all_intact(world *w)
{
    int ok = 1;
    for (int i = 0; i < NSMALL; i++)
        if (w->small[i] && !pattern_intact(w->small[i], w->small_size[i], w->seed + 1 + (uint64_t)i))
            ok = 0;
    for (int i = 0; i < NLARGE; i++)
        if (w->large[i] && !pattern_intact(w->large[i], w->large_size[i], w->seed + 100 + (uint64_t)i))
            ok = 0;
    for (int i = 0; i < NBUF; i++)
        if (fabpool_buffer_ptr(w->buf[i]) != w->buf_base[i] ||
            !pattern_intact(w->buf_base[i], w->buf_size[i], w->seed + 200 + (uint64_t)i))
            ok = 0;
    return ok;
}

static void teardown(world *w)
{
    if (w->p)
        fabpool_destroy(w->p);
    w->p = NULL;
}

/* Destroys w's pool; on the sim the ledger is back to l0. */
static void teardown_to(world *w, const fabsim_ledger *l0)
{
    teardown(w);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(t_ledger_same(&l, l0));
    }
}

/* ------------------------------------------------------------ offload */

static void offload_round_trip(void)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    CHECK(populate(&w, NULL, 11, 1) == 0);
    if (!w.p)
        return;
    fabpool_stats s0 = {.struct_size = sizeof s0};
    fabpool_get_stats(w.p, &s0);
    CHECK(s0.mapped_bytes > 90 * MB);
    if (sim)
        CHECK(t_ledger().bytes_held - l0.bytes_held == s0.mapped_bytes);
    size_t us0 = 0;
    CHECK_OK(fabpool_usable_size(w.p, w.small[3], &us0));

    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info si = t_sleep_info(w.p);
    CHECK(si.asleep == 1 && si.mode == FABPOOL_SLEEP_OFFLOAD && si.sleeps == 1 && si.wakes == 0);
    fabpool_stats s1 = {.struct_size = sizeof s1};
    fabpool_get_stats(w.p, &s1);
    CHECK(s1.mapped_bytes == 0 && s1.chunks_mapped == 0);
    /* what was offloaded: everything in use; the cache was trimmed, not copied */
    CHECK(si.offloaded_bytes >= s0.in_use_bytes && si.offloaded_bytes < s0.mapped_bytes);
    CHECK(si.discarded_bytes == 0);
    CHECK(si.host_bytes >= si.offloaded_bytes);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held); /* every device byte of the pool given back */
        CHECK(l.bytes_held_host == si.host_bytes);
    } else {
        CHECK(t_near(t_held(), 0));
    }
    /* the metadata stays: usable sizes, addresses, buffer info */
    size_t us1 = 0;
    CHECK_OK(fabpool_usable_size(w.p, w.small[3], &us1));
    CHECK(us1 == us0);
    CHECK(fabpool_buffer_ptr(w.buf[1]) == w.buf_base[1]);

    /* refusals while asleep, each changing nothing */
    fabsim_ledger la = t_ledger();
    void *q = NULL;
    CHECK_STATUS(fabpool_alloc(w.p, 1000, &q), FABPOOL_ERR_ASLEEP);
    CHECK(strstr(fabpool_last_error(), "fabpool_wake") != NULL);
    CHECK_STATUS(fabpool_alloc(w.p, 64, &q), FABPOOL_ERR_ASLEEP); /* a class the thread cache had */
    CHECK_STATUS(fabpool_alloc(w.p, 30 * MB, &q), FABPOOL_ERR_ASLEEP);
    fabpool_buffer_t *nb = NULL;
    CHECK_STATUS(fabpool_buffer_create(w.p, 8 * MB, 4 * MB, &nb), FABPOOL_ERR_ASLEEP);
    CHECK(nb == NULL);
    CHECK_STATUS(fabpool_buffer_resize(w.buf[0], 20 * MB, NULL), FABPOOL_ERR_ASLEEP);
    CHECK_STATUS(fabpool_buffer_resize(w.buf[1], 2 * MB, NULL), FABPOOL_ERR_ASLEEP);
    int fd = 7;
    CHECK_STATUS(fabpool_buffer_dmabuf(w.buf[0], 0, 2 * MB, &fd), FABPOOL_ERR_ASLEEP);
    CHECK(fd == -1);
    if (fabpool_handle_type_of(w.p) == FABPOOL_HANDLE_POSIX_FD) {
        unsigned char d[4096];
        int fds[16];
        size_t len = 0, nfds = 0;
        CHECK_STATUS(fabpool_buffer_export(w.buf[0], 0, d, sizeof d, &len, fds, 16, &nfds), FABPOOL_ERR_ASLEEP);
    }
    CHECK_STATUS(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL), FABPOOL_ERR_ASLEEP);
    CHECK_STATUS(fabpool_sleep(w.p, FABPOOL_SLEEP_DISCARD, NULL), FABPOOL_ERR_ASLEEP);
    CHECK(strstr(fabpool_last_error(), "already asleep") != NULL);
    if (sim) {
        fabsim_ledger lb = t_ledger();
        CHECK(t_ledger_same(&la, &lb));
    }
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(w.buf[0], &bi));
    CHECK(bi.size == w.buf_size[0]);

    /* frees while asleep: only the records change; what they free is not mapped at wake */
    CHECK_OK(fabpool_free(w.p, w.small[5]));
    w.small[5] = NULL;
    CHECK_OK(fabpool_free(w.p, w.large[0]));
    w.large[0] = NULL;
    CHECK_STATUS(fabpool_free(w.p, w.large[0] ? w.large[0] : (void *)(uintptr_t)1), FABPOOL_ERR_NOT_FOUND);
    if (sim)
        CHECK(t_ledger().bytes_held == l0.bytes_held);

    CHECK_STATUS(fabpool_wake(NULL, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_wake(w.p, NULL));
    si = t_sleep_info(w.p);
    CHECK(si.asleep == 0 && si.wakes == 1 && si.host_bytes == 0);
    CHECK(si.offloaded_bytes > 0); /* the last sleep's report stays */
    CHECK(all_intact(&w));
    fabpool_stats s2 = {.struct_size = sizeof s2};
    fabpool_get_stats(w.p, &s2);
    CHECK(s2.mapped_bytes > 0 && s2.mapped_bytes <= s0.mapped_bytes);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held - l0.bytes_held == s2.mapped_bytes);
        CHECK(l.bytes_held_host == l0.bytes_held_host);
        CHECK(l.reservations == l0.reservations + 1); /* the pool's own; the host copies' range went */
    }
    CHECK_STATUS(fabpool_wake(w.p, NULL), FABPOOL_ERR_INVALID_ARG); /* wake without sleep */
    CHECK(strstr(fabpool_last_error(), "not asleep") != NULL);

    /* the pool works as before: allocations (fast path too), buffers, at the same addresses */
    for (int k = 0; k < 1000; k++) {
        void *a = NULL;
        CHECK_OK(fabpool_alloc(w.p, 64 + (size_t)(k % 7) * 100, &a));
        if (a) {
            pattern_fill(a, 64, (uint64_t)k);
            CHECK(pattern_intact(a, 64, (uint64_t)k));
            CHECK_OK(fabpool_free(w.p, a));
        }
    }
    CHECK_OK(fabpool_buffer_resize(w.buf[0], 20 * MB, NULL));
    CHECK(pattern_intact(w.buf_base[0], w.buf_size[0], w.seed + 200));
    CHECK(all_intact(&w));

    /* a second round, with a stream */
    CUstream st = NULL;
    CHECK_CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, st));
    if (sim)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_wake(w.p, st));
    CHECK(all_intact(&w));
    CHECK(t_sleep_info(w.p).sleeps == 2);
    cuStreamDestroy(st);
    teardown_to(&w, &l0);
}

/* ------------------------------------------------------------ discard */

static void discard_round_trip(void)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    CHECK(populate(&w, NULL, 21, 1) == 0);
    if (!w.p)
        return;
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_DISCARD, NULL));
    fabpool_sleep_info si = t_sleep_info(w.p);
    CHECK(si.asleep && si.mode == FABPOOL_SLEEP_DISCARD && si.offloaded_bytes == 0 && si.discarded_bytes > 0 &&
          si.host_bytes == 0);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held && l.bytes_held_host == 0);
    }
    CHECK_OK(fabpool_wake(w.p, NULL));
    si = t_sleep_info(w.p);
    CHECK(!si.asleep && si.discarded_bytes > 0); /* the report says the contents were discarded */
    if (sim)
        CHECK(t_ledger().bytes_held - l0.bytes_held == t_mapped(w.p));
    /* the memory is there again: write and read every block */
    fill_all(&w, 22);
    CHECK(all_intact(&w));
    teardown_to(&w, &l0);
}

/* ------------------------------------------------------------ tags */

static void two_tags(void)
{
    fabsim_ledger l0 = t_ledger();
    world weights, kv, other;
    CHECK(populate(&weights, NULL, 31, 1) == 0);
    CHECK(populate(&kv, NULL, 41, 1) == 0);
    CHECK(populate(&other, "slab_max:1MiB", 51, 0) == 0);
    if (!weights.p || !kv.p || !other.p)
        return;
    uint64_t mo = t_mapped(other.p);
    CHECK_OK(fabpool_sleep(weights.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_sleep(kv.p, FABPOOL_SLEEP_DISCARD, NULL));
    if (sim)
        CHECK(t_ledger().bytes_held - l0.bytes_held == mo); /* only the awake pool holds device memory */
    CHECK(all_intact(&other));
    CHECK_STATUS(fabpool_sleep(weights.p, FABPOOL_SLEEP_DISCARD, NULL), FABPOOL_ERR_ASLEEP);
    void *a = NULL;
    CHECK_OK(fabpool_alloc(other.p, 5000, &a)); /* the awake pool allocates */
    CHECK_OK(fabpool_free(other.p, a));
    CHECK(t_sleep_info(weights.p).offloaded_bytes > 0 && t_sleep_info(weights.p).discarded_bytes == 0);
    CHECK(t_sleep_info(kv.p).offloaded_bytes == 0 && t_sleep_info(kv.p).discarded_bytes > 0);
    CHECK(t_sleep_info(other.p).asleep == 0 && t_sleep_info(other.p).sleeps == 0);
    CHECK_OK(fabpool_wake(kv.p, NULL));
    CHECK_OK(fabpool_wake(weights.p, NULL));
    CHECK(all_intact(&weights));
    CHECK(all_intact(&other));
    teardown(&weights);
    teardown(&kv);
    teardown(&other);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(t_ledger_same(&l, &l0));
    }
}

/* ------------------------------------------------------------ refusals */

static void refusals(void)
{
    fabsim_ledger l0 = t_ledger();
    CHECK_STATUS(fabpool_sleep(NULL, FABPOOL_SLEEP_OFFLOAD, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_wake(NULL, NULL), FABPOOL_ERR_INVALID_ARG);
    fabpool_sleep_info si = {.struct_size = sizeof si};
    CHECK_STATUS(fabpool_sleep_state(NULL, &si), FABPOOL_ERR_INVALID_ARG);
    world w;
    CHECK(populate(&w, "handle_type:posix_fd,slab_max:1MiB", 61, 0) == 0);
    if (!w.p)
        return;
    CHECK_STATUS(fabpool_sleep_state(w.p, NULL), FABPOOL_ERR_INVALID_ARG);
    uint64_t m0 = t_mapped(w.p);
    CHECK_STATUS(fabpool_sleep(w.p, (fabpool_sleep_mode)7, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "mode 7") != NULL);
    CHECK_STATUS(fabpool_wake(w.p, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK(t_mapped(w.p) == m0 && t_sleep_info(w.p).asleep == 0 && t_sleep_info(w.p).sleeps == 0);

    /* an exported buffer whose peers have not said they are gone */
    unsigned char d[8192];
    int fds[32];
    size_t len = 0, nfds = 0;
    CHECK_OK(fabpool_buffer_export(w.buf[0], 0, d, sizeof d, &len, fds, 32, &nfds));
    CHECK_STATUS(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL), FABPOOL_ERR_BUSY);
    CHECK(strstr(fabpool_last_error(), "peers") != NULL);
    CHECK(t_mapped(w.p) == m0 && t_sleep_info(w.p).asleep == 0);
    void *a = NULL;
    CHECK_OK(fabpool_alloc(w.p, 100, &a)); /* nothing changed: the pool allocates */
    CHECK_OK(fabpool_free(w.p, a));
    CHECK_OK(fabpool_buffer_export_done(w.buf[0]));
    CHECK_OK(fabpool_buffer_peers_ack(w.buf[0], UINT64_MAX)); /* no peer is left */
    fabpool_buffer_info b0 = {.struct_size = sizeof b0};
    fabpool_buffer_get_info(w.buf[0], &b0);
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    if (sim)
        CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().exported_fds == l0.exported_fds);
    /* a buffer destroyed while asleep: nothing of it is mapped at wake */
    CHECK_OK(fabpool_buffer_destroy(w.buf[1], NULL));
    CHECK_OK(fabpool_wake(w.p, NULL));
    fabpool_buffer_info b1 = {.struct_size = sizeof b1};
    fabpool_buffer_get_info(w.buf[0], &b1);
    CHECK(b1.generation > b0.generation); /* new memory behind the chunks: a new generation */
    CHECK(pattern_intact(w.buf_base[0], w.buf_size[0], w.seed + 200));
    CHECK(t_mapped(w.p) < m0);
    w.buf[1] = NULL;
    for (int i = 0; i < 4; i++)
        CHECK(pattern_intact(w.small[i], w.small_size[i], w.seed + 1 + (uint64_t)i));
    CHECK(pattern_intact(w.large[0], w.large_size[0], w.seed + 100));
    /* export after wake: the chunks are exported anew */
    CHECK_OK(fabpool_buffer_export(w.buf[0], 0, d, sizeof d, &len, fds, 32, &nfds));
    CHECK_OK(fabpool_buffer_export_done(w.buf[0]));
    CHECK_OK(fabpool_buffer_peers_ack(w.buf[0], UINT64_MAX));
    teardown_to(&w, &l0);
}

/* While asleep, a buffer create or a reuse answers FABPOOL_ERR_ASLEEP (not a lack of room or of a kept
 * buffer), and changes nothing; after the wake both work. */
static void buffers_refused_asleep(void)
{
    fabpool_t *p = t_pool("keep_ms:60000");
    if (!p)
        return;
    fabpool_buffer_t *b = NULL, *r = (fabpool_buffer_t *)1;
    CHECK_OK(fabpool_buffer_create(p, 64 << 20, 8 << 20, &b));
    CHECK_OK(fabpool_buffer_release(b));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_stats s0 = t_stats(p);
    CHECK_STATUS(fabpool_buffer_create(p, 64 << 20, 8 << 20, &r), FABPOOL_ERR_ASLEEP);
    CHECK(r == NULL);
    r = (fabpool_buffer_t *)1;
    CHECK_STATUS(fabpool_buffer_create(p, (size_t)1 << 50, 8 << 20, &r), FABPOOL_ERR_ASLEEP);
    r = (fabpool_buffer_t *)1;
    CHECK_STATUS(fabpool_buffer_reuse(p, 8 << 20, NULL, &r), FABPOOL_ERR_ASLEEP);
    CHECK(r == NULL);
    fabpool_stats s1 = t_stats(p);
    CHECK(s1.buffers == s0.buffers && s1.kept_bytes == s0.kept_bytes && s1.mapped_bytes == s0.mapped_bytes);
    CHECK(t_sleep_info(p).asleep);
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK_OK(fabpool_buffer_create(p, 64 << 20, 8 << 20, &r));
    if (r)
        CHECK_OK(fabpool_buffer_destroy(r, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* ------------------------------------------------------------ other threads' caches */

typedef struct tstate {
    fabpool_t *p;
    pthread_barrier_t *bar;
    void *live[16];
    fabpool_status asleep_alloc, asleep_free, awake_alloc;
} tstate;

static void *cache_thread(void *arg)
{
    tstate *t = arg;
    cuCtxSetCurrent(t_ctx);
    void *tmp[16];
    for (int i = 0; i < 16; i++) {
        fabpool_alloc(t->p, 4096, &t->live[i]);
        fabpool_alloc(t->p, 4096, &tmp[i]);
        pattern_fill(t->live[i], 4096, 500 + (uint64_t)i);
    }
    for (int i = 0; i < 16; i++)
        fabpool_free(t->p, tmp[i]); /* into this thread's cache */
    pthread_barrier_wait(t->bar);   /* the main thread sleeps the pool */
    pthread_barrier_wait(t->bar);
    void *a = NULL;
    t->asleep_alloc = fabpool_alloc(t->p, 4096, &a); /* a cache hit would hand out unmapped memory */
    t->asleep_free = fabpool_free(t->p, t->live[15]);
    t->live[15] = NULL;
    pthread_barrier_wait(t->bar);   /* the main thread wakes it */
    pthread_barrier_wait(t->bar);
    t->awake_alloc = fabpool_alloc(t->p, 4096, &a);
    if (t->awake_alloc == FABPOOL_OK)
        fabpool_free(t->p, a);
    for (int i = 0; i < 15; i++) {
        CHECK(pattern_intact(t->live[i], 4096, 500 + (uint64_t)i));
        fabpool_free(t->p, t->live[i]);
    }
    return NULL;
}

static void thread_caches(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    o.reserve_bytes = 4ull << 30;
    CHECK_OK(fabpool_create(&o, &p));
    if (!p)
        return;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    tstate t;
    memset(&t, 0, sizeof t);
    t.p = p;
    t.bar = &bar;
    pthread_t th;
    pthread_create(&th, NULL, cache_thread, &t);
    pthread_barrier_wait(&bar);
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    if (sim)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    CHECK(t.asleep_alloc == FABPOOL_ERR_ASLEEP);
    CHECK(t.asleep_free == FABPOOL_OK);
    CHECK_OK(fabpool_wake(p, NULL));
    pthread_barrier_wait(&bar);
    pthread_join(th, NULL);
    CHECK(t.awake_alloc == FABPOOL_OK);
    pthread_barrier_destroy(&bar);
    fabpool_destroy(p);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(t_ledger_same(&l, &l0));
    }
}

/* destroyed while asleep: the host copies go, nothing stays */
static void destroy_asleep(void)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    CHECK(populate(&w, "slab_max:1MiB", 71, 0) == 0);
    if (!w.p)
        return;
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    if (sim)
        CHECK(t_ledger().bytes_held_host > 0);
    fabpool_destroy(w.p); /* blocks and buffers live: BUSY, the pool is gone anyway */
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(t_ledger_same(&l, &l0));
    }
}

/* ------------------------------------------------------------ faults (sim) */

static const char *const fault_entries[] = {
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "cuDeviceGetAttribute", "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree",
    "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemRelease", "cuMemUnmap", "cuMemcpyDtoDAsync",
};
#define N_FAULT_ENTRIES (sizeof fault_entries / sizeof fault_entries[0])

static int n_trials, n_failed_ops, n_absorbed;

/* Call n of entry e fails during the sleep (phase 0) or the wake (phase 1).
 * Returns 0 once the operation makes fewer than n calls of e. */
static int fault_trial(size_t e, uint64_t n, int phase, fabpool_sleep_mode mode, int keep)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    if (populate(&w, keep ? "slab_max:1MiB,sleep_keep_host:1" : "slab_max:1MiB", 81 + n, 0) != 0) {
        CHECK(!"populate");
        teardown(&w);
        return 0;
    }
    fabsim_ledger la = t_ledger();
    if (keep) { /* a round first: the faulted sleep copies into the host memory this wake kept */
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(t_sleep_info(w.p).host_bytes > 0);
    }
    uint64_t m0 = t_mapped(w.p);
    if (phase == 1)
        CHECK_OK(fabpool_sleep(w.p, mode, NULL));
    int err = strcmp(fault_entries[e], "cuMemCreate") == 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    uint64_t c0 = calls(fault_entries[e]);
    fault_set(fault_entries[e], n, 0, err);
    fabpool_status st = phase == 0 ? fabpool_sleep(w.p, mode, NULL) : fabpool_wake(w.p, NULL);
    fault_clear();
    uint64_t made = calls(fault_entries[e]) - c0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    int reached = made >= n;
    n_trials += reached;
    fabpool_sleep_info si = t_sleep_info(w.p);
    if (st != FABPOOL_OK) {
        n_failed_ops++;
        CHECK(msg[0] != 0);
        if (phase == 0) {
            /* rolled back: awake, data in place, no host memory (kept copies the sleep took are freed with
             * its record; where it failed before taking them they stay); the cache may have been trimmed */
            fabsim_ledger l = t_ledger();
            CHECK(!si.asleep && (keep || si.host_bytes == 0));
            CHECK(l.bytes_held_host - la.bytes_held_host == si.host_bytes &&
                  l.reservations == la.reservations + (si.host_bytes > 0));
            CHECK(l.bytes_held <= la.bytes_held && l.bytes_held - l0.bytes_held == t_mapped(w.p));
            CHECK(all_intact(&w));
            void *a = NULL;
            CHECK_OK(fabpool_alloc(w.p, 100, &a));
            CHECK_OK(fabpool_free(w.p, a));
            if (mode == FABPOOL_SLEEP_OFFLOAD) { /* and it can sleep now */
                CHECK_OK(fabpool_sleep(w.p, mode, NULL));
                CHECK_OK(fabpool_wake(w.p, NULL));
                CHECK(all_intact(&w));
            }
        } else {
            /* asleep still (the host copies kept): a second wake completes */
            CHECK(si.asleep);
            if (mode == FABPOOL_SLEEP_OFFLOAD)
                CHECK(si.host_bytes > 0);
            CHECK_OK(fabpool_wake(w.p, NULL));
            CHECK(!t_sleep_info(w.p).asleep);
            if (mode == FABPOOL_SLEEP_OFFLOAD)
                CHECK(all_intact(&w));
        }
    } else {
        if (reached)
            n_absorbed++;
        if (phase == 0) {
            CHECK(si.asleep && t_mapped(w.p) == 0 && t_ledger().bytes_held == l0.bytes_held);
            CHECK_OK(fabpool_wake(w.p, NULL));
        }
        CHECK(!t_sleep_info(w.p).asleep && t_mapped(w.p) > 0 && t_mapped(w.p) <= m0);
        if (mode == FABPOOL_SLEEP_OFFLOAD)
            CHECK(all_intact(&w));
    }
    CHECK(t_ledger().bytes_held - l0.bytes_held == t_mapped(w.p));
    int fails0 = t_failures;
    teardown(&w);
    fabsim_ledger l = t_ledger();
    CHECK(t_ledger_same(&l, &l0));
    if (t_failures != fails0 || (st != FABPOOL_OK && !msg[0]))
        fprintf(stderr, "  fault: %s call %llu, phase %d, mode %d: %s\n", fault_entries[e], (unsigned long long)n,
                phase, (int)mode, msg);
    return reached;
}

static void faults(void)
{
    sim_hooks();
    if (!sim || !fault_set || !fault_clear || !calls) {
        printf("test_sleep: fault injection needs the simulated driver; skipped\n");
        return;
    }
    /* sleep with offload and with discard, and the wake of an offload (a discard's wake makes the same calls
     * less the copies) */
    for (int phase = 0; phase < 2; phase++)
        for (int mode = 0; mode < 2; mode++)
            for (size_t e = 0; e < N_FAULT_ENTRIES && !(phase == 1 && mode == FABPOOL_SLEEP_DISCARD); e++)
                for (uint64_t n = 1; n < 200 && fault_trial(e, n, phase, (fabpool_sleep_mode)mode, 0); n++)
                    ;
    /* with sleep_keep_host, a sleep with offload that reuses the kept copies, and its wake (which keeps them) */
    for (int phase = 0; phase < 2; phase++)
        for (size_t e = 0; e < N_FAULT_ENTRIES; e++)
            for (uint64_t n = 1; n < 200 && fault_trial(e, n, phase, FABPOOL_SLEEP_OFFLOAD, 1); n++)
                ;
    printf("test_sleep: %d faults injected into sleep and wake, %d made the call fail, %d absorbed\n", n_trials,
           n_failed_ops, n_absorbed);
    CHECK(n_trials > 50 && n_failed_ops > 20);
}

/* A wake whose copy back of chunk n fails and whose unmap of that chunk is refused too (every unmap, twice): the
 * wake fails saying so and stays asleep with the host copies; a trim while asleep keeps them; the next wake
 * copies the chunk in, and every byte reads back (the chunk stayed mapped; it was skipped, its copy freed,
 * before). */
static void wake_copy_and_unmap_refused(void)
{
    sim_hooks();
    if (!sim || !fault_set || !fault_clear || !calls)
        return;
    int tried = 0;
    for (uint64_t n = 1; n < 64; n++) {
        fabsim_ledger l0 = t_ledger();
        world w;
        if (populate(&w, "slab_max:1MiB", 91 + n, 0) != 0) {
            CHECK(!"populate");
            teardown(&w);
            return;
        }
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        uint64_t c0 = calls("cuMemcpyDtoDAsync");
        fault_set("cuMemcpyDtoDAsync", n, 0, CUDA_ERROR_INVALID_VALUE);
        fault_set("cuMemUnmap", 1, 1, CUDA_ERROR_INVALID_VALUE);
        fabpool_status st = fabpool_wake(w.p, NULL);
        fault_clear();
        int reached = calls("cuMemcpyDtoDAsync") - c0 >= n;
        if (!reached) { /* past the copies: only the host copies' unmaps were refused, and a wake completes */
            if (st != FABPOOL_OK)
                CHECK_OK(fabpool_wake(w.p, NULL));
            CHECK(!t_sleep_info(w.p).asleep && all_intact(&w));
            teardown(&w);
            break;
        }
        /* the copy refused (else every copy went in and the host copies' unmaps were refused: asleep still) */
        int copy = strstr(fabpool_last_error(), "cuMemcpyDtoDAsync") != NULL;
        tried += copy;
        CHECK_STATUS(st, FABPOOL_ERR_DRIVER);
        CHECK(!copy || strstr(fabpool_last_error(), "the next fabpool_wake copies it in") != NULL);
        fabpool_sleep_info si = t_sleep_info(w.p);
        CHECK(si.asleep && si.host_bytes > 0);
        CHECK_OK(fabpool_trim(w.p, 0));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(!t_sleep_info(w.p).asleep && all_intact(&w));
        CHECK_OK(fabpool_check(w.p));
        CHECK(t_ledger().bytes_held - l0.bytes_held == t_mapped(w.p));
        teardown(&w);
        fabsim_ledger l = t_ledger();
        CHECK(t_ledger_same(&l, &l0));
    }
    CHECK(tried >= 2);
}

/* A sleep whose unmaps the driver refuses (each one twice) from its n-th chunk on; the cache trimmed first, so that
 * every unmap of the sleep is one of its chunks.  A rollback that gives the pool back as it was answers the refusal
 * with the pool awake and every byte in place: an offload with sleep_keep_host (its wake keeps the host copies, no
 * unmap), a discard refused at its first chunk.  A discard that has dropped contents goes on instead: it answers
 * FABPOOL_ERR_PARTIAL, asleep, discarded_bytes the bytes it unmapped, the refused chunks mapped still (the sim's
 * ledger agrees), fabpool_check passes, allocation answers FABPOOL_ERR_ASLEEP, and a wake completes it.  An
 * offload without the option cannot free its host copies in the rollback's wake either: FABPOOL_ERR_PARTIAL,
 * asleep with them, and a wake restores every byte.  After each, a sleep and wake go through and destroy leaves
 * nothing behind. */
static int unmap_refused_trial(fabpool_sleep_mode mode, int keep, uint64_t n, int *partial)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    if (populate(&w, keep ? "slab_max:1MiB,sleep_keep_host:1" : "slab_max:1MiB", 601 + n, 0) != 0) {
        CHECK(!"populate");
        teardown(&w);
        return 0;
    }
    CHECK_OK(fabpool_trim(w.p, 0));
    uint64_t m0 = t_mapped(w.p), c0 = calls("cuMemUnmap");
    fault_set("cuMemUnmap", n, 1, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_sleep(w.p, mode, NULL);
    fault_clear();
    int reached = calls("cuMemUnmap") - c0 >= n;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    fabpool_sleep_info si = t_sleep_info(w.p);
    int fails0 = t_failures;
    CHECK(st != FABPOOL_OK || !reached);
    CHECK(st == FABPOOL_OK || strstr(msg, "cuMemUnmap") != NULL);
    CHECK(t_ledger().bytes_held - l0.bytes_held == t_mapped(w.p));
    CHECK_OK(fabpool_check(w.p));
    int go_on = mode == FABPOOL_SLEEP_DISCARD && n > 1, rolled = !go_on && (keep || mode == FABPOOL_SLEEP_DISCARD);
    if (st == FABPOOL_OK) { /* the sleep made fewer unmaps */
        CHECK_OK(fabpool_wake(w.p, NULL));
        if (mode == FABPOOL_SLEEP_DISCARD)
            fill_all(&w, w.seed + 7);
    } else if (rolled) { /* as before the call */
        CHECK(st != FABPOOL_ERR_PARTIAL && !si.asleep && t_mapped(w.p) == m0 && all_intact(&w));
    } else if (go_on) { /* asleep: what it unmapped is dropped, the refused chunks stay */
        void *x = NULL;
        CHECK_STATUS(st, FABPOOL_ERR_PARTIAL);
        CHECK(si.asleep && si.mode == FABPOOL_SLEEP_DISCARD && si.discarded_bytes > 0 && t_mapped(w.p) > 0 &&
              si.discarded_bytes + t_mapped(w.p) == m0 && strstr(msg, "the pool is asleep") != NULL);
        CHECK_STATUS(fabpool_alloc(w.p, 100, &x), FABPOOL_ERR_ASLEEP);
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(!t_sleep_info(w.p).asleep && t_mapped(w.p) == m0);
        fill_all(&w, w.seed + 7); /* discarded contents are unspecified: written again */
    } else { /* an offload whose rollback could not free its host copies: asleep with them */
        CHECK_STATUS(st, FABPOOL_ERR_PARTIAL);
        CHECK(si.asleep && si.host_bytes > 0);
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(!t_sleep_info(w.p).asleep && t_mapped(w.p) == m0);
    }
    *partial += st == FABPOOL_ERR_PARTIAL;
    CHECK(all_intact(&w));
    CHECK_OK(fabpool_sleep(w.p, mode, NULL));
    CHECK_OK(fabpool_wake(w.p, NULL));
    if (mode == FABPOOL_SLEEP_OFFLOAD)
        CHECK(all_intact(&w));
    CHECK_OK(fabpool_check(w.p));
    if (t_failures != fails0)
        fprintf(stderr, "  unmap %llu on refused, mode %d, keep %d: %s: %s\n", (unsigned long long)n, (int)mode, keep,
                fabpool_status_name(st), msg);
    teardown_to(&w, &l0);
    return reached;
}

static void unmap_refused_twice(void)
{
    sim_hooks();
    if (!sim || !fault_set || !fault_clear || !calls)
        return;
    static const struct {
        fabpool_sleep_mode mode;
        int keep;
    } cases[] = {{FABPOOL_SLEEP_DISCARD, 0}, {FABPOOL_SLEEP_OFFLOAD, 1}, {FABPOOL_SLEEP_OFFLOAD, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int trials = 0, partial = 0;
        for (uint64_t n = 1; n < 64 && unmap_refused_trial(cases[c].mode, cases[c].keep, n, &partial); n++)
            trials++;
        printf("test_sleep: every unmap of %s sleep%s refused from its chunk n on, n = 1..%d: %d answered "
               "FABPOOL_ERR_PARTIAL\n", cases[c].mode == FABPOOL_SLEEP_DISCARD ? "a discard" : "an offload",
               cases[c].keep ? " (sleep_keep_host)" : "", trials, partial);
        CHECK(trials >= 4);
        /* discard: every refusal past the first chunk; offload: the rollbacks that could not free host copies */
        CHECK(partial == (cases[c].mode == FABPOOL_SLEEP_DISCARD ? trials - 1 : cases[c].keep ? 0 : trials));
    }
}

/* ------------------------------------------------------------ sleep_keep_host */

/* Wake keeps the host copies; the next sleep of the same memory makes no host
 * memory and restores the new contents; another layout makes them anew; a
 * discard sleep leaves them; trim (after a refused unmap, again) and destroy
 * free them. */
static void keep_host(void)
{
    sim_hooks();
    fabsim_ledger l0 = t_ledger();
    world w;
    if (populate(&w, "sleep_keep_host:1", 501, 1) != 0) {
        CHECK(!"populate");
        teardown(&w);
        return;
    }
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info s1 = t_sleep_info(w.p);
    CHECK(s1.host_reused_bytes == 0 && s1.host_bytes > 0 && s1.offloaded_bytes > 0);
    CHECK_OK(fabpool_wake(w.p, NULL));
    CHECK(all_intact(&w));
    fabpool_sleep_info s2 = t_sleep_info(w.p);
    CHECK(s2.host_bytes == s1.host_bytes && s2.host_copies == s1.host_copies); /* kept */
    if (sim) /* the real driver tells nobody what pinned host memory a process holds */
        CHECK(t_ledger().bytes_held_host - l0.bytes_held_host == s1.host_bytes);
    CHECK_OK(fabpool_check(w.p));
    /* new contents in the same chunks: the second sleep copies them into the kept memory */
    fill_all(&w, 777);
    uint64_t creates = calls ? calls("cuMemCreate") : 0;
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info s3 = t_sleep_info(w.p);
    if (calls)
        CHECK(calls("cuMemCreate") == creates);
    CHECK(s3.host_reused_bytes == s1.host_bytes && s3.host_bytes == s1.host_bytes &&
          s3.offloaded_bytes == s1.offloaded_bytes && t_mapped(w.p) == 0);
    CHECK_OK(fabpool_wake(w.p, NULL));
    CHECK(all_intact(&w)); /* the new contents, not the first sleep's */
    /* another layout (one more large block): the kept copies do not fit, they are freed and made anew */
    void *extra = NULL;
    CHECK_OK(fabpool_alloc(w.p, 12 * MB, &extra));
    creates = calls ? calls("cuMemCreate") : 0;
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info s4 = t_sleep_info(w.p);
    CHECK(s4.host_reused_bytes == 0 && s4.host_bytes > s1.host_bytes);
    if (calls)
        CHECK(calls("cuMemCreate") > creates);
    if (sim)
        CHECK(t_ledger().bytes_held_host - l0.bytes_held_host == s4.host_bytes); /* the old ones are gone */
    CHECK_OK(fabpool_wake(w.p, NULL));
    CHECK(all_intact(&w));
    /* a discard sleep leaves the kept copies as they are */
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_DISCARD, NULL));
    CHECK(t_sleep_info(w.p).host_bytes == s4.host_bytes && t_sleep_info(w.p).host_reused_bytes == 0);
    CHECK_OK(fabpool_wake(w.p, NULL));
    CHECK(t_sleep_info(w.p).host_bytes == s4.host_bytes);
    /* trim frees them; where the driver refuses an unmap (twice) they stay, counted, for the next trim */
    if (fault_set && fault_clear) {
        fault_set("cuMemUnmap", 1, 1, CUDA_ERROR_INVALID_VALUE);
        CHECK(fabpool_trim(w.p, 0) != FABPOOL_OK);
        fault_clear();
        CHECK(strstr(fabpool_last_error(), "kept host copy") != NULL);
        CHECK(t_sleep_info(w.p).host_bytes > 0 &&
              t_ledger().bytes_held_host - l0.bytes_held_host == t_sleep_info(w.p).host_bytes);
    }
    CHECK_OK(fabpool_trim(w.p, 0));
    CHECK(t_sleep_info(w.p).host_bytes == 0 && t_sleep_info(w.p).host_copies == 0 &&
          t_ledger().bytes_held_host == l0.bytes_held_host);
    CHECK_OK(fabpool_check(w.p));
    CHECK_OK(fabpool_free(w.p, extra));
    teardown(&w);
    fabsim_ledger l = t_ledger();
    CHECK(t_ledger_same(&l, &l0));
    /* destroy with kept copies frees them */
    if (populate(&w, "slab_max:1MiB,sleep_keep_host:1", 502, 0) == 0) {
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(t_sleep_info(w.p).host_bytes > 0);
    } else {
        CHECK(!"populate");
    }
    teardown(&w);
    l = t_ledger();
    CHECK(t_ledger_same(&l, &l0));
    /* without the option, wake keeps nothing */
    if (populate(&w, "slab_max:1MiB", 503, 0) == 0) {
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(t_sleep_info(w.p).host_bytes == 0 && t_ledger().bytes_held_host == l0.bytes_held_host);
    }
    teardown(&w);
}

#include <time.h>
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* test_sleep [PART...]: the parts named (every part without one).  The TSan step of CI runs thread_caches only,
 * the one part that starts a thread: in a program of one thread TSan finds nothing, and the other parts' copies
 * of tens of MiB through its shadow memory took ten minutes on a slow machine. */
static int n_named, n_ran;
static char **named;
static int wanted(const char *part)
{
    for (int i = 0; i < n_named; i++)
        if (strcmp(named[i], part) == 0)
            return 1;
    return n_named == 0;
}
#define PART(f)                                                                        \
    do {                                                                               \
        if (!wanted(#f))                                                               \
            break;                                                                     \
        n_ran++;                                                                       \
        double t0_ = now_s();                                                          \
        f();                                                                           \
        printf("test_sleep: %s %.2f s\n", #f, now_s() - t0_);                          \
    } while (0)

int main(int argc, char **argv)
{
    n_named = argc - 1;
    named = argv + 1;
    sim = t_driver_init();
    PART(offload_round_trip);
    PART(discard_round_trip);
    PART(two_tags);
    PART(refusals);
    PART(buffers_refused_asleep);
    PART(thread_caches);
    PART(destroy_asleep);
    PART(keep_host);
    PART(faults);
    PART(wake_copy_and_unmap_refused);
    PART(unmap_refused_twice);
    CHECK(n_named == 0 || n_ran == n_named); /* every part named exists */
    return t_done("test_sleep");
}
