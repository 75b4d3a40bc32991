/* slab.c - the heap (slab.h): slabs of size-class blocks cut from the
 * medium arena, the arenas' growth and trade, trim and decay (the blocks
 * above slab_max are large.c's).  Free memory stays mapped (cached) until a
 * trade, a trim or the decay. */
#include "slab.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "arena_grow.h"
#include "arena_trim.h"
#include "array.h"
#include "clock.h"
#include "counter.h"
#include "error.h"
#include "list.h"
#include "oom.h"


/* A class keeps this many empty slabs; more go back to the medium arena,
 * where any class (or, once a chunk is all free, the driver) can have the
 * memory. */
#define FP_EMPTY_SLABS_KEPT 1u

/* How each arena grows (arena.h, fp_arena_policy): the medium one maps
 * ahead at most 4 MiB and a quarter of what it holds (its blocks are small:
 * a granule serves many); the large one twice its recent growth, up to
 * 64 MiB in one chunk, for blocks under 8 MiB, and no more than leaves it
 * mapping a fifth over its used bytes: a live set of a few blocks that grows
 * fast is mapped at most about 1.2x, not 2.7x (arena_grow.c, ahead_room;
 * docs/design.md, "Blocks above slab_max", has the measurements).  The
 * medium arena's table of blocks is the direct index, always: medium.h's
 * fp_medium_alloc takes it as a constant. */
static const fp_arena_policy policies[FP_NARENAS] = {
    {.ahead_max = 4ull << 20, .ahead_below = UINT64_MAX, .ahead_mult = 1, .ahead_frac = 4, .chunk_granules = 32,
     .direct = 1},
    {.ahead_max = 64ull << 20, .ahead_below = 8ull << 20, .ahead_mult = 2, .ahead_frac = 0, .mapped_frac = 5,
     .chunk_granules = 32},
};

/* ------------------------------------------------------------ idle bytes
 *
 * Idle memory is the empty slabs (written under class locks: atomics) and
 * the arenas' free bytes (written under the pool lock: a plain sum kept in
 * an atomic that the lock-free readers load).  The decay's low-water mark
 * is kept for each part in the same way. */

/* Empty slabs went down by n bytes: the decay's low-water mark follows. */
static void idle_slabs_sub(fp_heap *h, uint64_t n)
{
    uint64_t now = atomic_fetch_sub(&h->idle_slabs, n) - n;
    uint64_t low = atomic_load_explicit(&h->idle_slabs_low, memory_order_relaxed);
    while (now < low && !atomic_compare_exchange_weak_explicit(&h->idle_slabs_low, &low, now, memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
}

/* ------------------------------------------------------------ lists */

static fp_span **class_list(fp_class *c, int list)
{
    return list == FP_LIST_PARTIAL ? &c->partial : list == FP_LIST_EMPTY ? &c->empty : NULL;
}

/* Moves slab s to the list its free count says. */
static void relist(fp_heap *h, fp_class *c, fp_span *s)
{
    fp_lock_assert_held(&c->lock);
    int want = s->nfree == 0 ? FP_LIST_FULL : s->nfree == s->nobj ? FP_LIST_EMPTY : FP_LIST_PARTIAL;
    if (want == s->list)
        return;
    fp_span **from = class_list(c, s->list), **to = class_list(c, want);
    if (from)
        FP_LIST_REMOVE(from, s, next, prev);
    if (s->list == FP_LIST_EMPTY) {
        c->nempty--;
        idle_slabs_sub(h, s->size);
    }
    if (to)
        FP_LIST_PUSH(to, s, next, prev);
    if (want == FP_LIST_EMPTY) {
        c->nempty++;
        atomic_fetch_add(&h->idle_slabs, s->size);
    }
    s->list = (uint8_t)want;
}

/* ------------------------------------------------------------ classes */

/* A slab of blocks of obj bytes: the fewest pages that hold sixteen blocks
 * (eight or four where sixteen would pass 1 MiB; or one page), or up to
 * twice that where it leaves a smaller tail, the first whose tail is at most
 * 1/64 of it (as jemalloc and mimalloc choose their slab sizes): classes up
 * to 4 KiB take one or two 64 KiB pages, at most 1.6 % of them unused.
 * Sixteen, not four, for the classes above 4 KiB that a larger slab_max
 * brings: with four, slab_max:64KiB cut a slab from the medium arena about
 * every 24 calls while the uniform 1 B..64 KiB shape's live set grew (1,684
 * in a replay of 40,000), most batches of 32 calls paid for one, and the
 * bench's median was 27 ns a call on the sim's machine against 22 with
 * sixteen (618 cuts), at 1.1166x the live peak against 1.1179x (ten seeds;
 * slab_max:16KiB 1.0562x against 1.0534x). */
#define FP_SLAB_BLOCKS 16u
_Static_assert((1u << FP_PAGE_SHIFT) % FP_BLOCK_ALIGN == 0, "a slab's page keeps its blocks 256-aligned");
#define FP_SLAB_BLOCKS_MIN 4u
#define FP_SLAB_BYTES (1ull << 20)
static uint64_t slab_size_for(uint64_t obj, uint64_t page)
{
    uint64_t n = FP_SLAB_BLOCKS;
    while (n > FP_SLAB_BLOCKS_MIN && obj * n > FP_SLAB_BYTES)
        n /= 2;
    uint64_t min = obj * n > page ? fp_round_up(obj * n, page) : page;
    uint64_t best = min, best_tail = min % obj;
    for (uint64_t s = min; s <= 2 * min; s += page) {
        uint64_t tail = s % obj;
        if (tail * best < best_tail * s) {
            best = s;
            best_tail = tail;
        }
        if (tail * 64 <= s)
            break;
    }
    return best;
}

void fp_heap_init(fp_heap *h, fp_space *sp, fp_usage *use, const fabpool_options *o)
{
    h->sp = sp;
    use->large = &h->large_in_use_bytes;
    h->cache_limit = o->cache_limit_bytes;
    h->decay_ms = o->decay_ms;
    h->policy_mask = o->decay_ms ? 15u : 0u;
    h->large_slack_percent = o->large_slack_percent;
    /* slab_max is rounded up to a class size (docs/config.md): every size up
     * to the value given comes from slabs, every larger size from an arena,
     * and the allocation path's one comparison with slab_max sends each size
     * to a class that exists.  0 (options set by hand) means no slabs. */
    uint64_t slab_max = o->slab_max_bytes;
    if (slab_max > FP_SLAB_MAX_LIMIT)
        slab_max = FP_SLAB_MAX_LIMIT;
    if (slab_max && slab_max < FP_BLOCK_ALIGN)   /* the parser's least (256 B), for a field set by hand */
        slab_max = FP_BLOCK_ALIGN;
    h->n_slab_classes = slab_max ? fp_class_of(slab_max) + 1 : 0;
    h->slab_max = slab_max ? fp_class_size(h->n_slab_classes - 1) : 0;
    h->medium_max = h->slab_max > FP_MEDIUM_MAX ? h->slab_max : FP_MEDIUM_MAX;
    uint64_t page = 1ull << sp->page_shift;
    for (unsigned i = 0; i < FP_NCLASS; i++) {
        fp_class *c = &h->classes[i];
        fp_lock_init(&c->lock, FP_LOCK_CLASS, i, "class");
        c->obj_size = fp_class_size(i);
        if (i < h->n_slab_classes) {
            c->slab_size = slab_size_for(c->obj_size, page);
            c->nobj = (uint32_t)(c->slab_size / c->obj_size);
        }
    }
    /* homes in the reservation, apart: large blocks from the top down, the
     * medium arena below three quarters; buffer windows come from the bottom
     * up */
    uint64_t base = fp_space_base(sp), size = fp_space_size(sp);
    const char *names[FP_NARENAS] = {"the medium-block arena", "the large-block arena"};
    uint64_t homes[FP_NARENAS] = {base + size / 4 * 3, base + size};
    for (int i = 0; i < FP_NARENAS; i++) {
        h->sentinels[i].kind = FP_SPAN_LARGE;
        h->sentinels[i].cls = (uint16_t)i;
        fp_arena_init(&h->arenas[i], sp, &h->sentinels[i], names[i], homes[i], &policies[i]);
    }
    /* large_chunks:whole: a large block's growth is one chunk of up to max_chunk (arena_grow.c, map_range) */
    if (o->large_chunks == FABPOOL_LARGE_CHUNKS_WHOLE)
        h->arenas[FP_ARENA_LARGE].pol.whole_max = o->max_chunk_bytes > sp->gran ? o->max_chunk_bytes : sp->gran;
}

/* Host bytes of a slab's record: the span, its free stack and a free flag
 * per block.  The one formula for its allocation and its free. */
static size_t slab_meta_bytes(uint32_t nobj)
{
    return sizeof(fp_span) + (size_t)nobj * (sizeof(uint32_t) + sizeof(uint8_t)) + 1;
}

/* An empty slab's record for class cls (placed later); NULL without host memory. */
static fp_span *slab_record(fp_heap *h, unsigned cls)
{
    uint32_t nobj = h->classes[cls].nobj;
    fp_span *s = fp_meta_alloc(h->sp->meta, slab_meta_bytes(nobj));
    if (!s)
        return NULL;
    s->kind = FP_SPAN_SLAB;
    s->size = h->classes[cls].slab_size;
    s->cls = (uint16_t)cls;
    s->nobj = nobj;
    s->obj_q = (uint32_t)(h->classes[cls].obj_size >> FP_QUANTUM_SHIFT);
    s->magic = ((1ull << 32) + s->obj_q - 1) / s->obj_q;
    s->obj_bytes = h->classes[cls].obj_size;
    s->free_stack = (uint32_t *)(s + 1);
    s->freeflag = (_Atomic uint8_t *)(s->free_stack + s->nobj);
    for (uint32_t i = 0; i < s->nobj; i++) {
        s->free_stack[i] = s->nobj - 1 - i;   /* pop order: low addresses first */
        atomic_store_explicit(&s->freeflag[i], 1, memory_order_relaxed);
    }
    atomic_store_explicit(&s->freeflag[s->nobj], FP_FREEFLAG_FREE, memory_order_relaxed);   /* the tail's */
    s->nfree = s->nobj;
    return s;
}

static void slab_free_record(fp_heap *h, fp_span *s) { fp_meta_free(h->sp->meta, s, slab_meta_bytes(s->nobj)); }

/* ------------------------------------------------------------ out of memory */

fabpool_status fp_heap_chunk_create(fp_heap *h, uint64_t size, CUmemGenericAllocationHandle *out)
{
    fp_lock_assert_held(&h->sp->lock);
    fp_msg_hold mh; /* a try that works after the trim leaves the message as it was */
    fp_error_hold(&mh);
    fabpool_status st = fp_chunk_create(h->sp->ch, size, out);
    if (st == FABPOOL_ERR_OUT_OF_MEMORY) {
        /* what the heap caches goes back to the driver, then one more try */
        uint64_t idle = fp_heap_idle(h);
        if (idle) {
            fp_heap_trim_locked(h, 0);
            atomic_fetch_add(&h->oom_retries, 1);
            st = fp_chunk_create(h->sp->ch, size, out);
        }
        if (st == FABPOOL_ERR_OUT_OF_MEMORY)
            st = fp_oom_error(h->sp->ch, size, idle);
    }
    return fp_error_unhold(&mh, st);
}

void fp_heap_count_oom_retry(fp_heap *h) { atomic_fetch_add(&h->oom_retries, 1); }


void fp_heap_read_counters(const fp_heap *src, fp_heap_counters *c)
{
    c->n_slab_classes = src->n_slab_classes;
    FP_HEAP_COUNTERS(FP_COUNTER_COPY)
    for (unsigned i = 0; i < FP_NCLASS; i++)
        c->large_allocs[i] = fp_counter(&src->large_allocs[i]);
}

void fp_heap_read_class(fp_heap *h, unsigned cls, fp_class_counters *c)
{
    fp_class *k = &h->classes[cls];
    c->size = k->obj_size;
    c->nobj = k->nobj;
    fp_lock(&k->lock);
    c->slabs = k->nslabs;
    fp_unlock(&k->lock);
}

fabpool_status fp_heap_chunk_map(fp_heap *h, uint64_t va, uint64_t size, fp_map_kind kind, void *owner)
{
    CUmemGenericAllocationHandle hdl = 0;
    fabpool_status st = fp_heap_chunk_create(h, size, &hdl);
    if (st != FABPOOL_OK)
        return st;
    return fp_chunk_map_handle(h->sp->ch, va, size, hdl, kind, owner, "a chunk");
}

/* ------------------------------------------------------------ arenas */

/* Before a miss maps `need` bytes: free chunks of the arenas that nothing fit
 * are traded for them, but large_slack of what is in use stays free and
 * mapped: a workload whose shapes vary (a training loop's sequence lengths)
 * needs that much room to find fits, and trading it away makes every later
 * step miss and map again.  On the H200 training trace
 * (perf/traces/train-h200.trace.gz) the second half of the steps mapped 33
 * chunks with no slack, 38 with 1 %, none with 2 to 5 %; the default, 4 %,
 * is two steps past the knee.  Decay and the OOM retry still return the
 * slack when it stays unused or memory runs short.  `held` is the free
 * range the miss grows: it is about to become the block.
 *
 * The slack is room only where the next blocks fit: free ranges that at
 * least FP_TRADE_FIT_RANK + 1 of the arena's last FP_ARENA_RATE blocks would
 * have fitted.  Smaller ranges are traded first and do not count towards
 * the slack: counted, they would let the trade unmap the ranges the next
 * blocks need, and those blocks would miss and map again.  With sizes that
 * drift upwards (fabpool_bench's drift family), counting every free byte
 * mapped and unmapped 10,600 chunks in 60,000 operations, counting fitting
 * ranges 6,000, at 1.050x the live peak instead of 1.054x (means over 40
 * seeds; docs/performance.md).  A buffer grown by copying (the realloc
 * family) pays for the room kept: 1.059x instead of 1.051x. */
#define FP_TRADE_FIT_RANK 2u
static void trade(fp_heap *h, const fp_arena *grown, uint64_t need, uint64_t held)
{
    uint64_t done = 0;
    for (int i = FP_NARENAS; i-- > 0 && done < need;) {
        fp_arena *a = &h->arenas[i];
        uint64_t live = a->used_bytes + (a == grown ? need : 0), idle = a->free_bytes - (a == grown ? held : 0);
        uint64_t slack = live / 100 * h->large_slack_percent + live % 100 * h->large_slack_percent / 100;
        if (idle > slack)
            done += fp_arena_unmap_free(a, idle - slack < need - done ? idle - slack : need - done,
                                        fp_arena_recent_size(a, FP_TRADE_FIT_RANK), slack);
    }
    atomic_fetch_add_explicit(&h->traded_bytes, done, memory_order_relaxed);
}

/* A miss of arena a: maps what a block of n bytes needs (and what the
 * arena's growth says the next ones will), after a trade; out of device
 * memory, everything cached goes back and it tries once more, for n alone. */
static fp_piece *grow(fp_heap *h, fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_arena_grow gr;
    fp_piece *b = NULL;
    if ((*st = fp_arena_grow_plan(a, n, align, 1, &gr)) != FABPOOL_OK)
        return NULL;
    trade(h, a, gr.size, gr.g ? fp_piece_size(gr.g) : 0);
    fp_msg_hold mh; /* a try that works after the trim leaves the message as it was */
    fp_error_hold(&mh);
    *st = fp_arena_grow_map(a, &gr, n, align, &b);
    if (*st == FABPOOL_ERR_OUT_OF_MEMORY) {
        uint64_t idle = fp_heap_idle(h);
        if (idle) {
            fp_heap_trim_locked(h, 0);
            atomic_fetch_add(&h->oom_retries, 1);
            if ((*st = fp_arena_grow_plan(a, n, align, 0, &gr)) == FABPOOL_OK)
                *st = fp_arena_grow_map(a, &gr, n, align, &b);
        }
        if (*st == FABPOOL_ERR_OUT_OF_MEMORY)
            *st = fp_oom_error(h->sp->ch, n, idle);
    }
    return fp_error_unhold(&mh, *st) == FABPOOL_OK ? b : NULL;
}

fp_piece *fp_heap_miss(fp_heap *h, fp_arena *a, uint64_t n, uint64_t align, fabpool_status *st)
{
    fp_lock_assert_held(&h->sp->lock);
    return grow(h, a, n, align, st);
}

/* ------------------------------------------------------------ slabs */

/* Unmaps nothing: gives slab s (in no list) back to the medium arena.  Pool lock held. */
static void slab_release(fp_heap *h, fp_span *s)
{
    fp_lock_assert_held(&h->sp->lock);
    fp_arena *a = &h->arenas[FP_ARENA_MEDIUM];
    FP_LIST_REMOVE(&h->spans, s, all_next, all_prev);
    fp_map_set(&h->sp->map, s->base, s->size, a->sentinel); /* its pages have leaves: cannot fail */
    fp_arena_release(a, fp_arena_block(a, s->base));
    fp_heap_idle_follow(h);
    slab_free_record(h, s);
}

/* Up to n blocks of slab s into out[]; given != 0: their free flags cleared (fp_class_take). */
static unsigned take_from(fp_span *s, fp_item *out, unsigned n, int given)
{
    unsigned k = 0;
    uint64_t obj = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
    while (k < n && s->nfree) {
        uint32_t i = s->free_stack[--s->nfree];
        if (given)
            atomic_store_explicit(&s->freeflag[i], FP_FREEFLAG_USED, memory_order_relaxed);
        out[k].ptr = s->base + (uint64_t)i * obj;
        out[k].span = s;
        k++;
    }
    return k;
}

/* A new slab of class cls, cut from the medium arena, with up to n of its
 * blocks taken into out[] (take_from); returns how many (0 with an error
 * set).  It joins the list of every slab and its class at once, under the
 * pool lock and the class's, so that fabpool_check (which holds both) finds
 * it in both or in neither. */
static unsigned slab_new_take(fp_heap *h, unsigned cls, fp_item *out, unsigned n, int given, fabpool_status *st)
{
    fp_class *c = &h->classes[cls];
    fp_span *s = slab_record(h, cls);
    if (!s) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the metadata of a slab (%zu bytes)",
                       slab_meta_bytes(c->nobj));
        return 0;
    }
    unsigned k = 0;
    fp_lock(&h->sp->lock);
    /* on a page boundary: a block lies at a multiple of its class from there, so that every block is aligned
     * as sizeclass.h says (fp_heap_slab_align) */
    fp_piece *run = fp_heap_take(h, &h->arenas[FP_ARENA_MEDIUM], s->size, fp_heap_slab_align(h), st);
    if (run) {
        s->base = run->base;
        fp_map_set(&h->sp->map, s->base, s->size, s); /* the arena's pages have leaves: cannot fail */
        fp_lock(&c->lock);
        FP_LIST_PUSH(&h->spans, s, all_next, all_prev);
        c->nslabs++;
        s->list = FP_LIST_NONE;
        k = take_from(s, out, n, given);
        relist(h, c, s);
        fp_unlock(&c->lock);
    }
    fp_unlock(&h->sp->lock);
    if (!run)
        slab_free_record(h, s);
    return k;
}

unsigned fp_class_take(fp_heap *h, unsigned cls, fp_item *out, unsigned n, int given, fabpool_status *st)
{
    fp_class *c = &h->classes[cls];
    unsigned k = 0;
    fp_lock(&c->lock);
    while (k < n) {
        fp_span *s = c->partial ? c->partial : c->empty;
        if (!s)
            break;
        k += take_from(s, out + k, n - k, given);
        relist(h, c, s);
    }
    fp_unlock(&c->lock);
    if (k)
        return k;

    /* No free block: a new slab without the class lock (a miss of the slab
     * arena maps, tens of microseconds, and may trim on OOM). */
    return slab_new_take(h, cls, out, n, given, st);
}

/* Empty slabs of class cls beyond `keep` go back to the medium arena.  Pool lock held. */
static void class_shed(fp_heap *h, unsigned cls, uint32_t keep)
{
    fp_lock_assert_held(&h->sp->lock);
    fp_class *c = &h->classes[cls];
    for (;;) {
        fp_lock(&c->lock);
        fp_span *s = c->nempty > keep ? c->empty : NULL;
        if (s) {
            FP_LIST_REMOVE(&c->empty, s, next, prev);
            s->list = FP_LIST_NONE;
            c->nempty--;
            c->nslabs--;
            /* the arena counts it now (slab_release): no lower idle mark for the decay */
            atomic_fetch_sub(&h->idle_slabs, s->size);
        }
        fp_unlock(&c->lock);
        if (!s)
            return;
        slab_release(h, s);
    }
}

void fp_class_give(fp_heap *h, unsigned cls, const fp_item *items, unsigned n, int flag)
{
    fp_class *c = &h->classes[cls];
    uint64_t obj = c->obj_size;
    fp_lock(&c->lock);
    for (unsigned k = 0; k < n; k++) {
        fp_span *s = items[k].span;
        uint32_t i = (uint32_t)((items[k].ptr - s->base) / obj);
        if (flag)
            atomic_store_explicit(&s->freeflag[i], FP_FREEFLAG_FREE, memory_order_relaxed);
        s->free_stack[s->nfree++] = i;
        relist(h, c, s);
    }
    /* the caller may hold the pool lock (a flush while the pool goes to
     * sleep): the empty slabs beyond what a class keeps go back at the next
     * fp_heap_trim_policy, which every slow path of a thread cache calls */
    if (c->nempty > FP_EMPTY_SLABS_KEPT)
        atomic_store_explicit(&h->shed, 1, memory_order_relaxed);
    fp_unlock(&c->lock);
}

/* ------------------------------------------------------------ trim */

/* Unmaps free chunks of arena i while more than keep bytes are idle. */
static void trim_arena(fp_heap *h, int i, uint64_t keep)
{
    uint64_t idle = fp_heap_idle(h);
    if (idle <= keep)
        return;
    fp_arena_unmap_free(&h->arenas[i], idle - keep, 0, 0);
    fp_heap_idle_follow(h);
}

void fp_heap_trim_locked(fp_heap *h, uint64_t keep)
{
    fp_lock_assert_held(&h->sp->lock);
    /* large chunks first: one driver call frees the most */
    for (int i = FP_NARENAS; i-- > 0;)
        trim_arena(h, i, keep);
    if (fp_heap_idle(h) <= keep)
        return;
    /* then the empty slabs, through the medium arena */
    for (unsigned cls = 0; cls < h->n_slab_classes; cls++)
        class_shed(h, cls, 0);
    trim_arena(h, FP_ARENA_MEDIUM, keep);
}

void fp_heap_trim_policy(fp_heap *h)
{
    if (atomic_load_explicit(&h->shed, memory_order_relaxed) && atomic_exchange(&h->shed, 0)) {
        fp_lock(&h->sp->lock);
        for (unsigned cls = 0; cls < h->n_slab_classes; cls++)
            class_shed(h, cls, FP_EMPTY_SLABS_KEPT);
        fp_unlock(&h->sp->lock);
    }
    uint64_t idle = fp_heap_idle(h);
    if (idle == 0)
        return;
    uint64_t limit = h->cache_limit, decay = h->decay_ms;
    if (decay == 0 || (idle > limit && idle > atomic_load_explicit(&h->trim_floor, memory_order_relaxed))) {
        /* free memory in chunks that also hold blocks cannot go: a trim that
         * left some above the limit is not tried again until more is idle */
        fp_lock(&h->sp->lock);
        fp_heap_trim_locked(h, decay == 0 ? 0 : limit);
        uint64_t left = fp_heap_idle(h);
        atomic_store_explicit(&h->trim_floor, left > limit ? left : 0, memory_order_relaxed);
        fp_unlock(&h->sp->lock);
        if (decay == 0)
            return;
    }
    /* decay: what stayed idle through a whole period goes back to the driver */
    uint64_t t = fp_coarse_ns(), epoch = atomic_load_explicit(&h->decay_epoch_ns, memory_order_relaxed);
    if (t - epoch < decay * 1000000ull ||
        !atomic_compare_exchange_strong_explicit(&h->decay_epoch_ns, &epoch, t, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    fp_lock(&h->sp->lock);
    uint64_t low = atomic_load(&h->idle_slabs_low) + h->idle_arenas_low;
    idle = fp_heap_idle(h);
    if (low)
        fp_heap_trim_locked(h, idle > low ? idle - low : 0);
    atomic_store(&h->idle_slabs_low, atomic_load(&h->idle_slabs));
    h->idle_arenas_low = atomic_load(&h->idle_arenas);
    fp_unlock(&h->sp->lock);
}

void fp_heap_destroy(fp_heap *h)
{
    if (!h->sp)
        return; /* never set up */
    while (h->spans) {
        fp_span *s = h->spans;
        FP_LIST_REMOVE(&h->spans, s, all_next, all_prev);
        slab_free_record(h, s);
    }
    for (int i = 0; i < FP_NARENAS; i++)
        fp_arena_destroy(&h->arenas[i]);
    for (unsigned cls = 0; cls < FP_NCLASS; cls++) {
        fp_class *c = &h->classes[cls];
        fp_lock_destroy(&c->lock);
    }
}
