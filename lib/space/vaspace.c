/* vaspace.c - first-fit address-range allocator with merging. */
#include "vaspace.h"

#include <string.h>

#include "array.h"

static int grow(fp_vaspace *v) { return FP_ARRAY_RESERVE(v->meta, v->free, v->n, v->cap, v->n + 1, 16); }

int fp_va_init(fp_vaspace *v, fp_meta *meta, uint64_t base, uint64_t size)
{
    memset(v, 0, sizeof *v);
    v->meta = meta;
    v->base = base;
    v->size = size;
    if (grow(v))
        return -1;
    v->free[0] = (fp_range){base, size};
    v->n = 1;
    v->free_bytes = size;
    return 0;
}

void fp_va_destroy(fp_vaspace *v)
{
    FP_ARRAY_FREE(v->meta, v->free, v->cap);
    memset(v, 0, sizeof *v);
}

/* Takes [start, start + size) out of free range i, which holds it: 0, or -1
 * if the list could not grow for the split. */
static int cut(fp_vaspace *v, size_t i, uint64_t start, uint64_t size)
{
    fp_range *r = &v->free[i];
    uint64_t end = r->start + r->size;
    uint64_t head = start - r->start, tail = end - (start + size);
    if (head && tail) {
        if (v->n == v->cap && grow(v))
            return -1;
        r = &v->free[i];
        memmove(&v->free[i + 2], &v->free[i + 1], (v->n - i - 1) * sizeof *r);
        v->free[i + 1] = (fp_range){start + size, tail};
        r->size = head;
        v->n++;
    } else if (head) {
        r->size = head;
    } else if (tail) {
        r->start = start + size;
        r->size = tail;
    } else {
        memmove(&v->free[i], &v->free[i + 1], (v->n - i - 1) * sizeof *r);
        v->n--;
    }
    v->free_bytes -= size;
    return 0;
}

uint64_t fp_va_alloc(fp_vaspace *v, uint64_t size, uint64_t align)
{
    for (size_t i = 0; i < v->n; i++) {
        fp_range *r = &v->free[i];
        uint64_t start = (r->start + align - 1) & ~(align - 1);
        uint64_t end = r->start + r->size;
        if (start < r->start || start > end || end - start < size)
            continue;
        return cut(v, i, start, size) == 0 ? start : 0;
    }
    return 0;
}

int fp_va_free(fp_vaspace *v, uint64_t start, uint64_t size)
{
    size_t i = 0;
    while (i < v->n && v->free[i].start < start)
        i++;
    int merge_prev = i > 0 && v->free[i - 1].start + v->free[i - 1].size == start;
    int merge_next = i < v->n && start + size == v->free[i].start;
    v->free_bytes += size;
    if (merge_prev && merge_next) {
        v->free[i - 1].size += size + v->free[i].size;
        memmove(&v->free[i], &v->free[i + 1], (v->n - i - 1) * sizeof *v->free);
        v->n--;
    } else if (merge_prev) {
        v->free[i - 1].size += size;
    } else if (merge_next) {
        v->free[i].start = start;
        v->free[i].size += size;
    } else {
        if (v->n == v->cap && grow(v)) {
            v->free_bytes -= size;
            return -1;
        }
        memmove(&v->free[i + 1], &v->free[i], (v->n - i) * sizeof *v->free);
        v->free[i] = (fp_range){start, size};
        v->n++;
    }
    return 0;
}

uint64_t fp_va_alloc_top_below(fp_vaspace *v, uint64_t size, uint64_t align, uint64_t limit)
{
    for (size_t i = v->n; i-- > 0;) {
        fp_range *r = &v->free[i];
        uint64_t end = r->start + r->size < limit ? r->start + r->size : limit;
        if (end < r->start || end - r->start < size)
            continue;
        uint64_t start = (end - size) & ~(align - 1);
        if (start < r->start)
            continue;
        return fp_va_take(v, start, size) == 0 ? start : 0;
    }
    return fp_va_alloc_top(v, size, align);
}

uint64_t fp_va_alloc_top(fp_vaspace *v, uint64_t size, uint64_t align)
{
    for (size_t i = v->n; i-- > 0;) {
        fp_range *r = &v->free[i];
        uint64_t end = r->start + r->size;
        if (r->size < size)
            continue;
        uint64_t start = (end - size) & ~(align - 1);
        if (start < r->start)
            continue;
        return fp_va_take(v, start, size) == 0 ? start : 0;
    }
    return 0;
}

int fp_va_take(fp_vaspace *v, uint64_t start, uint64_t size)
{
    if (size == 0 || start < v->base || start + size < start)
        return -1;
    /* the free range that holds start: the last one starting at or below it
     * (start + 1 cannot wrap: start + size did not) */
    size_t lo = FP_ARRAY_LOWER(v->free, v->n, fp_range, start, start + 1);
    if (lo == 0)
        return -1;
    size_t i = lo - 1;
    if (start + size > v->free[i].start + v->free[i].size)
        return -1;
    return cut(v, i, start, size);
}

/* ---- fabpool_check (walk.h) */

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

fabpool_status fp_va_check(const fp_vaspace *v, const fp_walk *w)
{
    if (v->base != w->va_base || v->size != w->va_size)
        return FAIL("[va.bounds] the address space allocator covers [0x%llx, +%llu), the reservation is "
                    "[0x%llx, +%llu)", ULL(v->base), ULL(v->size), ULL(w->va_base), ULL(w->va_size));
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
fabpool_status fp_va_check_used(const fp_vaspace *v, fp_walk *w)
{
    fp_walk_sort(w);
    uint64_t used = 0;
    for (size_t i = 0; i < w->n_iv; i++) {
        const fp_ival *a = &w->iv[i];
        if (a->lo < v->base || a->hi > v->base + v->size || a->hi <= a->lo)
            return FAIL("[va.outside] %s [0x%llx, 0x%llx) is empty or outside the reservation [0x%llx, 0x%llx)",
                        a->what, ULL(a->lo), ULL(a->hi), ULL(v->base), ULL(v->base + v->size));
        if (i && a->lo < w->iv[i - 1].hi)
            return FAIL("[va.overlap] %s [0x%llx, 0x%llx) overlaps %s [0x%llx, 0x%llx)", w->iv[i - 1].what,
                        ULL(w->iv[i - 1].lo), ULL(w->iv[i - 1].hi), a->what, ULL(a->lo), ULL(a->hi));
        used += a->hi - a->lo;
    }
    size_t k = 0;
    for (size_t i = 0; i < v->n; i++) {
        const fp_range *r = &v->free[i];
        while (k < w->n_iv && w->iv[k].hi <= r->start)
            k++;
        if (k < w->n_iv && w->iv[k].lo < r->start + r->size)
            return FAIL("[va.free_used] free range [0x%llx, +%llu) overlaps %s [0x%llx, 0x%llx), which is in use",
                        ULL(r->start), ULL(r->size), w->iv[k].what, ULL(w->iv[k].lo), ULL(w->iv[k].hi));
    }
    if (used + v->free_bytes != v->size)
        return FAIL("[va.sum] %llu bytes in use and %llu free, the reservation is %llu bytes (address space was "
                    "lost or counted twice)", ULL(used), ULL(v->free_bytes), ULL(v->size));
    return FABPOOL_OK;
}
