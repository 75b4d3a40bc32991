/* test_sleep_double_fault: a sleep with offload where a driver call fails and so does the unmap that undoes it
 * (the simulated driver's fault injection).
 *   - host_copy_double_fault_keeps_mapping: the access grant of the k-th host copy is refused, and so is every
 *     unmap (that host copy's undo included): the sleep fails, the pool stays awake with its data and
 *     fabpool_check passes; then, the driver well again, the next sleep, a trim or the destroy frees the
 *     mapping the driver kept, the host copies made before it and their reservation: a sleep after it holds
 *     nothing of the device and only its own host copies, a trim leaves no host memory nor reservation, the
 *     wake reads every byte back, and after destroy the driver holds nothing of the pool (the sim's ledger:
 *     mappings, handles, reservations, bytes).  With and without sleep_keep_host (there the faulted sleep
 *     frees the kept host copies, which do not fit a changed layout, and makes its own anew: the unmaps after
 *     those of the kept ones are refused).
 *   - sleep_unmaps_stuck_mapping_first: a pool mapping the driver would not unmap (a grow's access grant and
 *     its undo refused) holds device memory, so a sleep unmaps it before it puts anything to sleep: where the
 *     driver still refuses, the sleep fails saying so, with the pool awake and unchanged; once the driver
 *     unmaps it, the sleeping pool holds no device memory, and the wake reads every byte back. */
#include "testutil.h"
#include "pattern.h"

#define MB (1ull << 20)

enum { NBLK = 4 };

typedef struct world {
    fabpool_t *p;
    void *blk[NBLK];
    size_t blk_size[NBLK];
    fabpool_buffer_t *buf;
    size_t buf_size;
    uint64_t seed;
} world;

static int all_intact(const world *w)
{
    int ok = 1;
    for (int i = 0; i < NBLK; i++)
        if (w->blk[i] && !pattern_intact(w->blk[i], w->blk_size[i], w->seed + (uint64_t)i))
            ok = 0;
    if (w->buf && !pattern_intact(fabpool_buffer_ptr(w->buf), w->buf_size, w->seed + 100))
        ok = 0;
    return ok;
}

/* Allocates block i of size bytes and fills it. */
static int add_block(world *w, int i, size_t size)
{
    w->blk_size[i] = size;
    if (fabpool_alloc(w->p, size, &w->blk[i]) != FABPOOL_OK)
        return -1;
    pattern_fill(w->blk[i], size, w->seed + (uint64_t)i);
    return 0;
}

/* Slabs, a large block and a buffer of two chunks, each filled with its pattern: several host copies. */
static int build(world *w, const char *conf, uint64_t seed)
{
    memset(w, 0, sizeof *w);
    w->seed = seed;
    w->p = t_pool(conf);
    if (!w->p || add_block(w, 0, 4096) != 0 || add_block(w, 1, 300000) != 0 || add_block(w, 2, MB + 4096) != 0)
        return -1;
    w->buf_size = 3 * MB;
    if (fabpool_buffer_create(w->p, 64 * MB, MB, &w->buf) != FABPOOL_OK ||
        fabpool_buffer_resize(w->buf, w->buf_size, NULL) != FABPOOL_OK)
        return -1;
    pattern_fill(fabpool_buffer_ptr(w->buf), w->buf_size, w->seed + 100);
    return 0;
}

static void teardown(world *w)
{
    if (w->buf)
        CHECK_OK(fabpool_buffer_destroy(w->buf, NULL));
    for (int i = 0; i < NBLK; i++)
        if (w->blk[i])
            CHECK_OK(fabpool_free(w->p, w->blk[i]));
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
    memset(w, 0, sizeof *w);
}

static void say_ledger(const char *when, const fabsim_ledger *l, const fabsim_ledger *b)
{
    fprintf(stderr, "  %s the driver holds %lld mappings, %lld handles, %lld reservations, %lld device bytes, %lld "
            "host bytes more than before\n", when, (long long)(l->mappings - b->mappings),
            (long long)(l->handles - b->handles), (long long)(l->reservations - b->reservations),
            (long long)(l->bytes_held - b->bytes_held), (long long)(l->bytes_held_host - b->bytes_held_host));
}

/* ------------------------------------------------------------ a host copy's double fault */

enum { END_SLEEP, END_TRIM, END_DESTROY, N_ENDS };
static const char *const end_names[N_ENDS] = {"a sleep", "a trim", "the destroy"};

/* The pool of a trial: with keep, a round of sleep and wake first keeps host copies, and a new large block
 * changes the layout, so that the faulted sleep frees them and makes its copies anew. */
static int trial_world(world *w, int keep, uint64_t seed)
{
    if (build(w, keep ? "slab_max:1MiB,sleep_keep_host:1,reserve:4GiB" : "slab_max:1MiB,reserve:4GiB", seed) != 0)
        return -1;
    if (keep) {
        CHECK_OK(fabpool_sleep(w->p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(w->p, NULL));
        CHECK(t_sleep_info(w->p).host_bytes > 0);
        if (add_block(w, 3, 2 * MB + 8192) != 0)
            return -1;
    }
    return 0;
}

/* The access grant of host copy k refused, and every unmap: the rule above, ended by `end`. */
static void host_copy_trial(t_sim_hooks *h, int keep, uint64_t k, int end)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    if (trial_world(&w, keep, 700 + k) != 0) {
        CHECK(!"the pool could not be built");
        teardown(&w);
        return;
    }
    fabsim_ledger la = t_ledger(); /* the pool awake: its own reservation and mappings (and kept copies) */
    int fails0 = t_failures;
    /* the kept copies, which do not fit, are unmapped before any copy is made: the unmaps after those fail */
    uint64_t kept = t_sleep_info(w.p).host_copies;
    h->fault_set("cuMemSetAccess", k, 0, CUDA_ERROR_INVALID_VALUE);
    h->fault_set("cuMemUnmap", kept + 1, 1, CUDA_ERROR_INVALID_VALUE);
    fabpool_status st = fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL);
    h->fault_clear();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    CHECK(st != FABPOOL_OK && strstr(msg, "cuMemSetAccess") != NULL && strstr(msg, "host copy") != NULL);
    /* the message says that the driver kept it, and what frees it */
    CHECK(strstr(msg, "refused twice too") != NULL && strstr(msg, "stays mapped until") != NULL);
    CHECK(!t_sleep_info(w.p).asleep && all_intact(&w));
    CHECK_OK(fabpool_check(w.p));
    void *a = NULL;
    CHECK_OK(fabpool_alloc(w.p, 100, &a));
    CHECK_OK(fabpool_free(w.p, a));
    if (end == END_SLEEP) {
        /* what the failed sleep left goes: the sleeping pool holds its host copies and nothing else */
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        fabpool_sleep_info si = t_sleep_info(w.p);
        fabsim_ledger l = t_ledger();
        CHECK(si.asleep && t_mapped(w.p) == 0 && l.bytes_held == l0.bytes_held);
        CHECK(l.bytes_held_host - l0.bytes_held_host == si.host_bytes && l.mappings - l0.mappings == si.host_copies);
        CHECK(l.reservations == l0.reservations + 2); /* the pool's, its host copies' */
        if (l.mappings - l0.mappings != si.host_copies || l.reservations != l0.reservations + 2)
            say_ledger("asleep,", &l, &l0);
        CHECK_OK(fabpool_check(w.p));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(!t_sleep_info(w.p).asleep && all_intact(&w));
    } else if (end == END_TRIM) {
        /* a trim frees every host copy and reservation the failed sleep left */
        CHECK_OK(fabpool_trim(w.p, 0));
        fabsim_ledger l = t_ledger();
        CHECK(t_sleep_info(w.p).host_bytes == 0 && l.bytes_held_host == l0.bytes_held_host);
        CHECK(l.reservations == l0.reservations + 1 && l.bytes_held - l0.bytes_held == t_mapped(w.p));
        if (l.reservations != l0.reservations + 1 || l.bytes_held_host != l0.bytes_held_host)
            say_ledger("after the trim", &l, &la);
        CHECK_OK(fabpool_check(w.p));
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(w.p, NULL));
        CHECK(all_intact(&w));
    }
    teardown(&w);
    fabsim_ledger l = t_ledger();
    CHECK(t_ledger_same(&l, &l0));
    if (!t_ledger_same(&l, &l0))
        say_ledger("after destroy", &l, &l0);
    if (t_failures != fails0)
        fprintf(stderr, "  host copy %llu's access grant and every unmap refused%s, ended by %s: %s\n",
                (unsigned long long)k, keep ? " (sleep_keep_host)" : "", end_names[end], msg);
}

/* The host copies an offload of the trial's pool makes (calls of cuMemSetAccess). */
static uint64_t host_copies_made(t_sim_hooks *h, int keep)
{
    world w;
    uint64_t n = 0;
    if (trial_world(&w, keep, 1) == 0) {
        uint64_t c0 = h->calls("cuMemSetAccess");
        CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
        n = h->calls("cuMemSetAccess") - c0;
        CHECK_OK(fabpool_wake(w.p, NULL));
    } else {
        CHECK(!"the pool could not be built");
    }
    teardown(&w);
    return n;
}

static void host_copy_double_fault_keeps_mapping(t_sim_hooks *h)
{
    for (int keep = 0; keep < 2; keep++) {
        uint64_t n = host_copies_made(h, keep);
        CHECK(n >= 3); /* a first, a middle and a last host copy */
        for (uint64_t k = 1; k <= n; k++)
            for (int end = 0; end < N_ENDS; end++)
                host_copy_trial(h, keep, k, end);
    }
}

/* ------------------------------------------------------------ a pool's stuck mapping at sleep */

static void sleep_unmaps_stuck_mapping_first(t_sim_hooks *h)
{
    fabsim_ledger l0 = t_ledger();
    world w;
    if (build(&w, "max_chunk:8MiB,handle_type:none,reserve:4GiB", 900) != 0) {
        CHECK(!"the pool could not be built");
        teardown(&w);
        return;
    }
    /* a grow whose chunk's access grant is refused, and its unmap: the driver keeps that chunk mapped */
    fabpool_buffer_t *g = NULL;
    CHECK_OK(fabpool_buffer_create(w.p, 64 * MB, 8 * MB, &g));
    uint64_t m0 = t_mapped(w.p);
    h->fault_set("cuMemSetAccess", 1, 0, CUDA_ERROR_INVALID_VALUE);
    h->fault_set("cuMemUnmap", 1, 1, CUDA_ERROR_INVALID_VALUE);
    CHECK(fabpool_buffer_resize(g, 16 * MB, NULL) != FABPOOL_OK);
    h->fault_clear();
    uint64_t m1 = t_mapped(w.p);
    CHECK(m1 > m0 && t_ledger().bytes_held - l0.bytes_held == m1); /* the stuck chunk, counted as mapped */
    CHECK_OK(fabpool_check(w.p));
    /* the driver refuses its unmap again: the sleep fails with the pool awake, nothing changed */
    h->fault_set("cuMemUnmap", 1, 1, CUDA_ERROR_INVALID_VALUE);
    fabpool_status st = fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL);
    h->fault_clear();
    const char *msg = fabpool_last_error();
    CHECK(st != FABPOOL_OK && strstr(msg, "would not unmap") != NULL && strstr(msg, "fabpool_sleep") != NULL &&
          strstr(msg, "nothing changed") != NULL);
    if (st == FABPOOL_OK || strstr(msg, "nothing changed") == NULL)
        fprintf(stderr, "  the sleep over a stuck mapping answered %s: %s\n", fabpool_status_name(st), msg);
    fabpool_sleep_info si = t_sleep_info(w.p);
    CHECK(!si.asleep && si.host_bytes == 0 && t_mapped(w.p) == m1 && all_intact(&w));
    CHECK(t_ledger().bytes_held_host == l0.bytes_held_host);
    CHECK_OK(fabpool_check(w.p));
    /* the driver well: the sleep unmaps it first, and the sleeping pool holds no device memory at all */
    CHECK_OK(fabpool_sleep(w.p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK(t_sleep_info(w.p).asleep && t_mapped(w.p) == 0 && t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_check(w.p));
    CHECK_OK(fabpool_wake(w.p, NULL));
    CHECK(all_intact(&w) && t_mapped(w.p) == m0 && t_ledger().bytes_held - l0.bytes_held == m0);
    CHECK_OK(fabpool_check(w.p));
    CHECK_OK(fabpool_buffer_resize(g, 16 * MB, NULL));
    CHECK_OK(fabpool_buffer_destroy(g, NULL));
    teardown(&w);
    fabsim_ledger l = t_ledger();
    CHECK(t_ledger_same(&l, &l0));
    if (!t_ledger_same(&l, &l0))
        say_ledger("after destroy", &l, &l0);
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_sleep_double_fault", "faults");
    host_copy_double_fault_keeps_mapping(&h);
    sleep_unmaps_stuck_mapping_first(&h);
    return t_done("test_sleep_double_fault");
}
