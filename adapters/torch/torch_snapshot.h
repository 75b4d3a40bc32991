/* torch_snapshot.h - the shim's memory snapshot: the trace its pools record
 * (FABPOOL_TRACE) as PyTorch's memory snapshot, for a program that runs with
 * the pluggable shim, whose interface has no allocation history
 * (fabpool_torch.record_memory_history / dump_snapshot, docs/memory-viz.md). */
#ifndef FABPOOL_TORCH_SNAPSHOT_H
#define FABPOOL_TORCH_SNAPSHOT_H

#include <stddef.h>

#include "fabpool.h"

/* Writes every trace's buffer out (fabpool_trace_flush), then the trace at
 * `trace` (the run so far) as PyTorch's memory snapshot into `out` (what
 * fabpool_trace --memory-snapshot writes).  0, or -1 with the reason in msg. */
FABPOOL_API int fabpool_torch_memory_snapshot(const char *trace, const char *out, char *msg, size_t cap);

#endif
