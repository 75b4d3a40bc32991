/* arena.c - a best-fit heap of blocks over the chunks mapped for it
 * (arena.h): bins, runs, blocks, chunks and trim; its records
 * are arena_rec.c's, its growth on a miss arena_grow.c's. */
#include "arena.h"

#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "error.h"
#include "sizeclass.h"

#define P(r) fp_piece_at(a, (r))
#define N(r) fp_piece_of(a, (r))
#define R(p) fp_piece_rid(p)
#define SZ(p) fp_piece_size((p))

/* ------------------------------------------------------------ records */

/* A piece of a spare record (fp_arena_spare_reserve made sure there is one): *rid its id. */
static inline fp_piece *piece_new(fp_arena *a, uint64_t base, uint64_t size, uint32_t state, fp_rid *rid)
{
    fp_piece *p = fp_rec_take(&a->recs, rid);
    *p = (fp_piece){.base = base, .size_q = (uint32_t)(size >> FP_PIECE_UNIT_SHIFT), .state = (uint16_t)state};
    return p;
}

fp_piece *fp_arena_piece_new(fp_arena *a, uint64_t base, uint64_t size, uint32_t state, fp_rid *rid)
{
    return piece_new(a, base, size, state, rid);
}

void fp_arena_piece_drop(fp_arena *a, fp_piece *p) { fp_rec_give(&a->recs, p, R(p)); }

/* ------------------------------------------------------------ bins */

/* Free range p, of id r, into the bin of its size. */
static inline void bin_push(fp_arena *a, fp_piece *p, fp_rid r)
{
    unsigned b = fp_arena_bin_of(p->size_q);
    p->state = FP_LARGE_FREE;
    p->bin = b;
    p->prev = 0;
    p->next = a->bins[b];
    a->bins[b] = r;
    if (p->next) {
        N(p->next)->prev = r;
    } else { /* the bin was empty: its bits were clear */
        a->bitmap[b / 64] |= 1ull << (b % 64);
        a->summary |= 1ull << (b / 64);
    }
}

void fp_arena_bin_insert(fp_arena *a, fp_piece *p) { bin_push(a, p, R(p)); }

static inline void bin_pull(fp_arena *a, fp_piece *p)
{
    unsigned b = p->bin;
    if (p->prev)
        N(p->prev)->next = p->next;
    else
        a->bins[b] = p->next;
    if (p->next)
        N(p->next)->prev = p->prev;
    p->next = p->prev = 0;
    if (!a->bins[b] && !(a->bitmap[b / 64] &= ~(1ull << (b % 64))))
        a->summary &= ~(1ull << (b / 64));
}

void fp_arena_bin_remove(fp_arena *a, fp_piece *p) { bin_pull(a, p); }

/* ------------------------------------------------------------ runs */

/* The run that holds addr: its index, or n_runs. */
size_t fp_arena_run_of(const fp_arena *a, uint64_t addr)
{
    size_t i = FP_ARRAY_LOWER(a->runs, a->n_runs, fp_run, base, addr + 1);
    if (i == 0 || addr >= a->runs[i - 1].base + a->runs[i - 1].size)
        return a->n_runs;
    return i - 1;
}

/* Piece p (in a run) is now the last of it. */
static void set_tail(fp_arena *a, fp_piece *p)
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

/* ------------------------------------------------------------ the table of blocks */

/* Block of id r at addr into the table (its room made: fp_arena_index_reserve, best_fit). */
static inline void block_list(fp_arena *a, uint64_t addr, fp_rid r)
{
    if (a->pol.direct) {
        *fp_arena_bidx_at(a, addr) = r;
        a->bidx.n++;
    } else {
        fp_addrmap_put(&a->blocks, addr, r);
    }
}

static inline void block_unlist(fp_arena *a, uint64_t addr)
{
    if (a->pol.direct) {
        *fp_arena_bidx_at(a, addr) = 0;
        a->bidx.n--;
    } else {
        fp_addrmap_del_at(&a->blocks, fp_arena_block_slot(a, addr));
    }
}

void fp_arena_block_list(fp_arena *a, uint64_t addr, fp_rid r)
{
    if (!a->pol.direct && fp_addrmap_reserve(&a->blocks, 1) != 0)
        return;
    block_list(a, addr, r);
}

void fp_arena_block_unlist(fp_arena *a, uint64_t addr)
{
    if (fp_arena_block_id(a, addr))
        block_unlist(a, addr);
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
}

/* An allocation of n bytes, for the growth rate. */
static void note_alloc(fp_arena *a, uint64_t n)
{
    a->ring_n[a->ring_at % FP_ARENA_RATE] = a->n_blocks;
    a->ring_size[a->ring_at++ % FP_ARENA_RATE] = n;
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

/* Puts piece q (id rq) right after piece p (id rp), in p's run. */
static inline __attribute__((always_inline)) void link_after(fp_arena *a, fp_piece *p, fp_rid rp, fp_piece *q,
                                                             fp_rid rq)
{
    q->aprev = rp;
    q->anext = p->anext;
    if (p->anext)
        N(p->anext)->aprev = rq;
    else
        set_tail(a, q);
    p->anext = rq;
}

/* Cuts the block [x, x + n) out of free range f (out of its bin): what is
 * left of f below and above it stays free.  Two spare records are there. */
static inline __attribute__((always_inline)) fp_piece *carve(fp_arena *a, fp_piece *f, fp_rid fr, uint64_t x,
                                                              uint64_t n)
{
    uint64_t end = f->base + SZ(f);
    fp_piece *b = f;
    fp_rid br = fr, rr;
    if (x > f->base) { /* f keeps [base, x); the block follows it */
        b = piece_new(a, x, n, FP_LARGE_LIVE, &br);
        fp_piece_resize(f, x - f->base);
        link_after(a, f, fr, b, br);
        bin_push(a, f, fr);
    }
    if (x + n < end) { /* the rest above the block */
        fp_piece *r = piece_new(a, x + n, end - x - n, FP_LARGE_FREE, &rr);
        fp_piece_resize(b, n);
        link_after(a, b, br, r, rr);
        bin_push(a, r, rr);
    }
    b->state = FP_LARGE_LIVE;
    block_list(a, b->base, br);
    a->free_bytes -= n;
    a->used_bytes += n;
    a->n_blocks++;
    note_alloc(a, n);
    return b;
}

fp_piece *fp_arena_carve_at(fp_arena *a, fp_piece *f, uint64_t x, uint64_t n) { return carve(a, f, R(f), x, n); }



/* Where a block of n bytes aligned to `align` goes in free range f: at its
 * high end (what is left of f stays free at the low end, where runs grow)
 * or, for a run that grows upwards, its low end; 0 if it does not fit. */
uint64_t fp_arena_place(const fp_piece *f, uint64_t n, uint64_t align, int high)
{
    if (SZ(f) < n)
        return 0;
    uint64_t end = f->base + SZ(f);
    uint64_t x = high ? (end - n) & ~(align - 1) : (f->base + align - 1) & ~(align - 1);
    return x >= f->base && x + n <= end ? x : 0;
}

/* The walk of the bins from n's own up: the smallest range that fits among all of n's bin and the first 64
 * of the first bin above it that holds one that fits, the lowest address on a tie (the first one in the bins
 * of one size each); for a block aligned beyond the quantum, and where the quick fit found nothing.  The
 * range, still in its bin (*rid its id), or NULL. */
static __attribute__((noinline)) fp_piece *fit_walk(fp_arena *a, uint64_t n, uint64_t align, fp_rid *rid)
{
    unsigned b0 = fp_arena_bin_of(n >> FP_PIECE_UNIT_SHIFT);
    fp_piece *best = NULL;
    fp_rid best_r = 0;
    for (unsigned b = fp_arena_bin_next(a, b0); b < FP_ARENA_NBINS && !best; b = fp_arena_bin_next(a, b + 1)) {
        unsigned look = 0;
        for (fp_rid fr = a->bins[b]; fr && (b == b0 || look < 64); fr = N(fr)->next, look++) {
            fp_piece *f = N(fr);
            if (!fp_arena_place(f, n, align, 1) ||
                (best && (SZ(f) > SZ(best) || (SZ(f) == SZ(best) && f->base > best->base))))
                continue;
            best = f;
            best_r = fr;
            if (b < FP_ARENA_SUB && align <= a->quantum)
                break; /* one size in these bins */
        }
    }
    *rid = best_r;
    return best;
}

/* The quick fit of a block of the quantum's alignment: the first range that fits among the first
 * FP_ARENA_LOOK of its size's bin, else the head of the next bin that holds any; NULL where neither fits
 * (*rid its id). */
static inline __attribute__((always_inline)) fp_piece *fit_quick(fp_arena *a, uint64_t n, fp_rid *rid)
{
    uint64_t u = n >> FP_PIECE_UNIT_SHIFT;
    unsigned b0 = fp_arena_bin_of(u);
    fp_rid fr = a->bins[b0];
    for (unsigned look = 0; fr && look < FP_ARENA_LOOK; fr = N(fr)->next, look++)
        if (N(fr)->size_q >= u)
            break;
    if (!fr || N(fr)->size_q < u) {
        unsigned b = fp_arena_bin_next(a, b0 + 1);
        fr = b < FP_ARENA_NBINS ? a->bins[b] : 0;
    }
    if (!fr || N(fr)->size_q < u) /* (the last bin holds every size beyond it) */
        return NULL;
    *rid = fr;
    return N(fr);
}

/* A fit of n bytes aligned to align among the free ranges, cut; NULL if none fits.
 *
 * A block of the quantum's alignment (every block above slab_max) takes a good fit in a few loads: the first
 * range that fits among the first FP_ARENA_LOOK of its size's bin, else the first range of the next bin that
 * holds any (within a bin's width, a 64th of a doubling, of the smallest free range larger than n's bin);
 * only where neither has one is the rest of the bin looked at, so a miss still means that no free range
 * fits.  Which of the ranges of a size a block is cut from (the lowest address, or the one freed last)
 * left the peak held of the bench's uniform and normal shapes where it was over forty seeds
 * (docs/performance.md); the walk of a whole bin for the lowest cost a medium allocation a twentieth of
 * its instructions.  A slab (aligned to its page) takes the best fit: the smallest range that fits among the
 * bin of its size (all of them) and the next bin that holds one that fits (its first 64), the lowest on a
 * tie.  The quick fit and the cut are inline here, the walk apart (fit_walk), so that the common call
 * saves no more registers than it uses. */
static inline __attribute__((always_inline)) fp_piece *best_fit(fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_rid best_r = 0;
    fp_piece *best = align <= a->quantum ? fit_quick(a, n, &best_r) : NULL;
    if (__builtin_expect(!best, 0) && !(best = fit_walk(a, n, align, &best_r)))
        return NULL;
    if ((!a->pol.direct && fp_addrmap_reserve(&a->blocks, 1) != 0) || fp_arena_spare_reserve(a, 2) != 0) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the record of a block of %llu bytes",
                       (unsigned long long)n);
        return NULL;
    }
    bin_pull(a, best);
    return carve(a, best, best_r, fp_arena_place(best, n, align, 1), n);
}

/* Merges free range p (out of its bin), of id *pr, with the free ranges
 * touching it; the result (*pr its id) is out of its bin too. */
static inline __attribute__((always_inline)) fp_piece *coalesce(fp_arena *a, fp_piece *p, fp_rid *pr)
{
    fp_rid lr = p->aprev, rr = p->anext;
    fp_piece *l = P(lr), *r = P(rr);
    if (l && l->state == FP_LARGE_FREE) {
        bin_pull(a, l);
        l->size_q += p->size_q;
        l->anext = rr;
        if (r)
            r->aprev = lr;
        else
            set_tail(a, l);
        fp_rec_give(&a->recs, p, *pr);
        p = l;
        *pr = lr;
    }
    if (r && r->state == FP_LARGE_FREE) {
        bin_pull(a, r);
        p->size_q += r->size_q;
        p->anext = r->anext;
        if (r->anext)
            N(r->anext)->aprev = *pr;
        else
            set_tail(a, p);
        fp_rec_give(&a->recs, r, rr);
    }
    return p;
}

fp_piece *fp_arena_coalesce(fp_arena *a, fp_piece *p)
{
    fp_rid r = R(p);
    return coalesce(a, p, &r);
}

fp_piece *fp_arena_fit(fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_lock_assert_held(&a->sp->lock);
    *st = FABPOOL_OK;
    return best_fit(a, n, align, st);
}

/* Block br out of the table, merged with the free ranges touching it, into the bin of the merged range's size. */
static inline __attribute__((always_inline)) void release(fp_arena *a, fp_rid br)
{
    fp_piece *b = N(br);
    block_unlist(a, b->base);
    a->used_bytes -= SZ(b);
    if (!a->used_bytes) /* empty: the growth that brought it here says nothing of what comes next */
        a->ring_at = 0;
    a->free_bytes += SZ(b);
    a->n_blocks--;
    b->state = FP_LARGE_FREE;
    b = coalesce(a, b, &br);
    bin_push(a, b, br);
}

void fp_arena_release(fp_arena *a, fp_rid br)
{
    fp_lock_assert_held(&a->sp->lock);
    release(a, br);
}

fp_piece *fp_arena_refit(fp_arena *a, const fp_rid *back, unsigned n_back, uint64_t n, fabpool_status *st)
{
    fp_lock_assert_held(&a->sp->lock);
    for (unsigned i = 0; i < n_back; i++)
        release(a, back[i]);
    *st = FABPOOL_OK;
    return best_fit(a, n, a->quantum, st);
}

const fp_piece *fp_arena_find(const fp_arena *a, uint64_t addr)
{
    size_t r = fp_arena_run_of(a, addr);
    if (r == a->n_runs)
        return NULL;
    for (const fp_piece *p = a->runs[r].head; p; p = P(p->anext))
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
    if (!x->leaves || !size || va - x->base >= x->size || size > x->size - (va - x->base))
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
    return fp_mstate_init(&a->ms, a->sp->meta, fp_space_base(a->sp), fp_space_size(a->sp), lo, hi);
}

_Atomic uint8_t *fp_arena_mstate_make(fp_arena *a, uint64_t addr)
{
    fp_lock_assert_held(&a->sp->lock);
    return fp_mstate_make(&a->ms, a->sp->meta, addr);
}

void fp_arena_destroy(fp_arena *a)
{
    if (!a->sp)
        return; /* never set up */
    fp_mstate_free(&a->ms, a->sp->meta);
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
