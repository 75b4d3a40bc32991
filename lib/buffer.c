/* buffer.c - growable buffers: an address window of their own, chunks mapped
 * one behind the other, so the base address never changes.  Chunks a shrink
 * gives up retire: they are unmapped once the GPU work that may use them is
 * done, and a grow that comes first takes them back as they are. */
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "pool.h"

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
    list_del(p, b);
    fp_va_free(&p->va, b->base, b->window);
    fp_meta_free(&p->meta, b->chunks, b->cap * sizeof *b->chunks);
    fp_meta_free(&p->meta, b, sizeof *b);
    atomic_fetch_sub(&p->buffer_count, 1);
}

/* Unmaps the last chunk.  Pool lock held. */
static fabpool_status pop_chunk(struct fabpool *p, struct fabpool_buffer *b)
{
    fp_bchunk *c = &b->chunks[b->n - 1];
    fabpool_status st = fp_chunk_unmap(p, b->base + c->off, c->size);
    if (st != FABPOOL_OK)
        return st;
    fp_chunk_forget_export(p, c);
    if (c->retiring) {
        if (c->retire_event)
            FP_CU(&p->calls, cuEventDestroy, c->retire_event);
        atomic_fetch_sub(&p->retiring_bytes, c->size);
    } else {
        b->live -= c->size;
    }
    b->mapped -= c->size;
    atomic_fetch_sub(&p->buffer_mapped, c->size);
    b->n--;
    if (!c->retiring)
        b->generation++; /* a live chunk went (undo of a grow): peers must hear of it */
    return FABPOOL_OK;
}

/* Unmaps retired chunks, from each buffer's end down, whose event has
 * completed (all of them, waiting, with wait != 0). */
fabpool_status fp_collect_locked(struct fabpool *p, int wait)
{
    fabpool_status first = FABPOOL_OK;
    CUcontext saved = NULL;
    int pushed = 0;
    struct fabpool_buffer *b = p->buffers, *next;
    for (; b; b = next) {
        next = b->next;
        while (b->n && b->chunks[b->n - 1].retiring) {
            fp_bchunk *c = &b->chunks[b->n - 1];
            if (b->shared && b->acked < c->drop_gen)
                break; /* a peer may still map it (a fabric handle holds no reference) */
            if (c->retire_event) {
                if (!pushed) {
                    if (fp_ctx_push(p, &saved) != FABPOOL_OK)
                        return FABPOOL_ERR_DRIVER;
                    pushed = 1;
                }
                CUresult r = wait ? FP_CU(&p->calls, cuEventSynchronize, c->retire_event)
                                  : FP_CU(&p->calls, cuEventQuery, c->retire_event);
                if (r == CUDA_ERROR_NOT_READY)
                    break;
                if (r != CUDA_SUCCESS) {
                    if (first == FABPOOL_OK)
                        first = fp_drv_error(r, wait ? "cuEventSynchronize" : "cuEventQuery",
                                             "waiting for the GPU work before unmapping a retired chunk");
                    break;
                }
            }
            fabpool_status st = pop_chunk(p, b);
            if (st != FABPOOL_OK) {
                if (first == FABPOOL_OK)
                    first = st;
                break;
            }
        }
        if (b->destroyed && b->n == 0)
            free_buffer(p, b);
    }
    if (pushed)
        fp_ctx_pop(p, saved);
    return first;
}

fabpool_status fabpool_collect(fabpool_t *p, int wait)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_collect: the pool is NULL");
    pthread_mutex_lock(&p->lock);
    fabpool_status st = fp_collect_locked(p, wait);
    pthread_mutex_unlock(&p->lock);
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
    *mapped_from = b->n;
    /* take back retired chunks first: they are still mapped, data and all */
    for (uint32_t i = 0; i < b->n && b->live < target; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (!c->retiring)
            continue;
        if (c->retire_event)
            FP_CU(&p->calls, cuEventDestroy, c->retire_event);
        c->retire_event = NULL;
        c->retiring = 0;
        b->live += c->size;
        c->gen = ++b->generation; /* back among the live chunks: the next delta names it */
        atomic_fetch_sub(&p->retiring_bytes, c->size);
    }
    *mapped_from = b->n;
    while (b->live < target) {
        if (b->n && b->chunks[b->n - 1].retiring)
            break; /* cannot happen: all retiring chunks were taken back */
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

/* Retires the chunks a buffer of `target` bytes no longer needs, keeping the
 * hysteresis.  stream NULL: synchronize and unmap at once. */
static fabpool_status shrink(struct fabpool *p, struct fabpool_buffer *b, uint64_t target, void *stream)
{
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
    if (first_retire == last_live)
        return FABPOOL_OK;
    CUcontext saved;
    fabpool_status st = fp_ctx_push(p, &saved);
    if (st != FABPOOL_OK)
        return st;
    if (!stream) {
        CUresult r = FP_CU(&p->calls, cuCtxSynchronize);
        if (r != CUDA_SUCCESS) {
            fp_ctx_pop(p, saved);
            return fp_drv_error(r, "cuCtxSynchronize", "waiting for GPU work before unmapping a shrunk buffer's chunks");
        }
    }
    /* the events first, so that a failure retires nothing and the buffer keeps its size */
    for (uint32_t i = first_retire; stream && i < last_live; i++) {
        CUevent ev = NULL;
        CUresult r = FP_CU(&p->calls, cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS) {
            r = FP_CU(&p->calls, cuEventRecord, ev, (CUstream)stream);
            if (r != CUDA_SUCCESS)
                FP_CU(&p->calls, cuEventDestroy, ev);
        }
        if (r != CUDA_SUCCESS) {
            for (uint32_t j = first_retire; j < i; j++) {
                FP_CU(&p->calls, cuEventDestroy, b->chunks[j].retire_event);
                b->chunks[j].retire_event = NULL;
            }
            fp_ctx_pop(p, saved);
            return fp_drv_error(r, "cuEventRecord", "recording an event on stream %p before retiring a buffer chunk "
                                "(nothing was retired)", stream);
        }
        b->chunks[i].retire_event = ev;
    }
    for (uint32_t i = first_retire; i < last_live; i++) {
        fp_bchunk *c = &b->chunks[i];
        c->retiring = 1;
        if (!stream)
            c->retire_event = NULL;
        c->drop_gen = b->generation + 1;
        b->live -= c->size;
        atomic_fetch_add(&p->retiring_bytes, c->size);
    }
    fp_ctx_pop(p, saved);
    b->generation++; /* the live chunks changed */
    fabpool_status cst = fp_collect_locked(p, 0);
    return st != FABPOOL_OK ? st : cst;
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
    pthread_mutex_lock(&p->lock);
    b->base = fp_va_alloc(&p->va, b->window, p->gran);
    if (!b->base) {
        pthread_mutex_unlock(&p->lock);
        fp_meta_free(&p->meta, b, sizeof *b);
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: no free address range of %llu bytes left in the "
                        "pool's reservation of %llu bytes; raise reserve", (unsigned long long)b->window,
                        (unsigned long long)p->va_size);
    }
    list_add(p, b);
    atomic_fetch_add(&p->buffer_count, 1);
    uint32_t from;
    fabpool_status st = grow(p, b, size, &from);
    if (st != FABPOOL_OK) {
        undo_grow(p, b, from);
        free_buffer(p, b);
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    b->size = size;
    atomic_fetch_add(&p->buffer_bytes, size);
    pthread_mutex_unlock(&p->lock);
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
        fabpool_status st = check_size(bufs[i], sizes[i], "fabpool_buffer_resize");
        if (st != FABPOOL_OK)
            return st;
    }
    enum { STACK = 16 };
    uint32_t from_stack[STACK], *from = from_stack;
    if (n > STACK && !(from = fp_meta_alloc(&p->meta, n * sizeof *from)))
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to resize %zu buffers", n);
    pthread_mutex_lock(&p->lock);
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
            size_t old = bufs[i]->size;
            bufs[i]->size = sizes[i];
            fabpool_status s2 = shrink(p, bufs[i], sizes[i], stream);
            if (s2 != FABPOOL_OK && bufs[i]->live >= old)
                bufs[i]->size = old; /* nothing was retired: the buffer keeps its old size */
            atomic_fetch_add(&p->buffer_bytes, bufs[i]->size);
            atomic_fetch_sub(&p->buffer_bytes, old);
            if (s2 != FABPOOL_OK && st == FABPOOL_OK)
                st = s2;
        }
    }
    pthread_mutex_unlock(&p->lock);
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
    pthread_mutex_lock(&p->lock);
    atomic_fetch_sub(&p->buffer_bytes, b->size);
    b->size = 0;
    fabpool_status st = shrink(p, b, 0, stream);
    b->destroyed = 1;
    fabpool_status cst = fp_collect_locked(p, 0);
    pthread_mutex_unlock(&p->lock);
    return st != FABPOOL_OK ? st : cst;
}

void fp_buffers_destroy(struct fabpool *p)
{
    while (p->buffers) {
        struct fabpool_buffer *b = p->buffers;
        while (b->n)
            if (pop_chunk(p, b) != FABPOOL_OK) {
                b->n--; /* the driver refused: forget the chunk, the reservation goes next */
            }
        free_buffer(p, b);
    }
}

fabpool_status fabpool_buffer_get_info(const fabpool_buffer_t *b, fabpool_buffer_info *out)
{
    if (!b || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_get_info: the buffer or the output is NULL");
    struct fabpool *p = b->pool;
    pthread_mutex_lock(&p->lock);
    out->base = (void *)(uintptr_t)b->base;
    out->size = b->size;
    out->mapped = b->live;
    out->max_size = b->window;
    out->n_chunks = 0;
    for (uint32_t i = 0; i < b->n; i++)
        out->n_chunks += !b->chunks[i].retiring;
    out->generation = b->generation;
    pthread_mutex_unlock(&p->lock);
    return FABPOOL_OK;
}

void *fabpool_buffer_ptr(const fabpool_buffer_t *b) { return b ? (void *)(uintptr_t)b->base : NULL; }
