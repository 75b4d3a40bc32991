/* test_torch_shim.c - libfabpool_torch.so called as PyTorch calls it.
 *
 * The library is dlopen'ed with RTLD_LOCAL (what ctypes.CDLL does inside
 * torch.cuda.memory.CUDAPluggableAllocator) and its functions are called
 * with a size, a device and a stream.  Streams come from the driver
 * (cuStreamCreate of the simulated driver); fabsim_stream_hold keeps work
 * on a stream pending, so the test can tell whether a block freed on one
 * stream is given to another before that stream's work is done.
 * Usage: test_torch_shim <path of libfabpool_torch.so> [case]: a case named
 * runs alone (forked_child_answers_while_a_thread_waited: on a small
 * device, FABSIM_MEMORY, so that two large blocks do not fit). */
#include "../../tests/testutil.h" /* first: it asks for _GNU_SOURCE (usleep) */

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fabpool_torch.h"

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
static void *T_lib;
static alloc_fn T_alloc;
static free_fn T_free;
static fabpool_status (*T_empty)(int);
static fabpool_status (*T_stats_json)(int, char *, size_t, size_t *);
static fabpool_status (*T_counters)(int, fabpool_torch_counters *);
static const char *(*T_err)(void);
static int (*T_verbose)(int);
static fabpool_status (*T_shutdown)(void);
static fabpool_status (*T_mstats)(int, fabpool_torch_mem_stats *);
static fabpool_status (*T_reset_peak)(int);
static fabpool_status (*T_reset_acc)(int);
static int (*T_tag_slot)(const char *, int);
static int (*T_tag_list)(int, char *, size_t);
static const char *(*T_tag_err)(void);
static int (*T_tag_sleep)(const char *, int, int, void *);

static int (*S_hold)(void *);
static int (*S_hold_long)(void *);
static int (*S_release)(void *);
static uint64_t (*S_calls)(const char *);
static int (*S_fault)(const char *, uint64_t, int, int);
static void (*S_fault_clear)(void);

static fabpool_torch_counters counters(void)
{
    fabpool_torch_counters c = {.struct_size = sizeof c};
    CHECK(T_counters(0, &c) == FABPOOL_OK);
    return c;
}

/* A number after "key": in json, from `from` on (0 if absent). */
static uint64_t jnum(const char *from, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(from, pat);
    return p ? strtoull(p + strlen(pat), NULL, 10) : UINT64_MAX;
}

/* The shim's counters against the pool's own stats. */
static void check_against_pool(const char *where)
{
    static char js[1 << 16];
    size_t need = 0;
    CHECK(T_stats_json(0, js, sizeof js, &need) == FABPOOL_OK);
    CHECK(need == strlen(js) + 1);
    const char *pool = strstr(js, "\"pool\":");
    CHECK(pool != NULL);
    if (!pool)
        return;
    fabpool_torch_counters c = counters();
    uint64_t blocks = jnum(pool, "blocks"), in_use = jnum(pool, "in_use_bytes");
    uint64_t class_allocs = 0;
    const char *q = strstr(pool, "\"classes\":[");
    for (q = q ? strstr(q, "\"allocs\":") : NULL; q; q = strstr(q + 1, "\"allocs\":"))
        class_allocs += strtoull(q + 9, NULL, 10);
    int ok = blocks == c.blocks_live + c.cached_blocks && in_use == c.usable_bytes_live + c.cached_bytes &&
             class_allocs == c.pool_allocs && c.allocs == c.reuse_same_stream + c.reuse_after_event + c.pool_allocs &&
             jnum(js, "allocs") == c.allocs;
    CHECK(ok);
    if (!ok)
        fprintf(stderr,
                "%s: pool blocks %llu in_use %llu class allocs %llu; shim live %llu+cached %llu blocks, usable %llu+%llu "
                "bytes, allocs %llu = %llu same + %llu event + %llu pool\n",
                where, (unsigned long long)blocks, (unsigned long long)in_use, (unsigned long long)class_allocs,
                (unsigned long long)c.blocks_live, (unsigned long long)c.cached_blocks,
                (unsigned long long)c.usable_bytes_live, (unsigned long long)c.cached_bytes,
                (unsigned long long)c.allocs, (unsigned long long)c.reuse_same_stream,
                (unsigned long long)c.reuse_after_event, (unsigned long long)c.pool_allocs);
}



/* A block freed on `from` while `from` is held goes to `to` only after `done` runs. */
static void check_cross_stream(void *from, void *to, size_t size, int by_sync)
{
    void *x = T_alloc(size, 0, from);
    CHECK(x != NULL);
    t_put_tag(x, size, 0xabcdef01);
    S_hold(from);               /* kernels on `from` that use x are still queued */
    T_free(x, size, 0, from);
    fabpool_torch_counters c0 = counters();
    void *y = T_alloc(size, 0, to);
    CHECK(y != NULL && y != x); /* not given to another stream while `from` is busy */
    fabpool_torch_counters c1 = counters();
    CHECK(c1.events_recorded > c0.events_recorded);
    CHECK(c1.cached_blocks == c0.cached_blocks); /* x still waits */
    if (by_sync)
        CHECK_CU(cuStreamSynchronize((CUstream)from));
    else
        S_release(from);
    void *w = T_alloc(size, 0, to);
    CHECK(w == x);              /* now it is */
    CHECK(t_tag_ok(w, size, 0xabcdef01));
    CHECK(counters().reuse_after_event == c1.reuse_after_event + 1);
    T_free(y, size, 0, to);
    T_free(w, size, 0, to);
}

/* While the default tag's pool sleeps, fabpool_torch_alloc answers NULL
 * (the pool's FABPOOL_ERR_ASLEEP message) even for a size its stream has just
 * freed, and counts nothing as allocated; after the wake the stream gets its
 * blocks back, mapped. */
static void check_asleep(void *s)
{
    int (*tag_sleep)(const char *, int, int, void *) = NULL;
    int (*tag_wake)(const char *, int, void *) = NULL;
    *(void **)&tag_sleep = dlsym(T_lib, "fabpool_torch_tag_sleep");
    *(void **)&tag_wake = dlsym(T_lib, "fabpool_torch_tag_wake");
    CHECK(tag_sleep && tag_wake);
    if (!tag_sleep || !tag_wake)
        return;
    const size_t sizes[2] = {4096, 48u << 20};
    void *b[2];
    for (int i = 0; i < 2; i++) {
        b[i] = T_alloc(sizes[i], 0, s);
        CHECK(b[i] != NULL);
    }
    CHECK(tag_sleep("default", 0, 1, NULL) == FABPOOL_OK);
    for (int i = 0; i < 2; i++)
        T_free(b[i], sizes[i], 0, s);
    fabpool_torch_counters c0 = counters();
    int quiet = T_verbose(0);
    for (int i = 0; i < 2; i++)
        CHECK(T_alloc(sizes[i], 0, s) == NULL && strstr(T_err(), "the pool is asleep") != NULL);
    T_verbose(quiet);
    fabpool_torch_counters c1 = counters();
    CHECK(c1.allocs == c0.allocs && c1.blocks_live == c0.blocks_live && c1.reuse_same_stream == c0.reuse_same_stream);
    CHECK(c1.alloc_failures == c0.alloc_failures + 2);
    CHECK(tag_wake("default", 0, NULL) == FABPOOL_OK);
    for (int i = 0; i < 2; i++) {
        void *q = T_alloc(sizes[i], 0, s);
        CHECK(q == b[i]);
        if (q) {
            t_put_tag(q, sizes[i], 0x77u + (unsigned)i);
            CHECK(t_tag_ok(q, sizes[i], 0x77u + (unsigned)i));
            T_free(q, sizes[i], 0, s);
        }
    }
}

/* Lines of `f` (from its start) that contain `what`. */
static int count_lines(FILE *f, const char *what)
{
    char line[1024];
    int n = 0;
    rewind(f);
    while (fgets(line, sizeof line, f))
        n += strstr(line, what) != NULL;
    return n;
}

/* A double free and a free of a pointer the shim never gave
 * out are refused, reported once each on stderr, and change nothing: no two
 * live blocks share memory afterwards, the counters do not move (the live
 * count does not wrap), and shutdown still succeeds at the end. */
/* Every tensor's base is aligned to 256 bytes, as cudaMalloc's (PyTorch's kernels pick vector widths from it):
 * the sizes below 256, whose fabpool classes are aligned to their size only, too. */
static void check_small_alignment(void *s)
{
    void *p[64];
    int n = 0;
    for (size_t size = 1; size <= 1024; size = size < 16 ? size + 1 : size * 2 - 1) {
        p[n] = T_alloc(size, 0, s);
        CHECK(p[n] != NULL && ((uintptr_t)p[n] & 255) == 0);
        n++;
    }
    size_t size = 1;
    for (int i = 0; i < n; i++, size = size < 16 ? size + 1 : size * 2 - 1)
        T_free(p[i], size, 0, s);
}

static void check_bad_frees(void *s)
{
    fabpool_torch_counters c0 = counters();
    fflush(stderr);
    int saved = dup(2);
    FILE *log = tmpfile();
    CHECK(saved >= 0 && log != NULL);
    if (saved < 0 || !log)
        return;
    dup2(fileno(log), 2);
    int old_verbose = T_verbose(1);

    void *a = T_alloc(256, 0, s);
    CHECK(a != NULL);
    /* a block start inside a's slab that was never handed out */
    T_free((char *)a + 256, 256, 0, s);
    int refused_inside = strstr(T_err(), "not a live allocation") != NULL;
    void *b = T_alloc(256, 0, s);
    void *c = T_alloc(256, 0, s);
    T_free(b, 256, 0, s);
    T_free(b, 256, 0, s); /* a double free */
    int refused_double = strstr(T_err(), "not a live allocation") != NULL;
    void *d = T_alloc(256, 0, s);
    void *e = T_alloc(256, 0, s);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    T_verbose(old_verbose);

    CHECK(refused_inside && refused_double);
    /* one line per bad free: the two above, nothing else */
    int reports = count_lines(log, "fabpool_torch:");
    CHECK(reports == 2);
    if (reports != 2) {
        char line[1024];
        rewind(log);
        while (fgets(line, sizeof line, log))
            fprintf(stderr, "  stderr: %s", line);
    }
    fclose(log);
    /* four live blocks, all different: the double free did not put b twice
     * in the cache, and a + 256 was not taken as free */
    void *live[4] = {a, c, d, e};
    for (int i = 0; i < 4; i++) {
        CHECK(live[i] != NULL);
        for (int j = 0; j < i; j++)
            CHECK(live[i] != live[j]);
    }
    for (int i = 0; i < 4; i++)
        if (live[i])
            t_put_tag(live[i], 256, 0x5100 + (uint64_t)i);
    for (int i = 0; i < 4; i++)
        if (live[i])
            CHECK(t_tag_ok(live[i], 256, 0x5100 + (uint64_t)i));
    fabpool_torch_counters c1 = counters();
    CHECK(c1.blocks_live == c0.blocks_live + 4 && c1.frees == c0.frees + 1 && c1.allocs == c0.allocs + 5);
    CHECK(c1.bad_frees == c0.bad_frees + 2);
    for (int i = 0; i < 4; i++)
        if (live[i])
            T_free(live[i], 256, 0, s);
    fabpool_torch_counters c2 = counters();
    CHECK(c2.blocks_live == c0.blocks_live && c2.bytes_live == c0.bytes_live &&
          c2.usable_bytes_live == c0.usable_bytes_live);
    /* a device without a pool, and one that is no device: refused, counted in the sum over devices */
    fabpool_torch_counters a0 = {.struct_size = sizeof a0}, a1 = a0;
    CHECK(T_counters(-1, &a0) == FABPOOL_OK);
    int was = T_verbose(0);
    T_free((void *)(uintptr_t)0x1000, 256, 7, s);
    T_free((void *)(uintptr_t)0x1000, 256, -1, s);
    T_verbose(was);
    CHECK(T_counters(-1, &a1) == FABPOOL_OK && a1.bad_frees == a0.bad_frees + 2);
    char js[64];
    size_t need = 0;
    CHECK(T_stats_json(-1, js, sizeof js, &need) == FABPOOL_ERR_INVALID_ARG && strstr(T_err(), "not a device"));
    check_against_pool("bad frees");

    /* many live blocks at once (the table grows), freed in a shuffled order
     * (entries move back in their probe runs), then every one freed again:
     * each second free is refused */
    enum { M = 5000 };
    static void *many[M];
    c0 = counters();
    for (int i = 0; i < M; i++) {
        many[i] = T_alloc(256 + (size_t)(i % 3) * 512, 0, s);
        CHECK(many[i] != NULL);
    }
    uint64_t seed = 77;
    for (int i = M - 1; i > 0; i--) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((seed >> 33) % (uint64_t)(i + 1));
        void *t = many[i];
        many[i] = many[j];
        many[j] = t;
    }
    T_verbose(0);
    for (int i = 0; i < M; i++) {
        T_free(many[i], 0, 0, s);
        if (i % 2 == 1) /* a second free of the one before */
            T_free(many[i - 1], 0, 0, s);
    }
    for (int i = 0; i < M; i += 7)
        T_free(many[i], 0, 0, s);
    T_verbose(old_verbose);
    c1 = counters();
    CHECK(c1.frees == c0.frees + M && c1.blocks_live == c0.blocks_live && c1.bytes_live == c0.bytes_live);
    CHECK(c1.bad_frees == c0.bad_frees + M / 2 + (M + 6) / 7);
    check_against_pool("many");
}

static fabpool_torch_mem_stats mstats(void)
{
    fabpool_torch_mem_stats m;
    memset(&m, 0xff, sizeof m); /* every field written by the call */
    m.struct_size = sizeof m;
    CHECK(T_mstats(0, &m) == FABPOOL_OK);
    return m;
}

/* A number of the pool's stats JSON (fabpool_torch_stats_json). */
static uint64_t pool_num(const char *key)
{
    static char js[1 << 16];
    size_t need = 0;
    if (T_stats_json(0, js, sizeof js, &need) != FABPOOL_OK)
        return UINT64_MAX;
    const char *pool = strstr(js, "\"pool\":");
    return pool ? jnum(pool, key) : UINT64_MAX;
}

/* PyTorch's statistics against what is known: the sizes
 * asked, the counters, the pool's stats and what the driver holds. */
static void check_memory_stats(void *s, fabsim_ledger l0)
{
    enum { A = FABPOOL_TORCH_ALL, SP = FABPOOL_TORCH_SMALL_POOL, LP = FABPOOL_TORCH_LARGE_POOL };
    fabpool_torch_mem_stats m0 = mstats();
    fabpool_torch_counters c0 = counters();
    CHECK(m0.allocation[A].current == (int64_t)c0.blocks_live);
    CHECK(m0.allocated_bytes[A].current == (int64_t)c0.usable_bytes_live);
    CHECK(m0.requested_bytes[A].current == (int64_t)c0.bytes_live);
    CHECK(m0.allocation[A].current == m0.allocation[SP].current + m0.allocation[LP].current);

    size_t big = (5u << 20) + 4096;
    void *p1 = T_alloc(3000, 0, s), *p2 = T_alloc(big, 0, s);
    CHECK(p1 && p2);
    fabpool_torch_mem_stats m1 = mstats();
    fabpool_torch_counters c1 = counters();
    int64_t usable = (int64_t)(c1.usable_bytes_live - c0.usable_bytes_live);
    CHECK(m1.allocation[A].current == m0.allocation[A].current + 2);
    CHECK(m1.allocation[SP].current == m0.allocation[SP].current + 1);
    CHECK(m1.allocation[LP].current == m0.allocation[LP].current + 1);
    CHECK(m1.requested_bytes[A].current == m0.requested_bytes[A].current + 3000 + (int64_t)big);
    CHECK(m1.requested_bytes[SP].current == m0.requested_bytes[SP].current + 3000);
    CHECK(m1.allocated_bytes[A].current == m0.allocated_bytes[A].current + usable);
    CHECK(usable >= 3000 + (int64_t)big && m1.allocated_bytes[A].allocated - m0.allocated_bytes[A].allocated == usable);
    CHECK(m1.allocated_bytes[A].peak >= m1.allocated_bytes[A].current);
    /* reserved: what the pool maps, which is what the driver holds */
    fabsim_ledger l1 = t_ledger();
    CHECK(m1.reserved_bytes.current == (int64_t)(l1.bytes_held - l0.bytes_held));
    CHECK((uint64_t)m1.reserved_bytes.current == pool_num("mapped_bytes"));
    CHECK((uint64_t)m1.segment.current == pool_num("chunks_mapped"));
    CHECK((uint64_t)m1.num_device_alloc == pool_num("chunks_mapped_total"));
    CHECK((uint64_t)m1.num_device_free == pool_num("chunks_unmapped_total"));
    CHECK(m1.reserved_bytes.peak >= m1.reserved_bytes.current && m1.reserved_bytes.current >= usable);

    /* peaks stay after a free, and reset to the current values */
    T_free(p2, big, 0, s);
    fabpool_torch_mem_stats m2 = mstats();
    CHECK(m2.allocated_bytes[A].current == m1.allocated_bytes[A].current - (usable - (m1.allocated_bytes[SP].current -
                                                                                      m0.allocated_bytes[SP].current)));
    CHECK(m2.allocated_bytes[A].peak == m1.allocated_bytes[A].peak && m2.requested_bytes[LP].freed >= (int64_t)big);
    CHECK(T_reset_peak(0) == FABPOOL_OK);
    fabpool_torch_mem_stats m3 = mstats();
    CHECK(m3.allocated_bytes[A].peak == m3.allocated_bytes[A].current && m3.allocation[A].peak == m3.allocation[A].current);
    CHECK(m3.reserved_bytes.peak == m3.reserved_bytes.current);
    CHECK(counters().bytes_live_peak == counters().bytes_live);

    /* a block that maps new memory raises the reserved peak; empty brings the
     * current value down (to what the driver holds), not the peak */
    void *p3 = T_alloc(96u << 20, 0, s);
    CHECK(p3 != NULL);
    fabpool_torch_mem_stats m4 = mstats();
    CHECK(m4.reserved_bytes.current > m3.reserved_bytes.current && m4.reserved_bytes.current >= (96 << 20));
    CHECK(m4.reserved_bytes.peak == m4.reserved_bytes.current);
    CHECK(m4.allocated_bytes[A].peak == m4.allocated_bytes[A].current);
    T_free(p3, 96u << 20, 0, s);
    CHECK(T_empty(0) == FABPOOL_OK);
    fabpool_torch_mem_stats m5 = mstats();
    fabsim_ledger l5 = t_ledger();
    CHECK(m5.reserved_bytes.current == (int64_t)(l5.bytes_held - l0.bytes_held));
    CHECK(m5.reserved_bytes.current < m4.reserved_bytes.current && m5.reserved_bytes.peak == m4.reserved_bytes.peak);
    CHECK(m5.num_device_free > m4.num_device_free);
    CHECK(m5.reserved_bytes.allocated - m5.reserved_bytes.freed == m5.reserved_bytes.current);

    /* accumulated counts start again from 0 */
    CHECK(T_reset_acc(0) == FABPOOL_OK);
    fabpool_torch_mem_stats m6 = mstats();
    CHECK(m6.allocation[A].allocated == 0 && m6.allocation[A].freed == 0 && m6.reserved_bytes.allocated == 0 &&
          m6.num_device_alloc == 0 && m6.num_device_free == 0 && m6.num_sync_all_streams == 0 &&
          m6.num_alloc_retries == 0 && m6.num_ooms == 0);
    CHECK(m6.allocation[A].current == m5.allocation[A].current);
    T_free(p1, 3000, 0, s);
    fabpool_torch_mem_stats m7 = mstats();
    CHECK(m7.allocation[A].freed == 1 && m7.requested_bytes[A].freed == 3000 &&
          m7.allocation[A].current == m0.allocation[A].current);

    /* bad input */
    CHECK(T_mstats(64, &m7) == FABPOOL_ERR_INVALID_ARG && T_mstats(0, NULL) == FABPOOL_ERR_INVALID_ARG);
    CHECK(T_mstats(5, &m7) == FABPOOL_OK && m7.reserved_bytes.current == 0 && m7.allocation[A].peak == 0);
    CHECK(T_reset_peak(-2) == FABPOOL_ERR_INVALID_ARG && T_reset_acc(64) == FABPOOL_ERR_INVALID_ARG);
    CHECK(T_reset_peak(-1) == FABPOOL_OK);
    CHECK(T_empty(0) == FABPOOL_OK); /* nothing cached for what follows */
}

/* The slot of `tag` on device 0 and its allocator pair, as fabpool_torch.mempool(tag=...) binds them for a
 * MemPool: 0, or -1 if the slot was refused. */
static int tag_bind(void *h, const char *tag, alloc_fn *a, free_fn *f)
{
    int k = T_tag_slot(tag, 0);
    CHECK(k >= 0);
    if (k < 0)
        return -1;
    char name[64];
    snprintf(name, sizeof name, "fabpool_torch_tag%d_alloc", k);
    *(void **)a = dlsym(h, name);
    snprintf(name, sizeof name, "fabpool_torch_tag%d_free", k);
    *(void **)f = dlsym(h, name);
    CHECK(*a != NULL && *f != NULL);
    return *a && *f ? 0 : -1;
}

static int ledger_back_to(fabsim_ledger l0, const char *where)
{
    fabsim_ledger l = t_ledger();
    int ok = l.bytes_held == l0.bytes_held && l.mappings == l0.mappings && l.reservations == l0.reservations &&
             l.handles == l0.handles;
    if (!ok)
        fprintf(stderr, "%s: the driver holds %llu bytes in %llu mappings, %llu reservations, %llu handles "
                "(started with %llu, %llu, %llu, %llu)\n", where, (unsigned long long)l.bytes_held,
                (unsigned long long)l.mappings, (unsigned long long)l.reservations, (unsigned long long)l.handles,
                (unsigned long long)l0.bytes_held, (unsigned long long)l0.mappings,
                (unsigned long long)l0.reservations, (unsigned long long)l0.handles);
    return ok;
}

/* Shutdown destroys the tags' pools (MemPools of fabpool_torch.mempool(tag=...)) as well as the devices':
 * the driver holds nothing after it.  A tag with a live block keeps its pool, its memory and its data
 * (FABPOOL_ERR_BUSY, the tag named), while the pools with nothing live go.  After a shutdown a tag slot is
 * unbound: its pair refuses until fabpool_torch_tag_slot binds it again, and then works. */
static void check_shutdown_with_tags(void *h, void *s, fabsim_ledger l0)
{
    char list[256];
    /* every block freed: nothing left anywhere */
    alloc_fn ta;
    free_fn tf;
    if (tag_bind(h, "weights", &ta, &tf) != 0)
        return;
    void *w = ta(64u << 20, 0, s);
    void *d = T_alloc(1u << 20, 0, s);
    CHECK(w != NULL && d != NULL);
    tf(w, 64u << 20, 0, s);
    T_free(d, 1u << 20, 0, s);
    CHECK(T_shutdown() == FABPOOL_OK);
    CHECK(ledger_back_to(l0, "shutdown after a tag's blocks were freed"));
    CHECK(T_tag_list(0, list, sizeof list) == FABPOOL_OK && list[0] == 0);

    /* the old slot is unbound now: refused with a message, nothing allocated */
    CHECK(ta(4096, 0, s) == NULL && strstr(T_tag_err(), "fabpool_torch_tag_slot") != NULL);
    CHECK(ledger_back_to(l0, "an unbound slot's allocation"));

    /* a tag with a live block: BUSY, that tag's pool and data stay; the default pool (nothing live) goes */
    if (tag_bind(h, "kv", &ta, &tf) != 0)
        return;
    size_t kv_size = (2u << 20) + 512;
    void *kv = ta(kv_size, 0, s);
    CHECK(kv != NULL);
    if (!kv)
        return;
    t_put_tag(kv, kv_size, 0x6b76);
    d = T_alloc(3000, 0, s);
    CHECK(d != NULL);
    T_free(d, 3000, 0, s);
    fabsim_ledger la = t_ledger();
    CHECK(T_shutdown() == FABPOOL_ERR_BUSY);
    CHECK(strstr(T_err(), "'kv'") != NULL && strstr(T_err(), "1 live block") != NULL);
    CHECK(T_tag_list(0, list, sizeof list) == FABPOOL_OK && strcmp(list, "kv") == 0);
    CHECK(t_ledger().bytes_held < la.bytes_held); /* the default pool's memory went back */
    CHECK(t_tag_ok(kv, kv_size, 0x6b76));
    d = T_alloc(3000, 0, s); /* a device and a tag busy: the message names both */
    CHECK(d != NULL);
    CHECK(T_shutdown() == FABPOOL_ERR_BUSY);
    CHECK(strstr(T_err(), "device 0 still has 1 live blocks") != NULL && strstr(T_err(), "'kv'") != NULL);
    T_free(d, 3000, 0, s);
    void *kv2 = ta(4096, 0, s); /* the tag still allocates */
    CHECK(kv2 != NULL);
    tf(kv2, 4096, 0, s);
    tf(kv, kv_size, 0, s);
    CHECK(T_shutdown() == FABPOOL_OK);
    CHECK(ledger_back_to(l0, "shutdown once the tag's block was freed"));

    /* and everything works again after a shutdown; a tag asleep (its data offloaded to the host) goes too */
    if (tag_bind(h, "weights", &ta, &tf) != 0)
        return;
    w = ta(8u << 20, 0, s);
    d = T_alloc(1234, 0, s);
    CHECK(w != NULL && d != NULL);
    if (w)
        t_put_tag(w, 8u << 20, 0x77);
    CHECK(w == NULL || t_tag_ok(w, 8u << 20, 0x77));
    CHECK(T_tag_sleep("weights", 0, 1, NULL) == FABPOOL_OK && t_ledger().bytes_held_host > 0);
    tf(w, 8u << 20, 0, s);
    T_free(d, 1234, 0, s);
    CHECK(T_shutdown() == FABPOOL_OK);
    CHECK(ledger_back_to(l0, "shutdown after a second round") && t_ledger().bytes_held_host == 0);
}

typedef struct worker {
    int id;
    int failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    cuCtxSetCurrent(t_ctx);
    CUstream s;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS) {
        w->failures++;
        return NULL;
    }
    void *live[16] = {0};
    size_t sz[16] = {0};
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    for (int i = 0; i < 3000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % 16);
        if (live[k]) {
            T_free(live[k], sz[k], 0, s);
            live[k] = NULL;
        } else {
            sz[k] = 256 + (size_t)((seed >> 20) % (64 << 10));
            live[k] = T_alloc(sz[k], 0, i % 7 == 0 ? NULL : s);
            if (!live[k])
                w->failures++;
        }
    }
    for (int k = 0; k < 16; k++)
        if (live[k])
            T_free(live[k], sz[k], 0, s);
    cuStreamDestroy(s);
    return NULL;
}

/* ---- a child forked while a thread of the parent waits inside the shim */

#define FORK_BLOCK (160u << 20) /* two do not fit on the device of 256 MiB that the case runs on */
#define FORK_ALARM_S 5

/* The driver's synchronizes so far: a thread that waits for a stream held long sits in one. */
static uint64_t sync_calls(void)
{
    return S_calls("cuStreamSynchronize") + S_calls("cuEventSynchronize") + S_calls("cuCtxSynchronize");
}

typedef struct fork_waiter {
    CUstream s, s2;      /* s: held long once its block is freed; s2: the allocation that waits for it */
    uint64_t syncs0;     /* sync_calls() just before that allocation */
    atomic_int armed;    /* syncs0 is set and the allocation starts */
    atomic_int done;     /* the allocation returned */
    void *got;
    int failures;
} fork_waiter;

static void *fork_waiter_main(void *arg)
{
    fork_waiter *w = arg;
    cuCtxSetCurrent(t_ctx);
    void *first = T_alloc(FORK_BLOCK, 0, w->s);
    void *other = T_alloc(4096, 0, w->s2); /* another stream: s's frees go through the queue from now on */
    if (!first || !other) {
        w->failures++;
        atomic_store(&w->armed, 1);
        atomic_store(&w->done, 1);
        return NULL;
    }
    T_free(other, 4096, 0, w->s2);
    S_hold_long(w->s); /* a kernel on s that runs long still uses `first` */
    T_free(first, FORK_BLOCK, 0, w->s);
    w->syncs0 = sync_calls();
    atomic_store(&w->armed, 1);
    /* no room while `first` waits for s: the out-of-memory path waits for s, the device's lock held */
    w->got = T_alloc(FORK_BLOCK, 0, w->s2);
    atomic_store(&w->done, 1);
    return NULL;
}

/* A child forked while a thread of the parent waits, inside fabpool_torch_alloc's out-of-memory path and holding
 * the device's lock, for a stream whose work runs long: the shim's calls in the child answer (the pool, made
 * before the fork, refuses: FABPOOL_ERR_NOT_SUPPORTED, and an allocation gives NULL) instead of waiting for a lock
 * that no thread of the child will let go; alarm() ends a child that hangs.  Then the stream's work ends, the
 * thread gets its block, and the shim's shutdown gives the driver every byte back. */
static void forked_child_answers_while_a_thread_waited(void)
{
    fabsim_ledger l0 = t_ledger();
    void (*report_at_exit)(void) = NULL;
    *(void **)&report_at_exit = dlsym(T_lib, "fabpool_torch_print_stats_at_exit");
    CHECK(report_at_exit != NULL && S_hold_long != NULL);
    if (!report_at_exit || !S_hold_long)
        return;
    fork_waiter w = {0};
    CHECK_CU(cuStreamCreate(&w.s, 0));
    CHECK_CU(cuStreamCreate(&w.s2, 0));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, fork_waiter_main, &w) == 0);
    while (!atomic_load(&w.armed))
        usleep(1000);
    int ms = 0;
    while (!w.failures && sync_calls() == w.syncs0 && ms++ < 10000)
        usleep(1000);
    CHECK(w.failures == 0 && sync_calls() > w.syncs0 && !atomic_load(&w.done));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(FORK_ALARM_S);
        T_verbose(0);
        fabpool_torch_counters c = {.struct_size = sizeof c};
        fabpool_status sc = T_counters(-1, &c);
        fabpool_torch_mem_stats m = {.struct_size = sizeof m};
        fabpool_status sm = T_mstats(0, &m);
        void *p = T_alloc(4096, 0, NULL);
        char alloc_msg[512];
        snprintf(alloc_msg, sizeof alloc_msg, "%s", T_err());
        report_at_exit(); /* the Python module's at-exit report */
        printf("forked child: get_counters %d, get_memory_stats %d, alloc %p (%s)\n", (int)sc, (int)sm, p, alloc_msg);
        fflush(stdout);
        /* 3: an answer other than the pool's refusal (the shim passes it on), or the allocation's message naming
         * another call than the one that refused it */
        _exit(sc == FABPOOL_ERR_NOT_SUPPORTED && sm == FABPOOL_ERR_NOT_SUPPORTED && !p &&
                      strstr(alloc_msg, "fabpool_alloc_on_stream") ? 0 : 3);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WIFSIGNALED(status))
        fprintf(stderr, "the forked child hung in a shim call (ended by signal %d after %d s)\n", WTERMSIG(status),
                FORK_ALARM_S);
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "the forked child's shim calls did not pass on the pool's refusal, or named another call "
                "(exit %d)\n",
                WEXITSTATUS(status));
    CHECK(!atomic_load(&w.done)); /* the thread waited all along */
    S_release(w.s);
    pthread_join(th, NULL);
    CHECK(w.got != NULL);
    if (w.got)
        T_free(w.got, FORK_BLOCK, 0, w.s2);
    CHECK(T_shutdown() == FABPOOL_OK);
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_held == l0.bytes_held && l.reservations == l0.reservations && l.mappings == l0.mappings &&
          l.handles == l0.handles);
    CHECK_CU(cuStreamDestroy(w.s));
    CHECK_CU(cuStreamDestroy(w.s2));
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s libfabpool_torch.so\n", argv[0]);
        return 2;
    }
    int sim = t_driver_init();
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    T_lib = h;
#define SYM(var, name) do { *(void **)&var = dlsym(h, name); CHECK(var != NULL); } while (0)
    SYM(T_alloc, "fabpool_torch_alloc");
    SYM(T_free, "fabpool_torch_free");
    SYM(T_empty, "fabpool_torch_empty");
    SYM(T_stats_json, "fabpool_torch_stats_json");
    SYM(T_counters, "fabpool_torch_get_counters");
    SYM(T_err, "fabpool_torch_last_error");
    SYM(T_verbose, "fabpool_torch_set_verbose");
    SYM(T_shutdown, "fabpool_torch_shutdown");
    SYM(T_mstats, "fabpool_torch_get_memory_stats");
    SYM(T_reset_peak, "fabpool_torch_reset_peak_stats");
    SYM(T_reset_acc, "fabpool_torch_reset_accumulated_stats");
    SYM(T_tag_slot, "fabpool_torch_tag_slot");
    SYM(T_tag_list, "fabpool_torch_tag_list");
    SYM(T_tag_err, "fabpool_torch_tag_last_error");
    SYM(T_tag_sleep, "fabpool_torch_tag_sleep");
#undef SYM
    /* one file, the PyTorch ABI only: fabpool's own symbols stay inside */
    CHECK(dlsym(h, "fabpool_alloc") == NULL && dlsym(h, "fp_drv_load") == NULL);
    if (!sim) { /* the library's ABI checked above; the rest skipped (77) */
        fprintf(stderr, "the simulated driver is not loaded: this test needs its stream holds and ledger; skipped\n");
        return t_done("test_torch_shim") ? 1 : 77;
    }
    *(void **)&S_hold = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&S_hold_long = dlsym(RTLD_DEFAULT, "fabsim_stream_hold_long");
    *(void **)&S_release = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    *(void **)&S_calls = dlsym(RTLD_DEFAULT, "fabsim_calls");
    *(void **)&S_fault = dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    *(void **)&S_fault_clear = dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    if (argc > 2) {
        if (strcmp(argv[2], "forked_child_answers_while_a_thread_waited") != 0) {
            fprintf(stderr, "%s: no case '%s' (forked_child_answers_while_a_thread_waited)\n", argv[0], argv[2]);
            return 2;
        }
        forked_child_answers_while_a_thread_waited();
        return t_done(argv[2]);
    }
    fabsim_ledger l0 = t_ledger();

    CUstream s1, s2;
    CHECK_CU(cuStreamCreate(&s1, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));

    /* same stream: the block comes back at once, with no driver call; first on the owner stream (the first
     * stream the pool sees, s1: its frees go to the pool at once), then, once another stream's allocation
     * has ended the owner mode, through the queue */
    for (int owner = 1; owner >= 0; owner--) {
        for (size_t size = 1000; size <= (64u << 20); size *= 16) {
            void *p = T_alloc(size, 0, s1);
            CHECK(p != NULL && (uintptr_t)p % 256 == 0);
            t_put_tag(p, size, size);
            fabpool_torch_counters c0 = counters();
            uint64_t calls0 = S_calls(NULL);
            T_free(p, size, 0, s1);
            void *q = T_alloc(size - 8, 0, s1); /* same size class */
            CHECK(S_calls(NULL) == calls0);
            CHECK(q == p);
            fabpool_torch_counters c1 = counters();
            CHECK(owner ? c1.owner_frees == c0.owner_frees + 1 && c1.reuse_same_stream == c0.reuse_same_stream
                        : c1.reuse_same_stream == c0.reuse_same_stream + 1 && c1.owner_frees == c0.owner_frees);
            CHECK(t_tag_ok(q, size, size));
            T_free(q, size - 8, 0, s1);
        }
        check_against_pool("same stream");
        if (owner) { /* an allocation on s2 waits for s1's work once (a fence) and ends the owner mode */
            fabpool_torch_counters c0 = counters();
            void *x = T_alloc(4096, 0, s2);
            CHECK(x != NULL && counters().fences == c0.fences + 1);
            T_free(x, 4096, 0, s2);
        }
    }

    /* another stream: only after the first stream's work is done */
    check_cross_stream(s1, s2, 4096, 0);
    check_cross_stream(s2, s1, 6u << 20, 1);     /* a large block, released by a stream sync */
    check_cross_stream(NULL, s2, 768, 0);        /* the legacy default stream */
    check_cross_stream(s1, NULL, 100000, 0);
    check_against_pool("cross stream");

    /* a mixed workload on two streams and the default one: no block is given
     * twice (every live block keeps its tags) */
    {
        enum { N = 48 };
        void *live[N] = {0};
        size_t sz[N] = {0};
        void *st[N] = {0};
        void *streams[3] = {s1, s2, NULL};
        uint64_t seed = 12345;
        for (int i = 0; i < 3000; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int k = (int)((seed >> 33) % N);
            if (live[k]) {
                CHECK(t_tag_ok(live[k], sz[k], (uint64_t)k * 7919 + sz[k]));
                T_free(live[k], sz[k], 0, st[k]);
                live[k] = NULL;
            } else {
                unsigned r = (unsigned)(seed >> 40);
                sz[k] = r % 5 == 0 ? (size_t)(1 + r % 12) << 20 : 256 + r % (200 << 10);
                st[k] = streams[(seed >> 20) % 3];
                live[k] = T_alloc(sz[k], 0, st[k]);
                CHECK(live[k] != NULL);
                if (live[k])
                    t_put_tag(live[k], sz[k], (uint64_t)k * 7919 + sz[k]);
            }
            if (i == 1500)
                S_hold(s2); /* for a while, s2's frees stay pending */
            if (i == 2500)
                S_release(s2);
        }
        check_against_pool("mixed");
        for (int k = 0; k < N; k++)
            if (live[k]) {
                CHECK(t_tag_ok(live[k], sz[k], (uint64_t)k * 7919 + sz[k]));
                T_free(live[k], sz[k], 0, st[k]);
            }
        fabpool_torch_counters c = counters();
        CHECK(c.reuse_same_stream > 100 && c.reuse_after_event > 0 && c.blocks_live == 0 && c.bytes_live == 0);
        printf("mixed: %llu allocs, %llu same-stream reuses, %llu after an event, %llu from the pool, %llu events\n",
               (unsigned long long)c.allocs, (unsigned long long)c.reuse_same_stream,
               (unsigned long long)c.reuse_after_event, (unsigned long long)c.pool_allocs,
               (unsigned long long)c.events_recorded);
    }

    check_asleep(s1);
    check_small_alignment(s1);
    check_bad_frees(s1);

    /* threads, each on its own stream (and sometimes the default one) */
    {
        pthread_t th[4];
        worker w[4];
        for (int i = 0; i < 4; i++) {
            w[i] = (worker){i, 0};
            pthread_create(&th[i], NULL, worker_main, &w[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK(w[i].failures == 0);
        }
        check_against_pool("threads");
    }

    /* a stream destroyed with blocks still freed on it: the shim waits for the
     * device instead of recording on it */
    {
        CUstream s3;
        CHECK_CU(cuStreamCreate(&s3, 0));
        void *p = T_alloc(3000, 0, s3);
        T_free(p, 3000, 0, s3);
        CHECK_CU(cuStreamDestroy(s3));
        fabpool_torch_counters c0 = counters();
        void *q = T_alloc(50000, 0, s2); /* a miss: polls every stream */
        CHECK(q != NULL);
        CHECK(counters().syncs > c0.syncs);
        T_free(q, 50000, 0, s2);
    }

    /* empty: every cached byte back to the driver */
    CHECK(T_empty(-1) == FABPOOL_OK);
    {
        fabpool_torch_counters c = counters();
        CHECK(c.cached_blocks == 0 && c.cached_bytes == 0 && c.streams == 0);
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held && l.mappings == l0.mappings);
        if (l.bytes_held != l0.bytes_held)
            fprintf(stderr, "after empty the driver holds %llu bytes (started with %llu)\n",
                    (unsigned long long)l.bytes_held, (unsigned long long)l0.bytes_held);
        check_against_pool("empty");
    }

    check_memory_stats(s1, l0);

    /* errors: NULL and a message (PyTorch itself does not look) */
    T_verbose(0);
    {
        fabpool_torch_counters c0 = counters();
        CHECK(T_alloc(0, 0, s1) == NULL && strstr(T_err(), "size 0"));
        CHECK(T_alloc((size_t)1 << 50, 0, s1) == NULL && strstr(T_err(), "PyTorch asked for"));
        CHECK(T_alloc(256, 99, s1) == NULL && strstr(T_err(), "device 99"));
        CHECK(T_alloc(256, 3, s1) == NULL && strstr(T_err(), "does not exist"));
        CHECK(T_alloc(256, -1, s1) == NULL && strstr(T_err(), "out of range"));
        int x;
        T_free(&x, 4, 0, s1);
        CHECK(strstr(T_err(), "not given out by fabpool_torch_alloc") != NULL);
        T_free(&x, 4, 5, s1);
        CHECK(strstr(T_err(), "no fabpool pool") != NULL);
        /* the driver out of memory: NULL, a message that says so, nothing leaked */
        fabsim_ledger la = t_ledger();
        S_fault("cuMemCreate", 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(T_alloc(64u << 20, 0, s1) == NULL && strstr(T_err(), "OUT_OF_MEMORY"));
        S_fault_clear();
        fabsim_ledger lb = t_ledger();
        CHECK(lb.bytes_held == la.bytes_held && lb.handles == la.handles);
        fabpool_torch_counters c1 = counters();
        CHECK(c1.alloc_failures == c0.alloc_failures + 2 && c1.allocs == c0.allocs && c1.frees == c0.frees);
        CHECK(mstats().num_ooms == 2); /* 1 << 50 and the driver's out of memory (since the reset above) */
        void *p = T_alloc(64u << 20, 0, s1); /* and it works again */
        CHECK(p != NULL);
        T_free(p, 64u << 20, 0, s1);
        CHECK(T_empty(7) == FABPOOL_OK);      /* a device without a pool: nothing to do */
        CHECK(T_empty(-2) == FABPOOL_ERR_INVALID_ARG);
        char small[8];
        size_t need = 0;
        CHECK(T_stats_json(0, small, sizeof small, &need) == FABPOOL_ERR_LIMIT && need > sizeof small);
        CHECK(T_stats_json(1, small, sizeof small, &need) == FABPOOL_ERR_NOT_FOUND && strstr(T_err(), "no pool"));
    }

    /* shutdown refuses while a block is live, then destroys the pool */
    {
        void *p = T_alloc(1234, 0, s1);
        CHECK(T_shutdown() == FABPOOL_ERR_BUSY && strstr(T_err(), "1 live blocks"));
        T_free(p, 1234, 0, s1);
        CHECK(T_shutdown() == FABPOOL_OK);
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == l0.bytes_held && l.reservations == l0.reservations && l.mappings == l0.mappings);
        /* and a later allocation makes a new pool */
        p = T_alloc(1234, 0, s1);
        CHECK(p != NULL);
        T_free(p, 1234, 0, s1);
        CHECK(T_shutdown() == FABPOOL_OK);
    }
    check_shutdown_with_tags(h, s1, l0);
    CHECK_CU(cuStreamDestroy(s1));
    CHECK_CU(cuStreamDestroy(s2));
    return t_done("test_torch_shim");
}
