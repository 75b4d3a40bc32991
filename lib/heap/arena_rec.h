/* arena_rec.h - an arena's records (fp_piece, arena.h says what they
 * hold): pages of FP_PIECE_SLOTS slots of 32 bytes, aligned to their 4 KiB
 * (so that a record's page is found from its address), in a directory
 * whose index, with the slot's offset, makes a record's 32-bit id.  Each page keeps
 * its spare records on a list, and the pages with spares are listed.  A
 * split or a merge takes or gives a record without a call to the metadata
 * allocator (a call each cost about as much as the rest of a medium block's
 * allocation; take and give are inline: they are on every medium block's
 * path); a page goes back when all of it is spare and more than
 * FP_RECS_SPARE_MAX records are spare besides.  Pool lock held. */
#ifndef FP_ARENA_REC_H
#define FP_ARENA_REC_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"

/* A piece's size is counted in units of 256 bytes (the arenas' quantum, the
 * alignment cudaMalloc promises): a constant shift, where the arena's own
 * would be read again after every store to a record. */
#define FP_PIECE_UNIT_SHIFT 8u

/* A record's id: its page's index in the directory times the page's bytes
 * (FP_PIECE_PAGE_BYTES), plus its slot's offset in the page (32 bytes per
 * slot, slots 1..FP_PIECE_SLOTS - 1: slot 0 is the page's header, so that 0
 * names no record).  An id counted in bytes, not in slots, is turned into
 * its record by a shift, a load and an add, with no scaling of the id (two
 * instructions of five, a dozen times per medium block's pair); the
 * directory then holds at most 2^20 pages (133 million records, 4 GiB of
 * them, per arena: a medium arena's blocks of 4 KiB and more fill 250 GiB
 * of device memory before its records run out, a failure for host memory
 * then). */
typedef uint32_t fp_rid;

/* A block or a free range of an arena: 32 bytes, two to a cache line, its
 * links 32-bit ids (a record of pointers took 64: the records of the bench's
 * uniform shape did not stay in the cache between its batches), its size in
 * quanta (fp_piece_size): up to 1 TiB in quanta of 256 bytes, more than a
 * device maps (a run is mapped memory). */
typedef struct fp_piece {
    uint64_t base;
    uint32_t size_q;
    uint16_t bin;                      /* a free range's */
    uint16_t state;                    /* FP_LARGE_* (not a char: a store to it would alias every pointer) */
    fp_rid anext, aprev;               /* the pieces touching it, in address order (0: the run ends) */
    fp_rid next, prev;                 /* a free range: its bin's list (a spare record: its page's spares) */
} fp_piece;

_Static_assert(sizeof(fp_piece) == 32, "a record is 32 bytes");

#define FP_PIECE_PAGE_SHIFT 12u        /* an id's page: id >> FP_PIECE_PAGE_SHIFT */
#define FP_PIECE_PAGE_BYTES (1u << FP_PIECE_PAGE_SHIFT)
#define FP_PIECE_SLOTS ((unsigned)(FP_PIECE_PAGE_BYTES / sizeof(fp_piece)))
typedef struct fp_piece_page {         /* slot 0 of its page */
    uint32_t idx;                      /* in the arena's directory of pages */
    uint32_t n_spare;
    fp_rid spare;                      /* its spare records (through next) */
    uint32_t avail_next, avail_prev;   /* the pages that have spare records (index + 1; 0: none) */
    uint32_t unused[3];
} fp_piece_page;

/* The most spare records kept beyond a page that is all spare: splits and
 * merges then make no call to the metadata allocator in the steady state. */
#define FP_RECS_SPARE_MAX 1024u

/* The spare records kept apart from their pages, last given first taken: a fit takes about one record and a
 * merge gives about one back, so most takes and gives are a pop and a push here, without the page's list
 * and count and the list of pages with spares. */
#define FP_RECS_CACHE 16u

typedef struct fp_recs {
    fp_meta *meta;
    fp_piece_page **pages;             /* the directory (NULL: an index not in use) */
    /* Beside it, each page's address less its first id: id r's record is at
     * rbase[r >> FP_PIECE_PAGE_SHIFT] + r, with no mask of the slot (an
     * integer: the difference may point outside any object).  Each lookup
     * of an id is a shift, a load and an add. */
    uintptr_t *rbase;
    size_t n_pages, cap_pages, cap_rbase;
    uint32_t avail;                    /* the pages that have spare records (index + 1; 0: none) */
    size_t n_spare;                    /* spare records in all (those of cache[] too) */
    uint32_t n_cache;                  /* spare records in cache[], off their pages' lists (their pages stay) */
    fp_rid cache[FP_RECS_CACHE];
} fp_recs;

/* The record of id r (NULL for 0), of an id that is not 0, and the id of record p. */
static inline fp_piece *fp_rec_of(const fp_recs *rs, fp_rid r)
{
    return (fp_piece *)(rs->rbase[r >> FP_PIECE_PAGE_SHIFT] + (uintptr_t)r);
}
static inline fp_piece *fp_rec_at(const fp_recs *rs, fp_rid r) { return r ? fp_rec_of(rs, r) : NULL; }
static inline fp_rid fp_rec_id(const fp_piece *p)
{
    uintptr_t at = (uintptr_t)p;
    const fp_piece_page *pg = (const fp_piece_page *)(at & ~(uintptr_t)(FP_PIECE_PAGE_BYTES - 1));
    return pg->idx << FP_PIECE_PAGE_SHIFT | (fp_rid)(at & (FP_PIECE_PAGE_BYTES - 1));
}

/* New pages until n records are spare (fp_recs_reserve's slow side): 0, or -1. */
int fp_recs_grow(fp_recs *rs, size_t n);
/* Makes sure n records are spare, so that what follows cannot fail for host memory: 0, or -1. */
static inline int fp_recs_reserve(fp_recs *rs, size_t n) { return rs->n_spare >= n ? 0 : fp_recs_grow(rs, n); }

/* Page pg onto, and off, the list of pages with spares. */
static inline void fp_recs_avail_push(fp_recs *rs, fp_piece_page *pg)
{
    pg->avail_prev = 0;
    pg->avail_next = rs->avail;
    if (rs->avail)
        rs->pages[rs->avail - 1]->avail_prev = pg->idx + 1;
    rs->avail = pg->idx + 1;
}

static inline void fp_recs_avail_remove(fp_recs *rs, fp_piece_page *pg)
{
    if (pg->avail_prev)
        rs->pages[pg->avail_prev - 1]->avail_next = pg->avail_next;
    else
        rs->avail = pg->avail_next;
    if (pg->avail_next)
        rs->pages[pg->avail_next - 1]->avail_prev = pg->avail_prev;
    pg->avail_next = pg->avail_prev = 0;
}
/* Page pg, all spare, back to the metadata allocator. */
void fp_recs_page_free(fp_recs *rs, fp_piece_page *pg);
/* Every page freed and the directory emptied. */
void fp_recs_free(fp_recs *rs);

/* A spare record (fp_recs_reserve made sure there is one; the caller sets every field): *rid its id. */
static inline fp_piece *fp_rec_take(fp_recs *rs, fp_rid *rid)
{
    rs->n_spare--;
    if (rs->n_cache) {
        fp_rid c = rs->cache[--rs->n_cache];
        *rid = c;
        return fp_rec_of(rs, c);
    }
    fp_piece_page *pg = rs->pages[rs->avail - 1];
    fp_rid r = pg->spare;
    fp_piece *p = (fp_piece *)(void *)((char *)pg + (r & (FP_PIECE_PAGE_BYTES - 1)));
    *rid = r;
    pg->spare = p->next;
    if (!--pg->n_spare)
        fp_recs_avail_remove(rs, pg);
    return p;
}

/* Record p, of id r, back to the spares: into the cache while it has room, else onto its page's list. */
static inline void fp_rec_give(fp_recs *rs, fp_piece *p, fp_rid r)
{
    if (rs->n_cache < FP_RECS_CACHE) {
        rs->cache[rs->n_cache++] = r;
        rs->n_spare++;
        return;
    }
    fp_piece_page *pg = (fp_piece_page *)((uintptr_t)p & ~(uintptr_t)(FP_PIECE_PAGE_BYTES - 1));
    *p = (fp_piece){.next = pg->spare};
    pg->spare = r;
    if (!pg->n_spare++)
        fp_recs_avail_push(rs, pg);
    rs->n_spare++;
    if (pg->n_spare == FP_PIECE_SLOTS - 1 && rs->n_spare > FP_RECS_SPARE_MAX + FP_PIECE_SLOTS)
        fp_recs_page_free(rs, pg);
}

#endif
