/* property.h - what the property tests share (test_property, test_combined):
 * the seeded random numbers, failures counted by kind with the step that
 * made them, the patterns each live object carries (written with
 * cuMemcpyHtoD at sample offsets and read back), and the overlap check of
 * live address ranges.  One test program includes it once, through
 * property_model.h (the model both keep and the step loop). */
#ifndef FP_PROPERTY_H
#define FP_PROPERTY_H

#include <signal.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "../testutil.h"

#define KB (1ull << 10)
#define MB (1ull << 20)
#define NPTS 6

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1 /* the tests run a tenth of their seeds */
#else
#define SANITIZED 0
#endif

/* The pools' clock of keep_ms and decay_ms is CLOCK_MONOTONIC_COARSE (lib/base/clock.h); the tests link the
 * library statically, so this definition is the one its calls reach: that clock runs `clock_skew_ns` ahead of
 * the system's, so that a step can make every kept buffer and view outlive keep_ms without waiting for it (the
 * tests' keep_ms is long enough that the run's own time never does). */
#include <dlfcn.h>
static uint64_t clock_skew_ns;
int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*sys_clock)(clockid_t, struct timespec *);
    if (!sys_clock)
        *(void **)&sys_clock = dlsym(RTLD_NEXT, "clock_gettime");
    if (sys_clock(id, ts) != 0)
        return -1;
#ifdef CLOCK_MONOTONIC_COARSE
    if (id == CLOCK_MONOTONIC_COARSE && clock_skew_ns) {
        uint64_t ns = (uint64_t)ts->tv_nsec + clock_skew_ns % 1000000000ull;
        ts->tv_sec += (time_t)(clock_skew_ns / 1000000000ull + ns / 1000000000ull);
        ts->tv_nsec = (long)(ns % 1000000000ull);
    }
#endif
    return 0;
}

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The driver's granularity for device memory (2 MiB if it does not say). */
static inline uint64_t granularity(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g)
        return g;
    return 2 * MB;
}

/* ------------------------------------------------------------ random */

static uint64_t rng_s;
static inline uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline uint64_t rnd(void) { return mix(rng_s++); }
static inline uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static inline int chance(unsigned pct) { return below(100) < pct; }
/* log-uniform in [lo, hi] */
static inline uint64_t logsize(uint64_t lo, uint64_t hi)
{
    int b0 = 63 - __builtin_clzll(lo), b1 = 63 - __builtin_clzll(hi);
    int b = b0 + (int)below((uint64_t)(b1 - b0 + 1));
    uint64_t v = (1ull << b) + below(1ull << b);
    return v < lo ? lo : v > hi ? hi : v;
}
/* the pattern of object id at offset off */
static inline uint64_t pat(uint64_t id, uint64_t off) { return mix(id * 0x100000001b3ull ^ off) | 1; }

/* ------------------------------------------------------------ operations */

/* One entry of a test's table of operations: adding an operation is a
 * function and a line in the table. */
typedef struct op_def {
    const char *name;
    unsigned weight;          /* its share of the draws */
    int (*applies)(int pool); /* whether it can run on this pool now */
    void (*run)(int pool);
} op_def;

/* One of the npool pools that ok accepts, at random; -1 if none. */
static inline int pick_pool_of(int npool, int (*ok)(int))
{
    int c[8], n = 0;
    for (int p = 0; p < npool && p < 8; p++)
        if (ok(p))
            c[n++] = p;
    return n ? c[below((uint64_t)n)] : -1;
}

/* Draws an operation of ops by weight (w[o], whose sum is total) and a pool
 * it applies to, up to `tries` times: the operation's index with *pool set,
 * or -1 (and *pool -1) when no draw applied. */
static inline int draw_op(const op_def *ops, const unsigned *w, unsigned total, int npool, int tries, int *pool)
{
    *pool = -1;
    for (int t = 0; t < tries; t++) {
        uint64_t r = below(total);
        int o = 0;
        while (r >= w[o])
            r -= w[o++];
        if ((*pool = pick_pool_of(npool, ops[o].applies)) >= 0)
            return o;
    }
    return -1;
}

/* ------------------------------------------------------------ failures */

static unsigned long long cur_seed;
static long cur_step;
static const char *cur_op = "setup";
static char cur_what[320];

/* FABPOOL_TEST_KNOWN_FAILURES: kinds (keys, or their prefixes, comma-separated) of failures known to
 * the caller: still printed and counted by kind, marked known, and they do not fail the run. */
static const char *known_failures;
static long n_known;

#define MAXKINDS 96
typedef struct {
    const char *key;
    long n;
    unsigned long long seed; /* where the first one was */
    long step;
} fcount_t;
static fcount_t fcounts[MAXKINDS];
static int nfcounts;
static long printed;

static inline int is_known(const char *key)
{
    for (const char *k = known_failures; k && *k;) {
        size_t n = strcspn(k, ",");
        if (n && strncmp(k, key, n) == 0)
            return 1;
        k += n + (k[n] == ',');
    }
    return 0;
}

/* A failed check of kind `key`: counted, and printed (the first 3 of each kind, 100 in all). */
static inline void fail_(const char *key, int line, const char *fmt, ...)
{
    if (is_known(key))
        n_known++;
    else
        t_failures++;
    int i;
    for (i = 0; i < nfcounts; i++)
        if (strcmp(fcounts[i].key, key) == 0)
            break;
    if (i == nfcounts && nfcounts < MAXKINDS)
        fcounts[nfcounts++] = (fcount_t){key, 0, cur_seed, cur_step};
    long n = i < MAXKINDS ? ++fcounts[i].n : 1;
    if (n > 3 || printed >= 100)
        return;
    printed++;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL [%s] seed %llu step %ld op %s (%s), line %d: %s\n", key, cur_seed, cur_step, cur_op,
            cur_what, line, msg);
}

#define EXPECT(cond, key, ...)                                                                                   \
    do {                                                                                                         \
        t_checks++;                                                                                              \
        if (!(cond))                                                                                             \
            fail_(key, __LINE__, __VA_ARGS__);                                                                   \
    } while (0)

/* a call that must succeed; the status and message are reported otherwise */
#define EXPECT_OK(st, key, call)                                                                                 \
    EXPECT((st) == FABPOOL_OK, key, "%s -> %s: %s", call, fabpool_status_name(st), fabpool_last_error())

typedef struct {
    const char *key, *means;
} meaning_t;

/* The failures by kind, each with the first seed and step, and what the kind means: the entry of
 * `meanings` whose key is the longest prefix of it (n of them; may be none). */
static inline void print_kinds(const char *name, const meaning_t *meanings, size_t n)
{
    if (!nfcounts)
        return;
    fprintf(stderr, "%s: failed checks by kind (the first 3 of each printed above); %ld of the kinds "
            "FABPOOL_TEST_KNOWN_FAILURES names (%s):\n", name, n_known, known_failures ? known_failures : "");
    for (int i = 0; i < nfcounts; i++) {
        const char *means = "";
        size_t best = 0;
        for (size_t k = 0; k < n; k++) {
            size_t len = strlen(meanings[k].key);
            if (len > best && strncmp(meanings[k].key, fcounts[i].key, len) == 0)
                means = meanings[k].means, best = len;
        }
        fprintf(stderr, "  %-40s %8ld%s  first: seed %llu step %ld  %s\n", fcounts[i].key, fcounts[i].n,
                is_known(fcounts[i].key) ? " known" : "      ", fcounts[i].seed, fcounts[i].step, means);
    }
}

/* A crash (an abort, a fault) says where it happened: the seed and step to run again with -v. */
static inline void say_where(int sig)
{
    char msg[400];
    int n = snprintf(msg, sizeof msg, "\nsignal %d at seed %llu step %ld op %s (%s)\n", sig, cur_seed, cur_step,
                     cur_op, cur_what);
    if (n > 0 && write(2, msg, (size_t)n) < 0)
        n = 0;
    signal(sig, SIG_DFL);
    raise(sig);
}
static inline void say_where_on_crash(void)
{
    signal(SIGABRT, say_where);
    signal(SIGSEGV, say_where);
    signal(SIGBUS, say_where);
}

/* ------------------------------------------------------------ objects */

/* a block given out */
typedef struct {
    void *p;
    size_t size, usable;
    uint64_t id;
    int recorded; /* test_combined: 1 + the stream last recorded on it (fabpool_record_stream); 0: none */
} blk_t;

/* a size for a buffer of this window: small, large, or anywhere */
static inline size_t buf_size(uint64_t window)
{
    switch (below(4)) {
    case 0:
        return (size_t)logsize(1, window);
    case 1:
        return (size_t)(window - below(window / 4 + 1));
    default:
        return (size_t)(1 + below(window));
    }
}

/* Exported buffers destroyed: acknowledged later by export id (fabpool_peers_ack). */
#define MAXDEAD 256
static struct {
    int pool;
    uint64_t id;
} dead[MAXDEAD];
static int ndead;

/* Every dead buffer of pool p (`pool`) acked as "no peer is left", as a caller does once its peers
 * closed their views; forgets them. */
static inline void ack_dead(int p, fabpool_t *pool)
{
    int w = 0;
    for (int i = 0; i < ndead; i++) {
        if (dead[i].pool != p) {
            dead[w++] = dead[i];
            continue;
        }
        fabpool_status st = fabpool_peers_ack(pool, dead[i].id, UINT64_MAX);
        EXPECT(st == FABPOOL_OK || st == FABPOOL_ERR_NOT_FOUND, "ack.dead", "fabpool_peers_ack of destroyed buffer "
               "0x%llx -> %s: %s", (unsigned long long)dead[i].id, fabpool_status_name(st), fabpool_last_error());
    }
    ndead = w;
}

/* ------------------------------------------------------------ memory */

static inline int put(uint64_t at, uint64_t v)
{
    return cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v) == CUDA_SUCCESS;
}
/* 1: reads back v; 0: another value; -1: unreadable (not mapped) */
static inline int probe(uint64_t at, uint64_t v, uint64_t *got)
{
    *got = 0;
    if (cuMemcpyDtoH(got, (CUdeviceptr)at, sizeof *got) != CUDA_SUCCESS)
        return -1;
    return *got == v;
}

/* sample offsets of an object's window: the start, and five spread over it */
static inline void gen_points(uint64_t id, uint64_t window, uint64_t *pts)
{
    static const uint64_t spans[NPTS] = {8, 64 * KB, 2 * MB, 16 * MB, 1ull << 62, 1ull << 62};
    for (int i = 0; i < NPTS; i++) {
        uint64_t span = spans[i] < window - 8 ? spans[i] : window - 8;
        pts[i] = i == 0 ? 0 : (mix(id * 31 + (uint64_t)i) % span) & ~7ull;
    }
}

/* The samples x with lo < x + 8 <= hi get their pattern. */
static inline void write_points(uint64_t id, uint64_t base, const uint64_t *pts, uint64_t lo, uint64_t hi)
{
    for (int i = 0; i < NPTS; i++)
        if (pts[i] + 8 > lo && pts[i] + 8 <= hi)
            EXPECT(put(base + pts[i], pat(id, pts[i])), "data.write", "cuMemcpyHtoD at offset %llu of object %llu "
                   "(0x%llx) failed: not mapped", (unsigned long long)pts[i], (unsigned long long)id,
                   (unsigned long long)(base + pts[i]));
}

/* The samples that a size of hi bytes holds and one of lo bytes does not (lo < x + 8 <= hi) read back:
 * all of them, or only sample `which` (mod NPTS).  1 if one did not. */
static inline int check_points(const char *key, const char *what, uint64_t id, uint64_t base, const uint64_t *pts,
                        uint64_t lo, uint64_t hi, int which)
{
    int bad = 0;
    for (int i = 0; i < NPTS; i++) {
        if (which >= 0 && i != which % NPTS)
            continue;
        uint64_t x = pts[i];
        if (x + 8 <= lo || x + 8 > hi)
            continue;
        uint64_t got;
        int r = probe(base + x, pat(id, x), &got);
        t_checks++;
        if (r != 1) {
            bad = 1;
            fail_(key, __LINE__, "%s %llu: offset %llu (0x%llx) %s 0x%llx, wrote 0x%llx", what,
                  (unsigned long long)id, (unsigned long long)x, (unsigned long long)(base + x),
                  r < 0 ? "is not mapped (cuMemcpyDtoH fails); expected" : "reads", (unsigned long long)got,
                  (unsigned long long)pat(id, x));
        }
    }
    return bad;
}

/* ------------------------------------------------------------ overlaps */

/* a live address range: [lo, hi) of object `id` (`what` says which kind; one object may list several) */
typedef struct {
    uint64_t lo, hi;
    const char *what;
    uint64_t id;
} ival_t;

static inline int ival_cmp(const void *a, const void *b)
{
    const ival_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static inline void overlap_fail(const ival_t *a, const ival_t *b)
{
    fail_("overlap", __LINE__, "%s %llu [0x%llx, 0x%llx) overlaps %s %llu [0x%llx, 0x%llx)", a->what,
          (unsigned long long)a->id, (unsigned long long)a->lo, (unsigned long long)a->hi, b->what,
          (unsigned long long)b->id, (unsigned long long)b->lo, (unsigned long long)b->hi);
}

/* No two of iv[0..n) overlap (ranges of one object may).  Ranges never change, so only an object made
 * in this step (numbered from first_new on) can overlap one that did not before: each step checks those
 * against all; full sorts them all. */
static inline void check_overlaps(ival_t *iv, int n, uint64_t first_new, int full)
{
    t_checks += n;
    if (full) {
        qsort(iv, (size_t)n, sizeof iv[0], ival_cmp);
        for (int i = 1; i < n; i++)
            if (!(iv[i].lo >= iv[i - 1].hi || (iv[i].id == iv[i - 1].id && iv[i].what == iv[i - 1].what)))
                overlap_fail(&iv[i], &iv[i - 1]);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (iv[i].id < first_new)
            continue;
        for (int j = 0; j < n; j++)
            if (j != i && iv[j].lo < iv[i].hi && iv[i].lo < iv[j].hi &&
                !(iv[i].id == iv[j].id && iv[i].what == iv[j].what))
                overlap_fail(&iv[i], &iv[j]);
    }
}

#endif
