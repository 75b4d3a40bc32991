/* large.c - blocks above slab_max, each cut from the medium or the large
 * arena by best fit (large.h). */
#include "medium.h"

#include "error.h"

static int arena_index(const fp_heap *h, uint64_t size)
{
    return size <= h->medium_max ? FP_ARENA_MEDIUM : FP_ARENA_LARGE;
}

static fp_arena *arena_for(fp_heap *h, uint64_t size) { return &h->arenas[arena_index(h, size)]; }

uint64_t fp_large_size(const fp_heap *h, uint64_t size) { return fp_arena_round(&h->arenas[arena_index(h, size)], size); }

/* Whether the block at addr of arena a sits in a thread cache (fp_mstate): free to its caller. */
static int in_cache(const fp_arena *a, uint64_t addr)
{
    const _Atomic uint8_t *f = fp_mstate_at(&a->ms, addr);
    return f && atomic_load_explicit(f, memory_order_relaxed) == FP_MSTATE_CACHED;
}

/* The state a live block of n bytes at addr of arena a takes (its code: thread caches may hold it). */
static void mstate_live(fp_arena *a, uint64_t addr, uint64_t n)
{
    unsigned c = a->ms.leaves ? fp_mstate_code(&a->ms, n) : 0;
    if (c)
        fp_arena_mstate_set(a, addr, c);
}

fabpool_status fp_large_alloc(fp_heap *h, uint64_t size, uint64_t align, void **out)
{
    if (size > fp_space_size(h->sp)) {
        /* more than the device holds too: out of memory, as cudaMalloc answers any size no device memory can
         * serve (a larger reservation would change nothing); a size the device holds: raise reserve */
        fabpool_status st = fp_chunk_fits_device(h->sp->ch, size, "fabpool_alloc: a block of");
        if (st != FABPOOL_OK)
            return st;
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_alloc of %llu bytes: larger than the pool's reserved address "
                        "space (%llu bytes); raise reserve", (unsigned long long)size,
                        (unsigned long long)fp_space_size(h->sp));
    }
    fp_arena *a = arena_for(h, size);
    uint64_t n = fp_arena_round(a, size);
    fabpool_status st = fp_chunk_fits_device(h->sp->ch, n, "fabpool_alloc: a block of");
    if (st != FABPOOL_OK)
        return st;
    fp_lock(&h->sp->lock);
    fp_piece *b = fp_heap_take(h, a, n, align > FP_BLOCK_QUANTUM ? align : FP_BLOCK_QUANTUM, &st);
    if (b) {
        mstate_live(a, b->base, n);
        fp_count_locked(&h->large_in_use_bytes, n);
        uint64_t q = n >> FP_PIECE_UNIT_SHIFT;
        unsigned bucket = q <= FP_ARENA_CLS_Q ? a->cls_of_q[q - 1] : fp_class_of(n);
        fp_count_locked(&h->large_allocs[bucket < FP_NCLASS ? bucket : FP_NCLASS - 1], 1);
        *out = (void *)(uintptr_t)b->base;
    }
    int due = fp_heap_policy_due(h, atomic_load_explicit(&h->idle_arenas, memory_order_relaxed));
    fp_unlock(&h->sp->lock);
    if (due)
        fp_heap_trim_policy(h);
    return st;
}

/* The arena whose sentinel s is, or NULL. */
static fp_arena *arena_of(fp_heap *h, const fp_span *s)
{
    for (int i = 0; i < FP_NARENAS; i++)
        if (s == &h->sentinels[i])
            return &h->arenas[i];
    return NULL;
}

/* The arena of blocks above slab_max whose page holds addr, or NULL. */
static fp_arena *arena_at(fp_heap *h, uint64_t addr) { return arena_of(h, fp_map_get(&h->sp->map, addr)); }

/* The live block at addr, or NULL with a message (fn names the call); a: the arena whose page holds it. */
static fp_piece *live_in(fp_arena *a, uint64_t addr, const char *fn, fabpool_status *st)
{
    fp_piece *b = a ? fp_arena_block(a, addr) : NULL;
    if (b && b->state == FP_LARGE_LIVE && !in_cache(a, addr))
        return b;
    if (b && b->state == FP_LARGE_LIVE) {
        *st = fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this %llu-byte block was already freed and waits in a "
                       "thread's cache for reuse (a double free)", fn, (void *)(uintptr_t)addr,
                       (unsigned long long)fp_piece_size(b));
        return NULL;
    }
    if (b) {
        *st = fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this block was already freed on a stream and waits there "
                       "for the stream's work (a double free)", fn, (void *)(uintptr_t)addr);
        return NULL;
    }
    const fp_piece *p = a ? fp_arena_find(a, addr) : NULL;
    if (p && (p->state == FP_LARGE_LIVE || p->state == FP_LARGE_PENDING))
        *st = fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer, %llu bytes into a block of %llu bytes at "
                       "0x%llx; free the pointer fabpool_alloc returned", fn, (void *)(uintptr_t)addr,
                       (unsigned long long)(addr - p->base), (unsigned long long)fp_piece_size(p),
                       (unsigned long long)p->base);
    else if (p)
        *st = fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this address is in free memory of %s (a double free, or a "
                       "pointer this pool never gave out)", fn, (void *)(uintptr_t)addr, a->name);
    else
        *st = fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): this pool did not give out that pointer, or it was freed and "
                       "its memory returned to the driver", fn, (void *)(uintptr_t)addr);
    return NULL;
}

/* live_in, the arena looked up; *ap: the arena (or NULL). */
static fp_piece *live_at(fp_heap *h, uint64_t addr, fp_arena **ap, const char *fn, fabpool_status *st)
{
    fp_lock_assert_held(&h->sp->lock);
    *ap = arena_at(h, addr);
    return live_in(*ap, addr, fn, st);
}

fabpool_status fp_large_check(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable)
{
    fabpool_status st = FABPOOL_OK;
    fp_arena *a = NULL;
    fp_lock(&h->sp->lock);
    fp_piece *b = live_at(h, addr, &a, fn, &st);
    if (b)
        *usable = fp_piece_size(b);
    fp_unlock(&h->sp->lock);
    return st;
}

fabpool_status fp_large_pend(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable)
{
    fabpool_status st = FABPOOL_OK;
    fp_arena *a = NULL;
    fp_lock(&h->sp->lock);
    fp_piece *b = live_at(h, addr, &a, fn, &st);
    if (b) {
        b->state = FP_LARGE_PENDING;
        fp_arena_mstate_set(a, addr, 0);   /* its free now takes the slow path, which says it is pending */
        *usable = fp_piece_size(b);
    }
    fp_unlock(&h->sp->lock);
    return st;
}

void fp_large_unpend(fp_heap *h, uint64_t addr)
{
    fp_lock(&h->sp->lock);
    fp_arena *a = arena_at(h, addr);
    fp_piece *b = a ? fp_arena_block(a, addr) : NULL;
    if (b) {
        b->state = FP_LARGE_LIVE;
        mstate_live(a, addr, fp_piece_size(b));
    }
    fp_unlock(&h->sp->lock);
}

fabpool_status fp_large_live_locked(fp_heap *h, uint64_t addr, uint64_t *usable, const char *fn)
{
    fp_lock_assert_held(&h->sp->lock);
    fp_arena *a = arena_at(h, addr);
    fp_piece *b = a ? fp_arena_block(a, addr) : NULL;
    int cached = b && in_cache(a, addr);
    if (b && b->state == FP_LARGE_LIVE && !cached) {
        *usable = fp_piece_size(b);
        return FABPOOL_OK;
    }
    if (b)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): this %llu-byte block is free (%s); only a live block can be "
                        "used", fn, (void *)(uintptr_t)addr, (unsigned long long)fp_piece_size(b),
                        cached ? "in a thread's cache for reuse" : "freed on a stream and waiting for its work");
    const fp_piece *p = a ? fp_arena_find(a, addr) : NULL;
    if (p && (p->state == FP_LARGE_LIVE || p->state == FP_LARGE_PENDING))
        return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer, %llu bytes into a block of %llu bytes at "
                        "0x%llx; give the pointer fabpool_alloc returned", fn, (void *)(uintptr_t)addr,
                        (unsigned long long)(addr - p->base), (unsigned long long)fp_piece_size(p),
                        (unsigned long long)p->base);
    return fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): this address is free memory of %s, not a block given out; only a "
                    "live block can be used", fn, (void *)(uintptr_t)addr, a ? a->name : "the pool");
}

fabpool_status fp_large_usable(fp_heap *h, uint64_t addr, uint64_t *usable, const char *fn)
{
    fp_lock(&h->sp->lock);
    /* a block freed on a stream is still given out until its work is done: it keeps its size, as a slab's */
    fp_arena *a = arena_at(h, addr);
    fp_piece *b = a ? fp_arena_block(a, addr) : NULL;
    fabpool_status st = FABPOOL_OK;
    if (b && b->state == FP_LARGE_PENDING)
        *usable = fp_piece_size(b);
    else
        st = fp_large_live_locked(h, addr, usable, fn);
    fp_unlock(&h->sp->lock);
    return st;
}

fabpool_status fp_large_free(fp_heap *h, const fp_span *s, uint64_t addr, const char *fn)
{
    /* the block is looked up under the lock: pieces merge and split under it (and a chunk is unmapped under
     * it only when all of it is free: the span the caller read stays the page's while a block is there) */
    fabpool_status st = FABPOOL_OK;
    fp_arena *a = arena_of(h, s);
    fp_lock(&h->sp->lock);
    fp_piece *b = live_in(a, addr, fn, &st);
    int due = 0;
    if (b) {
        fp_count_locked(&h->large_in_use_bytes, 0 - fp_piece_size(b));
        fp_arena_mstate_set(a, addr, 0);
        fp_arena_release(a, b);
        due = fp_heap_policy_due(h, fp_heap_idle_follow(h));
    }
    fp_unlock(&h->sp->lock);
    if (due)
        fp_heap_trim_policy(h);
    return st;
}

void fp_heap_count_large(const fp_heap *h, uint64_t *counts)
{
    for (int i = 0; i < FP_NARENAS; i++) {
        const fp_arena *a = &h->arenas[i];
        for (size_t r = 0; r < a->n_runs; r++)   /* the blocks given out (live or pending): the table's */
            for (const fp_piece *b = a->runs[r].head; b; b = b->anext) {
                const fp_span *s = fp_map_get(&h->sp->map, b->base);
                if ((b->state != FP_LARGE_LIVE && b->state != FP_LARGE_PENDING) || (s && s->kind == FP_SPAN_SLAB) ||
                    in_cache(a, b->base))
                    continue; /* free, a slab of the medium arena, or a block in a thread cache (free to its
                                 caller) */
                unsigned c = fp_class_of(fp_piece_size(b));
                counts[c < FP_NCLASS ? c : FP_NCLASS - 1]++;
            }
    }
}


/* A block a thread cache held back to the medium arena a (pool lock held): its state 0, merged with its free
 * neighbours; nothing where addr is not such a block (fabpool_check says what is wrong). */
static inline void release_cached(fp_heap *h, fp_arena *a, uint64_t addr)
{
    fp_piece *b = fp_arena_block(a, addr);
    _Atomic uint8_t *f = fp_mstate_at(&a->ms, addr);
    if (!b || b->state != FP_LARGE_LIVE || !f || atomic_load_explicit(f, memory_order_relaxed) != FP_MSTATE_CACHED)
        return;
    fp_count_locked(&h->large_in_use_bytes, 0 - fp_piece_size(b));
    atomic_store_explicit(f, 0, memory_order_relaxed);
    fp_arena_release(a, b);
}

void fp_large_release_cached_locked(fp_heap *h, uint64_t addr)
{
    fp_lock_assert_held(&h->sp->lock);
    release_cached(h, &h->arenas[FP_ARENA_MEDIUM], addr);
}

int fp_large_policy_due(fp_heap *h)
{
    return fp_heap_policy_due(h, fp_heap_idle_follow(h));
}
