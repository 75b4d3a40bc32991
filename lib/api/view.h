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
#include "desc.h"
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
/* What view_open.c (view_open.h: a view opened, or a kept one taken back) uses of view.c: */
/* Closes the fds given (those below 0 skipped). */
void fp_view_close_fds(const int *fds, size_t n);
/* Applies a parsed descriptor to v, all or nothing (view.c says how).  Pool lock held. */
fabpool_status fp_view_apply_locked(fabpool_view_t *v, const fp_desc *ds, const int *fds);
/* st, and where it is a failure whose message a layer below wrote without naming the public call (a descriptor
 * refused, no host memory, the driver), that message with " (fn)" after it. */
fabpool_status fp_view_named(fabpool_status st, const char *fn);
/* Unmaps v's chunks and frees it (its handle's slot too: handles.h).  A refusal of the driver stops it: the
 * view stays, with the chunks it still maps (unmapping a range and then handing it out again while a chunk is
 * still mapped there would break the next mapping, and the reservation's release at destroy); with force (pool
 * destroy) those are forgotten instead.  Pool lock held. */
fabpool_status fp_view_free(fp_views *vs, fabpool_view_t *v, int force);
/* Marks v kept (on: released, its handle refused from now on) or not, kept_bytes following the bytes its
 * chunks map (what fabpool_check adds up: a view that lost chunks to a refused apply counts what it still
 * maps).  Pool lock held. */
void fp_view_keep(fp_views *vs, fabpool_view_t *v, int on);

/* Pool destroy: unmaps and frees every view.  Pool lock held. */
void fp_views_destroy(fp_views *vs);
/* Closes the kept views: every one (all != 0), or those kept for keep_ms or
 * longer.  Pool lock held. */
void fp_views_drop_kept(fp_views *vs, int all);

#endif
