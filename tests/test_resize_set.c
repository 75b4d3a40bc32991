/* A set of buffers resized at once is all or nothing.
 *  - a set shrunk when a shrink would refit a chunk (replace it by a smaller
 *    one) but the device has no memory for the smaller chunk: every buffer
 *    still reaches its size, the chunk that could not be refit stays mapped
 *    whole, and every byte below the new sizes is kept;
 *  - every driver call of a set that grows some buffers and shrinks others
 *    (with and without a stream, with a refit, with a retired chunk that a
 *    grow takes back), made to fail in turn: the call either resizes every
 *    buffer, or answers an error and changes nothing a caller can see (each
 *    buffer's size, mapped bytes, chunk count and generation, the pool's
 *    retiring bytes, the data). */
#include "testutil.h"
#include "driver_calls.h"

#define MB (1ull << 20)

static void fill(fabpool_buffer_t *b, size_t n, unsigned char v)
{
    CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(b), v, n));
}

static int kept(fabpool_buffer_t *b, size_t n, unsigned char v)
{
    unsigned char first = 0, last = 0;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)fabpool_buffer_ptr(b);
    if (cuMemcpyDtoH(&first, at, 1) != CUDA_SUCCESS || cuMemcpyDtoH(&last, at + n - 1, 1) != CUDA_SUCCESS)
        return 0;
    return first == v && last == v;
}

static size_t size_of(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i.size;
}

/* x (64 MiB in two 32 MiB chunks) shrinks to 30 MiB by retiring a chunk; y
 * (100 MiB) to 1 MiB must refit its first chunk, and the device has no memory
 * for the smaller one (every cuMemCreate fails, on the simulated driver). */
static void shrink_set_without_memory(void)
{
    t_sim_hooks h = t_sim_hooks_get();
    if (!h.fault_set) {
        printf("test_resize_set: the driver injects no faults: skipped\n");
        return;
    }
    fabpool_t *p = t_pool("max_chunk:32MiB,handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL, *y = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 64 * MB, &x));
    CHECK_OK(fabpool_buffer_create(p, 100 * MB, 100 * MB, &y));
    if (!x || !y)
        return;
    fill(x, 64 * MB, 0x5a);
    fill(y, 100 * MB, 0xa5);
    fabpool_buffer_t *set[2] = {x, y};
    size_t sizes[2] = {30 * MB, 1 * MB};
    h.fault_set("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_OK(fabpool_buffer_resize_set(set, sizes, 2, NULL));
    h.fault_clear();
    CHECK(size_of(x) == 30 * MB && size_of(y) == 1 * MB);
    CHECK(kept(x, 30 * MB, 0x5a) && kept(y, 1 * MB, 0xa5));
    CHECK_OK(fabpool_check(p));
    /* with memory again, the next shrink refits what stayed whole */
    uint64_t before = t_mapped(p);
    CHECK_OK(fabpool_buffer_resize(y, 1 * MB, NULL));
    CHECK(t_mapped(p) + 16 * MB <= before);
    CHECK(kept(y, 1 * MB, 0xa5));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* ---------------------------------------------------------------- every fault of a mixed set */

enum { NSET = 2 };

typedef struct scenario {
    const char *name;
    size_t max[NSET], from[NSET], to[NSET];
    int on_stream;                     /* the set resizes on a stream (else NULL: synchronized) */
    int retired;                       /* buffer 0 was shrunk from max on a held stream first: its retired chunk
                                          waits, and the set's grow takes it back */
} scenario;

static const scenario scenarios[] = {
    {"one grows, one shrinks", {32 * MB, 16 * MB}, {1 * MB, 16 * MB}, {16 * MB, 8 * MB}, 0, 0},
    {"both shrink", {16 * MB, 16 * MB}, {16 * MB, 16 * MB}, {8 * MB, 8 * MB}, 0, 0},
    {"one grows, one shrinks, on a stream", {32 * MB, 16 * MB}, {1 * MB, 16 * MB}, {16 * MB, 8 * MB}, 1, 0},
    {"a retired chunk taken back, one grows", {16 * MB, 32 * MB}, {8 * MB, 1 * MB}, {16 * MB, 24 * MB}, 0, 1},
    {"a refit and a grow", {26 * MB, 32 * MB}, {26 * MB, 1 * MB}, {1 * MB, 16 * MB}, 0, 0},
    {"a refit and a shrink, on a stream", {26 * MB, 16 * MB}, {26 * MB, 16 * MB}, {1 * MB, 8 * MB}, 1, 0},
};

typedef struct world {
    fabpool_t *p;
    fabpool_buffer_t *b[NSET];
    CUstream s;
    fabpool_buffer_info info[NSET];
    uint64_t retiring;
} world;

static fabpool_buffer_info info_of(fabpool_buffer_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    return i;
}

static int build(world *w, const scenario *sc, t_sim_hooks *h)
{
    memset(w, 0, sizeof *w);
    w->p = t_pool("max_chunk:8MiB,handle_type:none");
    if (!w->p || cuStreamCreate(&w->s, 0) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < NSET; i++) {
        size_t first = sc->retired && i == 0 ? sc->max[i] : sc->from[i];
        if (fabpool_buffer_create(w->p, sc->max[i], first, &w->b[i]) != FABPOOL_OK)
            return -1;
        fill(w->b[i], first, (unsigned char)(0x11 * (i + 1)));
    }
    if (sc->retired) { /* the chunk it drops waits for the held stream's work */
        h->hold(w->s);
        if (fabpool_buffer_resize(w->b[0], sc->from[0], w->s) != FABPOOL_OK)
            return -1;
    }
    for (int i = 0; i < NSET; i++)
        w->info[i] = info_of(w->b[i]);
    w->retiring = t_stats(w->p).retiring_bytes;
    return 0;
}

static void unbuild(world *w, t_sim_hooks *h)
{
    if (w->s) {
        h->release(w->s);
        cuStreamDestroy(w->s);
    }
    for (int i = 0; i < NSET; i++)
        if (w->b[i])
            CHECK_OK(fabpool_buffer_destroy(w->b[i], NULL));
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
}

static fabpool_status run_set(world *w, const scenario *sc)
{
    return fabpool_buffer_resize_set(w->b, sc->to, NSET, sc->on_stream ? (void *)w->s : NULL);
}

static int n_trials, n_refused, n_absorbed;

/* Call n of entry e fails during the set: all or nothing. */
static void fault_trial(const scenario *sc, t_sim_hooks *h, size_t e, uint64_t n)
{
    world w;
    if (build(&w, sc, h) != 0) {
        CHECK(!"the scenario could not be built");
        unbuild(&w, h);
        return;
    }
    uint64_t c0 = h->calls(entries[e]);
    h->fault_set(entries[e], n, 0, CUDA_ERROR_UNKNOWN);
    fabpool_status st = run_set(&w, sc);
    h->fault_clear();
    int fired = h->calls(entries[e]) - c0 >= n;
    n_trials++;
    int bad = 0;
    if (st == FABPOOL_OK) {
        n_absorbed += fired;
        for (int i = 0; i < NSET; i++) {
            size_t keep = sc->to[i] < sc->from[i] ? sc->to[i] : sc->from[i];
            bad |= info_of(w.b[i]).size != sc->to[i] || !kept(w.b[i], keep, (unsigned char)(0x11 * (i + 1)));
        }
    } else {
        n_refused++;
        for (int i = 0; i < NSET; i++) {
            fabpool_buffer_info a = info_of(w.b[i]), b0 = w.info[i];
            bad |= a.size != b0.size || a.mapped != b0.mapped || a.n_chunks != b0.n_chunks ||
                   a.generation != b0.generation || !kept(w.b[i], b0.size, (unsigned char)(0x11 * (i + 1)));
            if (a.size != b0.size || a.mapped != b0.mapped || a.n_chunks != b0.n_chunks || a.generation != b0.generation)
                fprintf(stderr, "  buffer %d: size %zu -> %zu, mapped %zu -> %zu, chunks %u -> %u, generation "
                        "%llu -> %llu\n", i, b0.size, a.size, b0.mapped, a.mapped, b0.n_chunks, a.n_chunks,
                        (unsigned long long)b0.generation, (unsigned long long)a.generation);
        }
        bad |= t_stats(w.p).retiring_bytes != w.retiring;
    }
    CHECK(!bad);
    if (bad)
        fprintf(stderr, "  %s: call %llu of %s failed; the set answered %s (%s)\n", sc->name, (unsigned long long)n,
                entries[e], fabpool_status_name(st), st == FABPOOL_OK ? "" : fabpool_last_error());
    CHECK_OK(fabpool_check(w.p));
    /* the pool goes on: the set resizes with the driver well */
    if (st != FABPOOL_OK)
        CHECK_OK(run_set(&w, sc));
    unbuild(&w, h);
}

static void set_is_all_or_nothing_under_faults(void)
{
    t_sim_hooks h = t_sim_hooks_get();
    if (!h.fault_set || !h.calls || !h.hold) {
        printf("test_resize_set: the driver injects no faults: skipped\n");
        return;
    }
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
        const scenario *sc = &scenarios[k];
        uint64_t made[N_ENTRIES];
        world w;
        if (build(&w, sc, &h) != 0) {
            CHECK(!"the scenario could not be built");
            unbuild(&w, &h);
            continue;
        }
        t_calls_mark(&h, made);
        CHECK_OK(run_set(&w, sc));
        t_calls_since(&h, made);
        unbuild(&w, &h);
        for (size_t e = 0; e < N_ENTRIES; e++)
            for (uint64_t n = 1; n <= made[e]; n++)
                fault_trial(sc, &h, e, n);
    }
    printf("test_resize_set: %d faults, %d refused with nothing changed, %d absorbed\n", n_trials, n_refused,
           n_absorbed);
}

int main(void)
{
    t_driver_init();
    shrink_set_without_memory();
    set_is_all_or_nothing_under_faults();
    return t_done("test_resize_set");
}
