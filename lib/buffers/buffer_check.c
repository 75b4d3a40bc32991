/* buffer_check.c - fabpool_check's walk of the buffers (walk.h): the list,
 * each buffer's window and chunks, and the buffers' counters.  Pool lock
 * held (pool/check.c takes it). */
#include "buffer_check.h"

#include "handles.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* Buffer b's chunks: apart, in whole granules, in its window, a live
 * buffer's live chunks following each other from its base and the retiring
 * ones after them, in order (a refit that shrank the last live chunk and
 * could not unmap those after it leaves a gap before them: a grow takes
 * back only a retiring chunk that lies right behind the live ones); *live
 * and *all their sums. */
static fabpool_status check_buffer_chunks(fp_walk *w, const struct fabpool_buffer *b, uint64_t *live, uint64_t *all)
{
    uint64_t end = 0;
    int retired_seen = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        const fp_bchunk *c = &b->chunks[i];
        if (!c->size || c->off < end || c->off + c->size > b->window || (c->off | c->size) & (w->gran - 1))
            return FAIL("[buffer.chunks] buffer 0x%llx: chunk %u (%llu bytes at +%llu) is empty, overlaps the one "
                        "before, is not in whole granules or leaves the window of %llu bytes", ULL(b->base), i,
                        ULL(c->size), ULL(c->off), ULL(b->window));
        if (!b->destroyed && !c->retiring && c->off != end)
            return FAIL("[buffer.contiguous] buffer 0x%llx: chunk %u starts at +%llu, the chunks before end at "
                        "+%llu (a live buffer's chunks follow each other from its base)", ULL(b->base), i,
                        ULL(c->off), ULL(end));
        uint32_t tickets;
        size_t room;
        if (!fp_retire_waits_ok(&c->uses, &tickets, &room))
            return FAIL("[buffer.uses] buffer 0x%llx: chunk %u's list of streams that may use it holds %u tickets "
                        "in room for %zu, one of no stream, or two of one stream", ULL(b->base), i, tickets, room);
        if (!b->destroyed && !c->retiring && retired_seen)
            return FAIL("[buffer.retire] buffer 0x%llx: live chunk %u lies after a retiring one (the live chunks "
                        "come first)", ULL(b->base), i);
        retired_seen |= c->retiring;
        end = c->off + c->size;
        *all += c->size;
        *live += c->retiring ? 0 : c->size;
        w->fds += c->fd >= 0;
        w->n_chunks++;
        w->chunk_bytes += c->size;
    }
    return FABPOOL_OK;
}

/* What the walk adds up, for the buffers' counters. */
typedef struct buffer_sums {
    uint64_t bytes, mapped, retiring, count, held, kept;
} buffer_sums;

static fabpool_status check_buffer(fp_walk *w, const fp_buffers *bs, const struct fabpool_buffer *b,
                                   const struct fabpool_buffer *pv, buffer_sums *sum)
{
    if (b->prev != pv || b->owner != bs)
        return FAIL("[buffer.list] buffer 0x%llx: its back link or its pool is wrong", ULL(b->base));
    if (!b->window || ((b->base - w->va_base) | b->window) & (w->gran - 1) || b->n > b->cap ||
        b->n_peer_holds > b->cap_peer_holds)
        return FAIL("[buffer.window] buffer 0x%llx: window of %llu bytes not in whole granules, or %u chunks in a "
                    "list of %zu", ULL(b->base), ULL(b->window), b->n, b->cap);
    uint64_t live = 0, all = 0;
    fabpool_status st = check_buffer_chunks(w, b, &live, &all);
    if (st != FABPOOL_OK)
        return st;
    if (live != b->live || all != b->mapped)
        return FAIL("[buffer.sums] buffer 0x%llx: its chunks add up to %llu live and %llu mapped bytes, it says "
                    "%llu and %llu", ULL(b->base), ULL(live), ULL(all), ULL(b->live), ULL(b->mapped));
    if (b->destroyed ? b->size != 0 || b->live != 0 : b->size > b->live)
        return FAIL("[buffer.size] buffer 0x%llx%s: size %llu with %llu bytes live", ULL(b->base),
                    b->destroyed ? " (destroyed)" : "", ULL(b->size), ULL(b->live));
    if (fp_handle_live(b, FP_HANDLE_BUFFER) != (!b->destroyed && !b->kept))
        return FAIL("[buffer.handle] buffer 0x%llx%s: its handle is %s", ULL(b->base), b->destroyed ? " (destroyed)"
                    : b->kept ? " (released)" : "", fp_handle_live(b, FP_HANDLE_BUFFER) ? "live" : "refused");
    for (uint32_t i = 0; i < b->n_peer_holds; i++)
        sum->held += b->peer_holds[i].size;
    sum->bytes += b->size;
    sum->mapped += b->mapped;
    sum->retiring += b->mapped - b->live;
    sum->count += !b->destroyed && !b->kept;
    sum->kept += b->kept ? b->live : 0;
    if (fp_walk_use(w, b->base, b->window, "a buffer's window", b) != 0)
        return FP_WALK_HOST_FAIL();
    return FABPOOL_OK;
}

fabpool_status fp_buffers_check(const fp_buffers *bs, fp_walk *w)
{
    buffer_sums sum = {0, 0, 0, 0, 0, 0};
    const struct fabpool_buffer *pv = NULL;
    for (const struct fabpool_buffer *b = bs->list; b; pv = b, b = b->next) {
        fabpool_status st = check_buffer(w, bs, b, pv, &sum);
        if (st != FABPOOL_OK)
            return st;
    }
    struct {
        const char *name;
        uint64_t walk, stat;
    } sums[] = {
        {"buffer_bytes", sum.bytes, atomic_load(&bs->bytes)},
        {"buffer_mapped", sum.mapped, atomic_load(&bs->mapped)},
        {"retiring_bytes", sum.retiring, atomic_load(&bs->retiring_bytes)},
        {"buffer_count", sum.count, atomic_load(&bs->count)},
        {"held_for_peers_bytes", sum.held, atomic_load(&bs->held_for_peers_bytes)},
        {"kept_bytes (buffers)", sum.kept, atomic_load(&bs->kept_bytes)},
    };
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
        if (sums[i].walk != sums[i].stat)
            return FAIL("[buffer.stats] the buffers add up to %llu for %s, the pool's counter says %llu",
                        ULL(sums[i].walk), sums[i].name, ULL(sums[i].stat));
    return FABPOOL_OK;
}

fabpool_status fp_buffers_check_stuck(const fp_buffers *bs, fp_walk *w)
{
    if (bs->n_stuck > bs->cap_stuck)
        return FAIL("[buffer.stuck] %u copies the driver would not unmap, in a list of %zu", bs->n_stuck,
                    bs->cap_stuck);
    for (uint32_t i = 0; i < bs->n_stuck; i++) {
        const fp_stuck_copy *c = &bs->stuck[i];
        if (!c->size || ((c->va - w->va_base) | c->size) & (w->gran - 1))
            return FAIL("[buffer.stuck] the copy at 0x%llx of %llu bytes is empty or not in whole granules",
                        ULL(c->va), ULL(c->size));
        if (fp_walk_use(w, c->va, c->size, "a shrunk chunk's copy the driver would not unmap", c) != 0)
            return FP_WALK_HOST_FAIL();
        w->n_chunks++;
        w->chunk_bytes += c->size;
    }
    return FABPOOL_OK;
}
