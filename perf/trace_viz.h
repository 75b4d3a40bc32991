/* trace_viz.h - a trace as memory over time, for the viewers users know
 * (fabpool_trace --memory-snapshot, --csv, --plot; docs/memory-viz.md).
 *
 * The trace is walked as events of its level (trace_summary's: the
 * application's calls where the trace marks them, else the pool's): an
 * allocation (a block, or a buffer's size), its free, and the chunks the
 * pool maps and unmaps, each with the bytes in use and the bytes mapped
 * after it.  From those:
 *   - PyTorch's memory snapshot (what torch.cuda.memory._snapshot() returns
 *     and torch.cuda._memory_viz reads): a pickle (protocol 2) of a dict with
 *     "device_traces" (one list a device; on the trace's device every event:
 *     alloc, free_requested + free_completed, segment_map, segment_unmap, with
 *     addr, size, stream, frames (none: a trace has no stacks), time_us) and
 *     "segments" (the memory mapped at the end, one segment a contiguous
 *     range, its blocks live or inactive);
 *   - a CSV: time, event, size, in use, mapped;
 *   - an SVG plot of in use and mapped over time. */
#ifndef FABPOOL_TRACE_VIZ_H
#define FABPOOL_TRACE_VIZ_H

#include <stdio.h>

#include "trace_file.h"

/* Each writes d to f: 0, or -1 with the reason in err (no host memory, a
 * write that failed, a record that trace_rec_bad refuses or out of time
 * order, live or mapped bytes past 64 bits, a device outside
 * 0..TRACE_MAX_DEVICE): each checks the records it uses itself, whoever
 * read them.  title (the plot's) may hold any bytes. */
int trace_write_snapshot(const trace_data *d, FILE *f, char *err, size_t cap);
int trace_write_csv(const trace_data *d, FILE *f, char *err, size_t cap);
int trace_write_svg(const trace_data *d, const char *title, FILE *f, char *err, size_t cap);

#endif
