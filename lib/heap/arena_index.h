/* arena_index.h - the host tables beside an arena's records that say what
 * starts at an address of the reservation, an id and a byte per quantum in
 * leaves of address space (arena.h holds them): the direct index of the
 * blocks given out (fp_bidx) and the blocks' states that thread caches read
 * (fp_mstate), one entry a quantum for both.  Made and freed in
 * arena_index.c, under the pool lock but for fp_mstate_at's readers. */
#ifndef FP_ARENA_INDEX_H
#define FP_ARENA_INDEX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "arena_rec.h"
#include "meta.h"

/* The table of blocks of an arena of small blocks (the medium one), a direct index: at each quantum of the
 * reservation an entry (fp_bent) with the record id of the block given out there (0: none) and, where the arena
 * keeps them, the block's state byte beside it (fp_mstate), so that the block's id and its state are one line
 * (a medium pair reads and writes both: the free the state, the release and the cut the id and the state). In
 * leaves of 1 << FP_BIDX_LEAF_SHIFT bytes of address space, each made before the arena first maps memory there
 * (fp_arena_index_reserve): 5 bytes of host memory per 256 bytes the arena maps, rounded out to leaves.  A leaf
 * is freed when the arena no longer maps any of it, except where states are kept: their readers take no lock,
 * and those leaves stay until the arena's end.  A lookup, an insert and a delete are a load or a store where the
 * hash table's probes and backward shift took about 100 instructions of a medium block's pair (docs/design.md,
 * "Records and the table of blocks").  Pool lock held, but for fp_mstate_at's readers. */
#define FP_BIDX_LEAF_SHIFT 21u
#define FP_BIDX_LEAF_IDS ((1u << FP_BIDX_LEAF_SHIFT) >> FP_PIECE_UNIT_SHIFT)
typedef struct __attribute__((packed)) fp_bent {
    _Atomic uint8_t state;             /* fp_mstate (first: the byte's address is the entry's) */
    fp_rid rid;                        /* pool lock */
} fp_bent;
typedef struct fp_bidx {
    _Atomic(fp_bent *) *leaves;        /* NULL until the arena first maps memory or keeps states */
    uint64_t base, size;               /* the reservation */
    size_t n;                          /* the ids it holds */
    int keep;                          /* leaves kept until the end: states are kept in them */
} fp_bidx;
/* The entry of addr (a multiple of the quantum in the reservation; leaves made), or NULL where no leaf is. */
static inline fp_bent *fp_bidx_at(const fp_bidx *x, uint64_t addr)
{
    uint64_t off = addr - x->base;
    fp_bent *leaf = atomic_load_explicit(&x->leaves[off >> FP_BIDX_LEAF_SHIFT], memory_order_relaxed);
    return leaf ? leaf + ((off >> FP_PIECE_UNIT_SHIFT) & (FP_BIDX_LEAF_IDS - 1)) : NULL;
}
/* The entry whose state byte is at f (fp_mstate_at's). */
static inline fp_bent *fp_bent_of_state(_Atomic uint8_t *f)
{
    return (fp_bent *)(void *)((char *)f - offsetof(fp_bent, state));
}
/* The leaves over [va, va + size) made, and the index of leaves over the reservation [rbase, rbase + rsize)
 * at the first call: 0, or -1 without host memory (what was made stays, for fp_bidx_leaf_free or
 * fp_bidx_free). */
int fp_bidx_reserve(fp_bidx *x, fp_meta *meta, uint64_t rbase, uint64_t rsize, uint64_t va, uint64_t size);
/* Leaf l (where made) back to the metadata allocator (never one of an index that keeps its leaves: its caller,
 * fp_arena_index_drop, tests keep); and every leaf and the index. */
void fp_bidx_leaf_free(fp_bidx *x, fp_meta *meta, uint64_t l);
void fp_bidx_free(fp_bidx *x, fp_meta *meta);

/* The states of the blocks of an arena whose blocks thread caches may hold (the medium arena: docs/design.md,
 * "Medium blocks"), read without a lock: the state bytes of the direct index's entries (fp_bent), whose leaves
 * then stay until the arena's end.  A block start's byte: 0, no live block a cache may take (the slow path,
 * under the pool lock, says what is there); 1..FP_MSTATE_MAX, a live block of lo + that many quanta;
 * FP_MSTATE_CACHED, a block in a thread cache: free to its caller, given out to the arena.  Written under the
 * pool lock, except by the thread whose cache takes a block (code -> CACHED) or gives it out again
 * (CACHED -> code).  This handle is a copy (the thread caches hold one): the index of leaves never moves. */
#define FP_MSTATE_MAX 254u
#define FP_MSTATE_CACHED 255u
typedef struct fp_mstate {
    uint64_t base, end;                /* the reservation's */
    uint64_t lo, hi;                   /* the sizes with a code: (lo, hi], multiples of the quantum */
    _Atomic(fp_bent *) *leaves;        /* the direct index's; NULL: no states kept */
} fp_mstate;

/* The state byte of the block that would start at addr, or NULL where no leaf holds it (no lock). */
static inline _Atomic uint8_t *fp_mstate_at(const fp_mstate *m, uint64_t addr)
{
    uint64_t off = addr - m->base;
    if (off >= m->end - m->base)
        return NULL;
    fp_bent *leaf = atomic_load_explicit(&m->leaves[off >> FP_BIDX_LEAF_SHIFT], memory_order_acquire);
    return leaf ? &leaf[(off >> FP_PIECE_UNIT_SHIFT) & (FP_BIDX_LEAF_IDS - 1)].state : NULL;
}
/* fp_mstate_at of an address known to lie in the reservation (the page map sent it to the arena, or it is a
 * block's base) in a table that keeps states: no range test. */
static inline _Atomic uint8_t *fp_mstate_in(const fp_mstate *m, uint64_t addr)
{
    uint64_t off = addr - m->base;
    fp_bent *leaf = atomic_load_explicit(&m->leaves[off >> FP_BIDX_LEAF_SHIFT], memory_order_acquire);
    return leaf ? &leaf[(off >> FP_PIECE_UNIT_SHIFT) & (FP_BIDX_LEAF_IDS - 1)].state : NULL;
}
/* The code of a block of n bytes (a multiple of the quantum), 0 if none. */
static inline unsigned fp_mstate_code(const fp_mstate *m, uint64_t n)
{
    return n > m->lo && n <= m->hi ? (unsigned)((n - m->lo) >> FP_PIECE_UNIT_SHIFT) : 0;
}

/* Keeps states in the index x over the reservation [base, base + size) for block sizes (lo, hi]: its index of
 * leaves made (0, or -1 without host memory) and its leaves kept from then on. */
int fp_mstate_init(fp_mstate *m, fp_bidx *x, fp_meta *meta, uint64_t base, uint64_t size, uint64_t lo, uint64_t hi);

#endif
