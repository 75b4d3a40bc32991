/* test_arena_fit: which free range of the medium arena a block above
 * slab_max is cut from (arena.c's best_fit, docs/design.md "Blocks above
 * slab_max"): a range of the block's own size before a larger one, and no
 * miss (no chunk mapped) while any free range fits, however many ranges of
 * its bin too small for it are listed before it.
 *
 * And what a trade keeps: the bytes in free ranges that fit the arena's
 * recent blocks, whatever the chunks it unmaps leave beside them.
 *
 * White-box: it includes lib/pool.h to read the medium arena's free ranges
 * and where its blocks lie (the same build's headers); it changes nothing
 * there but by the trade it calls, and every pool is checked
 * (fabpool_check) and destroyed, the driver holding nothing at the end. */
#include "testutil.h"

#include "arena_trim.h"
#include "pool.h"

#define KB 1024ull
#define NPLANT ((int)FP_ARENA_LOOK + 2)  /* ranges planted in one bin: more than a block looks at */
#define NKEEP 4096

static void *keep[NKEEP];           /* blocks that fill the arena's larger free ranges */
static int nkeep;

static fp_arena *medium(fabpool_t *p) { return &p->heap.arenas[FP_ARENA_MEDIUM]; }

/* The largest free range of arena a, in bytes (0: none). */
static uint64_t largest_free(const fp_arena *a)
{
    uint64_t m = 0;
    for (size_t i = 0; i < a->n_runs; i++)
        for (const fp_piece *q = a->runs[i].head; q; q = q->anext)
            if (q->state == FP_LARGE_FREE && fp_piece_size(q) > m)
                m = fp_piece_size(q);
    return m;
}

/* Whether the block at ptr has a block given out on each side (so that its free leaves a range of its own size). */
static int fenced(const fp_arena *a, void *ptr)
{
    const fp_piece *b = fp_arena_block(a, (uint64_t)(uintptr_t)ptr);
    const fp_piece *l = b ? b->aprev : NULL, *r = b ? b->anext : NULL;
    return l && r && l->state == FP_LARGE_LIVE && r->state == FP_LARGE_LIVE;
}

/* Allocates blocks until no free range of the medium arena holds min bytes, each the size of the largest free
 * range (at most the arena's largest block), so that none is a miss: the mapped bytes stay as they were. */
static void fill_from(fabpool_t *p, uint64_t min)
{
    fp_arena *a = medium(p);
    uint64_t mapped = t_mapped(p);
    for (uint64_t m; (m = largest_free(a)) >= min && nkeep < NKEEP;) {
        uint64_t size = m < p->heap.medium_max ? m : p->heap.medium_max;
        CHECK_OK(fabpool_alloc(p, size, &keep[nkeep++]));
    }
    CHECK(largest_free(a) < min);
    CHECK(t_mapped(p) == mapped);
}

/* Ranges of 32 KiB and one of 32 KiB + 256 (the same bin: two quanta wide there), each between blocks given out;
 * the larger freed first, so that it is the last of its bin's list, behind NPLANT - 1 ranges too small for a block
 * of its size.  A block of that size is cut from it, with no chunk mapped; a block of 32 KiB, with a 64 KiB range
 * free too, from one of the 32 KiB ranges. */
static void fit_behind_small_ranges(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.decay_ms = 1000000; /* nothing goes back to the driver behind the test's back */
    o.thread_cache = 0;   /* every free reaches the arena (a thread cache keeps medium blocks by size) */
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    if (!p)
        return;
    fp_arena *a = medium(p);
    void *guard = NULL, *blk[NPLANT], *sep[NPLANT], *big = NULL, *bigsep = NULL;
    const uint64_t small = 32 * KB, large = 32 * KB + FP_BLOCK_QUANTUM;
    CHECK(small > p->heap.slab_max); /* blocks of the medium arena */
    nkeep = 0;
    CHECK_OK(fabpool_alloc(p, 8 * KB, &guard));
    for (int i = 0; i < NPLANT; i++) {
        CHECK_OK(fabpool_alloc(p, i == NPLANT - 1 ? large : small, &blk[i]));
        CHECK_OK(fabpool_alloc(p, 8 * KB, &sep[i]));
    }
    CHECK_OK(fabpool_alloc(p, 64 * KB, &big));
    CHECK_OK(fabpool_alloc(p, 8 * KB, &bigsep));
    fill_from(p, small);
    for (int i = 0; i < NPLANT; i++)
        CHECK(fenced(a, blk[i]));
    CHECK(fenced(a, big));

    /* the larger one last in its bin, NPLANT - 1 smaller ones before it, nothing larger free */
    CHECK_OK(fabpool_free(p, blk[NPLANT - 1]));
    for (int i = 0; i < NPLANT - 1; i++)
        CHECK_OK(fabpool_free(p, blk[i]));
    CHECK(largest_free(a) == large);
    uint64_t mapped = t_mapped(p);
    int64_t held = t_held();
    void *x = NULL;
    CHECK_OK(fabpool_alloc(p, large, &x));
    if (x != blk[NPLANT - 1])
        fprintf(stderr, "  a block of %llu bytes at %p, not in the free range of its size at %p\n",
                (unsigned long long)large, x, blk[NPLANT - 1]);
    CHECK(x == blk[NPLANT - 1]);
    CHECK(t_mapped(p) == mapped && t_near(t_held(), held));

    /* a range of the block's own size before a larger one */
    CHECK_OK(fabpool_free(p, big));
    void *y = NULL;
    CHECK_OK(fabpool_alloc(p, small, &y));
    int own = 0;
    for (int i = 0; i < NPLANT - 1; i++)
        own |= y == blk[i];
    CHECK(own);
    CHECK(t_mapped(p) == mapped && t_near(t_held(), held));
    CHECK_OK(fabpool_check(p));

    CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_free(p, y));
    for (int i = 0; i < NPLANT; i++)
        CHECK_OK(fabpool_free(p, sep[i]));
    CHECK_OK(fabpool_free(p, guard));
    CHECK_OK(fabpool_free(p, bigsep));
    for (int i = 0; i < nkeep; i++)
        CHECK_OK(fabpool_free(p, keep[i]));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

/* Bytes in free ranges of arena a of at least fit bytes. */
static uint64_t fitting_free(const fp_arena *a, uint64_t fit)
{
    uint64_t n = 0;
    for (size_t i = 0; i < a->n_runs; i++)
        for (const fp_piece *q = a->runs[i].head; q; q = q->anext)
            if (q->state == FP_LARGE_FREE && fp_piece_size(q) >= fit)
                n += fp_piece_size(q);
    return n;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A trade (fp_arena_unmap_free with fit and keep, as a miss calls it)
 * unmaps free chunks but leaves at least keep bytes in free ranges of fit
 * bytes or more, counting what an unmapped chunk leaves beside it: a piece
 * of a chunk with a live block in its other part, too small to fit, is lost
 * to the slack too.  Large-arena blocks of random sizes, freed in runs of
 * up to five between blocks kept, then one trade for every byte with keep
 * swept over what fits; the layout is built again for each keep. */
static void trade_keeps_fitting_bytes(void)
{
    enum { NB = 48 };
    const uint64_t fit = 12ull << 20;
    int worst_short = 0, trials = 0, unmapped_any = 0;
    for (uint64_t kept = 0; kept <= 384ull << 20; kept += 8ull << 20) {
        fabpool_options o;
        fabpool_options_init(&o);
        o.decay_ms = 1000000;
        fabpool_t *p = NULL;
        CHECK_OK(fabpool_create(&o, &p));
        if (!p)
            return;
        fp_arena *a = &p->heap.arenas[FP_ARENA_LARGE];
        void *b[NB];
        uint64_t s = 0x7eade;
        for (int i = 0; i < NB; i++)
            CHECK_OK(fabpool_alloc(p, (8ull << 20) + lcg(&s) % (16ull << 20), &b[i]));
        for (int i = 0; i < NB;) { /* runs of up to 5 freed, then 1 to 3 kept */
            for (int n = (int)(lcg(&s) % 6); n-- > 0 && i < NB; i++) {
                CHECK_OK(fabpool_free(p, b[i]));
                b[i] = NULL;
            }
            i += 1 + (int)(lcg(&s) % 3);
        }
        uint64_t mapped = t_mapped(p);
        fp_lock(&p->heap.sp->lock);
        uint64_t before = fitting_free(a, fit);
        uint64_t done = fp_arena_unmap_free(a, UINT64_MAX, fit, kept);
        uint64_t after = fitting_free(a, fit);
        fp_heap_idle_follow(&p->heap);
        fp_unlock(&p->heap.sp->lock);
        uint64_t floor = kept < before ? kept : before;
        if (after < floor) {
            fprintf(stderr, "  keep %llu: %llu bytes in fitting ranges after the trade (%llu before)\n",
                    (unsigned long long)kept, (unsigned long long)after, (unsigned long long)before);
            worst_short = 1;
        }
        CHECK(after >= floor);
        CHECK(t_mapped(p) == mapped - done);
        unmapped_any |= done > 0;
        trials++;
        CHECK_OK(fabpool_check(p));
        for (int i = 0; i < NB; i++)
            if (b[i])
                CHECK_OK(fabpool_free(p, b[i]));
        CHECK_OK(fabpool_destroy(p));
    }
    printf("trade: %d values of keep, %s\n", trials, worst_short ? "some kept less" : "each kept");
    CHECK(unmapped_any);
}

int main(void)
{
    t_driver_init();
    fit_behind_small_ranges();
    trade_keeps_fitting_bytes();
    CHECK(t_near(t_held(), 0));
    return t_done("test_arena_fit");
}
