/* test_sizeclass_grid.c - the size-class grid (lib/base/sizeclass.c) on its
 * own: every size's class is the smallest one that holds it; the size
 * rounded up to a power of two (at least 64) up to 256 bytes, to a multiple
 * of 256 up to 1 KiB, at most 1.25x the size above; every class of 256 bytes
 * or more a multiple of 256 (the blocks' alignment); and the
 * granularity-rounded classes are classes, multiples of the granularity, on
 * the right side of the size. */
#include <stdint.h>

#include "sizeclass.h"
#include "unit.h"

/* the smallest class >= size, found by a walk of the grid */
static unsigned class_by_walk(uint64_t size)
{
    unsigned i = 0;
    while (fp_class_size(i) < size)
        i++;
    return i;
}

static void check_grid(void)
{
    CHECK(fp_class_size(0) == 64 && fp_class_size(1) == 128 && fp_class_size(2) == 256);
    CHECK(fp_class_size(3) == 512 && fp_class_size(4) == 768 && fp_class_size(5) == 1024);
    CHECK(fp_class_size(6) == 1280 && fp_class_size(9) == 2048 && fp_class_size(10) == 2560);
    for (unsigned i = 1; i < FP_NCLASS; i++)
        CHECK(fp_class_size(i) > fp_class_size(i - 1));
    for (unsigned i = 0; i < FP_NCLASS; i++)
        CHECK(fp_class_size(i) < 256 || fp_class_size(i) % 256 == 0);
    CHECK(fp_class_size(FP_NCLASS - 1) >= (1ull << 50));
    CHECK(fp_class_of(0) < FP_NCLASS);
    uint64_t sizes[] = {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 319, 320, 321, 511, 513, 767, 769, 1000, 1024,
                        1025, 4097, 65535, 1ull << 20, (1ull << 20) + 1, 3ull << 30, (1ull << 40) + 12345};
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t s = sizes[k];
        unsigned c = fp_class_of(s);
        uint64_t cs = fp_class_size(c);
        CHECK(c == class_by_walk(s));
        CHECK(cs >= s);
        if (s > 1024)
            CHECK(cs * 4 <= s * 5);
        else if (s > 256)
            CHECK(cs == (s + 255) / 256 * 256);
        else
            CHECK(cs >= 64 && (cs & (cs - 1)) == 0 && (cs == 64 || cs / 2 < s));
        CHECK(cs % fp_block_align(s) == 0);
        CHECK(fp_block_align(s) == (s >= 256 ? 256 : cs));
    }
    for (uint64_t s = 1; s <= 70000; s += s < 4096 ? 1 : 7)
        CHECK(fp_class_of(s) == class_by_walk(s) && fp_class_size(fp_class_of(s)) % fp_block_align(s) == 0);
}

static void check_gran(void)
{
    const uint64_t gran = 2ull << 20;
    uint64_t xs[] = {1, gran - 1, gran, gran + 1, 5 * gran + 3, 100 * gran, (1ull << 33) + 1};
    for (unsigned k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        uint64_t x = xs[k];
        uint64_t up = fp_class_round_up_gran(x, gran), down = fp_class_round_down_gran(x, gran);
        CHECK(up >= x && up % gran == 0);
        CHECK(fp_class_size(fp_class_of(up)) == up);
        if (x < gran) {
            CHECK(down == 0);
        } else {
            CHECK(down <= x && down >= gran && down % gran == 0);
            CHECK(fp_class_size(fp_class_of(down)) == down);
        }
    }
    CHECK(fp_class_round_up_gran(5 * gran + 3, gran) == 6 * gran);
    CHECK(fp_class_round_down_gran(5 * gran + 3, gran) == 5 * gran);
    CHECK(fp_class_round_down_gran(gran / 2, gran) == 0);
}

int main(void)
{
    check_grid();
    check_gran();
    return unit_result("test_sizeclass_grid");
}
