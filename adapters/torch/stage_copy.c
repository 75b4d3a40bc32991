/* stage_copy.c - host copies through a pinned staging ring (stage_copy.h). */
#define _GNU_SOURCE
#include "stage_copy.h"
#include "stage_uffd.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* the driver's signatures, with its handles as void * (the same ABI) */
typedef int (*f_host_alloc)(void **, size_t, unsigned);
typedef int (*f_ptr)(void *);
typedef int (*f_pptr)(void **);
typedef int (*f_device_get)(int *, int);
typedef int (*f_retain)(void **, int);
typedef int (*f_release)(int);
typedef int (*f_create)(void **, unsigned);
typedef int (*f_record)(void *, void *);
typedef int (*f_dtoh)(void *, uint64_t, size_t, void *);
typedef int (*f_htod)(uint64_t, const void *, size_t, void *);
#define FN(type, drv, name) ((type)(uintptr_t)(drv)->name)

#define CU_MEMHOSTALLOC_PORTABLE 1u
#define CU_STREAM_NON_BLOCKING 1u
#define CU_EVENT_DISABLE_TIMING 2u
#define HUGE_ALIGN (2u << 20)

typedef struct lane {
    void *buf[2], *ev[2], *stream;
} lane;

struct fabpool_torch_stage {
    fabpool_torch_stage_driver drv;
    int device, cudev;
    void *ctx;
    unsigned nlanes;
    size_t buf_bytes;
    int uffd;                      /* FABPOOL_STAGE_UFFD=1: copies to the host fill fresh pages by UFFDIO_COPY */
    pthread_mutex_t busy;          /* a copy's: taken only in the process that made the ring (pid) */
    pid_t pid;
    lane lanes[FABPOOL_TORCH_STAGE_MAX_LANES];
};

static _Atomic uint64_t host_mapped;
/* 1 once the kernel refused MADV_POPULATE_WRITE (before Linux 5.14): the
 * copies then fault the fresh pages in as they write them */
static atomic_int populate_off;
static _Atomic uint64_t populated;
/* 1 once the kernel refused a userfaultfd (no such call, not allowed, an
 * older kernel): the copies then populate and memcpy as without it */
static atomic_int uffd_off;

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int drv_complete(const fabpool_torch_stage_driver *d)
{
    const void *const *p = (const void *const *)d;
    for (size_t i = 0; i < sizeof(*d) / sizeof(void *); i++)
        if (!p[i])
            return 0;
    return 1;
}

/* Frees lane resources made so far (the ring's context is current). */
static void lanes_free(fabpool_torch_stage *s)
{
    for (unsigned l = 0; l < s->nlanes; l++) {
        lane *ln = &s->lanes[l];
        for (int b = 0; b < 2; b++) {
            if (ln->buf[b])
                FN(f_ptr, &s->drv, mem_free_host)(ln->buf[b]);
            if (ln->ev[b])
                FN(f_ptr, &s->drv, event_destroy)(ln->ev[b]);
            ln->buf[b] = ln->ev[b] = NULL;
        }
        if (ln->stream)
            FN(f_ptr, &s->drv, stream_destroy)(ln->stream);
        ln->stream = NULL;
    }
}

EXPORT int fabpool_torch_stage_create(const fabpool_torch_stage_driver *drv, int device, unsigned lanes,
                                      size_t buffer_bytes, fabpool_torch_stage **out, char *err, size_t errlen)
{
    if (!out)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_create: out is NULL");
    *out = NULL;
    if (!drv || !drv_complete(drv))
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_create: a driver entry point is missing; pass "
                                          "every field of fabpool_torch_stage_driver");
    if (lanes < 1 || lanes > FABPOOL_TORCH_STAGE_MAX_LANES)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_create: %u lanes; give 1 to %d", lanes,
                    FABPOOL_TORCH_STAGE_MAX_LANES);
    if (buffer_bytes < FABPOOL_TORCH_STAGE_MIN_BUFFER || buffer_bytes > FABPOOL_TORCH_STAGE_MAX_BUFFER)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_create: staging buffers of %zu bytes; give %u to %u",
                    buffer_bytes, FABPOOL_TORCH_STAGE_MIN_BUFFER, FABPOOL_TORCH_STAGE_MAX_BUFFER);
    const char *uf = secure_getenv("FABPOOL_STAGE_UFFD");
    if (uf && *uf && strcmp(uf, "0") != 0 && strcmp(uf, "1") != 0)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_create: FABPOOL_STAGE_UFFD='%.40s': give 0 or 1",
                    uf);
    fabpool_torch_stage *s = calloc(1, sizeof(*s));
    if (!s)
        return fail(err, errlen, -ENOMEM, "fabpool_torch_stage_create: out of host memory for the ring");
    s->uffd = uf && strcmp(uf, "1") == 0;
    s->pid = getpid();
    s->drv = *drv;
    s->device = device;
    s->buf_bytes = buffer_bytes;
    if (pthread_mutex_init(&s->busy, NULL) != 0) {
        free(s);
        return fail(err, errlen, -ENOMEM, "fabpool_torch_stage_create: pthread_mutex_init failed");
    }
    int r = FN(f_device_get, drv, device_get)(&s->cudev, device);
    if (r) {
        fail(err, errlen, r, "fabpool_torch_stage_create: cuDeviceGet(%d) failed (CUDA error %d)", device, r);
        goto out_free;
    }
    r = FN(f_retain, drv, primary_ctx_retain)(&s->ctx, s->cudev);
    if (r) {
        fail(err, errlen, r, "fabpool_torch_stage_create: cuDevicePrimaryCtxRetain(%d) failed (CUDA error %d)",
             device, r);
        goto out_free;
    }
    void *was = NULL;
    r = FN(f_pptr, drv, ctx_get_current)(&was);
    if (!r)
        r = FN(f_ptr, drv, ctx_set_current)(s->ctx);
    if (r) {
        fail(err, errlen, r, "fabpool_torch_stage_create: making device %d's context current failed (CUDA error "
             "%d)", device, r);
        goto out_release;
    }
    s->nlanes = lanes;
    for (unsigned l = 0; l < lanes && !r; l++) {
        lane *ln = &s->lanes[l];
        r = FN(f_create, drv, stream_create)(&ln->stream, CU_STREAM_NON_BLOCKING);
        if (r) {
            fail(err, errlen, r, "fabpool_torch_stage_create: cuStreamCreate failed (CUDA error %d)", r);
            break;
        }
        for (int b = 0; b < 2 && !r; b++) {
            r = FN(f_create, drv, event_create)(&ln->ev[b], CU_EVENT_DISABLE_TIMING);
            if (r) {
                fail(err, errlen, r, "fabpool_torch_stage_create: cuEventCreate failed (CUDA error %d)", r);
                break;
            }
            r = FN(f_host_alloc, drv, mem_host_alloc)(&ln->buf[b], buffer_bytes, CU_MEMHOSTALLOC_PORTABLE);
            if (r) {
                ln->buf[b] = NULL;
                fail(err, errlen, r, "fabpool_torch_stage_create: cuMemHostAlloc of a %zu-byte staging buffer "
                     "failed (CUDA error %d); free host memory or set FABPOOL_STAGE_MIB lower", buffer_bytes, r);
            }
        }
    }
    if (r)
        lanes_free(s);
    FN(f_ptr, drv, ctx_set_current)(was);   /* the caller's context again */
    if (r)
        goto out_release;
    *out = s;
    return 0;
out_release:
    FN(f_release, drv, primary_ctx_release)(s->cudev);
out_free:
    pthread_mutex_destroy(&s->busy);
    free(s);
    return r;
}

EXPORT int fabpool_torch_stage_destroy(fabpool_torch_stage *s, char *err, size_t errlen)
{
    if (!s)
        return 0;
    void *was = NULL;
    int r = FN(f_pptr, &s->drv, ctx_get_current)(&was);
    if (!r)
        r = FN(f_ptr, &s->drv, ctx_set_current)(s->ctx);
    if (r)
        return fail(err, errlen, r, "fabpool_torch_stage_destroy: making device %d's context current failed (CUDA "
                    "error %d); the ring is kept", s->device, r);
    for (unsigned l = 0; l < s->nlanes; l++)
        if (s->lanes[l].stream)
            FN(f_ptr, &s->drv, stream_synchronize)(s->lanes[l].stream);
    lanes_free(s);
    FN(f_ptr, &s->drv, ctx_set_current)(was);
    FN(f_release, &s->drv, primary_ctx_release)(s->cudev);
    pthread_mutex_destroy(&s->busy);
    free(s);
    return 0;
}

EXPORT uint64_t fabpool_torch_stage_pinned_bytes(const fabpool_torch_stage *s)
{
    return s ? (uint64_t)s->nlanes * 2u * s->buf_bytes : 0;
}

/* ------------------------------------------------------------ one copy */

/* A part of an item that lies in one fill of a staging buffer. */
typedef struct span {
    uint64_t host, dev, len, at;   /* at: offset in the buffer */
} span;

typedef struct fill {
    size_t lo, hi;                 /* spans [lo, hi) */
} fill;

typedef struct job {
    fabpool_torch_stage *s;
    const span *spans;
    const fill *fills;
    size_t nfills;
    int to_host;
    stage_uffd uf;                 /* fd -1: fresh pages populated ahead, then memcpy */
    atomic_int failed;
    pthread_mutex_t lock;
    int code;
    char msg[256];
} job;

typedef struct lane_arg {
    job *j;
    unsigned l;
} lane_arg;

static void job_fail(job *j, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&j->lock);
    if (!j->code) {
        j->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&j->lock);
    atomic_store(&j->failed, 1);
}

/* Queues the DMA of fill f on the lane's stream (to_host: into buffer b,
 * else out of it) and records the buffer's event after it. */
static int issue(job *j, lane *ln, size_t f, int b)
{
    const fabpool_torch_stage_driver *d = &j->s->drv;
    for (size_t i = j->fills[f].lo; i < j->fills[f].hi; i++) {
        const span *sp = &j->spans[i];
        char *buf = (char *)ln->buf[b] + sp->at;
        int r = j->to_host ? FN(f_dtoh, d, memcpy_dtoh_async)(buf, sp->dev, sp->len, ln->stream)
                           : FN(f_htod, d, memcpy_htod_async)(sp->dev, buf, sp->len, ln->stream);
        if (r) {
            job_fail(j, r, "copying %llu bytes %s device address 0x%llx through the staging ring failed (CUDA "
                     "error %d)", (unsigned long long)sp->len, j->to_host ? "from" : "to",
                     (unsigned long long)sp->dev, r);
            return r;
        }
    }
    int r = FN(f_record, d, event_record)(ln->ev[b], ln->stream);
    if (r)
        job_fail(j, r, "cuEventRecord on a staging lane failed (CUDA error %d)", r);
    return r;
}

static int wait_buf(job *j, lane *ln, int b)
{
    int r = FN(f_ptr, &j->s->drv, event_synchronize)(ln->ev[b]);
    if (r)
        job_fail(j, r, "waiting for a staging copy failed (cuEventSynchronize: CUDA error %d)", r);
    return r;
}

/* Faults in the host pages that fill f will write (a copy to the host), so
 * that the kernel zeroes them while the lane's DMA runs rather than page by
 * page inside the memcpy: one madvise per span, the span widened to whole
 * pages (the pages it touches belong to the same mapping; populating does
 * not change their bytes).  Pages already there (a host copy kept from an
 * earlier pause) cost a page-table walk and no fault.  Advice only: a
 * refusal leaves the faults to the memcpy, as without it. */
static void populate(const job *j, size_t f)
{
#ifdef MADV_POPULATE_WRITE
    if (!j->to_host || j->uf.fd >= 0 || atomic_load_explicit(&populate_off, memory_order_relaxed))
        return;
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    for (size_t i = j->fills[f].lo; i < j->fills[f].hi; i++) {
        const span *sp = &j->spans[i];
        uint64_t lo = sp->host & ~(pg - 1), hi = (sp->host + sp->len + pg - 1) & ~(pg - 1);
        if (madvise((void *)(uintptr_t)lo, (size_t)(hi - lo), MADV_POPULATE_WRITE) == 0) {
            atomic_fetch_add_explicit(&populated, hi - lo, memory_order_relaxed);
        } else if (errno == EINVAL) {
            atomic_store_explicit(&populate_off, 1, memory_order_relaxed);
            return;
        }
    }
#else
    (void)j;
    (void)f;
#endif
}

/* Moves fill f between the lane's buffer b and the host copies. */
static int host_side(job *j, lane *ln, size_t f, int b)
{
    for (size_t i = j->fills[f].lo; i < j->fills[f].hi; i++) {
        const span *sp = &j->spans[i];
        char *buf = (char *)ln->buf[b] + sp->at;
        if (!j->to_host) {
            memcpy(buf, (const void *)(uintptr_t)sp->host, sp->len);
            continue;
        }
        int r = stage_uffd_put(&j->uf, (char *)(uintptr_t)sp->host, buf, sp->len);
        if (r) {
            job_fail(j, r, "filling %llu bytes of a host copy at 0x%llx failed (UFFDIO_COPY: %s); unset "
                     "FABPOOL_STAGE_UFFD", (unsigned long long)sp->len, (unsigned long long)sp->host, strerror(-r));
            return r;
        }
    }
    return 0;
}

static void *lane_run(void *p)
{
    lane_arg *a = p;
    job *j = a->j;
    fabpool_torch_stage *s = j->s;
    lane *ln = &s->lanes[a->l];
    size_t step = s->nlanes, first = a->l;
    int r = FN(f_ptr, &s->drv, ctx_set_current)(s->ctx);
    if (r) {
        job_fail(j, r, "cuCtxSetCurrent on a staging lane failed (CUDA error %d)", r);
        return NULL;
    }
    if (j->to_host) {
        /* two fills in flight; the memcpy out of one overlaps the DMA of the other */
        for (size_t k = 0; k < 2 && first + k * step < j->nfills && !atomic_load(&j->failed); k++)
            if (issue(j, ln, first + k * step, (int)k))
                break;
        for (size_t k = 0, f = first; f < j->nfills && !atomic_load(&j->failed); k++, f += step) {
            int b = (int)(k & 1);
            populate(j, f);   /* the pages' zeroing while the DMA of f runs */
            if (wait_buf(j, ln, b))
                break;
            if (host_side(j, ln, f, b) || (f + 2 * step < j->nfills && issue(j, ln, f + 2 * step, b)))
                break;
        }
    } else {
        for (size_t k = 0, f = first; f < j->nfills && !atomic_load(&j->failed); k++, f += step) {
            int b = (int)(k & 1);
            if (k >= 2 && wait_buf(j, ln, b))
                break;
            if (host_side(j, ln, f, b) || issue(j, ln, f, b))
                break;
        }
    }
    /* nothing of this lane's stays in flight, error or not */
    r = FN(f_ptr, &s->drv, stream_synchronize)(ln->stream);
    if (r)
        job_fail(j, r, "waiting for a staging lane's copies failed (cuStreamSynchronize: CUDA error %d)", r);
    return NULL;
}

EXPORT int fabpool_torch_stage_copy(fabpool_torch_stage *s, const fabpool_torch_stage_item *items, size_t n,
                                    int to_host, char *err, size_t errlen)
{
    if (!s || (n && !items))
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_copy: no ring or no items");
    /* a ring made before this process was forked: a thread of the parent may have held busy at the fork (a copy
     * in flight), a thread the child lacks, and the ring's pinned buffers and streams are of the parent's CUDA
     * context, which does not carry over a fork */
    if (s->pid != getpid())
        return fail(err, errlen, -ENOTSUP, "fabpool_torch_stage_copy: this staging ring was made before this process "
                    "was forked (pid %d made it): CUDA does not carry over a fork; make a ring in the child, started "
                    "with exec or spawn", (int)s->pid);
    uint64_t total = 0;
    size_t nonempty = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].bytes > UINT64_MAX - total)
            return fail(err, errlen, -EOVERFLOW, "fabpool_torch_stage_copy: the items' sizes overflow");
        total += items[i].bytes;
        nonempty += items[i].bytes != 0;
        if (items[i].bytes && (items[i].host > UINT64_MAX - items[i].bytes || items[i].dev > UINT64_MAX -
                                                                                 items[i].bytes))
            return fail(err, errlen, -EOVERFLOW, "fabpool_torch_stage_copy: item %zu wraps the address space", i);
    }
    if (!total)
        return 0;
    uint64_t nf = total / s->buf_bytes + 1;
    if (nf > SIZE_MAX / sizeof(fill) || nonempty > SIZE_MAX / sizeof(span) - nf)
        return fail(err, errlen, -EOVERFLOW, "fabpool_torch_stage_copy: too many items");
    span *spans = malloc((nonempty + nf) * sizeof(span));
    fill *fills = malloc(nf * sizeof(fill));
    if (!spans || !fills) {
        free(spans);
        free(fills);
        return fail(err, errlen, -ENOMEM, "fabpool_torch_stage_copy: out of host memory for %llu items",
                    (unsigned long long)n);
    }
    size_t ns = 0, nfills = 0;
    uint64_t pos = 0;
    fills[0].lo = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t off = 0; off < items[i].bytes;) {
            uint64_t take = items[i].bytes - off;
            if (take > s->buf_bytes - pos)
                take = s->buf_bytes - pos;
            spans[ns++] = (span){items[i].host + off, items[i].dev + off, take, pos};
            pos += take;
            off += take;
            if (pos == s->buf_bytes) {
                fills[nfills++].hi = ns;
                fills[nfills].lo = ns;   /* nf counts one fill past the last full one */
                pos = 0;
            }
        }
    }
    if (pos)
        fills[nfills++].hi = ns;

    job j = {.s = s, .spans = spans, .fills = fills, .nfills = nfills, .to_host = to_host, .uf = {.fd = -1}};
    if (to_host && s->uffd && !atomic_load(&uffd_off)) {
        uint64_t(*at)[2] = malloc(ns * sizeof *at);
        for (size_t i = 0; at && i < ns; i++) {
            at[i][0] = spans[i].host;
            at[i][1] = spans[i].len;
        }
        int e = at ? stage_uffd_open(&j.uf, (const uint64_t(*)[2])at, ns) : -ENOMEM;
        if (e == -ENOSYS || e == -EPERM)
            atomic_store(&uffd_off, 1);   /* the kernel's or its policy's answer for every copy: not asked again */
        free(at);
    }
    atomic_init(&j.failed, 0);
    pthread_mutex_init(&j.lock, NULL);
    pthread_t th[FABPOOL_TORCH_STAGE_MAX_LANES];
    lane_arg args[FABPOOL_TORCH_STAGE_MAX_LANES];
    unsigned started = 0, want = s->nlanes < nfills ? s->nlanes : (unsigned)nfills;
    pthread_mutex_lock(&s->busy);
    for (unsigned l = 0; l < want; l++) {
        args[l] = (lane_arg){&j, l};
        int e = pthread_create(&th[l], NULL, lane_run, &args[l]);
        if (e) {
            job_fail(&j, -e, "starting a staging lane failed (pthread_create: %s)", strerror(e));
            break;
        }
        started++;
    }
    for (unsigned l = 0; l < started; l++)
        pthread_join(th[l], NULL);
    stage_uffd_close(&j.uf);
    pthread_mutex_unlock(&s->busy);
    free(spans);
    free(fills);
    pthread_mutex_destroy(&j.lock);
    if (j.code)
        return fail(err, errlen, j.code, "fabpool_torch_stage_copy: %s", j.msg);
    return 0;
}

/* ------------------------------------------------------------ pageable host copies */

static uint64_t page_round(uint64_t bytes)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    return (bytes + pg - 1) / pg * pg;
}

EXPORT int fabpool_torch_stage_host_map(uint64_t bytes, uint64_t *out, char *err, size_t errlen)
{
    if (!out)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_host_map: out is NULL");
    *out = 0;
    if (!bytes)
        return 0;
    if (bytes > (uint64_t)SIZE_MAX / 2)
        return fail(err, errlen, -ENOMEM, "fabpool_torch_stage_host_map: %llu bytes is more than the address "
                    "space", (unsigned long long)bytes);
    size_t len = (size_t)page_round(bytes);
    size_t over = len >= HUGE_ALIGN ? len + HUGE_ALIGN : len;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        return fail(err, errlen, -e, "fabpool_torch_stage_host_map: mmap of %zu bytes for a host copy failed (%s); "
                    "free host memory or pause without enable_cpu_backup", len, strerror(e));
    }
    char *a = p;
    if (over != len) {
        /* 2 MiB aligned, so that huge pages can back it; the slack is given back */
        a = (char *)(((uintptr_t)p + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
        if (a > p)
            munmap(p, (size_t)(a - p));
        if (p + over > a + len)
            munmap(a + len, (size_t)(p + over - (a + len)));
#ifdef MADV_HUGEPAGE
        (void)madvise(a, len, MADV_HUGEPAGE);   /* advice only: small pages where the kernel has none */
#endif
    }
    atomic_fetch_add(&host_mapped, (uint64_t)len);
    *out = (uint64_t)(uintptr_t)a;
    return 0;
}

/* A large host copy's pages go back to the kernel from several threads
 * before its munmap: freeing them is the kernel's work page by page (87 ms
 * for 3 GiB of small pages on an H100's host: copies filled by UFFDIO_COPY
 * have no huge pages), and MADV_DONTNEED frees them under the mapping's
 * read lock, so pieces of one mapping are freed side by side, where munmap
 * frees them on one thread.  At least ZAP_MIN_THREADS: two threads freed
 * those pages slower than munmap alone (112 ms), four to sixteen in about
 * 31 ms (docs/results/h100-stage/stage-probe-4.txt).  The munmap that
 * follows finds no page.  Advice only: a piece its thread could not take is
 * freed by the munmap. */
#define ZAP_PIECE (64ull << 20)
#define ZAP_MIN_THREADS 4u
#define ZAP_THREADS 16u

typedef struct zap {
    char *at;
    size_t len;
} zap;

static void *zap_run(void *p)
{
    const zap *z = p;
    (void)madvise(z->at, z->len, MADV_DONTNEED);
    return NULL;
}

/* Zap threads for len bytes: one per ZAP_PIECE, at most the CPUs the process may run on and ZAP_THREADS; 0
 * where fewer than ZAP_MIN_THREADS would run. */
static unsigned zap_threads(size_t len)
{
    uint64_t n = len / ZAP_PIECE;
    cpu_set_t cs;
    unsigned cpus = sched_getaffinity(0, sizeof cs, &cs) == 0 ? (unsigned)CPU_COUNT(&cs) : 1u;
    if (n > cpus)
        n = cpus;
    if (n > ZAP_THREADS)
        n = ZAP_THREADS;
    return n >= ZAP_MIN_THREADS ? (unsigned)n : 0u;
}

unsigned stage_host_zap(char *a, size_t len, unsigned n)
{
    if (n > ZAP_THREADS)
        n = ZAP_THREADS;
    if (n < 1 || len == 0)
        return 0;
    zap z[ZAP_THREADS];
    pthread_t th[ZAP_THREADS];
    int started[ZAP_THREADS] = {0};
    unsigned ran = 0;
    size_t piece = (len / n + HUGE_ALIGN - 1) & ~(size_t)(HUGE_ALIGN - 1);
    for (unsigned i = 0; i < n; i++) {
        size_t off = (size_t)i * piece;
        z[i] = (zap){a + off, off >= len ? 0 : (len - off < piece ? len - off : piece)};
        if (z[i].len)
            started[i] = pthread_create(&th[i], NULL, zap_run, &z[i]) == 0;
    }
    for (unsigned i = 0; i < n; i++)
        if (started[i]) {
            pthread_join(th[i], NULL);
            ran++;
        }
    return ran;
}

EXPORT int fabpool_torch_stage_host_unmap(uint64_t addr, uint64_t bytes, char *err, size_t errlen)
{
    if (!addr || !bytes)
        return 0;
    size_t len = (size_t)page_round(bytes);
    if (addr % (uint64_t)sysconf(_SC_PAGESIZE) || addr > UINT64_MAX - len)
        return fail(err, errlen, -EINVAL, "fabpool_torch_stage_host_unmap: 0x%llx is not a host copy's address",
                    (unsigned long long)addr);
    unsigned n = zap_threads(len);
    if (n)
        stage_host_zap((char *)(uintptr_t)addr, len, n);
    if (munmap((void *)(uintptr_t)addr, len) != 0) {
        int e = errno;
        return fail(err, errlen, -e, "fabpool_torch_stage_host_unmap: munmap(0x%llx, %zu) failed (%s)",
                    (unsigned long long)addr, len, strerror(e));
    }
    atomic_fetch_sub(&host_mapped, (uint64_t)len);
    return 0;
}

EXPORT uint64_t fabpool_torch_stage_populated_bytes(void)
{
    return atomic_load(&populated);
}

EXPORT uint64_t fabpool_torch_stage_uffd_bytes(void)
{
    return stage_uffd_bytes();
}

EXPORT uint64_t fabpool_torch_stage_host_bytes(void)
{
    return atomic_load(&host_mapped);
}
