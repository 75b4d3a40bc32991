/* refit.c - a shrink's refit (refit.h): the last chunk a buffer still
 * needs, which reaches beyond the hysteresis, replaced by a smaller chunk at
 * the same address, its bytes below the new size copied in; the chunks after
 * it unmapped.  The memory a peer may still import is kept for it first. */
#include "refit.h"

#include <stdio.h>
#include <string.h>

#include "error.h"
#include "vmm.h"

fabpool_status fp_buffers_sync(fp_buffers *bs, void *stream, const char *why)
{
    CUresult r = stream ? FP_CU(&bs->sp->ch->calls, cuStreamSynchronize, (CUstream)stream) : FP_CU(&bs->sp->ch->calls, cuCtxSynchronize);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, stream ? "cuStreamSynchronize" : "cuCtxSynchronize", "waiting for GPU work %s", why);
    return FABPOOL_OK;
}

/* Keeps the memory of chunk c, dropped at generation `dropped` (handle h,
 * retained by the caller), for the peers that may still import it; returns
 * 0 if no peer may (the caller releases h).  Its exported fd, if the pool
 * still holds one, is closed when the chunk is unmapped, as for any chunk
 * (fabpool.h). */
static int peer_hold_keep(fp_buffers *bs, struct fabpool_buffer *b, fp_bchunk *c, uint64_t dropped,
                      CUmemGenericAllocationHandle h)
{
    fp_lock_assert_held(&bs->sp->lock);
    return fp_buffer_peers_may_hold(b, c->named, dropped) &&
           fp_buffer_peer_hold_add(bs, b, (fp_peer_hold){h, c->size, c->named, dropped}) == FABPOOL_OK;
}

/* Moves chunk c's memory, dropped at generation `dropped`, to the peer holds
 * when a peer may still import it, so that unmapping it here does not free
 * it. */
static fabpool_status keep_for_peers(fp_buffers *bs, struct fabpool_buffer *b, fp_bchunk *c, uint64_t dropped)
{
    fp_lock_assert_held(&bs->sp->lock);
    if (!fp_buffer_peers_may_hold(b, c->named, dropped))
        return FABPOOL_OK;
    CUmemGenericAllocationHandle h = 0;
    fabpool_status st = fp_chunk_retain(bs->sp->ch, b->base + c->off, &h, "keeping a chunk its peers may import");
    if (st != FABPOOL_OK)
        return st;
    if (!peer_hold_keep(bs, b, c, dropped, h)) {
        fp_chunk_release(bs->sp->ch, h);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's list of chunks its peers hold");
    }
    return FABPOOL_OK;
}

/* Refit's copy: the bytes of chunk j below target into the new chunk mapped at
 * tmp, on `stream`; then waits for that stream (NULL: the context) and for the
 * work of the other streams that may use j or the chunks after it (retired on
 * them, or retired and taken back since). */
static fabpool_status refit_copy(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t tmp, uint64_t target,
                                 void *stream)
{
    const fp_bchunk *c = &b->chunks[j];
    CUresult r = FP_CU(&bs->sp->ch->calls, cuMemcpyDtoDAsync, (CUdeviceptr)tmp, (CUdeviceptr)(b->base + c->off),
                       target - c->off, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemcpyDtoDAsync", "copying %llu bytes of a shrunk buffer into its smaller chunk",
                            (unsigned long long)(target - c->off));
    fabpool_status st = fp_buffers_sync(bs, stream, "before a shrunk buffer's chunk is replaced");
    for (uint32_t i = j; i < b->n && st == FABPOOL_OK; i++)
        if (fp_retire_waits_done(bs->retire, &b->chunks[i].uses, 1, &st) < 0)
            fp_error_append(" (a chunk of a buffer being shrunk, retired on another stream)");
    return st;
}

/* Refit's swap: chunk j's old memory (held by ho as well) unmapped and the
 * new chunk hn of rs bytes mapped at its address; a failed map maps the old
 * one back (*lost = 1 where that fails too). */
static fabpool_status refit_swap(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs,
                                 CUmemGenericAllocationHandle hn, CUmemGenericAllocationHandle ho, int *lost)
{
    fp_bchunk *c = &b->chunks[j];
    uint64_t at = b->base + c->off, old = c->size;
    fabpool_status st = fp_chunk_unmap(bs->sp->ch, at, old);
    if (st != FABPOOL_OK)
        return st;
    if ((st = fp_chunk_map_access(bs->sp->ch, at, rs, hn, FP_MAP_BUFFER, b, "a shrunk buffer's smaller chunk")) != FABPOOL_OK) {
        if (fp_chunk_map_access(bs->sp->ch, at, old, ho, FP_MAP_BUFFER, b, "a shrunk buffer's chunk, back") == FABPOOL_OK)
            fp_chunk_count_mapped(bs->sp->ch, at, old, "a shrunk buffer's chunk, back");
        else {
            *lost = 1;
            fp_error_append(" (the chunk could not be mapped back either: the buffer lost %llu bytes at offset %llu)",
                            (unsigned long long)old, (unsigned long long)c->off);
        }
        return st;
    }
    fp_chunk_count_mapped(bs->sp->ch, at, rs, "a shrunk buffer's smaller chunk");
    return FABPOOL_OK;
}

/* After refit's swap: chunk j is new (size rs, generation drop_gen; its old
 * memory ho kept for the peers that may still import it, or released), and
 * the chunks after it retire and are unmapped, from the end (their GPU work
 * is done).  A chunk that fails to unmap stays retired: fabpool_collect
 * retries it. */
static fabpool_status refit_finish(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs,
                                   uint64_t drop_gen, CUmemGenericAllocationHandle ho)
{
    fp_bchunk *c = &b->chunks[j];
    uint64_t old = c->size;
    if (!peer_hold_keep(bs, b, c, drop_gen, ho))
        fp_chunk_release(bs->sp->ch, ho);
    fp_bchunk_forget_export(bs, c);
    b->live -= old - rs;
    b->mapped -= old - rs;
    atomic_fetch_sub(&bs->mapped, old - rs);
    c->size = rs;
    c->gen = drop_gen; /* a new chunk: the next delta names it */
    c->named = 0;
    b->generation = drop_gen;
    for (uint32_t i = j + 1; i < b->n; i++) {
        fp_bchunk *t = &b->chunks[i];
        if (t->retiring)
            continue;
        t->retiring = 1;
        fp_chunk_set_copy(bs->sp->ch, b->base + t->off, 0);
        t->drop_gen = drop_gen;
        b->live -= t->size;
        atomic_fetch_add(&bs->retiring_bytes, t->size);
    }
    fabpool_status st = FABPOOL_OK;
    while (b->n > j + 1 && (st = fp_buffer_pop_chunk(bs, b)) == FABPOOL_OK)
        ;
    return st;
}

/* After a swap that lost chunk j (its old memory unmapped, and the driver
 * refused to map the new chunk there and then the old one back): the buffer
 * ends where chunk j began, so that it never counts bytes it does not map.
 * Chunk j's old memory ho is kept for the peers that may still import it (or
 * released), its record goes (its mapping is gone already), and the chunks
 * after it, retiring, their GPU work done and their memory kept for the
 * peers, are unmapped from the end.  One that fails to unmap stays retired
 * for fabpool_collect.  The new generation names the change for the peers. */
static void refit_lose(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t drop_gen,
                       CUmemGenericAllocationHandle ho)
{
    fp_bchunk *c = &b->chunks[j];
    if (!peer_hold_keep(bs, b, c, drop_gen, ho))
        fp_chunk_release(bs->sp->ch, ho);
    fp_bchunk_forget_export(bs, c);
    fp_retire_waits_drop(bs->retire, &c->uses);
    b->live -= c->size;
    b->mapped -= c->size;
    atomic_fetch_sub(&bs->mapped, c->size);
    memmove(c, c + 1, (size_t)(b->n - j - 1) * sizeof *c);
    b->n--;
    b->generation = drop_gen;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", fabpool_last_error());
    while (b->n > j && fp_buffer_pop_chunk(bs, b) == FABPOOL_OK)
        ;
    fp_error(FABPOOL_ERR_DRIVER, "%s", keep); /* what lost the chunk, not a later unmap's refusal */
}

fabpool_status fp_buffer_refit(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs, uint64_t target,
                               void *stream, int *lost)
{
    fp_lock_assert_held(&bs->sp->lock);
    *lost = 0;
    fp_bchunk *c = &b->chunks[j];
    uint64_t at = b->base + c->off, drop_gen = b->generation + 1;
    if (fp_buffers_reserve_stuck(bs) != 0) /* the failure path below records a copy it could not unmap */
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "shrinking a buffer to %llu bytes: no host memory for the list of "
                        "copies to unmap later; nothing was changed", (unsigned long long)target);
    uint64_t tmp = fp_va_alloc(&bs->sp->va, rs, bs->sp->gran);
    if (!tmp)
        return fp_error(FABPOOL_ERR_LIMIT, "shrinking a buffer to %llu bytes: no free address range of %llu bytes "
                        "left in the pool's reservation for the copy; raise reserve", (unsigned long long)target,
                        (unsigned long long)rs);
    CUmemGenericAllocationHandle hn = 0, ho = 0;
    fabpool_status st = fp_heap_chunk_create(bs->heap, rs, &hn);
    if (st != FABPOOL_OK)
        goto free_va;
    if ((st = fp_chunk_map_access(bs->sp->ch, tmp, rs, hn, FP_MAP_STAGING, NULL, "a smaller chunk for a shrunk buffer")) != FABPOOL_OK)
        goto release_new;
    if ((st = refit_copy(bs, b, j, tmp, target, stream)) != FABPOOL_OK)
        goto unmap_tmp;
    /* the old chunk's memory: a handle of our own, to map it back if the swap fails */
    if ((st = fp_chunk_retain(bs->sp->ch, at, &ho, "keeping a shrunk buffer's chunk while it is replaced")) != FABPOOL_OK)
        goto unmap_tmp;

    /* the chunks after j go: their memory first kept for the peers that may
     * still import it, so that a failure before the swap undoes everything */
    uint32_t n0 = b->n_peer_holds;
    for (uint32_t i = j + 1; i < b->n && st == FABPOOL_OK; i++)
        st = keep_for_peers(bs, b, &b->chunks[i], b->chunks[i].retiring ? b->chunks[i].drop_gen : drop_gen);
    if (st != FABPOOL_OK)
        goto drop_peer_holds;

    if ((st = refit_swap(bs, b, j, rs, hn, ho, lost)) != FABPOOL_OK) {
        if (!*lost)
            goto drop_peer_holds;
        refit_lose(bs, b, j, drop_gen, ho);
        goto unmap_tmp;
    }
    st = refit_finish(bs, b, j, rs, drop_gen, ho);
    goto unmap_tmp;

drop_peer_holds:
    while (b->n_peer_holds > n0) {
        fp_peer_hold *g = &b->peer_holds[--b->n_peer_holds];
        fp_chunk_release(bs->sp->ch, g->h);
        atomic_fetch_sub(&bs->held_for_peers_bytes, g->size);
    }
    fp_chunk_release(bs->sp->ch, ho);
unmap_tmp:
    if (fp_vmm_unmap(bs->sp->ch, tmp, rs) != CUDA_SUCCESS) {
        /* the mapping keeps the memory (the handle can go), and the range stays used, until a collect */
        fp_chunk_release(bs->sp->ch, hn);
        bs->stuck[bs->n_stuck++] = (fp_stuck_copy){tmp, rs};
        return st != FABPOOL_OK ? st : fp_error(FABPOOL_ERR_DRIVER, "cuMemUnmap of the copy of a shrunk buffer's "
                                                "chunk failed twice; its %llu bytes stay mapped until "
                                                "fabpool_collect unmaps them", (unsigned long long)rs);
    }
release_new:
    fp_chunk_release(bs->sp->ch, hn);
free_va:
    fp_space_free_range(bs->sp, tmp, rs);
    return st;
}

