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
 * reads them as PyTorch's memory viewer would and compares. */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

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

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!t_failures && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done("test_trace_viz_python");
}
