/* slab.c - slabs of size-class blocks, and large blocks on spans of their
 * own.  Free slabs and spans stay mapped (cached) until a trim. */
#include "slab.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "error.h"
#include "list.h"

static void idle_sub(fp_heap *h, uint64_t n);

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
        idle_sub(h, s->size);
    }
    if (to)
        FP_LIST_PUSH(to, s, next, prev);
    if (want == FP_LIST_EMPTY) {
        c->nempty++;
        atomic_fetch_add(&h->idle_bytes, s->size);
    }
    s->list = (uint8_t)want;
}

/* ------------------------------------------------------------ classes */

void fp_heap_init(fp_heap *h, fp_space *sp, const fabpool_options *o)
{
    h->sp = sp;
    h->cache_limit = o->cache_limit_bytes;
    h->decay_ms = o->decay_ms;
    h->large_slack_percent = o->large_slack_percent;
    /* slab_max is rounded up to a class size (docs/config.md): every size up
     * to the value given comes from slabs, every larger size is a large
     * block, and the allocation path's one comparison with slab_max sends
     * each size to a class that exists.  0 (options set by hand) means no
     * slabs: every size is a large block. */
    uint64_t slab_max = o->slab_max_bytes;
    if (slab_max > FP_SLAB_MAX_LIMIT)
        slab_max = FP_SLAB_MAX_LIMIT;
    h->n_slab_classes = slab_max ? fp_class_of(slab_max) + 1 : 0;
    h->slab_max = slab_max ? fp_class_size(h->n_slab_classes - 1) : 0;
    for (unsigned i = 0; i < FP_NCLASS; i++) {
        fp_class *c = &h->classes[i];
        fp_lock_init(&c->lock, FP_LOCK_CLASS, i, "class");
        c->obj_size = fp_class_size(i);
        if (i < h->n_slab_classes) {
            /* at least one granule and room for four blocks */
            uint64_t want = c->obj_size * 4 > h->sp->gran ? c->obj_size * 4 : h->sp->gran;
            c->slab_size = fp_round_up(want, h->sp->gran);
            c->nobj = (uint32_t)(c->slab_size / c->obj_size);
        }
    }
}

/* Host bytes of a slab's record: the span, its free stack and a free flag
 * per block.  The one formula for its allocation and its free. */
static size_t slab_meta_bytes(uint32_t nobj)
{
    return sizeof(fp_span) + (size_t)nobj * (sizeof(uint32_t) + sizeof(uint8_t));
}

static void span_free_meta(fp_heap *h, fp_span *s)
{
    fp_meta_free(h->sp->meta, s, s->kind == FP_SPAN_SLAB ? slab_meta_bytes(s->nobj) : sizeof *s);
}

/* A span's record: a large piece of [base, base + size), or an empty slab
 * of class cls (placed later).  NULL without host memory. */
static fp_span *span_new(fp_heap *h, uint8_t kind, unsigned cls, uint64_t base, uint64_t size)
{
    uint32_t nobj = kind == FP_SPAN_SLAB ? h->classes[cls].nobj : 0;
    fp_span *s = fp_meta_alloc(h->sp->meta, kind == FP_SPAN_SLAB ? slab_meta_bytes(nobj) : sizeof *s);
    if (!s)
        return NULL;
    s->kind = kind;
    s->base = base;
    s->size = size;
    if (kind != FP_SPAN_SLAB)
        return s;
    s->cls = (uint16_t)cls;
    s->nobj = nobj;
    s->obj_q = (uint32_t)(h->classes[cls].obj_size >> FP_QUANTUM_SHIFT);
    s->magic = ((1ull << 32) + s->obj_q - 1) / s->obj_q;
    s->free_stack = (uint32_t *)(s + 1);
    s->freeflag = (_Atomic uint8_t *)(s->free_stack + s->nobj);
    for (uint32_t i = 0; i < s->nobj; i++) {
        s->free_stack[i] = s->nobj - 1 - i;   /* pop order: low addresses first */
        atomic_store_explicit(&s->freeflag[i], 1, memory_order_relaxed);
    }
    s->nfree = s->nobj;
    return s;
}

/* Unmaps a span that is in no list and frees its address range. */
static fabpool_status span_release(fp_heap *h, fp_span *s)
{
    fp_lock_assert_held(&h->sp->lock);
    fabpool_status st = fp_chunk_unmap(h->sp->ch, s->base, s->size);
    if (st != FABPOOL_OK)
        return st;
    FP_LIST_REMOVE(&h->spans, s, all_next, all_prev);
    fp_map_set(&h->sp->map, s->base, s->size, NULL);
    fp_va_free(&h->sp->va, s->base, s->size);
    span_free_meta(h, s);
    return FABPOOL_OK;
}

/* Address range + chunk for a new span. */
static fabpool_status span_map(fp_heap *h, uint64_t size, uint64_t *va)
{
    fp_lock_assert_held(&h->sp->lock);
    *va = fp_va_alloc(&h->sp->va, size, h->sp->gran);
    if (!*va)
        return fp_error(FABPOOL_ERR_LIMIT,
                        "the pool's reserved address space (%llu bytes) has no free range of %llu bytes left; "
                        "create the pool with a larger reserve (FABPOOL_CONF=reserve:...)",
                        (unsigned long long)h->sp->va.size, (unsigned long long)size);
    fabpool_status st = fp_heap_chunk_map(h, *va, size);
    if (st != FABPOOL_OK)
        fp_va_free(&h->sp->va, *va, size);
    return st;
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

/* A new slab of class cls, mapped, with up to n of its blocks taken into
 * out[] (take_from); returns how many (0 with an error set).  It joins the
 * list of every slab and its class at once, under the pool lock and the
 * class's, so that fabpool_check (which holds both) finds it in both or in
 * neither. */
static unsigned slab_new_take(fp_heap *h, unsigned cls, fp_item *out, unsigned n, int given, fabpool_status *st)
{
    fp_class *c = &h->classes[cls];
    fp_span *s = span_new(h, FP_SPAN_SLAB, cls, 0, c->slab_size);
    if (!s) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the metadata of a slab (%zu bytes)",
                       slab_meta_bytes(c->nobj));
        return 0;
    }
    unsigned k = 0;
    fp_lock(&h->sp->lock);
    uint64_t va = 0;
    *st = span_map(h, s->size, &va);
    if (*st == FABPOOL_OK) {
        s->base = va;
        if (fp_map_set(&h->sp->map, va, s->size, s) != 0) {
            fp_chunk_unmap(h->sp->ch, va, s->size);
            fp_va_free(&h->sp->va, va, s->size);
            *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of a new slab");
        } else {
            fp_lock(&c->lock);
            FP_LIST_PUSH(&h->spans, s, all_next, all_prev);
            c->nslabs++;
            s->list = FP_LIST_NONE;
            k = take_from(s, out, n, given);
            relist(h, c, s);
            fp_unlock(&c->lock);
        }
    }
    fp_unlock(&h->sp->lock);
    if (*st != FABPOOL_OK)
        span_free_meta(h, s);
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

    /* No free block: map a new slab without the class lock (the driver call
     * takes tens of microseconds, and may trim on OOM). */
    return slab_new_take(h, cls, out, n, given, st);
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
    fp_unlock(&c->lock);
}

/* ------------------------------------------------------------ large blocks
 *
 * A large block is its size rounded up to the granularity, carved out of
 * the large heap: pieces of the reservation, each one live block or one free
 * range, mapped by physical chunks (h->lchunks, sorted by address).  A piece
 * may span several chunks and a chunk several pieces; every granule of a
 * piece points to it in the page map, so a free finds its neighbours there
 * and merges with the free ones.  An allocation takes the best fit of the
 * free ranges and splits it.  On a miss it maps only what is missing: it
 * grows the largest free range whose neighbouring address space is free,
 * and before it maps, it returns free chunks that lie wholly inside free
 * ranges (they did not fit), so a miss trades cached memory for the memory
 * it needs instead of adding to it.  A chunk is unmapped only when all of it
 * is free. */

static void piece_free_meta(fp_heap *h, fp_span *s) { fp_meta_free(h->sp->meta, s, sizeof *s); }

static fp_span *piece_new(fp_heap *h, uint64_t base, uint64_t size)
{
    return span_new(h, FP_SPAN_LARGE, 0, base, size);
}

/* Index of the first chunk whose va >= addr. */
static size_t lchunk_lower(const fp_heap *h, uint64_t addr)
{
    return FP_ARRAY_LOWER(h->lchunks, h->n_lchunks, fp_lchunk, va, addr);
}

static int lchunk_add(fp_heap *h, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&h->sp->lock);
    if (FP_ARRAY_RESERVE(h->sp->meta, h->lchunks, h->n_lchunks, h->cap_lchunks, h->n_lchunks + 1, 64) != 0)
        return -1;
    size_t i = lchunk_lower(h, va);
    memmove(&h->lchunks[i + 1], &h->lchunks[i], (h->n_lchunks - i) * sizeof *h->lchunks);
    h->lchunks[i] = (fp_lchunk){va, size};
    h->n_lchunks++;
    return 0;
}

static void lchunk_remove(fp_heap *h, size_t i)
{
    fp_lock_assert_held(&h->sp->lock);
    memmove(&h->lchunks[i], &h->lchunks[i + 1], (h->n_lchunks - i - 1) * sizeof *h->lchunks);
    h->n_lchunks--;
}

/* The large piece at addr, or NULL (slab, buffer window, unmapped). */
static fp_span *piece_at(fp_heap *h, uint64_t addr)
{
    fp_span *s = fp_map_get(&h->sp->map, addr);
    return s && s->kind == FP_SPAN_LARGE ? s : NULL;
}

static void free_add(fp_heap *h, uint64_t n)
{
    h->large_free_bytes += n;
    atomic_fetch_add(&h->idle_bytes, n);
}

static void free_sub(fp_heap *h, uint64_t n)
{
    h->large_free_bytes -= n;
    idle_sub(h, n);
}

/* Unmaps chunks that lie wholly inside free ranges (not held ones) until
 * `goal` bytes went back or none is left; returns the bytes unmapped. */
static uint64_t large_unmap_free(fp_heap *h, uint64_t goal)
{
    fp_lock_assert_held(&h->sp->lock);
    uint64_t done = 0;
    for (size_t i = h->n_lchunks; i-- > 0 && done < goal;) {
        fp_lchunk c = h->lchunks[i];
        fp_span *f = piece_at(h, c.va);
        if (!f || atomic_load_explicit(&f->in_use, memory_order_relaxed) != FP_LARGE_FREE ||
            c.va + c.size > f->base + f->size)
            continue;
        uint64_t lsize = c.va - f->base, rsize = f->base + f->size - (c.va + c.size);
        fp_span *r = NULL;
        if (lsize && rsize && !(r = piece_new(h, c.va + c.size, rsize)))
            break;   /* no host memory to split the range: keep the chunk */
        if (fp_chunk_unmap(h->sp->ch, c.va, c.size) != FABPOOL_OK) {
            if (r)
                piece_free_meta(h, r);
            break;
        }
        fp_map_set(&h->sp->map, c.va, c.size, NULL);
        fp_va_free(&h->sp->va, c.va, c.size);
        lchunk_remove(h, i);
        free_sub(h, c.size);
        done += c.size;
        if (!lsize && !rsize) {
            FP_LIST_REMOVE(&h->large_free, f, next, prev);
            piece_free_meta(h, f);
        } else if (!lsize) {
            f->base = c.va + c.size;
            f->size = rsize;
        } else {
            f->size = lsize;
            if (r) {
                FP_LIST_PUSH(&h->large_free, r, next, prev);
                fp_map_set(&h->sp->map, r->base, r->size, r);   /* granules already have leaves: cannot fail */
            }
        }
    }
    return done;
}

/* The block of n bytes at the end (the high addresses) of free range f.
 * Large pieces grow downwards from the top of the reservation, so what is
 * left of f stays on the side where free address space may lie, and a later
 * miss can grow it there (grow, below) instead of mapping a new range beside
 * a free one that is too small.  On the H200 training trace this took the
 * peak from 1.050x to 1.029x the live peak, with fewer maps (577 against
 * 659), and without any chunk trade from 1.163x to 1.027x (docs/design.md). */
static fp_span *carve(fp_heap *h, fp_span *f, uint64_t n, fabpool_status *st)
{
    fp_lock_assert_held(&h->sp->lock);
    if (f->size == n) {
        FP_LIST_REMOVE(&h->large_free, f, next, prev);
        free_sub(h, n);
        return f;
    }
    fp_span *b = piece_new(h, f->base + f->size - n, n);
    if (!b) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a large block's record");
        return NULL;
    }
    f->size -= n;
    fp_map_set(&h->sp->map, b->base, n, b);   /* granules already have leaves: cannot fail */
    free_sub(h, n);
    return b;
}

/* Whether [start, start + size) is free address space (not taken). */
static int va_free_at(fp_heap *h, uint64_t start, uint64_t size)
{
    if (start < h->sp->va.base || start + size > h->sp->va.base + h->sp->va.size || start + size < start)
        return 0;
    if (fp_va_take(&h->sp->va, start, size) != 0)
        return 0;
    fp_va_free(&h->sp->va, start, size);
    return 1;
}

/* The grid of large chunks: FP_LARGE_CHUNK_GRANULES granules (32 MiB on a
 * 2 MiB granularity).  Smaller chunks waste less (a chunk that holds the end
 * of a live block and free memory cannot be unmapped) but cost a driver call
 * each: measured on the sim's seeded mix (test_sizeclass large), mapped peak
 * over live peak was 1.000x with 2 MiB chunks (3,400 maps), 1.01-1.03x with
 * 16 MiB (470), 1.02-1.04x with 32 MiB (240), 1.03-1.08x with 64 MiB (140) and
 * up to 1.31x with one chunk per miss (35), when carve took a range's low
 * end; with the high end, 32 MiB gives 1.025-1.047x (180-272). */
#define FP_LARGE_CHUNK_GRANULES 16u

static uint64_t large_chunk_cap(fp_heap *h) { return h->sp->gran * FP_LARGE_CHUNK_GRANULES; }

/* Unmaps the chunks of [va, va + size) (all mapped by map_chunks). */
static void unmap_chunks(fp_heap *h, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&h->sp->lock);
    size_t i = lchunk_lower(h, va);
    while (i < h->n_lchunks && h->lchunks[i].va < va + size) {
        fp_chunk_unmap(h->sp->ch, h->lchunks[i].va, h->lchunks[i].size);
        lchunk_remove(h, i);
    }
}

/* Maps [va, va + size) as chunks on a grid of the large chunk size, so that
 * a chunk is at most that and the chunks of neighbouring growths tile the
 * address space alike.  All or nothing. */
static fabpool_status map_chunks(fp_heap *h, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&h->sp->lock);
    uint64_t cap = large_chunk_cap(h), at = va, end = va + size;
    while (at < end) {
        uint64_t next = (at - h->sp->va.base) / cap * cap + cap + h->sp->va.base;
        uint64_t n = (next < end ? next : end) - at;
        fabpool_status st = fp_heap_chunk_map(h, at, n);
        if (st == FABPOOL_OK && lchunk_add(h, at, n) != 0) {
            fp_chunk_unmap(h->sp->ch, at, n);
            st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of large chunks");
        }
        if (st != FABPOOL_OK) {
            unmap_chunks(h, va, at - va);
            return st;
        }
        at += n;
    }
    return FABPOOL_OK;
}

/* A miss: maps what a block of n bytes needs. */
static fp_span *grow(fp_heap *h, uint64_t n, fabpool_status *st)
{
    fp_lock_assert_held(&h->sp->lock);
    /* the largest free range that can grow into free address space beside it */
    fp_span *g = NULL;
    int right = 0;
    for (fp_span *f = h->large_free; f; f = f->next) {
        if (g && f->size <= g->size)
            continue;
        uint64_t miss = n - f->size;
        if (va_free_at(h, f->base + f->size, miss))
            g = f, right = 1;
        else if (f->base - h->sp->va.base >= miss && va_free_at(h, f->base - miss, miss))
            g = f, right = 0;
    }
    uint64_t miss = g ? n - g->size : n;
    uint64_t va = g ? (right ? g->base + g->size : g->base - miss) : fp_va_alloc_top(&h->sp->va, n, h->sp->gran);
    if (g ? fp_va_take(&h->sp->va, va, miss) != 0 : !va) {
        *st = fp_error(FABPOOL_ERR_LIMIT,
                       "the pool's reserved address space (%llu bytes) has no free range of %llu bytes left; "
                       "create the pool with a larger reserve (FABPOOL_CONF=reserve:...)",
                       (unsigned long long)h->sp->va.size, (unsigned long long)n);
        return NULL;
    }
    fp_span *b = g ? g : piece_new(h, va, n);
    if (!b) {
        fp_va_free(&h->sp->va, va, miss);
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a large block's record");
        return NULL;
    }
    if (g) {
        /* held: neither the trade below nor an OOM trim unmaps it */
        FP_LIST_REMOVE(&h->large_free, g, next, prev);
        atomic_store_explicit(&g->in_use, FP_LARGE_HELD, memory_order_relaxed);
    }
    /* Trade free chunks that did not fit for the memory needed, but leave
     * large_slack of the live large bytes free and mapped: a workload whose
     * shapes vary (a training loop's sequence lengths) needs that much room to
     * find fits, and trading it away makes every later step miss and map
     * again.  On the H200 training trace (perf/traces/train-h200.trace.gz),
     * the second half of the steps mapped 33 chunks with no slack, 38 with
     * 1 %, none with 2 to 5 %, at peaks of 1.027x-1.033x the live peak (no
     * trade at all: 1.027x); the default, 4 %, is two steps past the knee.
     * (Before carve took a range's high end: 213, 347 and 285 chunks with 0, 1
     * and 2 %, and 1.16x without a trade.)  Decay and the OOM retry still
     * return the slack when it stays unused or memory runs short. */
    uint64_t live = atomic_load_explicit(&h->large_in_use_bytes, memory_order_relaxed) + n;
    uint64_t slack = live / 100 * h->large_slack_percent + live % 100 * h->large_slack_percent / 100;
    uint64_t idle = h->large_free_bytes - (g ? g->size : 0); /* g is about to become the block */
    if (idle > slack)
        large_unmap_free(h, idle - slack < miss ? idle - slack : miss);
    *st = map_chunks(h, va, miss);
    if (*st == FABPOOL_OK && fp_map_set(&h->sp->map, va, miss, b) != 0) {
        unmap_chunks(h, va, miss);
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of a large block");
    }
    if (*st != FABPOOL_OK) {
        fp_va_free(&h->sp->va, va, miss);
        if (g) {
            atomic_store_explicit(&g->in_use, FP_LARGE_FREE, memory_order_relaxed);
            FP_LIST_PUSH(&h->large_free, g, next, prev);
        } else {
            piece_free_meta(h, b);
        }
        return NULL;
    }
    if (g) {
        free_sub(h, g->size);
        if (!right)
            g->base = va;
        g->size = n;
    }
    return b;
}

fabpool_status fp_large_alloc(fp_heap *h, uint64_t size, void **out)
{
    if (size > h->sp->va.size)
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_alloc of %llu bytes: larger than the pool's reserved address "
                        "space (%llu bytes)", (unsigned long long)size, (unsigned long long)h->sp->va.size);
    /* the size rounded to the granularity, no class: at most 1.25x from 8 MiB on */
    uint64_t n = fp_round_up(size, h->sp->gran);
    fabpool_status st = fp_chunk_fits_device(h->sp->ch, n, "fabpool_alloc: a block of");
    if (st != FABPOOL_OK)
        return st;
    fp_lock(&h->sp->lock);
    fp_span *best = NULL;
    for (fp_span *f = h->large_free; f; f = f->next)
        if (f->size >= n && (!best || f->size < best->size)) {
            best = f;
            if (f->size == n)
                break;
        }
    fp_span *b = best ? carve(h, best, n, &st) : grow(h, n, &st);
    if (b) {
        atomic_store_explicit(&b->in_use, FP_LARGE_LIVE, memory_order_relaxed);
        FP_LIST_PUSH(&h->large_live, b, next, prev);
        atomic_fetch_add(&h->large_in_use_bytes, n);
        atomic_fetch_add(&h->large_blocks, 1);
        unsigned bucket = fp_class_of(n);
        atomic_fetch_add(&h->large_allocs[bucket < FP_NCLASS ? bucket : FP_NCLASS - 1], 1);
        *out = (void *)(uintptr_t)b->base;
    }
    fp_unlock(&h->sp->lock);
    fp_heap_trim_policy(h);
    return st;
}

/* The live large block at addr, or NULL with a message (fn names the call). */
static fp_span *large_live_at(fp_heap *h, uint64_t addr, const char *fn, fabpool_status *st)
{
    fp_lock_assert_held(&h->sp->lock);
    fp_span *b = piece_at(h, addr);
    uint32_t state = b ? atomic_load_explicit(&b->in_use, memory_order_relaxed) : FP_LARGE_FREE;
    if (b && state == FP_LARGE_LIVE && addr == b->base)
        return b;
    if (b && (state == FP_LARGE_LIVE || (state == FP_LARGE_PENDING && addr != b->base)))
        *st = fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): an interior pointer, %llu bytes into a block of %llu bytes at "
                       "0x%llx; free the pointer fabpool_alloc returned", fn, (void *)(uintptr_t)addr,
                       (unsigned long long)(addr - b->base), (unsigned long long)b->size,
                       (unsigned long long)b->base);
    else if (b && state == FP_LARGE_PENDING)
        *st = fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this block was already freed on a stream and waits there "
                       "for the stream's work (a double free)", fn, (void *)(uintptr_t)addr);
    else if (b)
        *st = fp_error(FABPOOL_ERR_DOUBLE_FREE, "%s(%p): this address is in free large memory (a double free, or a "
                       "pointer this pool never gave out)", fn, (void *)(uintptr_t)addr);
    else
        *st = fp_error(FABPOOL_ERR_NOT_FOUND, "%s(%p): this pool did not give out that pointer, or it was freed and "
                       "its memory returned to the driver", fn, (void *)(uintptr_t)addr);
    return NULL;
}

fabpool_status fp_large_check(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable)
{
    fabpool_status st = FABPOOL_OK;
    fp_lock(&h->sp->lock);
    fp_span *b = large_live_at(h, addr, fn, &st);
    if (b)
        *usable = b->size;
    fp_unlock(&h->sp->lock);
    return st;
}

fabpool_status fp_large_pend(fp_heap *h, uint64_t addr, const char *fn, uint64_t *usable)
{
    fabpool_status st = FABPOOL_OK;
    fp_lock(&h->sp->lock);
    fp_span *b = large_live_at(h, addr, fn, &st);
    if (b) {
        atomic_store_explicit(&b->in_use, FP_LARGE_PENDING, memory_order_relaxed);
        *usable = b->size;
    }
    fp_unlock(&h->sp->lock);
    return st;
}

fabpool_status fp_large_free(fp_heap *h, uint64_t addr, const char *fn)
{
    /* the piece is looked up under the lock: pieces merge and split under it */
    fabpool_status st = FABPOOL_OK;
    fp_lock(&h->sp->lock);
    fp_span *b = large_live_at(h, addr, fn, &st);
    if (!b) {
        fp_unlock(&h->sp->lock);
        return st;
    }
    atomic_store_explicit(&b->in_use, FP_LARGE_FREE, memory_order_relaxed);
    FP_LIST_REMOVE(&h->large_live, b, next, prev);
    atomic_fetch_sub(&h->large_in_use_bytes, b->size);
    atomic_fetch_sub(&h->large_blocks, 1);
    free_add(h, b->size);
    /* merge with free neighbours (held ones are being grown: left alone) */
    fp_span *l = b->base > h->sp->va.base ? piece_at(h, b->base - 1) : NULL;
    if (l && atomic_load_explicit(&l->in_use, memory_order_relaxed) == FP_LARGE_FREE) {
        l->size += b->size;
        fp_map_set(&h->sp->map, b->base, b->size, l);
        piece_free_meta(h, b);
        b = l;
    } else {
        FP_LIST_PUSH(&h->large_free, b, next, prev);
    }
    fp_span *r = piece_at(h, b->base + b->size);
    if (r && atomic_load_explicit(&r->in_use, memory_order_relaxed) == FP_LARGE_FREE) {
        FP_LIST_REMOVE(&h->large_free, r, next, prev);
        fp_map_set(&h->sp->map, r->base, r->size, b);
        b->size += r->size;
        piece_free_meta(h, r);
    }
    fp_unlock(&h->sp->lock);
    fp_heap_trim_policy(h);
    return FABPOOL_OK;
}

static void large_destroy(fp_heap *h)
{
    for (size_t i = 0; i < h->n_lchunks; i++) {
        fp_chunk_unmap(h->sp->ch, h->lchunks[i].va, h->lchunks[i].size);
        fp_map_set(&h->sp->map, h->lchunks[i].va, h->lchunks[i].size, NULL);
    }
    FP_ARRAY_FREE(h->sp->meta, h->lchunks, h->cap_lchunks);
    h->n_lchunks = 0;
    fp_span **lists[] = {&h->large_live, &h->large_free};
    for (int k = 0; k < 2; k++)
        while (*lists[k]) {
            fp_span *s = *lists[k];
            FP_LIST_REMOVE(lists[k], s, next, prev);
            piece_free_meta(h, s);
        }
}

/* ------------------------------------------------------------ trim */

/* idle_bytes went down by n: the decay's low-water mark follows. */
static void idle_sub(fp_heap *h, uint64_t n)
{
    uint64_t now = atomic_fetch_sub(&h->idle_bytes, n) - n;
    uint64_t low = atomic_load_explicit(&h->idle_low, memory_order_relaxed);
    while (now < low &&
           !atomic_compare_exchange_weak_explicit(&h->idle_low, &low, now, memory_order_relaxed, memory_order_relaxed))
        ;
}

void fp_heap_trim_locked(fp_heap *h, uint64_t keep)
{
    fp_lock_assert_held(&h->sp->lock);
    /* large chunks first: one driver call frees the most */
    uint64_t idle = atomic_load(&h->idle_bytes);
    if (idle > keep)
        large_unmap_free(h, idle - keep);
    for (unsigned cls = 0; cls < h->n_slab_classes && atomic_load(&h->idle_bytes) > keep; cls++) {
        fp_class *c = &h->classes[cls];
        for (;;) {
            fp_lock(&c->lock);
            fp_span *s = c->empty;
            if (!s || atomic_load(&h->idle_bytes) <= keep) {
                fp_unlock(&c->lock);
                break;
            }
            FP_LIST_REMOVE(&c->empty, s, next, prev);
            s->list = FP_LIST_NONE;
            c->nempty--;
            c->nslabs--;
            idle_sub(h, s->size);
            fp_unlock(&c->lock);
            if (span_release(h, s) != FABPOOL_OK) {
                fp_lock(&c->lock);
                c->nslabs++;
                relist(h, c, s);
                fp_unlock(&c->lock);
                return;
            }
        }
    }
}

/* ------------------------------------------------------------ out of memory */

static void human(char *buf, size_t n, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
}

fabpool_status fp_heap_chunk_create(fp_heap *h, uint64_t size, CUmemGenericAllocationHandle *out)
{
    fp_lock_assert_held(&h->sp->lock);
    fabpool_status st = fp_chunk_create(h->sp->ch, size, out);
    if (st != FABPOOL_ERR_OUT_OF_MEMORY)
        return st;
    /* what the heap caches goes back to the driver, then one more try */
    uint64_t idle = atomic_load(&h->idle_bytes);
    if (idle) {
        fp_heap_trim_locked(h, 0);
        atomic_fetch_add(&h->oom_retries, 1);
        st = fp_chunk_create(h->sp->ch, size, out);
    }
    if (st == FABPOOL_ERR_OUT_OF_MEMORY) {
        char a[32], m[32], c[32];
        human(a, sizeof a, size);
        human(m, sizeof m, atomic_load(&h->sp->ch->mapped_bytes));
        human(c, sizeof c, idle);
        return fp_error(FABPOOL_ERR_OUT_OF_MEMORY,
                        "device %d is out of memory: cuMemCreate of a %s chunk failed with "
                        "CUDA_ERROR_OUT_OF_MEMORY; this pool maps %s, of which %s were cached and %s "
                        "returned to the driver before one more try. Free or shrink buffers, or lower "
                        "other users of the device",
                        (int)h->sp->ch->dev, a, m, c, idle ? "were" : "none could be");
    }
    return st;
}

void fp_heap_count_oom_retry(fp_heap *h) { atomic_fetch_add(&h->oom_retries, 1); }

fabpool_status fp_heap_chunk_map(fp_heap *h, uint64_t va, uint64_t size)
{
    CUmemGenericAllocationHandle hdl = 0;
    fabpool_status st = fp_heap_chunk_create(h, size, &hdl);
    if (st != FABPOOL_OK)
        return st;
    return fp_chunk_map_handle(h->sp->ch, va, size, hdl, "a chunk");
}

/* The decay's clock: the coarse monotonic clock (a few ms of resolution,
 * read from the vDSO without a syscall) is plenty for periods of tens of ms
 * and up, and costs a few ns on the slow paths that read it. */
static uint64_t now_ns(void)
{
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fp_heap_trim_policy(fp_heap *h)
{
    uint64_t idle = atomic_load_explicit(&h->idle_bytes, memory_order_relaxed);
    if (idle == 0)
        return;
    uint64_t limit = h->cache_limit, decay = h->decay_ms;
    if (decay == 0 || idle > limit) {
        fp_lock(&h->sp->lock);
        fp_heap_trim_locked(h, decay == 0 ? 0 : limit);
        fp_unlock(&h->sp->lock);
        if (decay == 0)
            return;
    }
    /* decay: what stayed idle through a whole period goes back to the driver */
    uint64_t t = now_ns(), epoch = atomic_load_explicit(&h->decay_epoch_ns, memory_order_relaxed);
    if (t - epoch < decay * 1000000ull ||
        !atomic_compare_exchange_strong_explicit(&h->decay_epoch_ns, &epoch, t, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    fp_lock(&h->sp->lock);
    uint64_t low = atomic_load(&h->idle_low);
    idle = atomic_load(&h->idle_bytes);
    if (low)
        fp_heap_trim_locked(h, idle > low ? idle - low : 0);
    atomic_store(&h->idle_low, atomic_load(&h->idle_bytes));
    fp_unlock(&h->sp->lock);
}

void fp_heap_destroy(fp_heap *h)
{
    if (!h->sp)
        return; /* never set up */
    while (h->spans) {
        fp_span *s = h->spans;
        if (span_release(h, s) != FABPOOL_OK) {
            /* the driver refused the unmap: drop the metadata anyway, the
             * reservation is freed next and the message says what failed */
            FP_LIST_REMOVE(&h->spans, s, all_next, all_prev);
            span_free_meta(h, s);
        }
    }
    large_destroy(h);
    for (unsigned cls = 0; cls < FP_NCLASS; cls++) {
        fp_class *c = &h->classes[cls];
        fp_lock_destroy(&c->lock);
    }
}
