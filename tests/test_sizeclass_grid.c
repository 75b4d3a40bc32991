/* test_sizeclass_grid.c - the size-class grid (lib/base/sizeclass.c) on its
 * own: every size's class is the smallest one that holds it, at most 1.25x
 * the size above 256 bytes, and the granularity-rounded classes are classes,
 * multiples of the granularity, on the right side of the size. */
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
    CHECK(fp_class_size(0) == 256);
    CHECK(fp_class_size(1) == 320 && fp_class_size(4) == 512 && fp_class_size(5) == 640);
    for (unsigned i = 1; i < FP_NCLASS; i++)
        CHECK(fp_class_size(i) > fp_class_size(i - 1));
    CHECK(fp_class_size(FP_NCLASS - 1) >= (1ull << 50));
    uint64_t sizes[] = {1, 255, 256, 257, 319, 320, 321, 1000, 1024, 1025, 4097, 65535, 1ull << 20,
                        (1ull << 20) + 1, 3ull << 30, (1ull << 40) + 12345};
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t s = sizes[k];
        unsigned c = fp_class_of(s);
        CHECK(c == class_by_walk(s));
        CHECK(fp_class_size(c) >= s);
        if (s > 256)
            CHECK(fp_class_size(c) * 4 <= s * 5);
        CHECK(fp_class_size(c) % FP_MIN_ALIGN == 0);
    }
    for (uint64_t s = 1; s <= 70000; s += 7)
        CHECK(fp_class_of(s) == class_by_walk(s));
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
