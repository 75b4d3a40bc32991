/* test_trace: FABPOOL_TRACE / the conf key trace (lib/trace.c).
 *
 * A known sequence recorded and read back with the tools' reader (every
 * record compared); many threads; a pool with and without a trace behaving
 * the same; the key's parsing; a bad path refused at creation with nothing
 * held; %p / %d and a second pool on the same path; the flush at exit of a
 * process that never destroys its pool; a forked child writing nothing; and
 * truncated or corrupt files refused by the reader and by fabpool_replay
 * (argv[1]); fabpool_replay --check on a trace of the stream pair on two
 * streams: passed when everything was freed, failed on a block left live;
 * the application's calls marked as its own; the map and unmap records
 * adding up to the bytes the pool mapped; fabpool_trace_flush while the
 * pool records; a trace path in a folder others may write: a symbolic
 * link planted by another user, a FIFO (with and without a reader), a file
 * of another user or with two names refuse pool creation (FABPOOL_ERR_IO,
 * naming the path and why) and change nothing, through the options,
 * FABPOOL_TRACE and FABPOOL_CONF; a file of ours is truncated, a new one is
 * made with mode 0600; a buffer that lost its chunk to two driver faults (FABPOOL_ERR_PARTIAL) read and
 * replayed.  test_trace --mixed REPLAY
 * SUMMARY: a program mixing every kind of call, traced with FABPOOL_TRACE,
 * summarised and replayed as it ran. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "planted.h"
#include "trace_write.h"
#include "trace_file.h"
#include "trace_viz.h"

static char dir[256];

static fabpool_t *make(const char *path, const char *conf)
{
    fabpool_options o;
    fabpool_options_init(&o);
    if (path)
        snprintf(o.trace_path, sizeof o.trace_path, "%s", path);
    o.conf = conf;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    return p;
}

/* A pool tracing to dir/name, its path in path. */
static fabpool_t *make_traced(const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    return make(path, NULL);
}

/* Bytes mapped minus bytes unmapped by the map and unmap records of the trace load() read last. */
static int64_t maps_net;

/* Reads the trace at path and takes its map and unmap records out (into maps_net), leaving the calls the
 * checks compare; each unmap must name a range an earlier map gave, and each record is the pool's own. */
static int load(const char *path, trace_data *d)
{
    char err[512];
    if (trace_load(path, d, err, sizeof err) != 0) {
        fprintf(stderr, "trace_load(%s): %s\n", path, err);
        return -1;
    }
    u64map mapped = {0};
    size_t k = 0;
    maps_net = 0;
    for (size_t i = 0; i < d->n; i++) {
        const fabpool_trace_rec *r = &d->recs[i];
        uint64_t size = 0;
        if (r->op == FABPOOL_TR_MAP) {
            CHECK(r->flags == 0 && r->size > 0 && !u64map_get(&mapped, r->ptr, NULL));
            CHECK(u64map_put(&mapped, r->ptr, r->size) == 0);
            maps_net += (int64_t)r->size;
        } else if (r->op == FABPOOL_TR_UNMAP) {
            CHECK(r->flags == 0 && u64map_del(&mapped, r->ptr, &size) && size == r->size);
            maps_net -= (int64_t)r->size;
        } else {
            d->recs[k++] = *r;
        }
    }
    d->n = k;
    u64map_free(&mapped);
    return 0;
}

/* The summary of the trace at path: 0, or -1 (a failed check) if it does not load. */
static int summary_of(const char *path, trace_summary *s)
{
    trace_data d;
    if (load(path, &d) != 0) {
        CHECK(0);
        return -1;
    }
    trace_summarize(&d, s);
    trace_free(&d);
    return 0;
}

typedef struct want {
    unsigned op;
    uint64_t ptr, size, arg;
    unsigned status;
} want;

static void round_trip(void)
{
    char path[300];
    fabpool_t *p = make_traced("known.trace", path, sizeof path);
    if (!p)
        return;
    CUstream s1 = NULL;
    CHECK_CU(cuStreamCreate(&s1, 0));
    want w[32];
    int n = 0;
    void *a = NULL, *b = NULL, *c = NULL, *bad = NULL;
    CHECK_OK(fabpool_alloc(p, 1000, &a));
    w[n++] = (want){FABPOOL_TR_ALLOC, (uintptr_t)a, 1000, 0, 0};
    CHECK_OK(fabpool_alloc(p, 300000, &b));
    w[n++] = (want){FABPOOL_TR_ALLOC, (uintptr_t)b, 300000, 0, 0};
    CHECK_OK(fabpool_alloc(p, 9u << 20, &c)); /* above slab_max: a block of an arena */
    w[n++] = (want){FABPOOL_TR_ALLOC, (uintptr_t)c, 9u << 20, 0, 0};
    CHECK_STATUS(fabpool_alloc(p, SIZE_MAX, &bad), FABPOOL_ERR_OUT_OF_MEMORY); /* a refusal, recorded with its status */
    w[n++] = (want){FABPOOL_TR_ALLOC, 0, SIZE_MAX, 0, FABPOOL_ERR_OUT_OF_MEMORY};
    CHECK_OK(fabpool_alloc(p, 0, &bad)); /* nothing allocated (NULL): nothing recorded */
    CHECK_OK(fabpool_free(p, NULL));
    CHECK_OK(fabpool_free(p, b));
    w[n++] = (want){FABPOOL_TR_FREE, (uintptr_t)b, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN};
    fabpool_buffer_t *buf = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64u << 20, 4u << 20, &buf));
    uint64_t base = (uintptr_t)fabpool_buffer_ptr(buf);
    w[n++] = (want){FABPOOL_TR_BUF_CREATE, base, 4u << 20, 64u << 20, 0};
    CHECK_OK(fabpool_buffer_resize(buf, 20u << 20, s1));
    w[n++] = (want){FABPOOL_TR_BUF_RESIZE, base, 20u << 20, (uintptr_t)s1, 0};
    CHECK_OK(fabpool_buffer_resize(buf, 2u << 20, NULL));
    w[n++] = (want){FABPOOL_TR_BUF_RESIZE, base, 2u << 20, 0, 0};
    CHECK_STATUS(fabpool_buffer_resize(buf, 128u << 20, NULL), FABPOOL_ERR_LIMIT); /* past max: not recorded */
    CHECK_OK(fabpool_trim(p, 12345));
    w[n++] = (want){FABPOOL_TR_TRIM, 0, 12345, 0, FABPOOL_TRACE_STATUS_UNKNOWN};
    CHECK_OK(fabpool_buffer_destroy(buf, s1));
    w[n++] = (want){FABPOOL_TR_BUF_DESTROY, base, 0, (uintptr_t)s1, 0};
    CHECK_OK(fabpool_free(p, a));
    w[n++] = (want){FABPOOL_TR_FREE, (uintptr_t)a, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN};
    CHECK_OK(fabpool_free(p, c));
    w[n++] = (want){FABPOOL_TR_FREE, (uintptr_t)c, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN};
    CHECK_STATUS(fabpool_free(p, a), FABPOOL_ERR_DOUBLE_FREE); /* recorded before it is refused */
    w[n++] = (want){FABPOOL_TR_FREE, (uintptr_t)a, 0, 0, FABPOOL_TRACE_STATUS_UNKNOWN};
    fabpool_options got = {.struct_size = sizeof got};
    CHECK_OK(fabpool_get_options(p, &got));
    CHECK(strcmp(got.trace_path, path) == 0);
    uint64_t mapped = t_mapped(p);
    CHECK(mapped > 0);
    CHECK_OK(fabpool_destroy(p)); /* the trace closes first: what destroy unmaps is not in it */
    CHECK_CU(cuStreamDestroy(s1));

    trace_data d;
    if (load(path, &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK(d.closed);
    CHECK(d.h.flags & FABPOOL_TRACE_F_APP_MARKED);
    CHECK(d.h.version == FABPOOL_TRACE_VERSION);
    CHECK(d.h.device == 0);
    CHECK(d.h.granularity == 2u << 20);
    CHECK(d.h.slab_max == 4096); /* the default */
    CHECK(d.h.pid == (uint32_t)getpid());
    CHECK(d.n == (size_t)n);
    CHECK(maps_net == (int64_t)mapped); /* the map and unmap records add up to what the driver held */
    for (int i = 0; i < n && (size_t)i < d.n; i++) {
        const fabpool_trace_rec *r = &d.recs[i];
        int same = r->op == w[i].op && r->ptr == w[i].ptr && r->size == w[i].size && r->arg == w[i].arg &&
                   r->status == w[i].status && r->thread == d.recs[0].thread &&
                   r->flags == FABPOOL_TRACE_R_APP; /* every call the program's */
        if (!same)
            fprintf(stderr, "record %d: op %u ptr %llx size %llu arg %llx status %u; expected op %u ptr %llx size %llu "
                    "arg %llx status %u\n", i, r->op, (unsigned long long)r->ptr, (unsigned long long)r->size,
                    (unsigned long long)r->arg, r->status, w[i].op, (unsigned long long)w[i].ptr,
                    (unsigned long long)w[i].size, (unsigned long long)w[i].arg, w[i].status);
        CHECK(same);
        if (i)
            CHECK(r->t_ns >= d.recs[i - 1].t_ns);
    }
    trace_summary s;
    trace_summarize(&d, &s);
    CHECK(s.ops[FABPOOL_TR_ALLOC] == 4 && s.failed[FABPOOL_TR_ALLOC] == 1 && s.ops[FABPOOL_TR_FREE] == 4);
    CHECK(s.unknown_frees == 1);   /* the double free */
    CHECK(s.live_end == 0 && s.objects_end == 0);
    /* peak: a + b + c live (1000 + 300000 + 9 MiB), then the buffer's 20 MiB with a and c */
    CHECK(s.live_peak == 1000 + (9u << 20) + (20u << 20));
    CHECK(s.n_streams == 1 && s.streams[0] == (uintptr_t)s1 && s.null_stream);
    trace_free(&d);
}

/* The calls the program made are marked as its own, and the records the pool makes of itself under the stream
 * pair (its allocation from the pool, a pending block given back) are not, whatever the mix: the owner stream's
 * pair, a plain allocation that ends the owner mode, another stream's pair, a plain free, a collect. */
static void app_marks(void)
{
    char path[300];
    fabpool_t *p = make_traced("marks.trace", path, sizeof path);
    if (!p)
        return;
    CUstream s1 = NULL, s2 = NULL;
    CHECK_CU(cuStreamCreate(&s1, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));
    void *a = NULL, *b = NULL, *c = NULL;
    enum { APP = FABPOOL_TRACE_R_APP, U = FABPOOL_TRACE_STATUS_UNKNOWN };
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, s1, &a)); /* the owner stream */
    CHECK_OK(fabpool_free_on_stream(p, a, s1));
    CHECK_OK(fabpool_alloc(p, 2000, &b));
    CHECK_OK(fabpool_alloc_on_stream(p, 3000, s2, &c));
    CHECK_OK(fabpool_free_on_stream(p, c, s2));          /* pending on s2 */
    CHECK_OK(fabpool_free(p, b));
    CHECK_OK(fabpool_collect(p, 1));                     /* c back to the pool */
    CHECK_OK(fabpool_destroy(p));
    struct {
        unsigned op, flags;
        void *ptr;
        uint64_t arg;
        unsigned status;
    } w[] = {
        {FABPOOL_TR_ALLOC, 0, a, 0, FABPOOL_OK},      {FABPOOL_TR_APP_ALLOC, APP, a, (uintptr_t)s1, FABPOOL_OK},
        {FABPOOL_TR_APP_FREE, APP, a, (uintptr_t)s1, U}, {FABPOOL_TR_FREE, 0, a, 0, U},
        {FABPOOL_TR_ALLOC, APP, b, 0, FABPOOL_OK},    {FABPOOL_TR_ALLOC, 0, c, 0, FABPOOL_OK},
        {FABPOOL_TR_APP_ALLOC, APP, c, (uintptr_t)s2, FABPOOL_OK}, {FABPOOL_TR_APP_FREE, APP, c, (uintptr_t)s2, U},
        {FABPOOL_TR_FREE, APP, b, 0, U},              {FABPOOL_TR_FREE, 0, c, 0, U},
    };
    enum { NW = sizeof w / sizeof w[0] };
    trace_data d;
    if (load(path, &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK(d.n == NW && (d.h.flags & FABPOOL_TRACE_F_APP_MARKED) && d.has_app);
    for (size_t i = 0; i < d.n && i < NW; i++) {
        const fabpool_trace_rec *r = &d.recs[i];
        int same = r->op == w[i].op && r->flags == w[i].flags && r->ptr == (uintptr_t)w[i].ptr &&
                   r->arg == w[i].arg && r->status == w[i].status;
        if (!same)
            fprintf(stderr, "marks: record %zu: op %s flags %u ptr %llx arg %llx status %u; expected %s flags %u "
                    "ptr %p arg %llx status %u\n", i, fabpool_trace_op_name(r->op), r->flags,
                    (unsigned long long)r->ptr, (unsigned long long)r->arg, r->status, fabpool_trace_op_name(w[i].op),
                    w[i].flags, w[i].ptr, (unsigned long long)w[i].arg, w[i].status);
        CHECK(same);
    }
    /* the application's level: a, b and c each allocated and freed once; the pool's: the same three */
    trace_summary s;
    trace_summarize(&d, &s);
    CHECK(s.level_app && s.live_end == 0 && s.objects_end == 0 && s.unknown_frees == 0);
    CHECK(s.live_peak == 2000 + 3000 && s.pool_live_peak >= 2000 + 3000);
    trace_free(&d);
    CHECK_CU(cuStreamDestroy(s1));
    CHECK_CU(cuStreamDestroy(s2));
}

/* ------------------------------------------------------------ threads */

typedef struct targ {
    fabpool_t *p;
    int id;
} targ;

static void *worker(void *v)
{
    targ *a = v;
    void *q[16];
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 16; i++)
            if (fabpool_alloc(a->p, (size_t)(256 << (i % 12)) + (size_t)a->id, &q[i]) != FABPOOL_OK)
                q[i] = NULL;
        for (int i = 0; i < 16; i++)
            if (q[i])
                fabpool_free(a->p, q[i]);
    }
    return NULL;
}

static void threads(void)
{
    char path[300];
    fabpool_t *p = make_traced("threads.trace", path, sizeof path);
    if (!p)
        return;
    enum { NT = 4 };
    pthread_t th[NT];
    targ args[NT];
    for (int i = 0; i < NT; i++) {
        args[i] = (targ){p, i};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    CHECK_OK(fabpool_destroy(p));
    trace_data d;
    if (load(path, &d) != 0) {
        CHECK(0);
        return;
    }
    /* 4 threads x 200 rounds x 16 allocs and frees: more than one buffer's worth, in file order */
    CHECK(d.n == (size_t)NT * 200 * 16 * 2);
    trace_summary s;
    trace_summarize(&d, &s);
    CHECK(s.threads >= NT);
    CHECK(s.unknown_frees == 0); /* every free follows its allocation in the file */
    CHECK(s.live_end == 0 && s.failed[FABPOOL_TR_ALLOC] == 0);
    trace_free(&d);
}

/* ------------------------------------------------------------ off = same */

static void run_mix(fabpool_t *p)
{
    void *q[64];
    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < 64; i++)
            fabpool_alloc(p, (size_t)(512 + 4096 * i + 100000 * (r % 7)), &q[i]);
        for (int i = 0; i < 64; i += 2)
            fabpool_free(p, q[i]);
        for (int i = 1; i < 64; i += 2)
            fabpool_free(p, q[i]);
    }
}

/* A traced pool does what an untraced one does.  Both without thread caches: a traced pool's thread cache keeps
 * no medium blocks (every call of a traced pool takes the slow path, which the medium blocks' cache is not on),
 * so with them the untraced pool reuses medium blocks the traced one gives back (docs/config.md, "Traces"). */
static void off_is_same(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/same.trace", dir);
    static fabpool_stats a = {.struct_size = sizeof a}, b = {.struct_size = sizeof b};
    fabpool_t *p = make(NULL, "thread_cache:0");
    if (!p)
        return;
    run_mix(p);
    CHECK_OK(fabpool_get_stats(p, &a));
    CHECK_OK(fabpool_destroy(p));
    p = make(path, "thread_cache:0");
    if (!p)
        return;
    run_mix(p);
    CHECK_OK(fabpool_get_stats(p, &b));
    CHECK_OK(fabpool_destroy(p));
    CHECK(a.mapped_bytes_peak == b.mapped_bytes_peak);
    CHECK(a.in_use_bytes_peak == b.in_use_bytes_peak);
    CHECK(a.chunks_mapped_total == b.chunks_mapped_total);
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS; i++)
        CHECK(a.driver_calls[i] == b.driver_calls[i]);
    trace_data d; /* every call, and a map record for each chunk mapped */
    if (load(path, &d) == 0) {
        CHECK(d.n == 50 * 128);
        trace_free(&d);
    }
    CHECK(maps_net == (int64_t)b.mapped_bytes);
    struct stat st;
    uint64_t recs = 50 * 128 + b.chunks_mapped_total + b.chunks_unmapped_total;
    CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == FABPOOL_TRACE_HEADER_BYTES + recs * FABPOOL_TRACE_RECORD_BYTES);
}

/* ------------------------------------------------------------ options */

static void options(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK(o.trace_path[0] == 0);
    CHECK_OK(fabpool_options_parse(&o, "trace:/tmp/a:b=c/x-%p.trace,device:0"));
    CHECK(strcmp(o.trace_path, "/tmp/a:b=c/x-%p.trace") == 0);
    CHECK_OK(fabpool_options_parse(&o, "trace:none"));
    CHECK(o.trace_path[0] == 0);
    char longv[700];
    memset(longv, 'x', sizeof longv);
    memcpy(longv, "trace:/", 7);
    longv[sizeof longv - 1] = 0;
    CHECK_OK(fabpool_options_parse(&o, "trace:/keep"));
    CHECK_STATUS(fabpool_options_parse(&o, longv), FABPOOL_ERR_CONFIG);
    CHECK(strstr(fabpool_last_error(), "above the maximum of 511") != NULL);
    CHECK(strcmp(o.trace_path, "/keep") == 0); /* unchanged by the refused string */
    CHECK_STATUS(fabpool_options_parse(&o, "trace:/a b"), FABPOOL_ERR_CONFIG);
    CHECK_STATUS(fabpool_options_parse(&o, "trace:"), FABPOOL_ERR_CONFIG);
    /* a field that is not NUL-terminated */
    fabpool_options_init(&o);
    memset(o.trace_path, 'y', sizeof o.trace_path);
    fabpool_t *p = NULL;
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_CONFIG);
    CHECK(strstr(fabpool_last_error(), "trace_path") != NULL);
}

static void bad_path(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_options o;
    fabpool_options_init(&o);
    snprintf(o.trace_path, sizeof o.trace_path, "%s/no-such-dir/x.trace", dir);
    fabpool_t *p = NULL;
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_IO);
    CHECK(p == NULL);
    CHECK(strstr(fabpool_last_error(), "no-such-dir/x.trace") != NULL);
    CHECK(strstr(fabpool_last_error(), "No such file or directory") != NULL);
    fabsim_ledger after = t_ledger();
    CHECK(after.reservations == before.reservations && after.bytes_held == before.bytes_held);
    /* through the environment, which wins over the options */
    char env[300];
    snprintf(env, sizeof env, "%s/no-such-dir/env.trace", dir);
    setenv("FABPOOL_TRACE", env, 1);
    fabpool_options_init(&o);
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_IO);
    CHECK(strstr(fabpool_last_error(), "env.trace") != NULL);
    unsetenv("FABPOOL_TRACE");
}

/* A pool tracing to path is refused (FABPOOL_ERR_IO, the message naming the path and holding word), holding
 * nothing; how: 0 the options, 1 FABPOOL_TRACE, 2 FABPOOL_CONF. */
static void refused_path(const char *path, const char *word, int how)
{
    fabsim_ledger before = t_ledger();
    fabpool_options o;
    fabpool_options_init(&o);
    char conf[600];
    if (how == 0)
        snprintf(o.trace_path, sizeof o.trace_path, "%s", path);
    else if (how == 1)
        setenv("FABPOOL_TRACE", path, 1);
    else {
        snprintf(conf, sizeof conf, "trace:%s", path);
        setenv("FABPOOL_CONF", conf, 1);
    }
    fabpool_t *p = NULL;
    alarm(30); /* a FIFO must not hold the open */
    CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_IO);
    alarm(0);
    unsetenv("FABPOOL_TRACE");
    unsetenv("FABPOOL_CONF");
    CHECK(p == NULL);
    CHECK(strstr(fabpool_last_error(), path) && strstr(fabpool_last_error(), word));
    if (!strstr(fabpool_last_error(), word))
        fprintf(stderr, "  (wanted '%s' in: %s)\n", word, fabpool_last_error());
    fabsim_ledger after = t_ledger();
    CHECK(after.reservations == before.reservations && after.bytes_held == before.bytes_held);
    if (p)
        fabpool_destroy(p);
}

static void unsafe_paths(void)
{
    planted pl;
    if (planted_setup(&pl, dir, "run.trace", "trace") != 0) {
        CHECK(0);
        return;
    }
    for (int how = 0; how < 3; how++)
        refused_path(pl.link, "symbolic link", how);
    CHECK(planted_holds(pl.target, PLANTED_PRECIOUS));

    CHECK(mkfifo(pl.fifo, 0666) == 0);
    refused_path(pl.fifo, "FIFO", 0); /* no reader: at once */
    int rd = open(pl.fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(rd >= 0);
    refused_path(pl.fifo, "a FIFO, not a regular file", 1); /* a reader: opened, then refused */
    if (rd >= 0) {
        char b[64];
        CHECK(read(rd, b, sizeof b) == 0); /* nothing was written into it */
        close(rd);
    }
    if (pl.other > 0) {
        refused_path(pl.theirs, "owned by uid 65534", 0);
        CHECK(planted_holds(pl.theirs, PLANTED_THEIRS));
    }

    /* a file of ours with a second name (the other may be anywhere): refused */
    char path[320], name2[330];
    snprintf(path, sizeof path, "%s/two-names.trace", dir);
    snprintf(name2, sizeof name2, "%s.other", path);
    CHECK(planted_write(path, PLANTED_PRECIOUS, 0600) == 0 && link(path, name2) == 0);
    refused_path(path, "hard links", 0);
    CHECK(planted_holds(name2, PLANTED_PRECIOUS));

    /* ours: truncated (the reader takes the file only if it holds the records and nothing more) */
    snprintf(path, sizeof path, "%s/own.trace", dir);
    char junk[8192];
    memset(junk, 'j', sizeof junk - 1);
    junk[sizeof junk - 1] = '\0';
    CHECK(planted_write(path, junk, 0644) == 0);
    fabpool_t *p = make(path, NULL);
    void *x = NULL;
    if (p) {
        CHECK_OK(fabpool_alloc(p, 4096, &x));
        CHECK_OK(fabpool_free(p, x));
        CHECK_OK(fabpool_destroy(p));
    }
    trace_data d;
    if (load(path, &d) == 0) {
        CHECK(d.closed && d.n == 2);
        trace_free(&d);
    } else {
        CHECK(0);
    }
    /* new: 0600, whatever the umask lets through */
    snprintf(path, sizeof path, "%s/new.trace", dir);
    mode_t um = umask(0);
    p = make(path, NULL);
    umask(um);
    if (p)
        CHECK_OK(fabpool_destroy(p));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0600);

    CHECK(planted_remove(&pl) == 0);
}

static void env_and_names(void)
{
    char pat[300], want1[320], want2[330];
    snprintf(pat, sizeof pat, "%s/env-%%p-dev%%d.trace", dir);
    setenv("FABPOOL_TRACE", pat, 1);
    fabpool_t *p1 = make("/ignored/by/env", NULL), *p2 = make(NULL, NULL);
    unsetenv("FABPOOL_TRACE");
    if (!p1 || !p2)
        return;
    snprintf(want1, sizeof want1, "%s/env-%ld-dev0.trace", dir, (long)getpid());
    snprintf(want2, sizeof want2, "%s.2", want1);
    void *x = NULL;
    CHECK_OK(fabpool_alloc(p2, 4096, &x));
    CHECK_OK(fabpool_free(p2, x));
    CHECK_OK(fabpool_destroy(p1));
    CHECK_OK(fabpool_destroy(p2));
    trace_data d1, d2;
    if (load(want1, &d1) == 0) {
        CHECK(d1.n == 0 && d1.closed);
        trace_free(&d1);
    } else {
        CHECK(0);
    }
    if (load(want2, &d2) == 0) {
        CHECK(d2.n == 2 && d2.recs[0].op == FABPOOL_TR_ALLOC && d2.recs[1].op == FABPOOL_TR_FREE);
        trace_free(&d2);
    } else {
        CHECK(0);
    }
}

/* ------------------------------------------------------------ exit, fork */

static void exit_flush_and_fork(void)
{
    char path[300], path2[300];
    snprintf(path, sizeof path, "%s/exit.trace", dir);
    snprintf(path2, sizeof path2, "%s/fork.trace", dir);
    /* the program's own path: under valgrind /proc/self/exe names valgrind's tool, while
     * readlink of it answers the program (valgrind emulates that link) */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        CHECK(0);
        return;
    }
    exe[n] = '\0';
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* a fresh process (a forked one may not use the driver) that never destroys its pool */
        execl(exe, "test_trace", "--exit-child", path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    trace_data d;
    if (load(path, &d) == 0) {
        CHECK(d.closed && d.n == 10000);
        trace_free(&d);
    } else {
        CHECK(0);
    }

    /* a forked child of a traced process records nothing into its parent's file */
    fabpool_t *p = make(path2, NULL);
    if (!p)
        return;
    void *q = NULL;
    CHECK_OK(fabpool_alloc(p, 4096, &q));
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        void *r;
        for (int i = 0; i < 10000; i++)
            if (fabpool_alloc(p, 1024, &r) == FABPOOL_OK)
                fabpool_free(p, r);
        exit(0);
    }
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_OK(fabpool_free(p, q));
    CHECK_OK(fabpool_destroy(p));
    if (load(path2, &d) == 0) {
        CHECK(d.closed && d.n == 2);
        trace_free(&d);
    } else {
        CHECK(0);
    }
}

/* Runs a shell command, its output (stdout and stderr) into out: its exit status, or -1. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *pp = popen(cmd, "r");
    size_t got = pp ? fread(out, 1, cap - 1, pp) : 0;
    out[got] = 0;
    int rc = pp ? pclose(pp) : -1;
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* ------------------------------------------------------------ hostile traces */

#define REC(t, op, ptr, size) {(t), (ptr), (size), 0, (op), FABPOOL_OK, 1, FABPOOL_TRACE_R_APP}
#define TOP(k) (UINT64_MAX - (k) + 1) /* the last k bytes of the address space */

/* Traces that claim what no pool writes: each is an error with a message from the reader, fabpool_trace (no
 * snapshot file left), fabpool_replay, and from the snapshot writer itself given the records without the reader;
 * never a write out of bounds (ASan) or a write without end (the tools' timeout, this process's alarm). */
static void hostile_traces(const char *replay, const char *tool)
{
    static const fabpool_trace_rec four_maps[] = {
        /* maps whose ranges run past the end of the address space: the snapshot's sets of mapped ranges came
         * out of order, and one more range than their buffer held was written */
        REC(1, FABPOOL_TR_MAP, 0xa7ull << 56, (0x64ull << 56) + 0x200000),
        REC(2, FABPOOL_TR_MAP, 0x20f1ull << 48, 0xf7ull << 56),
        REC(3, FABPOOL_TR_MAP, 0x20007eull << 40, 0x4ull << 48),
        REC(4, FABPOOL_TR_MAP, 0x0a0aull << 48, 0xef0aull << 48),
    }, three[] = {
        /* a map that wraps past the top, an allocation, its unmap: the unmap never took the range away, and the
         * writer went on writing segment_unmap events */
        REC(1, FABPOOL_TR_MAP, TOP(2u << 20), 4u << 20),
        REC(2, FABPOOL_TR_APP_ALLOC, 0x100000, 4096),
        REC(3, FABPOOL_TR_UNMAP, TOP(2u << 20), 4u << 20),
    }, one_alloc[] = {
        REC(1, FABPOOL_TR_APP_ALLOC, 0x100000, 4096), /* with device 2^31-1: 104 bytes, one empty list a device */
    }, too_many[] = {
        REC(1, FABPOOL_TR_APP_ALLOC, 0x1000, 1ull << 63), /* live bytes past 2^64 */
        REC(2, FABPOOL_TR_APP_ALLOC, 0x2000, 1ull << 63),
    };
    struct {
        const char *name;
        const fabpool_trace_rec *r;
        size_t n;
        int32_t dev;
        const char *reader, *writer; /* what their messages say; reader NULL: the reader takes it */
    } cases[] = {
        {"four-maps", four_maps, 4, 0, "runs past the end of the address space", "past the end"},
        {"three", three, 3, 0, "runs past the end of the address space", "past the end"},
        {"device", one_alloc, 1, INT32_MAX, "names device 2147483647", "device 2147483647"},
        {"too-many", too_many, 2, 0, NULL, "more bytes live or mapped than 64 bits count"},
    };
    char path[300], snap[320], cmd[1400], out[4096], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/hostile-%s.trace", dir, cases[i].name);
        snprintf(snap, sizeof snap, "%s.pickle", path);
        CHECK(write_trace(path, cases[i].dev, FABPOOL_TRACE_F_APP_MARKED, cases[i].r, cases[i].n) == 0);
        trace_data d;
        int rc = trace_load(path, &d, err, sizeof err);
        CHECK(cases[i].reader ? rc == -1 && strstr(err, cases[i].reader) : rc == 0);
        if (rc == 0)
            trace_free(&d);
        else if (!cases[i].reader || !strstr(err, cases[i].reader))
            fprintf(stderr, "%s: the reader says: %s\n", cases[i].name, err);
        if (tool) {
            snprintf(cmd, sizeof cmd, "timeout 20 '%s' --memory-snapshot '%s' '%s' 2>&1", tool, snap, path);
            CHECK(run_cmd(cmd, out, sizeof out) == 1);
            CHECK(strstr(out, cases[i].reader ? cases[i].reader : cases[i].writer) != NULL);
            struct stat sb;
            CHECK(stat(snap, &sb) != 0); /* no half snapshot left */
        }
        if (replay) {
            snprintf(cmd, sizeof cmd, "timeout 60 '%s' '%s' --allocators fabpool 2>&1", replay, path);
            CHECK(run_cmd(cmd, out, sizeof out) == 1);
            CHECK(strstr(out, cases[i].reader ? cases[i].reader : "more bytes than 64 bits count") != NULL);
        }
        /* the writer on its own, given the records as they are */
        trace_data raw = {.recs = (fabpool_trace_rec *)cases[i].r, .n = cases[i].n, .has_app = 1};
        raw.h.device = cases[i].dev;
        raw.h.flags = FABPOOL_TRACE_F_APP_MARKED;
        FILE *f = fopen(snap, "wb");
        CHECK(f != NULL);
        if (!f)
            continue;
        err[0] = 0;
        alarm(20);
        CHECK(trace_write_snapshot(&raw, f, err, sizeof err) == -1 && strstr(err, cases[i].writer));
        long size = ftell(f);
        CHECK(size >= 0 && size < 4096);
        if (cases[i].dev == 0) { /* the CSV and the plot walk the same records (they name no device) */
            CHECK(trace_write_csv(&raw, f, err, sizeof err) == -1 && strstr(err, cases[i].writer));
            CHECK(trace_write_svg(&raw, "hostile", f, err, sizeof err) == -1 && strstr(err, cases[i].writer));
        }
        alarm(0);
        fclose(f);
        unlink(snap);
    }
    /* a live buffer of 0 bytes outside any map (no pool writes one, the reader takes it): a snapshot of one
     * segment, where the writer used to take the same block again without end */
    static const fabpool_trace_rec empty[] = {REC(1, FABPOOL_TR_BUF_CREATE, 0x100000, 0)};
    snprintf(path, sizeof path, "%s/empty-buffer.trace", dir);
    snprintf(snap, sizeof snap, "%s.pickle", path);
    CHECK(write_trace(path, 0, FABPOOL_TRACE_F_APP_MARKED, empty, 1) == 0);
    if (tool) {
        snprintf(cmd, sizeof cmd, "timeout 20 '%s' --memory-snapshot '%s' '%s' 2>&1", tool, snap, path);
        CHECK(run_cmd(cmd, out, sizeof out) == 0);
        struct stat sb;
        CHECK(stat(snap, &sb) == 0 && sb.st_size > 0 && sb.st_size < 4096);
    }
}

/* ------------------------------------------------------------ bad files */

static int copy_cut(const char *from, const char *to, long cut, long flip)
{
    FILE *f = fopen(from, "rb");
    if (!f)
        return -1;
    static unsigned char b[1 << 20];
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    if (cut >= 0 && (size_t)cut < n)
        n = (size_t)cut;
    if (flip >= 0 && (size_t)flip < n)
        b[flip] ^= 0x40;
    f = fopen(to, "wb");
    if (!f)
        return -1;
    fwrite(b, 1, n, f);
    fclose(f);
    return 0;
}

static void refused(const char *replay)
{
    char good[300], bad[300], err[512], cmd[1200];
    snprintf(good, sizeof good, "%s/known.trace", dir);
    snprintf(bad, sizeof bad, "%s/bad.trace", dir);
    trace_data d;
    struct {
        long cut, flip;
        const char *says;
    } cases[] = {
        {FABPOOL_TRACE_HEADER_BYTES + 3 * FABPOOL_TRACE_RECORD_BYTES + 7, -1, "truncated"},
        {FABPOOL_TRACE_HEADER_BYTES + 2 * FABPOOL_TRACE_RECORD_BYTES, -1, "truncated"},
        {20, -1, "shorter than the 64-byte header"},
        {-1, FABPOOL_TRACE_HEADER_BYTES + 5 * FABPOOL_TRACE_RECORD_BYTES + 9, "checksum"},
        {-1, 2, "not a fabpool trace"},
        {-1, 8, "version"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(copy_cut(good, bad, cases[i].cut, cases[i].flip) == 0);
        CHECK(trace_load(bad, &d, err, sizeof err) == -1);
        if (!strstr(err, cases[i].says))
            fprintf(stderr, "case %zu: '%s' does not say '%s'\n", i, err, cases[i].says);
        CHECK(strstr(err, cases[i].says) != NULL);
        if (replay) {
            snprintf(cmd, sizeof cmd, "'%s' '%s' --allocators fabpool --check 2>&1", replay, bad);
            char out[2048];
            CHECK(run_cmd(cmd, out, sizeof out) == 1);
            CHECK(strstr(out, "refused") != NULL && strstr(out, cases[i].says) != NULL);
        }
    }
    /* a gzip stream cut short */
    if (replay) {
        char gz[300];
        snprintf(gz, sizeof gz, "%s/known.trace.gz", dir);
        snprintf(cmd, sizeof cmd, "gzip -c '%s' > '%s'", good, gz);
        CHECK(system(cmd) == 0);
        CHECK(trace_load(gz, &d, err, sizeof err) == 0);
        trace_free(&d);
        struct stat st;
        CHECK(stat(gz, &st) == 0);
        CHECK(copy_cut(gz, bad, st.st_size / 2, -1) == 0);
        CHECK(trace_load(bad, &d, err, sizeof err) == -1);
        CHECK(strstr(err, "truncated") != NULL || strstr(err, "corrupt") != NULL);
        /* 80 MiB of zeros in a gzip of about 80 KiB: refused once past 64 MiB, not read whole */
        snprintf(cmd, sizeof cmd, "head -c 83886080 /dev/zero | gzip -c > '%s'", bad);
        CHECK(system(cmd) == 0);
        CHECK(trace_load(bad, &d, err, sizeof err) == -1);
        CHECK(strstr(err, "decompresses to more than 67108864 bytes") != NULL);
        if (!strstr(err, "decompresses to more than"))
            fprintf(stderr, "a gzip of zeros: %s\n", err);
    }
    /* a writer that never completed its file (open marker): whole records read, a partial one dropped */
    CHECK(copy_cut(good, bad, FABPOOL_TRACE_HEADER_BYTES + 3 * FABPOOL_TRACE_RECORD_BYTES + 5, -1) == 0);
    FILE *f = fopen(bad, "r+b");
    unsigned char open_mark[8];
    memset(open_mark, 0xff, 8);
    CHECK(f && fseek(f, 40, SEEK_SET) == 0 && fwrite(open_mark, 1, 8, f) == 8);
    if (f)
        fclose(f);
    CHECK(trace_load(bad, &d, err, sizeof err) == 0);
    CHECK(!d.closed && d.n == 3 && strstr(d.note, "partial") != NULL);
    trace_free(&d);
}

/* the process of exit_flush_and_fork: allocates through a traced pool and exits without destroying it */
static int exit_child(const char *path)
{
    t_driver_init();
    fabpool_options o;
    fabpool_options_init(&o);
    snprintf(o.trace_path, sizeof o.trace_path, "%s", path);
    fabpool_t *p = NULL;
    if (fabpool_create(&o, &p) != FABPOOL_OK) {
        fprintf(stderr, "exit child: fabpool_create: %s\n", fabpool_last_error());
        return 3;
    }
    void *q;
    for (int i = 0; i < 5000; i++)
        if (fabpool_alloc(p, 8192, &q) == FABPOOL_OK)
            fabpool_free(p, q);
    exit(0);
}

/* fabpool_trace_flush: the file holds every record so far and reads as a trace still being written; the pool
 * goes on recording, and destroy completes the file. */
static void flush_while_running(void)
{
    char path[300];
    fabpool_t *p = make_traced("flushed.trace", path, sizeof path);
    if (!p)
        return;
    void *q[10];
    for (int i = 0; i < 10; i++)
        CHECK_OK(fabpool_alloc(p, 5000u * (unsigned)(i + 1), &q[i]));
    trace_data d;
    CHECK(load(path, &d) == 0 && d.n == 0); /* still in the buffer */
    trace_free(&d);
    CHECK_OK(fabpool_trace_flush());
    if (load(path, &d) == 0) {
        CHECK(!d.closed && d.n == 10 && strstr(d.note, "never completed") != NULL);
        CHECK(maps_net == (int64_t)t_mapped(p));
        for (size_t i = 0; i < d.n; i++)
            CHECK(d.recs[i].op == FABPOOL_TR_ALLOC && d.recs[i].ptr == (uintptr_t)q[i]);
        trace_free(&d);
    }
    for (int i = 0; i < 10; i++)
        CHECK_OK(fabpool_free(p, q[i]));
    CHECK_OK(fabpool_destroy(p));
    if (load(path, &d) == 0) {
        CHECK(d.closed && d.n == 20);
        trace_free(&d);
    }
}

/* An allocation refused while the pool sleeps is traced with its status, and the trace reads back (the reader
 * took FABPOOL_ERR_IO for the last status and called such a trace corrupt). */
static void asleep_in_trace(void)
{
    char path[300];
    fabpool_t *p = make_traced("asleep.trace", path, sizeof path);
    if (!p)
        return;
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(p, 5000, &a));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_STATUS(fabpool_alloc(p, 5000, &b), FABPOOL_ERR_ASLEEP);
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK_OK(fabpool_free(p, a));
    CHECK_OK(fabpool_destroy(p));
    trace_data d;
    memset(&d, 0, sizeof d);
    CHECK(load(path, &d) == 0);
    int seen = 0;
    for (size_t i = 0; i < d.n; i++)
        seen += d.recs[i].op == FABPOOL_TR_ALLOC && d.recs[i].status == FABPOOL_ERR_ASLEEP;
    CHECK(seen == 1);
    trace_free(&d);
}

/* fabpool_replay --check passes on the trace at path. */
static void replay_passes(const char *replay, const char *path)
{
    char cmd[1200], out[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --allocators fabpool --check 2>&1", replay, path);
    int rc = run_cmd(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "check passed") != NULL);
    if (rc != 0)
        fprintf(stderr, "%s:\n%s\n", cmd, out);
}

/* The trace at path ends with nothing live and no free of a pointer it never gave out, and fabpool_replay --check
 * passes on it (replay NULL: not run). */
static void ends_empty_and_replays(const char *replay, const char *path)
{
    trace_summary sum;
    if (summary_of(path, &sum) != 0)
        return;
    CHECK(sum.live_end == 0 && sum.objects_end == 0 && sum.unknown_frees == 0);
    if (replay)
        replay_passes(replay, path);
}

/* A program's trace of the stream pair on two streams, everything freed: fabpool_replay --check passes on it.
 * At the end of the replay the blocks freed on the stream that does not own the pool still wait in its queue
 * (the replay runs no GPU work, so nothing polled them): they are not live.  A block the replay really leaves
 * live (FABPOOL_REPLAY_DROP_FREES=1: its first free is not made) still fails the check. */
static void two_streams_replay(const char *replay)
{
    char path[300], cmd[1200], out[8192];
    snprintf(path, sizeof path, "%s/two-streams.trace", dir);
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = make(path, NULL);
    if (!p)
        return;
    CUstream s[2];
    CHECK_CU(cuStreamCreate(&s[0], 0));
    CHECK_CU(cuStreamCreate(&s[1], 0));
    enum { N = 48 };
    void *live[N] = {0};
    int on[N] = {0};
    uint64_t seed = 2024;
    for (int op = 0; op < 2000; op++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % N);
        if (live[k]) {
            CHECK_OK(fabpool_free_on_stream(p, live[k], s[on[k]]));
            live[k] = NULL;
        } else {
            unsigned r = (unsigned)(seed >> 40);
            size_t size = r % 6 == 0 ? (size_t)(1 + r % 24) << 20 : 256 + r % (512 << 10);
            on[k] = (int)((seed >> 20) & 1);
            CHECK_OK(fabpool_alloc_on_stream(p, size, s[on[k]], &live[k]));
        }
    }
    for (int k = 0; k < N; k++)
        if (live[k])
            CHECK_OK(fabpool_free_on_stream(p, live[k], s[on[k]]));
    CHECK_OK(fabpool_collect(p, 1));
    fabpool_stats st = {.struct_size = sizeof st};
    CHECK_OK(fabpool_get_stats(p, &st));
    CHECK(st.in_use_bytes == 0 && st.blocks == 0);
    CHECK_OK(fabpool_destroy(p));
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.bytes_held == l0.bytes_held && l1.mappings == l0.mappings);
    CHECK_CU(cuStreamDestroy(s[0]));
    CHECK_CU(cuStreamDestroy(s[1]));

    trace_summary sum;
    if (summary_of(path, &sum) != 0)
        return;
    CHECK(sum.n_streams == 2 && sum.live_end == 0 && sum.objects_end == 0 && sum.unknown_frees == 0);
    if (!replay)
        return;
    replay_passes(replay, path);
    snprintf(cmd, sizeof cmd, "FABPOOL_REPLAY_DROP_FREES=1 '%s' '%s' --allocators fabpool --check 2>&1", replay, path);
    int rc = run_cmd(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "CHECK FAILED: fabpool holds") != NULL && strstr(out, "live bytes in 1 block and 0 buffers") != NULL);
    if (rc != 1)
        fprintf(stderr, "%s:\n%s\n", cmd, out);
}

/* Buffers released and reused (fabpool_buffer_release, fabpool_buffer_reuse), and once given back by a trim
 * while kept: the trace reads as destroys and creates at the same base, each destroy once, nothing left at the
 * end, and fabpool_replay --check passes on it. */
static void released_buffers_replay(const char *replay)
{
    char path[300];
    fabpool_t *p = make_traced("released.trace", path, sizeof path);
    if (!p)
        return;
    fabpool_buffer_t *b[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        CHECK_OK(fabpool_buffer_create(p, (size_t)64 << 20, (size_t)(2 + 2 * i) << 20, &b[i]));
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 3; i++)
            CHECK_OK(fabpool_buffer_release(b[i]));
        if (round == 1) /* the pool gives the kept buffers back itself: no second destroy in the trace */
            CHECK_OK(fabpool_trim(p, 0));
        for (int i = 0; i < 3; i++) {
            b[i] = NULL;
            size_t size = (size_t)(4 + 2 * i + 2 * round) << 20;
            CHECK_OK(round == 1 ? fabpool_buffer_create(p, (size_t)64 << 20, size, &b[i])
                                : fabpool_buffer_reuse(p, size, NULL, &b[i]));
        }
    }
    for (int i = 0; i < 3; i++)
        if (b[i])
            CHECK_OK(fabpool_buffer_release(b[i]));
    CHECK_OK(fabpool_destroy(p));
    ends_empty_and_replays(replay, path);
}

/* A buffer that loses its only chunk to two driver faults in a shrink (FABPOOL_ERR_PARTIAL, fabpool.h): its trace
 * records the resize with that status and 0 bytes, the buffer grows again and goes; the reader takes the trace
 * (every status up to FABPOOL_STATUS_LAST), it ends with nothing live, and fabpool_replay --check passes on it
 * (no resize to 0 bytes replayed). */
static void lost_chunk_replay(const char *replay)
{
    t_sim_hooks h = t_sim_hooks_get();
    if (!h.fault_set || !h.fault_clear) {
        printf("lost_chunk_replay: needs the simulated driver's faults; skipped\n");
        return;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/lost-chunk.trace", dir);
    fabpool_t *p = make(path, "max_chunk:8MiB,handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, (size_t)8 << 20, (size_t)6 << 20, &b));
    fabpool_status st = FABPOOL_OK;
    /* the refit's maps: the staging chunk, the smaller chunk in place, the old chunk back; from the second on
     * every one refused loses the chunk */
    for (uint64_t n = 1; n <= 4 && st != FABPOOL_ERR_PARTIAL; n++) {
        h.fault_set("cuMemMap", n, 1, CUDA_ERROR_UNKNOWN);
        st = fabpool_buffer_resize(b, (size_t)1 << 20, NULL);
        h.fault_clear();
        if (st != FABPOOL_ERR_PARTIAL)
            CHECK_OK(fabpool_buffer_resize(b, (size_t)6 << 20, NULL));
    }
    CHECK_STATUS(st, FABPOOL_ERR_PARTIAL);
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    CHECK(bi.size == 0 && bi.mapped == 0);
    CHECK_OK(fabpool_buffer_resize(b, (size_t)3 << 20, NULL));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
    ends_empty_and_replays(replay, path);
}

/* The program of mixed_program_replay, run with FABPOOL_TRACE set: every kind of public call on one pool
 * (fabpool_alloc / fabpool_free, the stream pair on two streams, first as the owner stream then not, a block
 * of one freed by the other, buffers resized on streams, trims), everything freed at the end.  Prints the
 * number of calls it made; exit 0 once the pool counted nothing live and the driver holds nothing. */
static int mixed_child(void)
{
    t_driver_init();
    fabpool_t *p = NULL;
    if (fabpool_create(NULL, &p) != FABPOOL_OK) {
        fprintf(stderr, "mixed child: fabpool_create: %s\n", fabpool_last_error());
        return 3;
    }
    CUstream s[2];
    if (cuStreamCreate(&s[0], 0) != CUDA_SUCCESS || cuStreamCreate(&s[1], 0) != CUDA_SUCCESS)
        return 3;
    enum { N = 64 };
    void *live[N] = {0};
    int how[N] = {0}; /* 0: fabpool_alloc; 1, 2: the stream pair on s[0], s[1] */
    fabpool_buffer_t *buf[2] = {NULL, NULL};
    uint64_t calls = 0, seed = 4242;
    int bad = 0;
#define MIX_OK(expr) do { if ((expr) == FABPOOL_OK) calls++; else { bad++; fprintf(stderr, "%s: %s\n", #expr, \
                                                                          fabpool_last_error()); } } while (0)
    for (int i = 0; i < 2; i++)
        MIX_OK(fabpool_buffer_create(p, 256u << 20, (size_t)(4 + i) << 20, &buf[i]));
    for (int step = 0; step < 3000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        unsigned r = (unsigned)(seed >> 33);
        int k = (int)(r % N);
        if (step % 97 == 96) {
            MIX_OK(fabpool_buffer_resize(buf[step % 2], (size_t)(1 + r % 200) << 20, step % 3 ? s[step % 2] : NULL));
            continue;
        }
        if (step % 499 == 498) {
            MIX_OK(fabpool_trim(p, 0));
            continue;
        }
        if (live[k]) {
            int by = (int)((seed >> 20) % 4); /* 0: fabpool_free; 1, 2: on s[0], s[1]; 3: as allocated */
            if (by == 3)
                by = how[k];
            if (by == 0)
                MIX_OK(fabpool_free(p, live[k]));
            else
                MIX_OK(fabpool_free_on_stream(p, live[k], s[by - 1]));
            live[k] = NULL;
            continue;
        }
        /* the first 200 steps on s[0] alone: its owner mode; then every kind */
        how[k] = step < 200 ? 1 : (int)((seed >> 24) % 3);
        size_t size = r % 7 == 0 ? (size_t)(1 + r % 20) << 20 : 256 + (r >> 8) % (256 << 10);
        if (how[k] == 0)
            MIX_OK(fabpool_alloc(p, size, &live[k]));
        else
            MIX_OK(fabpool_alloc_on_stream(p, size, s[how[k] - 1], &live[k]));
    }
    for (int k = 0; k < N; k++)
        if (live[k])
            MIX_OK(how[k] ? fabpool_free_on_stream(p, live[k], s[how[k] - 1]) : fabpool_free(p, live[k]));
    for (int i = 0; i < 2; i++)
        MIX_OK(fabpool_buffer_destroy(buf[i], s[i]));
#undef MIX_OK
    fabpool_collect(p, 1);
    fabpool_stats st = {.struct_size = sizeof st};
    if (fabpool_get_stats(p, &st) != FABPOOL_OK || st.in_use_bytes || st.blocks || st.buffers)
        bad++;
    if (fabpool_destroy(p) != FABPOOL_OK)
        bad++;
    fabsim_ledger l = t_ledger();
    if (l.bytes_held || l.mappings || l.reservations)
        bad++;
    printf("calls %llu\n", (unsigned long long)calls);
    return bad ? 1 : 0;
}

/* A program that mixes every kind of call, traced with FABPOOL_TRACE: the trace is its workload as it ran.
 * fabpool_trace finds nothing never freed and no free of a pointer the trace never gave out, and
 * fabpool_replay --check replays as many calls as the program made and passes. */
static void mixed_program_replay(const char *replay, const char *summary)
{
    char path[300], exe[4096], cmd[5000], out[8192];
    snprintf(path, sizeof path, "%s/mixed.trace", dir);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        CHECK(0);
        return;
    }
    exe[n] = '\0';
    snprintf(cmd, sizeof cmd, "FABPOOL_TRACE='%s' FABSIM_MACHINE=\"$FABSIM_MACHINE-mixed\" '%s' --mixed-child", path,
             exe);
    int rc = run_cmd(cmd, out, sizeof out);
    unsigned long long calls = 0;
    const char *c = strstr(out, "calls ");
    if (c)
        calls = strtoull(c + 6, NULL, 10);
    CHECK(rc == 0 && calls > 3000);
    if (rc != 0)
        fprintf(stderr, "%s:\n%s\n", cmd, out);

    trace_summary sm;
    if (summary_of(path, &sm) != 0)
        return;
    CHECK(sm.level_app && sm.live_end == 0 && sm.objects_end == 0 && sm.unknown_frees == 0);
    CHECK(sm.n_streams == 2 && sm.null_stream);
    if (summary) {
        snprintf(cmd, sizeof cmd, "'%s' '%s' 2>&1", summary, path);
        rc = run_cmd(cmd, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "live at the end: 0 B in 0 blocks") != NULL && !strstr(out, "never freed") &&
              !strstr(out, "never gave out"));
        if (rc != 0 || strstr(out, "never"))
            fprintf(stderr, "%s:\n%s\n", cmd, out);
    }
    if (replay) {
        char expect[64];
        snprintf(expect, sizeof expect, " %llu operations at the ", calls);
        snprintf(cmd, sizeof cmd, "'%s' '%s' --allocators fabpool --check 2>&1", replay, path);
        rc = run_cmd(cmd, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "check passed") != NULL && strstr(out, expect) != NULL &&
              !strstr(out, "not replayed"));
        if (rc != 0 || !strstr(out, expect))
            fprintf(stderr, "%s (expected%s):\n%s\n", cmd, expect, out);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--exit-child"))
        return exit_child(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "--mixed-child"))
        return mixed_child();
    if (argc >= 2 && !strcmp(argv[1], "--mixed")) {
        /* test_trace --mixed REPLAY SUMMARY: the mixed program's trace alone (its own ctest entry) */
        t_driver_init();
        snprintf(dir, sizeof dir, "/tmp/fabpool-test-trace-mixed-XXXXXX");
        if (!mkdtemp(dir)) {
            perror(dir);
            return 1;
        }
        unsetenv("FABPOOL_TRACE");
        mixed_program_replay(argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (!t_failures && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        return t_done("test_trace --mixed");
    }
    int sim = t_driver_init();
    (void)sim;
    snprintf(dir, sizeof dir, "/tmp/fabpool-test-trace-XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    unsetenv("FABPOOL_TRACE");
    round_trip();
    app_marks();
    threads();
    off_is_same();
    options();
    bad_path();
    unsafe_paths();
    env_and_names();
    exit_flush_and_fork();
    refused(argc > 1 ? argv[1] : NULL);
    hostile_traces(argc > 1 ? argv[1] : NULL, argc > 2 ? argv[2] : NULL);
    asleep_in_trace();
    flush_while_running();
    two_streams_replay(argc > 1 ? argv[1] : NULL);
    released_buffers_replay(argc > 1 ? argv[1] : NULL);
    lost_chunk_replay(argc > 1 ? argv[1] : NULL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!t_failures && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done("test_trace");
}
