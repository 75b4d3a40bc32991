/* meta.c - host metadata in a private jemalloc arena, or libc. */
#define _GNU_SOURCE
#include "meta.h"

#include <dlfcn.h>
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

static int find_jemalloc(fp_meta *m, void *where)
{
    m->mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(where, "mallctl");
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
    if (m->mallctl("arenas.create", &m->arena, &sz, NULL, 0) != 0) {
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
    if (m->jemalloc) {
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
