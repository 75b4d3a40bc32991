/* torch_snapshot.c - the shim's memory snapshot (torch_snapshot.h), by the
 * trace tool's own reader and writer (perf/trace_file.c, perf/trace_viz.c). */
#include "torch_snapshot.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "trace_file.h"
#include "trace_viz.h"

int fabpool_torch_memory_snapshot(const char *trace, const char *out, char *msg, size_t cap)
{
    if (!trace || !out || !msg || !cap) {
        if (msg && cap)
            snprintf(msg, cap, "fabpool_torch_memory_snapshot: a trace path and an output path are needed");
        return -1;
    }
    msg[0] = 0;
    if (fabpool_trace_flush() != FABPOOL_OK) {
        snprintf(msg, cap, "%s", fabpool_last_error());
        return -1;
    }
    trace_data d;
    char err[512] = "";
    if (trace_load(trace, &d, err, sizeof err) != 0) {
        snprintf(msg, cap, "%s (is this process's FABPOOL_TRACE the path given?)", err);
        return -1;
    }
    FILE *f = fopen(out, "wb");
    if (!f) {
        snprintf(msg, cap, "cannot create '%s': %s", out, strerror(errno));
        trace_free(&d);
        return -1;
    }
    int rc = trace_write_snapshot(&d, f, err, sizeof err);
    if (fclose(f) != 0 && rc == 0) {
        snprintf(err, sizeof err, "%s", strerror(errno));
        rc = -1;
    }
    trace_free(&d);
    if (rc != 0) {
        snprintf(msg, cap, "writing '%s': %s", out, err);
        remove(out);
    }
    return rc;
}
