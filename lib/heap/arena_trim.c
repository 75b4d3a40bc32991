/* arena_trim.c - an arena's free chunks unmapped (fp_arena_unmap_free: the
 * trade before a miss maps, trims and the decay) and the sizes of its
 * recent blocks that say which free ranges are room (arena.h). */
#include "arena_trim.h"

#include <string.h>

#include "array.h"

/* Unmaps chunk ci, which lies wholly in free range f: f splits around it,
 * and so does its run.  0, or -1 when the driver refused (nothing changed). */
static int unmap_in(fp_arena *a, fp_piece *f, size_t ci)
{
    fp_lchunk c = a->chunks[ci];
    uint64_t lsize = c.va - f->base, rsize = f->base + fp_piece_size(f) - (c.va + c.size);
    if (fp_chunk_unmap(a->sp->ch, c.va, c.size) != FABPOOL_OK)
        return -1;
    fp_map_set(&a->sp->map, c.va, c.size, NULL);
    memmove(&a->chunks[ci], &a->chunks[ci + 1], (a->n_chunks - ci - 1) * sizeof *a->chunks);
    a->n_chunks--;
    a->mapped_bytes -= c.size;
    a->free_bytes -= c.size;
    fp_arena_index_drop(a, c.va, c.size);
    fp_va_free(&a->sp->va, c.va, c.size);
    size_t ri = fp_arena_run_of(a, f->base);
    fp_run run = a->runs[ri];
    fp_arena_bin_remove(a, f);
    fp_piece *before = f->aprev, *after = f->anext;
    /* the low part of the run: [run.base, c.va) */
    fp_piece *ltail = lsize ? f : before;
    if (lsize) {
        fp_piece_resize(f, lsize);
        f->anext = NULL;
        fp_arena_bin_insert(a, f);
    } else if (before) {
        before->anext = NULL;
    }
    /* the high part: [c.va + c.size, run end) */
    fp_piece *rhead = after;
    if (rsize) {
        rhead = fp_arena_piece_new(a, c.va + c.size, rsize, FP_LARGE_FREE);
        rhead->anext = after;
        if (after)
            after->aprev = rhead;
        fp_arena_bin_insert(a, rhead);
    } else if (after) {
        after->aprev = NULL;
    }
    if (!lsize)
        fp_arena_piece_drop(a, f);
    fp_arena_run_remove(a, ri);
    if (ltail)
        fp_arena_run_insert(a, (fp_run){run.base, c.va - run.base, run.head, ltail});
    if (rhead)
        fp_arena_run_insert(a, (fp_run){c.va + c.size, run.base + run.size - (c.va + c.size), rhead,
                               run.tail == f ? rhead : run.tail});
    return 0;
}

/* What unmapping chunk c takes from the bytes in free ranges of fit bytes or
 * more, c lying in such a range [base, base + size): the chunk, and what is
 * left on either side of it if that fits no more. */
static uint64_t fitting_loss(uint64_t base, uint64_t size, fp_lchunk c, uint64_t fit)
{
    uint64_t low = c.va - base, high = size - low - c.size;
    return c.size + (low < fit ? low : 0) + (high < fit ? high : 0);
}

uint64_t fp_arena_unmap_free(fp_arena *a, uint64_t goal, uint64_t fit, uint64_t keep)
{
    fp_lock_assert_held(&a->sp->lock);
    uint64_t done = 0, useful = 0;
    /* only a free range of a granule or more can hold a chunk: bins from there up */
    unsigned b0 = fp_arena_bin_of(a->sp->gran >> a->qshift);
    if (fit)
        for (unsigned b = fp_arena_bin_next(a, fp_arena_bin_of(fit >> a->qshift)); b < FP_ARENA_NBINS; b = fp_arena_bin_next(a, b + 1))
            for (fp_piece *p = a->bins[b]; p; p = p->next)
                useful += fp_piece_size(p) >= fit ? fp_piece_size(p) : 0;
    while (done < goal) {
        fp_piece *f = NULL;
        size_t ci = 0;
        uint64_t lost = 0;
        for (unsigned b = fp_arena_bin_next(a, b0); b < FP_ARENA_NBINS && !f; b = fp_arena_bin_next(a, b + 1))
            for (fp_piece *p = a->bins[b]; p && !f; p = p->next) {
                size_t i = fp_arena_chunk_lower(a, p->base);
                if (i >= a->n_chunks || a->chunks[i].va + a->chunks[i].size > p->base + fp_piece_size(p))
                    continue;
                uint64_t c = fit && fp_piece_size(p) >= fit ? fitting_loss(p->base, fp_piece_size(p), a->chunks[i], fit) : 0;
                if (!c || useful >= keep + c) {
                    f = p;
                    ci = i;
                    lost = c;
                }
            }
        /* two runs where there was one, and a record for the high part of f */
        if (!f || fp_arena_spare_reserve(a, 1) != 0 ||
            FP_ARRAY_RESERVE(a->sp->meta, a->runs, a->n_runs, a->cap_runs, a->n_runs + 1, 8) != 0)
            break;
        uint64_t size = a->chunks[ci].size;
        if (unmap_in(a, f, ci) != 0)
            break;
        useful -= lost;
        done += size;
    }
    return done;
}

uint64_t fp_arena_recent_size(const fp_arena *a, unsigned rank)
{
    unsigned k = a->ring_at < FP_ARENA_RATE ? a->ring_at : FP_ARENA_RATE;
    if (!k)
        return 0;
    uint64_t s[FP_ARENA_RATE];
    memcpy(s, a->ring_size, k * sizeof *s);
    unsigned want = rank * k / FP_ARENA_RATE;
    for (unsigned i = 0; i <= want; i++) /* a partial selection sort: rank is small */
        for (unsigned j = i + 1; j < k; j++)
            if (s[j] < s[i]) {
                uint64_t t = s[i];
                s[i] = s[j];
                s[j] = t;
            }
    return s[want];
}
