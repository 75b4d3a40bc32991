/* test_symm_faults: the symmetric buffer (symm.c) under driver faults, on the simulated driver, over 2 to 4
 * forked ranks whose parent is the group's all-gather (a hub over a socket pair per rank).  The rule checked
 * (symm.h): after any resize, failed or not, no rank's view maps memory that its peer's buffer does not have:
 * after every call every rank writes words of (rank, step) into its buffer, one every MiB and its last, and
 * reads every peer's through its view over min(the view's size, the peer's size).
 *
 * Cases (2 ranks):
 *   shrink_fails  both at 64 MiB ask 8 MiB, rank 1's shrink fails (cuCtxGetCurrent): rank 0's had refit its
 *                 chunk, and its rollback grew new memory behind it; every rank answers the error, keeps
 *                 64 MiB, and reads what its peer writes afterwards through a view of the whole 64 MiB;
 *   apply_fails   both shrink to 8 MiB, rank 1 cannot import rank 0's refit chunk: the buffers have 8 MiB,
 *                 rank 1's view of rank 0 maps nothing (size 0) instead of the chunk rank 0 gave up, and the
 *                 next resize maps it again;
 *   grow_fails    the controls: a grow that fails on rank 1 (cuMemCreate), and a grow whose new chunk rank 1
 *                 cannot import (its view stays as it was, shorter, and reads rank 0's bytes);
 *   refit_lost    rank 1's shrink loses the chunk it refits (the smaller chunk and then the old one refused):
 *                 every rank answers FABPOOL_ERR_PARTIAL, keeps 64 MiB and reads what its peer writes.
 * prop [first seeds steps [twice]]: seeded random resizes (grow, shrink, the same size; each rank asks its own share)
 * with a fault injected on one rank at random steps (a driver entry the resize or the exchange calls, failing
 * at its nth call); after every call: every rank answers the same status, the sizes every rank reports are
 * equal (the largest asked after a success), no address moved, every view reads its peer's words as above and
 * after a success covers the whole size; after close the driver holds nothing (the sim's ledger).  A call that
 * breaks the object (every rank says so) ends the seed.  "twice": now and then a second entry of the same
 * rank fails too (at a later call), also inside what mends the first failure.  The seed picks 2, 3 or 4 ranks, the handle type is
 * the environment's (the _fabric test: fabric handles). */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "symm.h"
#include "symm_group.h"

#define MB (1ull << 20)
#define MB (1ull << 20)
#define MAX_BYTES (64 * MB)

static void barrier(grp *g)
{
    uint8_t b = 0, all[MAXR];
    CHECK(allgather(g, &b, all, 1) == 0);
}

static fabpool_torch_symm_t *make(grp *g, uint64_t bytes)
{
    fabpool_torch_symm_options o = symm_group_options(g, allgather, MAX_BYTES, bytes);
    o.timeout_ms = 5000;
    return symm_group_create(g, &o);
}

/* ------------------------------------------------------------------ words */

static uint64_t word(int rank, long step, uint64_t off)
{
    return ((uint64_t)(rank + 1) << 56) ^ ((uint64_t)step << 32) ^ off ^ 0x5a5a;
}

/* The offsets of the words of a buffer of `size` bytes: one every MiB, and its last. */
static int n_words(uint64_t size) { return size < 8 ? 0 : (int)((size - 8) / MB) + 2; }
static uint64_t word_off(uint64_t size, int k) { return k == n_words(size) - 1 ? size - 8 : (uint64_t)k * MB; }

/* 0, or 1 where this rank's own buffer did not take a word (it does not map its whole size). */
static int write_words(uint64_t base, uint64_t size, int rank, long step)
{
    int bad = 0;
    for (int k = 0; k < n_words(size); k++) {
        uint64_t off = word_off(size, k), v = word(rank, step, off);
        CUresult r = cuMemcpyHtoD((CUdeviceptr)(base + off), &v, 8);
        if (r != CUDA_SUCCESS && !bad++)
            fprintf(stderr, "rank %d, step %ld: its own buffer of %llu bytes does not take a word at +%llu (cu %d)\n",
                    rank, step, (unsigned long long)size, (unsigned long long)off, (int)r);
    }
    CHECK_CU(cuCtxSynchronize()); /* other processes see it only then */
    return bad != 0;
}

/* Rank q's words of `step` through the view at base, over `len` bytes of the peer's `size`: the words that lie
 * there.  Prints the first wrong one; 0 if all are right. */
static int view_wrong(int rank, int q, uint64_t base, uint64_t len, uint64_t size, long step, const char *when)
{
    for (int k = 0; k < n_words(size); k++) {
        uint64_t off = word_off(size, k), v = 0;
        if (off + 8 > len)
            continue;
        CUresult r = cuMemcpyDtoH(&v, (CUdeviceptr)(base + off), 8);
        if (r != CUDA_SUCCESS || v != word(q, step, off)) {
            fprintf(stderr, "rank %d, %s: its view of rank %d (%llu of %llu bytes) at +%llu reads 0x%016llx (cu %d), "
                    "rank %d wrote 0x%016llx\n", rank, when, q, (unsigned long long)len, (unsigned long long)size,
                    (unsigned long long)off, (unsigned long long)v, (int)r, q,
                    (unsigned long long)word(q, step, off));
            return 1;
        }
    }
    return 0;
}

/* Every rank writes its words of `step` over `size`, then reads every peer's through its views.  The views
 * that read wrong. */
static int views_check(fabpool_torch_symm_t *s, grp *g, uint64_t size, long step, const char *when)
{
    uint64_t ptrs[MAXR], sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs, MAXR));
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    int wrong = write_words(ptrs[g->rank], size, g->rank, step);
    barrier(g);
    for (int q = 0; q < g->n; q++)
        if (q != g->rank)
            wrong += view_wrong(g->rank, q, ptrs[q], sizes[q] < size ? sizes[q] : size, size, step, when);
    barrier(g);
    return wrong;
}

static uint64_t info_size(fabpool_torch_symm_t *s)
{
    fabpool_torch_symm_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_torch_symm_get_info(s, &in));
    return in.size;
}

static void ledger_empty(int rank, const char *when)
{
    if (!t_ledger_p)
        return;
    fabsim_ledger l = t_ledger();
    if (l.bytes_held || l.mappings || l.handles || l.exported_fds || l.reservations)
        fprintf(stderr, "rank %d, %s: the driver holds %llu bytes, %llu mappings, %llu handles, %llu exported fds, "
                "%llu reservations\n", rank, when, (unsigned long long)l.bytes_held, (unsigned long long)l.mappings,
                (unsigned long long)l.handles, (unsigned long long)l.exported_fds, (unsigned long long)l.reservations);
    CHECK(l.bytes_held == 0 && l.mappings == 0 && l.handles == 0 && l.exported_fds == 0 && l.reservations == 0);
}

/* ------------------------------------------------------------------ cases */

/* A resize with rank `who`'s driver entry failing at its nth call from now; the status. */
static fabpool_status resize_faulted(fabpool_torch_symm_t *s, grp *g, uint64_t bytes, int who, const char *entry,
                                     uint64_t nth, int err)
{
    t_sim_hooks h = t_sim_hooks_get();
    if (g->rank == who)
        CHECK(h.fault_set(entry, nth, 0, err) == 0);
    fabpool_status st = fabpool_torch_symm_resize(s, bytes);
    if (g->rank == who)
        h.fault_clear();
    return st;
}

static void case_shrink_fails(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 64 * MB);
    if (!s)
        return;
    CHECK(views_check(s, g, 64 * MB, 1, "before the shrink") == 0);
    fabpool_status st = resize_faulted(s, g, 8 * MB, 1, "cuCtxGetCurrent", 1, CUDA_ERROR_UNKNOWN);
    CHECK(st == FABPOOL_ERR_DRIVER);
    CHECK(strstr(fabpool_torch_symm_last_error(), "rank 1") != NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "every rank keeps its old size") != NULL);
    CHECK(info_size(s) == 64 * MB);
    uint64_t sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    CHECK(sizes[0] == 64 * MB && sizes[1] == 64 * MB); /* every view was brought to its peer's new chunks */
    CHECK(views_check(s, g, 64 * MB, 2, "after the failed shrink") == 0);
    CHECK_OK(fabpool_torch_symm_resize(s, 8 * MB));
    CHECK(views_check(s, g, 8 * MB, 3, "after the next shrink") == 0);
    CHECK_OK(fabpool_torch_symm_close(s));
    ledger_empty(g->rank, "after close");
}

/* Rank 1's shrink refits its last chunk, and the driver refuses to map the smaller chunk (cuMemSetAccess) and
 * then the old one back (cuMemMap): its buffer loses the chunk (FABPOOL_ERR_PARTIAL, its size where the chunk
 * began).  Every rank answers that, goes back to 64 MiB and exchanges again: every view reads its peer. */
static void case_refit_lost(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 64 * MB);
    if (!s)
        return;
    CHECK(views_check(s, g, 64 * MB, 1, "before the shrink") == 0);
    t_sim_hooks h = t_sim_hooks_get();
    if (g->rank == 1) {
        CHECK(h.fault_set("cuMemSetAccess", 2, 0, CUDA_ERROR_UNKNOWN) == 0);
        CHECK(h.fault_set("cuMemMap", 3, 0, CUDA_ERROR_UNKNOWN) == 0);
    }
    fabpool_status st = fabpool_torch_symm_resize(s, 30 * MB);
    if (g->rank == 1)
        h.fault_clear();
    if (st != FABPOOL_ERR_PARTIAL)
        fprintf(stderr, "rank %d: the shrink answered %s: %s\n", g->rank, fabpool_status_name(st),
                fabpool_torch_symm_last_error());
    CHECK(st == FABPOOL_ERR_PARTIAL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "rank 1") != NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "every rank keeps its old size") != NULL);
    CHECK(info_size(s) == 64 * MB);
    uint64_t sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    CHECK(sizes[0] == 64 * MB && sizes[1] == 64 * MB);
    CHECK(views_check(s, g, 64 * MB, 2, "after the lost chunk") == 0);
    CHECK_OK(fabpool_torch_symm_resize(s, 30 * MB));
    CHECK(views_check(s, g, 30 * MB, 3, "after the next shrink") == 0);
    CHECK_OK(fabpool_torch_symm_close(s));
    ledger_empty(g->rank, "after close");
}

static void case_apply_fails(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 64 * MB);
    if (!s)
        return;
    CHECK(views_check(s, g, 64 * MB, 1, "before the shrink") == 0);
    fabpool_status st = resize_faulted(s, g, 8 * MB, 1, "cuMemImportFromShareableHandle", 1, CUDA_ERROR_UNKNOWN);
    CHECK(st == FABPOOL_ERR_DRIVER);
    CHECK(strstr(fabpool_torch_symm_last_error(), "rank 1") != NULL);
    CHECK(info_size(s) == 8 * MB);
    uint64_t sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    if (g->rank == 1) /* rank 0's refit chunk could not come: the chunk it gave up is not mapped either */
        CHECK(sizes[0] == 0);
    else
        CHECK(sizes[1] >= 8 * MB); /* a view covers what its peer maps: its size and the hysteresis */
    CHECK(views_check(s, g, 8 * MB, 2, "after the failed apply") == 0);
    CHECK_OK(fabpool_torch_symm_resize(s, 8 * MB)); /* the same size: brings the view that fell behind back */
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    CHECK(sizes[1 - g->rank] >= 8 * MB);
    CHECK(views_check(s, g, 8 * MB, 3, "after the next resize") == 0);
    CHECK_OK(fabpool_torch_symm_close(s));
    ledger_empty(g->rank, "after close");
}

static void case_grow_fails(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 8 * MB);
    if (!s)
        return;
    CHECK(views_check(s, g, 8 * MB, 1, "before the grow") == 0);
    /* rank 1 cannot grow: every rank keeps 8 MiB, every view reads its peer */
    fabpool_status st = resize_faulted(s, g, 64 * MB, 1, "cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(st == FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK(strstr(fabpool_torch_symm_last_error(), "every rank keeps its old size") != NULL);
    CHECK(info_size(s) == 8 * MB);
    CHECK(views_check(s, g, 8 * MB, 2, "after the failed grow") == 0);
    /* rank 1 cannot import rank 0's new chunk: the buffers have 64 MiB, rank 1's view of rank 0 keeps its
     * 8 MiB (still rank 0's memory: a grow adds behind it) */
    st = resize_faulted(s, g, 64 * MB, 1, "cuMemImportFromShareableHandle", 1, CUDA_ERROR_UNKNOWN);
    CHECK(st == FABPOOL_ERR_DRIVER);
    CHECK(info_size(s) == 64 * MB);
    uint64_t sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    if (g->rank == 1)
        CHECK(sizes[0] >= 8 * MB && sizes[0] < 64 * MB);
    else
        CHECK(sizes[1] == 64 * MB);
    CHECK(views_check(s, g, 64 * MB, 3, "after the failed import of a grow") == 0);
    CHECK_OK(fabpool_torch_symm_resize(s, 64 * MB));
    CHECK(views_check(s, g, 64 * MB, 4, "after the next resize") == 0);
    CHECK_OK(fabpool_torch_symm_close(s));
    ledger_empty(g->rank, "after close");
}

/* ------------------------------------------------------------------ property */

typedef struct prop {
    uint64_t seed;
    long steps;
    int twice; /* a second fault now and then */
} prop;

static uint64_t rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t z = *x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The driver entries a resize and its exchange call, and the error each fails with. */
static const struct {
    const char *entry;
    int err;
} k_faults[] = {
    {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY},   {"cuMemMap", CUDA_ERROR_UNKNOWN},
    {"cuMemSetAccess", CUDA_ERROR_UNKNOWN},      {"cuMemUnmap", CUDA_ERROR_UNKNOWN},
    {"cuMemRelease", CUDA_ERROR_UNKNOWN},        {"cuCtxGetCurrent", CUDA_ERROR_UNKNOWN},
    {"cuCtxSynchronize", CUDA_ERROR_UNKNOWN},    {"cuMemcpyDtoDAsync", CUDA_ERROR_UNKNOWN},
    {"cuMemExportToShareableHandle", CUDA_ERROR_UNKNOWN},
    {"cuMemImportFromShareableHandle", CUDA_ERROR_UNKNOWN},
    {"cuMemRetainAllocationHandle", CUDA_ERROR_UNKNOWN},
};
#define N_FAULTS (sizeof k_faults / sizeof k_faults[0])

/* What every rank says after a call, all-gathered and compared. */
typedef struct said {
    int32_t status, broken;
    uint64_t size;
} said;

static void case_prop(grp *g, void *arg)
{
    const prop *p = arg;
    uint64_t x = p->seed * 0x9e3779b97f4a7c15ull + 7; /* the same sequence on every rank */
    const char *fail_at = NULL;
    char where[256];
    uint64_t size = (rnd(&x) % 64 + 1) * MB;
    fabpool_torch_symm_t *s = make(g, g->rank == 0 ? size : 0);
    if (!s)
        return;
    uint64_t ptrs0[MAXR] = {0}, ptrs[MAXR] = {0}, sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs0, MAXR));
    t_sim_hooks h = t_sim_hooks_get();
    for (long step = 1; step <= p->steps && !fail_at; step++) {
        int kind = (int)(rnd(&x) % 8);
        uint64_t want = kind == 0 ? size : kind < 4 ? (rnd(&x) % 64 + 1) * MB : (rnd(&x) % (MAX_BYTES / 4096)) * 4096 + 4096;
        int asker = (int)(rnd(&x) % (uint64_t)g->n);
        uint64_t share = (rnd(&x) >> (8 * g->rank)) % 3; /* each rank's own, from one draw of every rank */
        uint64_t mine = g->rank == asker ? want : share == 0 ? 0 : share == 1 ? want / 2 : want;
        int faulty = rnd(&x) % 2 == 0, who = (int)(rnd(&x) % (uint64_t)g->n);
        size_t f = (size_t)(rnd(&x) % N_FAULTS);
        uint64_t nth = rnd(&x) % 4 + 1;
        /* with "twice", now and then a second entry fails too, so that what mends the first failure meets one */
        size_t f2 = (size_t)(rnd(&x) % N_FAULTS);
        uint64_t nth2 = rnd(&x) % 8 + 1;
        int twice = rnd(&x) % 4 == 0 && p->twice && faulty && f2 != f;
        if (faulty && g->rank == who)
            CHECK(h.fault_set(k_faults[f].entry, nth, 0, k_faults[f].err) == 0);
        if (twice && g->rank == who)
            CHECK(h.fault_set(k_faults[f2].entry, nth2, 0, k_faults[f2].err) == 0);
        fabpool_status st = fabpool_torch_symm_resize(s, mine);
        if (faulty && g->rank == who)
            h.fault_clear();
        snprintf(where, sizeof where, "seed %llu step %ld (%d ranks, %llu bytes asked by rank %d%s%s at call %llu%s%s "
                 "at call %llu of rank %d)", (unsigned long long)p->seed, step, g->n, (unsigned long long)want, asker,
                 faulty ? ", fault " : "", faulty ? k_faults[f].entry : "", (unsigned long long)nth,
                 twice ? " and " : "", twice ? k_faults[f2].entry : "", (unsigned long long)nth2, who);
        said me = {(int32_t)st, 0, info_size(s)}, all[MAXR];
        fabpool_torch_symm_info in = {.struct_size = sizeof in};
        CHECK_OK(fabpool_torch_symm_get_info(s, &in));
        /* a broken object refuses every call but close: a resize of 0 bytes is refused first without a round */
        me.broken = st != FABPOOL_OK && strstr(fabpool_torch_symm_last_error(), "only close is left") != NULL;
        char msg[600];
        snprintf(msg, sizeof msg, "%s", fabpool_torch_symm_last_error());
        CHECK(allgather(g, &me, all, sizeof me) == 0);
        for (int q = 0; q < g->n; q++)
            if (all[q].status != me.status || all[q].broken != me.broken || (!me.broken && all[q].size != me.size)) {
                fprintf(stderr, "rank %d, %s: rank %d says %s%s, %llu bytes; this rank %s%s, %llu bytes: %s\n",
                        g->rank, where, q, fabpool_status_name((fabpool_status)all[q].status),
                        all[q].broken ? " (broken)" : "", (unsigned long long)all[q].size,
                        fabpool_status_name(st), me.broken ? " (broken)" : "", (unsigned long long)me.size, msg);
                fail_at = "the ranks disagree";
            }
        if (fail_at || me.broken)
            break;
        if (st == FABPOOL_OK && me.size != want) {
            fprintf(stderr, "rank %d, %s: size %llu after a success\n", g->rank, where, (unsigned long long)me.size);
            fail_at = "size";
        }
        size = me.size;
        CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs, MAXR));
        CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
        if (memcmp(ptrs, ptrs0, sizeof ptrs) != 0)
            fail_at = "an address moved";
        for (int q = 0; st == FABPOOL_OK && q < g->n; q++)
            if (sizes[q] < size) {
                fprintf(stderr, "rank %d, %s: after a success its view of rank %d has %llu of %llu bytes\n", g->rank,
                        where, q, (unsigned long long)sizes[q], (unsigned long long)size);
                fail_at = "a view short after a success";
            }
        if (views_check(s, g, size, step, where))
            fail_at = "a view reads what its peer did not write";
        if (st != FABPOOL_OK && getenv("SYMM_FAULTS_VERBOSE"))
            printf("rank %d, %s: %s: %s\n", g->rank, where, fabpool_status_name(st), msg);
    }
    if (fail_at) {
        fprintf(stderr, "rank %d: %s: %s\n", g->rank, where, fail_at);
        t_failures++;
    }
    CHECK_OK(fabpool_torch_symm_close(s));
    ledger_empty(g->rank, where);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* the last round's answer goes to ranks that have left */
    const char *only = argc > 1 ? argv[1] : NULL;
    int failed = 0;
    static const struct {
        const char *name;
        void (*fn)(grp *, void *);
    } cases[] = {{"shrink_fails", case_shrink_fails}, {"apply_fails", case_apply_fails},
                 {"grow_fails", case_grow_fails}, {"refit_lost", case_refit_lost}};
    if (!only || strcmp(only, "prop") != 0) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (only && strcmp(only, cases[c].name) != 0)
                continue;
            int f = run_group(2, cases[c].fn, NULL);
            printf("test_symm_faults %s: %d ranks failed\n", cases[c].name, f);
            failed += f;
        }
        return failed ? 1 : 0;
    }
    uint64_t first = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    long seeds = argc > 3 ? atol(argv[3]) : 20, steps = argc > 4 ? atol(argv[4]) : 30;
    int twice = argc > 5 && strcmp(argv[5], "twice") == 0;
    int bad = 0;
    for (long k = 0; k < seeds; k++) {
        prop p = {first + (uint64_t)k, steps, twice};
        int n = 2 + (int)(p.seed % 3);
        int f = run_group(n, case_prop, &p);
        if (f) {
            printf("test_symm_faults prop: seed %llu (%d ranks): %d ranks failed\n", (unsigned long long)p.seed, n, f);
            bad++;
        }
    }
    printf("test_symm_faults prop: seeds %llu..%llu, %ld steps each: %d seeds failed\n", (unsigned long long)first,
           (unsigned long long)(first + (uint64_t)seeds - 1), steps, bad);
    return bad ? 1 : 0;
}
