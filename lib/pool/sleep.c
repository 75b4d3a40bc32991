/* sleep.c - fabpool_sleep / fabpool_wake: every mapping of the device
 * layer's registry that sleeps (mapreg.h: the arenas' chunks and the
 * buffers' chunks; views of peers' memory stay) unmapped and its physical
 * memory released, its bytes copied to pinned host memory first (offload,
 * the mappings the registry marks copy) or dropped (discard, and the
 * buffers' retired chunks); wake maps fresh memory at the same addresses,
 * in the same chunks, and copies the bytes back.  Sleep walks the registry
 * only, never the heap's or the buffers' lists.
 *
 * The record of a sleep is a list of those mappings, sorted by address,
 * each MAPPED (awake), ASLEEP (unmapped, out of the registry, maybe with a
 * host copy) or GONE (freed while asleep: a trim or a buffer's unmap went
 * through fp_chunk_unmap, which marks it instead of calling the driver:
 * chunk.c keeps a pointer to the list for that).  Each keeps its registry
 * entry, which wake adds again.  Nothing else of the pool changes: slabs,
 * arena blocks, buffers and the page map stay as they are, so every
 * pointer stays valid; a buffer's chunk only closes the fd it exported at
 * sleep and is named anew at wake (buffer_sleep.h).
 *
 * Host copies are VMM host NUMA memory (cuMemCreate with
 * CU_MEM_LOCATION_TYPE_HOST_NUMA, the node next to the device), one per
 * chunk, mapped in a reservation of their own and given device access, so
 * that the copies both ways are device-to-device copies on the caller's
 * stream and every piece is released like any chunk: unmapped, it is gone.
 *
 * With sleep_keep_host, wake keeps the host copies (their pieces and their
 * reservation: struct fp_host_cache) instead of freeing them, and the next
 * offload uses them again when every chunk to copy finds an unused piece of
 * its size and no piece is left over (what a loop that sleeps the same
 * memory again sees); else they are freed and made anew.  Pinning host
 * memory is most of an offload's time on the H200 (docs/integration.md), as
 * PyTorch's cached pinned memory spares vLLM's later sleeps.  fabpool_trim
 * and destroy free them.
 *
 * Failures: a mapping the driver would not unmap before (stuck) is unmapped
 * first, and a refusal there fails the sleep with nothing changed; a sleep
 * that fails before it unmaps anything undoes its host copies (the pool is
 * as before, the trimmed cache excepted; what the driver would not unmap of
 * them goes to the kept host copies, freed later); a failure while
 * unmapping wakes the chunks already unmapped where that gives them back as
 * they were (offload: their copies are there; discard: none unmapped yet),
 * and otherwise (discard: their contents are gone) goes on, the pool asleep
 * with the refused chunks mapped (FABPOOL_ERR_PARTIAL, as when that wake
 * fails).  A wake that fails (device memory) stops where it is: the chunks
 * mapped stay mapped, the rest stay asleep with their copies, and the next
 * fabpool_wake goes on from there. */
#include <stdlib.h>
#include <string.h>

#include "buffer_sleep.h"
#include "error.h"
#include "pool.h"
#include "host_copy.h"
#include "sleep.h"

/* The asleep state every layer reads (chunk.h), and the thread caches'
 * epoch bit that makes every fast path miss (alloc.h). */
static void set_asleep(struct fabpool *p, int asleep)
{
    fp_chunk_set_asleep(&p->ch, asleep);
    fp_alloc_set_asleep(&p->alloc, asleep);
}

/* The record in force (NULL: none), here and in chunk.c, which consults it on
 * every unmap.  Pool lock held. */
static void set_record(struct fabpool *p, struct fp_sleep *r)
{
    p->sleep = r;
    fp_chunk_set_slept(&p->ch, r ? r->e : NULL, r ? r->n : 0);
}

/* Every mapping of the registry that sleeps, in its (address) order.  Pool lock held. */
static struct fp_sleep *record_new(struct fabpool *p, fabpool_sleep_mode mode, fabpool_status *st)
{
    size_t n = 0, n_maps = 0;
    const fp_mapping *m = fp_chunk_mappings(&p->ch, &n_maps);
    for (size_t i = 0; i < n_maps; i++)
        n += FP_MAP_SLEEPS(m[i].kind);
    struct fp_sleep *r = fp_meta_alloc(&p->meta, sizeof *r);
    fp_slept *e = n ? fp_meta_alloc(&p->meta, n * sizeof *e) : NULL;
    if (!r || (n && !e)) {
        fp_meta_free(&p->meta, r, sizeof *r);
        fp_meta_free(&p->meta, e, n * sizeof *e);
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_sleep: no host memory for the list of %zu chunks to put to "
                       "sleep; the pool stays awake", n);
        return NULL;
    }
    memset(r, 0, sizeof *r);
    if (n)
        memset(e, 0, n * sizeof *e);
    int copy = mode == FABPOOL_SLEEP_OFFLOAD;
    size_t k = 0;
    for (size_t i = 0; i < n_maps; i++)
        if (FP_MAP_SLEEPS(m[i].kind))
            e[k++] = (fp_slept){.va = m[i].va, .size = m[i].size, .m = m[i], .copy = (uint8_t)(copy && m[i].copy)};
    r->e = e;
    r->n = n;
    return r;
}

static void record_free(struct fabpool *p, struct fp_sleep *r)
{
    fp_meta_free(&p->meta, r->e, r->n * sizeof *r->e);
    fp_meta_free(&p->meta, r, sizeof *r);
}

/* Copies chunk e's host copy back in (e mapped again, UNRESTORED).  On a failure e is unmapped again (ASLEEP), or,
 * where the driver refuses that too, stays mapped and UNRESTORED for the next wake to copy in: either way its host
 * copy stays, and the message is the copy's. */
static fabpool_status restore(struct fabpool *p, fp_slept *e, void *stream)
{
    CUresult cr = fp_device_copy(&p->ch, e->va, e->host_va, e->size, stream);
    if (cr == CUDA_SUCCESS)
        return FABPOOL_OK;
    fabpool_status st = fp_drv_error(cr, "cuMemcpyDtoDAsync", "copying a chunk of %llu bytes back from host memory",
                                     (unsigned long long)e->size);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    e->state = FP_SL_MAPPED; /* for fp_chunk_unmap: a mapping to unmap, not one to forget */
    if (fp_chunk_unmap(&p->ch, e->va, e->size) == FABPOOL_OK) {
        e->state = FP_SL_ASLEEP;
        return fp_error(st, "%s", msg);
    }
    e->state = FP_SL_UNRESTORED;
    return fp_error(st, "%s; the chunk stays mapped (its unmap was refused too) and the next fabpool_wake copies "
                    "it in", msg);
}

/* Maps every sleeping chunk again, restores its copy, and frees the copies
 * and the record.  Stops at the first failure (the pool stays asleep; a
 * retry goes on).  Pool lock held, context current. */
static fabpool_status wake_locked(struct fabpool *p, void *stream)
{
    struct fp_sleep *r = p->sleep;
    /* memory freed while asleep is not mapped again: a buffer's retired
     * chunks and the cache go (chunk.c marks them GONE); a failure here only leaves
     * more to map */
    fp_msg_hold mh;
    fp_error_hold(&mh);
    (void)fp_collect_locked(&p->bufs, 1);
    fp_error_unhold(&mh, FABPOOL_OK);
    fp_heap_trim_locked(&p->heap, 0);
    fabpool_status st = FABPOOL_OK;
    size_t done = 0, todo = 0;
    for (size_t i = 0; i < r->n; i++)
        todo += r->e[i].state == FP_SL_ASLEEP || r->e[i].state == FP_SL_UNRESTORED;
    for (size_t i = 0; i < r->n && st == FABPOOL_OK; i++) {
        fp_slept *e = &r->e[i];
        if (e->state == FP_SL_ASLEEP) {
            CUmemGenericAllocationHandle h = 0;
            if ((st = fp_heap_chunk_create(&p->heap, e->size, &h)) != FABPOOL_OK)
                break;
            if (e->state != FP_SL_ASLEEP) { /* the create's trim on OOM gave it up: it was free */
                fp_chunk_release(&p->ch, h);
                continue;
            }
            if ((st = fp_chunk_map_handle(&p->ch, e->va, e->size, h, fp_slept_kind(e), fp_slept_owner(e),
                                          "a chunk of a pool waking up")) != FABPOOL_OK)
                break;
            fp_chunk_set_copy(&p->ch, e->va, fp_slept_copies(e));
            e->state = FP_SL_UNRESTORED;
        } else if (e->state != FP_SL_UNRESTORED) {
            continue;
        }
        if (e->host_va && (st = restore(p, e, stream)) != FABPOOL_OK)
            break;
        e->state = FP_SL_MAPPED;
        if (fp_slept_kind(e) == FP_MAP_BUFFER)
            fp_buffer_chunk_renewed(fp_slept_owner(e), e->va);
        done++;
    }
    if (st == FABPOOL_OK)
        st = r->retry ? fp_sleep_sync(p, NULL, "restoring the offloaded contents")
                      : fp_sleep_sync(p, stream, "restoring the offloaded contents");
    if (st == FABPOOL_OK)
        st = p->opt.sleep_keep_host ? fp_host_keep(p, r) : fp_host_release(p, r);
    if (st != FABPOOL_OK) {
        r->retry = 1;
        fp_error_append(" (fabpool_wake: %zu of %zu chunks were mapped again with their contents; the pool stays "
                        "asleep and keeps the host copies: call fabpool_wake again to go on)", done, todo);
        return st;
    }
    set_record(p, NULL);
    record_free(p, r);
    set_asleep(p, 0);
    atomic_fetch_add(&p->wakes, 1);
    FP_LOG_CH(FP_LOG_INFO, &p->ch, "wake: %zu chunks mapped again, %llu bytes restored from host memory; %llu bytes "
              "of pinned host memory kept; the pool maps %llu", done,
              (unsigned long long)atomic_load(&p->sleep_offloaded), (unsigned long long)atomic_load(&p->sleep_host_bytes),
              (unsigned long long)fp_chunks_mapped(&p->ch, NULL));
    return FABPOOL_OK;
}

/* Why the pool may not sleep now (a status with its message), or OK. */
static fabpool_status sleep_refused_locked(struct fabpool *p)
{
    fp_space_assert_locked(&p->sp);
    if (fp_chunks_asleep(&p->ch))
        return fp_error(FABPOOL_ERR_ASLEEP, "fabpool_sleep: the pool is already asleep; call fabpool_wake first");
    return fp_buffers_sleep_refused(&p->bufs);
}

/* A refused unmap of a sleep rolled back: the chunks already unmapped are
 * woken again (a rollback, not a wake), the pool awake with the unmap's
 * status and message (msg).  Where that wake fails too, the pool stays
 * asleep for fabpool_wake to complete: FABPOOL_ERR_PARTIAL.  Pool lock
 * held, context current. */
static fabpool_status roll_back(struct fabpool *p, fabpool_status st, const char *msg, fabpool_sleep_mode mode,
                                void *stream)
{
    fabpool_status wst = wake_locked(p, stream);
    if (wst != FABPOOL_OK)
        return fp_error(FABPOOL_ERR_PARTIAL, "%s (after: %s)", fabpool_last_error(), msg);
    atomic_fetch_sub(&p->wakes, 1);
    if (mode == FABPOOL_SLEEP_OFFLOAD)
        return fp_error(st, "%s; the chunks already unmapped were mapped again with their contents: the pool is "
                        "awake, as before", msg);
    return fp_error(st, "%s; it was the first chunk, nothing was dropped: the pool is awake, as before", msg);
}

/* Unmaps every chunk of record r (set as the pool's), counting what was
 * offloaded and what discarded.  A chunk the driver refuses to unmap rolls
 * the sleep back where that is exact: with offload (the copies of the
 * chunks unmapped are there), with discard while no chunk was unmapped yet.
 * A discard sleep that has dropped contents goes on instead (waking fresh
 * memory under live blocks would hand them out changed): the refused
 * chunks stay mapped, the rest go, and the pool is asleep with
 * FABPOOL_ERR_PARTIAL.  Pool lock held, context current. */
static fabpool_status unmap_recorded(struct fabpool *p, struct fp_sleep *r, fabpool_sleep_mode mode, void *stream)
{
    uint64_t off = 0, drop = 0, kept = 0;
    size_t gone = 0, refused = 0;
    char first[1024] = "";
    set_record(p, r);
    for (size_t i = 0; i < r->n; i++) {
        fp_slept *e = &r->e[i];
        if (fp_slept_kind(e) == FP_MAP_BUFFER) /* an exported fd the pool holds would keep the memory */
            fp_buffer_chunk_slept(fp_slept_owner(e), e->va);
        fabpool_status st = fp_chunk_unmap(&p->ch, e->va, e->size);
        if (st != FABPOOL_OK) {
            fp_error_append(" to put it to sleep (tried twice)");
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fabpool_last_error());
            if (mode == FABPOOL_SLEEP_OFFLOAD || !gone)
                return roll_back(p, st, msg, mode, stream);
            if (!refused++)
                snprintf(first, sizeof first, "%s", msg);
            kept += e->size; /* mapped still, as in the record (FP_SL_MAPPED): wake leaves it */
            continue;
        }
        e->state = FP_SL_ASLEEP; /* fp_chunk_unmap counted it */
        gone++;
        if (e->host_va)
            off += e->size;
        else
            drop += e->size;
    }
    atomic_store(&p->sleep_offloaded, off);
    atomic_store(&p->sleep_discarded, drop);
    atomic_store(&p->sleep_mode, (int)mode);
    atomic_fetch_add(&p->sleeps, 1);
    FP_LOG_CH(FP_LOG_INFO, &p->ch, "sleep (%s): %llu bytes offloaded to host memory, %llu discarded; %llu bytes of "
              "pinned host memory held (%llu of them reused from the last wake); the pool maps %llu",
              mode == FABPOOL_SLEEP_OFFLOAD ? "offload" : "discard", (unsigned long long)off,
              (unsigned long long)drop, (unsigned long long)atomic_load(&p->sleep_host_bytes),
              (unsigned long long)atomic_load(&p->sleep_host_reused), (unsigned long long)fp_chunks_mapped(&p->ch, NULL));
    if (refused)
        return fp_error(FABPOOL_ERR_PARTIAL, "%s; the discard sleep had dropped the contents of %zu chunk%s (%llu "
                        "bytes) and went on: the pool is asleep, and the %zu chunk%s (%llu bytes) the driver would "
                        "not unmap stay mapped; fabpool_wake maps the rest again (discarded contents unspecified)",
                        first, gone, gone == 1 ? "" : "s", (unsigned long long)drop, refused,
                        refused == 1 ? "" : "s", (unsigned long long)kept);
    return FABPOOL_OK;
}

static fabpool_status sleep_pool(fabpool_t *p, fabpool_sleep_mode mode, void *stream)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_sleep: the pool is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_sleep");
    if (mode != FABPOOL_SLEEP_DISCARD && mode != FABPOOL_SLEEP_OFFLOAD)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_sleep: mode %d is neither FABPOOL_SLEEP_DISCARD (0) nor "
                        "FABPOOL_SLEEP_OFFLOAD (1)", (int)mode);
    /* the refusals first (nothing changes), then the blocks freed on streams
     * (pending.h): their streams' work is waited for and they go back to the
     * pool, so that they are free memory (trimmed below, not offloaded) and no
     * queued kernel reads memory that sleep unmaps; the drain takes the pool
     * lock itself, so the refusals are checked again after it */
    for (int pass = 0; pass < 2; pass++) {
        fp_space_lock(&p->sp);
        fabpool_status rst = sleep_refused_locked(p);
        if (rst != FABPOOL_OK || pass == 1) {
            if (rst != FABPOOL_OK) {
                fp_space_unlock(&p->sp);
                return rst;
            }
            break;
        }
        fp_space_unlock(&p->sp);
        fp_alloc_drain(&p->alloc, 1, 0);
    }
    CUcontext saved;
    fabpool_status st = fp_ctx_push(&p->ch, &saved);
    if (st != FABPOOL_OK) {
        fp_space_unlock(&p->sp);
        return st;
    }
    if ((st = fp_sleep_sync(p, stream, "before the pool goes to sleep (nothing changed)")) != FABPOOL_OK)
        goto out;
    /* a mapping the driver would not unmap before (mapreg.h: stuck) holds memory for the pool too, and a sleep
     * gives back all of it or nothing (as a chunk whose unmap is refused wakes the rest again): unmapped first,
     * or the sleep fails before it changes anything */
    if ((st = fp_space_unstick(&p->sp)) != FABPOOL_OK) {
        fp_error_append(" (fabpool_sleep: a sleeping pool would still hold that memory; the pool stays awake and "
                        "nothing changed: call fabpool_sleep again)");
        goto out;
    }
    /* from here on every thread cache misses, allocation fails */
    set_asleep(p, 1);
    fp_alloc_thread_flush_locked(&p->alloc);
    struct fp_sleep *r = NULL;
    fp_buffers_drop_kept(&p->bufs, 1); /* what was kept for reuse goes, not to the host */
    fp_views_drop_kept(&p->views, 1);
    if ((st = fp_collect_locked(&p->bufs, 1)) != FABPOOL_OK) {
        fp_error_append(" (fabpool_sleep: collecting retired buffer chunks; the pool stays awake)");
        goto awake;
    }
    fp_heap_trim_locked(&p->heap, 0);
    if (!(r = record_new(p, mode, &st)))
        goto awake;
    atomic_store(&p->sleep_host_reused, 0);
    if (mode == FABPOOL_SLEEP_OFFLOAD && (st = fp_host_offload(p, r, stream)) != FABPOOL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fabpool_last_error());
        int left = fp_host_give_up(p, r);
        if (left >= 0)
            record_free(p, r);
        /* else: no host memory to keep what the driver would not unmap: it stays mapped, in a record no one
         * frees (nothing better to do) */
        st = fp_error(st, "%s%s", msg, left == 0 ? "" : left > 0 ? " (the driver would not unmap every host copy "
                      "made: what it keeps stays mapped until fabpool_trim, the next sleep with offload or "
                      "fabpool_destroy frees it)" : " (the driver would not unmap every host copy made, and no "
                      "host memory was left to list them: they stay mapped)");
        goto awake;
    }
    st = unmap_recorded(p, r, mode, stream);
    goto out;
awake:
    set_asleep(p, 0);
out:
    fp_ctx_pop(&p->ch, saved);
    fp_space_unlock(&p->sp);
    return st;
}

/* A failure that the sleep or the wake recovers from on the way (a collect left for later) is not the call's. */
fabpool_status fabpool_sleep(fabpool_t *p, fabpool_sleep_mode mode, void *stream)
{
    fp_msg_hold h;
    fp_error_hold(&h);
    return fp_error_unhold(&h, sleep_pool(p, mode, stream));
}

static fabpool_status wake(fabpool_t *p, void *stream)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_wake: the pool is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_wake");
    fp_space_lock(&p->sp);
    if (!p->sleep) {
        fp_space_unlock(&p->sp);
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_wake: the pool is not asleep (fabpool_sleep first); "
                        "nothing changed");
    }
    CUcontext saved;
    fabpool_status st = fp_ctx_push(&p->ch, &saved);
    if (st == FABPOOL_OK) {
        st = wake_locked(p, stream);
        fp_ctx_pop(&p->ch, saved);
    }
    fp_space_unlock(&p->sp);
    if (st == FABPOOL_OK)
        fp_heap_trim_policy(&p->heap);
    return st;
}

fabpool_status fabpool_wake(fabpool_t *p, void *stream)
{
    fp_msg_hold h;
    fp_error_hold(&h);
    return fp_error_unhold(&h, wake(p, stream));
}

fabpool_status fabpool_sleep_state(fabpool_t *p, fabpool_sleep_info *out)
{
    fabpool_status st = fp_getter_begin("fabpool_sleep_state", "fabpool_sleep_info", p, out, sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_sleep_state");
    fp_space_lock(&p->sp);
    out->asleep = p->sleep != NULL;
    fp_space_unlock(&p->sp);
    out->mode = (fabpool_sleep_mode)atomic_load(&p->sleep_mode);
    out->offloaded_bytes = atomic_load(&p->sleep_offloaded);
    out->discarded_bytes = atomic_load(&p->sleep_discarded);
    out->host_bytes = atomic_load(&p->sleep_host_bytes);
    out->host_copies = atomic_load(&p->sleep_host_copies);
    out->sleeps = atomic_load(&p->sleeps);
    out->wakes = atomic_load(&p->wakes);
    out->host_reused_bytes = atomic_load(&p->sleep_host_reused);
    return FABPOOL_OK;
}

fabpool_status fp_sleep_host_trim(struct fabpool *p)
{
    fp_space_assert_locked(&p->sp);
    return fp_host_cache_release(p);
}

void fp_sleep_free(struct fabpool *p)
{
    fp_host_cache_release(p);
    struct fp_sleep *r = p->sleep;
    if (!r)
        return;
    set_record(p, NULL);
    if (fp_host_release(p, r) == FABPOOL_OK)
        record_free(p, r);
}

void fp_sleep_unmapped(const struct fabpool *p, uint64_t *count, uint64_t *bytes)
{
    for (int k = 0; k < FP_MAP_KINDS; k++)
        count[k] = bytes[k] = 0;
    if (!p->sleep)
        return;
    for (size_t i = 0; i < p->sleep->n; i++)
        if (p->sleep->e[i].state == FP_SL_ASLEEP) {
            count[fp_slept_kind(&p->sleep->e[i])]++;
            bytes[fp_slept_kind(&p->sleep->e[i])] += p->sleep->e[i].size;
        }
}
