/* host_copy.c - sleep's host copies (host_copy.h): made and filled by an
 * offload, kept by a wake with sleep_keep_host and used again, freed. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "host_copy.h"
#include "vmm.h"

/* Host copies kept from the last wake: pieces mapped in one reservation. */
typedef struct fp_hpiece {
    uint64_t va, size;
    int used;
} fp_hpiece;

struct fp_host_cache {
    uint64_t stage_va, stage_size;
    fp_hpiece *pc;
    size_t n;
};

static void human(char *buf, size_t n, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
}

/* Waits for the GPU work on `stream` (NULL: the whole context). */
fabpool_status fp_sleep_sync(struct fabpool *p, void *stream, const char *why)
{
    CUresult r = fp_device_sync(&p->ch, stream);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, stream ? "cuStreamSynchronize" : "cuCtxSynchronize", "waiting for GPU work %s", why);
    return FABPOOL_OK;
}

/* Unmaps one host copy (*va becomes 0) and counts it out.  A refusal of the
 * driver (tried twice) leaves it, and the first one goes into *st.  `what`
 * names it in the message. */
static void host_piece_free(struct fabpool *p, uint64_t *va, uint64_t size, const char *what, fabpool_status *st)
{
    if (!*va)
        return;
    CUresult cr = fp_vmm_unmap(&p->ch, *va, size);
    if (cr != CUDA_SUCCESS) {
        if (*st == FABPOOL_OK)
            *st = fp_drv_error(cr, "cuMemUnmap", "freeing %s (%llu bytes at 0x%llx) (tried twice)", what,
                               (unsigned long long)size, (unsigned long long)*va);
        return;
    }
    atomic_fetch_sub(&p->sleep_host_bytes, size);
    atomic_fetch_sub(&p->sleep_host_copies, 1);
    *va = 0;
}

/* Frees the reservation the host copies were mapped in (*va becomes 0), once
 * none is left in it: a host copy the driver would not unmap when its map
 * failed (listed as stuck, vmm.h) is unmapped first, and where the driver
 * refuses again the reservation stays for a later try. */
static fabpool_status host_range_free(struct fabpool *p, uint64_t *va, uint64_t size, const char *what)
{
    if (!*va)
        return FABPOOL_OK;
    fp_mapping left;
    CUresult cr = fp_chunk_unstick_range(&p->ch, *va, size, 1, &left);
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemUnmap", "unmapping a host copy at 0x%llx that the driver would not unmap "
                            "when its map failed (tried twice; it stays mapped, and the address range of %s "
                            "reserved, for the next try)", (unsigned long long)left.va, what);
    cr = fp_vmm_unreserve(&p->ch, *va, size);
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemAddressFree", "freeing the address range of %s (%llu bytes) (tried twice)",
                            what, (unsigned long long)size);
    *va = 0;
    return FABPOOL_OK;
}

/* Unmaps the host copies and frees their reservation; idempotent, so that a
 * failure can be retried.  Pool lock held. */
fabpool_status fp_host_release(struct fabpool *p, struct fp_sleep *r)
{
    fabpool_status st = FABPOOL_OK;
    for (size_t i = 0; i < r->n; i++)
        host_piece_free(p, &r->e[i].host_va, r->e[i].host_size, "the host copy of a chunk", &st);
    return st != FABPOOL_OK ? st : host_range_free(p, &r->stage_va, r->stage_size, "the host copies");
}

static void cache_free_meta(struct fabpool *p, struct fp_host_cache *c)
{
    fp_meta_free(&p->meta, c->pc, c->n * sizeof *c->pc);
    fp_meta_free(&p->meta, c, sizeof *c);
}

/* Frees the kept host copies: unmaps every piece, frees the reservation.
 * What the driver refuses to unmap (twice) stays in the cache, and the
 * status says so.  Pool lock held. */
fabpool_status fp_host_cache_release(struct fabpool *p)
{
    struct fp_host_cache *c = p->host_cache;
    if (!c)
        return FABPOOL_OK;
    fabpool_status st = FABPOOL_OK;
    for (size_t i = 0; i < c->n; i++)
        host_piece_free(p, &c->pc[i].va, c->pc[i].size, "a kept host copy", &st);
    /* where a piece stays, the reservation stays for it; a later call tries again */
    if (st != FABPOOL_OK ||
        (st = host_range_free(p, &c->stage_va, c->stage_size, "the kept host copies")) != FABPOOL_OK)
        return st;
    cache_free_meta(p, c);
    p->host_cache = NULL;
    return FABPOOL_OK;
}

/* The kept host copies for the chunks of r marked `copy`, if every one finds
 * an unused piece of its size (rounded to hg) and none is left over: then
 * each such chunk gets its piece (host_va), r takes the reservation, and the
 * cache is gone (1).  0: they do not fit, nothing changed.  Pool lock held. */
static int cache_take(struct fabpool *p, struct fp_sleep *r, size_t hg)
{
    struct fp_host_cache *c = p->host_cache;
    size_t need = 0;
    for (size_t i = 0; i < r->n; i++)
        need += r->e[i].copy;
    if (!c || need != c->n || !need)
        return 0;
    for (size_t k = 0; k < c->n; k++) {
        if (!c->pc[k].va)
            return 0; /* a piece an earlier release could not free: made anew */
        c->pc[k].used = 0;
    }
    size_t k0 = 0; /* pieces are kept in the order of the chunks that used them: a repeat finds them in turn */
    for (size_t i = 0; i < r->n; i++) {
        fp_slept *e = &r->e[i];
        if (!e->copy)
            continue;
        uint64_t hs = fp_round_up(e->size, hg);
        size_t k = k0 < c->n && !c->pc[k0].used && c->pc[k0].size == hs ? k0 : c->n;
        for (size_t j = 0; k == c->n && j < c->n; j++)
            if (!c->pc[j].used && c->pc[j].size == hs)
                k = j;
        if (k == c->n) {
            for (size_t j = 0; j < r->n; j++)
                r->e[j].host_va = r->e[j].host_size = 0;
            return 0;
        }
        c->pc[k].used = 1;
        e->host_va = c->pc[k].va;
        e->host_size = hs;
        k0 = k + 1;
    }
    r->stage_va = c->stage_va;
    r->stage_size = c->stage_size;
    cache_free_meta(p, c);
    p->host_cache = NULL;
    return 1;
}

/* The host copies of r still mapped (n of them; r->stage_va set, no cache
 * held) and their reservation become the cache: 0, or -1 without host
 * memory for the list (nothing changed).  Pool lock held. */
static int cache_from(struct fabpool *p, struct fp_sleep *r, size_t n)
{
    struct fp_host_cache *c = fp_meta_alloc(&p->meta, sizeof *c);
    fp_hpiece *pc = c && n ? fp_meta_alloc(&p->meta, n * sizeof *pc) : NULL;
    if (!c || (n && !pc)) {
        fp_meta_free(&p->meta, c, sizeof *c);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++) {
        fp_slept *e = &r->e[i];
        if (!e->host_va)
            continue;
        pc[k++] = (fp_hpiece){e->host_va, e->host_size, 0};
        e->host_va = e->host_size = 0;
    }
    c->pc = pc;
    c->n = n;
    c->stage_va = r->stage_va;
    c->stage_size = r->stage_size;
    r->stage_va = r->stage_size = 0;
    p->host_cache = c;
    return 0;
}

/* How many of r's chunks have a host copy mapped. */
static size_t host_mapped(const struct fp_sleep *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->e[i].host_va != 0;
    return n;
}

/* Wake with sleep_keep_host: the host copies of r become the cache instead
 * of being freed (a cache from an earlier sleep, which a sleep with offload
 * has used or freed already, is freed first).  Where r has no copies (a
 * discard) an earlier cache stays; where there is no host memory for the
 * list, r's copies are freed as without the option.  Pool lock held. */
fabpool_status fp_host_keep(struct fabpool *p, struct fp_sleep *r)
{
    size_t n = host_mapped(r);
    if (!n || !r->stage_va) /* nothing to keep (a discard): a cache from before stays as it is */
        return fp_host_release(p, r);
    fabpool_status st = fp_host_cache_release(p);
    if (st != FABPOOL_OK)
        return st;
    return cache_from(p, r, n) == 0 ? FABPOOL_OK : fp_host_release(p, r);
}

int fp_host_give_up(struct fabpool *p, struct fp_sleep *r)
{
    if (fp_host_release(p, r) == FABPOOL_OK)
        return 0;
    /* what the driver would not let go (host copies, one stuck where its map failed) and the reservation they
     * lie in are kept as the cache is, so that fabpool_trim, the next offload or destroy frees them; a pool
     * whose offload failed holds no cache (it took or freed the one it had before reserving) */
    if (!r->stage_va || fp_host_cache_release(p) != FABPOOL_OK || cache_from(p, r, host_mapped(r)) != 0)
        return -1;
    return 1;
}

/* Copies every chunk marked `copy` into the host copies kept from the last
 * wake (cache_take gave them), on stream, and waits for the copies. */
static fabpool_status offload_to_kept(struct fabpool *p, struct fp_sleep *r, void *stream, uint64_t total)
{
    for (size_t i = 0; i < r->n; i++) {
        fp_slept *e = &r->e[i];
        if (!e->copy)
            continue;
        CUresult cr = fp_device_copy(&p->ch, e->host_va, e->va, e->size, stream);
        if (cr != CUDA_SUCCESS)
            return fp_drv_error(cr, "cuMemcpyDtoDAsync", "copying a chunk of %llu bytes at 0x%llx to host memory "
                                "kept from the last wake; the pool stays awake", (unsigned long long)e->size,
                                (unsigned long long)e->va);
    }
    fabpool_status sst = fp_sleep_sync(p, stream, "copying the pool's memory to host memory (the pool stays awake)");
    if (sst == FABPOOL_OK)
        atomic_store(&p->sleep_host_reused, total);
    return sst;
}

/* The refusal of a host copy of hs bytes (total in all) that `call` failed
 * to make or map on NUMA node numa (stuck: the driver kept it mapped). */
static fabpool_status host_map_error(CUresult cr, const char *call, uint64_t hs, uint64_t total, int numa, int stuck)
{
    if (strcmp(call, "cuMemCreate"))
        return fp_drv_error(cr, call, "mapping a host copy of %llu bytes for the offload%s; the pool stays awake",
                            (unsigned long long)hs, stuck ? " (its undo, cuMemUnmap, was refused twice too)" : "");
    char a[32], t[32];
    human(a, sizeof a, hs);
    human(t, sizeof t, total);
    if (cr == CUDA_ERROR_OUT_OF_MEMORY)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_sleep: cuMemCreate of %s of pinned host memory "
                        "(NUMA node %d) failed with CUDA_ERROR_OUT_OF_MEMORY, %s in all were needed for the "
                        "offload; the pool stays awake and nothing changed. Free host memory, or sleep "
                        "with FABPOOL_SLEEP_DISCARD", a, numa, t);
    return fp_drv_error(cr, "cuMemCreate", "creating %s of pinned host memory (NUMA node %d) for the "
                        "offload; the pool stays awake", a, numa);
}

/* Copies every chunk marked `copy` into host memory of its own, on stream,
 * and waits for the copies.  On failure the caller frees what was made
 * (host_release).  Pool lock held, context current. */
fabpool_status fp_host_offload(struct fabpool *p, struct fp_sleep *r, void *stream)
{
    CUmemAllocationProp hp;
    size_t hg = 0;
    CUresult cr = fp_vmm_host_prop(&p->ch, &hp, &hg);
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemGetAllocationGranularity", "asking the granularity of host NUMA memory (node "
                            "%d) for the offload; the pool stays awake", hp.location.id);
    if (hg == 0 || (hg & (hg - 1)))
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "fabpool_sleep: the driver's host memory granularity %zu is not a "
                        "power of two; sleep with FABPOOL_SLEEP_DISCARD", hg);
    uint64_t total = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].copy)
            total += fp_round_up(r->e[i].size, hg);
    if (!total)
        return FABPOOL_OK;
    if (cache_take(p, r, hg)) /* the copies kept from the last wake: no host memory to make */
        return offload_to_kept(p, r, stream, total);
    fabpool_status cst = fp_host_cache_release(p); /* they do not fit: made anew */
    if (cst != FABPOOL_OK) {
        fp_error_append(" (fabpool_sleep: the pool stays awake)");
        return cst;
    }
    uint64_t va = 0;
    cr = fp_vmm_reserve(&p->ch, total, hg, &va);
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemAddressReserve", "reserving %llu bytes of address space for the host copies; "
                            "the pool stays awake", (unsigned long long)total);
    r->stage_va = va;
    r->stage_size = total;
    uint64_t at = va;
    for (size_t i = 0; i < r->n; i++) {
        fp_slept *e = &r->e[i];
        if (!e->copy)
            continue;
        uint64_t hs = fp_round_up(e->size, hg);
        const char *call = NULL;
        int stuck = 0;
        cr = fp_vmm_map_new(&p->ch, at, hs, &hp, FP_MAP_HOST, &call, &stuck);
        if (cr != CUDA_SUCCESS)
            return host_map_error(cr, call, hs, total, hp.location.id, stuck);
        e->host_va = at;
        e->host_size = hs;
        atomic_fetch_add(&p->sleep_host_bytes, hs);
        atomic_fetch_add(&p->sleep_host_copies, 1);
        cr = fp_device_copy(&p->ch, at, e->va, e->size, stream);
        if (cr != CUDA_SUCCESS)
            return fp_drv_error(cr, "cuMemcpyDtoDAsync", "copying a chunk of %llu bytes at 0x%llx to host memory; "
                                "the pool stays awake", (unsigned long long)e->size, (unsigned long long)e->va);
        at += hs;
    }
    return fp_sleep_sync(p, stream, "copying the pool's memory to host memory (the pool stays awake)");
}

