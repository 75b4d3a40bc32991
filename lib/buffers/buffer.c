/* buffer.c - growable buffers: an address window of their own, chunks mapped
 * one behind the other, so the base address never changes.  Chunks a shrink
 * gives up retire: they are unmapped once the GPU work that may use them is
 * done, and a grow that comes first takes them back as they are.  Here:
 * growing and shrinking buffers, a set of them all or nothing, and the
 * buffer API (create, resize, destroy, info); the refit of a shrink is in
 * refit.c; taking chunks out, peer holds and collecting retired chunks are in
 * bchunk.c.
 *
 * All or nothing (fabpool.h, docs/design.md): a resize first does every step
 * that can fail, for every buffer of the set, in a form that can be undone
 * (grows map their chunks and take retired ones back; shrinks reserve their
 * tickets, then one context synchronize or one event covers every chunk they
 * retire), and only then commits, which cannot fail: generations, live and
 * retiring chunks, sizes.  A refit, which replaces a shrunk buffer's last
 * chunk by a smaller one to give memory back, comes after the commit and
 * is an economy: when the driver refuses it the chunk stays whole (logged)
 * and a later shrink refits it. */
#include "buffer.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "array.h"
#include "clock.h"
#include "error.h"
#include "handles.h"
#include "list.h"
#include "log.h"
#include "refit.h"
#include "sizeclass.h"
#include "trace.h"

_Static_assert(sizeof(struct fabpool_buffer) <= FP_HANDLE_BYTES, "a buffer fits its handle's slot (handles.h)");

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

/* What a grow did, for its commit or its undo: the retired chunks it took
 * back (from index back, n_back of them) and the chunks it mapped (from
 * index n0). */
typedef struct grown {
    uint32_t back, n_back, n0;
} grown;

/* Grows b's mapping to cover `target`: retired chunks behind the live ones
 * taken back first (still mapped, data and all), then new chunks mapped.
 * Nothing a caller sees is committed: the generations are grow_commit's,
 * and grow_undo takes everything back (also after a failure here).  A map
 * that fails names fn, the public call, and then, what becomes of it. */
static fabpool_status grow(fp_buffers *bs, struct fabpool_buffer *b, uint64_t target, grown *g, const char *fn,
                           const char *then)
{
    fp_lock_assert_held(&bs->sp->lock);
    g->back = g->n0 = b->n;
    g->n_back = 0;
    /* the work of the streams the retired chunks were retired on may still use them: their tickets stay, and
     * whatever unmaps or replaces them later waits for it */
    for (uint32_t i = 0; i < b->n && b->live < target; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (!c->retiring)
            continue;
        if (c->off != b->live)
            break; /* not behind the live chunks (a chunk before it failed to unmap): it cannot come back */
        if (!g->n_back)
            g->back = i;
        g->n_back++;
        c->retiring = 0;
        fp_chunk_set_copy(bs->sp->ch, b->base + c->off, 1); /* its bytes matter again */
        b->live += c->size;
        atomic_fetch_sub(&bs->retiring_bytes, c->size);
    }
    while (b->live < target) {
        if (b->n && b->chunks[b->n - 1].retiring)
            return fp_error(FABPOOL_ERR_DRIVER, "a retired chunk of the buffer could not be unmapped earlier and "
                            "is in the way of growing it; fabpool_collect retries the unmap");
        uint64_t c = next_chunk(bs, b, b->live, target);
        if (fp_buffer_reserve_chunks(bs, b, b->n + 1) != 0)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer's chunk list");
        fabpool_status st = fp_heap_chunk_map(bs->heap, b->base + b->live, c, FP_MAP_BUFFER, b);
        if (st == FABPOOL_ERR_OUT_OF_MEMORY && atomic_load(&bs->kept_bytes)) {
            fp_msg_hold h; /* a map that succeeds now leaves the message as it was before the first try */
            fp_error_hold_retry(&h);
            fp_buffers_drop_kept(bs, 1); /* the heap's retry could not see the kept buffers */
            (void)fp_collect_locked(bs, 0);
            st = fp_error_unhold(&h, fp_heap_chunk_map(bs->heap, b->base + b->live, c, FP_MAP_BUFFER, b));
        }
        if (st != FABPOOL_OK) {
            fp_error_append(" (%s: growing a buffer from %llu to %llu bytes; %s)", fn, (unsigned long long)b->size,
                            (unsigned long long)target, then);
            return st;
        }
        fp_bchunk *nc = &b->chunks[b->n++];
        memset(nc, 0, sizeof *nc);
        nc->off = b->live;
        nc->size = c;
        nc->fd = -1;
        b->live += c;
        b->mapped += c;
        atomic_fetch_add(&bs->mapped, c);
    }
    return FABPOOL_OK;
}

/* Puts chunk c back among the retiring ones (a grow undone). */
static void unlive(fp_buffers *bs, struct fabpool_buffer *b, fp_bchunk *c)
{
    c->retiring = 1;
    fp_chunk_set_copy(bs->sp->ch, b->base + c->off, 0);
    b->live -= c->size;
    atomic_fetch_add(&bs->retiring_bytes, c->size);
}

/* Takes a grow back: its chunks unmapped, the retired chunks it took back
 * retired again, the generation as it was.  A chunk whose unmap the driver
 * refuses is retired instead (no descriptor names it): fabpool_collect
 * unmaps it, and the buffer shows what it showed. */
static void grow_undo(fp_buffers *bs, struct fabpool_buffer *b, const grown *g)
{
    uint64_t gen = b->generation;
    /* the failure's message stays first: an unmap the driver refuses here is what came of the undo */
    char first[512];
    snprintf(first, sizeof first, "%s", fabpool_last_error());
    while (b->n > g->n0) {
        fabpool_status st = fp_buffer_pop_chunk(bs, b);
        if (st == FABPOOL_OK)
            continue;
        char then[512];
        snprintf(then, sizeof then, "%s", fabpool_last_error());
        fp_error(st, "%s (undoing it: %s)", first, then);
        break;
    }
    for (uint32_t i = b->n; i-- > g->back;) {
        fp_bchunk *c = &b->chunks[i];
        if (i >= g->n0) {
            c->drop_gen = gen;
            unlive(bs, b, c);
        } else if (i < g->back + g->n_back) {
            unlive(bs, b, c);
        }
    }
    b->generation = gen; /* the chunks it mapped were never seen */
}

/* Commits a grow: one new generation names every chunk it took back or
 * mapped (the next delta carries them). */
static void grow_commit(struct fabpool_buffer *b, const grown *g)
{
    if (!g->n_back && b->n == g->n0)
        return;
    b->generation++;
    for (uint32_t i = g->back; i < g->back + g->n_back; i++)
        b->chunks[i].gen = b->generation;
    for (uint32_t i = g->n0; i < b->n; i++)
        b->chunks[i].gen = b->generation;
}

/* A shrink's plan: chunks [first, last) retire; refit: the chunk before
 * first reaches beyond the hysteresis, and is refit to end at `keep`. */
typedef struct shrunk {
    uint32_t first, last;
    int refit;
    uint64_t keep;
} shrunk;

/* Plans the shrink of b to `target` (nothing changes). */
static void shrink_plan(const fp_buffers *bs, const struct fabpool_buffer *b, uint64_t target, shrunk *s)
{
    s->keep = fp_round_up(target + target / 100 * bs->shrink_hysteresis_percent +
                          target % 100 * bs->shrink_hysteresis_percent / 100, bs->sp->gran);
    uint32_t last = b->n;
    while (last && b->chunks[last - 1].retiring)
        last--;
    uint32_t first = last;
    uint64_t live = b->live;
    while (first && live > s->keep && live - b->chunks[first - 1].size >= target) {
        first--;
        live -= b->chunks[first].size;
    }
    s->first = first;
    s->last = last;
    s->refit = target && live > s->keep && first > 0;
}

/* The steps of n shrinks that can fail, none of which changes a buffer:
 * room for a ticket in every chunk that retires, the pool's context made
 * current (*pushed: pop it with *saved), then one wait for the GPU work
 * (stream NULL: the context synchronized, so the chunks can go at once) or
 * one event on `stream` for every chunk (*ticket).  On failure nothing is
 * left to undo. */
static fabpool_status shrink_prepare(fp_buffers *bs, struct fabpool_buffer *const *bufs, const shrunk *s, size_t n,
                                     void *stream, fp_rticket *ticket, CUcontext *saved, int *pushed)
{
    uint32_t holders = 0;
    int refits = 0;
    ticket->rs = NULL;
    ticket->seq = 0;
    *pushed = 0;
    for (size_t k = 0; k < n; k++) {
        holders += s[k].last - s[k].first;
        refits |= s[k].refit;
        for (uint32_t i = s[k].first; stream && i < s[k].last; i++)
            if (fp_retire_waits_reserve(bs->retire, &bufs[k]->chunks[i].uses) != 0)
                return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of streams that use a "
                                "buffer chunk; nothing changed");
    }
    if (!holders && !refits)
        return FABPOOL_OK;
    fabpool_status st = fp_ctx_push(bs->sp->ch, saved);
    if (st != FABPOOL_OK)
        return st;
    *pushed = 1;
    if (holders && !stream)
        st = fp_buffers_sync(bs, NULL, "before unmapping a shrunk buffer's chunks; nothing changed");
    else if (holders && (st = fp_retire_mark(bs->retire, stream, holders, ticket)) != FABPOOL_OK)
        fp_error_append(" (before retiring a buffer chunk; nothing changed)");
    if (st != FABPOOL_OK) {
        fp_ctx_pop(bs->sp->ch, *saved);
        *pushed = 0;
    }
    return st;
}

/* Commits a shrink: its chunks retire, each waiting for the ticket (with
 * none, collect unmaps them at once). */
static void shrink_commit(fp_buffers *bs, struct fabpool_buffer *b, const shrunk *s, fp_rticket ticket)
{
    if (s->first == s->last)
        return;
    for (uint32_t i = s->first; i < s->last; i++) {
        fp_bchunk *c = &b->chunks[i];
        c->retiring = 1;
        fp_chunk_set_copy(bs->sp->ch, b->base + c->off, 0); /* nothing in it to keep through a sleep */
        fp_retire_waits_add(bs->retire, &c->uses, ticket);
        c->drop_gen = b->generation + 1;
        b->live -= c->size;
        atomic_fetch_add(&bs->retiring_bytes, c->size);
    }
    b->generation++; /* the live chunks changed */
}

/* After the commit: the refit a shrink planned, its last live chunk
 * replaced by a smaller one.  The driver or the device refusing it leaves
 * the chunk whole (logged; a later shrink refits it): FABPOOL_OK.  Where
 * the refit lost the chunk (the driver refused to map the old chunk back: a
 * second fault), the buffer ends where that chunk began, its size too (it
 * never counts bytes it does not map): FABPOOL_ERR_PARTIAL, the message
 * says what was lost.  k: the buffer's place in the set. */
static fabpool_status shrink_refit(fp_buffers *bs, struct fabpool_buffer *b, const shrunk *s, uint64_t target,
                                   void *stream, size_t k)
{
    if (!s->refit)
        return FABPOOL_OK;
    uint32_t j = s->first - 1;
    int lost = 0;
    uint64_t whole = b->chunks[j].size;
    fp_msg_hold h; /* a chunk kept whole is no failure of the call's */
    fp_error_hold(&h);
    fabpool_status st = fp_buffer_refit(bs, b, j, s->keep - b->chunks[j].off, target, stream, &lost);
    if (st != FABPOOL_OK && !lost)
        FP_LOG_CH(FP_LOG_INFO, bs->sp->ch, "a buffer shrunk to %llu bytes keeps a chunk of %llu bytes whole: %s",
                  (unsigned long long)target, (unsigned long long)whole, fabpool_last_error());
    if (fp_error_unhold(&h, lost ? FABPOOL_ERR_PARTIAL : FABPOOL_OK) == FABPOOL_OK)
        return FABPOOL_OK;
    atomic_fetch_sub(&bs->bytes, b->size - b->live);
    b->size = b->live;
    FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_RESIZE, b->base, b->size, stream, FABPOOL_ERR_PARTIAL);
    char why[1024];
    snprintf(why, sizeof why, "%s", fabpool_last_error());
    return fp_error(FABPOOL_ERR_PARTIAL, "%s; so buffer %zu of the set, shrunk to %llu bytes, now has %llu bytes, all "
                    "of them mapped, its data below that kept and the rest lost (every other buffer has its new "
                    "size); resize it to use more", why, k, (unsigned long long)target, (unsigned long long)b->size);
}

/* Resizes n buffers of the pool all or nothing (fabpool.h): every grow and
 * every shrink's steps that can fail first, undone on a failure; then the
 * commits, which cannot fail; then the refits.  g and s: room for n. */
static fabpool_status resize_locked(fp_buffers *bs, struct fabpool_buffer *const *bufs, const size_t *sizes,
                                    size_t n, void *stream, grown *g, shrunk *s)
{
    fp_lock_assert_held(&bs->sp->lock);
    fabpool_status st = FABPOOL_OK;
    size_t grew = 0;
    for (; grew < n && st == FABPOOL_OK; grew++) {
        g[grew].back = g[grew].n0 = bufs[grew]->n;
        g[grew].n_back = 0;
        if (sizes[grew] > bufs[grew]->live)
            st = grow(bs, bufs[grew], sizes[grew], &g[grew], n > 1 ? "fabpool_buffer_resize_set" :
                      "fabpool_buffer_resize", n > 1 ? "every buffer keeps its size and data" :
                      "it keeps its size and data");
    }
    for (size_t i = 0; i < n && st == FABPOOL_OK; i++)
        shrink_plan(bs, bufs[i], sizes[i], &s[i]);
    fp_rticket ticket;
    CUcontext saved = NULL;
    int pushed = 0;
    if (st == FABPOOL_OK)
        st = shrink_prepare(bs, bufs, s, n, stream, &ticket, &saved, &pushed);
    if (st != FABPOOL_OK) {
        for (size_t i = grew; i-- > 0;)
            grow_undo(bs, bufs[i], &g[i]);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        struct fabpool_buffer *b = bufs[i];
        grow_commit(b, &g[i]);
        shrink_commit(bs, b, &s[i], ticket);
        if (sizes[i] >= b->size) { /* by the difference: the in-use mark never sees both sizes */
            atomic_fetch_add(&bs->bytes, sizes[i] - b->size);
            fp_usage_raise(bs->use);
        } else {
            atomic_fetch_sub(&bs->bytes, b->size - sizes[i]);
        }
        b->size = sizes[i];
        FP_TRACE_ST(bs->trace, FABPOOL_TR_BUF_RESIZE, b->base, sizes[i], stream, FABPOOL_OK);
    }
    char first[1024] = ""; /* the first refit that lost a chunk: a later refit puts back or writes the message */
    for (size_t i = 0; i < n; i++) {
        fabpool_status s2 = shrink_refit(bs, bufs[i], &s[i], sizes[i], stream, i);
        if (s2 != FABPOOL_OK && st == FABPOOL_OK) {
            st = s2;
            snprintf(first, sizeof first, "%s", fabpool_last_error());
        }
    }
    if (st != FABPOOL_OK)
        fp_error(st, "%s", first);
    if (pushed)
        fp_ctx_pop(bs->sp->ch, saved);
    return st;
}

/* ------------------------------------------------------------ API */

fabpool_status fp_buffer_create(fp_buffers *bs, size_t max_size, size_t size, fabpool_buffer_t **out)
{
    if (!bs || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: the pool or the output pointer is NULL");
    *out = NULL;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_create");
    if (max_size == 0 || size == 0 || size > max_size)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_create: max_size %zu and size %zu: both must be "
                        "at least 1 and size <= max_size", max_size, size);
    if (fp_chunks_asleep(bs->sp->ch)) /* before the room: an asleep pool says so, whatever the size */
        return fp_chunk_asleep_error("fabpool_buffer_create");
    if (max_size > fp_space_size(bs->sp) - bs->sp->gran) /* a larger reserve helps up to its maximum only */
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: max_size %zu is larger than the pool's "
                        "reserved address space (%llu bytes); %s", max_size, (unsigned long long)fp_space_size(bs->sp),
                        max_size > FP_RESERVE_MAX - bs->sp->gran ? "it is beyond any reservation (reserve is at most "
                        "1PiB): ask for a smaller max_size" : "raise reserve");
    fabpool_status fits = fp_chunk_fits_device(bs->sp->ch, size, "fabpool_buffer_create: a size of");
    if (fits != FABPOOL_OK) /* refused before anything is mapped, not after the whole device was */
        return fits;
    struct fabpool_buffer *b = fp_handle_alloc(FP_HANDLE_BUFFER, bs->sp->meta);
    if (!b)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a buffer");
    uint64_t window = fp_round_up(max_size, bs->sp->gran);
    b->owner = bs;
    b->window = window;
    static _Atomic uint64_t uids;
    b->uid = ((uint64_t)getpid() << 32) ^ (atomic_fetch_add(&uids, 1) + 1) ^ ((uint64_t)(uintptr_t)b << 12);
    fp_lock(&bs->sp->lock);
    b->base = fp_va_alloc(&bs->sp->va, window, bs->sp->gran);
    if (!b->base) {
        int asleep = fp_chunks_asleep(bs->sp->ch);
        fp_unlock(&bs->sp->lock);
        fp_handle_free(b, bs->sp->meta);
        if (asleep)
            return fp_chunk_asleep_error("fabpool_buffer_create");
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_create: no free address range of %llu bytes left in the "
                        "pool's reservation of %llu bytes; raise reserve", (unsigned long long)window,
                        (unsigned long long)fp_space_size(bs->sp));
    }
    if (fp_chunks_asleep(bs->sp->ch)) {
        fp_va_free(&bs->sp->va, b->base, b->window);
        fp_unlock(&bs->sp->lock);
        fp_handle_free(b, bs->sp->meta);
        return fp_chunk_asleep_error("fabpool_buffer_create");
    }
    FP_LIST_PUSH(&bs->list, b, next, prev);
    atomic_fetch_add(&bs->count, 1);
    grown g;
    fabpool_status st = grow(bs, b, size, &g, "fabpool_buffer_create", "no buffer was made");
    if (st != FABPOOL_OK) {
        grow_undo(bs, b, &g);
        b->destroyed = 1;
        fp_handle_kill(b);
        if (!b->n)
            fp_buffer_free(bs, b); /* else the collect that unmaps the chunk the driver kept frees it */
        atomic_fetch_sub(&bs->count, 1);
        fp_unlock(&bs->sp->lock);
        return st;
    }
    grow_commit(b, &g);
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
    const char *fn = n > 1 ? "fabpool_buffer_resize_set" : "fabpool_buffer_resize";
    for (size_t i = 0; i < n; i++) { /* every handle before any is read */
        char which[32] = "the buffer";
        if (n > 1)
            snprintf(which, sizeof which, "buffer %zu", i);
        fabpool_status st = fp_handle_check(bufs[i], FP_HANDLE_BUFFER, fn, which);
        if (st != FABPOOL_OK)
            return st;
    }
    fp_buffers *bs = bufs[0]->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, fn);
    for (size_t i = 0; i < n; i++) {
        if (bufs[i]->owner != bs)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffer %zu is of another pool", i);
        for (size_t k = 0; k < i; k++)
            if (bufs[k] == bufs[i])
                return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_resize_set: buffers %zu and %zu are the same "
                                "buffer; give each buffer once, with its one size", k, i);
        fabpool_status st = check_size(bufs[i], sizes[i], fn);
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
    grown g_stack[STACK], *g = g_stack;
    shrunk s_stack[STACK] = {{0, 0, 0, 0}}, *sh = s_stack;
    size_t bytes = n * (sizeof *g + sizeof *sh);
    if (n > STACK) {
        if (!(g = fp_meta_alloc(bs->sp->meta, bytes)))
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to resize %zu buffers", n);
        sh = (shrunk *)(g + n);
    }
    fp_lock(&bs->sp->lock);
    fabpool_status st = FABPOOL_OK;
    if (fp_chunks_asleep(bs->sp->ch)) {
        st = fp_chunk_asleep_error("fabpool_buffer_resize");
    } else {
        /* a collect that fails here is retried by the next one: no failure of the resize's */
        fp_msg_hold h;
        fp_error_hold(&h);
        fp_buffers_drop_kept(bs, 0); /* those kept for keep_ms go before anything maps */
        (void)fp_collect_locked(bs, 0);
        fp_error_unhold(&h, FABPOOL_OK);
        fp_error_hold(&h);
        st = resize_locked(bs, bufs, sizes, n, stream, g, sh);
        if (st == FABPOOL_OK)
            (void)fp_collect_locked(bs, 0);
        fp_error_unhold(&h, st);
    }
    fp_unlock(&bs->sp->lock);
    if (g != g_stack)
        fp_meta_free(bs->sp->meta, g, bytes);
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
    shrunk s;
    fp_rticket ticket;
    CUcontext saved;
    int pushed;
    shrink_plan(bs, b, 0, &s);
    fabpool_status st = shrink_prepare(bs, &b, &s, 1, stream, &ticket, &saved, &pushed);
    if (st != FABPOOL_OK)
        return st; /* nothing was retired: the buffer is as it was */
    shrink_commit(bs, b, &s, ticket);
    if (pushed)
        fp_ctx_pop(bs->sp->ch, saved);
    if (b->kept) {
        atomic_fetch_sub(&bs->kept_bytes, live);
        b->kept = 0;
    } else {
        atomic_fetch_sub(&bs->bytes, b->size);
        atomic_fetch_sub(&bs->count, 1);
    }
    b->size = 0;
    b->destroyed = 1;
    fp_handle_kill(b); /* refused from now on; the struct stays until its chunks are collected */
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ kept buffers (release.c) */

/* No trace record: the release recorded the buffer's destroy, and the unmaps record what goes back now. */
static void drop(fp_buffers *bs, struct fabpool_buffer *b)
{
    /* where the driver refuses the context sync, the buffer stays kept and a later drop retries: no failure of
     * the call that drops it */
    fp_msg_hold h;
    fp_error_hold(&h);
    /* no GPU work uses a released buffer (fabpool.h): no stream to wait for */
    if (fp_buffer_destroy_locked(bs, b, NULL) != FABPOOL_OK)
        FP_LOG_CH(FP_LOG_WARN, bs->sp->ch, "a kept buffer could not be given back yet: %s", fabpool_last_error());
    fp_error_unhold(&h, FABPOOL_OK);
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
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_get_info: the output is NULL");
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_get_info", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    st = fp_struct_size_check("fabpool_buffer_get_info", "fabpool_buffer_info", out->struct_size, sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_get_info");
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

void *fabpool_buffer_ptr(const fabpool_buffer_t *b)
{
    if (fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_ptr", "the buffer") != FABPOOL_OK)
        return NULL;
    return (void *)(uintptr_t)b->base;
}
