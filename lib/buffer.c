/* buffer.c - growable buffers: an address window of their own, chunks mapped
 * one behind the other, so the base address never changes.  Chunks a shrink
 * gives up retire: they are unmapped once the GPU work that may use them is
 * done, and a grow that comes first takes them back as they are. */
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"
#include "trace.h"

static void list_add(struct fabpool *p, struct fabpool_buffer *b)
{
    b->prev = NULL;
    b->next = p->buffers;
    if (p->buffers)
        p->buffers->prev = b;
    p->buffers = b;
}

static void list_del(struct fabpool *p, struct fabpool_buffer *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        p->buffers = b->next;
    if (b->next)
        b->next->prev = b->prev;
}

static int reserve_chunks(struct fabpool *p, struct fabpool_buffer *b, uint32_t n)
{
    if (n <= b->cap)
        return 0;
    uint32_t cap = b->cap ? b->cap : 8;
    while (cap < n)
        cap *= 2;
    fp_bchunk *c = fp_meta_alloc(&p->meta, cap * sizeof *c);
    if (!c)
        return -1;
    if (b->n)
        memcpy(c, b->chunks, b->n * sizeof *c);
    fp_meta_free(&p->meta, b->chunks, b->cap * sizeof *c);
    b->chunks = c;
    b->cap = cap;
    return 0;
}

static void free_buffer(struct fabpool *p, struct fabpool_buffer *b)
{
    fp_lock_assert_held(&p->lock);
    list_del(p, b);
    fp_va_free(&p->va, b->base, b->window);
    fp_meta_free(&p->meta, b->chunks, b->cap * sizeof *b->chunks);
    fp_meta_free(&p->meta, b->ghosts, b->cap_ghosts * sizeof *b->ghosts);
    fp_meta_free(&p->meta, b, sizeof *b);
}

/* Whether a peer may still import a chunk that the descriptor of generation
 * `named` was the last to name (0: none did): some peer has not applied a
 * descriptor of that generation or later.  Later descriptors do not name it,
 * so a peer that has applied one needs nothing more of it: it maps the chunk
 * itself (and its mapping keeps the memory) or never will. */
static int peers_may_hold(const struct fabpool_buffer *b, uint64_t named)
{
    return b->shared && named && b->acked != UINT64_MAX && named > b->acked;
}

/* Unmaps chunk i. */
static fabpool_status remove_chunk(struct fabpool *p, struct fabpool_buffer *b, uint32_t i)
{
    fp_lock_assert_held(&p->lock);
    fp_bchunk *c = &b->chunks[i];
    fabpool_status st = fp_chunk_unmap(p, b->base + c->off, c->size);
    if (st != FABPOOL_OK)
        return st;
    fp_chunk_forget_export(p, c);
    int was_live = !c->retiring;
    if (c->retiring) {
        fp_retire_ticket_drop(&p->retire, &c->ticket);
        atomic_fetch_sub(&p->retiring_bytes, c->size);
    } else {
        b->live -= c->size;
    }
    b->mapped -= c->size;
    atomic_fetch_sub(&p->buffer_mapped, c->size);
    memmove(c, c + 1, (size_t)(b->n - i - 1) * sizeof *c);
    b->n--;
    if (was_live)
        b->generation++; /* a live chunk went (undo of a grow): peers must hear of it */
    return FABPOOL_OK;
}

/* Unmaps the last chunk. */
static fabpool_status pop_chunk(struct fabpool *p, struct fabpool_buffer *b) { return remove_chunk(p, b, b->n - 1); }

static fabpool_status ghost_add(struct fabpool *p, struct fabpool_buffer *b, fp_ghost g)
{
    fp_lock_assert_held(&p->lock);
    if (b->n_ghosts == b->cap_ghosts) {
        uint32_t cap = b->cap_ghosts ? b->cap_ghosts * 2 : 4;
        fp_ghost *n = fp_meta_alloc(&p->meta, cap * sizeof *n);
        if (!n)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's list of chunks its peers hold");
        if (b->n_ghosts)
            memcpy(n, b->ghosts, b->n_ghosts * sizeof *n);
        fp_meta_free(&p->meta, b->ghosts, b->cap_ghosts * sizeof *n);
        b->ghosts = n;
        b->cap_ghosts = cap;
    }
    b->ghosts[b->n_ghosts++] = g;
    atomic_fetch_add(&p->ghost_bytes, g.size);
    return FABPOOL_OK;
}

/* Releases the ghosts no peer can still import (all of them with all != 0). */
static void ghosts_release(struct fabpool *p, struct fabpool_buffer *b, int all)
{
    fp_lock_assert_held(&p->lock);
    uint32_t w = 0;
    for (uint32_t i = 0; i < b->n_ghosts; i++) {
        fp_ghost *g = &b->ghosts[i];
        if ((all || !peers_may_hold(b, g->named)) && fp_chunk_release(p, g->h) == CUDA_SUCCESS) {
            atomic_fetch_sub(&p->ghost_bytes, g->size);
            continue;
        }
        b->ghosts[w++] = *g;
    }
    b->n_ghosts = w;
}

/* Whether retired chunk c may be unmapped now: its GPU work is done (waited
 * for with wait != 0; the retirement queue knows, retire.h) and no peer may
 * still import it.  1 yes, 0 not yet, -1 the driver failed (*st says how). */
static int retired_done(struct fabpool *p, struct fabpool_buffer *b, fp_bchunk *c, int wait, fabpool_status *st)
{
    if (peers_may_hold(b, c->named))
        return 0;
    return fp_retire_ticket_done(&p->retire, &c->ticket, wait, st);
}

/* Unmaps retired chunks whose event has completed (all of them, waiting,
 * with wait != 0) and that no peer may still import: from each live
 * buffer's end down (a grow maps behind the live chunks), anywhere in a
 * destroyed one.  Frees destroyed buffers that hold nothing any more. */
fabpool_status fp_collect_locked(struct fabpool *p, int wait)
{
    fp_lock_assert_held(&p->lock);
    fabpool_status first = FABPOOL_OK;
    struct fabpool_buffer *b = p->buffers, *next;
    for (; b; b = next) {
        next = b->next;
        ghosts_release(p, b, 0);
        for (uint32_t i = b->n; i-- > 0;) {
            fp_bchunk *c = &b->chunks[i];
            if (!c->retiring) {
                if (b->destroyed)
                    continue;
                break;
            }
            fabpool_status st = FABPOOL_OK;
            int done = retired_done(p, b, c, wait, &st);
            if (done == 1)
                st = remove_chunk(p, b, i);
            if (st != FABPOOL_OK && first == FABPOOL_OK)
                first = st;
            if (done != 1 || st != FABPOOL_OK) {
                if (!b->destroyed)
                    break;
            }
        }
        if (b->destroyed && b->n == 0 && b->n_ghosts == 0)
            free_buffer(p, b);
    }
    return first;
}

fabpool_status fabpool_collect(fabpool_t *p, int wait)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_collect: the pool is NULL");
    fp_retire_drain(p, wait, wait); /* blocks freed on streams whose work is done go back to the pool */
    fp_lock(&p->lock);
    fabpool_status st = fp_collect_locked(p, wait);
    fp_unlock(&p->lock);
    return st;
}

/* Size of the next chunk when `live` bytes are mapped and `target` wanted:
 * as large as the waste bound allows (so a growing buffer maps few chunks:
 * each is about a quarter of what is there), never more than max_chunk. */
static uint64_t next_chunk(const struct fabpool *p, const struct fabpool_buffer *b, uint64_t live, uint64_t target)
{
    uint64_t need = fp_round_up(target - live, p->gran);
    uint64_t allow = fp_round_up(target + target / 100 * p->opt.max_waste_percent +
                                 target % 100 * p->opt.max_waste_percent / 100, p->gran);
    if (allow > b->window)
        allow = b->window;
    uint64_t room = allow - live, cap = p->opt.max_chunk_bytes;
    if (room > cap)
        room = cap;
    if (need >= cap)
        return cap;
    uint64_t c = fp_class_round_down_gran(room, p->gran);
    return c >= need ? c : need;
}

/* Grows b's mapping to cover `target`.  On failure everything this call
 * mapped is unmapped again (taken-back retired chunks stay live). */
static fabpool_status grow(struct fabpool *p, struct fabpool_buffer *b, uint64_t target, uint32_t *mapped_from)
{
    fp_lock_assert_held(&p->lock);
    *mapped_from = b->n;
    /* take back retired chunks first: they are still mapped, data and all */
    for (uint32_t i = 0; i < b->n && b->live < target; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (!c->retiring)
            continue;
        if (c->off != b->live)
            break; /* not behind the live chunks (a chunk before it failed to unmap): it cannot come back */
        fp_retire_ticket_drop(&p->retire, &c->ticket);
        c->retiring = 0;
        b->live += c->size;
        c->gen = ++b->generation; /* back among the live chunks: the next delta names it */
        atomic_fetch_sub(&p->retiring_bytes, c->size);
    }
    *mapped_from = b->n;
    while (b->live < target) {
        if (b->n && b->chunks[b->n - 1].retiring)
            return fp_error(FABPOOL_ERR_DRIVER, "a retired chunk of the buffer could not be unmapped earlier and "
                            "is in the way of growing it; fabpool_collect retries the unmap");
        uint64_t c = next_chunk(p, b, b->live, target);
        if (reserve_chunks(p, b, b->n + 1) != 0)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's chunk list");
        fabpool_status st = fp_chunk_map(p, b->base + b->live, c);
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
        atomic_fetch_add(&p->buffer_mapped, c);
    }
    return FABPOOL_OK;
}

static void undo_grow(struct fabpool *p, struct fabpool_buffer *b, uint32_t mapped_from)
{
    while (b->n > mapped_from)
        if (pop_chunk(p, b) != FABPOOL_OK)
            break;
}

/* Waits for the GPU work on `stream` (NULL: the whole context). */
static fabpool_status sync_stream(struct fabpool *p, void *stream, const char *why)
{
    CUresult r = stream ? FP_CU(&p->calls, cuStreamSynchronize, (CUstream)stream) : FP_CU(&p->calls, cuCtxSynchronize);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, stream ? "cuStreamSynchronize" : "cuCtxSynchronize", "waiting for GPU work %s", why);
    return FABPOOL_OK;
}

/* Keeps the memory of chunk c (handle h, retained by the caller) for the
 * peers that may still import it; returns 0 if no peer may (the caller
 * releases h).  Its exported fd, if the pool still holds one, is closed when
 * the chunk is unmapped, as for any chunk (fabpool.h). */
static int ghost_keep(struct fabpool *p, struct fabpool_buffer *b, fp_bchunk *c, CUmemGenericAllocationHandle h)
{
    fp_lock_assert_held(&p->lock);
    return peers_may_hold(b, c->named) && ghost_add(p, b, (fp_ghost){h, c->size, c->named}) == FABPOOL_OK;
}

/* Moves chunk c's memory to the ghosts when a peer may still import it, so
 * that unmapping it here does not free it. */
static fabpool_status keep_for_peers(struct fabpool *p, struct fabpool_buffer *b, fp_bchunk *c)
{
    fp_lock_assert_held(&p->lock);
    if (!peers_may_hold(b, c->named))
        return FABPOOL_OK;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = FP_CU(&p->calls, cuMemRetainAllocationHandle, &h, (void *)(uintptr_t)(b->base + c->off));
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemRetainAllocationHandle", "keeping a chunk its peers may import");
    atomic_fetch_add(&p->handles_outstanding, 1);
    if (!ghost_keep(p, b, c, h)) {
        fp_chunk_release(p, h);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's list of chunks its peers hold");
    }
    return FABPOOL_OK;
}

/* A shrink to `target` whose last needed chunk (index j) holds more than the
 * hysteresis allows: every chunk after j goes, and j is replaced by a chunk
 * of rs bytes at the same address, the data below target copied on `stream`.
 * The copy and the swap wait for the GPU work on `stream` (NULL: the
 * context) and for the retired chunks' events.  On failure before the swap
 * the buffer is as it was.  The pool's context is current. */
static fabpool_status refit(struct fabpool *p, struct fabpool_buffer *b, uint32_t j, uint64_t rs, uint64_t target,
                            void *stream)
{
    fp_lock_assert_held(&p->lock);
    fp_bchunk *c = &b->chunks[j];
    uint64_t at = b->base + c->off, drop_gen = b->generation + 1;
    uint64_t tmp = fp_va_alloc(&p->va, rs, p->gran);
    if (!tmp)
        return fp_error(FABPOOL_ERR_LIMIT, "shrinking a buffer to %llu bytes: no free address range of %llu bytes "
                        "left in the pool's reservation for the copy; raise reserve", (unsigned long long)target,
                        (unsigned long long)rs);
    CUmemGenericAllocationHandle hn = 0, ho = 0;
    fabpool_status st = fp_chunk_create(p, rs, &hn);
    if (st != FABPOOL_OK)
        goto free_va;
    if ((st = fp_chunk_map_access(p, tmp, rs, hn, "a smaller chunk for a shrunk buffer")) != FABPOOL_OK)
        goto release_new;
    CUresult r = FP_CU(&p->calls, cuMemcpyDtoDAsync, (CUdeviceptr)tmp, (CUdeviceptr)at, target - c->off,
                       (CUstream)stream);
    if (r != CUDA_SUCCESS) {
        st = fp_drv_error(r, "cuMemcpyDtoDAsync", "copying %llu bytes of a shrunk buffer into its smaller chunk",
                          (unsigned long long)(target - c->off));
        goto unmap_tmp;
    }
    if ((st = sync_stream(p, stream, "before a shrunk buffer's chunk is replaced")) != FABPOOL_OK)
        goto unmap_tmp;
    for (uint32_t i = j + 1; i < b->n; i++) {
        fp_bchunk *t = &b->chunks[i];
        if (t->retiring && fp_retire_ticket_done(&p->retire, &t->ticket, 1, &st) < 0) {
            fp_error_append(" (a retired chunk of a buffer being shrunk)");
            goto unmap_tmp;
        }
    }
    /* the old chunk's memory: a handle of our own, to map it back if the swap fails */
    r = FP_CU(&p->calls, cuMemRetainAllocationHandle, &ho, (void *)(uintptr_t)at);
    if (r != CUDA_SUCCESS) {
        st = fp_drv_error(r, "cuMemRetainAllocationHandle", "keeping a shrunk buffer's chunk while it is replaced");
        goto unmap_tmp;
    }
    atomic_fetch_add(&p->handles_outstanding, 1);

    /* the chunks after j go: their memory first kept for the peers that may
     * still import it, so that a failure before the swap undoes everything */
    uint32_t n0 = b->n_ghosts;
    for (uint32_t i = j + 1; i < b->n && st == FABPOOL_OK; i++)
        st = keep_for_peers(p, b, &b->chunks[i]);
    if (st != FABPOOL_OK)
        goto drop_ghosts;

    /* the swap */
    c = &b->chunks[j];
    uint64_t old = c->size;
    if ((st = fp_chunk_unmap(p, at, old)) != FABPOOL_OK)
        goto drop_ghosts;
    if ((st = fp_chunk_map_access(p, at, rs, hn, "a shrunk buffer's smaller chunk")) != FABPOOL_OK) {
        if (fp_chunk_map_access(p, at, old, ho, "a shrunk buffer's chunk, back") == FABPOOL_OK)
            fp_chunk_count_mapped(p, old);
        else
            fp_error_append(" (the chunk could not be mapped back either: the buffer lost %llu bytes at offset %llu)",
                            (unsigned long long)old, (unsigned long long)c->off);
        goto drop_ghosts;
    }
    fp_chunk_count_mapped(p, rs);
    if (!ghost_keep(p, b, c, ho)) /* the old memory, for the peers that may still import it */
        fp_chunk_release(p, ho);
    fp_chunk_forget_export(p, c);
    b->live -= old - rs;
    b->mapped -= old - rs;
    atomic_fetch_sub(&p->buffer_mapped, old - rs);
    c->size = rs;
    c->gen = drop_gen; /* a new chunk: the next delta names it */
    c->named = 0;
    b->generation = drop_gen;
    /* then the chunks after it, from the end (their GPU work is done) */
    for (uint32_t i = j + 1; i < b->n; i++) {
        fp_bchunk *t = &b->chunks[i];
        if (t->retiring)
            continue;
        t->retiring = 1;
        t->ticket = (fp_rticket){NULL, 0};
        t->drop_gen = drop_gen;
        b->live -= t->size;
        atomic_fetch_add(&p->retiring_bytes, t->size);
    }
    while (b->n > j + 1 && (st = pop_chunk(p, b)) == FABPOOL_OK)
        ;
    /* a chunk that failed to unmap stays retired: fabpool_collect retries it */
    goto unmap_tmp;

drop_ghosts:
    while (b->n_ghosts > n0) {
        fp_ghost *g = &b->ghosts[--b->n_ghosts];
        fp_chunk_release(p, g->h);
        atomic_fetch_sub(&p->ghost_bytes, g->size);
    }
    fp_chunk_release(p, ho);
unmap_tmp:
    if (FP_CU_UNDO(&p->calls, cuMemUnmap, (CUdeviceptr)tmp, rs) != CUDA_SUCCESS) {
        fp_chunk_release(p, hn);
        return st != FABPOOL_OK ? st : fp_error(FABPOOL_ERR_DRIVER, "cuMemUnmap of the copy of a shrunk buffer's "
                                                "chunk failed twice; %llu bytes of address space stay used",
                                                (unsigned long long)rs);
    }
release_new:
    fp_chunk_release(p, hn);
free_va:
    fp_va_free(&p->va, tmp, rs);
    return st;
}

/* Retires the chunks a buffer of `target` bytes no longer needs, keeping the
 * hysteresis; a last chunk that would leave more than that mapped is replaced
 * by a smaller one (refit).  stream NULL: synchronize and unmap at once.  On
 * failure nothing is retired.  The caller collects afterwards. */
static fabpool_status shrink(struct fabpool *p, struct fabpool_buffer *b, uint64_t target, void *stream)
{
    fp_lock_assert_held(&p->lock);
    uint64_t keep = fp_round_up(target + target / 100 * p->opt.shrink_hysteresis_percent +
                                target % 100 * p->opt.shrink_hysteresis_percent / 100, p->gran);
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
    fabpool_status st = fp_ctx_push(p, &saved);
    if (st != FABPOOL_OK)
        return st;
    if (refit_j) {
        fp_bchunk *j = &b->chunks[first_retire - 1];
        st = refit(p, b, first_retire - 1, keep - j->off, target, stream);
        fp_ctx_pop(p, saved);
        return st;
    }
    if (!stream && (st = sync_stream(p, NULL, "before unmapping a shrunk buffer's chunks")) != FABPOOL_OK) {
        fp_ctx_pop(p, saved);
        return st;
    }
    /* the event first (one for every chunk: the retirement queue's ticket), so
     * that a failure retires nothing and the buffer keeps its size */
    fp_rticket ticket = {NULL, 0};
    if (stream && (st = fp_retire_mark(&p->retire, stream, last_live - first_retire, &ticket)) != FABPOOL_OK) {
        fp_ctx_pop(p, saved);
        fp_error_append(" (before retiring a buffer chunk; nothing was retired)");
        return st;
    }
    for (uint32_t i = first_retire; i < last_live; i++) {
        fp_bchunk *c = &b->chunks[i];
        c->retiring = 1;
        c->ticket = ticket;
        c->drop_gen = b->generation + 1;
        b->live -= c->size;
        atomic_fetch_add(&p->retiring_bytes, c->size);
    }
    fp_ctx_pop(p, saved);
    b->generation++; /* the live chunks changed */
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ API */

fabpool_status fabpool_buffer_create(fabpool_t *p, size_t max_size, size_t size, fabpool_buffer_t **out)
{
    if (!p || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: the pool or the output pointer is NULL");
    *out = NULL;
    if (max_size == 0 || size == 0 || size > max_size)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: max_size %zu and size %zu: both must be "
                        "at least 1 and size <= max_size", max_size, size);
    if (max_size > p->va_size - p->gran)
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: max_size %zu is larger than the pool's "
                        "reserved address space (%llu bytes); raise reserve", max_size,
                        (unsigned long long)p->va_size);
    struct fabpool_buffer *b = fp_meta_alloc(&p->meta, sizeof *b);
    if (!b)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer");
    b->pool = p;
    b->window = fp_round_up(max_size, p->gran);
    static _Atomic uint64_t uids;
    b->uid = ((uint64_t)getpid() << 32) ^ (atomic_fetch_add(&uids, 1) + 1) ^ ((uint64_t)(uintptr_t)b << 12);
    fp_lock(&p->lock);
    b->base = fp_va_alloc(&p->va, b->window, p->gran);
    if (!b->base) {
        fp_unlock(&p->lock);
        fp_meta_free(&p->meta, b, sizeof *b);
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: no free address range of %llu bytes left in the "
                        "pool's reservation of %llu bytes; raise reserve", (unsigned long long)b->window,
                        (unsigned long long)p->va_size);
    }
    if (fp_asleep(p)) {
        fp_va_free(&p->va, b->base, b->window);
        fp_unlock(&p->lock);
        fp_meta_free(&p->meta, b, sizeof *b);
        return fp_asleep_error("fabpool_buffer_create");
    }
    list_add(p, b);
    atomic_fetch_add(&p->buffer_count, 1);
    uint32_t from;
    fabpool_status st = grow(p, b, size, &from);
    if (st != FABPOOL_OK) {
        undo_grow(p, b, from);
        free_buffer(p, b);
        atomic_fetch_sub(&p->buffer_count, 1);
        fp_unlock(&p->lock);
        return st;
    }
    b->size = size;
    atomic_fetch_add(&p->buffer_bytes, size);
    FP_TRACE_ST(p, FABPOOL_TR_BUF_CREATE, b->base, size, max_size, FABPOOL_OK);
    fp_unlock(&p->lock);
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
    struct fabpool *p = bufs[0] ? bufs[0]->pool : NULL;
    for (size_t i = 0; i < n; i++) {
        if (!bufs[i] || bufs[i]->destroyed)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize: buffer %zu is NULL or destroyed", i);
        if (bufs[i]->pool != p)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffer %zu is of another pool", i);
        for (size_t k = 0; k < i; k++)
            if (bufs[k] == bufs[i])
                return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffers %zu and %zu are the same "
                                "buffer; give each buffer once, with its one size", k, i);
        fabpool_status st = check_size(bufs[i], sizes[i], "fabpool_buffer_resize");
        if (st != FABPOOL_OK)
            return st;
    }
    enum { STACK = 16 };
    uint32_t from_stack[STACK], *from = from_stack;
    if (n > STACK && !(from = fp_meta_alloc(&p->meta, n * sizeof *from)))
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to resize %zu buffers", n);
    fp_lock(&p->lock);
    if (fp_asleep(p)) {
        fp_unlock(&p->lock);
        if (from != from_stack)
            fp_meta_free(&p->meta, from, n * sizeof *from);
        return fp_asleep_error("fabpool_buffer_resize");
    }
    fp_collect_locked(p, 0);
    fabpool_status st = FABPOOL_OK;
    size_t i;
    for (i = 0; i < n; i++) {
        from[i] = bufs[i]->n;
        if (sizes[i] > bufs[i]->live && (st = grow(p, bufs[i], sizes[i], &from[i])) != FABPOOL_OK)
            break;
    }
    if (st != FABPOOL_OK) {
        for (size_t j = 0; j <= i && j < n; j++)
            undo_grow(p, bufs[j], from[j]);
    } else {
        for (i = 0; i < n; i++) {
            uint64_t gen0 = bufs[i]->generation;
            fabpool_status s2 = shrink(p, bufs[i], sizes[i], stream);
            if (s2 != FABPOOL_OK && st == FABPOOL_OK)
                st = s2;
            /* a shrink that failed before it changed anything: the buffer keeps its old size */
            if (s2 == FABPOOL_OK || bufs[i]->generation != gen0) {
                atomic_fetch_add(&p->buffer_bytes, sizes[i]);
                atomic_fetch_sub(&p->buffer_bytes, bufs[i]->size);
                bufs[i]->size = sizes[i];
                FP_TRACE_ST(p, FABPOOL_TR_BUF_RESIZE, bufs[i]->base, sizes[i], stream, s2);
            }
        }
        /* a collect that fails here is retried by the next one: the resize happened */
        if (fp_collect_locked(p, 0) != FABPOOL_OK && st == FABPOOL_OK)
            fp_error_clear();
    }
    fp_unlock(&p->lock);
    if (from != from_stack)
        fp_meta_free(&p->meta, from, n * sizeof *from);
    return st;
}

fabpool_status fabpool_buffer_resize(fabpool_buffer_t *b, size_t size, void *stream)
{
    return fabpool_buffer_resize_set(&b, &size, 1, stream);
}

fabpool_status fabpool_buffer_destroy(fabpool_buffer_t *b, void *stream)
{
    if (!b || b->destroyed)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_destroy: the buffer is NULL or already destroyed");
    struct fabpool *p = b->pool;
    fp_lock(&p->lock);
    fabpool_status st = shrink(p, b, 0, stream);
    if (st != FABPOOL_OK) {
        /* nothing was retired: the buffer is as it was, and can be destroyed again */
        fp_error_append(" (fabpool_buffer_destroy: the buffer is still alive; destroy it again)");
        fp_unlock(&p->lock);
        return st;
    }
    atomic_fetch_sub(&p->buffer_bytes, b->size);
    atomic_fetch_sub(&p->buffer_count, 1);
    b->size = 0;
    b->destroyed = 1;
    FP_TRACE_ST(p, FABPOOL_TR_BUF_DESTROY, b->base, 0, stream, FABPOOL_OK);
    /* what no peer can still import goes now (once its GPU work is done);
     * the rest when the peers acknowledge (fabpool_peers_ack) or at pool
     * destroy.  A collect that fails here is retried by the next one. */
    (void)fp_collect_locked(p, 0);
    fp_unlock(&p->lock);
    fp_error_clear();
    return FABPOOL_OK;
}

void fp_buffers_destroy(struct fabpool *p)
{
    fp_lock_assert_held(&p->lock);
    while (p->buffers) {
        struct fabpool_buffer *b = p->buffers;
        while (b->n)
            if (pop_chunk(p, b) != FABPOOL_OK) {
                b->n--; /* the driver refused: forget the chunk, the reservation goes next */
            }
        ghosts_release(p, b, 1);
        free_buffer(p, b);
    }
}

fabpool_status fabpool_buffer_get_info(const fabpool_buffer_t *b, fabpool_buffer_info *out)
{
    if (!b || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_get_info: the buffer or the output is NULL");
    struct fabpool *p = b->pool;
    fp_lock(&p->lock);
    out->base = (void *)(uintptr_t)b->base;
    out->size = b->size;
    out->mapped = b->live;
    out->max_size = b->window;
    out->n_chunks = 0;
    for (uint32_t i = 0; i < b->n; i++)
        out->n_chunks += !b->chunks[i].retiring;
    out->generation = b->generation;
    out->export_id = b->uid;
    fp_unlock(&p->lock);
    return FABPOOL_OK;
}

void *fabpool_buffer_ptr(const fabpool_buffer_t *b) { return b ? (void *)(uintptr_t)b->base : NULL; }
