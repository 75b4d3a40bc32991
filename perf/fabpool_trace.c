/* fabpool_trace: summarises a fabpool trace (FABPOOL_TRACE=path, docs/config.md).
 *
 *   fabpool_trace [--json] [--memory-snapshot OUT.pickle] [--csv OUT.csv] [--plot OUT.svg] TRACE[.gz]
 *
 * Prints the header (device, granularity, writer), the records by operation
 * (and how many failed), the allocation sizes by power of two, the peak and
 * final live bytes, the duration, the streams and threads seen; and writes
 * the memory over time as asked (trace_viz.h): PyTorch's memory snapshot, a
 * CSV, an SVG plot.  Exit 1 if
 * the file is not a whole, valid trace (with the reason), 2 for a wrong
 * command line (cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../lib/base/json.h"
#include "cli.h"
#include "trace_file.h"
#include "trace_viz.h"

static const char usage_line[] =
    "usage: fabpool_trace [--json] [--memory-snapshot OUT.pickle] [--csv OUT.csv] [--plot OUT.svg] TRACE[.gz]\n";

static void help(void)
{
    printf("%s\n"
           "Summarises a trace that FABPOOL_TRACE recorded (docs/config.md, \"Traces\"): its header, the records by\n"
           "operation and how many failed, the allocation sizes by power of two, the peak and final live bytes,\n"
           "the duration, the streams and threads.  A gzip-compressed trace is read as well.\n\n"
           "  --json                      one JSON object on stdout instead of the text (the trace's path is in\n"
           "                              \"trace\")\n"
           "  --memory-snapshot OUT       writes PyTorch's memory snapshot (a pickle, as torch.cuda.memory.\n"
           "                              _snapshot() gives) of the run: every allocation and free of the\n"
           "                              trace's level and each chunk mapped and unmapped, over time, and the\n"
           "                              memory mapped at the end with its live blocks.  View it at\n"
           "                              https://pytorch.org/memory_viz or with python3 -m torch.cuda._memory_viz\n"
           "                              trace_plot OUT -o out.html (docs/memory-viz.md)\n"
           "  --csv OUT                   writes one line an event: time_s (since the trace began), event, size,\n"
           "                              in_use, mapped (bytes after it; mapped empty in a trace without map\n"
           "                              records)\n"
           "  --plot OUT                  writes an SVG plot of the bytes in use and mapped over time\n"
           "  --help                      this text\n\n"
           "Exit status: 0, 1 if the file is not a whole and valid trace (the reason on stderr), 2 for a wrong\n"
           "command line.\n",
           usage_line);
}

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

/* Writes each output asked for (NULL: not asked); -1 after a message if one could not be written. */
static int write_outputs(const char *path, const trace_data *d, const char *snap, const char *csv, const char *plot)
{
    const char *outs[3] = {snap, csv, plot};
    for (int k = 0; k < 3; k++) {
        if (!outs[k])
            continue;
        FILE *f = fopen(outs[k], k == 0 ? "wb" : "w");
        if (!f) {
            fprintf(stderr, "fabpool_trace: cannot create '%s': %s\n", outs[k], strerror(errno));
            return -1;
        }
        char err[512] = "";
        int rc = k == 0 ? trace_write_snapshot(d, f, err, sizeof err)
                 : k == 1 ? trace_write_csv(d, f, err, sizeof err)
                          : trace_write_svg(d, path, f, err, sizeof err);
        if (fclose(f) != 0 && rc == 0) {
            snprintf(err, sizeof err, "%s", strerror(errno));
            rc = -1;
        }
        if (rc != 0) {
            fprintf(stderr, "fabpool_trace: writing '%s': %s\n", outs[k], err);
            remove(outs[k]); /* no half file that a viewer would take for the run */
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int json = 0;
    const char *snap = NULL, *csv = NULL, *plot = NULL;
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                         {"memory-snapshot", required_argument, NULL, 's'},
                                         {"csv", required_argument, NULL, 'c'},
                                         {"plot", required_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        if (c == 'j')
            json = 1;
        else if (c == 's')
            snap = optarg;
        else if (c == 'c')
            csv = optarg;
        else if (c == 'p')
            plot = optarg;
        else if (c == 'h') {
            help();
            return CLI_OK;
        } else
            return cli_usage_error(usage_line);
    }
    if (optind != argc - 1) {
        fprintf(stderr, "fabpool_trace: %s\n", optind == argc ? "no trace named" : "one trace at a time");
        return cli_usage_error(usage_line);
    }
    const char *path = argv[optind];
    trace_data d;
    char err[512];
    if (trace_load(path, &d, err, sizeof err) != 0) {
        fprintf(stderr, "fabpool_trace: %s\n", err);
        return CLI_FAILED;
    }
    if (write_outputs(path, &d, snap, csv, plot) != 0) {
        trace_free(&d);
        return CLI_FAILED;
    }
    trace_summary s;
    trace_summarize(&d, &s);
    if (json) {
        printf("{\"trace\":");
        fp_json_str(stdout, path);
        if (d.note[0]) {
            printf(",\"note\":");
            fp_json_str(stdout, d.note);
        }
        printf(",\"version\":%u,\"device\":%d,\"granularity\":%" PRIu64 ",\"slab_max\":%" PRIu64
               ",\"pid\":%u,\"synthetic\":%d,\"closed\":%d,\"records\":%zu,\"level\":\"%s\",\"ops\":{",
               d.h.version, d.h.device, d.h.granularity, d.h.slab_max, d.h.pid,
               !!(d.h.flags & FABPOOL_TRACE_F_SYNTHETIC), d.closed, d.n, s.level_app ? "app" : "pool");
        for (int k = 0; k < 2; k++) { /* the records by operation, then the failed ones */
            int first = 1;
            for (unsigned op = 1; op < FABPOOL_TR_NOPS; op++) {
                fp_json_key(stdout, &first, fabpool_trace_op_name(op));
                printf("%" PRIu64, k ? s.failed[op] : s.ops[op]);
            }
            printf(k ? "}" : "},\"failed\":{");
        }
        printf(",\"size_hist_log2\":{");
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
