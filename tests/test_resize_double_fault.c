/* test_resize_double_fault: a set resize where a driver call fails and so does what undoes it.
 *
 * Every pair of driver calls that a set resize makes (with a refit: a shrunk buffer's last chunk replaced by a
 * smaller one) is made to fail together, the same entry twice included (every call of it from the first on,
 * but for the releases of handles and address ranges: where all of those fail, the driver keeps them by
 * definition; every unmap may fail, the refit's copy's included, and the collect of the destroy unmaps them);
 * and every call made with every unmap from the first on failing too (a map whose undo the driver refuses:
 * the mapping it keeps must stay the pool's, so that a collect unmaps it and nothing is mapped over it).
 * After each call the rule is checked:
 *  - FABPOOL_OK: every buffer has its new size and keeps its data;
 *  - FABPOOL_ERR_PARTIAL (the refit's new chunk and then the old one mapped back both refused): the buffer that
 *    lost its chunk counts only what it maps: its size and mapped bytes end where that chunk began, every byte
 *    below its size is mapped and keeps its data, its generation is new (a peer's view applies the delta and
 *    reads what the buffer holds); every other buffer has its new size; the pool's in-use bytes are the sizes;
 *  - any other error: nothing a caller can see changed (sizes, mapped bytes, chunk counts, generations, data).
 * Then, with the driver well: fabpool_check passes, the set resizes again and every byte of it takes a word,
 * a view follows, everything is destroyed and the driver holds nothing (the sim's ledger). */
#include "testutil.h"
#include "driver_calls.h"

#define MB (1ull << 20)

enum { NSET = 2 };

typedef struct scenario {
    const char *name, *conf;
    size_t max[NSET], from[NSET], to[NSET];
    int on_stream;                     /* the set resizes on a stream (else NULL: synchronized) */
    int viewed;                        /* buffer 1 is exported and viewed from a second pool */
} scenario;

/* Each pool reserves 4 GiB, not the default 8x the device: valgrind's memcheck, which runs this test in CI, gives
 * a process far less address space than the kernel does, and after some hundreds of worlds a pool's default
 * reservation (48 GiB on its 6 GiB device) no longer found a hole that large there. */
static const scenario scenarios[] = {
    /* buffer 1: 16 MiB in two chunks of 8 MiB; 9 MiB refits the second one (it would lose it at 8 MiB) */
    {"one grows, one refits its second chunk", "max_chunk:8MiB,handle_type:none,reserve:4GiB", {8 * MB, 16 * MB},
     {1 * MB, 16 * MB}, {4 * MB, 9 * MB}, 0, 0},
    {"one grows, one refits its second chunk, on a stream", "max_chunk:8MiB,handle_type:none,reserve:4GiB",
     {8 * MB, 16 * MB}, {1 * MB, 16 * MB}, {4 * MB, 9 * MB}, 1, 0},
    /* both refit their only chunk: a buffer that loses it keeps no byte */
    {"both refit their only chunk", "max_chunk:8MiB,handle_type:none,reserve:4GiB", {8 * MB, 6 * MB}, {8 * MB, 6 * MB},
     {2 * MB, 1 * MB}, 0, 0},
    {"one grows, one refits its second chunk, viewed by a peer", "max_chunk:8MiB,handle_type:auto,reserve:4GiB",
     {8 * MB, 16 * MB}, {1 * MB, 16 * MB}, {4 * MB, 9 * MB}, 0, 1},
};

typedef struct world {
    fabsim_ledger before;              /* what the driver held before the trial */
    fabpool_t *p, *q;                  /* q: the peer's pool, for the view */
    fabpool_buffer_t *b[NSET];
    fabpool_view_t *v;
    CUstream s;
    fabpool_buffer_info info[NSET];
} world;

static fabpool_buffer_info info_of(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i;
}

static unsigned char fill_of(int i) { return (unsigned char)(0x11 * (i + 1)); }

/* The offsets checked in n bytes: one every MiB, and the last byte. */
static int n_probes(size_t n) { return n ? (int)((n - 1) / MB) + 2 : 0; }
static size_t probe(size_t n, int k) { return k == n_probes(n) - 1 ? n - 1 : (size_t)k * MB; }

/* Whether the n bytes at base hold v where probed (all mapped). */
static int holds(uint64_t base, size_t n, unsigned char v)
{
    for (int k = 0; k < n_probes(n); k++) {
        unsigned char got = (unsigned char)~v;
        if (cuMemcpyDtoH(&got, (CUdeviceptr)(base + probe(n, k)), 1) != CUDA_SUCCESS || got != v)
            return 0;
    }
    return 1;
}

/* Whether every probed byte of the n bytes at base takes v (all mapped). */
static int takes(uint64_t base, size_t n, unsigned char v)
{
    for (int k = 0; k < n_probes(n); k++)
        if (cuMemsetD8((CUdeviceptr)(base + probe(n, k)), v, 1) != CUDA_SUCCESS)
            return 0;
    return holds(base, n, v);
}

/* Every byte that holds() may probe in a prefix of the n bytes at base (n and every prefix checked a whole number
 * of MiB: the first and the last byte of each MiB) takes v.  Only those: writing every byte of every trial's
 * buffers faulted in some 3.5 million host pages of the simulated driver's memory, a minute of the test's time. */
static int fill_probed(uint64_t base, size_t n, unsigned char v)
{
    for (size_t at = 0; at < n; at += MB)
        if (cuMemsetD8((CUdeviceptr)(base + at), v, 1) != CUDA_SUCCESS ||
            cuMemsetD8((CUdeviceptr)(base + (at + MB < n ? at + MB : n) - 1), v, 1) != CUDA_SUCCESS)
            return 0;
    return 1;
}

static uint64_t ptr_of(fabpool_buffer_t *b) { return (uint64_t)(uintptr_t)fabpool_buffer_ptr(b); }

/* The view of buffer 1 brought to the buffer's chunks (a delta since what it maps), then acknowledged. */
static int view_follows(world *w)
{
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    CHECK_OK(fabpool_view_get_info(w->v, &vi));
    static unsigned char desc[1 << 16];
    int fds[64];
    size_t len = 0, nfds = 0;
    if (fabpool_buffer_export(w->b[1], vi.generation, desc, sizeof desc, &len, fds, 64, &nfds) != FABPOOL_OK)
        return -1;
    int mine[64];
    for (size_t i = 0; i < nfds; i++)
        mine[i] = dup(fds[i]);
    fabpool_status st = fabpool_view_apply(w->v, desc, len, mine, nfds);
    CHECK_OK(fabpool_buffer_export_done(w->b[1]));
    if (st != FABPOOL_OK)
        return -1;
    fabpool_buffer_info bi = info_of(w->b[1]);
    CHECK_OK(fabpool_view_get_info(w->v, &vi));
    CHECK_OK(fabpool_buffer_peers_ack(w->b[1], bi.generation));
    return vi.generation == bi.generation && vi.mapped == bi.mapped ? 0 : -1;
}

static int build(world *w, const scenario *sc)
{
    memset(w, 0, sizeof *w);
    w->before = t_ledger();
    w->p = t_pool(sc->conf);
    if (!w->p || cuStreamCreate(&w->s, 0) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < NSET; i++) {
        if (fabpool_buffer_create(w->p, sc->max[i], sc->from[i], &w->b[i]) != FABPOOL_OK)
            return -1;
        CHECK(fill_probed(ptr_of(w->b[i]), sc->from[i], fill_of(i)));
    }
    if (sc->viewed) {
        w->q = t_pool("handle_type:auto,reserve:4GiB");
        if (!w->q || fabpool_handle_type_of(w->p) == FABPOOL_HANDLE_NONE)
            return -1;
        static unsigned char desc[1 << 16];
        int fds[64], mine[64];
        size_t len = 0, nfds = 0;
        if (fabpool_buffer_export(w->b[1], 0, desc, sizeof desc, &len, fds, 64, &nfds) != FABPOOL_OK)
            return -1;
        for (size_t i = 0; i < nfds; i++)
            mine[i] = dup(fds[i]);
        if (fabpool_view_open(w->q, desc, len, mine, nfds, &w->v) != FABPOOL_OK)
            return -1;
        CHECK_OK(fabpool_buffer_export_done(w->b[1]));
        CHECK_OK(fabpool_buffer_peers_ack(w->b[1], info_of(w->b[1]).generation));
    }
    for (int i = 0; i < NSET; i++)
        w->info[i] = info_of(w->b[i]);
    return 0;
}

/* 0, or -1 where the driver still holds something of the trial. */
static int unbuild(world *w)
{
    if (w->v)
        CHECK_OK(fabpool_view_close(w->v));
    for (int i = 0; i < NSET; i++) {
        if (!w->b[i])
            continue;
        if (w->v)
            CHECK_OK(fabpool_buffer_peers_ack(w->b[i], UINT64_MAX));
        CHECK_OK(fabpool_buffer_destroy(w->b[i], NULL));
    }
    if (w->s)
        cuStreamDestroy(w->s);
    if (w->q)
        CHECK_OK(fabpool_destroy(w->q));
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
    fabsim_ledger l = t_ledger(), b = w->before; /* nothing of the trial is left with the driver */
    if (l.bytes_held != b.bytes_held || l.mappings != b.mappings || l.handles != b.handles ||
        l.exported_fds != b.exported_fds || l.reservations != b.reservations) {
        fprintf(stderr, "  after the trial the driver holds %lld bytes, %lld mappings, %lld handles, %lld exported "
                "fds, %lld reservations more than before\n", (long long)(l.bytes_held - b.bytes_held),
                (long long)(l.mappings - b.mappings), (long long)(l.handles - b.handles),
                (long long)(l.exported_fds - b.exported_fds), (long long)(l.reservations - b.reservations));
        return -1;
    }
    return 0;
}

static fabpool_status run_set(world *w, const scenario *sc)
{
    return fabpool_buffer_resize_set(w->b, sc->to, NSET, sc->on_stream ? (void *)w->s : NULL);
}

static int n_trials, n_ok, n_partial, n_refused;

/* The rule after a call that answered st: 0 if it holds. */
static int rule_broken(world *w, const scenario *sc, fabpool_status st)
{
    int bad = 0, short_ = 0;
    uint64_t sum = 0;
    for (int i = 0; i < NSET; i++) {
        fabpool_buffer_info a = info_of(w->b[i]), b0 = w->info[i];
        size_t keep = sc->to[i] < sc->from[i] ? sc->to[i] : sc->from[i];
        sum += a.size;
        if (st == FABPOOL_OK) {
            bad |= a.size != sc->to[i] || a.mapped < a.size || !holds(ptr_of(w->b[i]), keep, fill_of(i));
        } else if (st == FABPOOL_ERR_PARTIAL) {
            /* its size is what it maps, at most what was asked; below it the data stays */
            int lost = a.size != sc->to[i];
            short_ |= lost;
            bad |= a.size > sc->to[i] || a.mapped < a.size || (lost && a.mapped != a.size) ||
                   (lost && a.generation == b0.generation) ||
                   !holds(ptr_of(w->b[i]), a.size < keep ? a.size : keep, fill_of(i));
        } else {
            bad |= a.size != b0.size || a.mapped != b0.mapped || a.n_chunks != b0.n_chunks ||
                   a.generation != b0.generation || !holds(ptr_of(w->b[i]), b0.size, fill_of(i));
        }
        if (bad)
            fprintf(stderr, "  buffer %d: size %zu -> %zu (asked %zu), mapped %zu -> %zu, chunks %u -> %u, "
                    "generation %llu -> %llu\n", i, b0.size, a.size, sc->to[i], b0.mapped, a.mapped, b0.n_chunks,
                    a.n_chunks, (unsigned long long)b0.generation, (unsigned long long)a.generation);
    }
    if (st == FABPOOL_ERR_PARTIAL)
        bad |= !short_ || strstr(fabpool_last_error(), "lost") == NULL;
    if (t_stats(w->p).in_use_bytes != sum) {
        fprintf(stderr, "  the pool counts %llu bytes in use, the buffers' sizes add up to %llu\n",
                (unsigned long long)t_stats(w->p).in_use_bytes, (unsigned long long)sum);
        bad = 1;
    }
    /* every byte a buffer counts is mapped: it takes a word */
    for (int i = 0; i < NSET; i++) {
        size_t n = info_of(w->b[i]).size;
        if (!takes(ptr_of(w->b[i]), n, fill_of(i))) {
            fprintf(stderr, "  buffer %d counts %zu bytes, not all of them mapped\n", i, n);
            bad = 1;
        }
    }
    if (sc->viewed && view_follows(w) != 0) {
        fprintf(stderr, "  the view does not follow the buffer\n");
        bad = 1;
    }
    if (sc->viewed && !holds((uint64_t)(uintptr_t)fabpool_view_ptr(w->v), info_of(w->b[1]).size, fill_of(1))) {
        fprintf(stderr, "  the view does not read what the buffer holds\n");
        bad = 1;
    }
    return bad;
}

/* The calls that give something back: where every one of them fails, the driver keeps what it was asked to
 * give back (the ledger cannot be empty), so they fail twice only as two calls of a pair.  cuMemUnmap is the
 * exception: a mapping the driver would not let go stays the pool's, and the collect of the destroy, the driver
 * well again, unmaps it (a refit's copy included), so every call of it may fail. */
static int gives_back(const char *entry)
{
    return strcmp(entry, "cuMemRelease") == 0 || strcmp(entry, "cuMemAddressFree") == 0;
}

/* Call n1 of entry e1 and call n2 of entry e2 fail in one set (e1 == e2: every call of it from n1 on; every2:
 * every call of e2 from n2 on). */
static void trial(const scenario *sc, t_sim_hooks *h, size_t e1, uint64_t n1, size_t e2, uint64_t n2, int every2)
{
    world w;
    if (build(&w, sc) != 0) {
        CHECK(!"the scenario could not be built");
        (void)unbuild(&w);
        return;
    }
    if (e1 == e2) {
        h->fault_set(entries[e1], n1, 1, CUDA_ERROR_UNKNOWN);
    } else {
        h->fault_set(entries[e1], n1, 0, CUDA_ERROR_UNKNOWN);
        h->fault_set(entries[e2], n2, every2, CUDA_ERROR_UNKNOWN);
    }
    fabpool_status st = run_set(&w, sc);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    h->fault_clear();
    n_trials++;
    n_ok += st == FABPOOL_OK;
    n_partial += st == FABPOOL_ERR_PARTIAL;
    n_refused += st != FABPOOL_OK && st != FABPOOL_ERR_PARTIAL;
    int bad = rule_broken(&w, sc, st);
    /* the pool goes on: checked, the set resized again, every byte of it mapped; what the driver would not
     * unmap is the pool's: a collect unmaps it, and the pools then count every byte the driver maps */
    if (fabpool_check(w.p) != FABPOOL_OK || fabpool_collect(w.p, 1) != FABPOOL_OK ||
        (w.q && fabpool_collect(w.q, 1) != FABPOOL_OK) || fabpool_check(w.p) != FABPOOL_OK) {
        fprintf(stderr, "  fabpool_check or fabpool_collect: %s\n", fabpool_last_error());
        bad = 1;
    }
    uint64_t counted = t_stats(w.p).mapped_bytes + (w.q ? t_stats(w.q).mapped_bytes : 0);
    if (t_ledger().bytes_mapped - w.before.bytes_mapped != counted) {
        fprintf(stderr, "  the driver maps %llu bytes for the trial, the pools count %llu\n",
                (unsigned long long)(t_ledger().bytes_mapped - w.before.bytes_mapped), (unsigned long long)counted);
        bad = 1;
    }
    if (run_set(&w, sc) != FABPOOL_OK) {
        fprintf(stderr, "  the set does not resize again: %s\n", fabpool_last_error());
        bad = 1;
    }
    for (int i = 0; i < NSET; i++)
        bad |= info_of(w.b[i]).size != sc->to[i] || !takes(ptr_of(w.b[i]), sc->to[i], 0x3c);
    if (sc->viewed)
        bad |= view_follows(&w) != 0 || !holds((uint64_t)(uintptr_t)fabpool_view_ptr(w.v), sc->to[1], 0x3c);
    bad |= unbuild(&w) != 0;
    CHECK(!bad);
    if (bad)
        fprintf(stderr, "  %s: call %llu of %s and %s %llu of %s failed; the set answered %s (%s)\n", sc->name,
                (unsigned long long)n1, entries[e1], e1 == e2 || every2 ? "every call from" : "call",
                (unsigned long long)n2, entries[e2], fabpool_status_name(st), st == FABPOOL_OK ? "" : msg);
}

/* A grow whose second chunk's access grant fails, with every unmap refused (so its undo cannot take back the
 * first chunk either): the message names the grant first, what came of the undo after it. */
static void grow_undo_says_what_failed_first(t_sim_hooks *h)
{
    fabpool_t *p = t_pool("max_chunk:8MiB,handle_type:none,reserve:4GiB");
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &b));
    h->fault_set("cuMemSetAccess", 2, 0, CUDA_ERROR_OUT_OF_MEMORY);
    h->fault_set("cuMemUnmap", 0, 1, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_buffer_resize(b, 24 * MB, NULL);
    h->fault_clear();
    const char *m = fabpool_last_error();
    CHECK(st != FABPOOL_OK && strncmp(m, "cuMemSetAccess", 14) == 0 && strstr(m, "undoing it: ") != NULL);
    if (st == FABPOOL_OK || strncmp(m, "cuMemSetAccess", 14) != 0)
        fprintf(stderr, "  the grow answered %s: %s\n", fabpool_status_name(st), m);
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_resize_double_fault", "faults, stream holds");
    t_driver_init();
    grow_undo_says_what_failed_first(&h);
    size_t unmap = 0;
    while (unmap < N_ENTRIES && strcmp(entries[unmap], "cuMemUnmap") != 0)
        unmap++;
    CHECK(unmap < N_ENTRIES);
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
        const scenario *sc = &scenarios[k];
        uint64_t made[N_ENTRIES];
        world w;
        if (build(&w, sc) != 0) {
            CHECK(!"the scenario could not be built");
            (void)unbuild(&w);
            continue;
        }
        t_calls_mark(&h, made);
        CHECK_OK(run_set(&w, sc));
        t_calls_since(&h, made);
        CHECK(unbuild(&w) == 0);
        int partial0 = n_partial;
        for (size_t e1 = 0; e1 < N_ENTRIES; e1++)
            for (uint64_t n1 = 1; n1 <= made[e1]; n1++) {
                if (!gives_back(entries[e1]))
                    trial(sc, &h, e1, n1, e1, n1, 0);
                if (e1 != unmap)
                    trial(sc, &h, e1, n1, unmap, 1, 1);
                for (size_t e2 = e1 + 1; e2 < N_ENTRIES; e2++)
                    for (uint64_t n2 = 1; n2 <= made[e2]; n2++)
                        trial(sc, &h, e1, n1, e2, n2, 0);
            }
        /* the pair this is about happened: the refit's new chunk and the old one mapped back both refused */
        CHECK(n_partial > partial0);
    }
    printf("test_resize_double_fault: %d pairs of faults: %d absorbed, %d refused with nothing changed, %d partial\n",
           n_trials, n_ok, n_refused, n_partial);
    return t_done("test_resize_double_fault");
}
