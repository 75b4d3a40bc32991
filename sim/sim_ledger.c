/* sim_ledger.c - what the simulated driver holds: cuMemGetInfo, the ledger
 * of allocations, handles, mappings and fds that tests read (fabsim.h), and
 * the bytes a simulated machine holds across processes. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_mem.h"

/* ------------------------------------------------------------ info, ledger */

SIM_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    ENTER(cuMemGetInfo);
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *c = sim_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT; /* H200: without a context, INVALID_CONTEXT */
    pthread_mutex_lock(&sim_lock);
    uint64_t held = sim_held_dev(c->dev);
    pthread_mutex_unlock(&sim_lock);
    *total = sim_capacity;
    *free_b = held > sim_capacity ? 0 : sim_capacity - held;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS && free_b && total) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

static void ledger(fabsim_ledger *l)
{
    settle_all();
    for (phys *p = physs; p; p = p->next) {
        check_exports(p);
        l->allocations++;
        l->exported_fds += (uint64_t)p->nexp;
        if (p->host) {
            l->bytes_held_host += p->size;
            continue;
        }
        l->bytes_held += p->size;
        if (p->dev >= 0 && p->dev < FABSIM_MAX_DEVICES)
            l->bytes_held_dev[p->dev] += p->size;
    }
    for (handle *h = handles; h; h = h->next)
        l->handles += (uint64_t)h->refs;
    l->mappings = nmaps;
    for (size_t i = 0; i < nmaps; i++)
        l->bytes_mapped += maps[i].size;
    l->reservations = nresv;
    for (dmabuf *d = dmabufs; d; d = d->next)
        l->dmabuf_fds++;
    /* cuMemAlloc's blocks and cuMemAllocAsync's pools (what each reserves, its live blocks and the bytes it
     * keeps) are held as cuMemCreate's are: cuMemGetInfo counts them, and so does a real device's used memory */
    for (legacy *x = legacies; x; x = x->next) {
        l->legacy_allocs++;
        if (!x->pooled && x->dev >= 0 && x->dev < FABSIM_MAX_DEVICES) {
            l->bytes_held += x->size;
            l->bytes_held_dev[x->dev] += x->size;
        }
    }
    for (int d = 0; d < FABSIM_MAX_DEVICES; d++) {
        l->bytes_held += mempools[d].reserved_bytes;
        l->bytes_held_dev[d] += mempools[d].reserved_bytes;
    }
}

SIM_API uint64_t fabsim_machine_held_bytes(int dev)
{
    char pre[128];
    snprintf(pre, sizeof pre, "/memfd:fabsim:%s:dev%d", sim_machine, dev);
    size_t prelen = strlen(pre);
    enum { MAXI = 65536 };
    static uint64_t inos[MAXI], sizes[MAXI];
    size_t n = 0;
    DIR *proc = opendir("/proc");
    if (!proc)
        return 0;
    struct dirent *pe;
    while ((pe = readdir(proc))) {
        if (pe->d_name[0] < '0' || pe->d_name[0] > '9')
            continue;
        char path[300], link[300];
        snprintf(path, sizeof path, "/proc/%s/fd", pe->d_name);
        DIR *fds = opendir(path);
        if (fds) {
            struct dirent *fe;
            while ((fe = readdir(fds))) {
                char fp[600];
                snprintf(fp, sizeof fp, "%s/%s", path, fe->d_name);
                ssize_t k = readlink(fp, link, sizeof link - 1);
                if (k <= 0)
                    continue;
                link[k] = '\0';
                if (strncmp(link, pre, prelen) != 0 || (link[prelen] != ' ' && link[prelen] != '\0'))
                    continue;
                struct stat st;
                if (stat(fp, &st) != 0)
                    continue;
                size_t i = 0;
                while (i < n && inos[i] != (uint64_t)st.st_ino)
                    i++;
                if (i == n && n < MAXI)
                    inos[n] = (uint64_t)st.st_ino, sizes[n++] = (uint64_t)st.st_size;
            }
            closedir(fds);
        }
        snprintf(path, sizeof path, "/proc/%s/maps", pe->d_name);
        FILE *m = fopen(path, "r");
        if (!m)
            continue;
        char line[512];
        while (fgets(line, sizeof line, m)) {
            char *at = strstr(line, pre);
            if (!at || (at[prelen] != ' ' && at[prelen] != '\n' && at[prelen] != '\0'))
                continue;
            unsigned long long lo, hi, off, ino;
            char perms[8], devs[16];
            if (sscanf(line, "%llx-%llx %7s %llx %15s %llu", &lo, &hi, perms, &off, devs, &ino) != 6)
                continue;
            size_t i = 0;
            while (i < n && inos[i] != ino)
                i++;
            if (i == n && n < MAXI)
                inos[n] = ino, sizes[n++] = hi - lo;
            else if (i < n && sizes[i] < hi - lo)
                sizes[i] = hi - lo;
        }
        fclose(m);
    }
    closedir(proc);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    return total;
}

SIM_API int fabsim_range_mapped(const void *va, size_t n)
{
    pthread_mutex_lock(&sim_lock);
    int ok = sim_check_range((uint64_t)(uintptr_t)va, n, 1, -1) == 0;
    pthread_mutex_unlock(&sim_lock);
    return ok;
}

SIM_API int fabsim_get_ledger(fabsim_ledger *out)
{
    if (!out)
        return -1;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&sim_lock);
    ledger(out);
    pthread_mutex_unlock(&sim_lock);
    return 0;
}
