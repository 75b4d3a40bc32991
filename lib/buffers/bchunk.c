/* bchunk.c - the pool's buffers set up and their counters read; the
 * chunks of growable buffers once mapped: taking one out (unmapped), the
 * holds that keep dropped chunks importable for the peers, and the
 * collection of retired chunks and destroyed buffers (their handles' slots
 * freed: handles.h), and a kept buffer moved to a new handle.  Growing,
 * refitting and shrinking, which add and retire chunks, are in buffer.c. */
#include "bchunk.h"

#include <string.h>

#include "array.h"
#include "counter.h"
#include "error.h"
#include "handles.h"
#include "list.h"
#include "vmm.h"

void fp_buffers_init(fp_buffers *bs, fp_heap *heap, fp_retire *retire, fp_usage *use, const fabpool_options *o)
{
    bs->heap = heap;
    bs->retire = retire;
    bs->use = use;
    use->buffers = &bs->bytes;
    bs->sp = heap->sp;
    bs->max_chunk = o->max_chunk_bytes;
    bs->max_waste_percent = o->max_waste_percent;
    bs->shrink_hysteresis_percent = o->shrink_hysteresis_percent;
    bs->keep_ms = o->keep_ms;
}

void fp_buffers_set_trace(fp_buffers *bs, struct fp_trace *trace) { bs->trace = trace; }


void fp_buffers_read_counters(const fp_buffers *src, fp_buffer_counters *c)
{
    FP_BUFFERS_COUNTERS(FP_COUNTER_COPY)
}

int fp_buffer_reserve_chunks(fp_buffers *bs, struct fabpool_buffer *b, uint32_t n)
{
    fp_lock_assert_held(&bs->sp->lock);
    return FP_ARRAY_RESERVE(bs->sp->meta, b->chunks, b->n, b->cap, n, 8);
}

void fp_buffer_free(fp_buffers *bs, struct fabpool_buffer *b)
{
    FP_LIST_REMOVE(&bs->list, b, next, prev);
    fp_space_free_range(bs->sp, b->base, b->window);
    FP_ARRAY_FREE(bs->sp->meta, b->chunks, b->cap);
    FP_ARRAY_FREE(bs->sp->meta, b->peer_holds, b->cap_peer_holds);
    fp_handle_free(b, bs->sp->meta);
}

struct fabpool_buffer *fp_buffer_rehandle(fp_buffers *bs, struct fabpool_buffer *b)
{
    fp_lock_assert_held(&bs->sp->lock);
    struct fabpool_buffer *nb = fp_handle_renew(b, FP_HANDLE_BUFFER, sizeof *b);
    if (!nb)
        return NULL;
    FP_LIST_MOVED(&bs->list, nb, next, prev);
    for (uint32_t i = 0; i < nb->n; i++) /* the registry names a buffer chunk's buffer (sleep finds it there) */
        fp_chunk_set_owner(bs->sp->ch, nb->base + nb->chunks[i].off, nb);
    return nb;
}

/* Whether a peer may still import a chunk that a descriptor named (named:
 * the last one's generation, 0: none did) and that generation `dropped`
 * took out of the live chunks: the peers have not acknowledged `dropped` or
 * a later generation.  A peer at the acknowledged generation may still open
 * that generation's descriptor (a view opened again, or a late peer handed
 * it), so what was live then stays importable until the peers acknowledge a
 * generation without it.  A destroy ends that: no descriptor of a destroyed
 * buffer may be opened any more, so only what a descriptor the peers have
 * not applied yet names stays (a peer that applied one maps the chunk
 * itself, and its mapping keeps the memory).  A fabric handle holds no
 * reference, so only this hold keeps a chunk importable; a POSIX fd would
 * keep it too, and it is held the same, so that the rule and the accounting
 * are one for both handle types. */
int fp_buffer_peers_may_hold(const struct fabpool_buffer *b, uint64_t named, uint64_t dropped)
{
    if (!b->shared || !named || b->acked == UINT64_MAX)
        return 0;
    return b->acked < (b->destroyed ? named : dropped);
}

/* Closes the pool's copy of chunk c's exported fd, if it holds one (an open
 * fd keeps the memory alive), and forgets its fabric handle: the chunk is
 * unmapped or replaced. */
void fp_bchunk_forget_export(fp_buffers *bs, fp_bchunk *c)
{
    fp_lock_assert_held(&bs->sp->lock);
    fp_chunk_close_fd(bs->sp->ch, &c->fd);
    c->has_fabric = 0;
}

/* Unmaps chunk i. */
static fabpool_status remove_chunk(fp_buffers *bs, struct fabpool_buffer *b, uint32_t i)
{
    fp_lock_assert_held(&bs->sp->lock);
    fp_bchunk *c = &b->chunks[i];
    fabpool_status st = fp_chunk_unmap(bs->sp->ch, b->base + c->off, c->size);
    if (st != FABPOOL_OK)
        return st;
    fp_bchunk_forget_export(bs, c);
    fp_retire_waits_drop(bs->retire, &c->uses);
    int was_live = !c->retiring;
    if (c->retiring) {
        atomic_fetch_sub(&bs->retiring_bytes, c->size);
    } else {
        b->live -= c->size;
    }
    b->mapped -= c->size;
    atomic_fetch_sub(&bs->mapped, c->size);
    memmove(c, c + 1, (size_t)(b->n - i - 1) * sizeof *c);
    b->n--;
    if (was_live)
        b->generation++; /* a live chunk went (undo of a grow): peers must hear of it */
    return FABPOOL_OK;
}

/* Unmaps the last chunk. */
fabpool_status fp_buffer_pop_chunk(fp_buffers *bs, struct fabpool_buffer *b)
{
    fp_lock_assert_held(&bs->sp->lock);
    return remove_chunk(bs, b, b->n - 1);
}

fabpool_status fp_buffer_peer_hold_add(fp_buffers *bs, struct fabpool_buffer *b, fp_peer_hold g)
{
    fp_lock_assert_held(&bs->sp->lock);
    if (FP_ARRAY_RESERVE(bs->sp->meta, b->peer_holds, b->n_peer_holds, b->cap_peer_holds, b->n_peer_holds + 1, 4) != 0)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's list of chunks its peers hold");
    b->peer_holds[b->n_peer_holds++] = g;
    atomic_fetch_add(&bs->held_for_peers_bytes, g.size);
    return FABPOOL_OK;
}

/* Releases the peer holds no peer can still import (all of them with all != 0). */
void fp_buffer_peer_holds_release(fp_buffers *bs, struct fabpool_buffer *b, int all)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < b->n_peer_holds; i++) {
        fp_peer_hold *g = &b->peer_holds[i];
        if ((all || !fp_buffer_peers_may_hold(b, g->named, g->dropped)) && fp_chunk_release(bs->sp->ch, g->h) == CUDA_SUCCESS) {
            atomic_fetch_sub(&bs->held_for_peers_bytes, g->size);
            continue;
        }
        b->peer_holds[w++] = *g;
    }
    b->n_peer_holds = w;
}

/* Whether retired chunk c may be unmapped now: the GPU work of every stream
 * that may use it is done (waited for with wait != 0; the retirement queue
 * knows, retire.h) and no peer may still import it.  1 yes, 0 not yet, -1
 * the driver failed (*st says how). */
static int retired_done(fp_buffers *bs, struct fabpool_buffer *b, fp_bchunk *c, int wait, fabpool_status *st)
{
    if (fp_buffer_peers_may_hold(b, c->named, c->drop_gen))
        return 0;
    return fp_retire_waits_done(bs->retire, &c->uses, wait, st);
}

int fp_buffers_reserve_stuck(fp_buffers *bs)
{
    fp_lock_assert_held(&bs->sp->lock);
    return FP_ARRAY_RESERVE(bs->sp->meta, bs->stuck, bs->n_stuck, bs->cap_stuck, bs->n_stuck + 1, 2);
}

/* Unmaps the shrinks' copies the driver refused before, and frees their address ranges: FABPOOL_OK, or the
 * first refusal (the copy stays for the next collect). */
static fabpool_status unmap_stuck(fp_buffers *bs)
{
    fabpool_status first = FABPOOL_OK;
    uint32_t w = 0;
    for (uint32_t i = 0; i < bs->n_stuck; i++) {
        fp_stuck_copy c = bs->stuck[i];
        CUresult r = fp_vmm_unmap(bs->sp->ch, c.va, c.size);
        if (r == CUDA_SUCCESS) {
            fp_va_free(&bs->sp->va, c.va, c.size);
            continue;
        }
        if (first == FABPOOL_OK)
            first = fp_drv_error(r, "cuMemUnmap", "unmapping the copy of a shrunk buffer's chunk (%llu bytes at "
                                 "0x%llx) that the driver refused before; fabpool_collect tries again",
                                 (unsigned long long)c.size, (unsigned long long)c.va);
        bs->stuck[w++] = c;
    }
    bs->n_stuck = w;
    return first;
}

/* Unmaps the shrinks' stuck copies and the mappings the driver would not
 * unmap before (space.h: fp_space_unstick), then retired chunks whose event has
 * completed (all of them, waiting, with wait != 0) and that no peer may
 * still import: from each live buffer's end down (a grow maps behind the
 * live chunks), anywhere in a destroyed one.  Frees destroyed buffers that
 * hold nothing any more. */
fabpool_status fp_collect_locked(fp_buffers *bs, int wait)
{
    fp_lock_assert_held(&bs->sp->lock);
    fabpool_status first = unmap_stuck(bs), st0 = fp_space_unstick(bs->sp); /* the device layer's stuck ones too */
    first = first != FABPOOL_OK ? first : st0;
    struct fabpool_buffer *b = bs->list, *next;
    for (; b; b = next) {
        next = b->next;
        fp_buffer_peer_holds_release(bs, b, 0);
        /* live chunks a grow took back while a stream's work may still use them: what is done is forgotten
         * (with wait, after waiting), so that a later unmap finds only what still runs */
        for (uint32_t i = 0; i < b->n; i++) {
            fp_bchunk *c = &b->chunks[i];
            fabpool_status st = FABPOOL_OK;
            if (!c->retiring && fp_retire_waits_count(&c->uses) &&
                fp_retire_waits_done(bs->retire, &c->uses, wait, &st) < 0 && first == FABPOOL_OK)
                first = st;
        }
        for (uint32_t i = b->n; i-- > 0;) {
            fp_bchunk *c = &b->chunks[i];
            if (!c->retiring) {
                if (b->destroyed)
                    continue;
                break;
            }
            fabpool_status st = FABPOOL_OK;
            int done = retired_done(bs, b, c, wait, &st);
            if (done == 1)
                st = remove_chunk(bs, b, i);
            if (st != FABPOOL_OK && first == FABPOOL_OK)
                first = st;
            if (done != 1 || st != FABPOOL_OK) {
                if (!b->destroyed)
                    break;
            }
        }
        if (b->destroyed && b->n == 0 && b->n_peer_holds == 0)
            fp_buffer_free(bs, b);
    }
    return first;
}

fabpool_status fp_buffers_collect(fp_buffers *bs, int wait)
{
    if (!bs)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_collect: the pool is NULL");
    fp_lock(&bs->sp->lock);
    fabpool_status st = fp_collect_locked(bs, wait);
    fp_unlock(&bs->sp->lock);
    return st;
}
