/* test_torch_combined: libfabpool_torch.so as PyTorch uses it, its features
 * mixed by seeded random sequences: the installed allocator's pool
 * ("default": fabpool_torch_alloc / free) and tag pools (MemPool tags:
 * fabpool_torch_tag_slot, fabpool_torch_tag<k>_alloc / _free) on three
 * streams that the sim holds and releases, sleep and wake of a tag (offload
 * or discard), empty_cache, the stats; each seed ends with every block freed
 * and fabpool_torch_shutdown.
 *
 * After every step: every block handed out is mapped (fabsim_range_mapped)
 * while its tag is awake and holds its pattern; a block freed on a held
 * stream stays mapped and goes to no other stream while that stream's work
 * pends; an allocation on a sleeping tag answers NULL; the sim's ledger maps
 * what the pools say they map (their stats_json, and host copies of the
 * sleeping ones).  After the shutdown the sim holds nothing.
 *
 *   test_torch_combined LIBFABPOOL_TORCH [first_seed [n_seeds [steps]]]   (default 1 20 600)
 * The pools reserve 4 GiB each (FABPOOL_CONF, unless set): four of the
 * default 128 GiB are more than valgrind allows.  Sanitizer builds run a
 * fifth of the seeds.  Sim only. */
#include <time.h>
#include <unistd.h>

#include "../../tests/reliability/property.h"
#include "fabpool_torch.h"

#define NTAG 4 /* "default" and three MemPool tags */
#define NSTREAM 3
#define MAXBLK 48
#define MAXPEND 64

static const char *const tag_names[NTAG] = {"default", "weights", "kv_cache", "activations"};

/* the library, as PyTorch loads it */
static void *(*T_alloc)(size_t, int, void *);
static void (*T_free)(void *, size_t, int, void *);
static fabpool_status (*T_empty)(int);
static fabpool_status (*T_stats_json)(int, char *, size_t, size_t *);
static fabpool_status (*T_shutdown)(void);
static int (*T_verbose)(int);
static int (*T_slot)(const char *, int);
static int (*T_sleep)(const char *, int, int, void *);
static int (*T_wake)(const char *, int, void *);
static int (*T_state)(const char *, int, fabpool_sleep_info *);
static int (*T_tag_json)(const char *, int, char *, size_t, size_t *);
static void *(*T_tag_alloc[8])(size_t, int, void *);
static void (*T_tag_free[8])(void *, size_t, int, void *);

static int (*S_hold)(void *), (*S_release)(void *), (*S_mapped)(const void *, size_t);

typedef struct {
    int slot;   /* a MemPool tag's pair of functions (-1: not bound yet) */
    int made;   /* its pool exists: the default one from its first allocation, a tag's once bound */
    int asleep;
    int discard;
} tag_t;
typedef struct {
    blk_t b;
    int tag, stream;
} tblk_t;
typedef struct {
    tblk_t t;
    uint64_t epoch;
} tpend_t;

static tag_t tags[NTAG];
static tblk_t blks[MAXBLK];
static int nblk;
static tpend_t pend[MAXPEND];
static int npend;
static CUstream streams[NSTREAM];
static int held[NSTREAM];
static uint64_t epoch[NSTREAM], next_id = 1;
static long n_asleep_refused, n_slept, n_empty, n_reused_pending;

static void *sptr(int s) { return s < 0 ? NULL : (void *)streams[s]; }
static void refresh(void)
{
    for (int s = 0; s < NSTREAM; s++)
        held[s] = cuStreamQuery(streams[s]) == CUDA_ERROR_NOT_READY;
}

static void *tag_alloc(int t, size_t size, int s)
{
    return t == 0 ? T_alloc(size, 0, sptr(s)) : T_tag_alloc[tags[t].slot](size, 0, sptr(s));
}
static void tag_free(const tblk_t *x)
{
    if (x->tag == 0)
        T_free(x->b.p, x->b.size, 0, sptr(x->stream));
    else
        T_tag_free[tags[x->tag].slot](x->b.p, x->b.size, 0, sptr(x->stream));
}
static void write_blk(const blk_t *b)
{
    uint64_t pts[NPTS] = {0, b->size - 8};
    write_points(b->id, (uint64_t)(uintptr_t)b->p, pts, 0, b->size);
}
static void check_blk(const blk_t *b, const char *key)
{
    uint64_t pts[NPTS] = {0, b->size - 8};
    check_points(key, "block", b->id, (uint64_t)(uintptr_t)b->p, pts, 0, b->size, -1);
}
static int has_pool(int t) { return tags[t].made; }
static int leaked; /* a shutdown left memory held: the ledger is not compared again */

/* ------------------------------------------------------------ operations */

static void op_alloc(void)
{
    int t = (int)below(NTAG), s = chance(20) ? -1 : (int)below(NSTREAM);
    if (t > 0 && tags[t].slot < 0) { /* mempool(tag=...): the slot and its pool on first use */
        tags[t].slot = T_slot(tag_names[t], 0);
        EXPECT(tags[t].slot >= 0, "tag_slot", "fabpool_torch_tag_slot(%s) -> %d", tag_names[t], tags[t].slot);
        if (tags[t].slot < 0)
            return;
        tags[t].made = 1;
    }
    size_t size = 8 + (size_t)(chance(80) ? logsize(8, 1 * MB) : logsize(1 * MB, 40 * MB)) / 8 * 8;
    snprintf(cur_what, sizeof cur_what, "tag %s, %zu bytes, stream %d%s", tag_names[t], size, s,
             tags[t].asleep ? ", asleep" : "");
    tblk_t x = {{tag_alloc(t, size, s), size, size, next_id++, 0}, t, s};
    if (tags[t].asleep) {
        n_asleep_refused++;
        EXPECT(x.b.p == NULL, "torch.asleep_alloc", "an allocation of tag %s while it sleeps returned %p%s", tag_names[t],
               x.b.p, x.b.p && !S_mapped(x.b.p, size) ? ", which is not mapped" : "");
        if (x.b.p)
            tag_free(&x);
        return;
    }
    EXPECT(x.b.p != NULL, "torch.alloc", "tag %s: NULL for %zu bytes", tag_names[t], size);
    if (!x.b.p)
        return;
    tags[t].made = 1;
    EXPECT(S_mapped(x.b.p, size), "handout.unmapped", "tag %s handed out %p (%zu bytes), not mapped", tag_names[t],
           x.b.p, size);
    refresh();
    for (int i = 0; i < npend; i++) { /* a block freed on a held stream: only that stream may have it back */
        tpend_t *q = &pend[i];
        uint64_t a = (uint64_t)(uintptr_t)x.b.p, e = (uint64_t)(uintptr_t)q->t.b.p;
        if (!(held[q->t.stream] && epoch[q->t.stream] == q->epoch) || a >= e + q->t.b.size || e >= a + size)
            continue;
        EXPECT(q->t.tag == t && q->t.stream == s, "pending.reused", "tag %s stream %d got %p, overlapping block %p "
               "freed on held stream %d (tag %s)", tag_names[t], s, x.b.p, q->t.b.p, q->t.stream, tag_names[q->t.tag]);
        n_reused_pending++;
        pend[i--] = pend[--npend];
    }
    write_blk(&x.b);
    blks[nblk++] = x;
}

static void op_free(void)
{
    int i = (int)below((uint64_t)nblk);
    tblk_t x = blks[i];
    snprintf(cur_what, sizeof cur_what, "tag %s, block %llu (%zu bytes), stream %d%s", tag_names[x.tag],
             (unsigned long long)x.b.id, x.b.size, x.stream, tags[x.tag].asleep ? ", asleep" : "");
    if (!tags[x.tag].asleep)
        check_blk(&x.b, "data.block");
    tag_free(&x);
    blks[i] = blks[--nblk];
    refresh();
    if (x.stream >= 0 && held[x.stream] && !tags[x.tag].asleep && npend < MAXPEND)
        pend[npend++] = (tpend_t){x, epoch[x.stream]};
}

static void op_sleep(void)
{
    int t = (int)below(NTAG), offload = chance(60), s = chance(30) ? -1 : (int)below(NSTREAM);
    if (!has_pool(t))
        return;
    snprintf(cur_what, sizeof cur_what, "tag %s, %s, stream %d%s", tag_names[t], offload ? "offload" : "discard", s,
             tags[t].asleep ? ", asleep already" : "");
    int st = T_sleep(tag_names[t], 0, offload, sptr(s));
    if (tags[t].asleep) {
        EXPECT(st == FABPOOL_ERR_ASLEEP, "torch.sleep_twice", "a second sleep of tag %s -> %d", tag_names[t], st);
        return;
    }
    EXPECT(st == FABPOOL_OK, "torch.sleep", "fabpool_torch_tag_sleep(%s) -> %d", tag_names[t], st);
    if (st != FABPOOL_OK)
        return;
    n_slept++;
    tags[t].asleep = 1;
    tags[t].discard = !offload;
    for (int i = 0; i < npend; i++) /* the pool waited for its streams' work before it unmapped */
        if (pend[i].t.tag == t)
            pend[i--] = pend[--npend];
}

static void op_wake(void)
{
    int t = (int)below(NTAG);
    if (!tags[t].asleep)
        return;
    snprintf(cur_what, sizeof cur_what, "tag %s, after a %s", tag_names[t], tags[t].discard ? "discard" : "offload");
    int st = T_wake(tag_names[t], 0, chance(50) ? NULL : (void *)streams[below(NSTREAM)]);
    EXPECT(st == FABPOOL_OK, "torch.wake", "fabpool_torch_tag_wake(%s) -> %d", tag_names[t], st);
    if (st != FABPOOL_OK)
        return;
    tags[t].asleep = 0;
    for (int i = 0; i < nblk; i++)
        if (blks[i].tag == t) {
            if (tags[t].discard)
                write_blk(&blks[i].b); /* contents unspecified: written again */
            else
                check_blk(&blks[i].b, "data.after_wake");
        }
}

static void op_state(void)
{
    int t = (int)below(NTAG);
    if (!has_pool(t))
        return;
    fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
    snprintf(cur_what, sizeof cur_what, "tag %s", tag_names[t]);
    int st = T_state(tag_names[t], 0, &si);
    EXPECT(st == FABPOOL_OK && si.asleep == tags[t].asleep, "torch.state", "-> %d, asleep %d (the test: %d)", st,
           si.asleep, tags[t].asleep);
}

static void op_empty(void)
{
    snprintf(cur_what, sizeof cur_what, "device 0");
    fabpool_status st = T_empty(0);
    n_empty++;
    EXPECT(st == FABPOOL_OK || (st == FABPOOL_ERR_NOT_FOUND && !has_pool(0)) || (st == FABPOOL_ERR_ASLEEP && tags[0].asleep),
           "torch.empty", "fabpool_torch_empty -> %d", (int)st);
}

static void op_hold(void)
{
    int s = (int)below(NSTREAM);
    refresh();
    snprintf(cur_what, sizeof cur_what, "stream %d", s);
    if (!held[s]) {
        S_hold(streams[s]);
        held[s] = 1;
        epoch[s]++;
    }
}

static void op_release(void)
{
    int s = (int)below(NSTREAM);
    snprintf(cur_what, sizeof cur_what, "stream %d", s);
    S_release(streams[s]);
    held[s] = 0;
}

static const struct {
    const char *name;
    unsigned weight;
    void (*run)(void);
} ops[] = {
    {"alloc", 30, op_alloc}, {"free", 26, op_free},   {"sleep", 4, op_sleep},     {"wake", 6, op_wake},
    {"state", 2, op_state},  {"empty", 3, op_empty}, {"stream_hold", 6, op_hold}, {"stream_release", 6, op_release},
};
#define NOPS ((int)(sizeof ops / sizeof ops[0]))

/* ------------------------------------------------------------ the checks */

static uint64_t json_num(const char *js, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

static void check_step(void)
{
    refresh();
    for (int i = 0; i < nblk; i++)
        if (!tags[blks[i].tag].asleep) {
            t_checks++;
            if (!S_mapped(blks[i].b.p, blks[i].b.size))
                fail_("live.unmapped", __LINE__, "block %llu %p of tag %s is not mapped", (unsigned long long)blks[i].b.id,
                      blks[i].b.p, tag_names[blks[i].tag]);
            else if (cur_step % 16 == 0)
                check_blk(&blks[i].b, "data.block");
        }
    int w = 0;
    for (int i = 0; i < npend; i++) {
        tpend_t *q = &pend[i];
        if (!(held[q->t.stream] && epoch[q->t.stream] == q->epoch))
            continue;
        pend[w++] = *q;
        EXPECT(S_mapped(q->t.b.p, q->t.b.size), "pending.unmapped", "block %p freed on held stream %d (tag %s) is not "
               "mapped", q->t.b.p, q->t.stream, tag_names[q->t.tag]);
    }
    npend = w;
    /* the ledger maps what the pools map, and the host copies of the sleeping ones */
    static char js[1 << 16];
    uint64_t mapped = 0, host = 0;
    for (int t = 0; t < NTAG; t++) {
        if (!has_pool(t))
            continue;
        size_t need = 0;
        int st = t == 0 ? (int)T_stats_json(0, js, sizeof js, &need) : T_tag_json(tag_names[t], 0, js, sizeof js, &need);
        if (st != FABPOOL_OK)
            continue;
        const char *pool = t == 0 ? strstr(js, "\"pool\":") : js;
        mapped += pool ? json_num(pool, "mapped_bytes") : 0;
        fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
        if (T_state(tag_names[t], 0, &si) == FABPOOL_OK)
            host += si.host_bytes;
    }
    fabsim_ledger L = t_ledger();
    EXPECT(leaked || L.bytes_mapped == mapped + host, "ledger.bytes_mapped", "the sim maps %llu bytes, the pools %llu + %llu "
           "host", (unsigned long long)L.bytes_mapped, (unsigned long long)mapped, (unsigned long long)host);
}

static void run_seed(unsigned long long seed, long steps)
{
    cur_seed = seed;
    rng_s = mix(seed * 0x9e3779b97f4a7c15ull + 14);
    for (int t = 0; t < NTAG; t++)
        tags[t] = (tag_t){-1, 0, 0, 0};
    nblk = npend = 0;
    unsigned total = 0;
    for (int o = 0; o < NOPS; o++)
        total += ops[o].weight;
    for (long s = 0; s < steps; s++) {
        cur_step = s;
        uint64_t r = below(total);
        int o = 0;
        while (r >= ops[o].weight)
            r -= ops[o].weight, o++;
        if (ops[o].run == op_free && nblk == 0)
            o = 0;
        if (ops[o].run == op_alloc && nblk == MAXBLK)
            o = 1;
        cur_op = ops[o].name;
        cur_what[0] = 0;
        ops[o].run();
        check_step();
    }
    /* the end of a program: everything freed, every tag awake, the allocator shut down */
    cur_op = "shutdown";
    cur_step = -1;
    for (int s = 0; s < NSTREAM; s++)
        op_release();
    for (int t = 0; t < NTAG; t++)
        if (tags[t].asleep)
            EXPECT(T_wake(tag_names[t], 0, NULL) == FABPOOL_OK, "torch.wake", "wake of tag %s", tag_names[t]);
    while (nblk)
        tag_free(&blks[--nblk]);
    snprintf(cur_what, sizeof cur_what, "tags %s%s%s", tags[1].slot >= 0 ? "weights " : "",
             tags[2].slot >= 0 ? "kv_cache " : "", tags[3].slot >= 0 ? "activations" : "");
    fabpool_status st = T_shutdown();
    EXPECT(st == FABPOOL_OK, "torch.shutdown", "fabpool_torch_shutdown -> %d", (int)st);
    fabsim_ledger l = t_ledger();
    int clean = l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0 && l.handles == 0 && l.bytes_held_host == 0;
    leaked |= !clean;
    EXPECT(clean, "torch.shutdown_leak", "after fabpool_torch_shutdown the sim holds %llu bytes in %llu mappings, %llu "
           "reservations, %llu handles, %llu host bytes", (unsigned long long)l.bytes_held,
           (unsigned long long)l.mappings, (unsigned long long)l.reservations, (unsigned long long)l.handles,
           (unsigned long long)l.bytes_held_host);
}

static const meaning_t meanings[] = {
    {"torch.asleep_alloc", "an allocation of a sleeping tag returned a block"},
    {"torch.shutdown_leak", "fabpool_torch_shutdown left memory held (a tag's pool)"},
    {"handout.unmapped", "an allocation handed out memory that is not mapped"},
    {"pending.reused", "a block freed on a held stream went to another stream or tag"},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s libfabpool_torch.so [first_seed [n_seeds [steps]]]\n", argv[0]);
        return 2;
    }
    unsigned long long first = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    long n_seeds = argc > 3 ? atol(argv[3]) : 20, steps = argc > 4 ? atol(argv[4]) : 600;
    if (SANITIZED && n_seeds >= 10)
        n_seeds /= 5;
    setenv("FABPOOL_CONF", "reserve:4GiB", 0); /* read at each pool's creation */
    int sim = t_driver_init();
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
#define SYM(var, name)                                                                                           \
    do {                                                                                                         \
        *(void **)&var = dlsym(h, name);                                                                         \
        CHECK(var != NULL);                                                                                      \
    } while (0)
    SYM(T_alloc, "fabpool_torch_alloc");
    SYM(T_free, "fabpool_torch_free");
    SYM(T_empty, "fabpool_torch_empty");
    SYM(T_stats_json, "fabpool_torch_stats_json");
    SYM(T_shutdown, "fabpool_torch_shutdown");
    SYM(T_verbose, "fabpool_torch_set_verbose");
    SYM(T_slot, "fabpool_torch_tag_slot");
    SYM(T_sleep, "fabpool_torch_tag_sleep");
    SYM(T_wake, "fabpool_torch_tag_wake");
    SYM(T_state, "fabpool_torch_tag_state");
    SYM(T_tag_json, "fabpool_torch_tag_stats_json");
    for (int k = 0; k < 8; k++) {
        char name[64];
        snprintf(name, sizeof name, "fabpool_torch_tag%d_alloc", k);
        SYM(T_tag_alloc[k], name);
        snprintf(name, sizeof name, "fabpool_torch_tag%d_free", k);
        SYM(T_tag_free[k], name);
    }
#undef SYM
    *(void **)&S_hold = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&S_release = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    *(void **)&S_mapped = dlsym(RTLD_DEFAULT, "fabsim_range_mapped");
    if (!sim || !S_hold || !S_mapped || t_failures) {
        printf("test_torch_combined: needs the simulated driver and the library's symbols\n");
        return t_done("test_torch_combined");
    }
    known_failures = getenv("FABPOOL_TEST_KNOWN_FAILURES");
    T_verbose(0); /* the refusals this test makes on purpose stay quiet */
    for (int s = 0; s < NSTREAM; s++)
        CHECK_CU(cuStreamCreate(&streams[s], 0));
    double t0 = now();
    for (long k = 0; k < n_seeds; k++)
        run_seed(first + (unsigned long long)k, steps);
    printf("test_torch_combined: %ld seeds x %ld steps in %.1f s: %ld sleeps, %ld allocations refused asleep, %ld "
           "empties, %ld pending blocks given back to their stream\n", n_seeds, steps, now() - t0, n_slept,
           n_asleep_refused, n_empty, n_reused_pending);
    print_kinds("test_torch_combined", meanings, sizeof meanings / sizeof meanings[0]);
    for (int s = 0; s < NSTREAM; s++)
        cuStreamDestroy(streams[s]);
    return t_done("test_torch_combined");
}
