/* meta.h - host memory for the pool's own metadata.
 *
 * In a private jemalloc arena when the process has jemalloc (or when asked
 * to load it), else from libc.  fabpool never links jemalloc: Debian's uses
 * initial-exec TLS, and a library linked against it cannot be dlopen'ed into
 * a running process (Python, PyTorch's pluggable allocator).  So jemalloc's
 * entry points are found at run time. */
#ifndef FP_META_H
#define FP_META_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "counter.h"
#include "fabpool.h"

/* The arena's counter that fp_meta_read_counters copies (counter.h): the bytes it holds. */
#define FP_META_COUNTERS(X) X(bytes)

typedef struct fp_meta {
    int jemalloc;         /* 1: a private jemalloc arena */
    unsigned arena;
    void *(*mallocx)(size_t, int);
    void (*sdallocx)(void *, size_t, int);
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    int flags;            /* MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE | MALLOCX_ZERO */
    FP_META_COUNTERS(FP_COUNTER_ATOMIC)
} fp_meta;

fabpool_status fp_meta_init(fp_meta *m, fabpool_metadata mode);
/* Zeroed memory, or NULL. */
void *fp_meta_alloc(fp_meta *m, size_t size);
void fp_meta_free(fp_meta *m, void *p, size_t size);
/* Zeroed memory of size bytes (a power of two) aligned to its size, or
 * NULL; freed with fp_meta_free_aligned. */
void *fp_meta_alloc_aligned(fp_meta *m, size_t size);
void fp_meta_free_aligned(fp_meta *m, void *p, size_t size);
/* Counts size bytes that the pool holds outside the arena (a handle slot,
 * handles.h) in its metadata bytes (held != 0), or no longer (held 0). */
void fp_meta_count(fp_meta *m, size_t size, int held);
/* Destroys the arena: every block must have been freed. */
void fp_meta_destroy(fp_meta *m);

/* What the stats read of the arena: where it is and the bytes it holds
 * (an atomic, read without a lock). */
typedef struct fp_meta_counters {
    FP_META_COUNTERS(FP_COUNTER_PLAIN)
    int jemalloc;         /* 1: a private jemalloc arena, else libc */
    unsigned arena;
} fp_meta_counters;
void fp_meta_read_counters(const fp_meta *m, fp_meta_counters *c);

#endif
