/* meta.c - host metadata in a private jemalloc arena, or libc. */
#define _GNU_SOURCE
#include "meta.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "counter.h"
#include "error.h"

/* jemalloc's flag encoding (jemalloc/jemalloc.h, stable since 4.0). */
#define FP_MALLOCX_ZERO 0x40
#define FP_MALLOCX_TCACHE_NONE (((unsigned)(-1 + 2)) << 8)
#define FP_MALLOCX_ARENA(a) ((int)(((unsigned)(a) + 1) << 20))
#define FP_MALLOCX_LG_ALIGN(la) ((int)(la))

/* Arenas of destroyed pools, reset and kept for the next pools of the
 * process.  jemalloc keeps an arena's own metadata mapped after
 * arena.<i>.destroy (with opt.retain, its default on 64-bit Linux): 2 MiB of
 * address space each, so a process that made and destroyed 2,000 pools held
 * 4 GiB more of it, and a long test sweep under valgrind ran out.  A reset
 * arena keeps its address space for its next pool.  Slots hold an arena
 * index + 1 (0: empty) of the jemalloc whose mallctl spare_mallctl names
 * (the first one seen; a process seldom has two); beyond FP_META_SPARE
 * spare arenas, an arena is destroyed.  Lock-free: pools are made and
 * destroyed under no lock of the library's. */
#define FP_META_SPARE 64
typedef int (*fp_mallctl_fn)(const char *, void *, size_t *, void *, size_t);
static _Atomic unsigned spare[FP_META_SPARE];
static _Atomic(fp_mallctl_fn) spare_mallctl;

static int take_spare(fp_meta *m)
{
    if (atomic_load_explicit(&spare_mallctl, memory_order_acquire) != m->mallctl)
        return 0;
    for (unsigned i = 0; i < FP_META_SPARE; i++) {
        unsigned v = atomic_load_explicit(&spare[i], memory_order_relaxed);
        if (v && atomic_compare_exchange_strong_explicit(&spare[i], &v, 0, memory_order_acquire,
                                                         memory_order_relaxed)) {
            m->arena = v - 1;
            return 1;
        }
    }
    return 0;
}

static int put_spare(fp_meta *m)
{
    fp_mallctl_fn none = NULL;
    atomic_compare_exchange_strong_explicit(&spare_mallctl, &none, m->mallctl, memory_order_acq_rel,
                                            memory_order_acquire);
    if (atomic_load_explicit(&spare_mallctl, memory_order_acquire) != m->mallctl)
        return 0;
    char cmd[64];
    snprintf(cmd, sizeof cmd, "arena.%u.reset", m->arena);
    if (m->mallctl(cmd, NULL, NULL, NULL, 0) != 0)
        return 0;
    snprintf(cmd, sizeof cmd, "arena.%u.purge", m->arena); /* its pages back to the system, its addresses kept */
    m->mallctl(cmd, NULL, NULL, NULL, 0);
    for (unsigned i = 0; i < FP_META_SPARE; i++) {
        unsigned none_v = 0;
        if (atomic_compare_exchange_strong_explicit(&spare[i], &none_v, m->arena + 1, memory_order_release,
                                                    memory_order_relaxed))
            return 1;
    }
    return 0;
}

static int find_jemalloc(fp_meta *m, void *where)
{
    m->mallctl = (fp_mallctl_fn)dlsym(where, "mallctl");
    m->mallocx = (void *(*)(size_t, int))dlsym(where, "mallocx");
    m->sdallocx = (void (*)(void *, size_t, int))dlsym(where, "sdallocx");
    return m->mallctl && m->mallocx && m->sdallocx;
}

/* Memory of the arena or libc, zeroed, not counted in the stats' bytes (the regions' own bookkeeping). */
static void *raw_alloc(fp_meta *m, size_t size)
{
    return m->jemalloc ? m->mallocx(size, m->flags | FP_MALLOCX_ZERO) : calloc(1, size);
}

static void raw_free(fp_meta *m, void *p, size_t size)
{
    if (m->jemalloc)
        m->sdallocx(p, size, m->flags);
    else
        free(p);
}

/* ---- regions for the aligned tables (meta.h: fp_meta_alloc_aligned)
 *
 * A region is 2 MiB of address space aligned to 2 MiB (a huge page's size and alignment on x86-64 and arm64
 * with 4 KiB pages), mapped anonymous and advised MADV_HUGEPAGE, holding slots of one power of two: a bit a
 * slot says which are given out, slots from `fresh` up were never given out.
 * A medium block's allocation and free read about a dozen lines of these tables at random over the whole
 * set of live blocks; in 4 KiB pages they spread over more pages than the TLB holds (10,000 live blocks:
 * about 1,900 pages), in huge pages over a handful.  A region that empties goes back to the kernel but the
 * last one of its slot size, kept for the next table of that size.  Calls come under several of the pool's
 * locks: the regions' own mutex, innermost, guards them. */
#define FP_META_REGION (2ull << 20)
#define FP_META_REGION_SLOTS (FP_META_REGION / FP_META_SLOT_MIN)

typedef struct fp_meta_region {
    uintptr_t base;
    unsigned lg;                       /* its slots' size: 1 << lg */
    unsigned used;                     /* slots given out */
    unsigned fresh;                    /* slots from here on never given out */
    uint64_t bits[FP_META_REGION_SLOTS / 64];
} fp_meta_region;

/* A size's tables come from regions once FP_META_REGION_AFTER of a region's worth of them are held outside
 * one: a small pool (a few record pages and leaves) keeps its 4 KiB pages, a huge page each would be most of
 * its host memory and its first touch the most of its creation's time (about 0.1 ms a region). */
#define FP_META_REGION_AFTER 8u

struct fp_meta_tables {
    pthread_mutex_t lock;
    fp_meta_region *r;                 /* sorted by base */
    size_t n, cap;
    unsigned outside[64];              /* tables of each size (by its log2) held outside regions */
};

/* The region that holds p (index), or t->n. */
static size_t region_of(const struct fp_meta_tables *t, uintptr_t p)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p < t->r[mid].base)
            hi = mid;
        else if (p - t->r[mid].base >= FP_META_REGION)
            lo = mid + 1;
        else
            return mid;
    }
    return t->n;
}

/* A new region of slots of 1 << lg bytes, in its place in the sorted list: its index, or t->n without
 * address space or host memory. */
static size_t region_new(fp_meta *m, struct fp_meta_tables *t, unsigned lg)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        fp_meta_region *r = raw_alloc(m, cap * sizeof *r);
        if (!r)
            return t->n;
        if (t->n)
            memcpy(r, t->r, t->n * sizeof *r);
        if (t->r)
            raw_free(m, t->r, t->cap * sizeof *r);
        t->r = r;
        t->cap = cap;
    }
    /* twice the size, then the unaligned ends unmapped: an aligned region of exactly 2 MiB */
    void *raw = mmap(NULL, 2 * FP_META_REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return t->n;
    uintptr_t b = ((uintptr_t)raw + FP_META_REGION - 1) & ~(uintptr_t)(FP_META_REGION - 1);
    if (b > (uintptr_t)raw)
        munmap(raw, b - (uintptr_t)raw);
    if ((uintptr_t)raw + 2 * FP_META_REGION > b + FP_META_REGION)
        munmap((void *)(b + FP_META_REGION), (uintptr_t)raw + 2 * FP_META_REGION - b - FP_META_REGION);
#ifdef MADV_HUGEPAGE
    madvise((void *)b, FP_META_REGION, MADV_HUGEPAGE); /* advice: where THP is off or absent, 4 KiB pages */
#endif
    size_t i = 0;
    while (i < t->n && t->r[i].base < b)
        i++;
    memmove(&t->r[i + 1], &t->r[i], (t->n - i) * sizeof *t->r);
    t->r[i] = (fp_meta_region){.base = b, .lg = lg};
    t->n++;
    return i;
}

/* A slot of 1 << lg bytes, zeroes, or NULL: none yet for this size (FP_META_REGION_AFTER), or no region
 * could be mapped; the caller then takes the table from the arena or libc and counts it (table_outside). */
static void *table_take(fp_meta *m, struct fp_meta_tables *t, unsigned lg)
{
    unsigned slots = (unsigned)(FP_META_REGION >> lg);
    pthread_mutex_lock(&t->lock);
    size_t i = 0, same = 0;
    for (; i < t->n && (t->r[i].lg != lg || t->r[i].used == slots); i++)
        same += t->r[i].lg == lg;
    int first = !same && t->outside[lg] < slots / FP_META_REGION_AFTER;
    if (i == t->n && (first || (i = region_new(m, t, lg)) == t->n)) {
        pthread_mutex_unlock(&t->lock);
        return NULL;
    }
    fp_meta_region *r = &t->r[i];
    unsigned k;   /* (zeroes either way: fresh from the kernel, or given back to it by table_give) */
    if (r->fresh < slots) {
        k = r->fresh++;
    } else {
        unsigned w = 0;
        while (!~r->bits[w])
            w++;
        k = w * 64 + (unsigned)__builtin_ctzll(~r->bits[w]);
    }
    r->bits[k / 64] |= 1ull << (k % 64);
    r->used++;
    void *p = (void *)(r->base + ((uintptr_t)k << lg));
    pthread_mutex_unlock(&t->lock);
    return p;
}

/* A table of 1 << lg bytes taken from, or given back to, the arena or libc. */
static void table_outside(struct fp_meta_tables *t, unsigned lg, int d)
{
    pthread_mutex_lock(&t->lock);
    t->outside[lg] += (unsigned)d;
    pthread_mutex_unlock(&t->lock);
}

/* Slot p of 1 << lg bytes back to its region: 1, or 0 where no region holds it (the arena's or libc's memory).
 * Its memory goes back to the kernel first (while the slot is still given out, so that no one takes it in
 * between): the regions hold what the live tables need, not their peak (a huge page that held it is split),
 * and the slot reads as zeroes when it is given again. */
static int table_give(struct fp_meta_tables *t, void *p, unsigned lg)
{
    pthread_mutex_lock(&t->lock);
    size_t i = region_of(t, (uintptr_t)p);
    pthread_mutex_unlock(&t->lock);
    if (i == t->n)
        return 0;
    madvise(p, (size_t)1 << lg, MADV_DONTNEED);
    pthread_mutex_lock(&t->lock);
    i = region_of(t, (uintptr_t)p);   /* (the list may have moved meanwhile; the region stays: p is in it) */
    fp_meta_region *r = &t->r[i];
    unsigned k = (unsigned)(((uintptr_t)p - r->base) >> r->lg);
    r->bits[k / 64] &= ~(1ull << (k % 64));
    if (!--r->used) {
        size_t same = 0;
        for (size_t j = 0; j < t->n; j++)
            same += t->r[j].lg == r->lg;
        if (same > 1) {
            munmap((void *)r->base, FP_META_REGION);
            memmove(&t->r[i], &t->r[i + 1], (t->n - i - 1) * sizeof *t->r);
            t->n--;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return 1;
}

/* Every region unmapped, and the list: before the arena goes (its memory holds them). */
static void tables_destroy(fp_meta *m)
{
    struct fp_meta_tables *t = m->tables;
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        munmap((void *)t->r[i].base, FP_META_REGION);
    if (t->r)
        raw_free(m, t->r, t->cap * sizeof *t->r);
    pthread_mutex_destroy(&t->lock);
    raw_free(m, t, sizeof *t);
    m->tables = NULL;
}

static fabpool_status meta_init(fp_meta *m, fabpool_metadata mode)
{
    memset(m, 0, sizeof *m);
    atomic_init(&m->bytes, 0);
    if (mode == FABPOOL_METADATA_LIBC)
        return FABPOOL_OK;
    int found = find_jemalloc(m, RTLD_DEFAULT);
    if (!found && mode == FABPOOL_METADATA_JEMALLOC) {
        /* RTLD_LOCAL: jemalloc's malloc must not replace the process's. */
        void *lib = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                            "metadata:jemalloc was asked for, but the process has no jemalloc and loading "
                            "libjemalloc.so.2 failed: %s. Start the process with LD_PRELOAD=libjemalloc.so.2, "
                            "link the program with -ljemalloc, or use metadata:auto",
                            dlerror());
        found = find_jemalloc(m, lib);
    }
    if (!found) {
        if (mode == FABPOOL_METADATA_JEMALLOC)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "metadata:jemalloc: the jemalloc found lacks mallctl, "
                                                       "mallocx or sdallocx (jemalloc 4 or newer is needed)");
        memset(m, 0, sizeof *m);
        return FABPOOL_OK;
    }
    size_t sz = sizeof m->arena;
    if (!take_spare(m) && m->mallctl("arenas.create", &m->arena, &sz, NULL, 0) != 0) {
        if (mode == FABPOOL_METADATA_JEMALLOC)
            return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "jemalloc refused arenas.create; use metadata:libc");
        memset(m, 0, sizeof *m);
        return FABPOOL_OK;
    }
    m->jemalloc = 1;
    m->flags = FP_MALLOCX_ARENA(m->arena) | FP_MALLOCX_TCACHE_NONE;
    return FABPOOL_OK;
}

fabpool_status fp_meta_init(fp_meta *m, fabpool_metadata mode)
{
    fabpool_status st = meta_init(m, mode);
    if (st != FABPOOL_OK)
        return st;
    /* from the pool's own allocator, as the pool's struct that holds the pointer (so that a leak check that
     * sees one sees the other); without host memory for it, no regions: the tables from the arena or libc */
    struct fp_meta_tables *t = raw_alloc(m, sizeof *t);
    if (t && pthread_mutex_init(&t->lock, NULL) != 0) {
        raw_free(m, t, sizeof *t);
        t = NULL;
    }
    m->tables = t;
    return FABPOOL_OK;
}

void *fp_meta_alloc(fp_meta *m, size_t size)
{
    if (size == 0)
        size = 1;
    void *p = m->jemalloc ? m->mallocx(size, m->flags | FP_MALLOCX_ZERO) : calloc(1, size);
    if (p)
        atomic_fetch_add_explicit(&m->bytes, size, memory_order_relaxed);
    return p;
}

void fp_meta_free(fp_meta *m, void *p, size_t size)
{
    if (!p)
        return;
    if (size == 0)
        size = 1;
    atomic_fetch_sub_explicit(&m->bytes, size, memory_order_relaxed);
    if (m->jemalloc)
        m->sdallocx(p, size, m->flags);
    else
        free(p);
}

void *fp_meta_alloc_aligned(fp_meta *m, size_t size)
{
    int lg = __builtin_ctzll(size);
    int table = m->tables && size >= FP_META_SLOT_MIN && size <= FP_META_SLOT_MAX;
    if (table) {
        void *t = table_take(m, m->tables, (unsigned)lg);
        if (t) {
            atomic_fetch_add_explicit(&m->bytes, size, memory_order_relaxed);
            return t;
        }
    }
    void *p = m->jemalloc ? m->mallocx(size, m->flags | FP_MALLOCX_ZERO | FP_MALLOCX_LG_ALIGN(lg))
                          : aligned_alloc(size, size);
    if (!p)
        return NULL;
    if (table)
        table_outside(m->tables, (unsigned)lg, 1);
    if (!m->jemalloc)
        memset(p, 0, size);
    atomic_fetch_add_explicit(&m->bytes, size, memory_order_relaxed);
    return p;
}

void fp_meta_free_aligned(fp_meta *m, void *p, size_t size)
{
    if (!p)
        return;
    atomic_fetch_sub_explicit(&m->bytes, size, memory_order_relaxed);
    if (m->tables && size >= FP_META_SLOT_MIN && size <= FP_META_SLOT_MAX) {
        if (table_give(m->tables, p, (unsigned)__builtin_ctzll(size)))
            return;
        table_outside(m->tables, (unsigned)__builtin_ctzll(size), -1);
    }
    if (m->jemalloc)
        m->sdallocx(p, size, m->flags | FP_MALLOCX_LG_ALIGN(__builtin_ctzll(size)));
    else
        free(p);
}

void fp_meta_destroy(fp_meta *m)
{
    tables_destroy(m);
    if (m->jemalloc && !put_spare(m)) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "arena.%u.destroy", m->arena);
        m->mallctl(cmd, NULL, NULL, NULL, 0);
    }
    m->jemalloc = 0;
}

void fp_meta_read_counters(const fp_meta *src, fp_meta_counters *c)
{
    FP_META_COUNTERS(FP_COUNTER_COPY)
    c->jemalloc = src->jemalloc;
    c->arena = src->arena;
}
