/* slab.c - slabs of size-class blocks, and large blocks on spans of their
 * own.  Free slabs and spans stay mapped (cached) until a trim. */
#include <string.h>

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

/* Moves slab s to the list its free count says. Class lock held. */
static void relist(struct fabpool *p, fp_class *c, fp_span *s)
{
    int want = s->nfree == 0 ? FP_LIST_FULL : s->nfree == s->nobj ? FP_LIST_EMPTY : FP_LIST_PARTIAL;
    if (want == s->list)
        return;
    fp_span **from = class_list(c, s->list), **to = class_list(c, want);
    if (from)
        list_remove(from, s);
    if (s->list == FP_LIST_EMPTY) {
        c->nempty--;
        atomic_fetch_sub(&p->idle_bytes, s->size);
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

/* Unmaps a span that is in no list and frees its address range. Pool lock held. */
static fabpool_status span_release(struct fabpool *p, fp_span *s)
{
    fabpool_status st = fp_chunk_unmap(p, s->base, s->size);
    if (st != FABPOOL_OK)
        return st;
    all_remove(p, s);
    fp_map_set(p, s->base, s->size, NULL);
    fp_va_free(&p->va, s->base, s->size);
    span_free_meta(p, s);
    return FABPOOL_OK;
}

/* Address range + chunk for a new span. Pool lock held. */
static fabpool_status span_map(struct fabpool *p, uint64_t size, uint64_t *va)
{
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

    pthread_mutex_lock(&p->lock);
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
    pthread_mutex_unlock(&p->lock);
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
    pthread_mutex_lock(&c->lock);
    while (k < n) {
        fp_span *s = c->partial ? c->partial : c->empty;
        if (!s)
            break;
        k += take_from(s, out + k, n - k);
        relist(p, c, s);
    }
    pthread_mutex_unlock(&c->lock);
    if (k)
        return k;

    /* No free block: map a new slab without the class lock (the driver call
     * takes tens of microseconds, and may trim on OOM). */
    fp_span *s = slab_new(p, cls, st);
    if (!s)
        return 0;
    pthread_mutex_lock(&c->lock);
    c->nslabs++;
    s->list = FP_LIST_NONE;
    k = take_from(s, out, n);
    relist(p, c, s);
    pthread_mutex_unlock(&c->lock);
    return k;
}

void fp_class_give(struct fabpool *p, unsigned cls, const fp_item *items, unsigned n)
{
    fp_class *c = &p->classes[cls];
    uint64_t obj = c->obj_size;
    pthread_mutex_lock(&c->lock);
    for (unsigned k = 0; k < n; k++) {
        fp_span *s = items[k].span;
        s->free_stack[s->nfree++] = (uint32_t)((items[k].ptr - s->base) / obj);
        relist(p, c, s);
    }
    pthread_mutex_unlock(&c->lock);
}

/* ------------------------------------------------------------ large blocks */

fabpool_status fp_large_alloc(struct fabpool *p, uint64_t size, void **out)
{
    if (size > p->va_size)
        return fp_error(FABPOOL_ERR_LIMIT, "fabpool_alloc of %llu bytes: larger than the pool's reserved address "
                        "space (%llu bytes)", (unsigned long long)size, (unsigned long long)p->va_size);
    /* the size rounded to the granularity, no class: at most 1.25x from 8 MiB on */
    uint64_t span_size = fp_round_up(size, p->gran);
    unsigned cls = fp_class_of(span_size);   /* the stats' bucket */
    fabpool_status st = FABPOOL_OK;
    pthread_mutex_lock(&p->lock);
    fp_span *s = p->large_cache[cls];
    while (s && s->size != span_size)
        s = s->next;
    if (s) {
        list_remove(&p->large_cache[cls], s);
        atomic_fetch_sub(&p->idle_bytes, s->size);
    } else {
        s = fp_meta_alloc(&p->meta, sizeof *s);
        if (!s) {
            st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a span's metadata");
            goto out;
        }
        s->kind = FP_SPAN_LARGE;
        s->cls = (uint16_t)cls;
        s->size = span_size;
        uint64_t va = 0;
        st = span_map(p, span_size, &va);
        if (st == FABPOOL_OK) {
            s->base = va;
            if (fp_map_set(p, va, span_size, s) != 0) {
                fp_chunk_unmap(p, va, span_size);
                fp_va_free(&p->va, va, span_size);
                st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of a new span");
            } else {
                all_add(p, s);
            }
        }
        if (st != FABPOOL_OK) {
            span_free_meta(p, s);
            goto out;
        }
    }
    atomic_store(&s->in_use, 1);
    atomic_fetch_add(&p->large_in_use_bytes, s->size);
    atomic_fetch_add(&p->large_blocks, 1);
    atomic_fetch_add(&p->large_allocs[cls], 1);
    *out = (void *)(uintptr_t)s->base;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

fabpool_status fp_large_free(struct fabpool *p, fp_span *s, uint64_t addr)
{
    if (addr != s->base)
        return fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_free(%p): an interior pointer, %llu bytes into a block of "
                        "%llu bytes at 0x%llx; free the pointer fabpool_alloc returned",
                        (void *)(uintptr_t)addr, (unsigned long long)(addr - s->base),
                        (unsigned long long)s->size, (unsigned long long)s->base);
    pthread_mutex_lock(&p->lock);
    if (!atomic_exchange(&s->in_use, 0)) {
        pthread_mutex_unlock(&p->lock);
        return fp_error(FABPOOL_ERR_DOUBLE_FREE, "fabpool_free(%p): this block of %llu bytes is already free "
                        "(double free)", (void *)(uintptr_t)addr, (unsigned long long)s->size);
    }
    atomic_fetch_sub(&p->large_in_use_bytes, s->size);
    atomic_fetch_sub(&p->large_blocks, 1);
    list_push(&p->large_cache[s->cls], s);
    atomic_fetch_add(&p->idle_bytes, s->size);
    pthread_mutex_unlock(&p->lock);
    fp_trim_policy(p);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ trim */

void fp_trim_locked(struct fabpool *p, uint64_t keep)
{
    /* large spans first: one driver call frees the most */
    for (int cls = FP_NCLASS - 1; cls >= 0 && atomic_load(&p->idle_bytes) > keep; cls--) {
        while (p->large_cache[cls] && atomic_load(&p->idle_bytes) > keep) {
            fp_span *s = p->large_cache[cls];
            list_remove(&p->large_cache[cls], s);
            atomic_fetch_sub(&p->idle_bytes, s->size);
            if (span_release(p, s) != FABPOOL_OK) {
                /* still mapped: keep it cached */
                list_push(&p->large_cache[cls], s);
                atomic_fetch_add(&p->idle_bytes, s->size);
                return;
            }
        }
    }
    for (unsigned cls = 0; cls < p->n_slab_classes && atomic_load(&p->idle_bytes) > keep; cls++) {
        fp_class *c = &p->classes[cls];
        for (;;) {
            pthread_mutex_lock(&c->lock);
            fp_span *s = c->empty;
            if (!s || atomic_load(&p->idle_bytes) <= keep) {
                pthread_mutex_unlock(&c->lock);
                break;
            }
            list_remove(&c->empty, s);
            s->list = FP_LIST_NONE;
            c->nempty--;
            c->nslabs--;
            atomic_fetch_sub(&p->idle_bytes, s->size);
            pthread_mutex_unlock(&c->lock);
            if (span_release(p, s) != FABPOOL_OK) {
                pthread_mutex_lock(&c->lock);
                c->nslabs++;
                relist(p, c, s);
                pthread_mutex_unlock(&c->lock);
                return;
            }
        }
    }
}

void fp_trim_policy(struct fabpool *p)
{
    if (atomic_load_explicit(&p->idle_bytes, memory_order_relaxed) <= p->opt.cache_limit_bytes)
        return;
    pthread_mutex_lock(&p->lock);
    fp_trim_locked(p, p->opt.cache_limit_bytes);
    pthread_mutex_unlock(&p->lock);
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
    for (unsigned cls = 0; cls < FP_NCLASS; cls++) {
        fp_class *c = &p->classes[cls];
        pthread_mutex_destroy(&c->lock);
    }
}
