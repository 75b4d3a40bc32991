/* counter.h - reading the pool's counters: atomics that each layer adds to
 * and that the stats read without a lock, relaxed (each is a count on its
 * own: nothing else is read through it).  Header only. */
#ifndef FP_COUNTER_H
#define FP_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

static inline uint64_t fp_counter(const _Atomic uint64_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

#endif
