/* slab.c - slabs of size-class blocks, and large blocks on spans of their
 * own.  Free slabs and spans stay mapped (cached) until a trim. */
#include <string.h>
#include <time.h>

#include "error.h"
#include "pool.h"

/* ------------------------------------------------------------ lists */

static void list_push(fp_span **head, fp_span *s)
{
    s->prev = NULL;
    s->next = *head;
    if (*head)
        (*head)->prev = s;
    *head = s;
}

static void list_remove(fp_span **head, fp_span *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        *head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->next = s->prev = NULL;
}

static fp_span **class_list(fp_class *c, int list)
{
    return list == FP_LIST_PARTIAL ? &c->partial : list == FP_LIST_EMPTY ? &c->empty : NULL;
}

/* Moves slab s to the list its free count says. */
static void relist(struct fabpool *p, fp_class *c, fp_span *s)
{
    fp_lock_assert_held(&c->lock);
    int want = s->nfree == 0 ? FP_LIST_FULL : s->nfree == s->nobj ? FP_LIST_EMPTY : FP_LIST_PARTIAL;
    if (want == s->list)
        return;
    fp_span **from = class_list(c, s->list), **to = class_list(c, want);
    if (from)
        list_remove(from, s);
    if (s->list == FP_LIST_EMPTY) {
        c->nempty--;
        fp_idle_sub(p, s->size);
    }
    if (to)
        list_push(to, s);
    if (want == FP_LIST_EMPTY) {
        c->nempty++;
        atomic_fetch_add(&p->idle_bytes, s->size);
    }
    s->list = (uint8_t)want;
}

/* ------------------------------------------------------------ classes */

void fp_classes_init(struct fabpool *p)
{
    /* slab_max is rounded up to a class size (docs/config.md): every size up
     * to the value given comes from slabs, every larger size is a large
     * block, and the allocation path's one comparison with slab_max sends
     * each size to a class that exists.  0 (options set by hand) means no
     * slabs: every size is a large block. */
    uint64_t slab_max = p->opt.slab_max_bytes;
    if (slab_max > FP_SLAB_MAX_LIMIT)
        slab_max = FP_SLAB_MAX_LIMIT;
    p->n_slab_classes = slab_max ? fp_class_of(slab_max) + 1 : 0;
    p->opt.slab_max_bytes = slab_max ? fp_class_size(p->n_slab_classes - 1) : 0;
    for (unsigned i = 0; i < FP_NCLASS; i++) {
        fp_class *c = &p->classes[i];
        c->obj_size = fp_class_size(i);
        if (i < p->n_slab_classes) {
            /* at least one granule and room for four blocks */
            uint64_t want = c->obj_size * 4 > p->gran ? c->obj_size * 4 : p->gran;
            c->slab_size = fp_round_up(want, p->gran);
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

static void span_free_meta(struct fabpool *p, fp_span *s)
{
    fp_meta_free(&p->meta, s, s->kind == FP_SPAN_SLAB ? slab_meta_bytes(s->nobj) : sizeof *s);
}

static void all_add(struct fabpool *p, fp_span *s)
{
    s->all_prev = NULL;
    s->all_next = p->spans;
    if (p->spans)
        p->spans->all_prev = s;
    p->spans = s;
}

static void all_remove(struct fabpool *p, fp_span *s)
{
    if (s->all_prev)
        s->all_prev->all_next = s->all_next;
    else
        p->spans = s->all_next;
    if (s->all_next)
        s->all_next->all_prev = s->all_prev;
}

/* Unmaps a span that is in no list and frees its address range. */
static fabpool_status span_release(struct fabpool *p, fp_span *s)
{
    fp_lock_assert_held(&p->lock);
    fabpool_status st = fp_chunk_unmap(p, s->base, s->size);
    if (st != FABPOOL_OK)
        return st;
    all_remove(p, s);
    fp_map_set(p, s->base, s->size, NULL);
    fp_va_free(&p->va, s->base, s->size);
    span_free_meta(p, s);
    return FABPOOL_OK;
}

/* Address range + chunk for a new span. */
static fabpool_status span_map(struct fabpool *p, uint64_t size, uint64_t *va)
{
    fp_lock_assert_held(&p->lock);
    *va = fp_va_alloc(&p->va, size, p->gran);
    if (!*va)
        return fp_error(FABPOOL_ERR_LIMIT,
                        "the pool's reserved address space (%llu bytes) has no free range of %llu bytes left; "
                        "create the pool with a larger reserve (FABPOOL_CONF=reserve:...)",
                        (unsigned long long)p->va_size, (unsigned long long)size);
    fabpool_status st = fp_chunk_map(p, *va, size);
    if (st != FABPOOL_OK)
        fp_va_free(&p->va, *va, size);
    return st;
}

static fp_span *slab_new(struct fabpool *p, unsigned cls, fabpool_status *st)
{
    fp_class *c = &p->classes[cls];
    size_t bytes = slab_meta_bytes(c->nobj);
    fp_span *s = fp_meta_alloc(&p->meta, bytes);
    if (!s) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the metadata of a slab (%zu bytes)", bytes);
        return NULL;
    }
    s->kind = FP_SPAN_SLAB;
    s->cls = (uint16_t)cls;
    s->size = c->slab_size;
    s->nobj = c->nobj;
    s->obj_q = (uint32_t)(c->obj_size >> FP_QUANTUM_SHIFT);
    s->magic = ((1ull << 32) + s->obj_q - 1) / s->obj_q;
    s->free_stack = (uint32_t *)(s + 1);
    s->freeflag = (_Atomic uint8_t *)(s->free_stack + s->nobj);
    for (uint32_t i = 0; i < s->nobj; i++) {
        s->free_stack[i] = s->nobj - 1 - i;   /* pop order: low addresses first */
        atomic_store_explicit(&s->freeflag[i], 1, memory_order_relaxed);
    }
    s->nfree = s->nobj;

    fp_lock(&p->lock);
    uint64_t va = 0;
    *st = span_map(p, s->size, &va);
    if (*st == FABPOOL_OK) {
        s->base = va;
        if (fp_map_set(p, va, s->size, s) != 0) {
            fp_chunk_unmap(p, va, s->size);
            fp_va_free(&p->va, va, s->size);
            *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of a new slab");
        } else {
            all_add(p, s);
        }
    }
    fp_unlock(&p->lock);
    if (*st != FABPOOL_OK) {
        span_free_meta(p, s);
        return NULL;
    }
    return s;
}

static unsigned take_from(fp_span *s, fp_item *out, unsigned n)
{
    unsigned k = 0;
    uint64_t obj = (uint64_t)s->obj_q << FP_QUANTUM_SHIFT;
    while (k < n && s->nfree) {
        uint32_t i = s->free_stack[--s->nfree];
        out[k].ptr = s->base + (uint64_t)i * obj;
        out[k].span = s;
        k++;
    }
    return k;
}

unsigned fp_class_take(struct fabpool *p, unsigned cls, fp_item *out, unsigned n, fabpool_status *st)
{
    fp_class *c = &p->classes[cls];
    unsigned k = 0;
    fp_lock(&c->lock);
    while (k < n) {
        fp_span *s = c->partial ? c->partial : c->empty;
        if (!s)
            break;
        k += take_from(s, out + k, n - k);
        relist(p, c, s);
    }
    fp_unlock(&c->lock);
    if (k)
        return k;

    /* No free block: map a new slab without the class lock (the driver call
     * takes tens of microseconds, and may trim on OOM). */
    fp_span *s = slab_new(p, cls, st);
    if (!s)
        return 0;
    fp_lock(&c->lock);
    c->nslabs++;
    s->list = FP_LIST_NONE;
    k = take_from(s, out, n);
    relist(p, c, s);
    fp_unlock(&c->lock);
    return k;
}

void fp_class_give(struct fabpool *p, unsigned cls, const fp_item *items, unsigned n)
{
    fp_class *c = &p->classes[cls];
    uint64_t obj = c->obj_size;
    fp_lock(&c->lock);
    for (unsigned k = 0; k < n; k++) {
        fp_span *s = items[k].span;
        s->free_stack[s->nfree++] = (uint32_t)((items[k].ptr - s->base) / obj);
        relist(p, c, s);
    }
    fp_unlock(&c->lock);
}

/* ------------------------------------------------------------ large blocks
 *
 * A large block is its size rounded up to the granularity, carved out of
 * the large heap: pieces of the reservation, each one live block or one free
 * range, mapped by physical chunks (p->lchunks, sorted by address).  A piece
 * may span several chunks and a chunk several pieces; every granule of a
 * piece points to it in the page map, so a free finds its neighbours there
 * and merges with the free ones.  An allocation takes the best fit of the
 * free ranges and splits it.  On a miss it maps only what is missing: it
 * grows the largest free range whose neighbouring address space is free,
 * and before it maps, it returns free chunks that lie wholly inside free
 * ranges (they did not fit), so a miss trades cached memory for the memory
 * it needs instead of adding to it.  A chunk is unmapped only when all of it
 * is free. */

static void piece_free_meta(struct fabpool *p, fp_span *s) { fp_meta_free(&p->meta, s, sizeof *s); }

static fp_span *piece_new(struct fabpool *p, uint64_t base, uint64_t size)
{
    fp_span *s = fp_meta_alloc(&p->meta, sizeof *s);
    if (s) {
        s->kind = FP_SPAN_LARGE;
        s->base = base;
        s->size = size;
    }
    return s;
}

/* Index of the first chunk whose va >= addr. */
static size_t lchunk_lower(const struct fabpool *p, uint64_t addr)
{
    size_t lo = 0, hi = p->n_lchunks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->lchunks[mid].va < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int lchunk_add(struct fabpool *p, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    if (p->n_lchunks == p->cap_lchunks) {
        size_t cap = p->cap_lchunks ? p->cap_lchunks * 2 : 64;
        fp_lchunk *n = fp_meta_alloc(&p->meta, cap * sizeof *n);
        if (!n)
            return -1;
        if (p->n_lchunks)
            memcpy(n, p->lchunks, p->n_lchunks * sizeof *n);
        fp_meta_free(&p->meta, p->lchunks, p->cap_lchunks * sizeof *n);
        p->lchunks = n;
        p->cap_lchunks = cap;
    }
    size_t i = lchunk_lower(p, va);
    memmove(&p->lchunks[i + 1], &p->lchunks[i], (p->n_lchunks - i) * sizeof *p->lchunks);
    p->lchunks[i] = (fp_lchunk){va, size};
    p->n_lchunks++;
    return 0;
}

static void lchunk_remove(struct fabpool *p, size_t i)
{
    fp_lock_assert_held(&p->lock);
    memmove(&p->lchunks[i], &p->lchunks[i + 1], (p->n_lchunks - i - 1) * sizeof *p->lchunks);
    p->n_lchunks--;
}

/* The large piece at addr, or NULL (slab, buffer window, unmapped). */
static fp_span *piece_at(struct fabpool *p, uint64_t addr)
{
    fp_span *s = fp_map_get(p, addr);
    return s && s->kind == FP_SPAN_LARGE ? s : NULL;
}

static void free_add(struct fabpool *p, uint64_t n)
{
    p->large_free_bytes += n;
    atomic_fetch_add(&p->idle_bytes, n);
}

static void free_sub(struct fabpool *p, uint64_t n)
{
    p->large_free_bytes -= n;
    fp_idle_sub(p, n);
}

/* Unmaps chunks that lie wholly inside free ranges (not held ones) until
 * `goal` bytes went back or none is left; returns the bytes unmapped. */
static uint64_t large_unmap_free(struct fabpool *p, uint64_t goal)
{
    fp_lock_assert_held(&p->lock);
    uint64_t done = 0;
    for (size_t i = p->n_lchunks; i-- > 0 && done < goal;) {
        fp_lchunk c = p->lchunks[i];
        fp_span *f = piece_at(p, c.va);
        if (!f || atomic_load_explicit(&f->in_use, memory_order_relaxed) != FP_LARGE_FREE ||
            c.va + c.size > f->base + f->size)
            continue;
        uint64_t lsize = c.va - f->base, rsize = f->base + f->size - (c.va + c.size);
        fp_span *r = NULL;
        if (lsize && rsize && !(r = piece_new(p, c.va + c.size, rsize)))
            break;   /* no host memory to split the range: keep the chunk */
        if (fp_chunk_unmap(p, c.va, c.size) != FABPOOL_OK) {
            if (r)
                piece_free_meta(p, r);
            break;
        }
        fp_map_set(p, c.va, c.size, NULL);
        fp_va_free(&p->va, c.va, c.size);
        lchunk_remove(p, i);
        free_sub(p, c.size);
        done += c.size;
        if (!lsize && !rsize) {
            list_remove(&p->large_free, f);
            piece_free_meta(p, f);
        } else if (!lsize) {
            f->base = c.va + c.size;
            f->size = rsize;
        } else {
            f->size = lsize;
            if (r) {
                list_push(&p->large_free, r);
                fp_map_set(p, r->base, r->size, r);   /* granules already have leaves: cannot fail */
            }
        }
    }
    return done;
}

/* The block of n bytes at the start of free range f. */
static fp_span *carve(struct fabpool *p, fp_span *f, uint64_t n, fabpool_status *st)
{
    fp_lock_assert_held(&p->lock);
    if (f->size == n) {
        list_remove(&p->large_free, f);
        free_sub(p, n);
        return f;
    }
    fp_span *b = piece_new(p, f->base, n);
    if (!b) {
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a large block's record");
        return NULL;
    }
    f->base += n;
    f->size -= n;
    fp_map_set(p, b->base, n, b);   /* granules already have leaves: cannot fail */
    free_sub(p, n);
    return b;
}

/* Whether [start, start + size) is free address space (not taken). */
static int va_free_at(struct fabpool *p, uint64_t start, uint64_t size)
{
    if (start < p->va_base || start + size > p->va_base + p->va_size || start + size < start)
        return 0;
    if (fp_va_take(&p->va, start, size) != 0)
        return 0;
    fp_va_free(&p->va, start, size);
    return 1;
}

/* The grid of large chunks: FP_LARGE_CHUNK_GRANULES granules (32 MiB on a
 * 2 MiB granularity).  Smaller chunks waste less (a chunk that holds the end
 * of a live block and free memory cannot be unmapped) but cost a driver call
 * each: measured on the sim's seeded mix (test_sizeclass large), mapped peak
 * over live peak was 1.000x with 2 MiB chunks (3,400 maps), 1.01-1.03x with
 * 16 MiB (470), 1.02-1.04x with 32 MiB (240), 1.03-1.08x with 64 MiB (140) and
 * up to 1.31x with one chunk per miss (35). */
#define FP_LARGE_CHUNK_GRANULES 16u

static uint64_t large_chunk_cap(struct fabpool *p) { return p->gran * FP_LARGE_CHUNK_GRANULES; }

/* Unmaps the chunks of [va, va + size) (all mapped by map_chunks). */
static void unmap_chunks(struct fabpool *p, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    size_t i = lchunk_lower(p, va);
    while (i < p->n_lchunks && p->lchunks[i].va < va + size) {
        fp_chunk_unmap(p, p->lchunks[i].va, p->lchunks[i].size);
        lchunk_remove(p, i);
    }
}

/* Maps [va, va + size) as chunks on a grid of the large chunk size, so that
 * a chunk is at most that and the chunks of neighbouring growths tile the
 * address space alike.  All or nothing. */
static fabpool_status map_chunks(struct fabpool *p, uint64_t va, uint64_t size)
{
    fp_lock_assert_held(&p->lock);
    uint64_t cap = large_chunk_cap(p), at = va, end = va + size;
    while (at < end) {
        uint64_t next = (at - p->va_base) / cap * cap + cap + p->va_base;
        uint64_t n = (next < end ? next : end) - at;
        fabpool_status st = fp_chunk_map(p, at, n);
        if (st == FABPOOL_OK && lchunk_add(p, at, n) != 0) {
            fp_chunk_unmap(p, at, n);
            st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the list of large chunks");
        }
        if (st != FABPOOL_OK) {
            unmap_chunks(p, va, at - va);
            return st;
        }
        at += n;
    }
    return FABPOOL_OK;
}

/* A miss: maps what a block of n bytes needs. */
static fp_span *grow(struct fabpool *p, uint64_t n, fabpool_status *st)
{
    fp_lock_assert_held(&p->lock);
    /* the largest free range that can grow into free address space beside it */
    fp_span *g = NULL;
    int right = 0;
    for (fp_span *f = p->large_free; f; f = f->next) {
        if (g && f->size <= g->size)
            continue;
        uint64_t miss = n - f->size;
        if (va_free_at(p, f->base + f->size, miss))
            g = f, right = 1;
        else if (f->base - p->va_base >= miss && va_free_at(p, f->base - miss, miss))
            g = f, right = 0;
    }
    uint64_t miss = g ? n - g->size : n;
    uint64_t va = g ? (right ? g->base + g->size : g->base - miss) : fp_va_alloc_top(&p->va, n, p->gran);
    if (g ? fp_va_take(&p->va, va, miss) != 0 : !va) {
        *st = fp_error(FABPOOL_ERR_LIMIT,
                       "the pool's reserved address space (%llu bytes) has no free range of %llu bytes left; "
                       "create the pool with a larger reserve (FABPOOL_CONF=reserve:...)",
                       (unsigned long long)p->va_size, (unsigned long long)n);
        return NULL;
    }
    fp_span *b = g ? g : piece_new(p, va, n);
    if (!b) {
        fp_va_free(&p->va, va, miss);
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a large block's record");
        return NULL;
    }
    if (g) {
        /* held: neither the trade below nor an OOM trim unmaps it */
        list_remove(&p->large_free, g);
        atomic_store_explicit(&g->in_use, FP_LARGE_HELD, memory_order_relaxed);
    }
    /* Trade free chunks that did not fit for the memory needed, but leave
     * large_slack of the live large bytes free and mapped: a workload whose
     * shapes vary (a training loop's sequence lengths) needs that much room to
     * find fits, and trading it away makes every later step miss and map
     * again.  On the H200 training trace (perf/traces/train-h200.trace.gz),
     * the second half of the steps mapped 213 chunks with no slack, 347 with
     * 1 %, 285 with 2 %, none with 3, 4 or 5 %, at a peak of 1.04x the live
     * peak up to 3 %, 1.05x at 4 and 5 % (no trade at all: 1.16x); the
     * default, 4 %, is one step past the knee.  Decay and the OOM retry still
     * return the slack when it stays unused or memory runs short. */
    uint64_t live = atomic_load_explicit(&p->large_in_use_bytes, memory_order_relaxed) + n;
    uint64_t slack = live / 100 * p->opt.large_slack_percent + live % 100 * p->opt.large_slack_percent / 100;
    uint64_t idle = p->large_free_bytes - (g ? g->size : 0); /* g is about to become the block */
    if (idle > slack)
        large_unmap_free(p, idle - slack < miss ? idle - slack : miss);
    *st = map_chunks(p, va, miss);
    if (*st == FABPOOL_OK && fp_map_set(p, va, miss, b) != 0) {
        unmap_chunks(p, va, miss);
        *st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of a large block");
    }
    if (*st != FABPOOL_OK) {
        fp_va_free(&p->va, va, miss);
        if (g) {
            atomic_store_explicit(&g->in_use, FP_LARGE_FREE, memory_order_relaxed);
            list_push(&p->large_free, g);
        } else {
            piece_free_meta(p, b);
        }
        return NULL;
    }
    if (g) {
        free_sub(p, g->size);
        if (!right)
            g->base = va;
        g->size = n;
    }
    return b;
}

fabpool_status fp_large_alloc(struct fabpool *p, uint64_t size, void **out)
{
    if (size > p->va_size)
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_alloc of %llu bytes: larger than the pool's reserved address "
                        "space (%llu bytes)", (unsigned long long)size, (unsigned long long)p->va_size);
    /* the size rounded to the granularity, no class: at most 1.25x from 8 MiB on */
    uint64_t n = fp_round_up(size, p->gran);
    fabpool_status st = FABPOOL_OK;
    fp_lock(&p->lock);
    fp_span *best = NULL;
    for (fp_span *f = p->large_free; f; f = f->next)
        if (f->size >= n && (!best || f->size < best->size)) {
            best = f;
            if (f->size == n)
                break;
        }
    fp_span *b = best ? carve(p, best, n, &st) : grow(p, n, &st);
    if (b) {
        atomic_store_explicit(&b->in_use, FP_LARGE_LIVE, memory_order_relaxed);
        list_push(&p->large_live, b);
        atomic_fetch_add(&p->large_in_use_bytes, n);
        atomic_fetch_add(&p->large_blocks, 1);
        unsigned bucket = fp_class_of(n);
        atomic_fetch_add(&p->large_allocs[bucket < FP_NCLASS ? bucket : FP_NCLASS - 1], 1);
        *out = (void *)(uintptr_t)b->base;
    }
    fp_unlock(&p->lock);
    fp_trim_policy(p);
    return st;
}

/* The live large block at addr, or NULL with a message (fn names the call).
 * Pool lock held. */
static fp_span *large_live_at(struct fabpool *p, uint64_t addr, const char *fn, fabpool_status *st)
{
    fp_span *b = piece_at(p, addr);
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

fabpool_status fp_large_pend(struct fabpool *p, uint64_t addr, uint64_t *usable)
{
    fabpool_status st = FABPOOL_OK;
    fp_lock(&p->lock);
    fp_span *b = large_live_at(p, addr, "fabpool_free_on_stream", &st);
    if (b) {
        atomic_store_explicit(&b->in_use, FP_LARGE_PENDING, memory_order_relaxed);
        *usable = b->size;
    }
    fp_unlock(&p->lock);
    return st;
}

fabpool_status fp_large_free(struct fabpool *p, fp_span *s, uint64_t addr)
{
    (void)s;   /* read again under the lock: pieces merge and split under it */
    fabpool_status st = FABPOOL_OK;
    fp_lock(&p->lock);
    fp_span *b = large_live_at(p, addr, "fabpool_free", &st);
    if (!b) {
        fp_unlock(&p->lock);
        return st;
    }
    atomic_store_explicit(&b->in_use, FP_LARGE_FREE, memory_order_relaxed);
    list_remove(&p->large_live, b);
    atomic_fetch_sub(&p->large_in_use_bytes, b->size);
    atomic_fetch_sub(&p->large_blocks, 1);
    free_add(p, b->size);
    /* merge with free neighbours (held ones are being grown: left alone) */
    fp_span *l = b->base > p->va_base ? piece_at(p, b->base - 1) : NULL;
    if (l && atomic_load_explicit(&l->in_use, memory_order_relaxed) == FP_LARGE_FREE) {
        l->size += b->size;
        fp_map_set(p, b->base, b->size, l);
        piece_free_meta(p, b);
        b = l;
    } else {
        list_push(&p->large_free, b);
    }
    fp_span *r = piece_at(p, b->base + b->size);
    if (r && atomic_load_explicit(&r->in_use, memory_order_relaxed) == FP_LARGE_FREE) {
        list_remove(&p->large_free, r);
        fp_map_set(p, r->base, r->size, b);
        b->size += r->size;
        piece_free_meta(p, r);
    }
    fp_unlock(&p->lock);
    fp_trim_policy(p);
    return FABPOOL_OK;
}

static void large_destroy(struct fabpool *p)
{
    for (size_t i = 0; i < p->n_lchunks; i++) {
        fp_chunk_unmap(p, p->lchunks[i].va, p->lchunks[i].size);
        fp_map_set(p, p->lchunks[i].va, p->lchunks[i].size, NULL);
    }
    fp_meta_free(&p->meta, p->lchunks, p->cap_lchunks * sizeof *p->lchunks);
    p->lchunks = NULL;
    p->n_lchunks = p->cap_lchunks = 0;
    fp_span **lists[] = {&p->large_live, &p->large_free};
    for (int k = 0; k < 2; k++)
        while (*lists[k]) {
            fp_span *s = *lists[k];
            list_remove(lists[k], s);
            piece_free_meta(p, s);
        }
}

/* ------------------------------------------------------------ trim */

void fp_idle_sub(struct fabpool *p, uint64_t n)
{
    uint64_t now = atomic_fetch_sub(&p->idle_bytes, n) - n;
    uint64_t low = atomic_load_explicit(&p->idle_low, memory_order_relaxed);
    while (now < low &&
           !atomic_compare_exchange_weak_explicit(&p->idle_low, &low, now, memory_order_relaxed, memory_order_relaxed))
        ;
}

void fp_trim_locked(struct fabpool *p, uint64_t keep)
{
    fp_lock_assert_held(&p->lock);
    /* large chunks first: one driver call frees the most */
    uint64_t idle = atomic_load(&p->idle_bytes);
    if (idle > keep)
        large_unmap_free(p, idle - keep);
    for (unsigned cls = 0; cls < p->n_slab_classes && atomic_load(&p->idle_bytes) > keep; cls++) {
        fp_class *c = &p->classes[cls];
        for (;;) {
            fp_lock(&c->lock);
            fp_span *s = c->empty;
            if (!s || atomic_load(&p->idle_bytes) <= keep) {
                fp_unlock(&c->lock);
                break;
            }
            list_remove(&c->empty, s);
            s->list = FP_LIST_NONE;
            c->nempty--;
            c->nslabs--;
            fp_idle_sub(p, s->size);
            fp_unlock(&c->lock);
            if (span_release(p, s) != FABPOOL_OK) {
                fp_lock(&c->lock);
                c->nslabs++;
                relist(p, c, s);
                fp_unlock(&c->lock);
                return;
            }
        }
    }
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

void fp_trim_policy(struct fabpool *p)
{
    uint64_t idle = atomic_load_explicit(&p->idle_bytes, memory_order_relaxed);
    if (idle == 0)
        return;
    uint64_t limit = p->opt.cache_limit_bytes, decay = p->opt.decay_ms;
    if (decay == 0 || idle > limit) {
        fp_lock(&p->lock);
        fp_trim_locked(p, decay == 0 ? 0 : limit);
        fp_unlock(&p->lock);
        if (decay == 0)
            return;
    }
    /* decay: what stayed idle through a whole period goes back to the driver */
    uint64_t t = now_ns(), epoch = atomic_load_explicit(&p->decay_epoch_ns, memory_order_relaxed);
    if (t - epoch < decay * 1000000ull ||
        !atomic_compare_exchange_strong_explicit(&p->decay_epoch_ns, &epoch, t, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    fp_lock(&p->lock);
    uint64_t low = atomic_load(&p->idle_low);
    idle = atomic_load(&p->idle_bytes);
    if (low)
        fp_trim_locked(p, idle > low ? idle - low : 0);
    atomic_store(&p->idle_low, atomic_load(&p->idle_bytes));
    fp_unlock(&p->lock);
}

void fp_classes_destroy(struct fabpool *p)
{
    while (p->spans) {
        fp_span *s = p->spans;
        if (span_release(p, s) != FABPOOL_OK) {
            /* the driver refused the unmap: drop the metadata anyway, the
             * reservation is freed next and the message says what failed */
            all_remove(p, s);
            span_free_meta(p, s);
        }
    }
    large_destroy(p);
    for (unsigned cls = 0; cls < FP_NCLASS; cls++) {
        fp_class *c = &p->classes[cls];
        fp_lock_destroy(&c->lock);
    }
}
