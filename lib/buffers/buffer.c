/* buffer.c - growable buffers: an address window of their own, chunks mapped
 * one behind the other, so the base address never changes.  Chunks a shrink
 * gives up retire: they are unmapped once the GPU work that may use them is
 * done, and a grow that comes first takes them back as they are.  Here:
 * growing, refitting and shrinking a buffer, and the buffer API (create,
 * resize, destroy, info); taking chunks out, peer holds and collecting
 * retired chunks are in bchunk.c. */
#include "buffer.h"

#include <string.h>
#include <unistd.h>

#include "array.h"
#include "clock.h"
#include "error.h"
#include "list.h"
#include "log.h"
#include "trace.h"
#include "vmm.h"

/* Size of the next chunk when `live` bytes are mapped and `target` wanted:
 * as large as the waste bound allows (so a growing buffer maps few chunks:
 * each is about a quarter of what is there), never more than max_chunk. */
static uint64_t next_chunk(const fp_buffers *bs, const struct fabpool_buffer *b, uint64_t live, uint64_t target)
{
    uint64_t need = fp_round_up(target - live, bs->sp->gran);
    uint64_t allow = fp_round_up(target + target / 100 * bs->max_waste_percent +
                                 target % 100 * bs->max_waste_percent / 100, bs->sp->gran);
    if (allow > b->window)
        allow = b->window;
    uint64_t room = allow - live, cap = bs->max_chunk;
    if (room > cap)
        room = cap;
    if (need >= cap)
        return cap;
    uint64_t c = fp_class_round_down_gran(room, bs->sp->gran);
    return c >= need ? c : need;
}

/* Grows b's mapping to cover `target`.  On failure everything this call
 * mapped is unmapped again (taken-back retired chunks stay live). */
static fabpool_status grow(fp_buffers *bs, struct fabpool_buffer *b, uint64_t target, uint32_t *mapped_from)
{
    fp_lock_assert_held(&bs->sp->lock);
    *mapped_from = b->n;
    /* take back retired chunks first: they are still mapped, data and all.  The
     * work of the streams they were retired on may still use them: their
     * tickets stay, and whatever unmaps or replaces them later waits for it */
    for (uint32_t i = 0; i < b->n && b->live < target; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (!c->retiring)
            continue;
        if (c->off != b->live)
            break; /* not behind the live chunks (a chunk before it failed to unmap): it cannot come back */
        c->retiring = 0;
        fp_chunk_set_copy(bs->sp->ch, b->base + c->off, 1); /* its bytes matter again */
        b->live += c->size;
        c->gen = ++b->generation; /* back among the live chunks: the next delta names it */
        atomic_fetch_sub(&bs->retiring_bytes, c->size);
    }
    *mapped_from = b->n;
    while (b->live < target) {
        if (b->n && b->chunks[b->n - 1].retiring)
            return fp_error(FABPOOL_ERR_DRIVER, "a retired chunk of the buffer could not be unmapped earlier and "
                            "is in the way of growing it; fabpool_collect retries the unmap");
        uint64_t c = next_chunk(bs, b, b->live, target);
        if (fp_buffer_reserve_chunks(bs, b, b->n + 1) != 0)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's chunk list");
        fabpool_status st = fp_heap_chunk_map(bs->heap, b->base + b->live, c, FP_MAP_BUFFER, b);
        if (st == FABPOOL_ERR_OUT_OF_MEMORY && atomic_load(&bs->kept_bytes)) {
            fp_buffers_drop_kept(bs, 1); /* the heap's retry could not see the kept buffers */
            (void)fp_collect_locked(bs, 0);
            fp_error_clear();
            st = fp_heap_chunk_map(bs->heap, b->base + b->live, c, FP_MAP_BUFFER, b);
        }
        if (st != FABPOOL_OK) {
            fp_error_append(" (growing a buffer from %llu to %llu bytes; it keeps its size and data)",
                            (unsigned long long)b->size, (unsigned long long)target);
            return st;
        }
        b->generation++;
        fp_bchunk *nc = &b->chunks[b->n++];
        memset(nc, 0, sizeof *nc);
        nc->off = b->live;
        nc->size = c;
        nc->gen = b->generation;
        nc->fd = -1;
        b->live += c;
        b->mapped += c;
        atomic_fetch_add(&bs->mapped, c);
    }
    return FABPOOL_OK;
}

static void undo_grow(fp_buffers *bs, struct fabpool_buffer *b, uint32_t mapped_from)
{
    while (b->n > mapped_from)
        if (fp_buffer_pop_chunk(bs, b) != FABPOOL_OK)
            break;
}

/* Waits for the GPU work on `stream` (NULL: the whole context). */
static fabpool_status sync_stream(fp_buffers *bs, void *stream, const char *why)
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
    fabpool_status st = sync_stream(bs, stream, "before a shrunk buffer's chunk is replaced");
    for (uint32_t i = j; i < b->n && st == FABPOOL_OK; i++)
        if (fp_retire_waits_done(bs->retire, &b->chunks[i].uses, 1, &st) < 0)
            fp_error_append(" (a chunk of a buffer being shrunk, retired on another stream)");
    return st;
}

/* Refit's swap: chunk j's old memory (held by ho as well) unmapped and the
 * new chunk hn of rs bytes mapped at its address; a failed map maps the old
 * one back. */
static fabpool_status refit_swap(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs,
                                 CUmemGenericAllocationHandle hn, CUmemGenericAllocationHandle ho)
{
    fp_bchunk *c = &b->chunks[j];
    uint64_t at = b->base + c->off, old = c->size;
    fabpool_status st = fp_chunk_unmap(bs->sp->ch, at, old);
    if (st != FABPOOL_OK)
        return st;
    if ((st = fp_chunk_map_access(bs->sp->ch, at, rs, hn, FP_MAP_BUFFER, b, "a shrunk buffer's smaller chunk")) != FABPOOL_OK) {
        if (fp_chunk_map_access(bs->sp->ch, at, old, ho, FP_MAP_BUFFER, b, "a shrunk buffer's chunk, back") == FABPOOL_OK)
            fp_chunk_count_mapped(bs->sp->ch, at, old, "a shrunk buffer's chunk, back");
        else
            fp_error_append(" (the chunk could not be mapped back either: the buffer lost %llu bytes at offset %llu)",
                            (unsigned long long)old, (unsigned long long)c->off);
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

/* A shrink to `target` whose last needed chunk (index j) holds more than the
 * hysteresis allows: every chunk after j goes, and j is replaced by a chunk
 * of rs bytes at the same address, the data below target copied on `stream`.
 * The copy and the swap wait for the GPU work on `stream` (NULL: the
 * context) and for the retired chunks' events.  On failure before the swap
 * the buffer is as it was.  The pool's context is current. */
static fabpool_status refit(fp_buffers *bs, struct fabpool_buffer *b, uint32_t j, uint64_t rs, uint64_t target,
                            void *stream)
{
    fp_lock_assert_held(&bs->sp->lock);
    fp_bchunk *c = &b->chunks[j];
    uint64_t at = b->base + c->off, drop_gen = b->generation + 1;
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

    if ((st = refit_swap(bs, b, j, rs, hn, ho)) != FABPOOL_OK)
        goto drop_peer_holds;
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
        fp_chunk_release(bs->sp->ch, hn);
        return st != FABPOOL_OK ? st : fp_error(FABPOOL_ERR_DRIVER, "cuMemUnmap of the copy of a shrunk buffer's "
                                                "chunk failed twice; %llu bytes of address space stay used",
                                                (unsigned long long)rs);
    }
release_new:
    fp_chunk_release(bs->sp->ch, hn);
free_va:
    fp_va_free(&bs->sp->va, tmp, rs);
    return st;
}

/* Retires the chunks a buffer of `target` bytes no longer needs, keeping the
 * hysteresis; a last chunk that would leave more than that mapped is replaced
 * by a smaller one (refit).  stream NULL: synchronize and unmap at once.  On
 * failure nothing is retired.  The caller collects afterwards. */
static fabpool_status shrink(fp_buffers *bs, struct fabpool_buffer *b, uint64_t target, void *stream)
{
    fp_lock_assert_held(&bs->sp->lock);
    uint64_t keep = fp_round_up(target + target / 100 * bs->shrink_hysteresis_percent +
                                target % 100 * bs->shrink_hysteresis_percent / 100, bs->sp->gran);
    uint32_t last_live = b->n;
    while (last_live && b->chunks[last_live - 1].retiring)
        last_live--;
    uint32_t first_retire = last_live;
    uint64_t live = b->live;
    while (first_retire && live > keep && live - b->chunks[first_retire - 1].size >= target) {
        first_retire--;
        live -= b->chunks[first_retire].size;
    }
    /* the last chunk still needed reaches beyond the hysteresis: refit it */
    int refit_j = target && live > keep && first_retire > 0;
    if (first_retire == last_live && !refit_j)
        return FABPOOL_OK;
    CUcontext saved;
    fabpool_status st = fp_ctx_push(bs->sp->ch, &saved);
    if (st != FABPOOL_OK)
        return st;
    if (refit_j) {
        fp_bchunk *j = &b->chunks[first_retire - 1];
        st = refit(bs, b, first_retire - 1, keep - j->off, target, stream);
        /* no room or memory for the smaller chunk (refit changed nothing):
         * the chunk stays whole, beyond the hysteresis, until a later
         * shrink refits it, and the shrink goes on without it, so that it
         * fails only where nothing can shrink (a set stays all or nothing) */
        if (st != FABPOOL_ERR_LIMIT && st != FABPOOL_ERR_OUT_OF_MEMORY) {
            fp_ctx_pop(bs->sp->ch, saved);
            return st;
        }
        FP_LOG_CH(FP_LOG_INFO, bs->sp->ch, "a buffer shrunk to %llu bytes keeps a chunk of %llu bytes whole: %s",
                  (unsigned long long)target, (unsigned long long)j->size, fabpool_last_error());
        fp_error_clear();
        if (first_retire == last_live) {
            fp_ctx_pop(bs->sp->ch, saved);
            return FABPOOL_OK;
        }
    }
    if (!stream && (st = sync_stream(bs, NULL, "before unmapping a shrunk buffer's chunks")) != FABPOOL_OK) {
        fp_ctx_pop(bs->sp->ch, saved);
        return st;
    }
    /* room for the ticket in every chunk, then the event (one for every
     * chunk: the retirement queue's ticket), so that a failure retires
     * nothing and the buffer keeps its size */
    for (uint32_t i = first_retire; stream && i < last_live; i++)
        if (fp_retire_waits_reserve(bs->retire, &b->chunks[i].uses) != 0) {
            fp_ctx_pop(bs->sp->ch, saved);
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of streams that use a buffer "
                            "chunk; nothing was retired");
        }
    fp_rticket ticket = {NULL, 0};
    if (stream && (st = fp_retire_mark(bs->retire, stream, last_live - first_retire, &ticket)) != FABPOOL_OK) {
        fp_ctx_pop(bs->sp->ch, saved);
        fp_error_append(" (before retiring a buffer chunk; nothing was retired)");
        return st;
    }
    for (uint32_t i = first_retire; i < last_live; i++) {
        fp_bchunk *c = &b->chunks[i];
        c->retiring = 1;
        fp_chunk_set_copy(bs->sp->ch, b->base + c->off, 0); /* nothing in it to keep through a sleep */
        fp_retire_waits_add(bs->retire, &c->uses, ticket);
        c->drop_gen = b->generation + 1;
        b->live -= c->size;
        atomic_fetch_add(&bs->retiring_bytes, c->size);
    }
    fp_ctx_pop(bs->sp->ch, saved);
    b->generation++; /* the live chunks changed */
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ API */

fabpool_status fp_buffer_create(fp_buffers *bs, size_t max_size, size_t size, fabpool_buffer_t **out)
{
    if (!bs || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: the pool or the output pointer is NULL");
    *out = NULL;
    if (max_size == 0 || size == 0 || size > max_size)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: max_size %zu and size %zu: both must be "
                        "at least 1 and size <= max_size", max_size, size);
    if (max_size > fp_space_size(bs->sp) - bs->sp->gran)
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: max_size %zu is larger than the pool's "
                        "reserved address space (%llu bytes); raise reserve", max_size,
                        (unsigned long long)fp_space_size(bs->sp));
    struct fabpool_buffer *b = fp_meta_alloc(bs->sp->meta, sizeof *b);
    if (!b)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer");
    b->owner = bs;
    b->window = fp_round_up(max_size, bs->sp->gran);
    static _Atomic uint64_t uids;
    b->uid = ((uint64_t)getpid() << 32) ^ (atomic_fetch_add(&uids, 1) + 1) ^ ((uint64_t)(uintptr_t)b << 12);
    fp_lock(&bs->sp->lock);
    b->base = fp_va_alloc(&bs->sp->va, b->window, bs->sp->gran);
    if (!b->base) {
        fp_unlock(&bs->sp->lock);
        fp_meta_free(bs->sp->meta, b, sizeof *b);
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: no free address range of %llu bytes left in the "
                        "pool's reservation of %llu bytes; raise reserve", (unsigned long long)b->window,
                        (unsigned long long)fp_space_size(bs->sp));
    }
    if (fp_chunks_asleep(bs->sp->ch)) {
        fp_va_free(&bs->sp->va, b->base, b->window);
        fp_unlock(&bs->sp->lock);
        fp_meta_free(bs->sp->meta, b, sizeof *b);
        return fp_chunk_asleep_error("fabpool_buffer_create");
    }
    FP_LIST_PUSH(&bs->list, b, next, prev);
    atomic_fetch_add(&bs->count, 1);
    uint32_t from;
    fabpool_status st = grow(bs, b, size, &from);
    if (st != FABPOOL_OK) {
        undo_grow(bs, b, from);
        fp_buffer_free(bs, b);
        atomic_fetch_sub(&bs->count, 1);
        fp_unlock(&bs->sp->lock);
        return st;
    }
    b->size = size;
    atomic_fetch_add(&bs->bytes, size);
    fp_usage_raise(bs->use);
    FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_CREATE, b->base, size, max_size, FABPOOL_OK);
    fp_unlock(&bs->sp->lock);
    *out = b;
    return FABPOOL_OK;
}

static fabpool_status check_size(const struct fabpool_buffer *b, size_t size, const char *fn)
{
    if (size == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: size 0; a buffer keeps at least one byte (destroy it instead)", fn);
    if (size > b->window)
        return fp_error(FABPOOL_ERR_LIMIT, "%s: %zu bytes is past the buffer's maximum of %llu bytes, fixed at "
                        "creation", fn, size, (unsigned long long)b->window);
    return FABPOOL_OK;
}

fabpool_status fabpool_buffer_resize_set(fabpool_buffer_t *const *bufs, const size_t *sizes, size_t n, void *stream)
{
    if (!bufs || !sizes || n == 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: no buffers given");
    fp_buffers *bs = bufs[0] ? bufs[0]->owner : NULL;
    for (size_t i = 0; i < n; i++) {
        if (!bufs[i] || bufs[i]->destroyed || bufs[i]->kept)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize: buffer %zu is NULL, destroyed or "
                            "released", i);
        if (bufs[i]->owner != bs)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffer %zu is of another pool", i);
        for (size_t k = 0; k < i; k++)
            if (bufs[k] == bufs[i])
                return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffers %zu and %zu are the same "
                                "buffer; give each buffer once, with its one size", k, i);
        fabpool_status st = check_size(bufs[i], sizes[i], "fabpool_buffer_resize");
        if (st != FABPOOL_OK)
            return st;
    }
    /* sizes that add up to more than the whole device can never be mapped (the sum saturates: no wrap) */
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum = sizes[i] > UINT64_MAX - sum ? UINT64_MAX : sum + sizes[i];
    fabpool_status fits = fp_chunk_fits_device(bs->sp->ch, sum, n > 1 ? "fabpool_buffer_resize_set: sizes adding up to"
                                                                      : "fabpool_buffer_resize: a size of");
    if (fits != FABPOOL_OK) {
        fp_error_append(", and every buffer keeps its size");
        return fits;
    }
    enum { STACK = 16 };
    uint32_t from_stack[STACK], *from = from_stack;
    if (n > STACK && !(from = fp_meta_alloc(bs->sp->meta, n * sizeof *from)))
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to resize %zu buffers", n);
    fp_lock(&bs->sp->lock);
    if (fp_chunks_asleep(bs->sp->ch)) {
        fp_unlock(&bs->sp->lock);
        if (from != from_stack)
            fp_meta_free(bs->sp->meta, from, n * sizeof *from);
        return fp_chunk_asleep_error("fabpool_buffer_resize");
    }
    fp_buffers_drop_kept(bs, 0); /* those kept for keep_ms go before anything maps */
    fp_collect_locked(bs, 0);
    fabpool_status st = FABPOOL_OK;
    size_t i;
    for (i = 0; i < n; i++) {
        from[i] = bufs[i]->n;
        if (sizes[i] > bufs[i]->live && (st = grow(bs, bufs[i], sizes[i], &from[i])) != FABPOOL_OK)
            break;
    }
    if (st != FABPOOL_OK) {
        for (size_t j = 0; j <= i && j < n; j++)
            undo_grow(bs, bufs[j], from[j]);
    } else {
        for (i = 0; i < n; i++) {
            uint64_t gen0 = bufs[i]->generation;
            fabpool_status s2 = shrink(bs, bufs[i], sizes[i], stream);
            if (s2 != FABPOOL_OK && st == FABPOOL_OK)
                st = s2;
            /* a shrink that failed before it changed anything: the buffer keeps its old size */
            if (s2 == FABPOOL_OK || bufs[i]->generation != gen0) {
                if (sizes[i] >= bufs[i]->size) { /* by the difference: the in-use mark never sees both sizes */
                    atomic_fetch_add(&bs->bytes, sizes[i] - bufs[i]->size);
                    fp_usage_raise(bs->use);
                } else {
                    atomic_fetch_sub(&bs->bytes, bufs[i]->size - sizes[i]);
                }
                bufs[i]->size = sizes[i];
                FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_RESIZE, bufs[i]->base, sizes[i], stream, s2);
            }
        }
        /* a collect that fails here is retried by the next one: the resize happened */
        if (fp_collect_locked(bs, 0) != FABPOOL_OK && st == FABPOOL_OK)
            fp_error_clear();
    }
    fp_unlock(&bs->sp->lock);
    if (from != from_stack)
        fp_meta_free(bs->sp->meta, from, n * sizeof *from);
    return st;
}

fabpool_status fabpool_buffer_resize(fabpool_buffer_t *b, size_t size, void *stream)
{
    return fabpool_buffer_resize_set(&b, &size, 1, stream);
}

fabpool_status fp_buffer_destroy_locked(fp_buffers *bs, struct fabpool_buffer *b, void *stream)
{
    fp_lock_assert_held(&bs->sp->lock);
    uint64_t live = b->live; /* what a kept buffer counts in kept_bytes */
    fabpool_status st = shrink(bs, b, 0, stream);
    if (st != FABPOOL_OK)
        return st; /* nothing was retired: the buffer is as it was */
    if (b->kept) {
        atomic_fetch_sub(&bs->kept_bytes, live);
        b->kept = 0;
    } else {
        atomic_fetch_sub(&bs->bytes, b->size);
        atomic_fetch_sub(&bs->count, 1);
    }
    b->size = 0;
    b->destroyed = 1;
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ kept buffers (release.c) */

static void drop(fp_buffers *bs, struct fabpool_buffer *b)
{
    /* no GPU work uses a released buffer (fabpool.h): no stream to wait for */
    if (fp_buffer_destroy_locked(bs, b, NULL) == FABPOOL_OK) {
        FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_DESTROY, b->base, 0, NULL, FABPOOL_OK);
    } else { /* the driver refused the context sync: the buffer stays kept, a later drop retries */
        FP_LOG_CH(FP_LOG_WARN, bs->sp->ch, "a kept buffer could not be given back yet: %s", fabpool_last_error());
        fp_error_clear();
    }
}

void fp_buffers_drop_kept(fp_buffers *bs, int all)
{
    fp_lock_assert_held(&bs->sp->lock);
    if (!atomic_load(&bs->kept_bytes) && !all)
        return;
    uint64_t now = fp_coarse_ns(), keep = (uint64_t)bs->keep_ms * 1000000u;
    for (struct fabpool_buffer *b = bs->list; b; b = b->next)
        if (b->kept && (all || now - b->kept_ns >= keep))
            drop(bs, b);
}

fabpool_status fabpool_buffer_get_info(const fabpool_buffer_t *b, fabpool_buffer_info *out)
{
    if (!b || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_get_info: the buffer or the output is NULL");
    fabpool_status st = fp_struct_size_check("fabpool_buffer_get_info", "fabpool_buffer_info", out->struct_size,
                                             sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    fp_lock(&bs->sp->lock);
    out->base = (void *)(uintptr_t)b->base;
    out->size = b->size;
    out->mapped = b->live;
    out->max_size = b->window;
    out->n_chunks = 0;
    for (uint32_t i = 0; i < b->n; i++)
        out->n_chunks += !b->chunks[i].retiring;
    out->generation = b->generation;
    out->export_id = b->uid;
    fp_unlock(&bs->sp->lock);
    return FABPOOL_OK;
}

void *fabpool_buffer_ptr(const fabpool_buffer_t *b) { return b ? (void *)(uintptr_t)b->base : NULL; }
