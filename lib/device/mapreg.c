/* mapreg.c - the list of a pool's mappings and its sums per kind
 * (mapreg.h). */
#include "mapreg.h"

#include <time.h>

#include "array.h"
#include "walk.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

static const char *const kind_names[FP_MAP_KINDS] = {"arena chunks", "buffer chunks", "view chunks",
                                                     "shrink copies", "host copies",
                                                     "stuck mappings"};

const char *fp_map_kind_name(fp_map_kind kind) { return kind < FP_MAP_KINDS ? kind_names[kind] : "unknown"; }

void fp_mapreg_init(fp_mapreg *r, fp_meta *meta)
{
    r->meta = meta;
    r->m = NULL;
    r->n = r->cap = 0;
    for (int k = 0; k < FP_MAP_KINDS; k++) {
        atomic_store(&r->count[k], 0);
        atomic_store(&r->bytes[k], 0);
    }
    atomic_store(&r->peak, 0);
}

void fp_mapreg_free(fp_mapreg *r)
{
    FP_ARRAY_FREE(r->meta, r->m, r->cap);
    r->n = 0;
}

int fp_mapreg_reserve(fp_mapreg *r) { return FP_ARRAY_RESERVE(r->meta, r->m, r->n, r->cap, r->n + 1, 64); }

static void peak_follow(fp_mapreg *r)
{
    uint64_t now = fp_mapreg_mapped(r, NULL), old = atomic_load_explicit(&r->peak, memory_order_relaxed);
    while (now > old &&
           !atomic_compare_exchange_weak_explicit(&r->peak, &old, now, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* A new mapping's identity: one counter for the process (every pool's mappings, so that a pool made again at
 * the same addresses never repeats one), started at the wall clock's nanoseconds, so that a later process of
 * the same pid starts past every identity an earlier one gave. */
static uint64_t next_ident(void)
{
    static _Atomic uint64_t last;
    uint64_t v = atomic_load_explicit(&last, memory_order_relaxed);
    if (!v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t seed = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        atomic_compare_exchange_strong(&last, &v, seed ? seed : 1); /* lost to another thread: theirs stands */
    }
    return atomic_fetch_add_explicit(&last, 1, memory_order_relaxed) + 1;
}

void fp_mapreg_add(fp_mapreg *r, uint64_t va, uint64_t size, fp_map_kind kind, void *owner)
{
    size_t i = FP_ARRAY_LOWER(r->m, r->n, fp_mapping, va, va);
    memmove(r->m + i + 1, r->m + i, (r->n - i) * sizeof *r->m);
    r->m[i] = (fp_mapping){va, size, next_ident(), owner, (uint8_t)kind, (uint8_t)FP_MAP_SLEEPS(kind), 0};
    r->n++;
    atomic_fetch_add(&r->count[kind], 1);
    atomic_fetch_add(&r->bytes[kind], size);
    if (FP_MAP_COUNTED(kind))
        peak_follow(r);
}

fp_mapping *fp_mapreg_find(fp_mapreg *r, uint64_t va)
{
    size_t i = FP_ARRAY_LOWER(r->m, r->n, fp_mapping, va, va);
    return i < r->n && r->m[i].va == va ? &r->m[i] : NULL;
}

const fp_mapping *fp_mapreg_over(const fp_mapreg *r, uint64_t va)
{
    size_t i = va == UINT64_MAX ? r->n : FP_ARRAY_LOWER(r->m, r->n, fp_mapping, va, va + 1); /* the first past va */
    return i && va - r->m[i - 1].va < r->m[i - 1].size ? &r->m[i - 1] : NULL;
}

int fp_mapreg_remove(fp_mapreg *r, uint64_t va, uint64_t size, fp_mapping *out)
{
    fp_mapping *e = fp_mapreg_find(r, va);
    if (!e || e->size != size)
        return -1;
    atomic_fetch_sub(&r->count[e->kind], 1);
    atomic_fetch_sub(&r->bytes[e->kind], size);
    if (out)
        *out = *e;
    size_t i = (size_t)(e - r->m);
    memmove(e, e + 1, (r->n - i - 1) * sizeof *e);
    r->n--;
    return 0;
}

int fp_mapreg_set_copy(fp_mapreg *r, uint64_t va, int copy)
{
    fp_mapping *e = fp_mapreg_find(r, va);
    if (!e)
        return -1;
    e->copy = copy != 0;
    return 0;
}

uint64_t fp_mapreg_mapped(const fp_mapreg *r, uint64_t *count)
{
    uint64_t b = 0, n = 0;
    for (int k = 0; k < FP_MAP_KINDS; k++)
        if (FP_MAP_COUNTED(k)) {
            b += atomic_load_explicit(&r->bytes[k], memory_order_relaxed);
            n += atomic_load_explicit(&r->count[k], memory_order_relaxed);
        }
    if (count)
        *count = n;
    return b;
}

uint64_t fp_mapreg_peak(const fp_mapreg *r) { return atomic_load_explicit(&r->peak, memory_order_relaxed); }

void fp_mapreg_reset_peak(fp_mapreg *r)
{
    atomic_store(&r->peak, fp_mapreg_mapped(r, NULL));
    peak_follow(r); /* a map in between */
}

fabpool_status fp_mapreg_check(const fp_mapreg *r)
{
    uint64_t n[FP_MAP_KINDS] = {0}, b[FP_MAP_KINDS] = {0}, end = 0;
    for (size_t i = 0; i < r->n; i++) {
        const fp_mapping *e = &r->m[i];
        if (e->kind >= FP_MAP_KINDS || !e->size || e->va < end || (e->owner && e->kind != FP_MAP_BUFFER) ||
            (e->held && e->kind != FP_MAP_STUCK))
            return FAIL("[registry.list] the mapping at 0x%llx (%llu bytes, kind %u) is empty, overlaps the one "
                        "before, or has no such kind or owner", ULL(e->va), ULL(e->size), (unsigned)e->kind);
        end = e->va + e->size;
        n[e->kind]++;
        b[e->kind] += e->size;
    }
    for (int k = 0; k < FP_MAP_KINDS; k++)
        if (n[k] != atomic_load(&r->count[k]) || b[k] != atomic_load(&r->bytes[k]))
            return FAIL("[registry.sums] the registry lists %llu %s of %llu bytes, its sums say %llu of %llu",
                        ULL(n[k]), kind_names[k], ULL(b[k]), ULL(atomic_load(&r->count[k])),
                        ULL(atomic_load(&r->bytes[k])));
    return FABPOOL_OK;
}
