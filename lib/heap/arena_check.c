/* arena_check.c - fabpool_check's walk of the arenas (walk.h): each
 * arena's chunks against its runs, the pieces of its runs, its bins, its
 * table of blocks and its pages of records, its counters, and the heap's
 * count of large blocks.
 * Runs under the pool lock (pool/check.c takes it). */
#include "arena_check.h"

#include <stdlib.h>

#include "pending.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* The chunks of arena a: sorted, apart, in whole granules, in the reservation. */
static fabpool_status check_arena_chunks(fp_walk *w, const fp_arena *a)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < a->n_chunks; i++) {
        const fp_lchunk *c = &a->chunks[i];
        if (!c->size || ((c->va - w->va_base) | c->size) & (w->gran - 1) || c->va < w->va_base ||
            c->va + c->size > w->va_base + w->va_size)
            return FAIL("[arena.chunk] chunk %zu of %s [0x%llx, +%llu) is empty, not in whole granules or outside the "
                        "reservation", i, a->name, ULL(c->va), ULL(c->size));
        if (i && c->va < a->chunks[i - 1].va + a->chunks[i - 1].size)
            return FAIL("[arena.chunk] chunks %zu [0x%llx, +%llu) and %zu [0x%llx, +%llu) of %s are not sorted or "
                        "overlap", i - 1, ULL(a->chunks[i - 1].va), ULL(a->chunks[i - 1].size), i, ULL(c->va),
                        ULL(c->size), a->name);
        sum += c->size;
        w->n_chunks++;
        w->chunk_bytes += c->size;
    }
    if (sum != a->mapped_bytes)
        return FAIL("[arena.sums] the chunks of %s add up to %llu bytes, it counts %llu mapped", a->name, ULL(sum),
                    ULL(a->mapped_bytes));
    /* the runs are what the chunks map: both walked as maximal ranges */
    size_t r = 0, k = 0;
    while (r < a->n_runs || k < a->n_chunks) {
        uint64_t rlo = 0, rhi = 0, clo = 0, chi = 0;
        if (r < a->n_runs) {
            rlo = a->runs[r].base;
            rhi = rlo + a->runs[r++].size;
        }
        if (k < a->n_chunks) {
            clo = a->chunks[k].va;
            chi = clo + a->chunks[k++].size;
            while (k < a->n_chunks && a->chunks[k].va == chi)
                chi += a->chunks[k++].size;
        }
        if (rlo != clo || rhi != chi)
            return FAIL("[arena.cover] %s has a run [0x%llx, 0x%llx) where its chunks map [0x%llx, 0x%llx) (the "
                        "runs are the mapped ranges, and runs that touch are one)", a->name, ULL(rlo), ULL(rhi),
                        ULL(clo), ULL(chi));
    }
    return FABPOOL_OK;
}

/* The addresses of an arena's pages of records, sorted: a link is checked against them before it is followed
 * (a corrupted record must be reported, not crash the check). */
typedef struct rec_pages {
    uintptr_t *at;
    size_t n;
} rec_pages;

static int cmp_addr(const void *x, const void *y)
{
    uintptr_t p = *(const uintptr_t *)x, q = *(const uintptr_t *)y;
    return (p > q) - (p < q);
}

/* rp filled from arena a's directory: 0, or -1 without host memory. */
static int rec_pages_make(rec_pages *rp, const fp_arena *a)
{
    rp->n = 0;
    rp->at = malloc((a->recs.n_pages ? a->recs.n_pages : 1) * sizeof *rp->at);
    if (!rp->at)
        return -1;
    for (size_t i = 0; i < a->recs.n_pages; i++)
        if (a->recs.pages[i])
            rp->at[rp->n++] = (uintptr_t)a->recs.pages[i];
    qsort(rp->at, rp->n, sizeof *rp->at, cmp_addr);
    return 0;
}

/* Whether q is a record of a page of the arena (compared as addresses: q may be anything). */
static int is_rec(const rec_pages *rp, const fp_piece *q)
{
    uintptr_t at = (uintptr_t)q, pg = at & ~(uintptr_t)(FP_PIECE_PAGE_BYTES - 1), off = at - pg;
    size_t lo = 0, hi = rp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rp->at[mid] < pg)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rp->n && rp->at[lo] == pg && off && off % sizeof *q == 0 && off / sizeof *q < FP_PIECE_SLOTS;
}

/* Link q to follow: q where it is NULL or a record of the arena's pages, else NULL with *bad set. */
static const fp_piece *lnk(const rec_pages *rp, const fp_piece *q, int *bad)
{
    if (!q || is_rec(rp, q))
        return q;
    *bad = 1;
    return NULL;
}

/* The record of id r (a table's), or NULL: for 0, and (with *bad set) where r names no record of a page of the
 * arena. */
static const fp_piece *rec(const fp_arena *a, fp_rid r, int *bad)
{
    size_t i = r >> FP_PIECE_PAGE_SHIFT;
    uint32_t off = r & (FP_PIECE_PAGE_BYTES - 1);
    if (!r)
        return NULL;
    if (i >= a->recs.n_pages || !a->recs.pages[i] || !off || off % sizeof(fp_piece) ||
        off / sizeof(fp_piece) >= FP_PIECE_SLOTS) {
        *bad = 1;
        return NULL;
    }
    return fp_piece_at(a, r);
}

/* The pages of arena a's records: each in the directory at the index it
 * names, aligned to its size, its spare records (its own) on its list and
 * counted, the pages with spares (and only those) on the list of pages to
 * take from, the cache's spare records distinct records of those pages, the
 * spares counted in all, and every other record a piece of a run (in_runs
 * of them). */
static fabpool_status check_arena_records(const fp_arena *a, const rec_pages *rp, uint64_t in_runs)
{
    uint64_t pages = 0, spare = 0, with_spare = 0, avail = 0;
    for (size_t i = 0; i < a->recs.n_pages; i++) {
        const fp_piece_page *pg = a->recs.pages[i];
        if (!pg)
            continue;
        uint64_t n = 0;
        int bad = 0;
        for (const fp_piece *q = lnk(rp, pg->spare, &bad); q; q = lnk(rp, q->next, &bad))
            if (++n > FP_PIECE_SLOTS || ((uintptr_t)q & ~(uintptr_t)(FP_PIECE_PAGE_BYTES - 1)) != (uintptr_t)pg)
                break;
        pages++;
        if (bad || pg->idx != i || ((uintptr_t)pg & (FP_PIECE_PAGE_BYTES - 1)) || n != pg->n_spare ||
            a->recs.rbase[i] + ((uintptr_t)i << FP_PIECE_PAGE_SHIFT) != (uintptr_t)pg)
            return FAIL("[arena.records] %s: page %zu of records holds %llu spare records on its list and counts %u "
                        "(or its list runs out of the page, or it names another index, %u, or is not aligned, or "
                        "its ids' base in the directory is not its address less its first id's records)",
                        a->name, i, ULL(n), pg->n_spare, pg->idx);
        spare += n;
        with_spare += n != 0;
    }
    uint64_t cached = a->recs.n_cache;
    for (uint32_t i = 0; i < a->recs.n_cache && i < FP_RECS_CACHE; i++) {
        const fp_piece *q = a->recs.cache[i];
        uint32_t dup = !is_rec(rp, q);
        for (uint32_t j = 0; j < i; j++)
            dup |= a->recs.cache[j] == a->recs.cache[i];
        if (dup)
            return FAIL("[arena.records] %s: spare record %u of the cache of %u names no record of the arena's "
                        "pages (or one the cache names twice)", a->name, i, a->recs.n_cache);
    }
    if (cached > FP_RECS_CACHE)
        return FAIL("[arena.records] %s: the cache of spare records counts %llu, more than its %u", a->name,
                    ULL(cached), FP_RECS_CACHE);
    for (uint32_t k = a->recs.avail, pv = 0; k; pv = k, k = a->recs.pages[k - 1]->avail_next)
        if (++avail > pages || k > a->recs.n_pages || !a->recs.pages[k - 1] || !a->recs.pages[k - 1]->n_spare ||
            a->recs.pages[k - 1]->avail_prev != pv)
            return FAIL("[arena.records] %s: the list of pages with spare records holds one without any, or more "
                        "pages than the arena has (or a back link is wrong)", a->name);
    if (avail != with_spare || spare + cached != a->recs.n_spare ||
        pages * (FP_PIECE_SLOTS - 1) - spare - cached != in_runs)
        return FAIL("[arena.records] %s: %llu pages of %u records, %llu of them with spares (%llu listed), %llu "
                    "spare and %llu in the cache (it counts %zu), %llu pieces in its runs", a->name, ULL(pages),
                    FP_PIECE_SLOTS - 1, ULL(with_spare), ULL(avail), ULL(spare), ULL(cached), a->recs.n_spare,
                    ULL(in_runs));
    return FABPOOL_OK;
}

/* Every free range of arena a (nfree of them) in the bin of its size, and
 * nothing else in a bin; the bitmap and its summary say which bins hold any. */
static fabpool_status check_arena_bins(const fp_arena *a, const rec_pages *rp, uint64_t nfree)
{
    uint64_t binned = 0;
    for (unsigned k = 0; k < FP_ARENA_NBINS / 64; k++)
        if (((a->summary >> k) & 1) != (a->bitmap[k] != 0))
            return FAIL("[arena.bin] %s: word %u of its bitmap is %s but its summary bit says %d", a->name, k,
                        a->bitmap[k] ? "set" : "clear", (int)((a->summary >> k) & 1));
    for (unsigned b = 0; b < FP_ARENA_NBINS; b++) {
        int bit = (a->bitmap[b / 64] >> (b % 64)) & 1, bad = 0;
        if (bit != (a->bins[b] != 0))
            return FAIL("[arena.bin] %s: bin %u is %s but its bit says %d", a->name, b, a->bins[b] ? "full" : "empty",
                        bit);
        const fp_piece *pv = NULL;
        for (const fp_piece *q = lnk(rp, a->bins[b], &bad);; pv = q, q = lnk(rp, q->next, &bad)) {
            if (!q && !bad)
                break;
            if (!q || ++binned > nfree || q->state != FP_LARGE_FREE || q->bin != b || q->prev != pv ||
                fp_arena_find(a, q->base) != q)
                return FAIL("[arena.bin] %s: bin %u holds a piece at 0x%llx that is not one of its free ranges of "
                            "that bin (or its back link is wrong)", a->name, b, ULL(q ? q->base : 0));
        }
    }
    if (binned != nfree)
        return FAIL("[arena.bin] %s: %llu free ranges in its runs, %llu in its bins", a->name, ULL(nfree),
                    ULL(binned));
    return FABPOOL_OK;
}

/* The pieces of arena a's runs: linked in address order, covering each run,
 * sizes and bases in quanta, free ones merged and in their bins, blocks in
 * the table of blocks, the counters right. */
static fabpool_status check_arena_pieces(fp_walk *w, const fp_heap *h, const fp_arena *a, const rec_pages *rp,
                                         fp_retire *rt)
{
    uint64_t freeb = 0, used = 0, nblocks = 0, nfree = 0;
    for (size_t i = 0; i < a->n_runs; i++) {
        const fp_run *r = &a->runs[i];
        if (i && r->base <= a->runs[i - 1].base + a->runs[i - 1].size)
            return FAIL("[arena.run] runs of %s at 0x%llx and 0x%llx are not sorted, overlap or touch", a->name,
                        ULL(a->runs[i - 1].base), ULL(r->base));
        if (fp_walk_use(w, r->base, r->size, "an arena's run", r) != 0)
            return FP_WALK_HOST_FAIL();
        uint64_t at = r->base, guard = 0;
        const fp_piece *prev = NULL;
        int bad = 0;
        if (r->head && !is_rec(rp, r->head))
            return FAIL("[arena.records] %s: the first piece of the run at 0x%llx is not a record of its pages",
                        a->name, ULL(r->base));
        for (const fp_piece *q = r->head; q; prev = q, q = lnk(rp, q->anext, &bad)) {
            if (++guard > (1ull << 32) || q->base != at || q->aprev != prev || !q->size_q ||
                (q->base & (a->quantum - 1)) || q->base + fp_piece_size(q) > r->base + r->size)
                return FAIL("[arena.run] %s: the piece at 0x%llx (%llu bytes) does not follow the one before at "
                            "0x%llx in its run [0x%llx, +%llu), or is not in whole quanta of %llu bytes", a->name,
                            ULL(q->base), ULL(fp_piece_size(q)), ULL(at), ULL(r->base), ULL(r->size), ULL(a->quantum));
            at += fp_piece_size(q);
            if (q->state == FP_LARGE_FREE) {
                if (prev && prev->state == FP_LARGE_FREE)
                    return FAIL("[arena.merge] %s: free ranges at 0x%llx and 0x%llx touch and were not merged",
                                a->name, ULL(prev->base), ULL(q->base));
                freeb += fp_piece_size(q);
                nfree++;
            } else if (q->state == FP_LARGE_LIVE || q->state == FP_LARGE_PENDING) {
                int stray = 0;
                if (rec(a, fp_arena_block_id(a, q->base), &stray) != q)
                    return FAIL("[arena.blocks] %s: the block at 0x%llx is not in its table of blocks", a->name,
                                ULL(q->base));
                used += fp_piece_size(q);
                nblocks++;
                w->pending += q->state == FP_LARGE_PENDING;
                const fp_span *home = fp_map_get(&h->sp->map, q->base);
                /* a slab's run starts where its first block does: that block's records are the slab walk's */
                if (q->state == FP_LARGE_LIVE && (!home || home->kind != FP_SPAN_SLAB) &&
                    fp_retire_any_used(rt))
                    w->recorded += (uint64_t)fp_retire_used_locked(rt, q->base);
            } else {
                return FAIL("[arena.run] %s: the piece at 0x%llx is in state %u (held: only inside an allocation)",
                            a->name, ULL(q->base), q->state);
            }
        }
        if (bad)
            return FAIL("[arena.records] %s: a piece of the run at 0x%llx links to no record of its pages", a->name,
                        ULL(r->base));
        if (at != r->base + r->size || prev != r->tail)
            return FAIL("[arena.run] %s: the pieces of the run [0x%llx, +%llu) end at 0x%llx, or its last piece is not "
                        "the one it names", a->name, ULL(r->base), ULL(r->size), ULL(at));
    }
    if (nblocks != fp_arena_block_count(a) || nblocks != a->n_blocks)
        return FAIL("[arena.blocks] %s: %llu blocks in its runs, %zu in its table, it counts %llu", a->name,
                    ULL(nblocks), fp_arena_block_count(a), ULL(a->n_blocks));
    fabpool_status st = check_arena_bins(a, rp, nfree);
    if (st != FABPOOL_OK)
        return st;
    if (freeb != a->free_bytes || used != a->used_bytes)
        return FAIL("[arena.sums] %s: its pieces add up to %llu free and %llu used bytes, it counts %llu and %llu",
                    a->name, ULL(freeb), ULL(used), ULL(a->free_bytes), ULL(a->used_bytes));
    w->idle += freeb;
    return check_arena_records(a, rp, nfree + nblocks);
}

fabpool_status fp_arenas_check(const fp_heap *h, fp_walk *w, fp_retire *rt)
{
    uint64_t used = 0;
    for (int i = 0; i < FP_NARENAS; i++) {
        const fp_arena *a = &h->arenas[i];
        fabpool_status st = check_arena_chunks(w, a);
        if (st != FABPOOL_OK)
            return st;
        rec_pages rp;
        if (rec_pages_make(&rp, a) != 0)
            return FP_WALK_HOST_FAIL();
        st = check_arena_pieces(w, h, a, &rp, rt);
        free(rp.at);
        if (st != FABPOOL_OK)
            return st;
        used += a->used_bytes;
    }
    used -= w->slab_bytes;
    if (used != atomic_load(&h->large_in_use_bytes))
        return FAIL("[large.in_use] the arenas give out %llu bytes besides the slabs, the heap counts %llu", ULL(used),
                    ULL(atomic_load(&h->large_in_use_bytes)));
    return FABPOOL_OK;
}

