/* view.h - a peer's buffer in this process: mapped from its descriptors, in
 * an address window of the pool's reservation, followed by deltas.
 *
 * Counter it owns: view bytes.  Pool lock (vs->sp->lock) held for every
 * change. */
#ifndef FP_VIEW_H
#define FP_VIEW_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "counter.h"
#include "device.h"
#include "space.h"
#include "walk.h"

/* A chunk of a view. */
typedef struct fp_vchunk {
    uint64_t off, size, gen;
} fp_vchunk;

/* The views' counters that fp_views_read_counters copies (counter.h): the bytes mapped by the views, and of
 * those, by the views kept for reuse. */
#define FP_VIEWS_COUNTERS(X) X(bytes) X(kept_bytes)

/* The pool's views. */
typedef struct fp_views {
    fp_space *sp;                      /* chunks, ranges, metadata, the pool lock */
    uint32_t keep_ms;                  /* how long a released view is kept for the next open of its buffer */
    struct fabpool_view *list;
    FP_VIEWS_COUNTERS(FP_COUNTER_ATOMIC)
} fp_views;

struct fabpool_view {
    fp_views *owner;
    struct fabpool_view *next, *prev;
    uint64_t base, window, live, generation, uid;
    uint32_t handle_type, n;
    size_t cap;
    int peer_pid, peer_device;         /* as the descriptor says (the peer's word) */
    int vouched_pid;                   /* the process the caller vouched the descriptors came from
                                          (fabpool_view_open_peer); 0: none, and a release closes the view */
    int kept;                          /* released, kept since kept_ns for an open of the same buffer */
    uint64_t kept_ns;
    fp_vchunk *chunks;
};

void fp_views_init(fp_views *vs, fp_space *sp, uint32_t keep_ms);
/* What the views count (fabpool_stats): atomics, read without a lock, exact
 * under the pool lock. */
typedef struct fp_view_counters {
    FP_VIEWS_COUNTERS(FP_COUNTER_PLAIN)
} fp_view_counters;
void fp_views_read_counters(const fp_views *vs, fp_view_counters *c);
/* fabpool_view_open (vouched 0) or fabpool_view_open_peer (vouched: the peer's pid) on the pool whose views vs
 * are (vs NULL: the pool was NULL). */
fabpool_status fp_view_open(fp_views *vs, int vouched, const void *desc, size_t len, const int *fds, size_t nfds,
                            fabpool_view_t **out);
/* Pool destroy: unmaps and frees every view.  Pool lock held. */
void fp_views_destroy(fp_views *vs);
/* Closes the kept views: every one (all != 0), or those kept for keep_ms or
 * longer.  Pool lock held. */
void fp_views_drop_kept(fp_views *vs, int all);

#endif
