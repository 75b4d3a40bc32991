/* test_vaspace.c - the reservation's free ranges (lib/space/vaspace.c) on
 * their own, over a made-up reservation: aligned first fit from the bottom,
 * fits from the top and below a limit, exact takes, and frees that merge
 * back into one range.  Built with the space layer's file and the base
 * files it uses: no driver, no pool. */
#include <stdint.h>

#include "vaspace.h"
#include "unit.h"

#define MiB (1ull << 20)
#define BASE (1ull << 40)
#define SIZE (64 * MiB)

static void check_fits(fp_vaspace *v)
{
    uint64_t a = fp_va_alloc(v, 3 * MiB, 2 * MiB);
    CHECK(a == BASE);
    uint64_t b = fp_va_alloc(v, 1 * MiB, 4 * MiB); /* skips [3, 4) MiB to be aligned */
    CHECK(b == BASE + 4 * MiB);
    uint64_t t = fp_va_alloc_top(v, 2 * MiB, 2 * MiB);
    CHECK(t == BASE + SIZE - 2 * MiB);
    uint64_t below = fp_va_alloc_top_below(v, 1 * MiB, 1 * MiB, BASE + 16 * MiB);
    CHECK(below == BASE + 15 * MiB);
    CHECK(v->free_bytes == SIZE - 7 * MiB);
    CHECK(fp_va_alloc(v, SIZE, 1) == 0); /* nothing that large is free: refused, nothing taken */
    CHECK(v->free_bytes == SIZE - 7 * MiB);
    CHECK(fp_va_take(v, BASE + 3 * MiB, 1 * MiB) == 0);
    CHECK(fp_va_take(v, BASE + 3 * MiB, 1 * MiB) == -1); /* taken already */
    CHECK(fp_va_take(v, BASE + SIZE - 1 * MiB, 2 * MiB) == -1); /* past the reservation's end */
    CHECK(v->free_bytes == SIZE - 8 * MiB);
    CHECK(fp_va_free(v, BASE + 3 * MiB, 1 * MiB) == 0);
    CHECK(fp_va_free(v, b, 1 * MiB) == 0);
    CHECK(fp_va_free(v, t, 2 * MiB) == 0);
    CHECK(fp_va_free(v, below, 1 * MiB) == 0);
    CHECK(fp_va_free(v, a, 3 * MiB) == 0);
    /* every range back: one free range, the whole reservation */
    CHECK(v->free_bytes == SIZE);
    CHECK(v->n == 1 && v->free[0].start == BASE && v->free[0].size == SIZE);
}

static void check_sorted_after_churn(fp_vaspace *v)
{
    uint64_t got[32];
    for (int i = 0; i < 32; i++)
        got[i] = fp_va_alloc(v, 1 * MiB, 1 * MiB);
    for (int i = 0; i < 32; i += 2) /* every other one: 16 holes */
        CHECK(fp_va_free(v, got[i], 1 * MiB) == 0);
    CHECK(v->n == 17);
    for (size_t i = 1; i < v->n; i++)
        CHECK(v->free[i - 1].start + v->free[i - 1].size < v->free[i].start);
    for (int i = 1; i < 32; i += 2)
        CHECK(fp_va_free(v, got[i], 1 * MiB) == 0);
    CHECK(v->n == 1 && v->free_bytes == SIZE);
}

int main(void)
{
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);
    fp_vaspace v;
    CHECK(fp_va_init(&v, &meta, BASE, SIZE) == 0);
    check_fits(&v);
    check_sorted_after_churn(&v);
    fp_va_destroy(&v);
    fp_meta_destroy(&meta);
    return unit_result("test_vaspace");
}
