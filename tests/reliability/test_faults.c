/* test_faults: every driver call of every public operation, made to fail.
 *
 * For each operation: a clean run counts the calls it makes, per entry point
 * (fabsim_calls).  Then for every one of those calls (the n-th call of entry
 * point E, for each E and n) and for each of four errors, the state is built
 * again from nothing, call n of E is made to fail (fabsim_fault_set), and the
 * operation runs.  Right after it, whatever it answered, the sim's ledger
 * matches the pools' stats (bytes mapped, mappings, handles, exported fds).
 * After each failure:
 *   - the operation returned an error with a message that names the failed call
 *     and no other in its place (or it absorbed the fault: an OOM answered by a
 *     trim and a retry, a failure in a call whose result does not matter; then
 *     its result is checked);
 *   - it changed nothing visible: a buffer keeps its size and mapping, the pool
 *     maps what it mapped (an OOM may have trimmed cached memory: not more), a
 *     view keeps its generation and mapping, a buffer whose destroy failed is
 *     still alive and a second destroy frees it;
 *   - data already in the pool's memory reads back intact;
 *   - with faults cleared, the pool still allocates and grows;
 *   - the calling thread's current context is the one it had (a driver call
 *     the pool makes in its own context gives the caller's back, even where
 *     asking which one was current failed);
 *   - once everything is destroyed, the simulated driver holds nothing: no
 *     handle, mapping, reservation, exported fd or byte.
 * Sim only: fault injection is a feature of the simulated driver. */
#include <unistd.h>

#include "../testutil.h"
#include "../driver_calls.h"

#define MB (1ull << 20)

typedef int (*fault_set_fn)(const char *, uint64_t, int, int);
typedef void (*fault_clear_fn)(void);
typedef uint64_t (*calls_fn)(const char *);
typedef int (*hold_fn)(void *);
static fault_set_fn fault_set;
static fault_clear_fn fault_clear;
static calls_fn calls;
static hold_fn stream_hold, stream_release;

static const struct {
    int err;
    const char *name;
} errors[] = {
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
};

enum op {
    OP_CREATE, OP_ALLOC_SMALL, OP_ALLOC_LARGE, OP_FREE, OP_BUF_CREATE, OP_GROW, OP_SHRINK, OP_RESIZE_SET,
    OP_TRIM, OP_COLLECT, OP_EXPORT, OP_VIEW_OPEN, OP_VIEW_APPLY, OP_VIEW_CLOSE, OP_BUF_DESTROY, OP_DESTROY,
    OP_SHRINK_STREAM, OP_BUF_DESTROY_STREAM, OP_DMABUF, OP_SLEEP, OP_WAKE, OP_BLOCK_EXPORT, OP_DESTROY_STREAMS,
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
    "pool create", "alloc 1000 B", "alloc 20 MiB", "free (cache_limit 0)", "buffer create", "buffer grow",
    "buffer shrink", "resize_set", "trim", "collect", "export", "view open", "view apply", "view close",
    "buffer destroy", "pool destroy", "shrink on a stream", "destroy on a stream", "dma-buf of 16 MiB",
    "sleep (offload)", "wake", "block export (100 MiB)", "pool destroy (stream records)",
};

typedef struct {
    fabpool_t *p, *q, *np;
    fabpool_buffer_t *b, *set[3], *nb;
    void *blk, *out, *freed;
    fabpool_view_t *v;
    CUstream s;
    uint8_t desc[1 << 14];
    size_t len, nfds;
    int fds[64];
    size_t b_size, mark_size, set_size[3];
    int p_gone, b_gone, v_gone;
} state;

static void put(uint64_t at, uint64_t v) { CHECK_CU(cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v)); }
static uint64_t get(uint64_t at)
{
    uint64_t v = ~0ull;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)at, sizeof v));
    return v;
}
static uint64_t B(fabpool_buffer_t *b) { return (uint64_t)(uintptr_t)fabpool_buffer_ptr(b); }
static size_t bsize(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    fabpool_buffer_get_info(b, &i);
    return i.size;
}

/* marks: values written at known places, read back after every failure */
static void mark_buf(fabpool_buffer_t *b, uint64_t tag)
{
    size_t sz = bsize(b);
    put(B(b), tag);
    put(B(b) + sz - 8, tag + 1);
}
static int buf_ok(fabpool_buffer_t *b, uint64_t tag, size_t upto)
{
    return get(B(b)) == tag && get(B(b) + upto - 8) == tag + 1;
}

static int dup_fds(const int *fds, size_t n, int *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = dup(fds[i]);
    return 0;
}

static int setup(state *t, enum op op)
{
    memset(t, 0, sizeof *t);
    if (op == OP_CREATE)
        return 0;
    fabpool_options o;
    fabpool_options_init(&o);
    if (op == OP_FREE)
        o.cache_limit_bytes = 0; /* a free goes back to the driver at once */
    if (fabpool_create(&o, &t->p) != FABPOOL_OK)
        return -1;
    if (fabpool_alloc(t->p, 64 << 10, &t->blk) != FABPOOL_OK)
        return -1;
    put((uint64_t)(uintptr_t)t->blk, 0xb10c);
    t->b_size = 16 * MB;
    if (fabpool_buffer_create(t->p, 512 * MB, t->b_size, &t->b) != FABPOOL_OK)
        return -1;
    if (op == OP_SHRINK || op == OP_COLLECT || op == OP_SHRINK_STREAM) { /* grown in steps: several chunks, so a
                                                                          shrink drops some */
        for (size_t sz = 40 * MB; sz <= 100 * MB; sz += 30 * MB)
            if (fabpool_buffer_resize(t->b, sz, NULL) != FABPOOL_OK)
                return -1;
        t->b_size = 100 * MB;
    }
    mark_buf(t->b, 0xbeef);
    t->mark_size = t->b_size;
    switch (op) {
    case OP_SLEEP:
    case OP_WAKE: /* some cache too: sleep trims it */
        if (fabpool_alloc(t->p, 20 * MB, &t->freed) != FABPOOL_OK || fabpool_free(t->p, t->freed) != FABPOOL_OK)
            return -1;
        t->freed = NULL;
        if (op == OP_WAKE && fabpool_sleep(t->p, FABPOOL_SLEEP_OFFLOAD, NULL) != FABPOOL_OK)
            return -1;
        break;
    case OP_FREE:
        if (fabpool_alloc(t->p, 20 * MB, &t->freed) != FABPOOL_OK)
            return -1;
        break;
    case OP_BLOCK_EXPORT: /* a large block of several chunks (freed at cleanup) */
        if (fabpool_alloc(t->p, 100 * MB, &t->freed) != FABPOOL_OK)
            return -1;
        break;
    case OP_DESTROY: /* nothing live: the memory is cached, and destroy gives it all back */
    case OP_DESTROY_STREAMS:
        if (fabpool_free(t->p, t->blk) != FABPOOL_OK || fabpool_buffer_destroy(t->b, NULL) != FABPOOL_OK)
            return -1;
        t->blk = NULL;
        t->b = NULL;
        if (op == OP_DESTROY_STREAMS) { /* the records of two streams (one owned the pool, then another ended
                                           that), their frees done: nothing live, records and spare events left */
            void *a = NULL, *c = NULL;
            if (cuStreamCreate(&t->s, 0) != CUDA_SUCCESS ||
                fabpool_alloc_on_stream(t->p, 4096, t->s, &a) != FABPOOL_OK ||
                fabpool_alloc_on_stream(t->p, 4096, NULL, &c) != FABPOOL_OK ||
                fabpool_free_on_stream(t->p, a, t->s) != FABPOOL_OK ||
                fabpool_free_on_stream(t->p, c, NULL) != FABPOOL_OK || fabpool_collect(t->p, 1) != FABPOOL_OK)
                return -1;
        }
        break;
    case OP_RESIZE_SET:
        for (int i = 0; i < 3; i++) {
            t->set_size[i] = (size_t)(4 + 6 * i) * MB;
            if (fabpool_buffer_create(t->p, 256 * MB, t->set_size[i], &t->set[i]) != FABPOOL_OK)
                return -1;
            mark_buf(t->set[i], 0x5e70 + 16 * (uint64_t)i);
        }
        break;
    case OP_TRIM:
        for (int i = 0; i < 4; i++) {
            void *x;
            if (fabpool_alloc(t->p, (size_t)(1 + 7 * i) * MB, &x) != FABPOOL_OK || fabpool_free(t->p, x) != FABPOOL_OK)
                return -1;
        }
        break;
    case OP_SHRINK_STREAM:
    case OP_BUF_DESTROY_STREAM: /* the events of a retirement: cuEventCreate, cuEventRecord */
        if (cuStreamCreate(&t->s, 0) != CUDA_SUCCESS)
            return -1;
        break;
    case OP_COLLECT:
        if (cuStreamCreate(&t->s, 0) != CUDA_SUCCESS || stream_hold(t->s) != 0)
            return -1;
        if (fabpool_buffer_resize(t->b, 8 * MB, t->s) != FABPOOL_OK)
            return -1;
        t->b_size = 8 * MB;
        break;
    case OP_VIEW_OPEN:
    case OP_VIEW_APPLY:
    case OP_VIEW_CLOSE:
        if (fabpool_create(NULL, &t->q) != FABPOOL_OK)
            return -1;
        if (fabpool_buffer_export(t->b, 0, t->desc, sizeof t->desc, &t->len, t->fds, 64, &t->nfds) != FABPOOL_OK)
            return -1;
        if (op != OP_VIEW_OPEN) {
            int mine[64];
            dup_fds(t->fds, t->nfds, mine);
            if (fabpool_view_open(t->q, t->desc, t->len, mine, t->nfds, &t->v) != FABPOOL_OK)
                return -1;
            fabpool_buffer_info bi = {.struct_size = sizeof bi};
            fabpool_buffer_get_info(t->b, &bi);
            fabpool_buffer_export_done(t->b);
            if (fabpool_buffer_resize(t->b, 64 * MB, NULL) != FABPOOL_OK)
                return -1;
            put(B(t->b) + 64 * MB - 8, 0xde17a);
            if (fabpool_buffer_export(t->b, bi.generation, t->desc, sizeof t->desc, &t->len, t->fds, 64, &t->nfds) !=
                FABPOOL_OK)
                return -1;
        }
        break;
    default:
        break;
    }
    return 0;
}

static fabpool_status run(state *t, enum op op)
{
    int mine[64];
    switch (op) {
    case OP_CREATE:
        return fabpool_create(NULL, &t->np);
    case OP_ALLOC_SMALL:
        return fabpool_alloc(t->p, 1000, &t->out);
    case OP_ALLOC_LARGE:
        return fabpool_alloc(t->p, 20 * MB, &t->out);
    case OP_FREE: {
        fabpool_status st = fabpool_free(t->p, t->freed);
        if (st == FABPOOL_OK)
            t->freed = NULL;
        return st;
    }
    case OP_BUF_CREATE:
        return fabpool_buffer_create(t->p, 256 * MB, 40 * MB, &t->nb);
    case OP_GROW:
        return fabpool_buffer_resize(t->b, 100 * MB, NULL);
    case OP_SHRINK:
        return fabpool_buffer_resize(t->b, 8 * MB, NULL);
    case OP_SHRINK_STREAM:
        return fabpool_buffer_resize(t->b, 8 * MB, t->s);
    case OP_RESIZE_SET: {
        size_t sizes[3] = {40 * MB, 70 * MB, 130 * MB};
        return fabpool_buffer_resize_set(t->set, sizes, 3, NULL);
    }
    case OP_TRIM:
        return fabpool_trim(t->p, 0);
    case OP_COLLECT:
        return fabpool_collect(t->p, 1);
    case OP_EXPORT:
        return fabpool_buffer_export(t->b, 0, t->desc, sizeof t->desc, &t->len, t->fds, 64, &t->nfds);
    case OP_VIEW_OPEN:
        dup_fds(t->fds, t->nfds, mine);
        return fabpool_view_open(t->q, t->desc, t->len, mine, t->nfds, &t->v);
    case OP_VIEW_APPLY:
        dup_fds(t->fds, t->nfds, mine);
        return fabpool_view_apply(t->v, t->desc, t->len, mine, t->nfds);
    case OP_VIEW_CLOSE:
        t->v_gone = 1; /* a view is gone after close, whatever it answered */
        return fabpool_view_close(t->v);
    case OP_BUF_DESTROY:
        t->b_gone = 1;
        return fabpool_buffer_destroy(t->b, NULL);
    case OP_BUF_DESTROY_STREAM:
        t->b_gone = 1;
        return fabpool_buffer_destroy(t->b, t->s);
    case OP_DESTROY:
    case OP_DESTROY_STREAMS:
        t->p_gone = 1;
        return fabpool_destroy(t->p);
    case OP_DMABUF: /* the fd lands in fds[0]: result_ok checks its size and closes it */
        t->fds[0] = -1;
        return fabpool_buffer_dmabuf(t->b, 0, 16 * MB, &t->fds[0]);
    case OP_SLEEP:
        return fabpool_sleep(t->p, FABPOOL_SLEEP_OFFLOAD, NULL);
    case OP_WAKE:
        return fabpool_wake(t->p, NULL);
    case OP_BLOCK_EXPORT: {
        size_t off = 0;
        return fabpool_block_export(t->p, t->freed, t->desc, sizeof t->desc, &t->len, t->fds, 64, &t->nfds, &off);
    }
    default:
        return FABPOOL_ERR_INVALID_ARG;
    }
}

/* what a successful run must have done (also after an absorbed fault) */
static int result_ok(state *t, enum op op)
{
    switch (op) {
    case OP_CREATE:
        return t->np != NULL;
    case OP_ALLOC_SMALL:
    case OP_ALLOC_LARGE:
        if (!t->out)
            return 0;
        put((uint64_t)(uintptr_t)t->out, 0xa110c);
        return get((uint64_t)(uintptr_t)t->out) == 0xa110c;
    case OP_BUF_CREATE:
        if (!t->nb)
            return 0;
        put(B(t->nb) + 40 * MB - 8, 7);
        return get(B(t->nb) + 40 * MB - 8) == 7;
    case OP_GROW:
        put(B(t->b) + 100 * MB - 8, 9);
        return bsize(t->b) == 100 * MB && get(B(t->b) + 100 * MB - 8) == 9;
    case OP_SHRINK:
    case OP_SHRINK_STREAM:
        return bsize(t->b) == 8 * MB;
    case OP_RESIZE_SET:
        return bsize(t->set[0]) == 40 * MB && bsize(t->set[1]) == 70 * MB && bsize(t->set[2]) == 130 * MB;
    case OP_VIEW_OPEN:
        return t->v && get((uint64_t)(uintptr_t)fabpool_view_ptr(t->v)) == 0xbeef;
    case OP_VIEW_APPLY:
        return get((uint64_t)(uintptr_t)fabpool_view_ptr(t->v) + 64 * MB - 8) == 0xde17a;
    case OP_DMABUF: {
        int ok = t->fds[0] >= 0 && lseek(t->fds[0], 0, SEEK_END) == (off_t)(16 * MB) && t_ledger().dmabuf_fds == 1;
        if (t->fds[0] >= 0)
            close(t->fds[0]);
        t->fds[0] = -1;
        return ok && t_ledger().dmabuf_fds == 0;
    }
    case OP_SLEEP: { /* nothing mapped, the driver holds no device byte of it; a wake brings the data back */
        fabpool_sleep_info si = {.struct_size = sizeof si};
        fabpool_sleep_state(t->p, &si);
        int ok = si.asleep && t_mapped(t->p) == 0 && t_ledger().bytes_held == 0 && si.host_bytes > 0 &&
                 t_ledger().bytes_held_host == si.host_bytes;
        return fabpool_wake(t->p, NULL) == FABPOOL_OK && ok && buf_ok(t->b, 0xbeef, t->mark_size) &&
               get((uint64_t)(uintptr_t)t->blk) == 0xb10c && t_ledger().bytes_held_host == 0;
    }
    case OP_BLOCK_EXPORT: { /* a record and an open fd per chunk, and the ledger's count of exported fds */
        uint32_t n = 0;
        memcpy(&n, t->desc + 12, sizeof n);
        int ok = n >= 4 && t->nfds == n && t_ledger().exported_fds == n;
        for (size_t i = 0; i < t->nfds; i++)
            ok = ok && lseek(t->fds[i], 0, SEEK_END) >= 0;
        return ok;
    }
    case OP_WAKE: {
        fabpool_sleep_info si = {.struct_size = sizeof si};
        fabpool_sleep_state(t->p, &si);
        return !si.asleep && si.host_bytes == 0 && t_ledger().bytes_held_host == 0 && t_mapped(t->p) > 0 &&
               buf_ok(t->b, 0xbeef, t->mark_size);
    }
    default:
        return 1;
    }
}

static void cleanup(state *t)
{
    if (t->np)
        fabpool_destroy(t->np);
    if (t->v && !t->v_gone)
        fabpool_view_close(t->v);
    if (t->p_gone) {
        if (t->q)
            fabpool_destroy(t->q);
        if (t->s)
            cuStreamDestroy(t->s);
        return;
    }
    if (t->b && !t->b_gone) {
        fabpool_buffer_export_done(t->b);
        fabpool_buffer_peers_ack(t->b, UINT64_MAX);
        fabpool_buffer_destroy(t->b, NULL);
    }
    for (int i = 0; i < 3; i++)
        if (t->set[i])
            fabpool_buffer_destroy(t->set[i], NULL);
    if (t->nb)
        fabpool_buffer_destroy(t->nb, NULL);
    if (t->out)
        fabpool_free(t->p, t->out);
    if (t->freed)
        fabpool_free(t->p, t->freed);
    if (t->blk)
        fabpool_free(t->p, t->blk);
    if (t->p)
        fabpool_destroy(t->p);
    if (t->q)
        fabpool_destroy(t->q);
    if (t->s) {
        stream_release(t->s);
        cuStreamDestroy(t->s);
    }
}

/* The sim's ledger against the stats of every pool alive in the trial: what
 * the driver maps, its mappings, handles and exported fds are what the pools
 * say they hold.  Returns 0 and prints both sides if not. */
static int ledger_matches(const state *t, const char *when)
{
    fabpool_t *pools[3] = {t->p_gone ? NULL : t->p, t->q, t->np};
    uint64_t mapped = 0, handles = 0, fds = 0, chunks = 0;
    for (int i = 0; i < 3; i++) {
        fabpool_stats s = {.struct_size = sizeof s};
        fabpool_sleep_info si = {.struct_size = sizeof si};
        if (!pools[i] || fabpool_get_stats(pools[i], &s) != FABPOOL_OK ||
            fabpool_sleep_state(pools[i], &si) != FABPOOL_OK)
            continue;
        mapped += s.mapped_bytes + si.host_bytes; /* a sleeping pool's host copies are mapped too */
        chunks += si.host_copies;
        handles += s.handles_outstanding;
        fds += s.exported_fds_open;
        chunks += s.chunks_mapped;
    }
    fabsim_ledger l = t_ledger();
    int ok = l.bytes_mapped == mapped && l.handles == handles && l.exported_fds == fds && l.mappings == chunks;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  ledger %s: the sim maps %llu bytes in %llu mappings, holds %llu handles and %llu exported "
                        "fds; the pools say %llu bytes, %llu chunks, %llu handles, %llu fds\n",
                when, (unsigned long long)l.bytes_mapped, (unsigned long long)l.mappings,
                (unsigned long long)l.handles, (unsigned long long)l.exported_fds, (unsigned long long)mapped,
                (unsigned long long)chunks, (unsigned long long)handles, (unsigned long long)fds);
    return ok;
}

/* fabpool_check of every pool alive in the trial: the pool's own
 * structures are consistent after every operation, failed or not. */
static void pools_check(const state *t, const char *when)
{
    fabpool_t *pools[3] = {t->p_gone ? NULL : t->p, t->q, t->np};
    for (int i = 0; i < 3; i++) {
        if (!pools[i])
            continue;
        fabpool_status st = fabpool_check(pools[i]);
        CHECK_OK(st);
        if (st != FABPOOL_OK)
            fprintf(stderr, "  fabpool_check %s: %s\n", when, fabpool_last_error());
    }
}

/* The first entry point other than entries[e] that msg names, or NULL. */
static const char *other_call(const char *msg, size_t e)
{
    for (size_t j = 0; j < N_ENTRIES; j++) {
        if (j == e)
            continue;
        const char *at = strstr(msg, entries[j]);
        size_t n = strlen(entries[j]);
        /* a whole name, not the start of a longer one (cuEventDestroy in cuEventDestroy_v2 is fine) */
        while (at && ((at[n] >= 'a' && at[n] <= 'z') || (at[n] >= 'A' && at[n] <= 'Z')))
            at = strstr(at + 1, entries[j]);
        if (at)
            return entries[j];
    }
    return NULL;
}

static int ledger_empty(void)
{
    fabsim_ledger l = t_ledger();
    return l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0 &&
           l.allocations == 0 && l.dmabuf_fds == 0 && l.bytes_held_host == 0;
}

static void count_calls(uint64_t *c)
{
    for (size_t e = 0; e < N_ENTRIES; e++)
        c[e] = calls(entries[e]);
}

static int n_ops, n_calls, n_faults, n_absorbed, n_unreached;

/* One trial: call n of entry e fails with error k during op. */
static void trial(enum op op, size_t e, uint64_t n, int k)
{
    state t;
    int failures0 = t_failures;
    fabsim_ledger l0 = t_ledger();
    if (setup(&t, op) != 0) {
        CHECK(!"setup failed");
        cleanup(&t);
        return;
    }
    /* what is visible before: the pool's mapping, the buffer's, the view's */
    uint64_t mapped0 = t.p ? t_mapped(t.p) : 0;
    fabpool_buffer_info bi0 = {.struct_size = sizeof bi0}, vi0 = {.struct_size = sizeof vi0};
    if (t.b)
        fabpool_buffer_get_info(t.b, &bi0);
    if (t.v)
        fabpool_view_get_info(t.v, &vi0);
    uint64_t fds0 = t.p ? t_stats(t.p).exported_fds_open : 0;
    CUcontext ctx0 = NULL, ctx1 = NULL;
    CHECK_CU(cuCtxGetCurrent(&ctx0));
    uint64_t c0 = calls(entries[e]);
    fault_set(entries[e], n, 0, errors[k].err);
    fabpool_status st = run(&t, op);
    fault_clear();
    CHECK_CU(cuCtxGetCurrent(&ctx1));
    CHECK(ctx1 == ctx0);
    if (ctx1 != ctx0) { /* the caller's next driver call would fail: given back for the trials that follow */
        fprintf(stderr, "  the thread's current context was %p before the operation, %p after\n", (void *)ctx0,
                (void *)ctx1);
        cuCtxSetCurrent(ctx0);
    }
    ledger_matches(&t, "right after the operation");
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    pools_check(&t, "right after the operation");
    uint64_t made = calls(entries[e]) - c0;
    n_faults++;
    if (made < n) {
        n_unreached++; /* the operation took another path this time: the fault never fired */
    } else if (st == FABPOOL_OK) {
        n_absorbed++;
        CHECK(result_ok(&t, op));
    } else {
        CHECK(msg[0] != 0);
        /* the message names the call that failed, or says what the failure meant */
        CHECK(strstr(msg, entries[e]) != NULL || strstr(msg, errors[k].name) != NULL ||
              (errors[k].err == CUDA_ERROR_OUT_OF_MEMORY && st == FABPOOL_ERR_OUT_OF_MEMORY));
        /* ... and does not name another call in its place (a failed cuEventCreate is not "cuEventRecord failed") */
        const char *other = strstr(msg, entries[e]) ? NULL : other_call(msg, e);
        CHECK(other == NULL);
        if (other)
            fprintf(stderr, "  the message names %s, but %s failed\n", other, entries[e]);
        int oom = errors[k].err == CUDA_ERROR_OUT_OF_MEMORY;
        /* on failure a buffer keeps its old size and mapping */
        if (op == OP_GROW || op == OP_SHRINK || op == OP_SHRINK_STREAM) {
            fabpool_buffer_info bi = {.struct_size = sizeof bi};
            fabpool_buffer_get_info(t.b, &bi);
            CHECK(bsize(t.b) == t.b_size && bi.mapped == bi0.mapped && bi.generation == bi0.generation);
        }
        /* the pool maps what it mapped (after an OOM it may have trimmed its cache: not more); a collect or a
         * trim that fails half-way has unmapped some of what it was asked to: that is their job */
        /* a wake that fails keeps what it mapped (the next goes on); a sleep that fails has trimmed the cache */
        if (op == OP_WAKE) {
            fabpool_sleep_info si = {.struct_size = sizeof si};
            fabpool_sleep_state(t.p, &si);
            CHECK(si.asleep && si.host_bytes > 0);
            CHECK_OK(fabpool_wake(t.p, NULL));
        }
        if (t.p && !t.p_gone && op != OP_COLLECT && op != OP_TRIM && op != OP_WAKE) {
            uint64_t m = t_mapped(t.p);
            int le = oom || op == OP_SLEEP;
            CHECK(le ? m <= mapped0 : m == mapped0);
            if (le ? m > mapped0 : m != mapped0)
                fprintf(stderr, "  the pool maps %llu bytes after the failure, %llu before\n", (unsigned long long)m,
                        (unsigned long long)mapped0);
        }
        /* a view keeps what it maps */
        if (op == OP_VIEW_APPLY) {
            fabpool_buffer_info vi = {.struct_size = sizeof vi};
            fabpool_view_get_info(t.v, &vi);
            CHECK(vi.generation == vi0.generation && vi.mapped == vi0.mapped && vi.n_chunks == vi0.n_chunks);
            CHECK(get((uint64_t)(uintptr_t)fabpool_view_ptr(t.v)) == 0xbeef);
        }
        /* a buffer whose destroy failed is alive, keeps its data, and a second destroy frees it */
        if (op == OP_BUF_DESTROY || op == OP_BUF_DESTROY_STREAM) {
            t.b_gone = 0;
            CHECK(bsize(t.b) == t.b_size);
            CHECK(get(B(t.b)) == 0xbeef);
            fabpool_status again = fabpool_buffer_destroy(t.b, NULL);
            CHECK_OK(again);
            if (again == FABPOOL_OK) {
                t.b_gone = 1;
                CHECK_OK(fabpool_collect(t.p, 1));
                uint64_t m = t_mapped(t.p);
                CHECK(m + bi0.mapped <= mapped0);
                if (m + bi0.mapped > mapped0)
                    fprintf(stderr, "  after a second destroy the pool maps %llu bytes; %llu before the first, of "
                                    "which the buffer %llu\n", (unsigned long long)m, (unsigned long long)mapped0,
                            (unsigned long long)bi0.mapped);
            } else {
                fabpool_stats s = {.struct_size = sizeof s};
                fabpool_get_stats(t.p, &s);
                fprintf(stderr, "  a second destroy of the buffer answered %s (%s); the pool maps %llu bytes, "
                                "%llu retiring\n", fabpool_status_name(again), fabpool_last_error(),
                        (unsigned long long)s.mapped_bytes, (unsigned long long)s.retiring_bytes);
                t.b_gone = 1;
            }
        }
        /* a block export that fails keeps no fd it made */
        if (op == OP_BLOCK_EXPORT)
            CHECK(t_stats(t.p).exported_fds_open == fds0);
        if (op == OP_RESIZE_SET)
            for (int i = 0; i < 3; i++)
                CHECK(bsize(t.set[i]) == t.set_size[i]);
        if (op == OP_ALLOC_SMALL || op == OP_ALLOC_LARGE)
            t.out = NULL;
    }
    /* data already there is intact */
    if (!t.p_gone && t.p) {
        if (t.blk)
            CHECK(get((uint64_t)(uintptr_t)t.blk) == 0xb10c);
        if (t.b && !t.b_gone) {
            CHECK(get(B(t.b)) == 0xbeef);
            if (bsize(t.b) >= t.mark_size) /* the tail mark is still inside the buffer */
                CHECK(buf_ok(t.b, 0xbeef, t.mark_size));
        }
        for (int i = 0; i < 3; i++)
            if (t.set[i])
                CHECK(get(B(t.set[i])) == 0x5e70 + 16 * (uint64_t)i);
        /* the pool still works */
        void *x = NULL;
        CHECK_OK(fabpool_alloc(t.p, 3000, &x));
        if (x) {
            put((uint64_t)(uintptr_t)x, 77);
            CHECK(get((uint64_t)(uintptr_t)x) == 77);
            CHECK_OK(fabpool_free(t.p, x));
        }
        if (t.b && !t.b_gone) {
            size_t sz = bsize(t.b) + 24 * MB;
            CHECK_OK(fabpool_buffer_resize(t.b, sz, NULL));
            CHECK(get(B(t.b)) == 0xbeef);
        }
    }
    if (op == OP_CREATE) {
        fabpool_t *p2 = NULL;
        CHECK_OK(fabpool_create(NULL, &p2));
        if (p2)
            fabpool_destroy(p2);
    }
    pools_check(&t, "after the checks that follow the operation");
    cleanup(&t);
    /* nothing left behind by this trial (the figures before it were zero unless an earlier one leaked) */
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.handles == l0.handles && l1.mappings == l0.mappings && l1.reservations == l0.reservations &&
          l1.exported_fds == l0.exported_fds && l1.bytes_held == l0.bytes_held && l1.dmabuf_fds == l0.dmabuf_fds &&
          l1.bytes_held_host == l0.bytes_held_host);
    if (t_failures != failures0) {
        fabsim_ledger l = t_ledger();
        fprintf(stderr, "  ^ %s: call %llu of %s failed with %s: %s -> %s; ledger: %llu handles, %llu mappings, "
                        "%llu reservations, %llu fds, %llu bytes\n",
                op_names[op], (unsigned long long)n, entries[e], errors[k].name, fabpool_status_name(st), msg,
                (unsigned long long)l.handles, (unsigned long long)l.mappings, (unsigned long long)l.reservations,
                (unsigned long long)l.exported_fds, (unsigned long long)l.bytes_held);
    }
}

int main(int argc, char **argv)
{
    int sim = t_driver_init();
    fault_set = (fault_set_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    fault_clear = (fault_clear_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    calls = (calls_fn)dlsym(RTLD_DEFAULT, "fabsim_calls");
    stream_hold = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    stream_release = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    if (!sim || !fault_set || !calls) {
        printf("test_faults: fault injection needs the simulated driver; skipped\n");
        return 0;
    }
    int only = argc > 1 ? atoi(argv[1]) : -1; /* one operation, by index, to debug */
    /* the driver is loaded by the first pool of the process: sweep the steady state */
    fabpool_t *warm = NULL;
    CHECK_OK(fabpool_create(NULL, &warm));
    if (warm)
        fabpool_destroy(warm);
    for (int op = 0; op < OP_COUNT; op++) {
        if (only >= 0 && op != only)
            continue;
        /* the clean run: which calls does the operation make? */
        state t;
        uint64_t before[N_ENTRIES], after[N_ENTRIES];
        CHECK(setup(&t, (enum op)op) == 0);
        count_calls(before);
        CHECK_OK(run(&t, (enum op)op));
        count_calls(after);
        CHECK(result_ok(&t, (enum op)op));
        cleanup(&t);
        CHECK(ledger_empty());
        n_ops++;
        int op_calls = 0;
        for (size_t e = 0; e < N_ENTRIES; e++) {
            uint64_t d = after[e] - before[e];
            op_calls += (int)d;
            for (uint64_t n = 1; n <= d; n++)
                for (int k = 0; k < 4; k++)
                    trial((enum op)op, e, n, k);
        }
        n_calls += op_calls;
        printf("  %-22s %3d driver calls swept\n", op_names[op], op_calls);
    }
    printf("test_faults: %d operations, %d driver calls, %d faults injected (%d absorbed by the pool, %d not "
           "reached on that path)\n",
           n_ops, n_calls, n_faults, n_absorbed, n_unreached);
    CHECK(n_unreached == 0 || n_unreached < n_faults / 10);
    CHECK(ledger_empty());
    return t_done("test_faults");
}
