/* test_trace: FABPOOL_TRACE / the conf key trace (lib/trace.c).
 *
 * A known sequence recorded and read back with the tools' reader (every
 * record compared); many threads; a pool with and without a trace behaving
 * the same; the key's parsing; a bad path refused at creation with nothing
 * held; %p / %d and a second pool on the same path; the flush at exit of a
 * process that never destroys its pool; a forked child writing nothing; and
 * truncated or corrupt files refused by the reader and by fabpool_replay
 * (argv[1]). */
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "trace_file.h"

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

static int load(const char *path, trace_data *d)
{
    char err[512];
    if (trace_load(path, d, err, sizeof err) != 0) {
        fprintf(stderr, "trace_load(%s): %s\n", path, err);
        return -1;
    }
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
    snprintf(path, sizeof path, "%s/known.trace", dir);
    fabpool_t *p = make(path, NULL);
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
    CHECK_STATUS(fabpool_alloc(p, 0, &bad), FABPOOL_ERR_INVALID_ARG);
    w[n++] = (want){FABPOOL_TR_ALLOC, 0, 0, 0, FABPOOL_ERR_INVALID_ARG};
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
    fabpool_options got;
    CHECK_OK(fabpool_get_options(p, &got));
    CHECK(strcmp(got.trace_path, path) == 0);
    CHECK_OK(fabpool_destroy(p));
    CHECK_CU(cuStreamDestroy(s1));

    trace_data d;
    if (load(path, &d) != 0) {
        CHECK(0);
        return;
    }
    CHECK(d.closed);
    CHECK(!d.has_app);
    CHECK(d.h.version == FABPOOL_TRACE_VERSION);
    CHECK(d.h.device == 0);
    CHECK(d.h.granularity == 2u << 20);
    CHECK(d.h.slab_max == 4096); /* the default */
    CHECK(d.h.pid == (uint32_t)getpid());
    CHECK(d.n == (size_t)n);
    for (int i = 0; i < n && (size_t)i < d.n; i++) {
        const fabpool_trace_rec *r = &d.recs[i];
        int same = r->op == w[i].op && r->ptr == w[i].ptr && r->size == w[i].size && r->arg == w[i].arg &&
                   r->status == w[i].status && r->thread == d.recs[0].thread;
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
    snprintf(path, sizeof path, "%s/threads.trace", dir);
    fabpool_t *p = make(path, NULL);
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

static void off_is_same(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/same.trace", dir);
    static fabpool_stats a, b;
    fabpool_t *p = make(NULL, NULL);
    if (!p)
        return;
    run_mix(p);
    CHECK_OK(fabpool_get_stats(p, &a));
    CHECK_OK(fabpool_destroy(p));
    p = make(path, NULL);
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
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == FABPOOL_TRACE_HEADER_BYTES + 50 * 128 * FABPOOL_TRACE_RECORD_BYTES);
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
            FILE *pp = popen(cmd, "r");
            char out[2048] = {0};
            size_t got = pp ? fread(out, 1, sizeof out - 1, pp) : 0;
            out[got] = 0;
            int rc = pp ? pclose(pp) : -1;
            CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
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

/* An allocation refused while the pool sleeps is traced with its status, and the trace reads back (the reader
 * took FABPOOL_ERR_IO for the last status and called such a trace corrupt). */
static void asleep_in_trace(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/asleep.trace", dir);
    fabpool_t *p = make(path, NULL);
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

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--exit-child"))
        return exit_child(argv[2]);
    int sim = t_driver_init();
    (void)sim;
    snprintf(dir, sizeof dir, "/tmp/fabpool-test-trace-%ld", (long)getpid());
    mkdir(dir, 0700);
    unsetenv("FABPOOL_TRACE");
    round_trip();
    threads();
    off_is_same();
    options();
    bad_path();
    env_and_names();
    exit_flush_and_fork();
    refused(argc > 1 ? argv[1] : NULL);
    asleep_in_trace();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!t_failures && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done("test_trace");
}
