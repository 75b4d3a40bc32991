/* arena_index.h - the host tables beside an arena's records that say what
 * starts at an address of the reservation, a byte or an id per quantum in
 * leaves of address space (arena.h holds them): the direct index of the
 * blocks given out (fp_bidx) and the blocks' states that thread caches read
 * (fp_mstate).  Made and freed in arena_index.c, under the pool lock but
 * for fp_mstate_at's readers. */
#ifndef FP_ARENA_INDEX_H
#define FP_ARENA_INDEX_H

#include <stdatomic.h>
#include <stdint.h>

#include "arena_rec.h"
#include "meta.h"

/* The table of blocks of an arena of small blocks (the medium one), a direct index: the record id of the block
 * given out at each quantum of the reservation (0: none), in leaves of 1 << FP_BIDX_LEAF_SHIFT bytes of address
 * space, each made before the arena first maps memory there (fp_arena_index_reserve) and freed when it no longer
 * maps any: 4 bytes of host memory per 256 bytes the arena maps, rounded out to leaves.  A lookup, an insert and
 * a delete are a load or a store where the hash table's probes and backward shift took about 100 instructions
 * of a medium block's pair (docs/design.md, "Records and the table of blocks").  Pool lock held. */
#define FP_BIDX_LEAF_SHIFT 21u
#define FP_BIDX_LEAF_IDS ((1u << FP_BIDX_LEAF_SHIFT) >> FP_PIECE_UNIT_SHIFT)
typedef struct fp_bidx {
    fp_rid **leaves;                   /* NULL until the arena first maps memory */
    uint64_t base, size;               /* the reservation */
    size_t n;                          /* the ids it holds */
} fp_bidx;
/* The entry of addr (a multiple of the quantum in the reservation; leaves made), or NULL where no leaf is. */
static inline fp_rid *fp_bidx_at(const fp_bidx *x, uint64_t addr)
{
    uint64_t off = addr - x->base;
    fp_rid *leaf = x->leaves[off >> FP_BIDX_LEAF_SHIFT];
    return leaf ? leaf + ((off >> FP_PIECE_UNIT_SHIFT) & (FP_BIDX_LEAF_IDS - 1)) : NULL;
}
/* The leaves over [va, va + size) made, and the index of leaves over the reservation [rbase, rbase + rsize)
 * at the first call: 0, or -1 without host memory (what was made stays, for fp_bidx_leaf_free or
 * fp_bidx_free). */
int fp_bidx_reserve(fp_bidx *x, fp_meta *meta, uint64_t rbase, uint64_t rsize, uint64_t va, uint64_t size);
/* Leaf l (where made) back to the metadata allocator; and every leaf and the index. */
void fp_bidx_leaf_free(fp_bidx *x, fp_meta *meta, uint64_t l);
void fp_bidx_free(fp_bidx *x, fp_meta *meta);

/* The states of the blocks of an arena whose blocks thread caches may hold (the medium arena: docs/design.md,
 * "Medium blocks"), read without a lock: a byte per quantum of the reservation, in leaves of
 * 1 << FP_MSTATE_LEAF_SHIFT bytes of address space, each made when the arena first gives out a block there and
 * kept until destroy.  A block start's byte: 0, no live block a cache may take (the slow path, under the pool
 * lock, says what is there); 1..FP_MSTATE_MAX, a live block of lo + that many quanta; FP_MSTATE_CACHED, a
 * block in a thread cache: free to its caller, given out to the arena.  Written under the pool lock, except by
 * the thread whose cache takes a block (code -> CACHED) or gives it out again (CACHED -> code). */
#define FP_MSTATE_LEAF_SHIFT 21u
#define FP_MSTATE_MAX 254u
#define FP_MSTATE_CACHED 255u
typedef struct fp_mstate {
    uint64_t base, end;                /* the reservation's */
    uint64_t lo, hi;                   /* the sizes with a code: (lo, hi], multiples of the quantum */
    _Atomic(_Atomic uint8_t *) *leaves;  /* NULL: no states kept */
} fp_mstate;

/* The state byte of the block that would start at addr, or NULL where no leaf holds it (no lock). */
static inline _Atomic uint8_t *fp_mstate_at(const fp_mstate *m, uint64_t addr)
{
    uint64_t off = addr - m->base;
    if (off >= m->end - m->base)
        return NULL;
    _Atomic uint8_t *leaf = atomic_load_explicit(&m->leaves[off >> FP_MSTATE_LEAF_SHIFT], memory_order_acquire);
    return leaf ? leaf + ((off & ((1ull << FP_MSTATE_LEAF_SHIFT) - 1)) >> FP_PIECE_UNIT_SHIFT) : NULL;
}
/* fp_mstate_at of an address known to lie in the reservation (the page map sent it to the arena, or it is a
 * block's base) in a table that keeps states: no range test. */
static inline _Atomic uint8_t *fp_mstate_in(const fp_mstate *m, uint64_t addr)
{
    uint64_t off = addr - m->base;
    _Atomic uint8_t *leaf = atomic_load_explicit(&m->leaves[off >> FP_MSTATE_LEAF_SHIFT], memory_order_acquire);
    return leaf ? leaf + ((off & ((1ull << FP_MSTATE_LEAF_SHIFT) - 1)) >> FP_PIECE_UNIT_SHIFT) : NULL;
}
/* The code of a block of n bytes (a multiple of the quantum), 0 if none. */
static inline unsigned fp_mstate_code(const fp_mstate *m, uint64_t n)
{
    return n > m->lo && n <= m->hi ? (unsigned)((n - m->lo) >> FP_PIECE_UNIT_SHIFT) : 0;
}

/* Keeps states for the reservation [base, base + size) and block sizes (lo, hi]: 0, or -1 without host
 * memory; the leaf of addr made (NULL: without host memory, or outside); every leaf freed. */
int fp_mstate_init(fp_mstate *m, fp_meta *meta, uint64_t base, uint64_t size, uint64_t lo, uint64_t hi);
_Atomic uint8_t *fp_mstate_make(fp_mstate *m, fp_meta *meta, uint64_t addr);
void fp_mstate_free(fp_mstate *m, fp_meta *meta);

#endif
