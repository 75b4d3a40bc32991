/* pool.h - the pool: the top layer of lib/ (lib/LAYERS).  Only the files of
 * the top layer include this header; every layer below has its own header
 * and its own part of the pool, and never sees this struct (alloc.c reaches
 * its part by the cast alloc.h describes).  The top layer hands each part to
 * its layer's functions (&p->heap) and reads and writes inside it only
 * through them: getters of the layer's header (lib/LAYERS;
 * tools/layercheck.py fails on p->heap.field).
 *
 * What each member is, and who writes it:
 *   alloc   thread caches and the hot path (alloc.c); first, see alloc.h
 *   meta    the host metadata arena every layer allocates from (meta.c)
 *   ch      the device, its context, driver-call counters and what the
 *           driver holds for the pool: the registry of every mapping
 *           (mapreg.h; mapped bytes are its sums), handles, fds (chunk.c;
 *           opened, closed and read through device.h)
 *   sp      the reservation (space.c), its free ranges and the page map
 *           (vaspace.c, pagemap.c), written under the pool lock, which is
 *           here too (fp_space_lock)
 *   heap    slabs, large blocks, trim and decay (slab.c)
 *   bufs    growable buffers (buffer.c, export.c)
 *   views   peers' buffers (view.c)
 *   retire  the stream queue: stream-pending blocks (pending.c) and retired chunks' events (retire.c);
 *           alloc and bufs hold a pointer to it
 *   sleep   the record of a sleep and its counters (sleep.c); the asleep
 *           state every layer reads is ch.asleep (and alloc's epoch bit)
 *   use     the high-water mark of the bytes in use (usage.h): alloc counts
 *           slab blocks into it, bufs raises it, stats reads and resets it
 *
 * Locking: the pool lock guards the address space, the page map's writers,
 * the arenas, buffers, views, the list of thread caches and the driver
 * calls that change mappings.  Each slab class has its own lock.  lib/lock.h
 * has every lock's level and the one order (registry < pool < class <
 * retire < trace list < trace).  The hot path (a thread cache hit) takes
 * no lock and makes no driver call. */
#ifndef FP_POOL_H
#define FP_POOL_H

#include <pthread.h>

#include "alloc.h"
#include "release.h"
#include "device.h"
#include "fabpool.h"
#include "meta.h"
#include "pending.h"
#include "slab.h"
#include "space.h"
#include "view_open.h"

struct fabpool {
    fp_alloc alloc;                    /* first: alloc.h */
    fp_meta meta;
    fp_chunks ch;
    fp_space sp;                       /* the reservation, the page map, the pool lock */
    fp_heap heap;
    fp_buffers bufs;
    fp_views views;
    fp_retire retire;                  /* the stream queue: stream-pending blocks (pending.h), retired chunks' events (retire.h) */
    struct fp_sleep *sleep;            /* sleep.c: the chunks put to sleep, non-NULL while asleep (pool lock) */
    struct fp_host_cache *host_cache;  /* sleep.c: host copies kept from the last wake (sleep_keep_host; pool lock) */
    _Atomic uint64_t sleep_offloaded, sleep_discarded, sleep_host_bytes, sleep_host_copies, sleeps, wakes;
    _Atomic uint64_t sleep_host_reused;  /* the last sleep: bytes of host copies reused from the last wake */
    _Atomic int sleep_mode;            /* sleep.c's: written there only */
    struct fp_trace *trace;            /* NULL: no trace (trace.h); alloc and bufs hold copies */
    fabpool_options opt;
    fp_usage use;                      /* the in-use mark (usage.h); alloc and bufs hold a pointer to it */
};

#endif
