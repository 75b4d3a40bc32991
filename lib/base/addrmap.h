/* addrmap.h - a hash table from a block's address to a 32-bit value (the
 * arena's record id), in slots of 8 bytes: the key's 32-bit hash and the
 * value, not the key, so that the table of 10,000 blocks is 256 KiB and
 * stays in the cache (the table is read at every free of a medium block,
 * docs/performance.md).  The caller tells a slot of its key from one of
 * another key with the same hash by what the value names (fp_addrmap_next
 * gives the candidates in probe order).  Open addressing with linear
 * probing, at most half full (three quarters made the probes and the
 * deletes' shifts longer for less than they saved in cache), deletion by
 * backward shift (no tombstones, so a lookup never walks a long chain of
 * them).  Values are nonzero; 0 marks an empty slot.  No lock: the caller
 * holds the one that guards the table. */
#ifndef FP_ADDRMAP_H
#define FP_ADDRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"

typedef struct fp_addrmap_slot {
    uint32_t hash, val;
} fp_addrmap_slot;

typedef struct fp_addrmap {
    fp_addrmap_slot *slots;   /* cap slots, cap a power of two (or 0) */
    size_t cap, n;
    unsigned shift;           /* 32 - log2(cap) */
    fp_meta *meta;
} fp_addrmap;

#define FP_ADDRMAP_END ((size_t)-1)

void fp_addrmap_init(fp_addrmap *m, fp_meta *meta);
void fp_addrmap_destroy(fp_addrmap *m);
/* The keys it holds. */
static inline size_t fp_addrmap_count(const fp_addrmap *m) { return m->n; }
/* The value in slot i (one fp_addrmap_next gave). */
static inline uint32_t fp_addrmap_val(const fp_addrmap *m, size_t i) { return m->slots[i].val; }
/* Blocks are at least 256-byte aligned: the low bits carry nothing. */
static inline uint32_t fp_addrmap_hash(uint64_t key) { return (uint32_t)(((key >> 8) * 0x9E3779B97F4A7C15ull) >> 32); }

/* The table grown for `more` keys beyond those held (fp_addrmap_reserve's slow side). */
int fp_addrmap_grow(fp_addrmap *m, size_t more);
/* Room for `more` keys beyond those held, so that as many fp_addrmap_put
 * calls cannot fail: 0, or -1 without host memory (the table as it was). */
static inline int fp_addrmap_reserve(fp_addrmap *m, size_t more)
{
    return 2 * (m->n + more) <= m->cap ? 0 : fp_addrmap_grow(m, more);
}
/* Adds key -> val (val nonzero; key not held; room reserved). */
void fp_addrmap_put(fp_addrmap *m, uint64_t key, uint32_t val);
/* The slots that may hold key (hash h = fp_addrmap_hash(key)), in probe
 * order: the first after slot `after` (FP_ADDRMAP_END: from the start)
 * whose hash is h, or FP_ADDRMAP_END when the probe meets an empty slot. */
static inline size_t fp_addrmap_next(const fp_addrmap *m, uint32_t h, size_t after)
{
    if (!m->n)
        return FP_ADDRMAP_END;
    size_t mask = m->cap - 1;
    for (size_t i = after == FP_ADDRMAP_END ? h >> m->shift : (after + 1) & mask; m->slots[i].val; i = (i + 1) & mask)
        if (m->slots[i].hash == h)
            return i;
    return FP_ADDRMAP_END;
}
/* Empties slot i (a slot fp_addrmap_next gave) and returns its value. */
uint32_t fp_addrmap_del_at(fp_addrmap *m, size_t i);

#endif
