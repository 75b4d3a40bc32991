/* addrmap.h - a hash table from a block's address to its record: open
 * addressing with linear probing, at most three quarters full (a smaller
 * table stays in the cache: the table of blocks is read at every free of a
 * medium block, docs/performance.md), deletion by backward
 * shift (no tombstones, so a lookup never walks a long chain of them).  Keys
 * are nonzero addresses; 0 marks an empty slot.  No lock: the caller holds
 * the one that guards the table. */
#ifndef FP_ADDRMAP_H
#define FP_ADDRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"

typedef struct fp_addrmap_slot {
    uint64_t key;
    void *val;
} fp_addrmap_slot;

typedef struct fp_addrmap {
    fp_addrmap_slot *slots;   /* cap slots, cap a power of two (or 0) */
    size_t cap, n;
    unsigned shift;           /* 64 - log2(cap) */
    fp_meta *meta;
} fp_addrmap;

void fp_addrmap_init(fp_addrmap *m, fp_meta *meta);
void fp_addrmap_destroy(fp_addrmap *m);
/* Blocks are at least 256-byte aligned: the low bits carry nothing. */
static inline size_t fp_addrmap_slot_of(const fp_addrmap *m, uint64_t key)
{
    return (size_t)(((key >> 8) * 0x9E3779B97F4A7C15ull) >> m->shift);
}

/* The table grown for `more` keys beyond those held (fp_addrmap_reserve's slow side). */
int fp_addrmap_grow(fp_addrmap *m, size_t more);
/* Room for `more` keys beyond those held, so that as many fp_addrmap_put
 * calls cannot fail: 0, or -1 without host memory (the table as it was). */
static inline int fp_addrmap_reserve(fp_addrmap *m, size_t more)
{
    return 4 * (m->n + more) <= 3 * m->cap ? 0 : fp_addrmap_grow(m, more);
}
/* Adds key -> val (key not held; room reserved). */
void fp_addrmap_put(fp_addrmap *m, uint64_t key, void *val);
/* The value of key, or NULL. */
static inline void *fp_addrmap_get(const fp_addrmap *m, uint64_t key)
{
    if (!m->n)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = fp_addrmap_slot_of(m, key); m->slots[i].key; i = (i + 1) & mask)
        if (m->slots[i].key == key)
            return m->slots[i].val;
    return NULL;
}
/* Removes key (held) and returns its value. */
void *fp_addrmap_del(fp_addrmap *m, uint64_t key);

#endif
