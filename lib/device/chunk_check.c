/* chunk_check.c - fabpool_check's walks of the device layer's lists
 * (chunk.h): the chunks exported for blocks, the export anchor, the
 * registry, and the mappings the driver would not unmap. */
#include <fcntl.h>

#include "array.h"
#include "chunk_check.h"

#define FAIL FP_WALK_FAIL
#define ULL FP_ULL

/* The chunks exported for blocks (fabpool_block_export): sorted, apart, an
 * fd each in a pool of fds; each added to w->kept (the caller checks that
 * it lies under an arena's chunk) and its fd to w->fds. */
static fabpool_status check_kept(const fp_chunks *ch, fp_walk *w)
{
    uint64_t end = 0;
    for (size_t i = 0; i < ch->n_kept; i++) {
        const fp_xchunk *x = &ch->kept[i];
        if (!x->size || x->va < end)
            return FAIL("[chunk.kept] the chunk exported for a block at 0x%llx (%llu bytes) is empty, overlaps the one "
                        "before, or lies outside every arena", ULL(x->va), ULL(x->size));
        if ((x->fd >= 0) != (ch->handle_type == FABPOOL_HANDLE_POSIX_FD))
            return FAIL("[chunk.kept] the chunk exported for a block at 0x%llx %s an fd in a pool of handle type %d",
                        ULL(x->va), x->fd >= 0 ? "keeps" : "lacks", (int)ch->handle_type);
        if (fp_walk_keep(w, x->va, x->size, "the chunk exported for a block", x) != 0)
            return FP_WALK_HOST_FAIL();
        end = x->va + x->size;
        w->fds += x->fd >= 0;
    }
    return FABPOOL_OK;
}

/* The export anchor, if held, is an open fd of a chunk of the pool's own, mapped whole where it says. */
static fabpool_status check_anchor(const fp_chunks *ch)
{
    if (!ch->anchor_size)
        return FABPOOL_OK;
    size_t i = FP_ARRAY_LOWER(ch->reg.m, ch->reg.n, fp_mapping, va, ch->anchor_va);
    const fp_mapping *m = i < ch->reg.n ? &ch->reg.m[i] : NULL;
    if (!m || m->va != ch->anchor_va || m->size != ch->anchor_size || !FP_MAP_SLEEPS(m->kind))
        return FAIL("[chunk.anchor] the export anchor names a chunk at 0x%llx (%llu bytes) that the pool does not map "
                    "as its own: its fd would keep memory the pool gave back", ULL(ch->anchor_va),
                    ULL(ch->anchor_size));
    if (ch->anchor_fd < 0 || fcntl(ch->anchor_fd, F_GETFD) == -1)
        return FAIL("[chunk.anchor] the export anchor's fd %d is not open", ch->anchor_fd);
    return FABPOOL_OK;
}

fabpool_status fp_chunks_kept_check(const fp_chunks *ch, fp_walk *w)
{
    fabpool_status st = check_kept(ch, w);
    if (st != FABPOOL_OK)
        return st;
    if (w->fds + (ch->anchor_size != 0) != atomic_load(&ch->exported_fds))
        return FAIL("[buffer.stats] the buffers add up to %llu for %s (and %d for the export anchor), the pool's "
                    "counter says %llu", ULL(w->fds), "exported_fds", ch->anchor_size != 0,
                    ULL(atomic_load(&ch->exported_fds)));
    return check_anchor(ch);
}

fabpool_status fp_chunks_registry_check(const fp_chunks *ch) { return fp_mapreg_check(&ch->reg); }

fabpool_status fp_chunks_stuck_check(const fp_chunks *ch, fp_walk *w)
{
    for (size_t i = 0; i < ch->reg.n; i++) {
        const fp_mapping *m = &ch->reg.m[i];
        if (m->kind != FP_MAP_STUCK)
            continue;
        /* one whose range its user still holds lies in that user's range: only a held one is the range's holder */
        if (m->held && fp_walk_use(w, m->va, m->size, "a mapping the driver would not unmap", m) != 0)
            return FP_WALK_HOST_FAIL();
        w->n_chunks++;
        w->chunk_bytes += m->size;
    }
    return FABPOOL_OK;
}
