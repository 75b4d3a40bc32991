/* arena_grow.c - an arena's growth on a miss: the plan (the range to map,
 * held in the reservation), the chunks mapped for it, and the block cut
 * from the new free range (arena_grow.h). */
#include "arena_grow.h"

#include <string.h>

#include "array.h"
#include "error.h"

/* Maps [va, va + size) as chunks, their pages sent to the sentinel.  A
 * growth mapped mostly ahead of need (a fast-growing arena) is one chunk of
 * up to chunk_granules: one driver call, about 100 us on the H200, whatever
 * its size.  A growth for one block is cut on a grid of a quarter of it,
 * rounded up to granules (one granule to sixteen): when the block goes, the
 * chunks wholly inside it can be unmapped and traded for another block's,
 * which a single chunk shared with its neighbours could not.  Rounded down,
 * a growth of 10-14 MiB was five to seven chunks: sizes that drift upwards
 * mapped 34 chunks in the p99 batch of 32 calls, 24 rounded up, at 1.053x
 * the live peak instead of 1.050x (log-uniform sizes 1.076x and 1.074x;
 * 40 seeds).  And no larger than FP_PIN_GRANULES, a 64th
 * of what the arena holds or a 64th of the growth, whichever is largest:
 * once the block is freed, best fit cuts smaller blocks from its range, and
 * each keeps the chunk it lands in mapped.  A buffer grown by copying among
 * small blocks (fabpool_bench's realloc family) held 1.10x its live peak
 * with chunks of up to 16 granules, 1.05x with this cap, at 5 % more maps on
 * the H200 training trace (docs/performance.md).  A growth of at most
 * FP_ONE_CHUNK_GRANULES is one chunk all the same: on sizes that grow
 * slowly (fabpool_bench's normal shape, blocks of 2-4 MiB) such a miss
 * comes when nothing is mapped ahead, and its two chunks, about 50 us each
 * on the H200, made the p99 of the batches three maps instead of two; the
 * pin it leaves held log-uniform sizes at 1.074x instead of 1.070x (40
 * seeds).
 *
 * A pool of large_chunks:whole maps a growth for one block as one chunk of up
 * to whole_max (max_chunk), or equal chunks of at most that: the blocks of
 * such a pool live long (PyTorch's segments of a region that sleeps and
 * wakes, kept for the process's life), so what the grid saves once a block
 * is freed seldom comes, and each chunk costs a create, a map and a set
 * access, about 57 us on the H100 whatever its size up to 32 MiB.  The first
 * fill of an RL region (3 GiB of weights, a 2 GiB KV cache: 59 segments)
 * maps 458 chunks on the grid, 50 whole (adapters/torch/test_rl_segments.py).
 * All or nothing. */
#define FP_PIN_GRANULES 4u
#define FP_ONE_CHUNK_GRANULES 2u
static fabpool_status map_range(fp_arena *a, uint64_t va, uint64_t size, int ahead)
{
    fp_lock_assert_held(&a->sp->lock);
    uint64_t gran = a->sp->gran, cells = (size / gran + 3) / 4, pin = FP_PIN_GRANULES;
    cells = cells < 1 ? 1 : cells > 16 ? 16 : cells;
    pin = a->used_bytes / 64 / gran > pin ? a->used_bytes / 64 / gran : pin;
    pin = size / 64 / gran > pin ? size / 64 / gran : pin;
    cells = cells < pin ? cells : pin;
    int one = ahead || size <= FP_ONE_CHUNK_GRANULES * gran;
    uint64_t cap = gran * (one ? a->pol.chunk_granules : cells), at = va, end = va + size;
    if (!ahead && a->pol.whole_max) {
        uint64_t most = a->pol.whole_max / gran * gran, parts = size / most + (size % most != 0); /* no wrap */
        cap = (size / gran + parts - 1) / parts * gran; /* size is a multiple of gran */
        one = 1;
    }
    while (at < end) {
        uint64_t n = end - at < cap ? end - at : cap;
        if (!one) {
            uint64_t next = (at - fp_space_base(a->sp)) / cap * cap + cap + fp_space_base(a->sp);
            n = (next < end ? next : end) - at;
        }
        fabpool_status st = FABPOOL_OK;
        CUmemGenericAllocationHandle h = 0;
        if (FP_ARRAY_RESERVE(a->sp->meta, a->chunks, a->n_chunks, a->cap_chunks, a->n_chunks + 1, 16) != 0)
            st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of %s chunks", a->name);
        else if ((st = fp_chunk_create(a->sp->ch, n, &h)) == FABPOOL_OK &&
                 (st = fp_chunk_map_handle(a->sp->ch, at, n, h, FP_MAP_ARENA, NULL, "a chunk")) == FABPOOL_OK &&
                 fp_map_set(&a->sp->map, at, n, a->sentinel) != 0) {
            fp_chunk_unmap(a->sp->ch, at, n);
            st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of %s chunks", a->name);
        }
        if (st != FABPOOL_OK) {
            fp_arena_unmap_range(a, va, at - va);
            return st;
        }
        size_t i = fp_arena_chunk_lower(a, at);
        memmove(&a->chunks[i + 1], &a->chunks[i], (a->n_chunks - i) * sizeof *a->chunks);
        a->chunks[i] = (fp_lchunk){at, n};
        a->n_chunks++;
        a->mapped_bytes += n;
        at += n;
    }
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ growth */

/* Whether [start, start + size) is free address space. */
static int va_free_at(fp_arena *a, uint64_t start, uint64_t size)
{
    const fp_vaspace *v = &a->sp->va;
    if (start < v->base || start + size > v->base + v->size || start + size < start)
        return 0;
    size_t i = FP_ARRAY_LOWER(v->free, v->n, fp_range, start, start + 1);
    return i > 0 && start + size <= v->free[i - 1].start + v->free[i - 1].size;
}

/* The ahead a miss for n bytes may map (fp_arena_ahead's wish: what the
 * block needs included): no more than leaves the arena mapping its used
 * bytes, the block's included, and a mapped_frac-th of them, its free
 * ranges counted against that room, rounded down to granules.  A live set
 * that grows fast from nothing then meets a miss each time it has grown by
 * that fraction, a geometric schedule, until the room passes ahead_max; the
 * wish alone (twice the recent growth, up to 64 MiB) mapped 20 blocks of
 * 1 MiB as 54 MiB, 2.7x.  At 5: at most 1.20x the live peak for 20 to 100
 * blocks of 0.5-4 MiB, where 4 came to 1.244x (free ranges left by frees
 * and a granule's rounding on top), for about 5 * ln(320 MiB / 2 MiB), some
 * 25, more chunk maps in all on the way up from an empty arena.  A workload
 * that has reached its size grows rarely and mostly within the room; over
 * twenty seeds of fabpool_bench's shapes the peaks held stayed or fell,
 * and the chunk maps rose 0-16 % (docs/performance.md, "A small live set
 * that grows fast"). */
static uint64_t ahead_room(const fp_arena *a, uint64_t n, uint64_t ahead)
{
    if (!a->pol.mapped_frac)
        return ahead;
    uint64_t live = a->used_bytes + n, most = live + live / a->pol.mapped_frac;
    uint64_t room = most > a->mapped_bytes ? (most - a->mapped_bytes) & ~(a->sp->gran - 1) : 0;
    return ahead < room ? ahead : room;
}

fabpool_status fp_arena_grow_plan(fp_arena *a, uint64_t n, uint64_t align, int ahead_ok, fp_arena_grow *gr)
{
    uint64_t ahead = ahead_ok ? ahead_room(a, n, fp_arena_ahead(a, n)) : 0;
    n += align > a->quantum ? align - a->quantum : 0; /* room to place the block aligned */
    fp_lock_assert_held(&a->sp->lock);
    memset(gr, 0, sizeof *gr);
    uint64_t gran = a->sp->gran;
    /* the largest free range at a run's end with free address space beyond it: low ends first (runs are
     * placed downwards and blocks cut from the high end, so what is free gathers low) */
    for (size_t i = 0; i < a->n_runs; i++) {
        const fp_run *r = &a->runs[i];
        fp_piece *ends[2] = {r->head, r->tail};
        for (int k = 0; k < 2; k++) {
            fp_piece *f = ends[k];
            if (f->state != FP_LARGE_FREE || (gr->g && f->size_q <= gr->g->size_q))
                continue;
            uint64_t need = n - fp_piece_size(f) > ahead ? n - fp_piece_size(f) : ahead;
            int mostly = ahead >= 2 * (n - fp_piece_size(f));
            need = (need + gran - 1) & ~(gran - 1);
            if (k == 0 ? r->base - fp_space_base(a->sp) >= need && va_free_at(a, r->base - need, need)
                       : va_free_at(a, r->base + r->size, need)) {
                gr->g = f;
                gr->ahead = mostly;
                gr->low = k == 0;
                gr->size = need;
                gr->va = k == 0 ? r->base - need : r->base + r->size;
            }
        }
    }
    if (!gr->g) {
        uint64_t need = n > ahead ? n : ahead;
        gr->ahead = ahead >= 2 * n;
        gr->size = (need + gran - 1) & ~(gran - 1);
        gr->va = fp_va_alloc_top_below(&a->sp->va, gr->size, gran, a->home);
        if (!gr->va)
            return fp_error(FABPOOL_ERR_LIMIT,
                            "the pool's reserved address space (%llu bytes) has no free range of %llu bytes left; "
                            "create the pool with a larger reserve (FABPOOL_CONF=reserve:...)",
                            (unsigned long long)fp_space_size(a->sp), (unsigned long long)gr->size);
        return FABPOOL_OK;
    }
    if (fp_va_take(&a->sp->va, gr->va, gr->size) != 0)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the pool's list of free address ranges");
    fp_arena_bin_remove(a, gr->g);
    gr->g->state = FP_LARGE_HELD; /* neither a trade nor an out-of-memory trim unmaps it */
    return FABPOOL_OK;
}

void fp_arena_grow_cancel(fp_arena *a, fp_arena_grow *gr)
{
    fp_space_free_range(a->sp, gr->va, gr->size); /* a failed map may have left a stuck mapping there */
    if (gr->g)
        fp_arena_bin_insert(a, gr->g);
    memset(gr, 0, sizeof *gr);
}

/* Run i and the run that touches its low end, if any, become one: the
 * pieces linked, two free ones merged.  Returns the index of the run. */
static size_t join_below(fp_arena *a, size_t i)
{
    if (i == 0 || a->runs[i - 1].base + a->runs[i - 1].size != a->runs[i].base)
        return i;
    fp_run *lo = &a->runs[i - 1], *hi = &a->runs[i];
    lo->tail->anext = hi->head;
    hi->head->aprev = lo->tail;
    fp_piece *t = hi->head, *before = lo->tail;
    lo->size += hi->size;
    lo->tail = hi->tail;
    fp_arena_run_remove(a, i);
    if (t->state == FP_LARGE_FREE && before->state == FP_LARGE_FREE) {
        fp_arena_bin_remove(a, t);
        fp_arena_bin_insert(a, fp_arena_coalesce(a, t));
    }
    return i - 1;
}

fabpool_status fp_arena_grow_map(fp_arena *a, fp_arena_grow *gr, uint64_t n, uint64_t align, fp_piece **out)
{
    fp_lock_assert_held(&a->sp->lock);
    *out = NULL;
    fabpool_status st = FABPOOL_OK;
    /* what cannot fail once the chunks are mapped: three records, a run and a block's slot */
    if (fp_arena_spare_reserve(a, 3) != 0 || fp_arena_index_reserve(a, gr->va, gr->size) != 0 ||
        FP_ARRAY_RESERVE(a->sp->meta, a->runs, a->n_runs, a->cap_runs, a->n_runs + 1, 8) != 0)
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the records of %s", a->name);
    if (st == FABPOOL_OK)
        st = map_range(a, gr->va, gr->size, gr->ahead);
    if (st != FABPOOL_OK) {
        fp_arena_index_drop(a, gr->va, gr->size);
        fp_arena_grow_cancel(a, gr);
        return st;
    }
    fp_piece *g = gr->g;
    int high = !g || gr->low; /* a run that grows upwards keeps its free memory at its top */
    size_t r;
    if (g) {
        r = fp_arena_run_of(a, g->base);
        if (gr->low) {
            g->base = gr->va;
            a->runs[r].base = gr->va;
        }
        fp_piece_resize(g, fp_piece_size(g) + gr->size);
        a->runs[r].size += gr->size;
    } else {
        g = fp_arena_piece_new(a, gr->va, gr->size, FP_LARGE_HELD);
        r = fp_arena_run_insert(a, (fp_run){gr->va, gr->size, g, g});
    }
    a->free_bytes += gr->size;
    memset(gr, 0, sizeof *gr);
    *out = fp_arena_carve_at(a, g, fp_arena_place(g, n, align, high), n);
    /* a run that grew (or was placed) against another becomes one with it */
    if (r + 1 < a->n_runs)
        join_below(a, r + 1);
    join_below(a, r);
    return FABPOOL_OK;
}
