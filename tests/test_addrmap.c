/* test_addrmap.c - the table of blocks (lib/base/addrmap.c) on its own:
 * seeded random inserts, lookups and deletes against a plain list of what
 * it holds, so that every key reads back its value, every key deleted and
 * every key never put reads nothing, after each step and through every
 * growth and backward-shift delete; keys of one hash are told apart by
 * their values (the table keeps hashes, not keys), in either order;
 * the table stays at most half full, and grows only past that (3,000 keys
 * in 8,192 slots of 8 bytes, 64 KiB: slots of 16 bytes took 128 KiB, and a
 * table of blocks twice as large took the medium path 20 ns more an
 * operation on the bench's uniform shape, docs/performance.md).  Built
 * with the base files it uses: no driver, no pool. */
#include <stdint.h>
#include <stdlib.h>

#include "addrmap.h"
#include "unit.h"

enum { KEYS = 6000, STEPS = 60000 };

static uint64_t key[KEYS + 1]; /* value v names key[v] */

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The slot of k, told from other keys of its hash by the key its value names, or FP_ADDRMAP_END. */
static size_t find(const fp_addrmap *m, uint64_t k)
{
    uint32_t h = fp_addrmap_hash(k);
    size_t i = FP_ADDRMAP_END;
    while ((i = fp_addrmap_next(m, h, i)) != FP_ADDRMAP_END && key[m->slots[i].val] != k)
        ;
    return i;
}

static uint32_t get(const fp_addrmap *m, uint64_t k)
{
    size_t i = find(m, k);
    return i == FP_ADDRMAP_END ? 0 : m->slots[i].val;
}

int main(void)
{
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);
    fp_addrmap m;
    fp_addrmap_init(&m, &meta);
    static int held[KEYS + 1];
    uint64_t s = 5;
    /* block bases: 256-byte aligned, many close together (the same slot's neighbourhood), some far apart */
    for (int v = 1; v <= KEYS; v++)
        key[v] = v % 2 ? (1ull << 40) + (uint64_t)v * 256 : (1ull << 44) + (rng(&s) % (1ull << 30)) * 256 + 256;
    size_t n = 0, max_fill_bad = 0;
    CHECK(get(&m, key[1]) == 0);
    for (int step = 0; step < STEPS; step++) {
        uint32_t v = (uint32_t)(1 + rng(&s) % KEYS);
        if (held[v]) {
            size_t i = find(&m, key[v]);
            CHECK(i != FP_ADDRMAP_END && fp_addrmap_del_at(&m, i) == v);
            held[v] = 0;
            n--;
        } else {
            CHECK(fp_addrmap_reserve(&m, 1) == 0);
            fp_addrmap_put(&m, key[v], v);
            held[v] = 1;
            n++;
        }
        max_fill_bad += 2 * m.n > m.cap;
        CHECK(m.n == n);
        uint32_t w = (uint32_t)(1 + rng(&s) % KEYS); /* one key held or not */
        CHECK(get(&m, key[w]) == (held[w] ? w : 0));
        if (step % 5000 == 0)
            for (uint32_t k = 1; k <= KEYS; k++)
                CHECK(get(&m, key[k]) == (held[k] ? k : 0));
    }
    CHECK(max_fill_bad == 0);
    for (uint32_t k = 1; k <= KEYS; k++)
        CHECK(get(&m, key[k]) == (held[k] ? k : 0));
    printf("test_addrmap: %zu keys held in %zu slots\n", m.n, m.cap);
    fp_addrmap_destroy(&m);

    /* keys of one hash (found by a search of random bases): each found by its value, each deleted alone, in
     * either order */
    static const uint64_t twins[3][2] = {{0x30118b185a00ull, 0x188c34327800ull},
                                         {0x76cb5e0e5800ull, 0x53835bb58500ull},
                                         {0x72ad41721400ull, 0x48369e68f500ull}};
    for (int t = 0; t < 3; t++) {
        CHECK(fp_addrmap_hash(twins[t][0]) == fp_addrmap_hash(twins[t][1]));
        for (int first = 0; first < 2; first++) {
            fp_addrmap_init(&m, &meta);
            key[1] = twins[t][0];
            key[2] = twins[t][1];
            for (uint32_t v = 1; v <= 2; v++) {
                CHECK(fp_addrmap_reserve(&m, 1) == 0);
                fp_addrmap_put(&m, key[v], v);
            }
            CHECK(get(&m, key[1]) == 1 && get(&m, key[2]) == 2);
            uint32_t gone = (uint32_t)(1 + first), kept = 3 - gone;
            CHECK(fp_addrmap_del_at(&m, find(&m, key[gone])) == gone);
            CHECK(get(&m, key[gone]) == 0 && get(&m, key[kept]) == kept && m.n == 1);
            fp_addrmap_destroy(&m);
        }
    }
    /* 3,000 keys, one at a time as the arena puts them: 8,192 slots of 8 bytes */
    fp_addrmap_init(&m, &meta);
    for (uint32_t k = 1; k <= 3000; k++) {
        CHECK(fp_addrmap_reserve(&m, 1) == 0);
        fp_addrmap_put(&m, key[k], k);
    }
    printf("test_addrmap: 3000 keys in %zu slots of %zu bytes\n", m.cap, sizeof *m.slots);
    CHECK(m.cap == 8192 && sizeof *m.slots == 8);
    for (uint32_t k = 1; k <= 3000; k++)
        CHECK(get(&m, key[k]) == k);
    fp_addrmap_destroy(&m);
    fp_meta_destroy(&meta);
    return unit_result("test_addrmap");
}
