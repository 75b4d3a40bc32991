/* addrmap.h - a hash table from a block's address to its record: open
 * addressing with linear probing, at most half full, deletion by backward
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
/* Room for `more` keys beyond those held, so that as many fp_addrmap_put
 * calls cannot fail: 0, or -1 without host memory (the table as it was). */
int fp_addrmap_reserve(fp_addrmap *m, size_t more);
/* Adds key -> val (key not held; room reserved). */
void fp_addrmap_put(fp_addrmap *m, uint64_t key, void *val);
/* The value of key, or NULL. */
void *fp_addrmap_get(const fp_addrmap *m, uint64_t key);
/* Removes key (held) and returns its value. */
void *fp_addrmap_del(fp_addrmap *m, uint64_t key);

#endif
