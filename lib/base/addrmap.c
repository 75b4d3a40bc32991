/* addrmap.c - block address -> 32-bit value (addrmap.h). */
#include "addrmap.h"

#include <string.h>


void fp_addrmap_init(fp_addrmap *m, fp_meta *meta)
{
    memset(m, 0, sizeof *m);
    m->meta = meta;
}

void fp_addrmap_destroy(fp_addrmap *m)
{
    if (m->slots)
        fp_meta_free(m->meta, m->slots, m->cap * sizeof *m->slots);
    fp_addrmap_init(m, m->meta);
}

static void put(fp_addrmap *m, uint32_t h, uint32_t val)
{
    size_t mask = m->cap - 1, i = h >> m->shift;
    while (m->slots[i].val)
        i = (i + 1) & mask;
    m->slots[i].hash = h;
    m->slots[i].val = val;
    m->n++;
}

int fp_addrmap_grow(fp_addrmap *m, size_t more)
{
    size_t cap = m->cap ? m->cap : 64;
    while (2 * (m->n + more) > cap)
        cap *= 2;
    if (cap > (size_t)1 << 32)
        return -1; /* the hash's bits name a slot */
    fp_addrmap_slot *s = fp_meta_alloc(m->meta, cap * sizeof *s); /* zeroed: every slot empty */
    if (!s)
        return -1;
    fp_addrmap old = *m;
    m->slots = s;
    m->cap = cap;
    m->n = 0;
    m->shift = 32u - (unsigned)__builtin_ctzll(cap);
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].val)
            put(m, old.slots[i].hash, old.slots[i].val);
    if (old.slots)
        fp_meta_free(m->meta, old.slots, old.cap * sizeof *old.slots);
    return 0;
}

void fp_addrmap_put(fp_addrmap *m, uint64_t key, uint32_t val) { put(m, fp_addrmap_hash(key), val); }

uint32_t fp_addrmap_del_at(fp_addrmap *m, size_t i)
{
    size_t mask = m->cap - 1;
    uint32_t val = m->slots[i].val;
    /* backward shift: every entry after the hole that may sit in it moves up */
    for (size_t j = (i + 1) & mask; m->slots[j].val; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash >> m->shift;
        /* j's entry may fill i unless its home lies cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].hash = 0;
    m->slots[i].val = 0;
    m->n--;
    return val;
}
