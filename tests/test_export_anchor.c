/* test_export_anchor: a pool of POSIX-fd handles keeps one exported fd open
 * (its export anchor), so that the driver's fd exports and closes stay cheap
 * after the first (fabsim_cold_exports counts the exports made while no
 * exported fd was open: about 0.55 ms each on the H200, against 35 us), and
 * the anchor never keeps memory the pool gave back: before its chunk is
 * unmapped it moves to another chunk the pool maps, or closes when none is
 * left; sleep and destroy close it.  fabpool_stats.export_anchor_moves
 * counts the moves and closes that an unmap forced.  The sim's ledger says
 * what the driver holds at every step. */
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

static t_sim_hooks sim;

/* The times the export anchor moved or closed because its chunk went, as fabpool_stats gives it; the JSON
 * report, whose keys the Python module reads (fabpool_torch.stats), names the same figure. */
static uint64_t anchor_moves(fabpool_t *p)
{
    static char json[1 << 14];
    char key[64];
    uint64_t n = t_stats(p).export_anchor_moves;
    CHECK_OK(fabpool_stats_json(p, json, sizeof json, NULL));
    snprintf(key, sizeof key, "\"export_anchor_moves\":%llu,", (unsigned long long)n);
    CHECK(strstr(json, key) != NULL);
    return n;
}

/* What the driver holds is what the pool maps and what its views map: no fd keeps anything else alive. */
static void expect_nothing_beside(fabpool_t *p, fabpool_t *peer, const char *when)
{
    CHECK_OK(fabpool_check(p));
    if (!t_ledger_p)
        return;
    int64_t held = t_held(), mapped = (int64_t)t_mapped(p);
    fabpool_stats s = t_stats(peer);
    CHECK(held == mapped);
    CHECK(s.view_bytes == 0 || s.view_bytes <= (uint64_t)mapped);
    CHECK(t_ledger().exported_fds == t_stats(p).exported_fds_open + s.exported_fds_open);
    if (held != mapped)
        fprintf(stderr, "  %s: the driver holds %lld bytes, the pool maps %lld\n", when, (long long)held,
                (long long)mapped);
}

/* Exports what buf mapped since gen to a view in peer (the fds dup'ed, as a socket would hand them), then
 * export_done and the peers' ack. */
static void share_step(fabpool_buffer_t *buf, fabpool_t *peer, fabpool_view_t **v, uint64_t *gen)
{
    static unsigned char d[1 << 14];
    int fds[64], mine[64];
    size_t len = 0, nfds = 0;
    CHECK_OK(fabpool_buffer_export(buf, *gen, d, sizeof d, &len, fds, 64, &nfds));
    for (size_t i = 0; i < nfds; i++)
        mine[i] = dup(fds[i]);
    CHECK_OK(*v ? fabpool_view_apply(*v, d, len, mine, nfds) : fabpool_view_open(peer, d, len, mine, nfds, v));
    CHECK_OK(fabpool_buffer_export_done(buf));
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(buf, &bi));
    CHECK_OK(fabpool_buffer_peers_ack(buf, bi.generation));
    *gen = bi.generation;
}

/* A buffer grown 12 times, every growth exported: one cold export, the rest warm; one fd stays open. */
static void growth_exports_are_warm_after_the_first(fabpool_t *p, fabpool_t *peer)
{
    fabpool_buffer_t *b = NULL;
    fabpool_view_t *v = NULL;
    uint64_t gen = 0, cold0 = sim.cold_exports ? sim.cold_exports() : 0;
    fabpool_stats s0 = t_stats(p);
    uint64_t calls0 = t_calls(&s0, "cuMemExportToShareableHandle");
    uint64_t moves0 = anchor_moves(p);
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 2 * MB, &b));
    for (int i = 1; i <= 12; i++) {
        if (i > 1)
            CHECK_OK(fabpool_buffer_resize(b, (size_t)i * 2 * MB, NULL));
        share_step(b, peer, &v, &gen);
        t_put_word((char *)fabpool_buffer_ptr(b) + (size_t)(i - 1) * 2 * MB, 100u + (unsigned)i);
        CHECK(t_stats(p).exported_fds_open == 1); /* the anchor; the pool's other copies are closed */
        expect_nothing_beside(p, peer, "growth");
    }
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    CHECK_OK(fabpool_view_get_info(v, &vi));
    for (int i = 1; i <= 12; i++) /* the view reads what the buffer wrote, chunk by chunk */
        CHECK(t_get_word((char *)vi.base + (size_t)(i - 1) * 2 * MB) == 100u + (unsigned)i);
    fabpool_stats s1 = t_stats(p);
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    uint64_t exports = t_calls(&s1, "cuMemExportToShareableHandle") - calls0;
    CHECK(exports == bi.n_chunks && bi.n_chunks >= 4); /* one a chunk: the anchor is no export of its own */
    if (sim.cold_exports) {
        uint64_t cold = sim.cold_exports() - cold0;
        CHECK(cold == 1);
        printf("test_export_anchor: 12 growths exported in %llu chunks, %llu export(s) made with no exported fd "
               "open\n", (unsigned long long)exports, (unsigned long long)cold);
    }
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK(anchor_moves(p) == moves0); /* growths unmap nothing */
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK(t_stats(p).exported_fds_open == 0); /* no chunk of the pool's own is left to hold it */
    /* its chunks go from the end down: the anchor, on the first, closes once, when that one goes */
    CHECK(anchor_moves(p) == moves0 + 1);
    expect_nothing_beside(p, peer, "after the buffer went");
}

/* The anchor's chunk goes: the anchor moves to a chunk still mapped, with nothing held beside the pool's
 * mappings; the next export is still warm. */
static void anchor_moves_before_its_chunk_goes(fabpool_t *p, fabpool_t *peer)
{
    fabpool_buffer_t *x = NULL, *y = NULL;
    fabpool_view_t *vx = NULL, *vy = NULL;
    uint64_t gx = 0, gy = 0;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 8 * MB, &x));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 8 * MB, &y));
    share_step(x, peer, &vx, &gx); /* x's chunk holds the anchor */
    share_step(y, peer, &vy, &gy);
    CHECK(t_stats(p).exported_fds_open == 1);
    uint64_t moves0 = anchor_moves(p);
    CHECK_OK(fabpool_view_close(vx));
    CHECK_OK(fabpool_buffer_peers_ack(x, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK(t_stats(p).exported_fds_open == 1); /* moved to y's chunk */
    CHECK(anchor_moves(p) == moves0 + 1);
    expect_nothing_beside(p, peer, "x destroyed");
    uint64_t cold0 = sim.cold_exports ? sim.cold_exports() : 0;
    CHECK_OK(fabpool_buffer_resize(y, 16 * MB, NULL));
    share_step(y, peer, &vy, &gy);
    if (sim.cold_exports)
        CHECK(sim.cold_exports() == cold0); /* still warm */
    /* y goes too: the anchor moves to z's chunk */
    fabpool_buffer_t *z = NULL;
    fabpool_view_t *vz = NULL;
    uint64_t gz = 0;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &z));
    share_step(z, peer, &vz, &gz);
    CHECK_OK(fabpool_view_close(vy));
    CHECK_OK(fabpool_buffer_peers_ack(y, UINT64_MAX));
    CHECK(anchor_moves(p) == moves0 + 1); /* y's growth and z's chunk unmapped nothing */
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK(t_stats(p).exported_fds_open == 1);
    CHECK(anchor_moves(p) == moves0 + 2); /* once more, to z's chunk, as y's chunk that held it went */
    expect_nothing_beside(p, peer, "y destroyed");
    CHECK_OK(fabpool_view_close(vz));
    CHECK_OK(fabpool_buffer_peers_ack(z, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(z, NULL));
    CHECK(t_stats(p).exported_fds_open == 0);
    CHECK(anchor_moves(p) == moves0 + 3); /* closed with z's chunk: nowhere left to go */
    expect_nothing_beside(p, peer, "z destroyed");
}

/* A buffer of 4 MiB, shared once and its view closed, every peer gone: the pool holds the anchor. */
static fabpool_buffer_t *shared_once(fabpool_t *p, fabpool_t *peer)
{
    fabpool_buffer_t *b = NULL;
    fabpool_view_t *v = NULL;
    uint64_t gen = 0;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &b));
    share_step(b, peer, &v, &gen);
    CHECK(t_stats(p).exported_fds_open == 1);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    return b;
}

/* The driver refuses the export that would move the anchor: the anchor closes, the unmap goes on, nothing is
 * held beside the pool's mappings, and the next export_done takes a new anchor. */
static void a_failed_move_closes_the_anchor(fabpool_t *p, fabpool_t *peer)
{
    if (!sim.fault_set)
        return;
    fabpool_buffer_t *x = shared_once(p, peer), *y = shared_once(p, peer); /* x's chunk holds the anchor */
    CHECK(t_stats(p).exported_fds_open == 1);
    sim.fault_set("cuMemExportToShareableHandle", 1, 0, CUDA_ERROR_UNKNOWN);
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    sim.fault_clear();
    CHECK(t_stats(p).exported_fds_open == 0);
    expect_nothing_beside(p, peer, "a failed move");
    fabpool_view_t *v = NULL;
    uint64_t gen = 0;
    share_step(y, peer, &v, &gen); /* exports y again (its fds went at export_done) and keeps one */
    CHECK(t_stats(p).exported_fds_open == 1);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_peers_ack(y, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK(t_stats(p).exported_fds_open == 0);
    expect_nothing_beside(p, peer, "after a failed move");
}

/* Sleep closes the anchor (nothing of the pool is mapped, nothing is exported); after wake the first export
 * is cold again and takes a new one. */
static void sleep_closes_the_anchor(fabpool_t *p, fabpool_t *peer)
{
    fabpool_buffer_t *b = shared_once(p, peer);
    fabpool_view_t *v = NULL;
    uint64_t gen = 0, moves0 = anchor_moves(p);
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_DISCARD, NULL));
    CHECK(t_stats(p).exported_fds_open == 0);
    CHECK(anchor_moves(p) == moves0); /* closed by the sleep before any chunk went: no move */
    if (t_ledger_p)
        CHECK(t_ledger().exported_fds == 0 && t_held() == 0);
    CHECK_OK(fabpool_wake(p, NULL));
    uint64_t cold0 = sim.cold_exports ? sim.cold_exports() : 0;
    share_step(b, peer, &v, &gen);
    if (sim.cold_exports)
        CHECK(sim.cold_exports() == cold0 + 1);
    CHECK(t_stats(p).exported_fds_open == 1);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK(anchor_moves(p) == moves0 + 1); /* the anchor taken after the wake closed with b's chunk */
    expect_nothing_beside(p, peer, "after sleep");
}

int main(void)
{
    t_driver_init();
    sim = t_sim_hooks_get();
    fabpool_t *p = t_pool("handle_type:posix_fd"), *peer = t_pool("handle_type:posix_fd");
    if (!p || !peer)
        return t_done("test_export_anchor");
    growth_exports_are_warm_after_the_first(p, peer);
    anchor_moves_before_its_chunk_goes(p, peer);
    a_failed_move_closes_the_anchor(p, peer);
    sleep_closes_the_anchor(p, peer);
    /* an anchor held at destroy goes with the pool */
    CHECK(shared_once(p, peer) != NULL);
    CHECK_STATUS(fabpool_destroy(p), FABPOOL_ERR_BUSY); /* the buffer was still live */
    CHECK_OK(fabpool_destroy(peer));
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.exported_fds == 0 && l.bytes_held == 0 && l.mappings == 0 && l.handles == 0);
    }
    return t_done("test_export_anchor");
}
