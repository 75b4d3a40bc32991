/* usage.h - the high-water mark of the bytes a pool has in use
 * (fabpool_stats.in_use_bytes_peak; its semantics and bound: fabpool.h),
 * kept as the allocations happen, not only when stats are read.
 *
 * The pool has one fp_usage; the layers that change what is in use hold a
 * pointer to it: alloc counts slab blocks as they leave their class (a
 * thread cache's refill, or one block without a cache) and come back (a
 * flush), never on the thread-cache hit; large blocks and buffers are the
 * heap's and the buffers' own counters, read through the pointers below.
 * Each of those raises the mark after its count went up.  Header only. */
#ifndef FP_USAGE_H
#define FP_USAGE_H

#include <stdatomic.h>
#include <stdint.h>

#include "counter.h"

/* The counters fp_usage_read copies (counter.h): the bytes of slab blocks out of their classes (given out or
 * in a cache), and the mark: the most slab_out + *large + *buffers seen. */
#define FP_USAGE_COUNTERS(X) X(slab_out) X(peak)

typedef struct fp_usage {
    FP_USAGE_COUNTERS(FP_COUNTER_ATOMIC)
    const _Atomic uint64_t *large;      /* the heap's large_in_use_bytes */
    const _Atomic uint64_t *buffers;    /* the buffers' bytes (sizes asked) */
} fp_usage;

static inline uint64_t fp_usage_now(const fp_usage *u)
{
    return atomic_load_explicit(&u->slab_out, memory_order_relaxed) +
           atomic_load_explicit(u->large, memory_order_relaxed) +
           atomic_load_explicit(u->buffers, memory_order_relaxed);
}

/* After a count went up: the mark follows. */
static inline void fp_usage_raise(fp_usage *u)
{
    uint64_t v = fp_usage_now(u), old = atomic_load_explicit(&u->peak, memory_order_relaxed);
    while (v > old &&
           !atomic_compare_exchange_weak_explicit(&u->peak, &old, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* Slab blocks of `bytes` in all leave their classes (up: the mark follows) or come back. */
static inline void fp_usage_slab_out(fp_usage *u, uint64_t bytes)
{
    atomic_fetch_add_explicit(&u->slab_out, bytes, memory_order_relaxed);
    fp_usage_raise(u);
}

static inline void fp_usage_slab_back(fp_usage *u, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&u->slab_out, bytes, memory_order_relaxed);
}

/* What fabpool_stats and fabpool_check read of the mark. */
typedef struct fp_usage_counters {
    FP_USAGE_COUNTERS(FP_COUNTER_PLAIN)
} fp_usage_counters;
static inline void fp_usage_read(const fp_usage *src, fp_usage_counters *c)
{
    FP_USAGE_COUNTERS(FP_COUNTER_COPY)
}

/* fabpool_reset_peak: the mark starts again from what is counted now, and follows the counts again after the
 * store: an allocation's raise between the read and the store is not lost under it. */
static inline void fp_usage_reset(fp_usage *u)
{
    atomic_store(&u->peak, fp_usage_now(u));
    fp_usage_raise(u);
}

#endif
