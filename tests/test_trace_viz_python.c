/* test_trace_viz_python: fabpool_trace --memory-snapshot / --csv / --plot of a
 * traced program whose memory is known.
 *
 * test_trace_viz_python TRACE_TOOL PYTHON CHECKER: a pool traced to a file runs
 * the stream pair on two streams, plain allocations, a block above
 * slab_max, a buffer that grows and shrinks, and a trim, and exits with
 * blocks and a buffer live (the trace is completed at exit); what it held (the live blocks, the peak of the
 * bytes it held, the bytes the pool mapped at the end and at most, from the
 * simulated driver's counts) goes to a JSON file; then the trace tool
 * writes the three files and CHECKER (tests/tools/check_memory_snapshot.py)
 * reads them as PyTorch's memory viewer would and compares.
 *
 * Then traces of 20,000 map and unmap records (and allocations and frees) that no pool run is needed for: the
 * snapshot of each is written within 30 seconds (its time grows as n log n in the records; a writer that went
 * over every range at each unmap would take hours) and holds the segment events it should. */
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fabpool_trace_format.h"
#include "testutil.h"
#include "trace_write.h"

static uint64_t held, held_peak;

static void hold(int64_t bytes)
{
    held = (uint64_t)((int64_t)held + bytes);
    if (held > held_peak)
        held_peak = held;
}

/* The traced program (a child process, so that it can exit with its memory live): 0 if it ran. */
static int program(const char *trace, const char *want)
{
    t_driver_init();
    fabpool_options o;
    fabpool_options_init(&o);
    snprintf(o.trace_path, sizeof o.trace_path, "%s", trace);
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    if (!p)
        return 1;
    CUstream s1 = NULL, s2 = NULL;
    CHECK_CU(cuStreamCreate(&s1, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));

    enum { N = 64 };
    void *blk[N] = {0};
    size_t sz[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            sz[i] = (size_t)(1 + (i * 7919 + round * 104729) % 3000) << (i % 4 ? 6 : 11); /* 64 B .. 6 MiB */
            CUstream s = i % 3 == 0 ? s1 : i % 3 == 1 ? s2 : NULL;
            if (s)
                CHECK_OK(fabpool_alloc_on_stream(p, sz[i], s, &blk[i]));
            else
                CHECK_OK(fabpool_alloc(p, sz[i], &blk[i]));
            hold((int64_t)sz[i]);
        }
        for (int i = round == 2 ? 8 : 0; i < N; i++) { /* the last round leaves eight live */
            CUstream s = i % 3 == 0 ? s1 : i % 3 == 1 ? s2 : NULL;
            if (s)
                CHECK_OK(fabpool_free_on_stream(p, blk[i], s));
            else
                CHECK_OK(fabpool_free(p, blk[i]));
            hold(-(int64_t)sz[i]);
        }
    }
    void *big = NULL;
    CHECK_OK(fabpool_alloc(p, 40u << 20, &big)); /* above slab_max: an arena's block over several chunks */
    hold(40 << 20);
    fabpool_buffer_t *buf = NULL;
    CHECK_OK(fabpool_buffer_create(p, 256u << 20, 8u << 20, &buf));
    hold(8 << 20);
    CHECK_OK(fabpool_buffer_resize(buf, 96u << 20, s1));
    hold((int64_t)(96 - 8) << 20);
    CHECK_OK(fabpool_buffer_resize(buf, 24u << 20, s1)); /* remapped under the live buffer, then resized */
    hold(-((int64_t)(96 - 24) << 20));
    CHECK_CU(cuStreamSynchronize(s1));
    CHECK_CU(cuStreamSynchronize(s2));
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_trim(p, 0)); /* unmaps what is cached */

    FILE *f = fopen(want, "w");
    CHECK(f != NULL);
    if (!f)
        return 1;
    fabpool_stats st = t_stats(p);
    fprintf(f, "{\"device\": 0, \"mapped\": %llu, \"mapped_peak\": %llu, \"in_use_peak\": %llu, \"live\": {",
            (unsigned long long)st.mapped_bytes, (unsigned long long)st.mapped_bytes_peak,
            (unsigned long long)held_peak);
    for (int i = 0; i < 8; i++)
        fprintf(f, "\"%llu\": %zu, ", (unsigned long long)(uintptr_t)blk[i], sz[i]);
    fprintf(f, "\"%llu\": %u, \"%llu\": %u}}\n", (unsigned long long)(uintptr_t)big, 40u << 20,
            (unsigned long long)(uintptr_t)fabpool_buffer_ptr(buf), 24u << 20);
    CHECK(fclose(f) == 0);
    CHECK(st.mapped_bytes > 0 && st.mapped_bytes < st.mapped_bytes_peak); /* the trim unmapped some */
    return t_failures ? 1 : 0; /* exit writes the trace; the pool is never destroyed */
}

/* The many-records traces, chunks of 4 KiB, each 8 KiB from the last (so no two touch):
 *   "maps":   2N maps, then their 2N unmaps: 2N segment_map, 2N segment_unmap;
 *   "asleep": the N maps, a block in each, the N unmaps (a pool asleep: its blocks stay shown over no memory),
 *             then the N frees, each of which unmaps its chunk: N segment_map, N segment_unmap. */
static void many_records(const char *tool, const char *python, const char *dir)
{
    enum { N = 5000 };
    static fabpool_trace_rec r[4 * N];
    const char *names[] = {"maps", "asleep"};
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        uint64_t base = 1ull << 40;
        for (int pass = 0; pass < 4; pass++) {
            static const uint8_t ops[2][4] = {{FABPOOL_TR_MAP, FABPOOL_TR_MAP, FABPOOL_TR_UNMAP, FABPOOL_TR_UNMAP},
                                              {FABPOOL_TR_MAP, FABPOOL_TR_ALLOC, FABPOOL_TR_UNMAP, FABPOOL_TR_FREE}};
            for (uint64_t i = 0; i < N; i++, n++) {
                uint64_t size = ops[k][pass] == FABPOOL_TR_FREE ? 0 : ops[k][pass] == FABPOOL_TR_ALLOC ? 512 : 4096;
                r[n] = (fabpool_trace_rec){n, base + (i + (k == 0 && pass % 2 ? N : 0)) * 8192, size, 0,
                                           ops[k][pass], FABPOOL_OK, 1, 0};
            }
        }
        char trace[300], snap[320], cmd[1200];
        snprintf(trace, sizeof trace, "%s/%s.trace", dir, names[k]);
        snprintf(snap, sizeof snap, "%s.pickle", trace);
        CHECK(write_trace(trace, 0, 0, r, n) == 0); /* the pool's level: no application marks */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        snprintf(cmd, sizeof cmd, "timeout 60 '%s' --memory-snapshot '%s' '%s' >/dev/null", tool, snap, trace);
        int rc = system(cmd);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        printf("%s: the snapshot of %zu records in %.2f s\n", names[k], n, s);
        CHECK(rc == 0 && s < 30);
        int maps = k == 0 ? 2 * N : N; /* "maps" maps both halves of its range */
        snprintf(cmd, sizeof cmd, "'%s' -c 'import pickle, sys; e = pickle.load(open(sys.argv[1], \"rb\"))"
                 "[\"device_traces\"][0]; n = [sum(x[\"action\"] == a for x in e) for a in "
                 "(\"segment_map\", \"segment_unmap\")]; print(n); sys.exit(n != [%d, %d])' '%s'", python, maps,
                 maps, snap);
        CHECK(system(cmd) == 0);
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: test_trace_viz_python TRACE_TOOL PYTHON CHECKER\n");
        return 2;
    }
    unsetenv("FABPOOL_TRACE");
    char dir[256], trace[300], want[300], cmd[4096];
    snprintf(dir, sizeof dir, "/tmp/fabpool-test-trace-viz-%ld", (long)getpid());
    mkdir(dir, 0700);
    snprintf(trace, sizeof trace, "%s/run.trace", dir);
    snprintf(want, sizeof want, "%s/expected.json", dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        exit(program(trace, want));
    int wst = 0;
    CHECK(pid > 0 && waitpid(pid, &wst, 0) == pid && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);

    snprintf(cmd, sizeof cmd, "'%s' --memory-snapshot '%s/run.pickle' --csv '%s/run.csv' --plot '%s/run.svg' '%s' "
             ">/dev/null", argv[1], dir, dir, dir, trace);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s/run.pickle' '%s/run.csv' '%s/run.svg' '%s'", argv[2], argv[3], dir, dir,
             dir, want);
    CHECK(system(cmd) == 0);
    /* a file that cannot be written: exit 1, and no snapshot left behind */
    snprintf(cmd, sizeof cmd, "'%s' --memory-snapshot '%s/no/such/dir.pickle' '%s' 2>/dev/null >/dev/null", argv[1],
             dir, trace);
    int rc = system(cmd);
    CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    many_records(argv[1], argv[2], dir);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!t_failures && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done("test_trace_viz_python");
}
