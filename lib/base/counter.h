/* counter.h - the pool's counters: atomics that each layer adds to and that
 * the stats read without a lock, relaxed (each is a count on its own:
 * nothing else is read through it).  Header only.
 *
 * A layer lists its atomic uint64_t counters once, in its header, as a list
 * macro of X(name) entries (FP_HEAP_COUNTERS(X) in slab.h, for instance);
 * the helpers below make of that list the _Atomic members of the layer's
 * struct (LIST(FP_COUNTER_ATOMIC)), the plain members of its snapshot
 * struct (LIST(FP_COUNTER_PLAIN)) and the copies of its read function
 * (LIST(FP_COUNTER_COPY), in a function whose snapshot is `c` and whose
 * layer's struct is `src`).  Counters of another shape (arrays, fields read
 * under a lock, sums) are declared and copied by hand beside them. */
#ifndef FP_COUNTER_H
#define FP_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

static inline uint64_t fp_counter(const _Atomic uint64_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

#define FP_COUNTER_ATOMIC(name) _Atomic uint64_t name;
#define FP_COUNTER_PLAIN(name) uint64_t name;
#define FP_COUNTER_COPY(name) c->name = fp_counter(&src->name);

#endif
