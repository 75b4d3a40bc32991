/* meta.c - host metadata in a private jemalloc arena, or libc. */
#define _GNU_SOURCE
#include "meta.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

fabpool_status fp_meta_init(fp_meta *m, fabpool_metadata mode)
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

void fp_meta_count(fp_meta *m, size_t size, int held)
{
    if (held)
        atomic_fetch_add_explicit(&m->bytes, size, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&m->bytes, size, memory_order_relaxed);
}

void *fp_meta_alloc_aligned(fp_meta *m, size_t size)
{
    int lg = __builtin_ctzll(size);
    void *p = m->jemalloc ? m->mallocx(size, m->flags | FP_MALLOCX_ZERO | FP_MALLOCX_LG_ALIGN(lg))
                          : aligned_alloc(size, size);
    if (!p)
        return NULL;
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
    if (m->jemalloc)
        m->sdallocx(p, size, m->flags | FP_MALLOCX_LG_ALIGN(__builtin_ctzll(size)));
    else
        free(p);
}

void fp_meta_destroy(fp_meta *m)
{
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
