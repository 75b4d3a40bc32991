/* arena_rec.h - an arena's records (fp_piece, arena.h says what they
 * hold): pages of FP_PIECE_SLOTS slots of 48 bytes, aligned to their 64 KiB
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

/* A record's id, for the tables that map an address to its block (the
 * direct index and the hash table: arena.h), where 4 bytes a quantum keep
 * them half the size of pointers: its page's index in the directory times
 * the page's bytes (FP_PIECE_PAGE_BYTES), plus its slot's offset in the page
 * (slots 1..FP_PIECE_SLOTS - 1: slot 0 is the page's header, so that 0
 * names no record).  An id counted in bytes, not in slots, is turned into
 * its record by a shift, a load and an add; the directory then holds at most
 * 2^16 pages (89 million records per arena: a medium arena's blocks of 4 KiB
 * and more fill 170 GiB of device memory before its records run out, a
 * failure for host memory then).  A record's links are pointers (records
 * sit in pages that never move): a link followed is one load, where an id
 * took four instructions more, a dozen times per medium block's pair. */
typedef uint32_t fp_rid;

/* A block or a free range of an arena: 48 bytes, its links the pieces
 * themselves, its size in quanta (fp_piece_size): up to 1 TiB in quanta of
 * 256 bytes, more than a device maps (a run is mapped memory). */
typedef struct fp_piece {
    uint64_t base;
    uint32_t size_q;
    uint16_t bin;                      /* a free range's */
    uint16_t state;                    /* FP_LARGE_* (not a char: a store to it would alias every pointer) */
    struct fp_piece *anext, *aprev;    /* the pieces touching it, in address order (NULL: the run ends) */
    struct fp_piece *next, *prev;      /* a free range: its bin's list (a spare record: its page's spares) */
} fp_piece;

_Static_assert(sizeof(fp_piece) == 48, "a record is 48 bytes");

/* An id's page: id >> FP_PIECE_PAGE_SHIFT.  Pages of 64 KiB (1,364 records), not 4 KiB (84): a cut reads its
 * block's page header for the id, and a uniform mix's 8,000 records then share a few header lines that stay
 * cached instead of a hundred that did not (0.8 first-level misses a uniform pair). */
#define FP_PIECE_PAGE_SHIFT 16u
#define FP_PIECE_PAGE_BYTES (1u << FP_PIECE_PAGE_SHIFT)
#define FP_PIECE_SLOTS ((unsigned)(FP_PIECE_PAGE_BYTES / sizeof(fp_piece)))
typedef struct fp_piece_page {         /* slot 0 of its page */
    uint32_t idx;                      /* in the arena's directory of pages */
    uint32_t n_spare;
    fp_piece *spare;                   /* its spare records (through next) */
    uint32_t avail_next, avail_prev;   /* the pages that have spare records (index + 1; 0: none) */
} fp_piece_page;

_Static_assert(sizeof(fp_piece_page) <= sizeof(fp_piece), "a page's header fits its slot 0");

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
     * integer: the difference may point outside any object). */
    uintptr_t *rbase;
    size_t n_pages, cap_pages, cap_rbase;
    uint32_t avail;                    /* the pages that have spare records (index + 1; 0: none) */
    size_t n_spare;                    /* spare records in all (those of cache[] too) */
    uint32_t n_cache;                  /* spare records in cache[], off their pages' lists (their pages stay) */
    fp_piece *cache[FP_RECS_CACHE];
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

/* A spare record (fp_recs_reserve made sure there is one; the caller sets every field). */
static inline fp_piece *fp_rec_take(fp_recs *rs)
{
    rs->n_spare--;
    if (rs->n_cache)
        return rs->cache[--rs->n_cache];
    fp_piece_page *pg = rs->pages[rs->avail - 1];
    fp_piece *p = pg->spare;
    pg->spare = p->next;
    if (!--pg->n_spare)
        fp_recs_avail_remove(rs, pg);
    return p;
}

/* Record p back to the spares: into the cache while it has room, else onto its page's list. */
static inline void fp_rec_give(fp_recs *rs, fp_piece *p)
{
    if (rs->n_cache < FP_RECS_CACHE) {
        rs->cache[rs->n_cache++] = p;
        rs->n_spare++;
        return;
    }
    fp_piece_page *pg = (fp_piece_page *)((uintptr_t)p & ~(uintptr_t)(FP_PIECE_PAGE_BYTES - 1));
    *p = (fp_piece){.next = pg->spare};
    pg->spare = p;
    if (!pg->n_spare++)
        fp_recs_avail_push(rs, pg);
    rs->n_spare++;
    if (pg->n_spare == FP_PIECE_SLOTS - 1 && rs->n_spare > FP_RECS_SPARE_MAX + FP_PIECE_SLOTS)
        fp_recs_page_free(rs, pg);
}

#endif
