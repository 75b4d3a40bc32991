/* fuzz_snapshot: the trace reader (perf/trace_file.c) and what the tools
 * write from a trace (perf/trace_viz.c: PyTorch's memory snapshot, the CSV,
 * the SVG plot; and the summary), on any bytes, twice: the trace the reader
 * made of them, and the records as they are, without the reader's checks
 * (the writers check what they use themselves).  A refusal must say why;
 * nothing may read or write out of bounds (ASan, UBSan) or write without
 * end (the fuzzer's -timeout). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "trace_file.h"
#include "trace_viz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void write_all(const trace_data *d, FILE *sink)
{
    char err[512];
    int (*const fns[2])(const trace_data *, FILE *, char *, size_t) = {trace_write_snapshot, trace_write_csv};
    for (int k = 0; k < 3; k++) {
        err[0] = 0;
        int rc = k < 2 ? fns[k](d, sink, err, sizeof err) : trace_write_svg(d, "fuzz", sink, err, sizeof err);
        if (rc != 0 && !err[0])
            abort(); /* an error always says why */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink && !(sink = fopen("/dev/null", "w")))
        abort();
    trace_data d;
    char err[512] = "";
    if (trace_parse(data, size, "fuzz", &d, err, sizeof err) == 0) {
        trace_summary s;
        trace_summarize(&d, &s);
        write_all(&d, sink);
        trace_free(&d);
    } else if (!err[0]) {
        abort();
    }
    /* the same bytes as a header's device and flags and records, unchecked */
    if (size < FABPOOL_TRACE_HEADER_BYTES)
        return 0;
    size_t n = (size - FABPOOL_TRACE_HEADER_BYTES) / FABPOOL_TRACE_RECORD_BYTES;
    trace_data raw = {0};
    raw.h.device = (int32_t)fabpool_le_get32(data + 20);
    raw.h.flags = fabpool_le_get32(data + 60);
    raw.recs = malloc((n ? n : 1) * sizeof *raw.recs);
    if (!raw.recs)
        return 0;
    for (size_t i = 0; i < n; i++) {
        fabpool_trace_decode_rec(data + FABPOOL_TRACE_HEADER_BYTES + i * FABPOOL_TRACE_RECORD_BYTES, &raw.recs[i]);
        raw.has_app |= raw.recs[i].op >= FABPOOL_TR_APP_ALLOC;
    }
    raw.n = n;
    raw.has_app |= (raw.h.flags & FABPOOL_TRACE_F_APP_MARKED) != 0;
    write_all(&raw, sink);
    free(raw.recs);
    return 0;
}
