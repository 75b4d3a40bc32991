/* sim_records.c - the simulated driver's memory records (sim_mem.h) and the
 * bookkeeping every memory entry point shares: exported fds, a physical
 * allocation's life (its references, mappings and dma-bufs), handles, and
 * the lookups of mappings, reservations and cuMemAlloc blocks by address. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_mem.h"

phys *physs;
handle *handles;
uint64_t next_handle = 0x7f5a00001000ull;
mapping *maps;
size_t nmaps, capmaps;
range *resv;
size_t nresv, capresv;
legacy *legacies;
dmabuf *dmabufs;
sim_mempool mempools[FABSIM_MAX_DEVICES];

void sim_vmm_init(void)
{
    for (int i = 0; i < FABSIM_MAX_DEVICES; i++)
        mempools[i].dev = i;
}

/* ------------------------------------------------------------ bookkeeping */

static int fd_is(int fd, const phys *p)
{
    struct stat st;
    return fcntl(fd, F_GETFD) != -1 && fstat(fd, &st) == 0 && st.st_ino == p->ino && st.st_dev == p->st_dev;
}

/* forgets exported fds the program has closed (the sim cannot see close()) */
void check_exports(phys *p)
{
    int k = 0;
    for (int i = 0; i < p->nexp; i++)
        if (fd_is(p->exp[i], p))
            p->exp[k++] = p->exp[i];
    p->nexp = k;
}

/* The kernel just gave out fd again: an earlier export's fd of that number
 * was closed since, whatever it now refers to (a record of a chunk exported
 * twice would otherwise count the new fd twice). */
void forget_fd(int fd)
{
    for (phys *p = physs; p; p = p->next) {
        int k = 0;
        for (int i = 0; i < p->nexp; i++)
            if (p->exp[i] != fd)
                p->exp[k++] = p->exp[i];
        p->nexp = k;
    }
}

/* An fd the sim just got from the kernel: any export recorded under its
 * number was closed since (the sim cannot see close()), whatever the number
 * refers to now (the same memory again, say: then it would count twice). */
int fresh_fd(int fd)
{
    for (phys *p = physs; fd >= 0 && p; p = p->next) {
        int k = 0;
        for (int i = 0; i < p->nexp; i++)
            if (p->exp[i] != fd)
                p->exp[k++] = p->exp[i];
        p->nexp = k;
    }
    return fd;
}

void phys_unlink(phys *p)
{
    for (phys **pp = &physs; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (handle **hp = &handles; *hp;) {
        if ((*hp)->ph == p) {
            handle *h = *hp;
            *hp = h->next;
            free(h);
        } else {
            hp = &(*hp)->next;
        }
    }
    free(p->exp);
    free(p);
}

/* Drops the sim's own fd once no handle or mapping is left, and the record
 * once no exported fd is left either. */
void phys_settle(phys *p)
{
    if (p->refs > 0 || p->maps > 0 || p->dmabufs > 0)
        return;
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
        /* handles die with the last reference and mapping (the real driver
         * frees them: using one afterwards crashes it) */
        for (handle **hp = &handles; *hp;) {
            if ((*hp)->ph == p) {
                handle *h = *hp;
                *hp = h->next;
                free(h);
            } else {
                hp = &(*hp)->next;
            }
        }
    }
    check_exports(p);
    if (p->nexp == 0)
        phys_unlink(p);
}

/* forgets dma-bufs the program has closed, dropping their references */
static void check_dmabufs(void)
{
    for (dmabuf **dp = &dmabufs; *dp;) {
        dmabuf *d = *dp;
        struct stat st;
        if (fcntl(d->fd, F_GETFD) != -1 && fstat(d->fd, &st) == 0 && st.st_ino == d->ino && st.st_dev == d->st_dev) {
            dp = &d->next;
            continue;
        }
        *dp = d->next;
        for (int i = 0; i < d->nph; i++) {
            d->ph[i]->dmabufs--;
            phys_settle(d->ph[i]);
        }
        free(d->ph);
        free(d);
    }
}

void settle_all(void)
{
    check_dmabufs();
    for (phys *p = physs, *n; p; p = n) {
        n = p->next;
        if (p->refs == 0 && p->maps == 0)
            phys_settle(p);
    }
}

uint64_t sim_held_dev(int dev)
{
    settle_all();
    uint64_t s = 0;
    for (phys *p = physs; p; p = p->next)
        if (p->dev == dev)
            s += p->size;
    for (legacy *l = legacies; l; l = l->next)
        if (l->dev == dev && !l->pooled)
            s += l->size;
    return s + mempools[dev].reserved_bytes;
}

uint64_t held_host(void)
{
    uint64_t s = 0;
    for (phys *p = physs; p; p = p->next)
        if (p->host)
            s += p->size;
    return s;
}

handle *find_handle(CUmemGenericAllocationHandle v)
{
    for (handle *h = handles; h; h = h->next)
        if (h->value == v)
            return h;
    return NULL;
}

handle *new_handle(phys *p, unsigned types)
{
    handle *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->value = next_handle;
    next_handle += 0x40;
    h->ph = p;
    h->refs = 1;
    h->types = types;
    h->next = handles;
    handles = h;
    p->refs++;
    return h;
}

/* index of the first mapping with va + size > addr */
size_t map_lower(uint64_t addr)
{
    size_t lo = 0, hi = nmaps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (maps[mid].va + maps[mid].size <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

mapping *map_at(uint64_t addr)
{
    size_t i = map_lower(addr);
    return i < nmaps && maps[i].va <= addr ? &maps[i] : NULL;
}

range *resv_at(uint64_t addr)
{
    for (size_t i = 0; i < nresv; i++)
        if (resv[i].va <= addr && addr < resv[i].va + resv[i].size)
            return &resv[i];
    return NULL;
}

/* [va, va+n) inside reservations (possibly adjacent ones) */
int reserved(uint64_t va, uint64_t n)
{
    uint64_t cur = va;
    while (cur < va + n) {
        range *r = resv_at(cur);
        if (!r)
            return 0;
        cur = r->va + r->size;
    }
    return 1;
}

legacy *legacy_at(uint64_t addr)
{
    for (legacy *l = legacies; l; l = l->next)
        if (l->va <= addr && addr < l->va + l->size)
            return l;
    return NULL;
}

int sim_check_range(uint64_t va, size_t n, int write, int dev)
{
    uint64_t cur = va, end = va + n;
    if (end < va)
        return -1;
    while (cur < end) {
        mapping *m = map_at(cur);
        if (m) {
            /* a mapping is usable from a device only with access granted to that
             * device (cuMemSetAccess), whichever device holds its memory */
            unsigned long long acc = 0;
            for (int d = 0; d < FABSIM_MAX_DEVICES; d++)
                if (dev < 0 || d == dev)
                    acc |= m->access[d];
            if (!(acc & (write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ)))
                return -1;
            cur = m->va + m->size;
            continue;
        }
        legacy *l = legacy_at(cur);
        if (!l)
            return -1;
        cur = l->va + l->size;
    }
    return 0;
}

/* an address the program treats as device memory: reserved or cuMemAlloc'ed */
int is_device_addr(uint64_t va) { return resv_at(va) || legacy_at(va); }


void sim_vmm_after_fork(void)
{
    for (dmabuf *d = dmabufs, *nx; d; d = nx) {
        nx = d->next;
        free(d->ph);
        free(d);
    }
    dmabufs = NULL;
    for (phys *p = physs, *nx; p; p = nx) {
        nx = p->next;
        if (p->fd >= 0)
            close(p->fd);
        free(p->exp);
        free(p);
    }
    physs = NULL;
    for (handle *h = handles, *nx; h; h = nx) {
        nx = h->next;
        free(h);
    }
    handles = NULL;
    for (size_t i = 0; i < nresv; i++)
        munmap((void *)(uintptr_t)resv[i].va, resv[i].size);
    nresv = 0;
    nmaps = 0;
    for (legacy *l = legacies, *nx; l; l = nx) {
        nx = l->next;
        munmap((void *)(uintptr_t)l->va, l->size);
        free(l);
    }
    legacies = NULL;
    memset(mempools, 0, sizeof mempools);
    sim_vmm_init();
}
