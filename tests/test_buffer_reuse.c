/* test_buffer_reuse: buffers released and reused (fabpool_buffer_release,
 * fabpool_buffer_reuse) and views released and opened again
 * (fabpool_view_release): a reuse keeps the base address and the data, maps
 * and exports only the chunks it lacks, takes the kept buffer nearest in
 * size, and everything kept goes back on a miss, after keep_ms, on trim,
 * sleep, out of memory and destroy; a view opened again imports only the new
 * chunks, and none of the memory it mapped before the exporter slept; a kept
 * view goes only to an open from the peer it was opened from, and outlives its buffer's destroy until the
 * importing pool sleeps; a sleep or a block allocation out of memory meets kept buffers.  Runs
 * against the simulated driver (the ledger, call counts) with
 * FABSIM_MEMORY=1GiB. */
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

typedef int (*fault_fn)(const char *, uint64_t, int, int);
typedef void (*clear_fn)(void);
static fault_fn fault_set;
static clear_fn fault_clear;

#define put t_put_word
#define get t_get_word

static fabpool_buffer_info info(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i;
}

static uint64_t calls(fabpool_t *p, const char *name)
{
    fabpool_stats s = t_stats(p);
    return t_calls(&s, name);
}

static fabpool_buffer_t *make(fabpool_t *p, size_t window, size_t size)
{
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, window, size, &b));
    return b;
}

/* A descriptor of the whole buffer; its fds stay the pool's (fabpool.h). */
typedef struct desc {
    unsigned char d[4096];
    size_t len, nfds;
    int fds[64];
} desc;

static void export_full(fabpool_buffer_t *b, desc *x)
{
    CHECK_OK(fabpool_buffer_export(b, 0, x->d, sizeof x->d, &x->len, x->fds, 64, &x->nfds));
}

/* A view from x in pool v (the fds dup'ed: the view takes its own). */
static fabpool_view_t *open_view(fabpool_t *v, const desc *x)
{
    int mine[64];
    for (size_t i = 0; i < x->nfds; i++)
        mine[i] = dup(x->fds[i]);
    fabpool_view_t *view = NULL;
    CHECK_OK(fabpool_view_open_peer(v, getpid(), x->d, x->len, mine, x->nfds, &view));
    return view;
}

/* An exporting pool of conf and a pool that views its buffers and keeps released views: 0, or -1 (both
 * destroyed) where the pools cannot share. */
static int share_pools(const char *conf, fabpool_t **a, fabpool_t **v)
{
    *a = t_pool(conf);
    *v = t_pool("handle_type:auto,keep_ms:60000");
    if (fabpool_handle_type_of(*a) != FABPOOL_HANDLE_NONE)
        return 0;
    fabpool_destroy(*a);
    fabpool_destroy(*v);
    return -1;
}

/* Released, the buffer keeps its chunks; reused larger, it keeps its base and
 * data, maps one chunk more, and its export makes one export call. */
static void reuse_grows_in_place(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("handle_type:auto,max_waste:0,keep_ms:60000");
    int shared = fabpool_handle_type_of(p) != FABPOOL_HANDLE_NONE;
    fabpool_buffer_t *b = make(p, 256 * MB, 8 * MB);
    void *base = fabpool_buffer_ptr(b);
    put(base, 0x1111);
    desc x;
    if (shared)
        export_full(b, &x);
    uint64_t ex0 = calls(p, "cuMemExportToShareableHandle");
    fabsim_ledger l1 = t_ledger();
    CHECK_OK(fabpool_buffer_release(b));
    fabpool_stats s = t_stats(p);
    CHECK(s.kept_bytes == 8 * MB && s.buffers == 0 && s.in_use_bytes == 0 && s.mapped_bytes >= 8 * MB);
    CHECK(t_ledger().mappings == l1.mappings && t_ledger().bytes_held == l1.bytes_held);
    CHECK_OK(fabpool_check(p));

    fabpool_buffer_t *r = NULL;
    CHECK_OK(fabpool_buffer_reuse(p, 24 * MB, NULL, &r));
    /* a new handle (the released one stays refused), at the released buffer's address, with its data */
    CHECK(r && r != b && fabpool_buffer_ptr(r) == base && get(base) == 0x1111);
    CHECK_STATUS(fabpool_buffer_destroy(b, NULL), FABPOOL_ERR_INVALID_ARG);
    fabpool_buffer_info in = info(r);
    CHECK(in.size == 24 * MB && in.mapped == 24 * MB && in.n_chunks == 2);
    CHECK(t_ledger().mappings == l1.mappings + 1 && t_ledger().bytes_held == l1.bytes_held + 16 * MB);
    s = t_stats(p);
    CHECK(s.kept_bytes == 0 && s.buffers == 1 && s.in_use_bytes == 24 * MB);
    if (shared) {
        export_full(r, &x);
        CHECK(x.len == fabpool_desc_size(2));
        CHECK(calls(p, "cuMemExportToShareableHandle") == ex0 + 1); /* the new chunk only */
    }
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(r, NULL));
    fabpool_destroy(p);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings);
}

/* The kept buffer nearest in size whose window holds the size; a miss gives
 * every kept buffer back. */
static void reuse_takes_nearest_and_miss_gives_back(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("max_waste:0,keep_ms:60000");
    fabpool_buffer_t *a = make(p, 64 * MB, 4 * MB), *b = make(p, 64 * MB, 16 * MB), *small = make(p, 8 * MB, 2 * MB);
    void *pa = fabpool_buffer_ptr(a), *pb = fabpool_buffer_ptr(b);
    CHECK_OK(fabpool_buffer_release(a));
    CHECK_OK(fabpool_buffer_release(b));
    CHECK_OK(fabpool_buffer_release(small));
    CHECK(t_stats(p).kept_bytes == 22 * MB);
    fabpool_buffer_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
    CHECK_OK(fabpool_buffer_reuse(p, 15 * MB, NULL, &r1));
    CHECK(r1 && fabpool_buffer_ptr(r1) == pb);
    CHECK_OK(fabpool_buffer_reuse(p, 3 * MB, NULL, &r2));
    CHECK(r2 && fabpool_buffer_ptr(r2) == pa);
    /* 40 MiB: the small buffer's window is 8 MiB: a miss, and it goes */
    CHECK_STATUS(fabpool_buffer_reuse(p, 40 * MB, NULL, &r3), FABPOOL_ERR_NOT_FOUND);
    CHECK(r3 == NULL && strstr(fabpool_last_error(), "create one"));
    fabpool_stats s = t_stats(p);
    CHECK(s.kept_bytes == 0 && s.buffers == 2);
    CHECK(t_ledger().bytes_held == l0.bytes_held + (16 + 4) * MB);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(r1, NULL));
    CHECK_OK(fabpool_buffer_destroy(r2, NULL));
    fabpool_destroy(p);
    CHECK(t_ledger().bytes_held == l0.bytes_held);
}

/* Kept memory goes back after keep_ms (at the next collect), on trim, at
 * destroy, and at once with keep_ms 0. */
static void kept_memory_goes_back(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("keep_ms:200,max_waste:0");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 8 * MB)));
    CHECK(t_ledger().bytes_held == l0.bytes_held + 8 * MB);
    CHECK_OK(fabpool_collect(p, 0));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 150) /* (a loaded machine: no claim) */
        CHECK(t_stats(p).kept_bytes == 8 * MB); /* not yet */
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_stats(p).kept_bytes == 0 && t_ledger().bytes_held == l0.bytes_held);
    fabpool_destroy(p);

    p = t_pool("keep_ms:60000,max_waste:0");
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 8 * MB)));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_stats(p).kept_bytes == 0 && t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 8 * MB)));
    fabpool_destroy(p); /* with a kept buffer: nothing leaks */
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings &&
          t_ledger().reservations == l0.reservations);

    /* sleep gives the kept buffers back (nothing of theirs is copied), and the pool wakes without them */
    p = t_pool("keep_ms:60000,max_waste:0");
    fabpool_buffer_t *live = make(p, 64 * MB, 4 * MB);
    t_put_word(fabpool_buffer_ptr(live), 0x5555);
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 8 * MB)));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK(t_stats(p).kept_bytes == 0 && t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK(t_get_word(fabpool_buffer_ptr(live)) == 0x5555);
    fabpool_buffer_t *none = NULL;
    CHECK_STATUS(fabpool_buffer_reuse(p, 8 * MB, NULL, &none), FABPOOL_ERR_NOT_FOUND);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(live, NULL));
    fabpool_destroy(p);

    p = t_pool("keep_ms:0");
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 8 * MB)));
    CHECK(t_stats(p).kept_bytes == 0 && t_ledger().bytes_held == l0.bytes_held);
    fabpool_buffer_t *r = NULL;
    CHECK_STATUS(fabpool_buffer_reuse(p, 8 * MB, NULL, &r), FABPOOL_ERR_NOT_FOUND);
    fabpool_destroy(p);
}

/* A buffer released while its pool sleeps is given back (fabpool_buffer_destroy), not kept: the sleep gave
 * back what was kept, a reuse is refused until the wake, and a kept buffer would count in kept_bytes memory the
 * pool does not map, which the wake would map and restore again for no caller.  Its handle is refused, the wake
 * maps only the live buffer, with its data, and a reuse after it finds nothing. */
static void release_asleep_gives_back(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
    fabpool_buffer_t *live = make(p, 64 * MB, 4 * MB), *gone = make(p, 64 * MB, 8 * MB), *r = NULL;
    t_put_word(fabpool_buffer_ptr(live), 0x5151);
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_buffer_release(gone));
    fabpool_stats s = t_stats(p);
    CHECK(s.kept_bytes == 0 && s.kept_bytes <= s.mapped_bytes && s.buffers == 1);
    CHECK(fabpool_buffer_ptr(gone) == NULL);
    CHECK_STATUS(fabpool_buffer_reuse(p, 8 * MB, NULL, &r), FABPOOL_ERR_ASLEEP);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK(t_stats(p).kept_bytes == 0 && t_stats(p).mapped_bytes == 4 * MB);
    CHECK(t_ledger().bytes_held == l0.bytes_held + 4 * MB);
    CHECK(t_get_word(fabpool_buffer_ptr(live)) == 0x5151);
    CHECK_STATUS(fabpool_buffer_reuse(p, 8 * MB, NULL, &r), FABPOOL_ERR_NOT_FOUND);
    CHECK(r == NULL);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(live, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().bytes_held_host == l0.bytes_held_host);
}

/* Out of device memory (1 GiB here), a grow gives the kept buffers back and
 * tries again. */
static void out_of_memory_takes_kept_back(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
    CHECK_OK(fabpool_buffer_release(make(p, 1024 * MB, 600 * MB)));
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 1024 * MB, 700 * MB, &b)); /* 1,300 MiB with the kept one */
    fabpool_stats s = t_stats(p);
    CHECK(b && s.kept_bytes == 0 && s.buffers == 1);
    CHECK(t_ledger().bytes_held == l0.bytes_held + 700 * MB);
    if (b)
        CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_destroy(p);
}

/* Out of device memory, a block allocation (fabpool_alloc, the stream pair's, fabpool_alloc_aligned) gives the
 * kept buffers back too, and tries again: the block is given out, counted as a retry, with its bytes alone held. */
static void block_out_of_memory_takes_kept_back(void)
{
    CUstream st = NULL;
    CHECK_CU(cuStreamCreate(&st, 0));
    for (int how = 0; how < 3; how++) {
        fabsim_ledger l0 = t_ledger();
        fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
        CHECK_OK(fabpool_buffer_release(make(p, 1024 * MB, 600 * MB)));
        void *x = NULL;
        fabpool_status s = how == 0 ? fabpool_alloc(p, 700 * MB, &x)
                           : how == 1 ? fabpool_alloc_on_stream(p, 700 * MB, st, &x)
                                      : fabpool_alloc_aligned(p, 700 * MB, 2 * MB, &x);
        CHECK_OK(s); /* 1,300 MiB with the kept buffer */
        fabpool_stats ss = t_stats(p);
        CHECK(x && ss.kept_bytes == 0 && ss.buffers == 0 && ss.oom_retries == 1);
        CHECK(t_ledger().bytes_held == l0.bytes_held + ss.mapped_bytes && ss.mapped_bytes >= 700 * MB);
        if (x) {
            put(x, 0x600d);
            put((char *)x + 700 * MB - 8, 0xe0d);
            CHECK(get(x) == 0x600d && get((char *)x + 700 * MB - 8) == 0xe0d);
            CHECK_OK(how == 1 ? fabpool_free_on_stream(p, x, st) : fabpool_free(p, x));
        }
        CHECK_OK(fabpool_check(p));
        CHECK_OK(fabpool_destroy(p));
        CHECK(t_ledger().bytes_held == l0.bytes_held);
    }
    CHECK_CU(cuStreamDestroy(st));
}

/* A pool whose exported buffer was released (or destroyed) before its peers acknowledged it refuses to sleep:
 * the peers may still map its chunks.  Its handle is refused by then, so the message names the way that is
 * left, fabpool_peers_ack with the export id it gives; that acknowledgement lets the sleep go (a kept buffer
 * given back with it), and the wake finds the live buffer's data. */
static void sleep_refused_by_gone_export_names_the_ack(void)
{
    for (int how = 0; how < 2; how++) {
        fabsim_ledger l0 = t_ledger();
        fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
        if (!p || fabpool_handle_type_of(p) == FABPOOL_HANDLE_NONE) {
            fabpool_destroy(p);
            return;
        }
        fabpool_buffer_t *live = make(p, 64 * MB, 4 * MB), *b = make(p, 64 * MB, 8 * MB);
        put(fabpool_buffer_ptr(live), 0x51ee9);
        uint64_t id = info(b).export_id;
        desc x;
        export_full(b, &x);
        CHECK_OK(how ? fabpool_buffer_destroy(b, NULL) : fabpool_buffer_release(b));
        CHECK_STATUS(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL), FABPOOL_ERR_BUSY);
        char want[96];
        snprintf(want, sizeof want, "(export id 0x%llx, %s)", (unsigned long long)id,
                 how ? "destroyed" : "released and kept for reuse");
        const char *m = fabpool_last_error();
        CHECK(strstr(m, want) && strstr(m, "call fabpool_peers_ack with that export id with UINT64_MAX") &&
              !strstr(m, "fabpool_buffer_peers_ack"));
        if (!strstr(m, want) || strstr(m, "fabpool_buffer_peers_ack"))
            fprintf(stderr, "  the message: %s\n", m);
        CHECK(!t_sleep_info(p).asleep && t_stats(p).kept_bytes == (how ? 0 : 8 * MB));
        CHECK_STATUS(fabpool_buffer_peers_ack(b, UINT64_MAX), FABPOOL_ERR_INVALID_ARG); /* the handle is gone */
        CHECK_OK(fabpool_peers_ack(p, id, UINT64_MAX));
        CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK(t_stats(p).kept_bytes == 0 && t_sleep_info(p).offloaded_bytes == 4 * MB);
        CHECK_OK(fabpool_wake(p, NULL));
        CHECK(get(fabpool_buffer_ptr(live)) == 0x51ee9);
        CHECK_OK(fabpool_check(p));
        CHECK_OK(fabpool_buffer_destroy(live, NULL));
        CHECK_OK(fabpool_destroy(p));
        fabsim_ledger l1 = t_ledger();
        CHECK(t_ledger_same(&l0, &l1));
    }
}

/* A kept view outlives its buffer's destroy in the exporting pool (the view's mappings hold the memory: the
 * driver keeps it), and goes, with that memory, when the importing pool sleeps: nothing of it is offloaded and
 * the pool wakes without it; a view of a new buffer then opens and reads that buffer's data. */
static void kept_view_outlives_destroy_until_importer_sleeps(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *a = NULL, *v = NULL;
    if (share_pools("handle_type:auto,max_waste:0", &a, &v) != 0)
        return;
    fabpool_buffer_t *b = make(a, 64 * MB, 8 * MB);
    put(fabpool_buffer_ptr(b), 0x4444);
    desc x;
    export_full(b, &x);
    fabpool_view_t *view = open_view(v, &x);
    CHECK(view && get(fabpool_view_ptr(view)) == 0x4444);
    CHECK_OK(fabpool_view_release(view));
    CHECK_OK(fabpool_buffer_export_done(b));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK(t_mapped(a) == 0 && t_stats(v).kept_bytes == 8 * MB && t_stats(v).view_bytes == 8 * MB);
    CHECK(t_ledger().bytes_held == l0.bytes_held + 8 * MB); /* the kept view's mapping holds it */
    CHECK_OK(fabpool_check(v));

    CHECK_OK(fabpool_sleep(v, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info si = t_sleep_info(v);
    CHECK(si.asleep && si.offloaded_bytes == 0 && si.host_bytes == 0);
    CHECK(t_stats(v).kept_bytes == 0 && t_stats(v).view_bytes == 0 && t_ledger().bytes_held == l0.bytes_held);
    CHECK_OK(fabpool_wake(v, NULL));
    CHECK(t_mapped(v) == 0);

    b = make(a, 64 * MB, 8 * MB);
    put(fabpool_buffer_ptr(b), 0x5555);
    export_full(b, &x);
    view = open_view(v, &x);
    CHECK(view && get(fabpool_view_ptr(view)) == 0x5555);
    CHECK_OK(fabpool_check(v));
    if (view)
        CHECK_OK(fabpool_view_close(view));
    CHECK_OK(fabpool_buffer_export_done(b));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(v));
    CHECK_OK(fabpool_destroy(a));
    fabsim_ledger l1 = t_ledger();
    CHECK(t_ledger_same(&l0, &l1));
}

/* Wrong uses, refused with nothing changed. */
static void refusals(void)
{
    fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
    fabpool_buffer_t *b = make(p, 64 * MB, 8 * MB), *r = (fabpool_buffer_t *)1;
    CHECK_STATUS(fabpool_buffer_release(NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_buffer_reuse(NULL, 8, NULL, &r), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_buffer_reuse(p, 8, NULL, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_buffer_reuse(p, 0, NULL, &r), FABPOOL_ERR_INVALID_ARG);
    CHECK(r == NULL);
    CHECK_OK(fabpool_buffer_release(b));
    CHECK_STATUS(fabpool_buffer_release(b), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_buffer_destroy(b, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_buffer_resize(b, 16 * MB, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK(t_stats(p).kept_bytes == 8 * MB);
    CHECK_OK(fabpool_check(p));
    fabpool_destroy(p);
}

/* A released view opened again from the next full descriptor of its buffer:
 * the same address, the new chunk alone imported, the old data there; after
 * the exporter slept and woke, every chunk is new memory and is imported. */
static void view_reopens_kept(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *a = NULL, *v = NULL;
    if (share_pools("handle_type:auto,max_waste:0,keep_ms:60000", &a, &v) != 0)
        return;
    fabpool_buffer_t *b = make(a, 256 * MB, 8 * MB);
    put(fabpool_buffer_ptr(b), 0x2222);
    desc x;
    export_full(b, &x);
    fabpool_view_t *view = open_view(v, &x);
    void *at = fabpool_view_ptr(view);
    CHECK(get(at) == 0x2222);
    CHECK_OK(fabpool_view_release(view));
    CHECK(t_stats(v).kept_bytes == 8 * MB && t_stats(v).view_bytes == 8 * MB);
    CHECK_STATUS(fabpool_view_close(view), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_view_release(view), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_check(v));

    CHECK_OK(fabpool_buffer_resize(b, 40 * MB, NULL));
    put((char *)fabpool_buffer_ptr(b) + 39 * MB, 0x3333);
    export_full(b, &x);
    uint64_t im0 = calls(v, "cuMemImportFromShareableHandle");
    fabpool_view_t *again = open_view(v, &x);
    CHECK(again && again != view && fabpool_view_ptr(again) == at); /* a new handle: the released one is refused */
    CHECK_STATUS(fabpool_view_close(view), FABPOOL_ERR_INVALID_ARG);
    CHECK(calls(v, "cuMemImportFromShareableHandle") == im0 + 1);
    CHECK(get(at) == 0x2222 && get((char *)at + 39 * MB) == 0x3333);
    CHECK(t_stats(v).kept_bytes == 0 && t_stats(v).view_bytes == 40 * MB);
    CHECK_OK(fabpool_check(v));

    /* the exporter sleeps and wakes: its chunks are new memory, named by new generations */
    CHECK_OK(fabpool_view_release(again));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX)); /* (sleep refuses a buffer peers may map) */
    CHECK_OK(fabpool_sleep(a, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_wake(a, NULL));
    export_full(b, &x);
    im0 = calls(v, "cuMemImportFromShareableHandle");
    fabpool_view_t *woken = open_view(v, &x);
    CHECK(calls(v, "cuMemImportFromShareableHandle") == im0 + 2);
    CHECK(woken && get(fabpool_view_ptr(woken)) == 0x2222 && get((char *)fabpool_view_ptr(woken) + 39 * MB) == 0x3333);
    put(fabpool_buffer_ptr(b), 0x4444);
    CHECK(woken && get(fabpool_view_ptr(woken)) == 0x4444); /* the exporter's memory, not the old */

    /* a trim closes kept views */
    CHECK_OK(fabpool_view_release(woken));
    CHECK_OK(fabpool_trim(v, 0));
    CHECK(t_stats(v).kept_bytes == 0 && t_stats(v).view_bytes == 0);
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_destroy(v);
    fabpool_destroy(a);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings);
}

/* A chunk dropped and mapped again at the same offset and size is new memory: a view opened again maps it, not
 * the chunk it kept (the generation tells them apart). */
static void view_takes_new_chunk_at_same_offset(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *a = NULL, *v = NULL;
    if (share_pools("handle_type:auto,max_waste:0,shrink_hysteresis:0,keep_ms:60000", &a, &v) != 0)
        return;
    fabpool_buffer_t *b = make(a, 64 * MB, 4 * MB);
    CHECK_OK(fabpool_buffer_resize(b, 8 * MB, NULL)); /* a second chunk of 4 MiB at +4 MiB */
    char *top = (char *)fabpool_buffer_ptr(b) + 6 * MB;
    put(top, 0x6666);
    desc x;
    export_full(b, &x);
    fabpool_view_t *view = open_view(v, &x);
    CHECK(view && get((char *)fabpool_view_ptr(view) + 6 * MB) == 0x6666);
    CHECK_OK(fabpool_view_release(view));
    /* the second chunk goes (the peer acknowledged) and a new one of the same size comes at the same offset */
    CHECK_OK(fabpool_buffer_resize(b, 4 * MB, NULL));
    CHECK_OK(fabpool_buffer_peers_ack(b, info(b).generation));
    CHECK_OK(fabpool_collect(a, 1));
    CHECK(info(b).mapped == 4 * MB && t_stats(a).retiring_bytes == 0);
    uint64_t gen_dropped = info(b).generation;
    CHECK_OK(fabpool_buffer_resize(b, 8 * MB, NULL));
    CHECK(info(b).n_chunks == 2 && info(b).generation > gen_dropped);
    put(top, 0x7777);
    export_full(b, &x);
    fabpool_view_t *again = open_view(v, &x);
    CHECK(again && again != view && get((char *)fabpool_view_ptr(again) + 6 * MB) == 0x7777);
    CHECK_OK(fabpool_view_close(again));
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_destroy(v);
    fabpool_destroy(a);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings);
}

/* A reuse whose growth the driver refuses gives the released buffer back: nothing stays mapped, reserved or
 * counted, and the pool goes on. */
/* A released view is taken back only by an open that vouches for the same peer: a descriptor that names the
 * buffer from another peer (its fds anything: pipes here) opens no kept view, so its fds are imported and
 * refused; fabpool_view_open (no peer vouched for) takes none either, and the view it opens is closed at its
 * release: nothing kept that no open could take back. */
static void kept_view_goes_only_to_its_peer(void)
{
    fabsim_ledger l0 = t_ledger();
    fabpool_t *a = NULL, *v = NULL;
    if (share_pools("handle_type:auto,keep_ms:60000", &a, &v) != 0)
        return;
    fabpool_buffer_t *b = make(a, 64 * MB, 8 * MB);
    put(fabpool_buffer_ptr(b), 0x7777);
    desc x;
    export_full(b, &x);
    fabpool_view_t *view = open_view(v, &x);
    void *at = fabpool_view_ptr(view);
    uint64_t mapped = info(b).mapped;
    CHECK_OK(fabpool_view_release(view));
    CHECK(t_stats(v).kept_bytes == mapped);
    int junk[64];
    for (int by_peer = 1; by_peer >= 0; by_peer--) {
        for (size_t i = 0; i < x.nfds; i++) {
            int pp[2];
            CHECK(pipe(pp) == 0);
            junk[i] = pp[0];
            close(pp[1]);
        }
        uint64_t im0 = calls(v, "cuMemImportFromShareableHandle");
        fabpool_view_t *other = NULL;
        fabpool_status st = by_peer ? fabpool_view_open_peer(v, getpid() + 1, x.d, x.len, junk, x.nfds, &other)
                                    : fabpool_view_open(v, x.d, x.len, junk, x.nfds, &other);
        if (x.nfds) { /* POSIX fds: the pipes were imported, and refused */
            CHECK(st != FABPOOL_OK && other == NULL);
        } else { /* fabric: the handles are the descriptor's own, a view afresh */
            CHECK(st == FABPOOL_OK && other && fabpool_view_ptr(other) != at);
            CHECK_OK(fabpool_view_close(other));
        }
        CHECK(calls(v, "cuMemImportFromShareableHandle") > im0);
        for (size_t i = 0; i < x.nfds; i++)
            CHECK(fcntl(junk[i], F_GETFD) == -1); /* fabpool took them: closed */
        CHECK(t_stats(v).kept_bytes == mapped); /* the kept view stays as it was */
    }
    uint64_t im0 = calls(v, "cuMemImportFromShareableHandle");
    fabpool_view_t *again = open_view(v, &x); /* the peer itself: taken back, nothing imported */
    CHECK(again && again != view && fabpool_view_ptr(again) == at && get(at) == 0x7777);
    CHECK(calls(v, "cuMemImportFromShareableHandle") == im0);
    CHECK_OK(fabpool_view_close(again));
    /* opened with no peer vouched for: closed at its release */
    int mine[64];
    for (size_t i = 0; i < x.nfds; i++)
        mine[i] = dup(x.fds[i]);
    fabpool_view_t *plain = NULL;
    CHECK_OK(fabpool_view_open(v, x.d, x.len, mine, x.nfds, &plain));
    CHECK_OK(fabpool_view_release(plain));
    CHECK(t_stats(v).kept_bytes == 0 && t_stats(v).view_bytes == 0);
    /* a pid that is no process's: refused, its fds closed */
    for (size_t i = 0; i < x.nfds; i++)
        mine[i] = dup(x.fds[i]);
    CHECK_STATUS(fabpool_view_open_peer(v, 0, x.d, x.len, mine, x.nfds, &plain), FABPOOL_ERR_INVALID_ARG);
    for (size_t i = 0; i < x.nfds; i++)
        CHECK(fcntl(mine[i], F_GETFD) == -1);
    CHECK_OK(fabpool_buffer_export_done(b));
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_destroy(v);
    fabpool_destroy(a);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings);
}

static void failed_reuse_gives_buffer_back(void)
{
    if (!fault_set)
        return;
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool("keep_ms:60000,max_waste:0");
    CHECK_OK(fabpool_buffer_release(make(p, 64 * MB, 4 * MB)));
    fault_set("cuMemCreate", 1, 1, CUDA_ERROR_UNKNOWN);
    fabpool_buffer_t *r = NULL;
    fabpool_status st = fabpool_buffer_reuse(p, 32 * MB, NULL, &r);
    fault_clear();
    CHECK(st != FABPOOL_OK && r == NULL && strstr(fabpool_last_error(), "given back"));
    fabpool_stats s = t_stats(p);
    CHECK(s.kept_bytes == 0 && s.buffers == 0 && s.in_use_bytes == 0);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().mappings == l0.mappings);
    CHECK_OK(fabpool_check(p));
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 8 * MB, &b));
    if (b)
        CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_destroy(p);
    CHECK(t_ledger().bytes_held == l0.bytes_held && t_ledger().reservations == l0.reservations);
}

int main(void)
{
    if (!t_driver_init()) {
        printf("test_buffer_reuse: needs the simulated driver (ledger, call counts); skipped\n");
        return 77;
    }
    fault_set = (fault_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    fault_clear = (clear_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    reuse_grows_in_place();
    reuse_takes_nearest_and_miss_gives_back();
    kept_memory_goes_back();
    release_asleep_gives_back();
    out_of_memory_takes_kept_back();
    block_out_of_memory_takes_kept_back();
    sleep_refused_by_gone_export_names_the_ack();
    kept_view_outlives_destroy_until_importer_sleeps();
    refusals();
    view_reopens_kept();
    view_takes_new_chunk_at_same_offset();
    kept_view_goes_only_to_its_peer();
    failed_reuse_gives_buffer_back();
    return t_done("test_buffer_reuse");
}
