/* space.c - a pool's reservation: made, its page map and free ranges set
 * up over it, checked, freed (space.h). */
#include "space.h"

#include "array.h"
#include "error.h"
#include "sizeclass.h"
#include "vmm.h"

void fp_space_init(fp_space *sp, fp_chunks *ch, fp_meta *meta)
{
    fp_lock_init(&sp->lock, FP_LOCK_POOL, 0, "pool");
    sp->ch = ch;
    sp->meta = meta;
}

fabpool_status fp_space_reserve(fp_space *sp, uint64_t gran, uint64_t size)
{
    sp->gran = gran;
    sp->gran_shift = fp_log2_floor(gran);
    sp->page_shift = sp->gran_shift < FP_PAGE_SHIFT ? sp->gran_shift : FP_PAGE_SHIFT;
    uint64_t base = 0;
    CUresult r = fp_vmm_reserve(sp->ch, size, 0, &base);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemAddressReserve", "reserving %llu bytes of address space (lower it with "
                            "FABPOOL_CONF=reserve:...)", (unsigned long long)size);
    sp->va.base = base;
    sp->va.size = size;
    return FABPOOL_OK;
}

fabpool_status fp_space_map_init(fp_space *sp)
{
    uint64_t va_base = sp->va.base, va_size = sp->va.size;
    if (fp_map_init(&sp->map, sp->meta, &sp->lock, va_base, va_size, sp->page_shift) != 0 ||
        fp_va_init(&sp->va, sp->meta, va_base, va_size) != 0) {
        sp->va.base = va_base; /* fp_space_destroy frees the reservation */
        sp->va.size = va_size;
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the page map of %llu bytes of address space",
                        (unsigned long long)va_size);
    }
    return FABPOOL_OK;
}

fabpool_status fp_space_destroy(fp_space *sp)
{
    fabpool_status st = FABPOOL_OK;
    fp_map_destroy(&sp->map);
    uint64_t va_base = sp->va.base, va_size = sp->va.size;
    if (sp->va.free)
        fp_va_destroy(&sp->va);
    CUresult r;
    if (va_base && (r = fp_vmm_unreserve(sp->ch, va_base, va_size)) != CUDA_SUCCESS)
        st = fp_drv_error(r, "cuMemAddressFree", "freeing the pool's reservation of %llu bytes (tried twice; the "
                          "address range stays reserved)", (unsigned long long)va_size);
    fp_lock_destroy(&sp->lock);
    return st;
}

int fp_space_free_range(fp_space *sp, uint64_t va, uint64_t size)
{
    fp_space_assert_locked(sp);
    uint64_t at = va, end = va + size;
    int bad = 0;
    if (fp_chunks_stuck(sp->ch)) {
        size_t n;
        const fp_mapping *m = fp_chunk_mappings(sp->ch, &n);
        for (size_t i = FP_ARRAY_LOWER(m, n, fp_mapping, va, va); i < n && m[i].va < end; i++) {
            if (m[i].kind != FP_MAP_STUCK)
                continue;
            if (m[i].va > at)
                bad |= fp_va_free(&sp->va, at, m[i].va - at);
            fp_chunk_stuck_hold(sp->ch, m[i].va);
            at = m[i].va + m[i].size;
        }
    }
    if (at < end)
        bad |= fp_va_free(&sp->va, at, end - at);
    return bad ? -1 : 0;
}

fabpool_status fp_space_unstick(fp_space *sp)
{
    fp_space_assert_locked(sp);
    fabpool_status first = FABPOOL_OK;
    size_t n, i = 0;
    const fp_mapping *m = fp_chunk_mappings(sp->ch, &n);
    while (fp_chunks_stuck(sp->ch) && i < n) {
        fp_mapping e = m[i];
        CUresult r = e.kind == FP_MAP_STUCK ? fp_chunk_unmap_stuck(sp->ch, e.va, e.size) : CUDA_ERROR_UNKNOWN;
        if (r == CUDA_SUCCESS) { /* off the list: i is the next one */
            if (e.held)
                fp_va_free(&sp->va, e.va, e.size);
            m = fp_chunk_mappings(sp->ch, &n);
            continue;
        }
        if (e.kind == FP_MAP_STUCK && first == FABPOOL_OK)
            first = fp_drv_error(r, "cuMemUnmap", "unmapping a mapping of %llu bytes at 0x%llx that the driver "
                                 "would not unmap before (it stays listed; fabpool_collect, fabpool_trim and "
                                 "fabpool_destroy try again)", (unsigned long long)e.size, (unsigned long long)e.va);
        i++;
    }
    return first;
}

fabpool_status fp_space_check_ranges(const fp_space *sp, fp_walk *w) { return fp_va_check(&sp->va, w); }

/* The chunks exported for blocks each lie under an arena's chunk: both ends in the page map. */
fabpool_status fp_space_check_kept(const fp_space *sp, const fp_walk *w)
{
    for (size_t i = 0; i < w->n_kept; i++) {
        const fp_ival *x = &w->kept[i];
        if (!fp_map_get(&sp->map, x->lo) || !fp_map_get(&sp->map, x->hi - 1))
            return FP_WALK_FAIL("[chunk.kept] the chunk exported for a block at 0x%llx (%llu bytes) is empty, "
                                "overlaps the one before, or lies outside every arena", FP_ULL(x->lo),
                                FP_ULL(x->hi - x->lo));
    }
    return FABPOOL_OK;
}

fabpool_status fp_space_check_used(const fp_space *sp, fp_walk *w) { return fp_va_check_used(&sp->va, w); }

fabpool_status fp_space_check_pages(const fp_space *sp, fp_walk *w) { return fp_map_check_count(&sp->map, w); }
