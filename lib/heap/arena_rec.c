/* arena_rec.c - an arena's pages of records and their directory
 * (arena_rec.h). */
#include "arena_rec.h"

#include "array.h"

/* A new page of spare records in a free index of the directory: 0, or -1. */
static int page_new(fp_recs *rs)
{
    size_t i = 0;
    while (i < rs->n_pages && rs->pages[i])
        i++;
    if (i >= (size_t)1 << (32 - FP_PIECE_PAGE_SHIFT) ||
        (i == rs->n_pages && (FP_ARRAY_RESERVE(rs->meta, rs->pages, rs->n_pages, rs->cap_pages, i + 1, 16) != 0 ||
                              FP_ARRAY_RESERVE(rs->meta, rs->rbase, rs->n_pages, rs->cap_rbase, i + 1, 16) != 0)))
        return -1;
    fp_piece_page *pg = fp_meta_alloc_aligned(rs->meta, FP_PIECE_PAGE_BYTES);
    if (!pg)
        return -1;
    if (i == rs->n_pages)
        rs->n_pages++;
    rs->pages[i] = pg;
    rs->rbase[i] = (uintptr_t)pg - ((uintptr_t)i << FP_PIECE_PAGE_SHIFT);
    pg->idx = (uint32_t)i;
    fp_piece *recs = (fp_piece *)(void *)pg;
    pg->spare = NULL;
    for (unsigned k = FP_PIECE_SLOTS; k-- > 1;) {
        recs[k].next = pg->spare;
        pg->spare = &recs[k];
    }
    pg->n_spare = FP_PIECE_SLOTS - 1;
    fp_recs_avail_push(rs, pg);
    rs->n_spare += FP_PIECE_SLOTS - 1;
    return 0;
}

int fp_recs_grow(fp_recs *rs, size_t n)
{
    while (rs->n_spare < n)
        if (page_new(rs) != 0)
            return -1;
    return 0;
}

void fp_recs_page_free(fp_recs *rs, fp_piece_page *pg)
{
    fp_recs_avail_remove(rs, pg);
    rs->n_spare -= pg->n_spare;
    rs->pages[pg->idx] = NULL;
    rs->rbase[pg->idx] = 0;
    fp_meta_free_aligned(rs->meta, pg, FP_PIECE_PAGE_BYTES);
}

void fp_recs_free(fp_recs *rs)
{
    for (size_t i = 0; i < rs->n_pages; i++)
        if (rs->pages[i])
            fp_meta_free_aligned(rs->meta, rs->pages[i], FP_PIECE_PAGE_BYTES);
    FP_ARRAY_FREE(rs->meta, rs->pages, rs->cap_pages);
    FP_ARRAY_FREE(rs->meta, rs->rbase, rs->cap_rbase);
    rs->n_pages = 0;
    rs->avail = 0;
    rs->n_spare = 0;
    rs->n_cache = 0;
}
