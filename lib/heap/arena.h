/* arena.h - a heap of blocks of any size over chunks mapped for it: best
 * fit, neighbours coalesced, chunks mapped only where no free range fits.
 *
 * An arena owns runs of the reservation, each a contiguous range mapped by
 * its chunks (fp_lchunk, sorted by address) and cut into pieces: blocks
 * given out and free ranges, linked in address order (anext / aprev, NULL at
 * a run's ends), touching free ranges always merged.  Block sizes are
 * multiples of the arena's quantum, and every base is too.  Free ranges sit
 * in bins, 64 per doubling (TLSF's two-level index, a bitmap and its summary): an
 * allocation takes the first free range that fits among the first
 * FP_ARENA_LOOK of the bin of its size, else the first of the next bin that
 * holds any (a slab: the smallest that fits in those two bins), and splits
 * it, keeping the block at its high end.  Where none fits (a miss) the arena grows a free range at
 * the low (or high) end of a run into the free address space beside it, or
 * starts a run of its own below its home address, mapping only what is
 * missing plus what the recent growth of the arena says the next
 * allocations will take (fp_arena_ahead).  A chunk is unmapped only when
 * all of it lies in one free range (cuMemUnmap takes whole mappings).
 *
 * fp_span, the page map's record (slab.h serves slabs with it), is declared
 * here: every page of an arena's chunks points to the arena's sentinel span
 * (kind FP_SPAN_LARGE), except the pages of a slab carved from it, which
 * point to the slab.  A block's own record is found by its base in the
 * arena's table of blocks given out.
 *
 * Counters it owns: its mapped, free and used
 * bytes.  Locking: every call under the pool lock (h->sp->lock). */
#ifndef FP_ARENA_H
#define FP_ARENA_H

#include <stdatomic.h>
#include <stdint.h>

#include "addrmap.h"
#include "arena_index.h"
#include "arena_rec.h"
#include "error.h"
#include "space.h"

enum { FP_SPAN_SLAB = 1, FP_SPAN_LARGE = 2 };
/* a piece's state: a free range, a block given out, a free range held by an allocation in progress (no trim
 * unmaps it), a block freed on a stream whose work may still use it (pending.h: given out for the rest of the
 * pool) */
enum { FP_LARGE_FREE = 0, FP_LARGE_LIVE = 1, FP_LARGE_HELD = 2, FP_LARGE_PENDING = 3 };
/* a slab block's freeflag: given out, free, freed on a stream and still pending there (pending.h), given out and
 * used on other streams too (fabpool_record_stream: its free takes the slow path, which asks the stream queue) */
enum { FP_FREEFLAG_USED = 0, FP_FREEFLAG_FREE = 1, FP_FREEFLAG_PENDING = 2, FP_FREEFLAG_RECORDED = 3 };

/* What the page map points to: a slab (slab.h), or an arena's sentinel. */
typedef struct fp_span {
    uint64_t base, size;
    uint8_t kind, list;
    uint16_t cls;
    _Atomic uint32_t in_use;           /* unused (a sentinel: FP_LARGE_FREE) */
    /* slabs: what fabpool_free's hit reads, in the record's first cache line (a sentinel's are 0: no address
     * of the reservation passes its test, alloc.c) */
    uint64_t magic;                    /* ceil(2^32 / obj_q): index = (off/64 * magic) >> 32 */
    uint64_t obj_bytes;                /* the block size */
    _Atomic uint8_t *freeflag;         /* per block, FP_FREEFLAG_*: 1 = free (central or in a thread cache), 2 =
                                          pending on a stream (given out for the rest of the pool), 3 = given
                                          out with recorded streams: a byte each, so setting one is a plain
                                          store, not a locked RMW; and one more, FP_FREEFLAG_FREE, for the
                                          slab's tail, where an index one past the blocks may land */
    uint32_t obj_q;                    /* block size / 64 (FP_QUANTUM_SHIFT) */
    uint32_t nobj, nfree;              /* nfree: blocks on free_stack (held centrally) */
    uint32_t *free_stack;
    struct fp_span *next, *prev;       /* a slab's class list */
    struct fp_span *all_next, *all_prev; /* every slab of the heap (pool lock) */
} fp_span;

/* A contiguous range of the arena's mapped memory: its first and last piece. */
typedef struct fp_run {
    uint64_t base, size;
    fp_piece *head, *tail;
} fp_run;

/* One physical chunk mapped for an arena (cuMemUnmap takes whole chunks). */
typedef struct fp_lchunk {
    uint64_t va, size;
} fp_lchunk;

#define FP_ARENA_SUB_SHIFT 6u                      /* 64 bins per doubling */
#define FP_ARENA_SUB (1u << FP_ARENA_SUB_SHIFT)
#define FP_ARENA_NBINS 4096u                       /* 64 x 64: a word of the bitmap's summary each */
#define FP_ARENA_LOOK 8u                           /* ranges of its own bin a block looks at (fp_arena_fit) */
#define FP_ARENA_RATE 32u                          /* allocations the growth rate is taken over */
#define FP_ARENA_CLS_Q 1024u                       /* blocks up to this many quanta have their class in a table */
#define FP_ARENA_BIN_Q 1024u                       /* free ranges below this many quanta (256 KiB) have their bin
                                                      in a table: the medium arena's blocks and, on the uniform
                                                      mix, the ranges its fits and merges push (a table of 8,192
                                                      saved no more instructions) */

/* How an arena grows and maps (fp_arena_ahead, fp_arena_grow_plan). */
typedef struct fp_arena_policy {
    uint64_t ahead_max;                /* the most a miss maps beyond what it needs (0: only what it needs) */
    uint64_t ahead_below;              /* a block of this size or more maps only what it needs */
    unsigned ahead_mult;               /* the growth of the last FP_ARENA_RATE allocations, times this */
    unsigned ahead_frac;               /* and at most the used bytes / this (0: no such cap) */
    unsigned mapped_frac;              /* and no more than leaves the arena mapping its used bytes (the block's
                                          included) and a this-th of them (0: no such cap) */
    unsigned chunk_granules;           /* the largest chunk */
    uint64_t whole_max;                /* 0: a growth for one block is cut on map_range's grid; else it is one
                                          chunk of up to this many bytes, or equal chunks of at most that
                                          (large_chunks:whole) */
    int direct;                        /* its table of blocks a direct index (fp_bidx), not a hash table */
} fp_arena_policy;


typedef struct fp_arena {
    fp_space *sp;
    fp_span *sentinel;                 /* the page map's entry for the arena's pages */
    const char *name;                  /* in messages */
    uint64_t quantum;                  /* sizes and bases are multiples of it (1 << FP_PIECE_UNIT_SHIFT) */
    unsigned qshift;
    uint64_t home;                     /* new runs go below this address where the reservation has room */
    fp_arena_policy pol;
    fp_piece *bins[FP_ARENA_NBINS];
    uint64_t bitmap[FP_ARENA_NBINS / 64];  /* a bit per bin that holds a free range */
    uint64_t summary;                      /* a bit per word of the bitmap that is not 0 */
    fp_addrmap blocks;                 /* base -> record id of every block given out (live or pending) */
    fp_bidx bidx;                      /* the same as a direct index (pol.direct), blocks then unused */
    fp_run *runs;                      /* sorted by base, apart (touching runs are one) */
    size_t n_runs, cap_runs;
    fp_lchunk *chunks;                 /* sorted by va */
    size_t n_chunks, cap_chunks;
    fp_recs recs;                      /* its pieces' records */
    fp_mstate ms;                      /* its blocks' states, where thread caches hold some (leaves NULL: none) */
    uint8_t cls_of_q[FP_ARENA_CLS_Q];  /* the class of the grid a block of (i + 1) quanta falls in: its count in
                                          the stats (fp_class_of's dozen instructions, under the pool lock) */
    uint16_t bin_of_q[FP_ARENA_BIN_Q]; /* fp_arena_bin_of(i): one load on a fit's and a push's way where the
                                          bit scan and its arithmetic take about ten instructions */
    uint64_t mapped_bytes, free_bytes, used_bytes, n_blocks; /* used, blocks: given out (live or pending) */
    uint64_t ring_n[FP_ARENA_RATE];    /* blocks given out after each of the last allocations */
    uint64_t ring_size[FP_ARENA_RATE]; /* and the size of each */
    unsigned ring_at;
} fp_arena;

/* The bytes of piece p, and p set to n bytes (a multiple of the quantum). */
static inline uint64_t fp_piece_size(const fp_piece *p) { return (uint64_t)p->size_q << FP_PIECE_UNIT_SHIFT; }
static inline void fp_piece_resize(fp_piece *p, uint64_t n) { p->size_q = (uint32_t)(n >> FP_PIECE_UNIT_SHIFT); }

/* The record of id r (NULL for 0), of an id that is not 0, and the id of record p (the tables of blocks). */
static inline fp_piece *fp_piece_at(const fp_arena *a, fp_rid r) { return fp_rec_at(&a->recs, r); }
static inline fp_piece *fp_piece_of(const fp_arena *a, fp_rid r) { return fp_rec_of(&a->recs, r); }
static inline fp_rid fp_piece_rid(const fp_piece *p) { return fp_rec_id(p); }

/* The bin of a free range of u quanta: one bin per size below 64 quanta,
 * then sixty-four per doubling. */
static inline unsigned fp_arena_bin_of(uint64_t u)
{
    if (u < FP_ARENA_SUB)
        return (unsigned)u;
    unsigned lg = 63u - (unsigned)__builtin_clzll(u);
    unsigned b = FP_ARENA_SUB + (lg - FP_ARENA_SUB_SHIFT) * FP_ARENA_SUB +
                 (unsigned)((u >> (lg - FP_ARENA_SUB_SHIFT)) - FP_ARENA_SUB);
    return b < FP_ARENA_NBINS ? b : FP_ARENA_NBINS - 1;
}

/* fp_arena_bin_of(u) from the arena's table where it has one. */
static inline unsigned fp_arena_bin_q(const fp_arena *a, uint64_t u)
{
    return u < FP_ARENA_BIN_Q ? a->bin_of_q[u] : fp_arena_bin_of(u);
}

/* The first bin at or above b that holds a free range, or FP_ARENA_NBINS. */
static inline unsigned fp_arena_bin_next(const fp_arena *a, unsigned b)
{
    if (b >= FP_ARENA_NBINS)
        return FP_ARENA_NBINS;
    unsigned w = b / 64;
    uint64_t bits = a->bitmap[w] & (~0ull << (b % 64));
    if (bits)
        return w * 64 + (unsigned)__builtin_ctzll(bits);
    uint64_t words = w + 1 < 64 ? a->summary & (~0ull << (w + 1)) : 0;
    if (!words)
        return FP_ARENA_NBINS;
    w = (unsigned)__builtin_ctzll(words);
    return w * 64 + (unsigned)__builtin_ctzll(a->bitmap[w]);
}

/* A miss being served: the free range grown (held) and the range to map. */
typedef struct fp_arena_grow {
    fp_piece *g;                       /* NULL: a new run */
    uint64_t va, size;
    int low;                           /* g grows at its low end */
    int ahead;                         /* mostly mapped ahead of need: one chunk */
} fp_arena_grow;

/* An empty arena of blocks of whole quanta of 256 bytes (FP_PIECE_UNIT_SHIFT)
 * whose pages the page map sends to `sentinel`. */
void fp_arena_init(fp_arena *a, fp_space *sp, fp_span *sentinel, const char *name, uint64_t home,
                   const fp_arena_policy *pol);
/* Unmaps every chunk and frees every record (destroy: blocks still given out go too). */
void fp_arena_destroy(fp_arena *a);
/* Keeps its blocks' states (fp_mstate) for sizes (lo, hi], in its direct index: 0, or -1 without host memory
 * or without a direct index (none kept). */
int fp_arena_mstate_init(fp_arena *a, uint64_t lo, uint64_t hi);
/* Sets the state of the block at addr (pool lock held; the index's leaf there was made before the arena mapped
 * the block), where states are kept. */
static inline void fp_arena_mstate_set(fp_arena *a, uint64_t addr, unsigned state)
{
    _Atomic uint8_t *f = fp_mstate_at(&a->ms, addr);
    if (f)
        atomic_store_explicit(f, (uint8_t)state, memory_order_relaxed);
}

static inline uint64_t fp_arena_round(const fp_arena *a, uint64_t size)
{
    return (size + a->quantum - 1) & ~(a->quantum - 1);
}

/* The block of n bytes (a multiple of the quantum), its base a multiple of
 * align (a power of two), cut from a free range that fits (arena.c's
 * best_fit says which), no driver call; NULL when none
 * fits (*st FABPOOL_OK) or without host memory (*st says so). */
fp_piece *fp_arena_fit(fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st);
/* What a miss for a block of n bytes maps beyond what it needs: the blocks
 * the arena's last FP_ARENA_RATE allocations added (net of frees) at their
 * mean size, times ahead_mult, at most ahead_max (and a share of the used
 * bytes where the policy says); nothing for a block of ahead_below or more,
 * which pays for its own map.  A program that allocates fast meets a miss
 * every ahead_max bytes, not at every block; one that has reached its size
 * maps what it asks. */
uint64_t fp_arena_ahead(const fp_arena *a, uint64_t n);

/* The slot of the hash table of blocks that holds the block given out (live or pending) at addr, or
 * FP_ADDRMAP_END (an arena without the direct index). */
static inline size_t fp_arena_block_slot(const fp_arena *a, uint64_t addr)
{
    /* fp_addrmap_next's probe with the base compared in it: one loop, not a probe resumed per candidate */
    const fp_addrmap *m = &a->blocks;
    if (!m->n)
        return FP_ADDRMAP_END;
    uint32_t h = fp_addrmap_hash(addr);
    size_t mask = m->cap - 1;
    for (size_t i = h >> m->shift; m->slots[i].val; i = (i + 1) & mask)
        if (m->slots[i].hash == h && fp_piece_of(a, m->slots[i].val)->base == addr)
            return i;
    return FP_ADDRMAP_END;
}
/* The direct index's entry of addr (a multiple of the quantum in the reservation), or NULL where no leaf is
 * made. */
static inline fp_bent *fp_arena_bidx_at(const fp_arena *a, uint64_t addr) { return fp_bidx_at(&a->bidx, addr); }
/* The record id of the block given out (live or pending) at addr, or 0; and its record, or NULL. */
static inline fp_rid fp_arena_block_id(const fp_arena *a, uint64_t addr)
{
    if (a->pol.direct) {
        uint64_t off = addr - a->bidx.base;
        if (off >= a->bidx.size || (off & ((1u << FP_PIECE_UNIT_SHIFT) - 1)) || !a->bidx.leaves)
            return 0;
        const fp_bent *e = fp_arena_bidx_at(a, addr);
        return e ? e->rid : 0;
    }
    size_t i = fp_arena_block_slot(a, addr);
    return i == FP_ADDRMAP_END ? 0 : fp_addrmap_val(&a->blocks, i);
}
static inline fp_piece *fp_arena_block(const fp_arena *a, uint64_t addr)
{
    return fp_piece_at(a, fp_arena_block_id(a, addr));
}
/* The blocks the table holds. */
static inline size_t fp_arena_block_count(const fp_arena *a)
{
    return a->pol.direct ? a->bidx.n : fp_addrmap_count(&a->blocks);
}
/* Frees block b (fp_arena_block): out of the table of blocks, merged with the free ranges touching it. */
void fp_arena_release(fp_arena *a, fp_piece *b);
/* Makes sure the table of blocks can take a block anywhere in [va, va + size), which the arena is about to map
 * (the direct index's leaves made; the hash table room for one more): 0, or -1 without host memory. */
int fp_arena_index_reserve(fp_arena *a, uint64_t va, uint64_t size);
/* The leaves of the direct index over [va, va + size) where the arena no longer maps memory go back. */
void fp_arena_index_drop(fp_arena *a, uint64_t va, uint64_t size);
/* Block of id r at addr into, and out of, the table (fabpool_check's tests break it on purpose; the arena's
 * own calls keep it). */
void fp_arena_block_list(fp_arena *a, uint64_t addr, fp_rid r);
void fp_arena_block_unlist(fp_arena *a, uint64_t addr);
/* The piece that holds addr, or NULL (a walk of the run: for messages). */
const fp_piece *fp_arena_find(const fp_arena *a, uint64_t addr);

/* ---- shared by arena.c and arena_grow.c (pool lock held) */

/* Makes sure n records are spare: 0, or -1 without host memory. */
static inline int fp_arena_spare_reserve(fp_arena *a, size_t n) { return fp_recs_reserve(&a->recs, n); }
/* A piece of a spare record, and a record back to the spares. */
fp_piece *fp_arena_piece_new(fp_arena *a, uint64_t base, uint64_t size, uint32_t state);
void fp_arena_piece_drop(fp_arena *a, fp_piece *p);
/* A free range into, and out of, the bin of its size. */
void fp_arena_bin_insert(fp_arena *a, fp_piece *p);
void fp_arena_bin_remove(fp_arena *a, fp_piece *p);
/* The run that holds addr (its index), and the runs' sorted list kept. */
size_t fp_arena_run_of(const fp_arena *a, uint64_t addr);
void fp_arena_run_remove(fp_arena *a, size_t i);
size_t fp_arena_run_insert(fp_arena *a, fp_run r);
/* Cuts n bytes at x out of free range f: the block given out. */
fp_piece *fp_arena_carve_at(fp_arena *a, fp_piece *f, uint64_t x, uint64_t n);
/* Where a block of n bytes aligned to align goes in free range f (high: at its top). */
uint64_t fp_arena_place(const fp_piece *f, uint64_t n, uint64_t align, int high);
/* Merges free range p with the free ranges touching it: the merged one. */
fp_piece *fp_arena_coalesce(fp_arena *a, fp_piece *p);
/* The first chunk at or above addr (its index). */
size_t fp_arena_chunk_lower(const fp_arena *a, uint64_t addr);
/* Unmaps the chunks in [va, va + size). */
void fp_arena_unmap_range(fp_arena *a, uint64_t va, uint64_t size);

/* ---- the fit, cut, release and merge, inline: arena.c's calls, and the medium blocks' path in medium.h
 * (fp_medium_alloc, itself inline in its caller), which takes them in its caller's frame, the held-back blocks'
 * releases and the fit under one take of the pool lock, with the table of blocks known to be the direct index
 * (`direct` a constant 1 there: no test of the arena's policy and no hash of the table's other kind on the
 * way).  Pool lock held. */

#define FP_ARENA_INLINE static inline __attribute__((always_inline))

/* The walk of the bins from n's own up (arena.c): the range, still in its bin, or NULL. */
fp_piece *fp_arena_fit_walk(fp_arena *a, uint64_t n, uint64_t align);
/* Piece p (in a run) is now the last of it. */
void fp_arena_set_tail(fp_arena *a, fp_piece *p);

/* A piece of a spare record (fp_arena_spare_reserve made sure there is one). */
FP_ARENA_INLINE fp_piece *fp_arena_new_(fp_arena *a, uint64_t base, uint64_t size, uint32_t state)
{
    fp_piece *p = fp_rec_take(&a->recs);
    *p = (fp_piece){.base = base, .size_q = (uint32_t)(size >> FP_PIECE_UNIT_SHIFT), .state = (uint16_t)state};
    return p;
}

/* A block's piece of a spare record, for a cut: its base and size alone, its state set by fp_arena_given_, the
 * links that a live block has (its neighbours') by fp_arena_link_after_, its bin's never read while it is live. */
FP_ARENA_INLINE fp_piece *fp_arena_new_live_(fp_arena *a, uint64_t base, uint64_t n)
{
    fp_piece *p = fp_rec_take(&a->recs);
    p->base = base;
    p->size_q = (uint32_t)(n >> FP_PIECE_UNIT_SHIFT);
    return p;
}

/* Free range p into the bin of its size. */
FP_ARENA_INLINE void fp_arena_push_(fp_arena *a, fp_piece *p)
{
    unsigned b = fp_arena_bin_q(a, p->size_q);
    p->state = FP_LARGE_FREE;
    p->bin = (uint16_t)b;
    fp_piece *h = a->bins[b];   /* (a local: the store to the bin would make p->next be read again) */
    p->prev = NULL;
    p->next = h;
    a->bins[b] = p;
    if (h) {
        h->prev = p;
    } else { /* the bin was empty: its bits were clear */
        a->bitmap[b / 64] |= 1ull << (b % 64);
        a->summary |= 1ull << (b / 64);
    }
}

/* Free range p out of its bin (the bin is empty after it where p had neither neighbour there). */
FP_ARENA_INLINE void fp_arena_pull_(fp_arena *a, fp_piece *p)
{
    unsigned b = p->bin;
    fp_piece *pv = p->prev, *nx = p->next;
    if (pv)
        pv->next = nx;
    else
        a->bins[b] = nx;
    if (nx)
        nx->prev = pv;
    /* (p's own links are left: a range pulled is pushed again, given back or cut, and each sets them; a
     * block's are not read) */
    if (!pv && !nx && !(a->bitmap[b / 64] &= ~(1ull << (b % 64))))
        a->summary &= ~(1ull << (b / 64));
}

/* Block of id r at addr into, and out of, the table (direct: a->pol.direct, a constant where the caller knows
 * it; its room made: fp_arena_index_reserve, fp_arena_best_fit_); code: where not 0, the block's state byte
 * (fp_mstate) in the same entry of the direct index (the medium path's; other callers set it after). */
FP_ARENA_INLINE void fp_arena_list_(fp_arena *a, uint64_t addr, fp_rid r, int direct, unsigned code)
{
    if (direct) {
        fp_bent *e = fp_arena_bidx_at(a, addr);
        e->rid = r;
        if (__builtin_expect(code != 0, 1)) /* (the callers that pass 0 pass a constant) */
            atomic_store_explicit(&e->state, (uint8_t)code, memory_order_relaxed);
        a->bidx.n++;
    } else {
        fp_addrmap_put(&a->blocks, addr, r);
    }
}

FP_ARENA_INLINE void fp_arena_unlist_(fp_arena *a, uint64_t addr, int direct)
{
    if (direct) {
        fp_arena_bidx_at(a, addr)->rid = 0;
        a->bidx.n--;
    } else {
        fp_addrmap_del_at(&a->blocks, fp_arena_block_slot(a, addr));
    }
}

/* An allocation of n bytes, for the growth rate. */
FP_ARENA_INLINE void fp_arena_note_(fp_arena *a, uint64_t n)
{
    a->ring_n[a->ring_at % FP_ARENA_RATE] = a->n_blocks;
    a->ring_size[a->ring_at++ % FP_ARENA_RATE] = n;
}

/* Puts piece q right after piece p, in p's run. */
FP_ARENA_INLINE void fp_arena_link_after_(fp_arena *a, fp_piece *p, fp_piece *q)
{
    fp_piece *nx = p->anext;
    q->aprev = p;
    q->anext = nx;
    if (nx)
        nx->aprev = q;
    else
        fp_arena_set_tail(a, q);
    p->anext = q;
}

/* Block b of n bytes, just cut, given out: live, in the table (code: fp_arena_list_'s), counted. */
FP_ARENA_INLINE fp_piece *fp_arena_given_(fp_arena *a, fp_piece *b, uint64_t n, int direct, unsigned code)
{
    b->state = FP_LARGE_LIVE;
    fp_arena_list_(a, b->base, fp_rec_id(b), direct, code);
    a->free_bytes -= n;
    a->used_bytes += n;
    a->n_blocks++;
    fp_arena_note_(a, n);
    return b;
}

/* Cuts the block [x, x + n) out of free range f (out of its bin): what is
 * left of f below and above it stays free.  Two spare records are there. */
FP_ARENA_INLINE fp_piece *fp_arena_carve_(fp_arena *a, fp_piece *f, uint64_t x, uint64_t n, int direct)
{
    uint64_t end = f->base + fp_piece_size(f);
    fp_piece *b = f;
    if (x > f->base) { /* f keeps [base, x); the block follows it */
        b = fp_arena_new_(a, x, n, FP_LARGE_LIVE);
        fp_piece_resize(f, x - f->base);
        fp_arena_link_after_(a, f, b);
        fp_arena_push_(a, f);
    }
    if (x + n < end) { /* the rest above the block */
        fp_piece *r = fp_arena_new_(a, x + n, end - x - n, FP_LARGE_FREE);
        fp_piece_resize(b, n);
        fp_arena_link_after_(a, b, r);
        fp_arena_push_(a, r);
    }
    return fp_arena_given_(a, b, n, direct, 0);
}

/* fp_arena_carve_ of the top n bytes of free range f (out of its bin; n at most its size): the block of a
 * fit at the quantum's alignment, where nothing is left above it to test for. */
FP_ARENA_INLINE fp_piece *fp_arena_carve_top_(fp_arena *a, fp_piece *f, uint64_t n, int direct, unsigned code)
{
    uint64_t size = fp_piece_size(f);
    fp_piece *b = f;
    if (size > n) { /* f keeps its low part; the block follows it */
        b = fp_arena_new_live_(a, f->base + size - n, n);
        fp_piece_resize(f, size - n);
        fp_arena_link_after_(a, f, b);
        fp_arena_push_(a, f);
    }
    return fp_arena_given_(a, b, n, direct, code);
}

/* Where a block of n bytes aligned to `align` goes in free range f: at its
 * high end (what is left of f stays free at the low end, where runs grow)
 * or, for a run that grows upwards, its low end; 0 if it does not fit. */
FP_ARENA_INLINE uint64_t fp_arena_place_(const fp_piece *f, uint64_t n, uint64_t align, int high)
{
    if (fp_piece_size(f) < n)
        return 0;
    uint64_t end = f->base + fp_piece_size(f);
    uint64_t x = high ? (end - n) & ~(align - 1) : (f->base + align - 1) & ~(align - 1);
    return x >= f->base && x + n <= end ? x : 0;
}

/* The quick fit of a block of the quantum's alignment: the first range that fits among the first
 * FP_ARENA_LOOK of its size's bin, else the head of the next bin that holds any; NULL where neither fits. */
FP_ARENA_INLINE fp_piece *fp_arena_fit_quick_(fp_arena *a, uint64_t n)
{
    uint64_t u = n >> FP_PIECE_UNIT_SHIFT;
    unsigned b0 = fp_arena_bin_q(a, u);
    fp_piece *f = a->bins[b0];
    for (unsigned look = 0; f && look < FP_ARENA_LOOK; f = f->next, look++)
        if (f->size_q >= u)
            break;
    if (!f || f->size_q < u) {
        unsigned b = fp_arena_bin_next(a, b0 + 1);
        f = b < FP_ARENA_NBINS ? a->bins[b] : NULL;
    }
    if (!f || f->size_q < u) /* (the last bin holds every size beyond it) */
        return NULL;
    return f;
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
 * tie.  The quick fit and the cut are inline here, the walk apart (fp_arena_fit_walk), so that the common
 * call saves no more registers than it uses.  code: fp_arena_list_'s, for a block of the quantum's
 * alignment (the medium path's). */
FP_ARENA_INLINE fp_piece *fp_arena_best_fit_(fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st, int direct,
                                             unsigned code)
{
    fp_piece *best = align <= a->quantum ? fp_arena_fit_quick_(a, n) : NULL;
    if (__builtin_expect(!best, 0) && !(best = fp_arena_fit_walk(a, n, align)))
        return NULL;
    if ((!direct && fp_addrmap_reserve(&a->blocks, 1) != 0) || fp_arena_spare_reserve(a, 2) != 0) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the record of a block of %llu bytes",
                       (unsigned long long)n);
        return NULL;
    }
    fp_arena_pull_(a, best);
    if (align <= a->quantum)
        return fp_arena_carve_top_(a, best, n, direct, code);
    return fp_arena_carve_(a, best, fp_arena_place_(best, n, align, 1), n, direct);
}

/* Merges free range p (out of its bin) with the free ranges touching it; the result is out of its bin too. */
FP_ARENA_INLINE fp_piece *fp_arena_coalesce_(fp_arena *a, fp_piece *p)
{
    fp_piece *l = p->aprev, *r = p->anext;
    if (l && l->state == FP_LARGE_FREE) {
        fp_arena_pull_(a, l);
        l->size_q += p->size_q;
        l->anext = r;
        if (r)
            r->aprev = l;
        else
            fp_arena_set_tail(a, l);
        fp_rec_give(&a->recs, p);
        p = l;
    }
    if (r && r->state == FP_LARGE_FREE) {
        fp_piece *rn = r->anext;
        fp_arena_pull_(a, r);
        p->size_q += r->size_q;
        p->anext = rn;
        if (rn)
            rn->aprev = p;
        else
            fp_arena_set_tail(a, p);
        fp_rec_give(&a->recs, r);
    }
    return p;
}

/* Block b out of the table, merged with the free ranges touching it, into the bin of the merged range's size
 * (e: its entry in the direct index where the caller has it at hand, else NULL). */
FP_ARENA_INLINE void fp_arena_release_(fp_arena *a, fp_piece *b, int direct, fp_bent *e)
{
    uint64_t size = fp_piece_size(b); /* (before the entry's store, which may alias the record for the compiler) */
    if (e) {
        e->rid = 0;
        a->bidx.n--;
    } else {
        fp_arena_unlist_(a, b->base, direct);
    }
    a->used_bytes -= size;
    if (!a->used_bytes) /* empty: the growth that brought it here says nothing of what comes next */
        a->ring_at = 0;
    a->free_bytes += size;
    a->n_blocks--;
    b->state = FP_LARGE_FREE;
    b = fp_arena_coalesce_(a, b);
    fp_arena_push_(a, b);
}

#endif
