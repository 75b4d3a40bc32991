/* test_mapreg.c - the device layer's registry of mappings
 * (lib/device/mapreg.c) on its own: kept sorted by address whatever the
 * order of the maps, its sums per kind and the mapped bytes that count
 * (arena, buffer and view chunks, not host copies or a shrink's copy), the
 * peak, the copy-on-sleep flag, refusals that change nothing, and its check
 * finding a list out of order and sums that disagree.  Built with the
 * registry's file and the base files it uses: no driver, no pool. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mapreg.h"
#include "unit.h"

#define MiB (1ull << 20)
#define BASE (1ull << 40)

static void add(fp_mapreg *r, uint64_t va, uint64_t size, fp_map_kind kind, void *owner)
{
    CHECK(fp_mapreg_reserve(r) == 0);
    fp_mapreg_add(r, va, size, kind, owner);
}

static int sorted(const fp_mapreg *r)
{
    for (size_t i = 1; i < r->n; i++)
        if (r->m[i - 1].va + r->m[i - 1].size > r->m[i].va)
            return 0;
    return 1;
}

static void check_kinds_and_sums(fp_mapreg *r)
{
    int buf;
    add(r, BASE + 8 * MiB, 2 * MiB, FP_MAP_ARENA, NULL);
    add(r, BASE, 4 * MiB, FP_MAP_BUFFER, &buf);
    add(r, BASE + 32 * MiB, 2 * MiB, FP_MAP_HOST, NULL);
    add(r, BASE + 4 * MiB, 4 * MiB, FP_MAP_VIEW, NULL);
    add(r, BASE + 16 * MiB, 6 * MiB, FP_MAP_STAGING, NULL);
    CHECK(r->n == 5 && sorted(r));
    CHECK(r->m[0].va == BASE && r->m[0].owner == &buf && r->m[0].kind == FP_MAP_BUFFER);
    /* arena, buffer and view chunks count as mapped; a host copy and a shrink's copy do not */
    uint64_t n = 0;
    CHECK(fp_mapreg_mapped(r, &n) == 10 * MiB && n == 3);
    CHECK(fp_mapreg_peak(r) == 10 * MiB);
    CHECK(atomic_load(&r->bytes[FP_MAP_HOST]) == 2 * MiB && atomic_load(&r->count[FP_MAP_STAGING]) == 1);
    /* the kinds that sleep are copied until their owner says not; the others never are */
    CHECK(fp_mapreg_find(r, BASE)->copy == 1 && fp_mapreg_find(r, BASE + 8 * MiB)->copy == 1);
    CHECK(fp_mapreg_find(r, BASE + 4 * MiB)->copy == 0 && fp_mapreg_find(r, BASE + 32 * MiB)->copy == 0);
    CHECK(fp_mapreg_set_copy(r, BASE, 0) == 0 && fp_mapreg_find(r, BASE)->copy == 0);
    CHECK(fp_mapreg_set_copy(r, BASE + 1 * MiB, 0) == -1); /* no mapping starts there */
    CHECK(fp_mapreg_find(r, BASE + 1 * MiB) == NULL);
    CHECK(fp_mapreg_check(r) == FABPOOL_OK);

    /* a remove of another size, or where nothing starts, is refused and changes nothing */
    CHECK(fp_mapreg_remove(r, BASE + 8 * MiB, 4 * MiB, NULL) == -1);
    CHECK(fp_mapreg_remove(r, BASE + 9 * MiB, 2 * MiB, NULL) == -1);
    CHECK(r->n == 5 && fp_mapreg_mapped(r, NULL) == 10 * MiB);

    fp_mapping m;
    CHECK(fp_mapreg_remove(r, BASE + 4 * MiB, 4 * MiB, &m) == 0 && m.kind == FP_MAP_VIEW && m.size == 4 * MiB);
    CHECK(fp_mapreg_mapped(r, &n) == 6 * MiB && n == 2);
    CHECK(fp_mapreg_peak(r) == 10 * MiB); /* the peak stays */
    fp_mapreg_reset_peak(r);
    CHECK(fp_mapreg_peak(r) == 6 * MiB);
    CHECK(fp_mapreg_remove(r, BASE + 16 * MiB, 6 * MiB, NULL) == 0);
    CHECK(fp_mapreg_remove(r, BASE + 32 * MiB, 2 * MiB, NULL) == 0);
    CHECK(fp_mapreg_remove(r, BASE, 4 * MiB, NULL) == 0);
    CHECK(fp_mapreg_remove(r, BASE + 8 * MiB, 2 * MiB, NULL) == 0);
    CHECK(r->n == 0 && fp_mapreg_mapped(r, &n) == 0 && n == 0);
    for (int k = 0; k < FP_MAP_KINDS; k++)
        CHECK(atomic_load(&r->count[k]) == 0 && atomic_load(&r->bytes[k]) == 0);
}

/* Its check: a list that overlaps, and sums that are not the list's. */
static void check_finds_corruption(fp_mapreg *r)
{
    add(r, BASE, 2 * MiB, FP_MAP_ARENA, NULL);
    add(r, BASE + 2 * MiB, 2 * MiB, FP_MAP_ARENA, NULL);
    CHECK(fp_mapreg_check(r) == FABPOOL_OK);
    r->m[1].va -= MiB;
    CHECK(fp_mapreg_check(r) == FABPOOL_ERR_CORRUPT && strstr(fabpool_last_error(), "[registry.list]"));
    r->m[1].va += MiB;
    atomic_fetch_add(&r->bytes[FP_MAP_ARENA], MiB);
    CHECK(fp_mapreg_check(r) == FABPOOL_ERR_CORRUPT && strstr(fabpool_last_error(), "[registry.sums]"));
    atomic_fetch_sub(&r->bytes[FP_MAP_ARENA], MiB);
    atomic_fetch_add(&r->count[FP_MAP_VIEW], 1);
    CHECK(fp_mapreg_check(r) == FABPOOL_ERR_CORRUPT && strstr(fabpool_last_error(), "[registry.sums]"));
    atomic_fetch_sub(&r->count[FP_MAP_VIEW], 1);
    CHECK(fp_mapreg_check(r) == FABPOOL_OK);
    CHECK(fp_mapreg_remove(r, BASE, 2 * MiB, NULL) == 0 && fp_mapreg_remove(r, BASE + 2 * MiB, 2 * MiB, NULL) == 0);
}

/* Maps and unmaps in a random order against a table of what is mapped: the
 * list stays sorted and its sums the table's. */
static void check_churn(fp_mapreg *r)
{
    enum { SLOTS = 256 };
    uint8_t kind[SLOTS] = {0}, held[SLOTS] = {0};
    srand(7);
    for (int step = 0; step < 20000; step++) {
        int i = rand() % SLOTS;
        uint64_t va = BASE + (uint64_t)i * 8 * MiB, size = (uint64_t)(1 + i % 4) * 2 * MiB;
        if (held[i]) {
            CHECK(fp_mapreg_remove(r, va, size, NULL) == 0);
            held[i] = 0;
        } else {
            kind[i] = (uint8_t)(rand() % FP_MAP_KINDS);
            add(r, va, size, (fp_map_kind)kind[i], NULL);
            held[i] = 1;
        }
    }
    uint64_t want = 0, want_n = 0, n = 0;
    size_t listed = 0;
    for (int i = 0; i < SLOTS; i++)
        if (held[i]) {
            listed++;
            const fp_mapping *e = fp_mapreg_find(r, BASE + (uint64_t)i * 8 * MiB);
            CHECK(e && e->kind == kind[i]);
            if (FP_MAP_COUNTED(kind[i])) {
                want += (uint64_t)(1 + i % 4) * 2 * MiB;
                want_n++;
            }
        }
    CHECK(r->n == listed && sorted(r));
    CHECK(fp_mapreg_mapped(r, &n) == want && n == want_n);
    CHECK(fp_mapreg_check(r) == FABPOOL_OK);
}

int main(void)
{
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);
    fp_mapreg r;
    fp_mapreg_init(&r, &meta);
    check_kinds_and_sums(&r);
    check_finds_corruption(&r);
    check_churn(&r);
    CHECK(atomic_load(&meta.bytes) >= r.cap * sizeof(fp_mapping));
    fp_mapreg_free(&r);
    CHECK(r.n == 0 && r.m == NULL);
    CHECK(atomic_load(&meta.bytes) == 0); /* the list's memory went back to the metadata allocator */
    fp_meta_destroy(&meta);
    return unit_result("test_mapreg");
}
