/* test_trace_overlap: what the memory snapshot's writer (perf/trace_viz.c) makes of a trace whose live blocks
 * overlap, which no pool writes (a pool records a free before the memory can be reused) but which a user may be
 * handed.
 *
 * test_trace_overlap TRACE_TOOL: first, short traces given to the writer itself: blocks that only touch, a
 * buffer of 0 bytes where a block ends and a block over memory whose block was freed are taken; a block inside
 * a live one, one over two, one that ends inside the next, one at a live block's address, a buffer of 0 bytes
 * inside a block and a buffer that grows over a block are refused, the message naming the record and the first
 * live block it lies over.  Then traces of 20,000 records through fabpool_trace --memory-snapshot: 4,000
 * chunks mapped, a small block in each, the chunks unmapped (as a pool asleep: the blocks stay shown over no
 * memory), then 4,000 times a block over all the small ones allocated and freed ("over"), or 7,999 blocks
 * allocated at the first small block's address and a free ("same").  A writer that took them looked again at every small
 * block's run at each change to the big one, in time quadratic in the records (seconds here, and a gigabyte with
 * the blocks at one address): each is refused at its first block over another, exit 1, no snapshot left, within
 * CTest's TIMEOUT of this test.  The same trace with the small blocks freed first ("freed") is taken. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "fabpool.h"
#include "trace_file.h"
#include "trace_viz.h"
#include "trace_write.h"
#include "unit.h"

#define REC(t, op, ptr, size) {(t), (ptr), (size), 0, (op), FABPOOL_OK, 1, FABPOOL_TRACE_R_APP}
#define A FABPOOL_TR_ALLOC
#define F FABPOOL_TR_FREE
#define BC FABPOOL_TR_BUF_CREATE
#define BR FABPOOL_TR_BUF_RESIZE

/* The writer given n records of the application's level: NULL if it wrote the snapshot, else its message. */
static const char *snapshot_of(const fabpool_trace_rec *r, size_t n, char *err, size_t cap)
{
    trace_data d = {.recs = (fabpool_trace_rec *)r, .n = n, .has_app = 1};
    d.h.flags = FABPOOL_TRACE_F_APP_MARKED;
    FILE *f = tmpfile();
    if (!f)
        return "no temporary file";
    err[0] = 0;
    int rc = trace_write_snapshot(&d, f, err, cap);
    fclose(f);
    return rc == 0 ? NULL : err;
}

static void short_traces(void)
{
    static const struct {
        const char *name;
        fabpool_trace_rec r[3];
        size_t n;
        const char *refused; /* what the message must hold; NULL: taken */
    } cases[] = {
        {"touching", {REC(1, A, 0x10000, 0x1000), REC(2, A, 0x11000, 0x1000)}, 2, NULL},
        {"empty buffer at an end", {REC(1, A, 0x10000, 0x1000), REC(2, BC, 0x11000, 0)}, 2, NULL},
        {"reused", {REC(1, A, 0x10000, 0x1000), REC(2, F, 0x10000, 0), REC(3, A, 0x10800, 0x1000)}, 3, NULL},
        {"inside", {REC(1, A, 0x10000, 0x1000), REC(2, A, 0x10800, 0x100)}, 2,
         "record 1 (op 1, ptr 0x10800, size 256) has a block over memory that the live block at 0x10000 (4096"},
        {"over two", {REC(1, A, 0x10000, 0x1000), REC(2, A, 0x12000, 0x1000), REC(3, A, 0x10800, 0x2000)}, 3,
         "record 2 (op 1, ptr 0x10800, size 8192) has a block over memory that the live block at 0x10000 "},
        {"into the next", {REC(1, A, 0x12000, 0x1000), REC(2, A, 0x10000, 0x2001)}, 2,
         "record 1 (op 1, ptr 0x10000, size 8193) has a block over memory that the live block at 0x12000 "},
        {"same address", {REC(1, A, 0x10000, 0x1000), REC(2, A, 0x10000, 0x800)}, 2,
         "record 1 (op 1, ptr 0x10000, size 2048) has a block over memory that the live block at 0x10000 "},
        {"empty buffer inside", {REC(1, A, 0x10000, 0x1000), REC(2, BC, 0x10800, 0)}, 2,
         "record 1 (op 3, ptr 0x10800, size 0) has a block over memory that the live block at 0x10000 "},
        {"buffer grown over", {REC(1, BC, 0x20000, 0x1000), REC(2, A, 0x21000, 0x1000), REC(3, BR, 0x20000, 0x2000)},
         3, "record 2 (op 4, ptr 0x20000, size 8192) has a block over memory that the live block at 0x21000 "},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *msg = snapshot_of(cases[i].r, cases[i].n, err, sizeof err);
        int ok = cases[i].refused ? msg && strstr(msg, cases[i].refused) : !msg;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "%s: %s\n", cases[i].name, msg ? msg : "taken");
    }
}

enum { K = 4000 };          /* chunks, each with a small block */
#define BASE (1ull << 40)   /* the first chunk; each 8 KiB from the last, so that no two touch */
#define SPAN (K * 8192ull)

/* The long trace of that kind into r: its length. */
static size_t long_trace(const char *kind, fabpool_trace_rec *r)
{
    size_t n = 0;
    for (uint64_t i = 0; i < K; i++, n++)
        r[n] = (fabpool_trace_rec){n, BASE + i * 8192, 4096, 0, FABPOOL_TR_MAP, FABPOOL_OK, 1, 0};
    for (uint64_t i = 0; i < K; i++, n++)
        r[n] = (fabpool_trace_rec)REC(n, A, BASE + i * 8192, 512);
    for (uint64_t i = 0; i < K; i++, n++)
        r[n] = (fabpool_trace_rec){n, BASE + i * 8192, 4096, 0, FABPOOL_TR_UNMAP, FABPOOL_OK, 1, 0};
    if (!strcmp(kind, "same")) { /* then a free, which looked at every small block's run for each of them */
        for (uint64_t j = 0; j < 2 * K - 1; j++, n++)
            r[n] = (fabpool_trace_rec)REC(n, A, BASE, SPAN - 2048 * (j % 2));
        r[n] = (fabpool_trace_rec)REC(n, F, BASE, 0);
        return n + 1;
    }
    if (!strcmp(kind, "freed"))
        for (uint64_t i = 0; i < K; i++, n++)
            r[n] = (fabpool_trace_rec)REC(n, F, BASE + i * 8192, 0);
    for (uint64_t j = 0; j < K; j++) {
        r[n] = (fabpool_trace_rec)REC(n, A, BASE + 256, SPAN - 256);
        n++;
        r[n] = (fabpool_trace_rec)REC(n, F, BASE + 256, 0);
        n++;
    }
    return n;
}

/* fabpool_trace --memory-snapshot of each long trace: refused at record 3K (the first block over another), or
 * taken ("freed"). */
static void long_traces(const char *tool, const char *dir)
{
    static fabpool_trace_rec r[6 * K]; /* "freed": 3K, K frees, 2K */
    static const char *const kinds[] = {"over", "same", "freed"};
    char trace[300], snap[320], cmd[1200], err[512];
    for (int k = 0; k < 3; k++) {
        size_t n = long_trace(kinds[k], r);
        int taken = k == 2;
        snprintf(trace, sizeof trace, "%s/%s.trace", dir, kinds[k]);
        snprintf(snap, sizeof snap, "%s.pickle", trace);
        CHECK(write_trace(trace, 0, FABPOOL_TRACE_F_APP_MARKED, r, n) == 0);
        snprintf(cmd, sizeof cmd, "'%s' --memory-snapshot '%s' '%s' >/dev/null 2>'%s.err'", tool, snap, trace, trace);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = system(cmd);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        int exit_status = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        printf("%s: the snapshot of %zu records: exit %d in %.3f s\n", kinds[k], n, exit_status, s);
        CHECK(exit_status == (taken ? 0 : 1));
        struct stat sb;
        CHECK(taken ? stat(snap, &sb) == 0 && sb.st_size > 0 : stat(snap, &sb) != 0); /* no half snapshot */
        const char *want = "record 12000 (op 1, ptr 0x1000000";
        if (!taken) { /* the tool's message, as the writer's own */
            snprintf(cmd, sizeof cmd, "grep -q 'over memory that the live block at 0x10000000000 (512 bytes)' '%s.err'",
                     trace);
            CHECK(system(cmd) == 0);
            const char *msg = snapshot_of(r, n, err, sizeof err);
            CHECK(msg && strstr(msg, want) && strstr(msg, "live block at 0x10000000000 (512 bytes)"));
        }
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_trace_overlap TRACE_TOOL\n");
        return 2;
    }
    short_traces();
    char dir[] = "/tmp/fabpool-test-trace-overlap-XXXXXX", cmd[300];
    CHECK(mkdtemp(dir) != NULL);
    long_traces(argv[1], dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!unit_failures && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return unit_result("test_trace_overlap");
}
