/* arena.c - a best-fit heap of blocks over the chunks mapped for it
 * (arena.h): bins, runs, blocks, chunks and trim (the fit, cut, release
 * and merge inline in arena.h); its records are arena_rec.c's, its growth
 * on a miss arena_grow.c's. */
#include "arena.h"

#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "error.h"
#include "sizeclass.h"

#define SZ(p) fp_piece_size((p))

/* ------------------------------------------------------------ records */

fp_piece *fp_arena_piece_new(fp_arena *a, uint64_t base, uint64_t size, uint32_t state)
{
    return fp_arena_new_(a, base, size, state);
}

void fp_arena_piece_drop(fp_arena *a, fp_piece *p) { fp_rec_give(&a->recs, p); }

/* ------------------------------------------------------------ bins */

void fp_arena_bin_insert(fp_arena *a, fp_piece *p) { fp_arena_push_(a, p); }

void fp_arena_bin_remove(fp_arena *a, fp_piece *p) { fp_arena_pull_(a, p); }

/* ------------------------------------------------------------ the table of blocks */

void fp_arena_block_list(fp_arena *a, uint64_t addr, fp_rid r)
{
    if (!a->pol.direct && fp_addrmap_reserve(&a->blocks, 1) != 0)
        return;
    fp_arena_list_(a, addr, r, a->pol.direct, 0);
}

void fp_arena_block_unlist(fp_arena *a, uint64_t addr)
{
    if (fp_arena_block_id(a, addr))
        fp_arena_unlist_(a, addr, a->pol.direct);
}

fp_piece *fp_arena_carve_at(fp_arena *a, fp_piece *f, uint64_t x, uint64_t n)
{
    return fp_arena_carve_(a, f, x, n, a->pol.direct);
}

uint64_t fp_arena_place(const fp_piece *f, uint64_t n, uint64_t align, int high)
{
    return fp_arena_place_(f, n, align, high);
}

/* The walk of the bins from n's own up: the smallest range that fits among all of n's bin and the first 64
 * of the first bin above it that holds one that fits, the lowest address on a tie (the first one in the bins
 * of one size each); for a block aligned beyond the quantum, and where the quick fit found nothing.  The
 * range, still in its bin, or NULL. */
__attribute__((noinline)) fp_piece *fp_arena_fit_walk(fp_arena *a, uint64_t n, uint64_t align)
{
    unsigned b0 = fp_arena_bin_of(n >> FP_PIECE_UNIT_SHIFT);
    fp_piece *best = NULL;
    for (unsigned b = fp_arena_bin_next(a, b0); b < FP_ARENA_NBINS && !best; b = fp_arena_bin_next(a, b + 1)) {
        unsigned look = 0;
        for (fp_piece *f = a->bins[b]; f && (b == b0 || look < 64); f = f->next, look++) {
            if (!fp_arena_place_(f, n, align, 1) ||
                (best && (fp_piece_size(f) > fp_piece_size(best) || (fp_piece_size(f) == fp_piece_size(best) && f->base > best->base))))
                continue;
            best = f;
            if (b < FP_ARENA_SUB && align <= a->quantum)
                break; /* one size in these bins */
        }
    }
    return best;
}

fp_piece *fp_arena_coalesce(fp_arena *a, fp_piece *p)
{
    return fp_arena_coalesce_(a, p);
}

fp_piece *fp_arena_fit(fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_lock_assert_held(&a->sp->lock);
    *st = FABPOOL_OK;
    return fp_arena_best_fit_(a, n, align, st, a->pol.direct, 0);
}

void fp_arena_release(fp_arena *a, fp_piece *b)
{
    fp_lock_assert_held(&a->sp->lock);
    fp_arena_release_(a, b, a->pol.direct, NULL);
}

/* ------------------------------------------------------------ runs */

/* The run that holds addr: its index, or n_runs. */
size_t fp_arena_run_of(const fp_arena *a, uint64_t addr)
{
    size_t i = FP_ARRAY_LOWER(a->runs, a->n_runs, fp_run, base, addr + 1);
    if (i == 0 || addr >= a->runs[i - 1].base + a->runs[i - 1].size)
        return a->n_runs;
    return i - 1;
}

void fp_arena_set_tail(fp_arena *a, fp_piece *p)
{
    size_t r = fp_arena_run_of(a, p->base);
    a->runs[r].tail = p;
}

void fp_arena_run_remove(fp_arena *a, size_t i)
{
    memmove(&a->runs[i], &a->runs[i + 1], (a->n_runs - i - 1) * sizeof *a->runs);
    a->n_runs--;
}

/* Room was reserved: inserts run r in order and returns its index. */
size_t fp_arena_run_insert(fp_arena *a, fp_run r)
{
    size_t i = FP_ARRAY_LOWER(a->runs, a->n_runs, fp_run, base, r.base);
    memmove(&a->runs[i + 1], &a->runs[i], (a->n_runs - i) * sizeof *a->runs);
    a->runs[i] = r;
    a->n_runs++;
    return i;
}

/* ------------------------------------------------------------ blocks */

void fp_arena_init(fp_arena *a, fp_space *sp, fp_span *sentinel, const char *name, uint64_t home,
                   const fp_arena_policy *pol)
{
    memset(a, 0, sizeof *a);
    a->sp = sp;
    a->sentinel = sentinel;
    a->name = name;
    a->quantum = 1ull << FP_PIECE_UNIT_SHIFT;
    a->qshift = FP_PIECE_UNIT_SHIFT;
    a->home = home;
    a->pol = *pol;
    fp_addrmap_init(&a->blocks, sp->meta);
    a->recs.meta = sp->meta;
    for (unsigned i = 0; i < FP_ARENA_CLS_Q; i++) {
        unsigned c = fp_class_of((uint64_t)(i + 1) << FP_PIECE_UNIT_SHIFT);
        a->cls_of_q[i] = (uint8_t)(c < FP_NCLASS ? c : FP_NCLASS - 1);
    }
    for (unsigned u = 0; u < FP_ARENA_BIN_Q; u++)
        a->bin_of_q[u] = (uint16_t)fp_arena_bin_of(u);
}

uint64_t fp_arena_ahead(const fp_arena *a, uint64_t n)
{
    /* the blocks the last FP_ARENA_RATE allocations added, net of frees, at
     * their mean size */
    unsigned k = a->ring_at < FP_ARENA_RATE ? a->ring_at : FP_ARENA_RATE; /* fewer since the arena was empty */
    uint64_t then = k < FP_ARENA_RATE ? 0 : a->ring_n[a->ring_at % FP_ARENA_RATE];
    if (n >= a->pol.ahead_below || !k || a->n_blocks <= then)
        return 0;
    uint64_t sum = 0;
    for (unsigned i = 0; i < k; i++)
        sum += a->ring_size[i];
    uint64_t grew = (a->n_blocks - then) * (sum / k) * a->pol.ahead_mult;
    uint64_t cap = a->pol.ahead_max;
    if (a->pol.ahead_frac && a->used_bytes / a->pol.ahead_frac < cap)
        cap = a->used_bytes / a->pol.ahead_frac;
    return grew < cap ? grew : cap;
}

const fp_piece *fp_arena_find(const fp_arena *a, uint64_t addr)
{
    size_t r = fp_arena_run_of(a, addr);
    if (r == a->n_runs)
        return NULL;
    for (const fp_piece *p = a->runs[r].head; p; p = p->anext)
        if (addr < p->base + SZ(p))
            return addr >= p->base ? p : NULL;
    return NULL;
}

/* ------------------------------------------------------------ chunks */

size_t fp_arena_chunk_lower(const fp_arena *a, uint64_t addr)
{
    return FP_ARRAY_LOWER(a->chunks, a->n_chunks, fp_lchunk, va, addr);
}

static void chunk_unmap_at(fp_arena *a, size_t i)
{
    fp_lchunk c = a->chunks[i];
    fp_chunk_unmap(a->sp->ch, c.va, c.size);
    fp_map_set(&a->sp->map, c.va, c.size, NULL);
    memmove(&a->chunks[i], &a->chunks[i + 1], (a->n_chunks - i - 1) * sizeof *a->chunks);
    a->n_chunks--;
    a->mapped_bytes -= c.size;
    fp_arena_index_drop(a, c.va, c.size);
}

/* Unmaps the chunks of [va, va + size) (all mapped by map_range). */
void fp_arena_unmap_range(fp_arena *a, uint64_t va, uint64_t size)
{
    size_t i = fp_arena_chunk_lower(a, va);
    while (i < a->n_chunks && a->chunks[i].va < va + size)
        chunk_unmap_at(a, i);
}

/* ------------------------------------------------------------ the blocks' states and the index's leaves */

int fp_arena_index_reserve(fp_arena *a, uint64_t va, uint64_t size)
{
    if (!a->pol.direct)
        return fp_addrmap_reserve(&a->blocks, 1);
    return fp_bidx_reserve(&a->bidx, a->sp->meta, fp_space_base(a->sp), fp_space_size(a->sp), va, size);
}

void fp_arena_index_drop(fp_arena *a, uint64_t va, uint64_t size)
{
    fp_bidx *x = &a->bidx;
    if (!x->leaves || x->keep || !size || va - x->base >= x->size || size > x->size - (va - x->base))
        return;
    for (uint64_t l = (va - x->base) >> FP_BIDX_LEAF_SHIFT; l <= (va + size - 1 - x->base) >> FP_BIDX_LEAF_SHIFT; l++) {
        uint64_t lo = x->base + (l << FP_BIDX_LEAF_SHIFT), hi = lo + (1ull << FP_BIDX_LEAF_SHIFT);
        size_t i = fp_arena_chunk_lower(a, lo); /* a chunk of the arena still in [lo, hi): the leaf stays */
        if ((i < a->n_chunks && a->chunks[i].va < hi) || (i > 0 && a->chunks[i - 1].va + a->chunks[i - 1].size > lo))
            continue;
        fp_bidx_leaf_free(x, a->sp->meta, l);
    }
}

int fp_arena_mstate_init(fp_arena *a, uint64_t lo, uint64_t hi)
{
    if (!a->pol.direct)
        return -1; /* the states live in the direct index's entries */
    return fp_mstate_init(&a->ms, &a->bidx, a->sp->meta, fp_space_base(a->sp), fp_space_size(a->sp), lo, hi);
}

void fp_arena_destroy(fp_arena *a)
{
    if (!a->sp)
        return; /* never set up */
    memset(&a->ms, 0, sizeof a->ms); /* its leaves are the index's, freed below */
    while (a->n_chunks)
        chunk_unmap_at(a, a->n_chunks - 1);
    fp_recs_free(&a->recs);
    FP_ARRAY_FREE(a->sp->meta, a->runs, a->cap_runs);
    FP_ARRAY_FREE(a->sp->meta, a->chunks, a->cap_chunks);
    a->n_runs = a->n_chunks = 0;
    fp_addrmap_destroy(&a->blocks);
    fp_bidx_free(&a->bidx, a->sp->meta);
    memset(a->bins, 0, sizeof a->bins);
    memset(a->bitmap, 0, sizeof a->bitmap);
    a->summary = 0;
}
