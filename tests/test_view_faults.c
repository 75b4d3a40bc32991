/* test_view_faults: a view open or apply that the driver refuses, and whose undo it refuses too.
 *
 * - A view open (fresh, and the reopen of a released view) whose chunk map or access grant fails while every
 *   unmap fails as well: the open answers the map's error, fabpool_check passes (the chunk the undo could not
 *   unmap is no view's, and the window is not handed out under it), a collect unmaps what was left, the pools
 *   then count every byte the driver maps, a new view opens and reads the buffer, and once everything is
 *   destroyed the driver holds nothing.
 * - An apply of a delta that replaces a chunk (the exporter refit its last one) whose new chunk's map or access
 *   grant fails: the view is as it was (its info, every byte of info.mapped mapped, its data), and the same
 *   descriptor applies afterwards.  Where the driver refuses to map the old chunk back too: FABPOOL_ERR_PARTIAL,
 *   and the view counts only what it maps (its size and mapped bytes end where the lost chunk began). */
#include "testutil.h"

#define MB (1ull << 20)
#define TAG 0x5eedf00dull

typedef struct world {
    fabsim_ledger before;
    fabpool_t *p, *q;
    fabpool_buffer_t *b;
    fabpool_view_t *v, *v2;
    unsigned char desc[1 << 14];
    size_t len, nfds;
    int fds[16];
} world;

static fabpool_buffer_info vinfo(fabpool_view_t *v)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_view_get_info(v, &i));
    return i;
}

/* The buffer's descriptor since generation `since` into w, with copies of its fds (the export's own are the
 * pool's until fabpool_buffer_export_done); the copies of the one before closed. */
static void export_since(world *w, uint64_t since)
{
    for (size_t i = 0; i < w->nfds; i++)
        close(w->fds[i]);
    int fds[16];
    CHECK_OK(fabpool_buffer_export(w->b, since, w->desc, sizeof w->desc, &w->len, fds, 16, &w->nfds));
    for (size_t i = 0; i < w->nfds; i++)
        w->fds[i] = dup(fds[i]);
    CHECK_OK(fabpool_buffer_export_done(w->b));
}

/* Opens (peer 0: fabpool_view_open) or applies w's descriptor, with dups of its fds. */
static fabpool_status open_view(world *w, int peer, fabpool_view_t **out)
{
    int mine[16];
    for (size_t i = 0; i < w->nfds; i++)
        mine[i] = dup(w->fds[i]);
    return peer ? fabpool_view_open_peer(w->q, peer, w->desc, w->len, mine, w->nfds, out)
                : fabpool_view_open(w->q, w->desc, w->len, mine, w->nfds, out);
}

static fabpool_status apply(world *w, fabpool_view_t *v)
{
    int mine[16];
    for (size_t i = 0; i < w->nfds; i++)
        mine[i] = dup(w->fds[i]);
    return fabpool_view_apply(v, w->desc, w->len, mine, w->nfds);
}

static void build(world *w)
{
    memset(w, 0, sizeof *w);
    w->before = t_ledger();
    w->p = t_pool("max_chunk:8MiB,handle_type:posix_fd,reserve:4GiB");
    w->q = t_pool("handle_type:posix_fd,reserve:4GiB,keep_ms:60000");
    CHECK_OK(fabpool_buffer_create(w->p, 64 * MB, 16 * MB, &w->b)); /* two chunks of 8 MiB */
    t_put_tag(fabpool_buffer_ptr(w->b), 8 * MB, TAG);
    export_since(w, 0);
}

/* What the driver was left with: checked, collected, every byte it maps counted by a pool; then torn down and
 * nothing held. */
static void unbuild(world *w)
{
    CHECK_OK(fabpool_check(w->q));
    CHECK_OK(fabpool_collect(w->q, 1));
    CHECK_OK(fabpool_check(w->q));
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_mapped - w->before.bytes_mapped == t_stats(w->p).mapped_bytes + t_stats(w->q).mapped_bytes);
    fabpool_view_t *again = NULL; /* the windows are free for a new view, which reads the buffer */
    export_since(w, 0);
    CHECK_OK(open_view(w, 0, &again));
    CHECK(again && t_tag_ok(fabpool_view_ptr(again), 8 * MB, TAG));
    fabpool_view_t *vs[3] = {again, w->v, w->v2};
    for (int i = 0; i < 3; i++)
        if (vs[i])
            CHECK_OK(fabpool_view_close(vs[i]));
    for (size_t i = 0; i < w->nfds; i++)
        close(w->fds[i]);
    CHECK_OK(fabpool_buffer_peers_ack(w->b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(w->b, NULL));
    CHECK_OK(fabpool_destroy(w->q));
    CHECK_OK(fabpool_destroy(w->p));
    l = t_ledger();
    CHECK(l.mappings == w->before.mappings && l.bytes_held == w->before.bytes_held &&
          l.reservations == w->before.reservations && l.handles == w->before.handles);
}

/* A fresh open (reopen 0) or the reopen of a released view after the buffer grew by two chunks (reopen 1),
 * whose second chunk to map fails at `entry` while every unmap fails. */
static void open_trial(t_sim_hooks *h, const char *entry, int reopen)
{
    world w;
    build(&w);
    if (reopen) {
        CHECK_OK(open_view(&w, getpid(), &w.v));
        CHECK_OK(fabpool_view_release(w.v));
        w.v = NULL;
        CHECK_OK(fabpool_buffer_resize(w.b, 32 * MB, NULL));
        export_since(&w, 0);
    }
    h->fault_set(entry, 2, 0, CUDA_ERROR_UNKNOWN);
    h->fault_set("cuMemUnmap", 1, 1, CUDA_ERROR_UNKNOWN);
    fabpool_status st = open_view(&w, reopen ? getpid() : 0, &w.v2);
    h->fault_clear();
    if (!reopen) {
        CHECK(st == FABPOOL_ERR_DRIVER && strstr(fabpool_last_error(), entry) != NULL);
        CHECK(w.v2 == NULL);
    } /* a reopen that cannot take the kept view opens afresh */
    if (reopen && st == FABPOOL_OK)
        CHECK(t_tag_ok(fabpool_view_ptr(w.v2), 8 * MB, TAG));
    unbuild(&w);
}

/* A delta replacing the buffer's second chunk, applied while `entry` fails (every call of it with every). */
static void apply_trial(t_sim_hooks *h, const char *entry, int every)
{
    world w;
    build(&w);
    CHECK_OK(open_view(&w, 0, &w.v));
    fabpool_buffer_info v0 = vinfo(w.v);
    CHECK_OK(fabpool_buffer_resize(w.b, 9 * MB, NULL)); /* the second chunk is refit: replaced by a smaller one */
    export_since(&w, v0.generation);
    h->fault_set(entry, 1, every, CUDA_ERROR_UNKNOWN);
    fabpool_status st = apply(&w, w.v);
    h->fault_clear();
    fabpool_buffer_info vi = vinfo(w.v);
    CHECK(h->range_mapped(fabpool_view_ptr(w.v), vi.mapped));
    CHECK(vi.size <= vi.mapped && t_tag_ok(fabpool_view_ptr(w.v), 8 * MB, TAG));
    if (!every) {
        CHECK(st == FABPOOL_ERR_DRIVER && strstr(fabpool_last_error(), "as it was") != NULL);
        CHECK(vi.size == v0.size && vi.mapped == v0.mapped && vi.n_chunks == v0.n_chunks &&
              vi.generation == v0.generation);
    } else {
        CHECK(st == FABPOOL_ERR_PARTIAL && strstr(fabpool_last_error(), "lost") != NULL);
        CHECK(vi.size == 8 * MB && vi.mapped == 8 * MB && vi.generation == v0.generation);
    }
    CHECK_OK(fabpool_check(w.q));
    CHECK_OK(apply(&w, w.v)); /* the driver well again, the same descriptor applies */
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(w.b, &bi));
    vi = vinfo(w.v);
    CHECK(vi.mapped == bi.mapped && vi.generation == bi.generation && t_tag_ok(fabpool_view_ptr(w.v), 8 * MB, TAG));
    CHECK(h->range_mapped(fabpool_view_ptr(w.v), vi.mapped));
    unbuild(&w);
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_view_faults", "fault injection, the ledger");
    const char *maps[] = {"cuMemMap", "cuMemSetAccess"};
    for (int i = 0; i < 2; i++) {
        open_trial(&h, maps[i], 0);
        open_trial(&h, maps[i], 1);
        apply_trial(&h, maps[i], 0);
    }
    apply_trial(&h, "cuMemMap", 1);
    return t_done("test_view_faults");
}
