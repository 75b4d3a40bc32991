/* test_buffer_reuse_refused: a fabpool_buffer_reuse whose resize the driver refuses hands nothing out and
 * gives the released buffer back, or, where the driver refuses that too, keeps it kept: never a buffer
 * neither kept nor the caller's, still counted (fabpool.h).
 *
 * A buffer of two 8 MiB chunks is released (keep_ms long); fabpool_buffer_reuse takes it back at 24 MiB (a
 * grow: a new chunk mapped) or at 9 MiB (a shrink whose refit replaces the second chunk by a smaller one).
 * Every driver call that reuse makes is made to fail, once, and from that call on (so that what undoes the
 * first failure meets a second: a refit that loses its chunk, whose resize answers FABPOOL_ERR_PARTIAL), but
 * for cuMemUnmap and cuMemRelease, which fail once only (where every call that gives memory back fails, the
 * driver keeps that memory by definition).
 * After a refusal:
 *  - the status is an error other than FABPOOL_ERR_PARTIAL (nothing was handed out, so nothing is partly
 *    done for the caller), and *out is NULL;
 *  - the pool counts no live buffer and no bytes in use, and fabpool_check passes;
 *  - given back (no kept bytes): a reuse with the driver well finds none (FABPOOL_ERR_NOT_FOUND); kept (its
 *    kept bytes at most what it had): a reuse with the driver well hands the same buffer out (its base) at the
 *    size asked, every byte mapped.
 * After a success the buffer is handed out at its size.  After the pool's destroy the driver holds nothing. */
#include "testutil.h"
#include "driver_calls.h"

#define MB (1ull << 20)

typedef struct world {
    fabsim_ledger before;
    fabpool_t *p;
    void *base;
    uint64_t kept;                     /* kept_bytes after the release */
} world;

static int build(world *w)
{
    memset(w, 0, sizeof *w);
    w->before = t_ledger();
    w->p = t_pool("handle_type:none,max_chunk:8MiB,max_waste:0,keep_ms:600000");
    fabpool_buffer_t *b = NULL;
    if (!w->p || fabpool_buffer_create(w->p, 32 * MB, 16 * MB, &b) != FABPOOL_OK)
        return -1;
    w->base = fabpool_buffer_ptr(b);
    if (fabpool_buffer_release(b) != FABPOOL_OK)
        return -1;
    w->kept = t_stats(w->p).kept_bytes;
    return w->kept == 16 * MB ? 0 : -1;
}

static int unbuild(world *w)
{
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
    fabsim_ledger l = t_ledger(), b = w->before;
    return l.bytes_held != b.bytes_held || l.mappings != b.mappings || l.handles != b.handles ||
           l.reservations != b.reservations ? -1 : 0;
}

static const size_t sizes[] = {24 * MB, 9 * MB};

static int n_trials, n_refused, n_partial, n_kept;

static void trial(size_t size, t_sim_hooks *h, size_t e, uint64_t n, int every)
{
    world w;
    if (build(&w) != 0) {
        CHECK(!"the released buffer could not be set up");
        (void)unbuild(&w);
        return;
    }
    fabpool_buffer_t *out = (fabpool_buffer_t *)&w;
    h->fault_set(entries[e], n, every, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_buffer_reuse(w.p, size, NULL, &out);
    h->fault_clear();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    n_trials++;
    n_partial += strstr(msg, "lost") != NULL;
    int bad = 0;
    fabpool_stats s = t_stats(w.p);
    if (st != FABPOOL_OK) {
        n_refused++;
        if (st == FABPOOL_ERR_PARTIAL || out != NULL) {
            fprintf(stderr, "  refused with %s, *out %p\n", fabpool_status_name(st), (void *)out);
            bad = 1;
        }
        if (s.buffers != 0 || s.in_use_bytes != 0 || s.kept_bytes > w.kept) {
            fprintf(stderr, "  after the refusal: %llu live buffers, %llu bytes in use, %llu kept (%llu before)\n",
                    (unsigned long long)s.buffers, (unsigned long long)s.in_use_bytes,
                    (unsigned long long)s.kept_bytes, (unsigned long long)w.kept);
            bad = 1;
        }
        n_kept += s.kept_bytes != 0;
        if (fabpool_check(w.p) != FABPOOL_OK) {
            fprintf(stderr, "  fabpool_check: %s\n", fabpool_last_error());
            bad = 1;
        }
        /* given back, or kept for the next reuse */
        out = NULL;
        fabpool_status st2 = fabpool_buffer_reuse(w.p, size, NULL, &out);
        if (s.kept_bytes ? st2 != FABPOOL_OK || !out || fabpool_buffer_ptr(out) != w.base
                         : st2 != FABPOOL_ERR_NOT_FOUND || out) {
            fprintf(stderr, "  a second reuse -> %s (%s), the buffer at %p (the kept one at %p)\n",
                    fabpool_status_name(st2), fabpool_last_error(), out ? fabpool_buffer_ptr(out) : NULL, w.base);
            bad = 1;
        }
    }
    if (out) {
        fabpool_buffer_info i = {.struct_size = sizeof i};
        CHECK_OK(fabpool_buffer_get_info(out, &i));
        if (i.size != size || !h->range_mapped(i.base, size)) {
            fprintf(stderr, "  the buffer handed out has %zu bytes (%zu asked), %s\n", i.size, size,
                    h->range_mapped(i.base, i.size) ? "mapped" : "not all mapped");
            bad = 1;
        }
        CHECK(t_stats(w.p).buffers == 1);
        CHECK_OK(fabpool_buffer_destroy(out, NULL));
    }
    if (fabpool_check(w.p) != FABPOOL_OK) {
        fprintf(stderr, "  fabpool_check at the end: %s\n", fabpool_last_error());
        bad = 1;
    }
    if (unbuild(&w) != 0) {
        fprintf(stderr, "  the driver holds memory of the pool after its destroy\n");
        bad = 1;
    }
    CHECK(!bad);
    if (bad)
        fprintf(stderr, "  reuse at %zu MiB: call %llu of %s failed%s; the call answered %s (%s)\n", (size_t)(size / MB),
                (unsigned long long)n, entries[e], every ? " and every one after" : "", fabpool_status_name(st),
                st == FABPOOL_OK ? "" : msg);
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_buffer_reuse_refused", "faults");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t made[N_ENTRIES];
        world w;
        if (build(&w) != 0) {
            CHECK(!"the released buffer could not be set up");
            (void)unbuild(&w);
            continue;
        }
        fabpool_buffer_t *out = NULL;
        t_calls_mark(&h, made);
        CHECK_OK(fabpool_buffer_reuse(w.p, sizes[k], NULL, &out));
        t_calls_since(&h, made);
        CHECK(out && fabpool_buffer_ptr(out) == w.base);
        if (out)
            CHECK_OK(fabpool_buffer_destroy(out, NULL));
        CHECK(unbuild(&w) == 0);
        int t0 = n_trials, r0 = n_refused;
        for (size_t e = 0; e < N_ENTRIES; e++) {
            int gives_back = !strcmp(entries[e], "cuMemUnmap") || !strcmp(entries[e], "cuMemRelease");
            for (uint64_t n = 1; n <= made[e]; n++)
                for (int every = 0; every < 2 - gives_back; every++)
                    trial(sizes[k], &h, e, n, every);
        }
        printf("  reuse at %zu MiB: %d faults, %d refused\n", (size_t)(sizes[k] / MB), n_trials - t0, n_refused - r0);
    }
    printf("  refits that lost their chunk: %d; refusals whose give-back failed too (kept): %d\n", n_partial,
           n_kept);
    CHECK(n_partial > 0 && n_kept > 0); /* the double faults met */
    return t_done("test_buffer_reuse_refused");
}
