/* fabpool_trace: summarises a fabpool trace (FABPOOL_TRACE=path, docs/config.md).
 *
 *   fabpool_trace [--json] TRACE[.gz]
 *
 * Prints the header (device, granularity, writer), the records by operation
 * (and how many failed), the allocation sizes by power of two, the peak and
 * final live bytes, the duration, the streams and threads seen.  Exit 1 if
 * the file is not a whole, valid trace (with the reason). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "trace_file.h"

static void human(uint64_t b, char *out, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

int main(int argc, char **argv)
{
    int json = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: fabpool_trace [--json] TRACE[.gz]\n");
            return 0;
        } else if (!path)
            path = argv[i];
        else {
            fprintf(stderr, "fabpool_trace: one trace at a time ('%s' is extra)\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: fabpool_trace [--json] TRACE[.gz]\n");
        return 2;
    }
    trace_data d;
    char err[512];
    if (trace_load(path, &d, err, sizeof err) != 0) {
        fprintf(stderr, "fabpool_trace: %s\n", err);
        return 1;
    }
    trace_summary s;
    trace_summarize(&d, &s);
    if (json) {
        printf("{\"version\":%u,\"device\":%d,\"granularity\":%" PRIu64 ",\"slab_max\":%" PRIu64
               ",\"pid\":%u,\"synthetic\":%d,\"closed\":%d,\"records\":%zu,\"level\":\"%s\",\"ops\":{",
               d.h.version, d.h.device, d.h.granularity, d.h.slab_max, d.h.pid,
               !!(d.h.flags & FABPOOL_TRACE_F_SYNTHETIC), d.closed, d.n, s.level_app ? "app" : "pool");
        for (unsigned op = 1, first = 1; op < FABPOOL_TR_NOPS; op++) {
            printf("%s\"%s\":%" PRIu64, first ? "" : ",", fabpool_trace_op_name(op), s.ops[op]);
            first = 0;
        }
        printf("},\"failed\":{");
        for (unsigned op = 1, first = 1; op < FABPOOL_TR_NOPS; op++) {
            printf("%s\"%s\":%" PRIu64, first ? "" : ",", fabpool_trace_op_name(op), s.failed[op]);
            first = 0;
        }
        printf("},\"size_hist_log2\":{");
        for (unsigned k = 0, first = 1; k < TRACE_HIST; k++)
            if (s.hist[k]) {
                printf("%s\"%u\":%" PRIu64, first ? "" : ",", k, s.hist[k]);
                first = 0;
            }
        printf("},\"live_peak\":%" PRIu64 ",\"pool_live_peak\":%" PRIu64 ",\"live_end\":%" PRIu64
               ",\"objects_end\":%" PRIu64 ",\"unknown_frees\":%" PRIu64 ",\"duration_ns\":%" PRIu64
               ",\"streams\":%u,\"null_stream\":%d,\"threads\":%u}\n",
               s.live_peak, s.pool_live_peak, s.live_end, s.objects_end, s.unknown_frees, s.duration_ns, s.n_streams,
               s.null_stream, s.threads);
        trace_free(&d);
        return 0;
    }
    char a[32], b[32], c[32];
    human(d.h.granularity, a, sizeof a);
    human(d.h.slab_max, b, sizeof b);
    printf("trace %s: version %u, device %d, granularity %s, slab_max %s, written by pid %u%s\n", path, d.h.version,
           d.h.device, a, b, d.h.pid, d.h.flags & FABPOOL_TRACE_F_SYNTHETIC ? " (SYNTHETIC: made by a generator)" : "");
    if (d.note[0])
        printf("note: %s\n", d.note);
    printf("%zu records over %.3f s; level replayed: %s\n", d.n, (double)s.duration_ns / 1e9,
           s.level_app ? "the application's (the calls it made: fabpool_alloc / fabpool_free and the stream-ordered "
                         "pair with its streams)"
                       : "the pool's (fabpool_alloc / fabpool_free)");
    printf("\n%-16s %12s %10s\n", "operation", "records", "failed");
    for (unsigned op = 1; op < FABPOOL_TR_NOPS; op++)
        if (s.ops[op])
            printf("%-16s %12" PRIu64 " %10" PRIu64 "\n", fabpool_trace_op_name(op), s.ops[op], s.failed[op]);
    printf("\nallocation sizes (%s), by power of two:\n", s.level_app ? "the application's" : "alloc");
    uint64_t maxh = 1;
    for (unsigned k = 0; k < TRACE_HIST; k++)
        if (s.hist[k] > maxh)
            maxh = s.hist[k];
    for (unsigned k = 0; k < TRACE_HIST; k++)
        if (s.hist[k]) {
            human(1ull << k, a, sizeof a);
            int bar = (int)(40 * s.hist[k] / maxh);
            printf("  >= %-10s %10" PRIu64 " %.*s\n", a, s.hist[k], bar > 0 ? bar : 1,
                   "########################################");
        }
    int any_buf = 0;
    for (unsigned k = 0; k < TRACE_HIST; k++)
        any_buf |= s.buf_hist[k] != 0;
    if (any_buf) {
        printf("buffer sizes (create, resize), by power of two:\n");
        for (unsigned k = 0; k < TRACE_HIST; k++)
            if (s.buf_hist[k]) {
                human(1ull << k, a, sizeof a);
                printf("  >= %-10s %10" PRIu64 "\n", a, s.buf_hist[k]);
            }
    }
    human(s.live_peak, a, sizeof a);
    human(s.live_end, b, sizeof b);
    human(s.pool_live_peak, c, sizeof c);
    printf("\npeak live: %s (blocks of that level + buffer sizes); reaching the pool: %s peak\n", a, c);
    printf("live at the end: %s in %" PRIu64 " blocks and buffers%s\n", b, s.objects_end,
           s.objects_end ? " (never freed while traced)" : "");
    if (s.unknown_frees)
        printf("frees of pointers the trace never gave out: %" PRIu64 "\n", s.unknown_frees);
    printf("streams seen: %u%s", s.n_streams, s.null_stream ? " + the NULL stream" : "");
    for (unsigned i = 0; i < s.n_streams && i < 8; i++)
        printf("%s0x%" PRIx64, i ? ", " : " (", s.streams[i]);
    printf("%s\nthreads: %u\n", s.n_streams ? (s.n_streams > 8 ? ", ...)" : ")") : "", s.threads);
    trace_free(&d);
    return 0;
}
