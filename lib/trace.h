/* trace.h - recording a pool's allocations to a file (FABPOOL_TRACE, conf key
 * trace; the file's layout: fabpool_trace_format.h).
 *
 * A pool with no trace has p->trace == NULL, and each hook below costs one
 * predictable branch on that field.  With a trace, every record goes into a
 * per-pool buffer under the trace's own lock (a leaf lock: it may be taken
 * with the pool lock or a class lock held), written out when full, at pool
 * destroy, and at process exit (the PyTorch shim never destroys its pools). */
#ifndef FP_TRACE_H
#define FP_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"
#include "fabpool_trace_format.h"

struct fabpool;
struct fp_trace;

/* FABPOOL_TRACE, if set and not empty, into o->trace_path (it wins over the
 * options and FABPOOL_CONF).  FABPOOL_ERR_CONFIG if it is too long. */
fabpool_status fp_trace_env(fabpool_options *o);
/* Opens p->opt.trace_path (if not empty) once the pool knows its device and
 * granularity: FABPOOL_ERR_IO if the file cannot be created or written. */
fabpool_status fp_trace_open(struct fabpool *p);
/* Writes what is buffered, completes the header, closes the file. */
void fp_trace_close(struct fabpool *p);
/* The path being written (after %p/%d and a ".N" for a second pool of the
 * process on the same path), or NULL. */
const char *fp_trace_path(const struct fabpool *p);

void fp_trace_record(struct fabpool *p, unsigned op, uint64_t ptr, uint64_t size, uint64_t arg, unsigned status);

typedef fabpool_status (*fp_trace_alloc_fn)(fabpool_t *, size_t, void **);
/* fabpool_alloc with a trace: the allocation through `alloc`, then its record. */
fabpool_status fp_trace_alloc(struct fabpool *p, size_t size, void **out, fp_trace_alloc_fn alloc);

/* A hook: records (op, ptr, size, arg) if p has a trace, status unknown. */
#define FP_TRACE(p, op, ptr, size, arg)                                                                        \
    do {                                                                                                       \
        if (__builtin_expect((p)->trace != NULL, 0))                                                           \
            fp_trace_record((p), (op), (uint64_t)(uintptr_t)(ptr), (uint64_t)(size), (uint64_t)(uintptr_t)(arg), \
                            FABPOOL_TRACE_STATUS_UNKNOWN);                                                          \
    } while (0)

/* The same with the call's status. */
#define FP_TRACE_ST(p, op, ptr, size, arg, st)                                                                 \
    do {                                                                                                       \
        if (__builtin_expect((p)->trace != NULL, 0))                                                           \
            fp_trace_record((p), (op), (uint64_t)(uintptr_t)(ptr), (uint64_t)(size), (uint64_t)(uintptr_t)(arg), \
                            (unsigned)(st));                                                                   \
    } while (0)

#endif
