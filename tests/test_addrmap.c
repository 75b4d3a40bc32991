/* test_addrmap.c - the table of blocks (lib/base/addrmap.c) on its own:
 * seeded random inserts, lookups and deletes against a plain list of what
 * it holds, so that every key reads back its value, every key deleted and
 * every key never put reads NULL, after each step and through every growth
 * and backward-shift delete; the table stays at most three quarters full,
 * and grows only past that (3,000 keys in 4,096 slots: a table of blocks
 * twice as large took the medium path 20 ns more an operation on the
 * bench's uniform shape, docs/performance.md).  Built with the base files
 * it uses: no driver, no pool. */
#include <stdint.h>
#include <stdlib.h>

#include "addrmap.h"
#include "unit.h"

enum { KEYS = 6000, STEPS = 60000 };

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(void)
{
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);
    fp_addrmap m;
    fp_addrmap_init(&m, &meta);
    static uint64_t key[KEYS];
    static int held[KEYS];
    uint64_t s = 5;
    /* block bases: 256-byte aligned, many close together (the same slot's neighbourhood) and some far apart */
    for (int i = 0; i < KEYS; i++)
        key[i] = (i % 2 ? (1ull << 40) + (uint64_t)i * 256 : (1ull << 44) + (rng(&s) % (1ull << 30)) * 256) + 256;
    size_t n = 0, max_fill_bad = 0;
    CHECK(fp_addrmap_get(&m, key[0]) == NULL);
    for (int step = 0; step < STEPS; step++) {
        int i = (int)(rng(&s) % KEYS);
        if (held[i]) {
            CHECK(fp_addrmap_del(&m, key[i]) == &held[i]);
            held[i] = 0;
            n--;
        } else {
            CHECK(fp_addrmap_reserve(&m, 1) == 0);
            fp_addrmap_put(&m, key[i], &held[i]);
            held[i] = 1;
            n++;
        }
        max_fill_bad += 4 * m.n > 3 * m.cap;
        CHECK(m.n == n);
        int j = (int)(rng(&s) % KEYS); /* one key held or not */
        CHECK(fp_addrmap_get(&m, key[j]) == (held[j] ? &held[j] : NULL));
        if (step % 5000 == 0)
            for (int k = 0; k < KEYS; k++)
                CHECK(fp_addrmap_get(&m, key[k]) == (held[k] ? &held[k] : NULL));
    }
    CHECK(max_fill_bad == 0);
    for (int k = 0; k < KEYS; k++)
        CHECK(fp_addrmap_get(&m, key[k]) == (held[k] ? &held[k] : NULL));
    printf("test_addrmap: %zu keys held in %zu slots\n", m.n, m.cap);
    fp_addrmap_destroy(&m);

    /* 3,000 keys, one at a time as the arena puts them: 4,096 slots */
    fp_addrmap_init(&m, &meta);
    for (int k = 0; k < 3000; k++) {
        CHECK(fp_addrmap_reserve(&m, 1) == 0);
        fp_addrmap_put(&m, key[k], &held[k]);
    }
    printf("test_addrmap: 3000 keys in %zu slots\n", m.cap);
    CHECK(m.cap == 4096);
    for (int k = 0; k < 3000; k++)
        CHECK(fp_addrmap_get(&m, key[k]) == &held[k]);
    fp_addrmap_destroy(&m);
    fp_meta_destroy(&meta);
    return unit_result("test_addrmap");
}
