/* test_pagemap.c - the page map (lib/space/pagemap.c) on its own, over a
 * made-up reservation: a range set across a leaf's edge reads back on every
 * page it covers and nowhere else, a clear reads NULL, addresses outside the
 * reservation read NULL, and leaves are made only where a span was set.
 * Built with the space layer's file and the base files it uses: no driver,
 * no pool. */
#include <stdint.h>

#include "pagemap.h"
#include "unit.h"

#define SHIFT 16u /* 64 KiB pages */
#define PAGE (1ull << SHIFT)
#define LEAF_BYTES ((uint64_t)FP_MAP_LEAF << SHIFT)
#define BASE (1ull << 40)
#define SIZE (4 * LEAF_BYTES)

struct fp_span {
    int id;
};

static unsigned leaves(const fp_pagemap *m)
{
    unsigned n = 0;
    for (uint64_t i = 0; i < m->l1_n; i++)
        n += atomic_load(&m->l1[i]) != NULL;
    return n;
}

int main(void)
{
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);
    fp_lock_t lock;
    fp_lock_init(&lock, FP_LOCK_POOL, 0, "pool");
    fp_pagemap m;
    CHECK(fp_map_init(&m, &meta, &lock, BASE, SIZE, SHIFT) == 0);
    CHECK(m.l1_n == 4 && leaves(&m) == 0);

    struct fp_span a = {1}, b = {2};
    uint64_t at = BASE + LEAF_BYTES - 2 * PAGE; /* 2 pages in leaf 0, 3 in leaf 1 */
    fp_lock(&lock);
    CHECK(fp_map_set(&m, at, 5 * PAGE, &a) == 0);
    CHECK(fp_map_set(&m, BASE + 3 * LEAF_BYTES, PAGE, &b) == 0);
    CHECK(fp_map_set(&m, BASE + 2 * LEAF_BYTES, 4 * PAGE, NULL) == 0); /* a clear makes no leaf */
    fp_unlock(&lock);
    CHECK(leaves(&m) == 3);
    for (uint64_t off = 0; off < 5 * PAGE; off += PAGE / 2)
        CHECK(fp_map_get(&m, at + off) == &a);
    CHECK(fp_map_get(&m, at - 1) == NULL);
    CHECK(fp_map_get(&m, at + 5 * PAGE) == NULL);
    CHECK(fp_map_get(&m, BASE + 3 * LEAF_BYTES + PAGE - 1) == &b);
    CHECK(fp_map_get(&m, BASE + 2 * LEAF_BYTES) == NULL);
    CHECK(fp_map_get(&m, BASE - 1) == NULL);
    CHECK(fp_map_get(&m, BASE + SIZE) == NULL);

    fp_lock(&lock);
    CHECK(fp_map_set(&m, at + PAGE, 3 * PAGE, NULL) == 0);
    fp_unlock(&lock);
    CHECK(fp_map_get(&m, at) == &a && fp_map_get(&m, at + 4 * PAGE) == &a);
    for (uint64_t off = PAGE; off < 4 * PAGE; off += PAGE)
        CHECK(fp_map_get(&m, at + off) == NULL);

    fp_map_destroy(&m);
    CHECK(m.l1 == NULL);
    fp_lock_destroy(&lock);
    fp_meta_destroy(&meta);
    return unit_result("test_pagemap");
}
