/* check.c - fabpool_check: walks the pool's structures under its locks and
 * verifies their invariants (as TLSF's tlsf_check).  Each layer walks its
 * own structures beside them and reports into one fp_walk (walk.h says how
 * a broken invariant is named); this file takes the locks, orders the walks
 * and compares what they add up across the layers: the kept exports against
 * the page map, the address space against what every layer holds, the
 * retirement queue and the pool's counters against the sums, and what each
 * layer maps (the arenas', the buffers', the views' walks, sleep's host
 * copies) against the device layer's registry of mappings, kind by kind.
 *
 * The walk takes the pool lock, every class lock in ascending index and
 * the retirement queue's (lock.h), so the structures hold still.  Other
 * threads may still allocate and free meanwhile: what they change without a
 * lock is read so that it is no data race, and checked only as far as it
 * holds whatever they do (heap/slab_check.c and api/tcache_check.c say how
 * for the free flags and the thread caches).  A block freed on a stream is
 * flagged pending before it is queued, and taken out of the queue before
 * its flag is cleared: every queued block is flagged pending (exact), and
 * more flagged than queued is a block in flight or a broken flag.  With no
 * other thread's cache listed, the walk is repeated for up to half a
 * second, and the mismatch reported only if it stays while the queue sees
 * no activity (fabpool_check below). */
#include <string.h>
#include <time.h>

#include "arena_check.h"
#include "buffer_check.h"
#include "chunk_check.h"
#include "error.h"
#include "pool.h"
#include "slab_check.h"
#include "sleep.h"
#include "tcache_check.h"
#include "view_info.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* What each layer's walk found mapped, per registry kind (mapreg.h), and
 * w's count of mappings when the last walk began. */
typedef struct map_sums {
    uint64_t count[FP_MAP_KINDS], bytes[FP_MAP_KINDS];
    uint64_t n0, b0;
} map_sums;

/* Books the mappings the walk just done added to w as kind's. */
static void book(map_sums *s, fp_map_kind kind, const fp_walk *w)
{
    s->count[kind] += w->n_chunks - s->n0;
    s->bytes[kind] += w->chunk_bytes - s->b0;
    s->n0 = w->n_chunks;
    s->b0 = w->chunk_bytes;
}

/* Each layer's own walk, bottom up where one needs what another counted. */
static fabpool_status check_walks(struct fabpool *p, fp_walk *w, map_sums *maps)
{
    fabpool_status st;
    if ((st = fp_space_check_ranges(&p->sp, w)) != FABPOOL_OK ||
        (st = fp_tcaches_check(&p->alloc, &p->heap, w)) != FABPOOL_OK ||
        (st = fp_slabs_check(&p->heap, w)) != FABPOOL_OK)
        return st;
    /* the in-use mark counts every block out of its class: given out, pending on a stream, in a cache.  It is
     * counted after the class lock is let go, so it is exact only while no other thread is in the pool: no
     * other thread's cache listed, and caches on (a thread without one leaves no trace to see) */
    fp_usage_counters u;
    fp_usage_read(&p->use, &u);
    if (w->exact && fp_alloc_thread_cache(&p->alloc) && w->slab_out != u.slab_out)
        return FAIL("[usage.slab_out] %llu bytes of slab blocks are out of their classes, the in-use mark counts %llu",
                    ULL(w->slab_out), ULL(u.slab_out));
    maps->n0 = w->n_chunks;
    maps->b0 = w->chunk_bytes;
    if ((st = fp_arenas_check(&p->heap, w, &p->retire)) != FABPOOL_OK)
        return st;
    book(maps, FP_MAP_ARENA, w);
    if ((st = fp_buffers_check(&p->bufs, w)) != FABPOOL_OK)
        return st;
    book(maps, FP_MAP_BUFFER, w);
    if ((st = fp_buffers_check_stuck(&p->bufs, w)) != FABPOOL_OK)
        return st;
    book(maps, FP_MAP_STAGING, w);
    if ((st = fp_chunks_kept_check(&p->ch, w)) != FABPOOL_OK || (st = fp_space_check_kept(&p->sp, w)) != FABPOOL_OK ||
        (st = fp_views_check(&p->views, w)) != FABPOOL_OK)
        return st;
    book(maps, FP_MAP_VIEW, w);
    if ((st = fp_chunks_stuck_check(&p->ch, w)) != FABPOOL_OK)
        return st;
    book(maps, FP_MAP_STUCK, w);
    if ((st = fp_space_check_used(&p->sp, w)) != FABPOOL_OK || (st = fp_heap_map_check(&p->heap, w)) != FABPOOL_OK)
        return st;
    return fp_space_check_pages(&p->sp, w);
}

/* Each layer's mappings (those asleep apart: sleep took them out of the
 * registry, their owners keep them) against the registry's sum of their
 * kind; a shrink's copy lives inside one hold of the pool lock, so the only
 * ones left at a check are those the driver would not unmap, which the
 * buffers list.  Pool lock held. */
static fabpool_status check_registry(struct fabpool *p, map_sums *maps)
{
    fabpool_status st = fp_chunks_registry_check(&p->ch);
    if (st != FABPOOL_OK)
        return st;
    uint64_t slept_n[FP_MAP_KINDS], slept_b[FP_MAP_KINDS], reg_n[FP_MAP_KINDS], reg_b[FP_MAP_KINDS];
    fp_sleep_unmapped(p, slept_n, slept_b);
    fp_chunk_map_sums(&p->ch, reg_n, reg_b);
    maps->count[FP_MAP_HOST] = atomic_load(&p->sleep_host_copies);
    maps->bytes[FP_MAP_HOST] = atomic_load(&p->sleep_host_bytes);
    for (int k = 0; k < FP_MAP_KINDS; k++) {
        uint64_t n = maps->count[k] - slept_n[k], b = maps->bytes[k] - slept_b[k];
        if (n != reg_n[k] || b != reg_b[k])
            return FAIL("[pool.mapped] %s: the layer that owns them maps %llu of %llu bytes (%llu more asleep), the "
                        "device layer's registry lists %llu of %llu bytes", fp_map_kind_name((fp_map_kind)k), ULL(n),
                        ULL(b), ULL(slept_n[k]), ULL(reg_n[k]), ULL(reg_b[k]));
    }
    return FABPOOL_OK;
}

static fabpool_status check_locked(struct fabpool *p, fp_walk *w)
{
    fp_space_assert_locked(&p->sp);
    map_sums maps;
    memset(&maps, 0, sizeof maps);
    fabpool_status st = check_walks(p, w, &maps);
    if (st != FABPOOL_OK)
        return st;
    if (w->idle != fp_heap_idle(&p->heap))
        return FAIL("[pool.idle] empty slabs and the arenas' free ranges add up to %llu bytes, the heap counts %llu "
                    "idle", ULL(w->idle), ULL(fp_heap_idle(&p->heap)));
    uint64_t queued = fp_retire_queued(&p->retire), used = fp_retire_used_blocks(&p->retire);
    w->suspect = w->exact && w->pending > queued;
    if (w->pending < queued || w->suspect)
        return FAIL("[retire.pending] %llu slab and large blocks are marked pending on a stream, the retirement queue "
                    "holds %llu", ULL(w->pending), ULL(queued));
    /* fabpool_record_stream flags a slab block after its record, and the free of a recorded block clears the flag
     * before it drops the record, each outside the queue's lock: a thread (without a cache of its own, or with
     * caches off) may be between the two, so a difference is confirmed by a new walk (fabpool_check) */
    w->suspect = w->exact && w->recorded != used;
    if (w->suspect)
        return FAIL("[retire.uses] %llu live blocks are marked as used on recorded streams, the retirement queue "
                    "records streams for %llu", ULL(w->recorded), ULL(used));
    return check_registry(p, &maps);
}

/* One walk under the pool lock, the slab classes' locks (ascending; the
 * other classes hold no slab) and the retirement queue's (lock.h). */
static fabpool_status check_once(struct fabpool *p, int *suspect)
{
    fp_walk w;
    memset(&w, 0, sizeof w);
    fp_space_walk_init(&p->sp, &w);
    fp_space_lock(&p->sp);
    fp_heap_lock_classes(&p->heap);
    fp_retire_lock(&p->retire);
    fabpool_status st = check_locked(p, &w);
    fp_retire_unlock(&p->retire);
    fp_heap_unlock_classes(&p->heap);
    fp_space_unlock(&p->sp);
    fp_walk_free(&w);
    *suspect = w.suspect;
    return st;
}

fabpool_status fabpool_check(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_check: the pool is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_check");
    uint64_t act = fp_retire_activity(&p->retire);
    int suspect;
    fp_msg_hold h; /* a mismatch that a walk again does not confirm is no failure of the call's */
    fp_error_hold(&h);
    fabpool_status st = check_once(p, &suspect);
    /* more blocks flagged pending than queued, or flagged recorded than the queue records streams for, no
     * other thread's cache listed: a thread without one may be between flagging a block and queueing it (or
     * recording its stream), or between taking it out and clearing its flag, and goes on once the locks are
     * free; a broken flag stays.  Walks again for up to half a second: while the queue moves, the count cannot
     * be confirmed (OK: every queued block is flagged); a mismatch that stays while it does not is reported. */
    for (long ms = 1; suspect && ms <= 256; ms *= 2) {
        struct timespec nap = {0, ms * 1000000};
        nanosleep(&nap, NULL);
        if (fp_retire_activity(&p->retire) != act) {
            st = FABPOOL_OK;
            break;
        }
        st = check_once(p, &suspect);
    }
    return fp_error_unhold(&h, st);
}
