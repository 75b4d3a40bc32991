/* test_buffer_contract: what buffers, sharing and options promise where it is
 * easy to get wrong: option fields checked as their conf keys are, a failed
 * destroy or import that changes nothing, a shrink that gives its memory
 * back, refused duplicates, acks and fds, views counted apart from the cache,
 * an exported buffer's memory freed at destroy.  Runs against the simulated
 * driver (fault injection, the ledger) and, where the check needs neither,
 * the real one.
 * Size classes, large blocks and the PyTorch shim have tests of their own
 * (test_sizeclass, test_torch_shim). */
#include <fcntl.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

typedef int (*fault_fn)(const char *, uint64_t, int, int);
typedef void (*clear_fn)(void);
static fault_fn fault_set;
static clear_fn fault_clear;

static void put(uint64_t at, uint64_t v)
{
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v));
    CHECK_CU(cuCtxSynchronize());
}

static uint64_t get(uint64_t at)
{
    uint64_t v = 0;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)at, sizeof v));
    return v;
}

static uint64_t ptr(fabpool_buffer_t *b) { return (uint64_t)(uintptr_t)fabpool_buffer_ptr(b); }

static fabpool_buffer_info info(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i;
}

static fabpool_buffer_info vinfo(fabpool_view_t *v)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_view_get_info(v, &i));
    return i;
}


static int shareable(fabpool_t *p)
{
    fabpool_handle_type t = fabpool_handle_type_of(p);
    return t == FABPOOL_HANDLE_POSIX_FD || t == FABPOOL_HANDLE_FABRIC;
}

static void dup_fds(const int *fds, size_t n, int *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = dup(fds[i]);
}

/* Every field of fabpool_options is checked at fabpool_create with
 * its conf key's rules (unchecked, n_peer_devices 18 would overflow a stack
 * array and slab_max_bytes 100 read out of bounds). */
static void option_fields_follow_conf_rules(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_options o;
    fabpool_t *p = NULL;
#define BAD_FIELD(stmt, name)                                                                   \
    do {                                                                                        \
        fabpool_options_init(&o);                                                               \
        stmt;                                                                                   \
        p = NULL;                                                                               \
        CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_CONFIG);                               \
        CHECK(p == NULL && strstr(fabpool_last_error(), name) != NULL);                         \
        if (p)                                                                                  \
            fabpool_destroy(p);                                                                 \
    } while (0)
    BAD_FIELD(o.n_peer_devices = 18, "n_peer_devices");
    BAD_FIELD(o.n_peer_devices = -1, "n_peer_devices");
    BAD_FIELD((o.n_peer_devices = 2, o.peer_devices[0] = 1, o.peer_devices[1] = 1), "peer_devices");
    BAD_FIELD((o.n_peer_devices = 1, o.peer_devices[0] = -3), "peer_devices");
    BAD_FIELD(o.slab_max_bytes = 100, "slab_max_bytes");
    BAD_FIELD(o.device = -1, "device");
    BAD_FIELD(o.device = 5000, "device");
    if (!getenv("FABPOOL_CONF")) /* it would set a good handle_type over the bad field */
        BAD_FIELD(o.handle_type = (fabpool_handle_type)7, "handle_type");
    BAD_FIELD(o.metadata = (fabpool_metadata)9, "metadata");
    BAD_FIELD(o.max_chunk_bytes = 3 * MB, "max_chunk_bytes");
    BAD_FIELD(o.max_chunk_bytes = 0, "max_chunk_bytes");
    BAD_FIELD(o.max_waste_percent = 101, "max_waste_percent");
    BAD_FIELD(o.shrink_hysteresis_percent = 5000, "shrink_hysteresis_percent");
    BAD_FIELD(o.thread_cache = 2, "thread_cache");
    BAD_FIELD(o.stats_at_destroy = 3, "stats_at_destroy");
    BAD_FIELD(o.reserve_bytes = 4096, "reserve_bytes");
#undef BAD_FIELD
    CHECK(strstr(fabpool_last_error(), "'reserve'") != NULL); /* the message names the conf key too */
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.reservations == l0.reservations && l1.handles == l0.handles);
    /* a good struct still makes a pool */
    fabpool_options_init(&o);
    CHECK_OK(fabpool_create(&o, &p));
    if (p)
        CHECK_OK(fabpool_destroy(p));
}

/* A failed fabpool_buffer_destroy leaves the buffer alive and destroyable
 * again (not marked destroyed, so that a retry does not answer INVALID_ARG
 * with 80 MiB left mapped); a failed cuEventCreate is named. */
static void failed_destroy_keeps_buffer(void)
{
    if (!fault_set)
        return;
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    CUstream s;
    CHECK_CU(cuStreamCreate(&s, 0));
    const char *calls[] = {"cuEventCreate", "cuEventRecord", "cuCtxSynchronize"};
    for (int k = 0; k < 3; k++) {
        fabpool_buffer_t *b = NULL;
        CHECK_OK(fabpool_buffer_create(p, 256 * MB, 80 * MB, &b));
        if (!b)
            continue;
        put(ptr(b), 55);
        fault_set(calls[k], 1, 0, CUDA_ERROR_UNKNOWN);
        void *stream = k == 2 ? NULL : (void *)s;
        CHECK(fabpool_buffer_destroy(b, stream) != FABPOOL_OK);
        CHECK(strstr(fabpool_last_error(), calls[k]) != NULL);
        fault_clear();
        fabpool_buffer_info i = info(b);
        CHECK(i.size == 80 * MB && i.mapped >= 80 * MB && get(ptr(b)) == 55); /* alive, data and all */
        CHECK(t_stats(p).buffers == 1);
        CHECK_OK(fabpool_buffer_destroy(b, stream));
        CHECK_OK(fabpool_collect(p, 1));
        fabpool_stats st = t_stats(p);
        CHECK(st.buffers == 0 && st.mapped_bytes == 0);
        CHECK(t_ledger().bytes_mapped == 0);
    }
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

/* A shrink keeps at most the hysteresis over the new size (a first chunk
 * kept whole would leave 1 GiB mapped for 1 GiB -> 16 MiB, and 320 MiB for
 * 256 MiB -> 4 GiB -> 64 MiB). */
static void shrink_gives_memory_back(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    CUstream s;
    CHECK_CU(cuStreamCreate(&s, 0));
    for (int k = 0; k < 2; k++) {
        void *stream = k ? (void *)s : NULL;
        fabpool_buffer_t *b = NULL;
        CHECK_OK(fabpool_buffer_create(p, 8192 * MB, 1024 * MB, &b));
        if (!b)
            continue;
        uint64_t base = ptr(b);
        put(base, 1);
        put(base + 16 * MB - 8, 2);
        put(base + 900 * MB, 3);
        CHECK_OK(fabpool_buffer_resize(b, 16 * MB, stream));
        CHECK_OK(fabpool_collect(p, 1));
        fabpool_buffer_info i = info(b);
        CHECK(i.base == (void *)(uintptr_t)base && i.size == 16 * MB);
        CHECK(i.mapped >= 16 * MB && i.mapped <= 20 * MB); /* 16 MiB + 25 % */
        CHECK(get(base) == 1 && get(base + 16 * MB - 8) == 2);
        CHECK(t_stats(p).mapped_bytes == i.mapped);
        if (t_ledger_p)
            CHECK(t_ledger().bytes_mapped == i.mapped && t_ledger().bytes_held == i.mapped);
        /* grow again: the base stays, data below 16 MiB too */
        CHECK_OK(fabpool_buffer_resize(b, 4096 * MB, stream));
        CHECK(get(base) == 1 && get(base + 16 * MB - 8) == 2);
        put(base + 4096 * MB - 8, 4);
        CHECK_OK(fabpool_buffer_resize(b, 64 * MB, stream));
        CHECK_OK(fabpool_collect(p, 1));
        i = info(b);
        CHECK(i.mapped >= 64 * MB && i.mapped <= 80 * MB);
        CHECK(get(base) == 1 && get(base + 16 * MB - 8) == 2);
        CHECK(t_stats(p).mapped_bytes == i.mapped);
        CHECK_OK(fabpool_buffer_destroy(b, stream));
    }
    /* one chunk of 64 MiB shrunk to 40 MiB: the hysteresis keeps 50 MiB, so the chunk is refitted
     * (a bound of twice the hysteresis would keep all 64 MiB) */
    fabpool_buffer_t *c = NULL;
    CHECK_OK(fabpool_buffer_create(p, 1024 * MB, 64 * MB, &c));
    if (c) {
        uint64_t base = ptr(c);
        CHECK(info(c).mapped >= 64 * MB); /* more than the 50 MiB the shrink may keep */
        put(base + 40 * MB - 8, 5);
        CHECK_OK(fabpool_buffer_resize(c, 40 * MB, NULL));
        CHECK(info(c).mapped >= 40 * MB && info(c).mapped <= 50 * MB);
        CHECK(get(base + 40 * MB - 8) == 5 && ptr(c) == base);
        CHECK(t_stats(p).mapped_bytes == info(c).mapped);
        CHECK_OK(fabpool_buffer_destroy(c, NULL));
    }
    /* 256 MiB -> 4 GiB -> 64 MiB: the first chunk straddles the new end */
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 4096 * MB, 256 * MB, &b));
    if (b) {
        CHECK_OK(fabpool_buffer_resize(b, 4096 * MB, NULL));
        CHECK_OK(fabpool_buffer_resize(b, 64 * MB, NULL));
        CHECK(info(b).mapped <= 80 * MB);
        CHECK_OK(fabpool_buffer_destroy(b, NULL));
    }
    CHECK_OK(fabpool_collect(p, 1));
    CHECK(t_stats(p).mapped_bytes == 0);
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

/* resize_set with one buffer twice is refused and changes nothing (an OK
 * would leave size 20 MiB with 2 MiB mapped). */
static void resize_set_refuses_duplicate(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 8 * MB, &b));
    if (b) {
        fabpool_buffer_t *set[2] = {b, b};
        size_t sizes[2] = {20 * MB, 2 * MB};
        CHECK_STATUS(fabpool_buffer_resize_set(set, sizes, 2, NULL), FABPOOL_ERR_INVALID_ARG);
        CHECK(strstr(fabpool_last_error(), "same buffer") != NULL);
        fabpool_buffer_info i = info(b);
        CHECK(i.size == 8 * MB && i.mapped >= 8 * MB);
        CHECK_OK(fabpool_buffer_destroy(b, NULL));
    }
    CHECK_OK(fabpool_destroy(p));
}

/* The exporter pool a, the importer pool v, one buffer of a viewed by v. */
typedef struct pair {
    fabpool_t *a, *v;
    fabpool_buffer_t *b;
    fabpool_view_t *view;
    int posix;
    uint8_t d[16384];
    int fds[64], mine[64];
    size_t len, nfds;
} pair;

static int pair_open(pair *x, size_t max, size_t size)
{
    memset(x, 0, sizeof *x);
    x->a = t_pool(NULL);
    x->v = t_pool(NULL);
    if (!x->a || !x->v || !shareable(x->a))
        return 0;
    x->posix = fabpool_handle_type_of(x->a) == FABPOOL_HANDLE_POSIX_FD;
    CHECK_OK(fabpool_buffer_create(x->a, max, size, &x->b));
    if (!x->b)
        return 0;
    put(ptr(x->b), 77);
    CHECK_OK(fabpool_buffer_export(x->b, 0, x->d, sizeof x->d, &x->len, x->fds, 64, &x->nfds));
    dup_fds(x->fds, x->nfds, x->mine);
    CHECK_OK(fabpool_view_open(x->v, x->d, x->len, x->mine, x->nfds, &x->view));
    return x->view != NULL;
}

static void pair_close(pair *x)
{
    if (x->view)
        CHECK_OK(fabpool_view_close(x->view));
    if (x->b) {
        fabpool_buffer_peers_ack(x->b, UINT64_MAX);
        CHECK_OK(fabpool_buffer_destroy(x->b, NULL));
    }
    if (x->a)
        CHECK_OK(fabpool_destroy(x->a));
    if (x->v)
        CHECK_OK(fabpool_destroy(x->v));
}

/* An ack of a generation never issued is refused (accepted, gen + 1000 would
 * let a later shrink unmap at once under a late peer). */
static void ack_of_unissued_generation_refused(void)
{
    pair x;
    if (pair_open(&x, 256 * MB, 64 * MB)) {
        fabpool_buffer_info i = info(x.b);
        CHECK_STATUS(fabpool_buffer_peers_ack(x.b, i.generation + 1000), FABPOOL_ERR_INVALID_ARG);
        CHECK(strstr(fabpool_last_error(), "never issued") != NULL);
        CHECK_OK(fabpool_buffer_peers_ack(x.b, i.generation));
        CHECK_OK(fabpool_buffer_resize(x.b, 200 * MB, NULL));
        CHECK_STATUS(fabpool_buffer_peers_ack(x.b, info(x.b).generation + 1), FABPOOL_ERR_INVALID_ARG);
        /* so a shrink keeps the dropped chunks for a late peer */
        CHECK_OK(fabpool_buffer_export(x.b, i.generation, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds));
        uint64_t held = t_ledger_p ? t_ledger().bytes_held : 0;
        CHECK_OK(fabpool_buffer_resize(x.b, 64 * MB, NULL));
        if (t_ledger_p)
            CHECK(t_ledger().bytes_held >= held); /* the late peer can still import what it was sent */
        dup_fds(x.fds, x.nfds, x.mine);
        CHECK_OK(fabpool_view_apply(x.view, x.d, x.len, x.mine, x.nfds));
        CHECK(get((uint64_t)(uintptr_t)fabpool_view_ptr(x.view)) == 77);
        CHECK_OK(fabpool_buffer_export_done(x.b));
    }
    pair_close(&x);
}

/* A failed import leaves the view as it was (not already unmapped the
 * chunks the descriptor replaces: 4 MiB said, 2 MiB mapped).  A full
 * descriptor imports only the chunks the view lacks: each of their imports
 * fails in turn. */
static void failed_apply_keeps_view(void)
{
    if (!fault_set)
        return;
    pair x;
    if (pair_open(&x, 1024 * MB, 64 * MB)) {
        CHECK_OK(fabpool_buffer_resize(x.b, 300 * MB, NULL));
        CHECK_OK(fabpool_buffer_export(x.b, 0, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds)); /* full */
        fabpool_buffer_info before = vinfo(x.view), bi = {.struct_size = sizeof bi};
        CHECK_OK(fabpool_buffer_get_info(x.b, &bi));
        int lacking = (int)bi.n_chunks - (int)before.n_chunks;
        CHECK(lacking >= 1);
        uint64_t vmapped = t_stats(x.v).mapped_bytes;
        fabsim_ledger l0 = t_ledger();
        for (int nth = 1; nth <= lacking; nth++) {
            dup_fds(x.fds, x.nfds, x.mine);
            fault_set("cuMemImportFromShareableHandle", (uint64_t)nth, 0, CUDA_ERROR_UNKNOWN);
            CHECK(fabpool_view_apply(x.view, x.d, x.len, x.mine, x.nfds) != FABPOOL_OK);
            fault_clear();
            fabpool_buffer_info after = vinfo(x.view);
            CHECK(after.generation == before.generation && after.mapped == before.mapped &&
                  after.n_chunks == before.n_chunks);
            CHECK(t_stats(x.v).mapped_bytes == vmapped);
            fabsim_ledger l1 = t_ledger();
            CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles);
            CHECK(get((uint64_t)(uintptr_t)fabpool_view_ptr(x.view)) == 77);
        }
        dup_fds(x.fds, x.nfds, x.mine);
        CHECK_OK(fabpool_view_apply(x.view, x.d, x.len, x.mine, x.nfds));
        CHECK(vinfo(x.view).mapped == info(x.b).mapped);
        CHECK_OK(fabpool_buffer_export_done(x.b));
    }
    pair_close(&x);
}

/* A view's mappings are a figure of their own, not cached memory (not
 * 40 MiB "cached" after trim(0)). */
static void views_counted_apart_from_cache(void)
{
    pair x;
    if (pair_open(&x, 64 * MB, 40 * MB)) {
        CHECK_OK(fabpool_trim(x.v, 0));
        fabpool_stats s = t_stats(x.v);
        CHECK(s.cached_bytes == 0);
        CHECK(s.view_bytes == info(x.b).mapped && s.mapped_bytes == s.view_bytes);
        CHECK_OK(fabpool_buffer_export_done(x.b));
    }
    pair_close(&x);
}

/* POSIX fds that do not fit their records are refused, nothing mapped,
 * every fd closed: a duplicated fd (side by side, or first and last), fds
 * swapped. */
static void fds_must_fit_records(void)
{
    pair x;
    if (!pair_open(&x, 1024 * MB, 64 * MB) || !x.posix) {
        pair_close(&x);
        return;
    }
    CHECK_OK(fabpool_view_close(x.view));
    x.view = NULL;
    CHECK_OK(fabpool_buffer_resize(x.b, 300 * MB, NULL)); /* chunks of different sizes */
    CHECK_OK(fabpool_buffer_export(x.b, 0, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds));
    CHECK(x.nfds >= 2);
    fabsim_ledger l0 = t_ledger();
    fabpool_view_t *v = NULL;
    /* the same fd twice */
    x.mine[0] = dup(x.fds[0]);
    x.mine[1] = dup(x.mine[0]);
    for (size_t i = 2; i < x.nfds; i++)
        x.mine[i] = dup(x.fds[i]);
    CHECK_STATUS(fabpool_view_open(x.v, x.d, x.len, x.mine, x.nfds, &v), FABPOOL_ERR_DESCRIPTOR);
    CHECK(v == NULL && strstr(fabpool_last_error(), "one file") != NULL);
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles);
    for (size_t i = 0; i < x.nfds; i++)
        CHECK(fcntl(x.mine[i], F_GETFD) == -1); /* fabpool took the fds: closed */
    /* the first record's file again at the last, the message naming both */
    dup_fds(x.fds, x.nfds, x.mine);
    close(x.mine[x.nfds - 1]);
    x.mine[x.nfds - 1] = dup(x.mine[0]);
    CHECK_STATUS(fabpool_view_open(x.v, x.d, x.len, x.mine, x.nfds, &v), FABPOOL_ERR_DESCRIPTOR);
    char both[64];
    snprintf(both, sizeof both, "fds 0 and %zu are one file", x.nfds - 1);
    CHECK(v == NULL && strstr(fabpool_last_error(), both) != NULL);
    CHECK(t_ledger().mappings == l0.mappings && t_ledger().handles == l0.handles);
    for (size_t i = 0; i < x.nfds; i++)
        CHECK(fcntl(x.mine[i], F_GETFD) == -1);
    /* two fds of different sizes swapped */
    dup_fds(x.fds, x.nfds, x.mine);
    int t = x.mine[0];
    x.mine[0] = x.mine[x.nfds - 1];
    x.mine[x.nfds - 1] = t;
    CHECK_STATUS(fabpool_view_open(x.v, x.d, x.len, x.mine, x.nfds, &v), FABPOOL_ERR_DESCRIPTOR);
    CHECK(v == NULL && strstr(fabpool_last_error(), "record's size") != NULL);
    l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles);
    CHECK(t_stats(x.v).mapped_bytes == 0);
    CHECK_OK(fabpool_buffer_export_done(x.b));
    pair_close(&x);
}

/* Destroying an exported buffer unmaps at once what no unacknowledged
 * generation names; the rest goes on an ack by export id or at pool destroy,
 * which answers OK (not kept until a peers_ack on the freed handle, with
 * pool destroy answering BUSY). */
static void destroy_frees_exported_buffer(void)
{
    pair x;
    if (pair_open(&x, 1024 * MB, 64 * MB)) {
        fabpool_buffer_info i = info(x.b);
        uint64_t id = i.export_id;
        CHECK(id != 0 && vinfo(x.view).export_id == id);
        CHECK_OK(fabpool_buffer_export_done(x.b));
        /* the peer acked what it was sent: the exporter keeps nothing after destroy */
        CHECK_OK(fabpool_buffer_peers_ack(x.b, vinfo(x.view).generation));
        CHECK_OK(fabpool_buffer_destroy(x.b, NULL));
        x.b = NULL;
        CHECK(t_stats(x.a).mapped_bytes == 0 && t_stats(x.a).buffers == 0);
        CHECK(get((uint64_t)(uintptr_t)fabpool_view_ptr(x.view)) == 77); /* the view's mapping keeps it */
        CHECK_STATUS(fabpool_peers_ack(x.a, id, UINT64_MAX), FABPOOL_ERR_NOT_FOUND); /* nothing left */

        /* a second buffer: exported, grown and exported again, the peer has not acked that */
        fabpool_buffer_t *b = NULL;
        CHECK_OK(fabpool_buffer_create(x.a, 1024 * MB, 64 * MB, &b));
        if (b) {
            CHECK_OK(fabpool_buffer_export(b, 0, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds));
            uint64_t g0 = info(b).generation;
            CHECK_OK(fabpool_buffer_export_done(b));
            CHECK_OK(fabpool_buffer_peers_ack(b, g0));
            CHECK_OK(fabpool_buffer_resize(b, 300 * MB, NULL));
            CHECK_OK(fabpool_buffer_export(b, g0, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds)); /* not acked */
            CHECK_OK(fabpool_buffer_export_done(b));
            CHECK_OK(fabpool_buffer_resize(b, 400 * MB, NULL)); /* never exported */
            uint64_t g2 = info(b).generation - 1, id2 = info(b).export_id;
            fabpool_buffer_info bi = info(b);
            CHECK_OK(fabpool_buffer_destroy(b, NULL));
            fabpool_stats s = t_stats(x.a);
            CHECK(s.buffers == 0);
            /* the chunks of the last grow went; those named by the unacked descriptor stay */
            CHECK(s.mapped_bytes > 0 && s.mapped_bytes < bi.mapped);
            CHECK_OK(fabpool_peers_ack(x.a, id2, g2));
            CHECK(t_stats(x.a).mapped_bytes == 0);
        }
        /* a third one, never acked: pool destroy takes it and answers OK */
        CHECK_OK(fabpool_buffer_create(x.a, 1024 * MB, 64 * MB, &b));
        if (b) {
            CHECK_OK(fabpool_buffer_export(b, 0, x.d, sizeof x.d, &x.len, x.fds, 64, &x.nfds));
            CHECK_OK(fabpool_buffer_export_done(b));
            CHECK_OK(fabpool_buffer_destroy(b, NULL));
            CHECK(t_stats(x.a).mapped_bytes > 0);
        }
    }
    pair_close(&x);
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held == 0 && t_ledger().handles == 0);
}

int main(void)
{
    t_driver_init();
    fault_set = (fault_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    fault_clear = (clear_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    option_fields_follow_conf_rules();
    failed_destroy_keeps_buffer();
    shrink_gives_memory_back();
    resize_set_refuses_duplicate();
    ack_of_unissued_generation_refused();
    failed_apply_keeps_view();
    views_counted_apart_from_cache();
    fds_must_fit_records();
    destroy_frees_exported_buffer();
    return t_done("test_buffer_contract");
}
