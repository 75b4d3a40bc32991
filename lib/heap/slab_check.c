/* slab_check.c - fabpool_check's walk of the slabs (walk.h): every slab on
 * the heap's list of slabs, its free stack, its free flags and the calling
 * thread's cached blocks of it, and the class lists.
 *
 * The walk runs under every class lock (pool/check.c takes them).  Another
 * thread's cache is written by its thread alone and not read; a thread
 * flags a block free or given out outside a lock only through a cache of
 * its own, which the pool lists (alloc.c; without one, the flag changes
 * under the class lock: slab.c), so with no other thread's cache listed
 * (w->exact) the free flags are counted exactly, else only the blocks on the
 * free stacks and in the caller's caches are (each flagged free, none
 * twice).  Flags are read one at a time as atomics. */
#include <stdlib.h>
#include <string.h>

#include "slab_check.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* Block i's free flag: read as an atomic, for another thread may set or clear it meanwhile (this file's head). */
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
static fabpool_status slab_blocks_explain(fp_walk *w, const fp_span *s, size_t tc_lo, uint32_t in_tc)
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
static fabpool_status check_slab_blocks(fp_walk *w, const fp_span *s)
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

/* What the walk of the slabs counts per class, for the class lists. */
typedef struct slab_counts {
    uint64_t nslabs[FP_NCLASS], nempty[FP_NCLASS], npartial[FP_NCLASS];
} slab_counts;

/* One slab on the list of every slab: its class, shape, place in the
 * medium arena, count and list mark, then its blocks. */
static fabpool_status check_slab(fp_walk *w, const fp_heap *h, const fp_span *s, slab_counts *n)
{
    if (s->kind != FP_SPAN_SLAB || s->cls >= h->n_slab_classes)
        return FAIL("[slab.kind] span 0x%llx on the list of slabs is of kind %u, class %u (%u slab classes)",
                    ULL(s->base), s->kind, s->cls, h->n_slab_classes);
    const fp_class *c = &h->classes[s->cls];
    if (s->size != c->slab_size || s->nobj != c->nobj || ((uint64_t)s->obj_q << FP_QUANTUM_SHIFT) != c->obj_size)
        return FAIL("[slab.shape] slab 0x%llx of class %u: %llu bytes, %u blocks of %llu; the class has %llu, %u "
                    "of %llu", ULL(s->base), s->cls, ULL(s->size), s->nobj, ULL((uint64_t)s->obj_q << FP_QUANTUM_SHIFT),
                    ULL(c->slab_size), c->nobj, ULL(c->obj_size));
    const fp_piece *run = fp_arena_block(&h->arenas[FP_ARENA_MEDIUM], s->base);
    if (!run || run->state != FP_LARGE_LIVE || fp_piece_size(run) != s->size || (s->base & ((1ull << w->page_shift) - 1)))
        return FAIL("[slab.arena] slab 0x%llx of %llu bytes is not a page-aligned block of the medium arena given "
                    "out (%s)", ULL(s->base), ULL(s->size), run ? "one of another size or state" : "none starts there");
    if (s->nfree > s->nobj)
        return FAIL("[slab.count] slab 0x%llx: %u free of %u blocks", ULL(s->base), s->nfree, s->nobj);
    int want = s->nfree == 0 ? FP_LIST_FULL : s->nfree == s->nobj ? FP_LIST_EMPTY : FP_LIST_PARTIAL;
    if (s->list != want)
        return FAIL("[slab.list] slab 0x%llx (class %u, %u of %u free) is marked as on list %u, its count says %d",
                    ULL(s->base), s->cls, s->nfree, s->nobj, s->list, want);
    w->slab_out += (uint64_t)(s->nobj - s->nfree) * c->obj_size;
    n->nslabs[s->cls]++;
    n->nempty[s->cls] += want == FP_LIST_EMPTY;
    n->npartial[s->cls] += want == FP_LIST_PARTIAL;
    if (want == FP_LIST_EMPTY)
        w->idle += s->size;
    return check_slab_blocks(w, s);
}

/* The class lists hold the slabs their counts say. */
static fabpool_status check_class_lists(const fp_heap *h, const slab_counts *n)
{
    for (unsigned ci = 0; ci < FP_NCLASS; ci++) {
        const fp_class *c = &h->classes[ci];
        if (c->nslabs != n->nslabs[ci] || c->nempty != n->nempty[ci])
            return FAIL("[class.count] class %u counts %u slabs, %u empty; the pool's list has %llu, %llu empty", ci,
                        c->nslabs, c->nempty, ULL(n->nslabs[ci]), ULL(n->nempty[ci]));
        const struct {
            const fp_span *head;
            int list;
            uint64_t want;
            const char *name;
        } lists[2] = {{c->partial, FP_LIST_PARTIAL, n->npartial[ci], "partial"},
                      {c->empty, FP_LIST_EMPTY, n->nempty[ci], "empty"}};
        for (int l = 0; l < 2; l++) {
            uint64_t k = 0;
            const fp_span *pv = NULL;
            for (const fp_span *s = lists[l].head; s; pv = s, s = s->next) {
                if (++k > lists[l].want)
                    return FAIL("[class.list] class %u's %s list holds more than the %llu slabs its slabs' counts say",
                                ci, lists[l].name, ULL(lists[l].want));
                if (s->prev != pv || s->cls != ci || s->list != lists[l].list || s->kind != FP_SPAN_SLAB)
                    return FAIL("[class.list] class %u's %s list holds slab 0x%llx of class %u marked as on list %u "
                                "(or its back link is wrong)", ci, lists[l].name, ULL(s->base), s->cls, s->list);
            }
            if (k != lists[l].want)
                return FAIL("[class.list] class %u's %s list holds %llu slabs, its slabs' counts say %llu", ci,
                            lists[l].name, ULL(k), ULL(lists[l].want));
        }
    }
    return FABPOOL_OK;
}

fabpool_status fp_slabs_check(const fp_heap *h, fp_walk *w)
{
    slab_counts n;
    memset(&n, 0, sizeof n);
    uint32_t max_nobj = 0;
    for (unsigned c = 0; c < h->n_slab_classes; c++)
        if (h->classes[c].nobj > max_nobj)
            max_nobj = h->classes[c].nobj;
    w->seen = malloc((size_t)max_nobj + 8);
    if (!w->seen)
        return FP_WALK_HOST_FAIL();
    const fp_span *prev = NULL;
    uint64_t guard = 0;
    for (const fp_span *s = h->spans; s; prev = s, s = s->all_next) {
        if (++guard > (1u << 26))
            return FAIL("[slab.all] the list of every slab does not end");
        if (s->all_prev != prev)
            return FAIL("[slab.all] slab 0x%llx: its back link on the list of every slab is wrong", ULL(s->base));
        fabpool_status st = check_slab(w, h, s, &n);
        if (st != FABPOOL_OK)
            return st;
        w->n_slabs++;
        w->slab_bytes += s->size;
    }
    if (w->tc_found != w->n_tc)
        return FAIL("[tcache.block] thread caches hold %llu blocks of spans that are not slabs of this pool",
                    ULL(w->n_tc - w->tc_found));
    return check_class_lists(h, &n);
}

/* Every page of every arena chunk points at the arena's sentinel, or at the
 * slab that holds it; every page of a slab points at the slab. */
fabpool_status fp_heap_map_check(const fp_heap *h, fp_walk *w)
{
    const fp_pagemap *map = &h->sp->map;
    uint64_t page = 1ull << w->page_shift;
    for (int i = 0; i < FP_NARENAS; i++) {
        const fp_arena *a = &h->arenas[i];
        for (size_t k = 0; k < a->n_chunks; k++)
            for (uint64_t at = a->chunks[k].va; at < a->chunks[k].va + a->chunks[k].size; at += page) {
                const fp_span *m = (const fp_span *)fp_map_get(map, at);
                if (m == a->sentinel)
                    continue;
                if (!(i == FP_ARENA_MEDIUM && m && m->kind == FP_SPAN_SLAB && at >= m->base && at < m->base + m->size))
                    return FAIL("[map.span] the page map sends 0x%llx, in a chunk of %s, to %s%p", ULL(at), a->name,
                                m ? "another span " : "nothing ", (const void *)m);
            }
        w->map_pages += a->mapped_bytes >> w->page_shift;
    }
    for (const fp_span *s = h->spans; s; s = s->all_next)
        for (uint64_t at = s->base; at < s->base + s->size; at += page)
            if ((const fp_span *)fp_map_get(map, at) != s)
                return FAIL("[map.span] the page map sends 0x%llx, in the slab [0x%llx, +%llu), elsewhere", ULL(at),
                            ULL(s->base), ULL(s->size));
    return FABPOOL_OK;
}

void fp_heap_lock_classes(fp_heap *h)
{
    for (unsigned c = 0; c < h->n_slab_classes; c++)
        fp_lock(&h->classes[c].lock);
}

void fp_heap_unlock_classes(fp_heap *h)
{
    for (unsigned c = h->n_slab_classes; c-- > 0;)
        fp_unlock(&h->classes[c].lock);
}
