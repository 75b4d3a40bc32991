/* test_stream_pair_faults: fabpool_alloc_on_stream and fabpool_free_on_stream refused by the driver change
 * nothing of the owner stream, nor does a fabpool_alloc (or fabpool_alloc_aligned) of another user, which ends
 * the owner mode only when it succeeds (white-box: the pool's owner mode and owner are read from retire.h's
 * record).
 * Every driver call each makes, in each state the pool can be in (no owner yet, the stream the owner, another
 * stream the owner, a block with a recorded stream), is made to fail in turn.  After a refusal:
 *  - alloc (either): *out is NULL, the owner mode and owner are as before, the pool's in-use bytes too;
 *  - free: the block is live (fabpool_usable_size as before, its bytes read back), the owner mode and owner
 *    are as before, the in-use bytes too, and a second free of it on the same stream succeeds.
 * Then the pool passes fabpool_check, everything is freed, and after destroy the driver holds nothing.  Also,
 * with no fault: a fabpool_alloc that the thread cache could serve (the fast path), of the class of a block the
 * owner freed at once while its work pends, first waits for that work (stream_fences) and ends the owner mode. */
#include "testutil.h"
#include "driver_calls.h"
#include "retire.h"
#include "tcache.h"

#define MB (1ull << 20)

typedef struct world {
    fabpool_t *p;
    CUstream s1, s2;
    void *x;                           /* the block a free scenario frees */
    fabsim_ledger before;
} world;

typedef struct scenario {
    const char *name;
    int is_free;                       /* the operation: fabpool_free_on_stream(x, s1), else alloc_on_stream(s1);
                                          PLAIN: fabpool_alloc, ALIGNED: fabpool_alloc_aligned (1 MiB) */
    size_t size;
    int setup;                         /* what comes first (below) */
} scenario;

enum { PLAIN = 2, ALIGNED = 3 };

enum {
    FRESH,                             /* nothing: the pool has no owner */
    OWN_S1,                            /* s1 is the owner: a block allocated and freed on it */
    OWN_S2,                            /* s2 is the owner, and freed a block at once (a fence is due) */
    OWNERLESS,                         /* the owner mode ended (fabpool_alloc after an owner's free) */
    RECORDED,                          /* s1 the owner, the block used on s2 too (fabpool_record_stream) */
    FRESH_RECORDED                     /* no owner, a fabpool_alloc block used on s2 too */
};

static const scenario scenarios[] = {
    {"alloc, no owner yet", 0, 1000, FRESH},
    {"alloc of a large block, no owner yet", 0, 4 * MB, FRESH},
    {"alloc on the owner, a new chunk", 0, 48 * MB, OWN_S1},
    {"alloc on another stream than the owner", 0, 4 * MB, OWN_S2},
    {"alloc after the owner mode ended", 0, 4 * MB, OWNERLESS},
    {"free of a fabpool_alloc block, no owner yet", 1, 1000, FRESH},
    {"free of a large fabpool_alloc block, no owner yet", 1, 4 * MB, FRESH},
    {"free on the owner", 1, 4 * MB, OWN_S1},
    {"free on another stream than the owner", 1, 1000, OWN_S2},
    {"free of a large block on another stream than the owner", 1, 4 * MB, OWN_S2},
    {"free after the owner mode ended", 1, 4 * MB, OWNERLESS},
    {"free of a recorded block on the owner", 1, 1000, RECORDED},
    {"free of a recorded large block on the owner", 1, 4 * MB, RECORDED},
    {"free of a recorded block, no owner yet", 1, 1000, FRESH_RECORDED},
    {"free of a recorded large block, no owner yet", 1, 4 * MB, FRESH_RECORDED},
    {"fabpool_alloc of a new chunk while a stream owns the pool", PLAIN, 48 * MB, OWN_S2},
    {"fabpool_alloc of a small block while a stream owns the pool", PLAIN, 3000, OWN_S2},
    {"fabpool_alloc_aligned of a new chunk while a stream owns the pool", ALIGNED, 40 * MB, OWN_S2},
};

typedef struct owner_state {
    int mode;
    void *owner;
} owner_state;

static owner_state owner_of(fabpool_t *p)
{
    fp_retire *r = fp_alloc_of(p)->retire;
    owner_state o = {atomic_load(&r->owner_mode), NULL};
    if (o.mode == FP_OWNER_ON)
        o.owner = r->owner;
    return o;
}

static int build(world *w, const scenario *sc)
{
    memset(w, 0, sizeof *w);
    w->before = t_ledger();
    w->p = t_pool("stream_owner:1");
    if (!w->p || cuStreamCreate(&w->s1, 0) != CUDA_SUCCESS || cuStreamCreate(&w->s2, 0) != CUDA_SUCCESS)
        return -1;
    void *y = NULL;
    switch (sc->setup) {
    case OWN_S1:
    case RECORDED:
        if (fabpool_alloc_on_stream(w->p, 1000, w->s1, &y) || fabpool_free_on_stream(w->p, y, w->s1))
            return -1;
        break;
    case OWN_S2:
        if (fabpool_alloc_on_stream(w->p, 1000, w->s2, &y) || fabpool_free_on_stream(w->p, y, w->s2))
            return -1;
        break;
    case OWNERLESS:
        if (fabpool_alloc_on_stream(w->p, 1000, w->s2, &y) || fabpool_free_on_stream(w->p, y, w->s2) ||
            fabpool_alloc(w->p, 1000, &y) || fabpool_free(w->p, y))
            return -1;
        break;
    }
    if (sc->is_free == 1) {
        fabpool_status st = sc->setup == FRESH || sc->setup == FRESH_RECORDED ? fabpool_alloc(w->p, sc->size, &w->x)
                            : sc->setup == OWN_S2 ? fabpool_alloc_on_stream(w->p, sc->size, w->s2, &w->x)
                                                  : fabpool_alloc_on_stream(w->p, sc->size, w->s1, &w->x);
        if (st != FABPOOL_OK)
            return -1;
        t_put_tag(w->x, 1000, 0xb10c);
        if ((sc->setup == RECORDED || sc->setup == FRESH_RECORDED) && fabpool_record_stream(w->p, w->x, w->s2) != FABPOOL_OK)
            return -1;
    }
    return 0;
}

static int unbuild(world *w)
{
    if (w->p)
        CHECK_OK(fabpool_destroy(w->p));
    if (w->s1)
        cuStreamDestroy(w->s1);
    if (w->s2)
        cuStreamDestroy(w->s2);
    fabsim_ledger l = t_ledger(), b = w->before;
    return l.bytes_held != b.bytes_held || l.mappings != b.mappings || l.handles != b.handles ||
           l.reservations != b.reservations ? -1 : 0;
}

static fabpool_status op(world *w, const scenario *sc, void **out)
{
    *out = NULL;
    if (sc->is_free >= PLAIN)
        return sc->is_free == PLAIN ? fabpool_alloc(w->p, sc->size, out)
                                    : fabpool_alloc_aligned(w->p, sc->size, MB, out);
    if (sc->is_free)
        return fabpool_free_on_stream(w->p, w->x, w->s1);
    return fabpool_alloc_on_stream(w->p, sc->size, w->s1, out);
}

/* A block op allocated, freed as it came. */
static void give_back(world *w, const scenario *sc, void *out)
{
    CHECK_OK(sc->is_free >= PLAIN ? fabpool_free(w->p, out) : fabpool_free_on_stream(w->p, out, w->s1));
}

static int n_trials, n_refused;

static void trial(const scenario *sc, t_sim_hooks *h, size_t e, uint64_t n)
{
    world w;
    if (build(&w, sc) != 0) {
        CHECK(!"the scenario could not be built");
        (void)unbuild(&w);
        return;
    }
    owner_state o0 = owner_of(w.p);
    uint64_t in_use = t_stats(w.p).in_use_bytes, pending = t_counters(w.p).stream_pending_blocks;
    size_t usable0 = 0;
    if (sc->is_free == 1)
        CHECK_OK(fabpool_usable_size(w.p, w.x, &usable0));
    void *out = (void *)&w;
    h->fault_set(entries[e], n, 0, CUDA_ERROR_UNKNOWN);
    fabpool_status st = op(&w, sc, &out);
    h->fault_clear();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    n_trials++;
    int bad = 0;
    if (st != FABPOOL_OK) {
        n_refused++;
        owner_state o1 = owner_of(w.p);
        if (o1.mode != o0.mode || o1.owner != o0.owner) {
            fprintf(stderr, "  the owner mode was %d (stream %p), it is %d (stream %p)\n", o0.mode, o0.owner,
                    o1.mode, o1.owner);
            bad = 1;
        }
        if (t_stats(w.p).in_use_bytes != in_use || t_counters(w.p).stream_pending_blocks != pending) {
            fprintf(stderr, "  in use %llu -> %llu bytes, stream-pending blocks %llu -> %llu\n",
                    (unsigned long long)in_use, (unsigned long long)t_stats(w.p).in_use_bytes,
                    (unsigned long long)pending, (unsigned long long)t_counters(w.p).stream_pending_blocks);
            bad = 1;
        }
        if (sc->is_free != 1) {
            bad |= out != NULL;
        } else {
            size_t usable = 0;
            if (fabpool_usable_size(w.p, w.x, &usable) != FABPOOL_OK || usable != usable0 ||
                !t_tag_ok(w.x, 1000, 0xb10c)) {
                fprintf(stderr, "  the block is not live as it was (usable %zu, was %zu)\n", usable, usable0);
                bad = 1;
            }
            t_put_tag(w.x, 1000, 0x5eed); /* still the caller's to write */
            bad |= !t_tag_ok(w.x, 1000, 0x5eed);
            /* freed again on the same stream, as if the refused call never was */
            if (fabpool_free_on_stream(w.p, w.x, w.s1) != FABPOOL_OK) {
                fprintf(stderr, "  the second free is refused: %s\n", fabpool_last_error());
                bad = 1;
            }
        }
    } else if (sc->is_free != 1) {
        bad |= out == NULL;
        bad |= sc->is_free >= PLAIN && owner_of(w.p).mode != FP_OWNER_OFF; /* another user's: it ends the mode */
        give_back(&w, sc, out);
    }
    if (fabpool_check(w.p) != FABPOOL_OK) {
        fprintf(stderr, "  fabpool_check: %s\n", fabpool_last_error());
        bad = 1;
    }
    CHECK_CU(cuCtxSynchronize());
    CHECK_OK(fabpool_collect(w.p, 1));
    if (unbuild(&w) != 0) {
        fprintf(stderr, "  the driver holds memory of the pool after its destroy\n");
        bad = 1;
    }
    CHECK(!bad);
    if (bad)
        fprintf(stderr, "  %s: call %llu of %s failed; the call answered %s (%s)\n", sc->name, (unsigned long long)n,
                entries[e], fabpool_status_name(st), st == FABPOOL_OK ? "" : msg);
}

/* The fast path meets the owner's block: s1 frees a block at once (into this thread's cache) while its work
 * pends; a fabpool_alloc of its class waits for that work first, and ends the owner mode. */
static void fast_path_fences(t_sim_hooks *h)
{
    static const scenario sc = {"fabpool_alloc after the owner's free", PLAIN, 1000, OWN_S1};
    world w;
    void *x = NULL, *y = NULL;
    CHECK(build(&w, &sc) == 0);
    CHECK_OK(fabpool_alloc_on_stream(w.p, 1000, w.s1, &x));
    CHECK(h->hold(w.s1) == 0);
    CHECK_OK(fabpool_free_on_stream(w.p, x, w.s1));
    uint64_t fences = t_counters(w.p).stream_fences;
    CHECK_OK(fabpool_alloc(w.p, 1000, &y));
    CHECK(t_counters(w.p).stream_fences == fences + 1 && owner_of(w.p).mode == FP_OWNER_OFF);
    CHECK(h->release(w.s1) == 0);
    CHECK_OK(fabpool_free(w.p, y));
    CHECK_OK(fabpool_check(w.p));
    CHECK(unbuild(&w) == 0);
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_stream_pair_faults", "faults");
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
        const scenario *sc = &scenarios[k];
        uint64_t made[N_ENTRIES];
        world w;
        if (build(&w, sc) != 0) {
            CHECK(!"the scenario could not be built");
            (void)unbuild(&w);
            continue;
        }
        void *out = NULL;
        t_calls_mark(&h, made);
        CHECK_OK(op(&w, sc, &out));
        t_calls_since(&h, made);
        if (out)
            give_back(&w, sc, out);
        CHECK(unbuild(&w) == 0);
        int t0 = n_trials, r0 = n_refused;
        for (size_t e = 0; e < N_ENTRIES; e++)
            for (uint64_t n = 1; n <= made[e]; n++)
                trial(sc, &h, e, n);
        if (getenv("STREAM_PAIR_VERBOSE"))
            printf("  %s: %d faults, %d refused\n", sc->name, n_trials - t0, n_refused - r0);
    }
    fast_path_fences(&h);
    printf("test_stream_pair_faults: %d faults, %d refused\n", n_trials, n_refused);
    return t_done("test_stream_pair_faults");
}
