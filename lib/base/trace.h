/* trace.h - recording a pool's allocations to a file (FABPOOL_TRACE, conf key
 * trace; the file's layout: fabpool_trace_format.h).
 *
 * A pool with no trace has no struct fp_trace (NULL), and each hook below
 * costs one predictable branch on that pointer, which the layers that record
 * (alloc, buffer, pool) keep a copy of.  With a trace, every record goes into a
 * per-pool buffer under the trace's own lock (a leaf lock: it may be taken
 * with the pool lock or a class lock held), written out when full, at pool
 * destroy, and at process exit (the PyTorch shim never destroys its pools). */
#ifndef FP_TRACE_H
#define FP_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"
#include "fabpool_trace_format.h"

struct fp_trace;

/* FABPOOL_TRACE, if set and not empty, into o->trace_path (it wins over the
 * options and FABPOOL_CONF).  FABPOOL_ERR_CONFIG if it is too long. */
fabpool_status fp_trace_env(fabpool_options *o);
/* Opens o->trace_path (if not empty; *out stays NULL if it is) once the
 * pool knows its granularity, as fp_open_private (log.h) opens a file:
 * FABPOOL_ERR_IO, naming the path and why, if the file cannot be created or
 * written, or is refused (a symbolic link, not a regular file, another
 * user's). */
fabpool_status fp_trace_open(const fabpool_options *o, uint64_t gran, struct fp_trace **out);
/* Registers the trace list's fork hooks (once).  pthread_atfork runs the prepare hooks last registered first, and
 * the lock order takes the pools' registry before the trace list: the registry's hooks call this before they
 * register their own, so that a fork takes the two in that order whichever pool was made or traced first. */
void fp_trace_fork_hooks(void);
/* Writes what is buffered, completes the header, closes the file (t may be NULL). */
void fp_trace_close(struct fp_trace *t);
/* The path being written (after %p/%d and a ".N" for a second pool of the
 * process on the same path), or NULL. */
const char *fp_trace_path(const struct fp_trace *t);

/* One record; flags: FABPOOL_TRACE_R_APP for a call the application made, 0 for one the pool made of itself
 * (every file is written with FABPOOL_TRACE_F_APP_MARKED, so that a replay takes the application's calls
 * whatever their mix). */
void fp_trace_record(struct fp_trace *t, unsigned op, unsigned flags, uint64_t ptr, uint64_t size, uint64_t arg,
                     unsigned status);

/* The hook: records (op, ptr, size, arg, status) with flags if t is a trace. */
#define FP_TRACE_F(t, flags, op, ptr, size, arg, st)                                                           \
    do {                                                                                                       \
        if (__builtin_expect((t) != NULL, 0))                                                                  \
            fp_trace_record((t), (op), (flags), (uint64_t)(uintptr_t)(ptr), (uint64_t)(size),                  \
                            (uint64_t)(uintptr_t)(arg), (unsigned)(st));                                       \
    } while (0)

/* A public call the application made (marked FABPOOL_TRACE_R_APP), status unknown ... */
#define FP_TRACE(t, op, ptr, size, arg) FP_TRACE_F(t, FABPOOL_TRACE_R_APP, op, ptr, size, arg, FABPOOL_TRACE_STATUS_UNKNOWN)
/* ... and with the call's status. */
#define FP_TRACE_ST(t, op, ptr, size, arg, st) FP_TRACE_F(t, FABPOOL_TRACE_R_APP, op, ptr, size, arg, st)
/* A call the pool makes of itself inside one of the application's (the stream pair's own allocations and
 * frees): the pool's level only. */
#define FP_TRACE_POOL(t, op, ptr, size, arg) FP_TRACE_F(t, 0u, op, ptr, size, arg, FABPOOL_TRACE_STATUS_UNKNOWN)

#endif
