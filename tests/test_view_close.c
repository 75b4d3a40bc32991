/* test_view_close: a view close (or a view apply) that the driver refuses
 * leaves the view open and whole: every driver call of a close made to fail
 * in turn, in a pool whose owner stream freed a block (so that every unmap
 * waits for the owner's work first).  After each: the close answered OK and
 * nothing of the view is mapped, or it answered an error and the view maps
 * what it mapped, reads its data, fabpool_check passes, and a second close
 * frees it; a new view opens at once; when everything is destroyed the
 * driver holds nothing. */
#include "testutil.h"
#include "driver_calls.h"

#define MB (1ull << 20)

typedef struct world {
    fabpool_t *p, *q;
    fabpool_buffer_t *b;
    fabpool_view_t *v;
    CUstream s;
    uint8_t desc[1 << 13];
    size_t len, nfds;
    int fds[64];
} world;

static int open_view(world *w, fabpool_view_t **out)
{
    int mine[64];
    for (size_t i = 0; i < w->nfds; i++)
        mine[i] = dup(w->fds[i]);
    return fabpool_view_open(w->q, w->desc, w->len, mine, w->nfds, out) == FABPOOL_OK ? 0 : -1;
}

static int build(world *w)
{
    memset(w, 0, sizeof *w);
    w->p = t_pool("handle_type:auto,max_chunk:8MiB");
    w->q = t_pool("handle_type:auto,stream_owner:1");
    if (!w->p || !w->q || fabpool_handle_type_of(w->p) == FABPOOL_HANDLE_NONE || cuStreamCreate(&w->s, 0))
        return -1;
    if (fabpool_buffer_create(w->p, 64 * MB, 24 * MB, &w->b) != FABPOOL_OK)
        return -1;
    t_put_tag(fabpool_buffer_ptr(w->b), 24 * MB, 0x71e3);
    if (fabpool_buffer_export(w->b, 0, w->desc, sizeof w->desc, &w->len, w->fds, 64, &w->nfds) != FABPOOL_OK ||
        open_view(w, &w->v) != 0)
        return -1;
    /* the owner stream of q frees a block at once: the next unmap of q waits for its work first */
    void *x = NULL;
    if (fabpool_alloc_on_stream(w->q, 4096, w->s, &x) != FABPOOL_OK || fabpool_free_on_stream(w->q, x, w->s))
        return -1;
    return 0;
}

static void unbuild(world *w)
{
    if (w->v)
        CHECK_OK(fabpool_view_close(w->v));
    if (w->b) {
        CHECK_OK(fabpool_buffer_export_done(w->b));
        CHECK_OK(fabpool_buffer_peers_ack(w->b, UINT64_MAX));
        CHECK_OK(fabpool_buffer_destroy(w->b, NULL));
    }
    if (w->s)
        cuStreamDestroy(w->s);
    if (w->q)
        CHECK_OK(fabpool_destroy(w->q));
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
}

static int n_trials, n_refused;

static void close_trial(t_sim_hooks *h, size_t e, uint64_t n)
{
    world w;
    fabsim_ledger l0 = t_ledger();
    if (build(&w) != 0) {
        CHECK(!"the world could not be built");
        unbuild(&w);
        return;
    }
    fabpool_buffer_info vi0 = {.struct_size = sizeof vi0};
    CHECK_OK(fabpool_view_get_info(w.v, &vi0));
    uint64_t view_bytes0 = t_stats(w.q).view_bytes;
    h->fault_set(entries[e], n, 0, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_view_close(w.v);
    h->fault_clear();
    n_trials++;
    if (st == FABPOOL_OK) {
        w.v = NULL;
        CHECK(t_stats(w.q).view_bytes == view_bytes0 - vi0.mapped);
    } else {
        n_refused++;
        fabpool_buffer_info vi = {.struct_size = sizeof vi};
        CHECK_OK(fabpool_view_get_info(w.v, &vi));
        int same = vi.mapped == vi0.mapped && vi.n_chunks == vi0.n_chunks && vi.generation == vi0.generation &&
                   t_tag_ok(fabpool_view_ptr(w.v), 24 * MB, 0x71e3);
        CHECK(same);
        if (!same)
            fprintf(stderr, "  call %llu of %s failed: the refused close left the view with %zu of %zu bytes (%s)\n",
                    (unsigned long long)n, entries[e], vi.mapped, vi0.mapped, fabpool_last_error());
        CHECK(strstr(fabpool_last_error(), "still open") != NULL);
        CHECK_OK(fabpool_check(w.q));
        CHECK_OK(fabpool_view_close(w.v)); /* a second close frees it */
        w.v = NULL;
    }
    CHECK_OK(fabpool_check(w.q));
    CHECK(t_stats(w.q).view_bytes == 0);
    fabpool_view_t *again = NULL; /* the range is free for a new view */
    CHECK(open_view(&w, &again) == 0);
    if (again) {
        CHECK(t_tag_ok(fabpool_view_ptr(again), 24 * MB, 0x71e3));
        CHECK_OK(fabpool_view_close(again));
    }
    unbuild(&w);
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.bytes_held == l0.bytes_held && l1.reservations == l0.reservations);
}

int main(void)
{
    if (!t_driver_init()) {
        printf("test_view_close: needs the simulated driver (faults, ledger); skipped\n");
        return 77;
    }
    t_sim_hooks h = t_sim_hooks_get();
    world w;
    if (build(&w) != 0) {
        printf("test_view_close: no shareable handle type here; skipped\n");
        unbuild(&w);
        return t_done("test_view_close");
    }
    uint64_t made[N_ENTRIES];
    t_calls_mark(&h, made);
    CHECK_OK(fabpool_view_close(w.v));
    w.v = NULL;
    t_calls_since(&h, made);
    unbuild(&w);
    for (size_t e = 0; e < N_ENTRIES; e++)
        for (uint64_t n = 1; n <= made[e]; n++)
            close_trial(&h, e, n);
    printf("test_view_close: %d faults, %d closes refused\n", n_trials, n_refused);
    return t_done("test_view_close");
}
