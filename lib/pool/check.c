/* check.c - fabpool_check: walks the pool's structures under its locks and
 * verifies their invariants (as TLSF's tlsf_check).  The first broken one
 * is reported as FABPOOL_ERR_CORRUPT with a message that starts with the
 * invariant's name in brackets, e.g. "[slab.flags]": tests/test_check.c
 * breaks each one on purpose and looks for that name.
 *
 * The walk takes the pool lock, every class lock in ascending index and
 * the retirement queue's (lock.h), so the structures hold still.  Other
 * threads may still allocate and free meanwhile: what they change without a
 * lock is read so that it is no data race, and checked only as far as it
 * holds whatever they do:
 *  - another thread's cache is written by its thread alone: not read.  A
 *    thread flags a block free or given out outside a lock only through a
 *    cache of its own, which the pool lists (alloc.c; without one, the flag
 *    changes under the class lock: slab.c), so with no other thread's cache
 *    listed the free flags are counted exactly, else only the blocks on the
 *    free stacks and in the caller's caches are (each flagged free, none
 *    twice);
 *  - flags are read one at a time as atomics;
 *  - a block freed on a stream is flagged pending before it is queued, and
 *    taken out of the queue before its flag is cleared: every queued block
 *    is flagged pending (exact), and more flagged than queued is a block in
 *    flight or a broken flag.  With no other thread's cache listed, the walk
 *    is repeated for up to half a second, and the mismatch reported only if
 *    it stays while the queue sees no activity (fabpool_check below).
 * Scratch memory comes from libc, not the pool's metadata arena, so that a
 * check changes no statistic. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"

#define FAIL(...) fp_error(FABPOOL_ERR_CORRUPT, "fabpool_check: " __VA_ARGS__)
#define ULL(x) ((unsigned long long)(x))

typedef struct ival {
    uint64_t lo, hi;
    const char *what;
    const void *obj;
} ival;

static int ival_cmp(const void *a, const void *b)
{
    const ival *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

typedef struct tc_ref {
    const fp_span *span;
    uint64_t ptr;
    unsigned cls;
} tc_ref;

static int tc_cmp(const void *a, const void *b)
{
    const tc_ref *x = a, *y = b;
    if (x->span != y->span)
        return (uintptr_t)x->span < (uintptr_t)y->span ? -1 : 1;
    return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

typedef struct walk {
    struct fabpool *p;
    ival *iv;                 /* address space in use: arena runs, buffer and view windows */
    size_t n_iv, cap_iv;
    tc_ref *tc;               /* blocks in the calling thread's caches, sorted by slab */
    size_t n_tc, tc_found;
    int exact;                /* no other thread's cache is listed: every free flag is accounted for */
    int suspect;              /* more blocks flagged pending than queued, with exact: confirmed by a new walk */
    unsigned char *seen;      /* a byte per block of the slab being checked */
    uint64_t map_pages;       /* pages of the arenas' chunks: what the page map holds */
    uint64_t n_slabs, slab_bytes; /* slabs: blocks of the medium arena that are not the heap's blocks */
    uint64_t n_chunks, chunk_bytes;   /* mappings the pool counts */
    uint64_t pending;         /* slab blocks and large blocks freed on a stream, not yet reusable */
    uint64_t recorded;        /* live blocks with recorded streams (fabpool_record_stream) */
} walk;

static int iv_add(walk *w, uint64_t lo, uint64_t size, const char *what, const void *obj)
{
    if (w->n_iv == w->cap_iv) {
        size_t cap = w->cap_iv ? w->cap_iv * 2 : 256;
        ival *n = realloc(w->iv, cap * sizeof *n);
        if (!n)
            return -1;
        w->iv = n;
        w->cap_iv = cap;
    }
    w->iv[w->n_iv++] = (ival){lo, lo + size, what, obj};
    return 0;
}

#define HOST_FAIL() fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_check: no host memory for the walk's scratch lists")

/* ------------------------------------------------------------ address space */

static fabpool_status check_vaspace(walk *w)
{
    const struct fabpool *p = w->p;
    const fp_vaspace *v = &p->sp.va;
    if (v->base != p->sp.va.base || v->size != p->sp.va.size)
        return FAIL("[va.bounds] the address space allocator covers [0x%llx, +%llu), the reservation is "
                    "[0x%llx, +%llu)", ULL(v->base), ULL(v->size), ULL(p->sp.va.base), ULL(p->sp.va.size));
    if (v->n > v->cap)
        return FAIL("[va.list] %zu free ranges in a list of %zu", v->n, v->cap);
    uint64_t sum = 0;
    for (size_t i = 0; i < v->n; i++) {
        const fp_range *r = &v->free[i];
        if (r->size == 0 || r->start < v->base || r->start + r->size > v->base + v->size ||
            r->start + r->size < r->start)
            return FAIL("[va.range] free range %zu [0x%llx, +%llu) is empty or outside the reservation", i,
                        ULL(r->start), ULL(r->size));
        if (i && r->start <= v->free[i - 1].start + v->free[i - 1].size)
            return FAIL("[va.sorted] free ranges %zu [0x%llx, +%llu) and %zu [0x%llx, +%llu) are not sorted, "
                        "overlap or touch (touching ones are merged)", i - 1, ULL(v->free[i - 1].start),
                        ULL(v->free[i - 1].size), i, ULL(r->start), ULL(r->size));
        sum += r->size;
    }
    if (sum != v->free_bytes)
        return FAIL("[va.free_bytes] the free ranges add up to %llu bytes, free_bytes says %llu", ULL(sum),
                    ULL(v->free_bytes));
    return FABPOOL_OK;
}

/* The used ranges do not overlap each other nor a free range, and together
 * with the free ones they are the whole reservation. */
static fabpool_status check_va_used(walk *w)
{
    const struct fabpool *p = w->p;
    if (w->n_iv)
        qsort(w->iv, w->n_iv, sizeof *w->iv, ival_cmp);
    uint64_t used = 0;
    for (size_t i = 0; i < w->n_iv; i++) {
        const ival *a = &w->iv[i];
        if (a->lo < p->sp.va.base || a->hi > p->sp.va.base + p->sp.va.size || a->hi <= a->lo)
            return FAIL("[va.outside] %s [0x%llx, 0x%llx) is empty or outside the reservation [0x%llx, 0x%llx)",
                        a->what, ULL(a->lo), ULL(a->hi), ULL(p->sp.va.base), ULL(p->sp.va.base + p->sp.va.size));
        if (i && a->lo < w->iv[i - 1].hi)
            return FAIL("[va.overlap] %s [0x%llx, 0x%llx) overlaps %s [0x%llx, 0x%llx)", w->iv[i - 1].what,
                        ULL(w->iv[i - 1].lo), ULL(w->iv[i - 1].hi), a->what, ULL(a->lo), ULL(a->hi));
        used += a->hi - a->lo;
    }
    size_t k = 0;
    for (size_t i = 0; i < p->sp.va.n; i++) {
        const fp_range *r = &p->sp.va.free[i];
        while (k < w->n_iv && w->iv[k].hi <= r->start)
            k++;
        if (k < w->n_iv && w->iv[k].lo < r->start + r->size)
            return FAIL("[va.free_used] free range [0x%llx, +%llu) overlaps %s [0x%llx, 0x%llx), which is in use",
                        ULL(r->start), ULL(r->size), w->iv[k].what, ULL(w->iv[k].lo), ULL(w->iv[k].hi));
    }
    if (used + p->sp.va.free_bytes != p->sp.va.size)
        return FAIL("[va.sum] %llu bytes in use and %llu free, the reservation is %llu bytes (address space was "
                    "lost or counted twice)", ULL(used), ULL(p->sp.va.free_bytes), ULL(p->sp.va.size));
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ page map */

/* Every page of every arena chunk points at the arena's sentinel, or at the
 * slab that holds it; every page of a slab points at the slab. */
static fabpool_status check_map_spans(walk *w)
{
    const struct fabpool *p = w->p;
    uint64_t page = 1ull << p->sp.page_shift;
    for (int i = 0; i < FP_NARENAS; i++) {
        const fp_arena *a = &p->heap.arenas[i];
        for (size_t k = 0; k < a->n_chunks; k++)
            for (uint64_t at = a->chunks[k].va; at < a->chunks[k].va + a->chunks[k].size; at += page) {
                const fp_span *m = (const fp_span *)fp_map_get(&p->sp.map, at);
                if (m == a->sentinel)
                    continue;
                if (!(i == FP_ARENA_MEDIUM && m && m->kind == FP_SPAN_SLAB && at >= m->base && at < m->base + m->size))
                    return FAIL("[map.span] the page map sends 0x%llx, in a chunk of %s, to %s%p", ULL(at), a->name,
                                m ? "another span " : "nothing ", (const void *)m);
            }
        w->map_pages += a->mapped_bytes >> p->sp.page_shift;
    }
    for (const fp_span *s = p->heap.spans; s; s = s->all_next)
        for (uint64_t at = s->base; at < s->base + s->size; at += page)
            if ((const fp_span *)fp_map_get(&p->sp.map, at) != s)
                return FAIL("[map.span] the page map sends 0x%llx, in the slab [0x%llx, +%llu), elsewhere", ULL(at),
                            ULL(s->base), ULL(s->size));
    return FABPOOL_OK;
}

/* Nothing else in the page map: it holds as many entries as the arenas' chunks have pages. */
static fabpool_status check_map_rest(walk *w)
{
    const struct fabpool *p = w->p;
    uint64_t n = 0;
    for (uint64_t i = 0; i < p->sp.map.l1_n; i++) {
        _Atomic(fp_span *) *leaf = atomic_load_explicit(&p->sp.map.l1[i], memory_order_acquire);
        if (!leaf)
            continue;
        for (unsigned g = 0; g < FP_MAP_LEAF; g++)
            if (atomic_load_explicit(&leaf[g], memory_order_relaxed)) {
                n++;
                if (n > w->map_pages)
                    return FAIL("[map.stray] the page map sends 0x%llx to a span, but no chunk of the heap is there",
                                ULL(p->sp.va.base + (((i << FP_MAP_LEAF_SHIFT) + g) << p->sp.page_shift)));
            }
    }
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ slabs */

/* The calling thread's caches' blocks into w->tc; another thread's cache is
 * only counted (its thread writes it without a lock). */
static fabpool_status gather_tcaches(walk *w)
{
    const struct fabpool *p = w->p;
    size_t n = 0;
    uint64_t guard = 0, others = 0;
    for (const fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next) {
        if (++guard > (1u << 24))
            return FAIL("[tcache.list] the list of thread caches does not end");
        if (tc->owner != &p->alloc)
            return FAIL("[tcache.pool] a thread cache on the pool's list belongs to pool %p", (void *)tc->owner);
        if (!fp_tcache_mine(&p->alloc, tc)) {
            others++;
            continue;
        }
        for (unsigned c = 0; c < p->heap.n_slab_classes; c++) {
            if (tc->bins[c].n > tc->bins[c].cap)
                return FAIL("[tcache.bin] a thread cache holds %u blocks of class %u in a bin of %u", tc->bins[c].n,
                            c, tc->bins[c].cap);
            n += tc->bins[c].n;
        }
    }
    w->exact = others == 0;
    w->tc = n ? malloc(n * sizeof *w->tc) : NULL;
    if (n && !w->tc)
        return HOST_FAIL();
    for (const fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next) {
        if (!fp_tcache_mine(&p->alloc, tc))
            continue;
        for (unsigned c = 0; c < p->heap.n_slab_classes; c++)
            for (uint32_t i = 0; i < tc->bins[c].n; i++)
                w->tc[w->n_tc++] = (tc_ref){tc->bins[c].items[i].span, tc->bins[c].items[i].ptr, c};
    }
    if (w->n_tc)
        qsort(w->tc, w->n_tc, sizeof *w->tc, tc_cmp);
    return FABPOOL_OK;
}

/* Block i's free flag: read as an atomic, for another thread may set or clear it meanwhile (check.c's head). */
static inline uint8_t flag_of(const fp_span *s, uint32_t i)
{
    return atomic_load_explicit(&s->freeflag[i], memory_order_relaxed);
}

/* Blocks i..i+7's free flags as one word, each byte where a memcpy of
 * them would put it (so that they line up with the marks), put together in
 * a register: eight byte stores and a word load would stall the load. */
static inline uint64_t flags8(const fp_span *s, uint32_t i)
{
    uint64_t x = 0;
#pragma GCC unroll 8
    for (unsigned b = 0; b < 8; b++)
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        x |= (uint64_t)flag_of(s, i + b) << (8 * b);
#else
        x |= (uint64_t)flag_of(s, i + b) << (56 - 8 * b);
#endif
    return x;
}

/* The first block of s that is on its free stack or in a thread cache twice,
 * or whose flag is clear: the message, once the fast pass found something. */
static fabpool_status slab_blocks_explain(walk *w, const fp_span *s, size_t tc_lo, uint32_t in_tc)
{
    unsigned char *seen = w->seen;   /* 1: on the free stack, 2: in a thread cache */
    memset(seen, 0, s->nobj);
    for (uint32_t k = 0; k < s->nfree; k++) {
        uint32_t i = s->free_stack[k];
        if (seen[i])
            return FAIL("[slab.stack] slab 0x%llx: block %u is on its free stack twice", ULL(s->base), i);
        if (flag_of(s, i) != FP_FREEFLAG_FREE)
            return FAIL("[slab.flags] slab 0x%llx: block %u is on its free stack but its free flag is clear",
                        ULL(s->base), i);
        seen[i] = 1;
    }
    for (size_t k = tc_lo; k < tc_lo + in_tc; k++) {
        uint32_t i = 0;
        fp_slab_index(s, w->tc[k].ptr, &i);
        if (seen[i])
            return FAIL("[tcache.block] block 0x%llx is in a thread cache and %s", ULL(w->tc[k].ptr),
                        seen[i] == 1 ? "on its slab's free stack" : "in a thread cache again");
        if (flag_of(s, i) != FP_FREEFLAG_FREE)
            return FAIL("[slab.flags] block 0x%llx is in a thread cache but its free flag is clear", ULL(w->tc[k].ptr));
        seen[i] = 2;
    }
    return FAIL("[slab.flags] slab 0x%llx: its free stack and thread caches do not match its free flags", ULL(s->base));
}

/* A slab's free blocks: its free stack and the thread caches' blocks of it
 * are distinct blocks, each with its free flag set, and (w->exact) no other
 * flag is.  One pass without a load-after-store chain: mark every block
 * named (stack and caches), then compare marks and flags eight at a time:
 * marks within the flags, as many marks as names (no block named twice) and
 * as many flags as names.  A mismatch is explained by the slow walk above. */
static fabpool_status check_slab_blocks(walk *w, const fp_span *s)
{
    unsigned char *mark = w->seen;
    /* locals: the stores through mark (a char pointer) would otherwise reload them every time */
    const uint32_t nobj = s->nobj, nfree = s->nfree, *stack = s->free_stack;
    memset(mark, 0, (size_t)nobj + 1);
    uint32_t past = 0;   /* an entry past the end marks mark[nobj], outside the blocks */
    for (uint32_t k = 0; k < nfree; k++) {
        uint32_t i = stack[k];
        past |= i >= nobj;
        mark[i < nobj ? i : nobj] = 1;
    }
    if (past)
        for (uint32_t k = 0; k < nfree; k++)
            if (stack[k] >= nobj)
                return FAIL("[slab.stack] slab 0x%llx: free-stack entry %u is block %u of %u", ULL(s->base), k,
                            stack[k], nobj);
    /* the thread caches' blocks of s: a range of the sorted list */
    size_t lo = 0, hi = w->n_tc;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)w->tc[mid].span < (uintptr_t)s)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t in_tc = 0;
    for (size_t k = lo; k < w->n_tc && w->tc[k].span == s; k++, in_tc++) {
        uint32_t i;
        if (w->tc[k].cls != s->cls || !fp_slab_index(s, w->tc[k].ptr, &i))
            return FAIL("[tcache.block] a thread cache's bin of class %u holds 0x%llx, not a block of its slab 0x%llx "
                        "(class %u)", w->tc[k].cls, ULL(w->tc[k].ptr), ULL(s->base), s->cls);
        mark[i] = 1;
    }
    w->tc_found += in_tc;
    /* marks are bytes of 0 or 1, flags of 0 to 3, taken eight at a time */
    const uint64_t ones = 0x0101010101010101ull;
    uint32_t flags = 0, marks = 0, i = 0;
    uint64_t stray = 0;
    for (; i + 8 <= nobj; i += 8) {
        uint64_t x = flags8(s, i), m;
        memcpy(&m, mark + i, 8);
        /* a flag is 0 (used), 1 (free), 2 (pending on a stream: used until its event, retire.h) or 3 (used,
         * with recorded streams) */
        if (x & ~(ones * 3))
            return FAIL("[slab.flags] slab 0x%llx: a free flag among blocks %u..%u is not 0, 1, 2 or 3", ULL(s->base),
                        i, i + 7);
        uint64_t b0 = x & ones, b1 = (x >> 1) & ones;
        w->pending += ((b1 & ~b0) * ones) >> 56;
        w->recorded += ((b1 & b0) * ones) >> 56;
        x = b0 & ~b1;
        stray |= m & ~x;
        flags += (uint32_t)((x * ones) >> 56);   /* the sum of the eight bytes */
        marks += (uint32_t)((m * ones) >> 56);
    }
    for (; i < nobj; i++) {
        uint8_t fl = flag_of(s, i);
        if (fl > FP_FREEFLAG_RECORDED)
            return FAIL("[slab.flags] slab 0x%llx: the free flag of block %u is not 0, 1, 2 or 3", ULL(s->base), i);
        unsigned f = fl == FP_FREEFLAG_FREE;
        w->pending += fl == FP_FREEFLAG_PENDING;
        w->recorded += fl == FP_FREEFLAG_RECORDED;
        stray |= (uint64_t)(mark[i] & ~f & 1);
        flags += f;
        marks += mark[i];
    }
    if (stray || marks != s->nfree + in_tc)
        return slab_blocks_explain(w, s, lo, in_tc);
    if (w->exact && flags != s->nfree + in_tc)
        return FAIL("[slab.flags] slab 0x%llx (class %u): %u free flags set, but %u blocks on its free stack and %u in "
                    "thread caches", ULL(s->base), s->cls, flags, s->nfree, in_tc);
    return FABPOOL_OK;
}

static fabpool_status check_slabs(walk *w, uint64_t *idle)
{
    struct fabpool *p = w->p;
    uint64_t nslabs[FP_NCLASS], nempty[FP_NCLASS], npartial[FP_NCLASS];
    memset(nslabs, 0, sizeof nslabs);
    memset(nempty, 0, sizeof nempty);
    memset(npartial, 0, sizeof npartial);
    uint32_t max_nobj = 0;
    for (unsigned c = 0; c < p->heap.n_slab_classes; c++)
        if (p->heap.classes[c].nobj > max_nobj)
            max_nobj = p->heap.classes[c].nobj;
    w->seen = malloc((size_t)max_nobj + 8);
    if (!w->seen)
        return HOST_FAIL();
    const fp_span *prev = NULL;
    uint64_t guard = 0, n_all = 0, out = 0;
    for (const fp_span *s = p->heap.spans; s; prev = s, s = s->all_next) {
        if (++guard > (1u << 26))
            return FAIL("[slab.all] the list of every slab does not end");
        if (s->all_prev != prev)
            return FAIL("[slab.all] slab 0x%llx: its back link on the list of every slab is wrong", ULL(s->base));
        if (s->kind != FP_SPAN_SLAB || s->cls >= p->heap.n_slab_classes)
            return FAIL("[slab.kind] span 0x%llx on the list of slabs is of kind %u, class %u (%u slab classes)",
                        ULL(s->base), s->kind, s->cls, p->heap.n_slab_classes);
        const fp_class *c = &p->heap.classes[s->cls];
        if (s->size != c->slab_size || s->nobj != c->nobj || ((uint64_t)s->obj_q << FP_QUANTUM_SHIFT) != c->obj_size)
            return FAIL("[slab.shape] slab 0x%llx of class %u: %llu bytes, %u blocks of %llu; the class has %llu, %u "
                        "of %llu", ULL(s->base), s->cls, ULL(s->size), s->nobj, ULL((uint64_t)s->obj_q << FP_QUANTUM_SHIFT),
                        ULL(c->slab_size), c->nobj, ULL(c->obj_size));
        const fp_piece *run = fp_arena_block(&p->heap.arenas[FP_ARENA_MEDIUM], s->base);
        if (!run || run->state != FP_LARGE_LIVE || run->size != s->size || (s->base & ((1ull << p->sp.page_shift) - 1)))
            return FAIL("[slab.arena] slab 0x%llx of %llu bytes is not a page-aligned block of the medium arena given "
                        "out (%s)", ULL(s->base), ULL(s->size), run ? "one of another size or state" : "none starts there");
        if (s->nfree > s->nobj)
            return FAIL("[slab.count] slab 0x%llx: %u free of %u blocks", ULL(s->base), s->nfree, s->nobj);
        int want = s->nfree == 0 ? FP_LIST_FULL : s->nfree == s->nobj ? FP_LIST_EMPTY : FP_LIST_PARTIAL;
        if (s->list != want)
            return FAIL("[slab.list] slab 0x%llx (class %u, %u of %u free) is marked as on list %u, its count says %d",
                        ULL(s->base), s->cls, s->nfree, s->nobj, s->list, want);
        out += (uint64_t)(s->nobj - s->nfree) * c->obj_size;
        nslabs[s->cls]++;
        nempty[s->cls] += want == FP_LIST_EMPTY;
        npartial[s->cls] += want == FP_LIST_PARTIAL;
        if (want == FP_LIST_EMPTY)
            *idle += s->size;
        fabpool_status st = check_slab_blocks(w, s);
        if (st != FABPOOL_OK)
            return st;
        n_all++;
        w->slab_bytes += s->size;
    }
    w->n_slabs = n_all;
    if (w->tc_found != w->n_tc)
        return FAIL("[tcache.block] thread caches hold %llu blocks of spans that are not slabs of this pool",
                    ULL(w->n_tc - w->tc_found));
    /* the in-use mark counts every block out of its class: given out, pending on a stream, in a cache.  It is
     * counted after the class lock is let go, so it is exact only while no other thread is in the pool: no
     * other thread's cache listed, and caches on (a thread without one leaves no trace to see) */
    if (w->exact && p->alloc.thread_cache && out != atomic_load(&p->use.slab_out))
        return FAIL("[usage.slab_out] %llu bytes of slab blocks are out of their classes, the in-use mark counts %llu",
                    ULL(out), ULL(atomic_load(&p->use.slab_out)));
    /* the class lists hold the slabs their counts say */
    for (unsigned ci = 0; ci < FP_NCLASS; ci++) {
        const fp_class *c = &p->heap.classes[ci];
        if (c->nslabs != nslabs[ci] || c->nempty != nempty[ci])
            return FAIL("[class.count] class %u counts %u slabs, %u empty; the pool's list has %llu, %llu empty", ci,
                        c->nslabs, c->nempty, ULL(nslabs[ci]), ULL(nempty[ci]));
        const struct {
            const fp_span *head;
            int list;
            uint64_t want;
            const char *name;
        } lists[2] = {{c->partial, FP_LIST_PARTIAL, npartial[ci], "partial"}, {c->empty, FP_LIST_EMPTY, nempty[ci], "empty"}};
        for (int l = 0; l < 2; l++) {
            uint64_t n = 0;
            const fp_span *pv = NULL;
            for (const fp_span *s = lists[l].head; s; pv = s, s = s->next) {
                if (++n > lists[l].want)
                    return FAIL("[class.list] class %u's %s list holds more than the %llu slabs its slabs' counts say",
                                ci, lists[l].name, ULL(lists[l].want));
                if (s->prev != pv || s->cls != ci || s->list != lists[l].list || s->kind != FP_SPAN_SLAB)
                    return FAIL("[class.list] class %u's %s list holds slab 0x%llx of class %u marked as on list %u "
                                "(or its back link is wrong)", ci, lists[l].name, ULL(s->base), s->cls, s->list);
            }
            if (n != lists[l].want)
                return FAIL("[class.list] class %u's %s list holds %llu slabs, its slabs' counts say %llu", ci,
                            lists[l].name, ULL(n), ULL(lists[l].want));
        }
    }
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ arenas */

/* The chunks of arena a: sorted, apart, in whole granules, in the reservation. */
static fabpool_status check_arena_chunks(walk *w, const fp_arena *a)
{
    const struct fabpool *p = w->p;
    uint64_t sum = 0;
    for (size_t i = 0; i < a->n_chunks; i++) {
        const fp_lchunk *c = &a->chunks[i];
        if (!c->size || ((c->va - p->sp.va.base) | c->size) & (p->sp.gran - 1) || c->va < p->sp.va.base ||
            c->va + c->size > p->sp.va.base + p->sp.va.size)
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

/* The pieces of arena a's runs: linked in address order, covering each run,
 * sizes and bases in quanta, free ones merged and in their bins, blocks in
 * the table of blocks, the counters right. */
static fabpool_status check_arena_pieces(walk *w, const fp_arena *a, uint64_t *idle)
{
    struct fabpool *p = w->p;
    uint64_t freeb = 0, used = 0, nblocks = 0, nfree = 0;
    for (size_t i = 0; i < a->n_runs; i++) {
        const fp_run *r = &a->runs[i];
        if (i && r->base <= a->runs[i - 1].base + a->runs[i - 1].size)
            return FAIL("[arena.run] runs of %s at 0x%llx and 0x%llx are not sorted, overlap or touch", a->name,
                        ULL(a->runs[i - 1].base), ULL(r->base));
        if (iv_add(w, r->base, r->size, "an arena's run", r) != 0)
            return HOST_FAIL();
        uint64_t at = r->base, guard = 0;
        const fp_piece *prev = NULL;
        for (const fp_piece *q = r->head; q; prev = q, q = q->anext) {
            if (++guard > (1ull << 32) || q->base != at || q->aprev != prev || !q->size ||
                ((q->base | q->size) & (a->quantum - 1)) || q->base + q->size > r->base + r->size)
                return FAIL("[arena.run] %s: the piece at 0x%llx (%llu bytes) does not follow the one before at "
                            "0x%llx in its run [0x%llx, +%llu), or is not in whole quanta of %llu bytes", a->name,
                            ULL(q->base), ULL(q->size), ULL(at), ULL(r->base), ULL(r->size), ULL(a->quantum));
            at += q->size;
            if (q->state == FP_LARGE_FREE) {
                if (prev && prev->state == FP_LARGE_FREE)
                    return FAIL("[arena.merge] %s: free ranges at 0x%llx and 0x%llx touch and were not merged",
                                a->name, ULL(prev->base), ULL(q->base));
                freeb += q->size;
                nfree++;
            } else if (q->state == FP_LARGE_LIVE || q->state == FP_LARGE_PENDING) {
                if (fp_arena_block(a, q->base) != q)
                    return FAIL("[arena.blocks] %s: the block at 0x%llx is not in its table of blocks", a->name,
                                ULL(q->base));
                used += q->size;
                nblocks++;
                w->pending += q->state == FP_LARGE_PENDING;
                const fp_span *home = fp_map_get(&p->sp.map, q->base);
                /* a slab's run starts where its first block does: that block's records are the slab walk's */
                if (q->state == FP_LARGE_LIVE && (!home || home->kind != FP_SPAN_SLAB) &&
                    fp_retire_any_used(&p->retire))
                    w->recorded += (uint64_t)fp_retire_used_locked(&p->retire, q->base);
            } else {
                return FAIL("[arena.run] %s: the piece at 0x%llx is in state %u (held: only inside an allocation)",
                            a->name, ULL(q->base), q->state);
            }
        }
        if (at != r->base + r->size || prev != r->tail)
            return FAIL("[arena.run] %s: the pieces of the run [0x%llx, +%llu) end at 0x%llx, or its last piece is not "
                        "the one it names", a->name, ULL(r->base), ULL(r->size), ULL(at));
    }
    if (nblocks != a->blocks.n || nblocks != a->n_blocks)
        return FAIL("[arena.blocks] %s: %llu blocks in its runs, %zu in its table, it counts %llu", a->name,
                    ULL(nblocks), a->blocks.n, ULL(a->n_blocks));
    /* every free range in the bin of its size, and nothing else in a bin */
    uint64_t binned = 0;
    for (unsigned k = 0; k < FP_ARENA_NBINS / 64; k++)
        if (((a->summary >> k) & 1) != (a->bitmap[k] != 0))
            return FAIL("[arena.bin] %s: word %u of its bitmap is %s but its summary bit says %d", a->name, k,
                        a->bitmap[k] ? "set" : "clear", (int)((a->summary >> k) & 1));
    for (unsigned b = 0; b < FP_ARENA_NBINS; b++) {
        int bit = (a->bitmap[b / 64] >> (b % 64)) & 1;
        if (bit != (a->bins[b] != NULL))
            return FAIL("[arena.bin] %s: bin %u is %s but its bit says %d", a->name, b, a->bins[b] ? "full" : "empty",
                        bit);
        const fp_piece *pv = NULL;
        for (const fp_piece *q = a->bins[b]; q; pv = q, q = q->next) {
            if (++binned > nfree || q->state != FP_LARGE_FREE || q->bin != b || q->prev != pv ||
                fp_arena_find(a, q->base) != q)
                return FAIL("[arena.bin] %s: bin %u holds a piece at 0x%llx that is not one of its free ranges of "
                            "that bin (or its back link is wrong)", a->name, b, ULL(q->base));
        }
    }
    if (binned != nfree)
        return FAIL("[arena.bin] %s: %llu free ranges in its runs, %llu in its bins", a->name, ULL(nfree),
                    ULL(binned));
    if (freeb != a->free_bytes || used != a->used_bytes)
        return FAIL("[arena.sums] %s: its pieces add up to %llu free and %llu used bytes, it counts %llu and %llu",
                    a->name, ULL(freeb), ULL(used), ULL(a->free_bytes), ULL(a->used_bytes));
    *idle += freeb;
    return FABPOOL_OK;
}

static fabpool_status check_arenas(walk *w, uint64_t *idle)
{
    struct fabpool *p = w->p;
    uint64_t used = 0, blocks = 0;
    for (int i = 0; i < FP_NARENAS; i++) {
        const fp_arena *a = &p->heap.arenas[i];
        fabpool_status st;
        if ((st = check_arena_chunks(w, a)) != FABPOOL_OK || (st = check_arena_pieces(w, a, idle)) != FABPOOL_OK)
            return st;
        used += a->used_bytes;
        blocks += a->n_blocks;
    }
    used -= w->slab_bytes;
    blocks -= w->n_slabs;
    if (used != atomic_load(&p->heap.large_in_use_bytes) || blocks != atomic_load(&p->heap.large_blocks))
        return FAIL("[large.in_use] the arenas give out %llu blocks of %llu bytes besides the slabs, the heap counts "
                    "%llu of %llu", ULL(blocks), ULL(used), ULL(atomic_load(&p->heap.large_blocks)),
                    ULL(atomic_load(&p->heap.large_in_use_bytes)));
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ buffers and views */

/* The chunks exported for blocks (fabpool_block_export): sorted, apart, each
 * under an arena's chunk; *fds their fds. */
static fabpool_status check_kept(walk *w, uint64_t *fds)
{
    struct fabpool *p = w->p;
    uint64_t end = 0;
    for (size_t i = 0; i < p->ch.n_kept; i++) {
        const fp_xchunk *x = &p->ch.kept[i];
        if (!x->size || x->va < end || !fp_map_get(&p->sp.map, x->va) || !fp_map_get(&p->sp.map, x->va + x->size - 1))
            return FAIL("[chunk.kept] the chunk exported for a block at 0x%llx (%llu bytes) is empty, overlaps the one "
                        "before, or lies outside every arena", ULL(x->va), ULL(x->size));
        if ((x->fd >= 0) != (p->ch.handle_type == FABPOOL_HANDLE_POSIX_FD))
            return FAIL("[chunk.kept] the chunk exported for a block at 0x%llx %s an fd in a pool of handle type %d",
                        ULL(x->va), x->fd >= 0 ? "keeps" : "lacks", (int)p->ch.handle_type);
        end = x->va + x->size;
        *fds += x->fd >= 0;
    }
    return FABPOOL_OK;
}

static fabpool_status check_buffers(walk *w)
{
    struct fabpool *p = w->p;
    uint64_t bytes = 0, mapped = 0, retiring = 0, count = 0, held = 0, fds = 0;
    const struct fabpool_buffer *pv = NULL;
    for (const struct fabpool_buffer *b = p->bufs.list; b; pv = b, b = b->next) {
        if (b->prev != pv || b->owner != &p->bufs)
            return FAIL("[buffer.list] buffer 0x%llx: its back link or its pool is wrong", ULL(b->base));
        if (!b->window || ((b->base - p->sp.va.base) | b->window) & (p->sp.gran - 1) || b->n > b->cap ||
            b->n_peer_holds > b->cap_peer_holds)
            return FAIL("[buffer.window] buffer 0x%llx: window of %llu bytes not in whole granules, or %u chunks in a "
                        "list of %zu", ULL(b->base), ULL(b->window), b->n, b->cap);
        uint64_t live = 0, all = 0, end = 0;
        int retired_seen = 0;
        for (uint32_t i = 0; i < b->n; i++) {
            const fp_bchunk *c = &b->chunks[i];
            if (!c->size || c->off < end || c->off + c->size > b->window || (c->off | c->size) & (p->sp.gran - 1))
                return FAIL("[buffer.chunks] buffer 0x%llx: chunk %u (%llu bytes at +%llu) is empty, overlaps the one "
                            "before, is not in whole granules or leaves the window of %llu bytes", ULL(b->base), i,
                            ULL(c->size), ULL(c->off), ULL(b->window));
            if (!b->destroyed && c->off != end)
                return FAIL("[buffer.contiguous] buffer 0x%llx: chunk %u starts at +%llu, the chunks before end at "
                            "+%llu (a live buffer's chunks follow each other from its base)", ULL(b->base), i,
                            ULL(c->off), ULL(end));
            int uses_ok = c->uses.n <= c->uses.cap && (c->uses.t != NULL) == (c->uses.cap != 0);
            for (uint32_t k = 0; uses_ok && k < c->uses.n; k++)
                for (uint32_t m = 0; m <= k && uses_ok; m++)
                    uses_ok = c->uses.t[k].rs && (m == k || c->uses.t[m].rs != c->uses.t[k].rs);
            if (!uses_ok)
                return FAIL("[buffer.uses] buffer 0x%llx: chunk %u's list of streams that may use it holds %u tickets "
                            "in room for %zu, one of no stream, or two of one stream", ULL(b->base), i, c->uses.n,
                            c->uses.cap);
            if (!b->destroyed && !c->retiring && retired_seen)
                return FAIL("[buffer.retire] buffer 0x%llx: live chunk %u lies after a retiring one (the live chunks "
                            "come first)", ULL(b->base), i);
            retired_seen |= c->retiring;
            end = c->off + c->size;
            all += c->size;
            live += c->retiring ? 0 : c->size;
            fds += c->fd >= 0;
            w->n_chunks++;
            w->chunk_bytes += c->size;
        }
        if (live != b->live || all != b->mapped)
            return FAIL("[buffer.sums] buffer 0x%llx: its chunks add up to %llu live and %llu mapped bytes, it says "
                        "%llu and %llu", ULL(b->base), ULL(live), ULL(all), ULL(b->live), ULL(b->mapped));
        if (b->destroyed ? b->size != 0 || b->live != 0 : b->size > b->live)
            return FAIL("[buffer.size] buffer 0x%llx%s: size %llu with %llu bytes live", ULL(b->base),
                        b->destroyed ? " (destroyed)" : "", ULL(b->size), ULL(b->live));
        for (uint32_t i = 0; i < b->n_peer_holds; i++)
            held += b->peer_holds[i].size;
        bytes += b->size;
        mapped += b->mapped;
        retiring += b->mapped - b->live;
        count += !b->destroyed;
        if (iv_add(w, b->base, b->window, "a buffer's window", b) != 0)
            return HOST_FAIL();
    }
    fabpool_status kst = check_kept(w, &fds);
    if (kst != FABPOOL_OK)
        return kst;
    struct {
        const char *name;
        uint64_t walk, stat;
    } sums[] = {
        {"buffer_bytes", bytes, atomic_load(&p->bufs.bytes)},   {"buffer_mapped", mapped, atomic_load(&p->bufs.mapped)},
        {"retiring_bytes", retiring, atomic_load(&p->bufs.retiring_bytes)}, {"buffer_count", count, atomic_load(&p->bufs.count)},
        {"held_for_peers_bytes", held, atomic_load(&p->bufs.held_for_peers_bytes)},   {"exported_fds", fds, atomic_load(&p->ch.exported_fds)},
    };
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
        if (sums[i].walk != sums[i].stat)
            return FAIL("[buffer.stats] the buffers add up to %llu for %s, the pool's counter says %llu", ULL(sums[i].walk),
                        sums[i].name, ULL(sums[i].stat));
    return FABPOOL_OK;
}

static fabpool_status check_views(walk *w)
{
    struct fabpool *p = w->p;
    uint64_t bytes = 0;
    const struct fabpool_view *pv = NULL;
    for (const struct fabpool_view *v = p->views.list; v; pv = v, v = v->next) {
        if (v->prev != pv || v->owner != &p->views || v->n > v->cap)
            return FAIL("[view.list] view 0x%llx: its back link, its pool or its chunk count is wrong", ULL(v->base));
        uint64_t end = 0;
        for (uint32_t i = 0; i < v->n; i++) {
            const fp_vchunk *c = &v->chunks[i];
            if (!c->size || c->off < end || c->off + c->size > v->window)
                return FAIL("[view.chunks] view 0x%llx: chunk %u (%llu bytes at +%llu) is empty, overlaps the one before "
                            "or leaves the window of %llu bytes", ULL(v->base), i, ULL(c->size), ULL(c->off),
                            ULL(v->window));
            end = c->off + c->size;
            bytes += c->size;
            w->n_chunks++;
            w->chunk_bytes += c->size;
        }
        if (iv_add(w, v->base, v->window, "a view's window", v) != 0)
            return HOST_FAIL();
    }
    if (bytes != atomic_load(&p->views.bytes))
        return FAIL("[view.stats] the views' chunks add up to %llu bytes, view_bytes says %llu", ULL(bytes),
                    ULL(atomic_load(&p->views.bytes)));
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ the walk */

static fabpool_status check_locked(walk *w)
{
    struct fabpool *p = w->p;
    fp_lock_assert_held(&p->sp.lock);
    uint64_t idle = 0;
    fabpool_status st;
    if ((st = check_vaspace(w)) != FABPOOL_OK || (st = gather_tcaches(w)) != FABPOOL_OK ||
        (st = check_slabs(w, &idle)) != FABPOOL_OK || (st = check_arenas(w, &idle)) != FABPOOL_OK ||
        (st = check_buffers(w)) != FABPOOL_OK || (st = check_views(w)) != FABPOOL_OK ||
        (st = check_va_used(w)) != FABPOOL_OK || (st = check_map_spans(w)) != FABPOOL_OK ||
        (st = check_map_rest(w)) != FABPOOL_OK)
        return st;
    if (idle != fp_heap_idle(&p->heap))
        return FAIL("[pool.idle] empty slabs and the arenas' free ranges add up to %llu bytes, the heap counts %llu "
                    "idle", ULL(idle), ULL(fp_heap_idle(&p->heap)));
    uint64_t queued = atomic_load(&p->retire.pending_blocks);
    w->suspect = w->exact && w->pending > queued;
    if (w->pending < queued || w->suspect)
        return FAIL("[retire.pending] %llu slab and large blocks are marked pending on a stream, the retirement queue "
                    "holds %llu", ULL(w->pending), ULL(queued));
    /* a free of a recorded block drops its record before its flag: exact only while no other thread is in the pool */
    if (w->exact && w->recorded != fp_retire_used_blocks(&p->retire))
        return FAIL("[retire.uses] %llu live blocks are marked as used on recorded streams, the retirement queue "
                    "records streams for %llu", ULL(w->recorded), ULL(fp_retire_used_blocks(&p->retire)));
    uint64_t slept_chunks, slept_bytes;   /* asleep: chunks the records keep, unmapped (sleep.h) */
    fp_sleep_unmapped(p, &slept_chunks, &slept_bytes);
    w->n_chunks -= slept_chunks;
    w->chunk_bytes -= slept_bytes;
    if (w->chunk_bytes != atomic_load(&p->ch.mapped_bytes) || w->n_chunks != atomic_load(&p->ch.chunks_mapped))
        return FAIL("[pool.mapped] arena, buffer and view chunks: %llu mappings of %llu bytes; the "
                    "pool counts %llu of %llu bytes", ULL(w->n_chunks), ULL(w->chunk_bytes),
                    ULL(atomic_load(&p->ch.chunks_mapped)), ULL(atomic_load(&p->ch.mapped_bytes)));
    return FABPOOL_OK;
}

/* One walk under the pool lock, the slab classes' locks (ascending; the
 * other classes hold no slab) and the retirement queue's (lock.h). */
static fabpool_status check_once(struct fabpool *p, int *suspect)
{
    walk w;
    memset(&w, 0, sizeof w);
    w.p = p;
    fp_lock(&p->sp.lock);
    for (unsigned c = 0; c < p->heap.n_slab_classes; c++)
        fp_lock(&p->heap.classes[c].lock);
    fp_lock(&p->retire.lock);
    fabpool_status st = check_locked(&w);
    fp_unlock(&p->retire.lock);
    for (unsigned c = p->heap.n_slab_classes; c-- > 0;)
        fp_unlock(&p->heap.classes[c].lock);
    fp_unlock(&p->sp.lock);
    free(w.iv);
    free(w.tc);
    free(w.seen);
    *suspect = w.suspect;
    return st;
}

/* What the retirement queue has done, all time: blocks queued, taken back, given back to the pool. */
static uint64_t stream_activity(const struct fabpool *p)
{
    const fp_retire *r = &p->retire;
    return atomic_load(&r->frees) + atomic_load(&r->reuse_same) + atomic_load(&r->reuse_after_event) +
           atomic_load(&r->releases);
}

fabpool_status fabpool_check(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_check: the pool is NULL");
    uint64_t act = stream_activity(p);
    int suspect;
    fabpool_status st = check_once(p, &suspect);
    /* more blocks flagged pending than queued, no other thread's cache listed: a thread without one may be
     * between flagging a block and queueing it, or between taking it out and clearing its flag, and goes on
     * once the locks are free; a broken flag stays.  Walks again for up to half a second: while the queue
     * moves, the count cannot be confirmed (OK: every queued block is flagged); a mismatch that stays while
     * it does not is reported. */
    for (long ms = 1; suspect && ms <= 256; ms *= 2) {
        struct timespec nap = {0, ms * 1000000};
        nanosleep(&nap, NULL);
        if (stream_activity(p) != act) {
            st = FABPOOL_OK;
            break;
        }
        st = check_once(p, &suspect);
    }
    if (st == FABPOOL_OK)
        fp_error_clear();
    return st;
}
