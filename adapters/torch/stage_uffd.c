/* stage_uffd.c - fresh host pages filled by UFFDIO_COPY (stage_uffd.h). */
#define _GNU_SOURCE
#include "stage_uffd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__linux__) && defined(SYS_userfaultfd)
#include <linux/userfaultfd.h>
#endif

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1   /* Linux 5.11: no privilege needed, kernel-mode faults not intercepted */
#endif

static _Atomic uint64_t installed;

static int cmp_range(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

#if defined(__linux__) && defined(SYS_userfaultfd) && defined(UFFDIO_COPY)
static uint64_t page_size(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

int stage_uffd_open(stage_uffd *u, const uint64_t (*at)[2], size_t n)
{
    u->fd = -1;
    u->n = 0;
    u->ranges = NULL;
    uint64_t pg = page_size();
    uint64_t(*r)[2] = n ? calloc(n, sizeof *r) : NULL;
    if (!r)
        return n ? -ENOMEM : -EINVAL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (at[i][1]) {
            r[k][0] = at[i][0] & ~(pg - 1);
            r[k][1] = (at[i][0] + at[i][1] + pg - 1) & ~(pg - 1);
            k++;
        }
    qsort(r, k, sizeof *r, cmp_range);
    size_t m = 0;   /* merged: overlapping or touching ranges are one registration */
    for (size_t i = 0; i < k; i++) {
        if (m && r[i][0] <= r[m - 1][1]) {
            if (r[i][1] > r[m - 1][1])
                r[m - 1][1] = r[i][1];
        } else {
            r[m][0] = r[i][0];
            r[m][1] = r[i][1];
            m++;
        }
    }
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    struct uffdio_api api = {.api = UFFD_API};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api) != 0) {
        int e = errno ? errno : ENOSYS;
        if (fd >= 0)
            close(fd);
        free(r);
        return -e;
    }
    u->fd = fd;
    u->ranges = r;
    for (size_t i = 0; i < m; i++) {
        struct uffdio_register reg = {.range = {r[i][0], r[i][1] - r[i][0]}, .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
            int e = errno;
            stage_uffd_close(u);   /* the ones registered so far */
            return -e;
        }
        u->n = i + 1;
    }
    return 0;
}

/* The bytes from dst (at most len, up to 512 pages) on pages in memory: one
 * mincore for a run of pages kept from an earlier copy, written by memcpy. */
static uint64_t resident_run(const char *dst, uint64_t len)
{
    uint64_t pg = page_size(), base = (uint64_t)(uintptr_t)dst & ~(pg - 1);
    uint64_t end = (uint64_t)(uintptr_t)dst + len, pages = (end - base + pg - 1) / pg;
    unsigned char v[512];
    pages = pages < 512 ? pages : 512;
    if (mincore((void *)(uintptr_t)base, (size_t)(pages * pg), v) != 0)
        return 0;
    uint64_t k = 0;
    while (k < pages && (v[k] & 1))
        k++;
    uint64_t run = base + k * pg > (uint64_t)(uintptr_t)dst ? base + k * pg - (uint64_t)(uintptr_t)dst : 0;
    return run < len ? run : len;
}

/* Whether the page of p is in memory. */
static int resident(const char *p) { return resident_run(p, 1) != 0; }

/* One UFFDIO_COPY of len (whole pages) from src to dst: the bytes it
 * installed, or -errno; -EEXIST where the first page is present. */
static int64_t copy_pages(const stage_uffd *u, char *dst, const char *src, uint64_t len)
{
    struct uffdio_copy c = {.dst = (uint64_t)(uintptr_t)dst, .src = (uint64_t)(uintptr_t)src, .len = len};
    for (;;) {
        if (ioctl(u->fd, UFFDIO_COPY, &c) == 0 || c.copy > 0) {
            atomic_fetch_add_explicit(&installed, (uint64_t)c.copy, memory_order_relaxed);
            return c.copy;
        }
        if (errno != EAGAIN)   /* EAGAIN: the mappings changed under it; try again */
            return -errno;
    }
}

int stage_uffd_put(const stage_uffd *u, char *dst, const char *src, uint64_t len)
{
    if (u->fd < 0) {
        memcpy(dst, src, (size_t)len);
        return 0;
    }
    uint64_t pg = page_size();
    while (len) {
        uint64_t off = (uint64_t)(uintptr_t)dst & (pg - 1), n = pg - off < len ? pg - off : len;
        if (!off && n == pg && resident(dst) == 0) {
            /* whole missing pages: as many as one UFFDIO_COPY takes before a present one */
            int64_t got = copy_pages(u, dst, src, len & ~(pg - 1));
            if (got > 0) {
                dst += got, src += got, len -= (uint64_t)got;
                continue;
            }
            if (got != -EEXIST)
                return (int)got;
        } else if (!resident(dst)) {
            /* a page this copy fills in part: installed whole, zeros around the part (a fresh page's bytes);
             * another lane that fills the rest finds it present (EEXIST) and writes its part with memcpy */
            char *page = aligned_alloc((size_t)pg, (size_t)pg);
            if (!page)
                return -ENOMEM;
            memset(page, 0, (size_t)pg);
            memcpy(page + off, src, (size_t)n);
            int64_t got = copy_pages(u, dst - off, page, pg);
            free(page);
            if (got > 0) {
                dst += n, src += n, len -= n;
                continue;
            }
            if (got != -EEXIST)
                return (int)got;
        }
        uint64_t run = resident_run(dst, len);   /* present: no fault */
        if (run < n)
            run = n;   /* the page was just installed by another lane, or mincore refused: it is present */
        memcpy(dst, src, (size_t)run);
        dst += run, src += run, len -= run;
    }
    return 0;
}

void stage_uffd_close(stage_uffd *u)
{
    if (u->fd < 0)
        return;
    for (size_t i = 0; i < u->n; i++) {
        struct uffdio_range r = {u->ranges[i][0], u->ranges[i][1] - u->ranges[i][0]};
        (void)ioctl(u->fd, UFFDIO_UNREGISTER, &r);
    }
    close(u->fd);   /* closing also gives every page back to ordinary faults */
    free(u->ranges);
    u->fd = -1;
    u->n = 0;
    u->ranges = NULL;
}
#else
int stage_uffd_open(stage_uffd *u, const uint64_t (*at)[2], size_t n)
{
    (void)at;
    (void)n;
    (void)cmp_range;
    u->fd = -1;
    u->n = 0;
    u->ranges = NULL;
    return -ENOSYS;
}

int stage_uffd_put(const stage_uffd *u, char *dst, const char *src, uint64_t len)
{
    (void)u;
    memcpy(dst, src, (size_t)len);
    return 0;
}

void stage_uffd_close(stage_uffd *u) { (void)u; }
#endif

uint64_t stage_uffd_bytes(void)
{
    return atomic_load(&installed);
}
