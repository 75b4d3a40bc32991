/* sizeclass.c - class grids rounded to the allocation granularity. */
#include "sizeclass.h"

uint64_t fp_class_round_up_gran(uint64_t x, uint64_t gran)
{
    if (x <= gran)
        return gran;
    for (unsigned i = fp_class_of(x); i < FP_NCLASS; i++) {
        uint64_t c = fp_class_size(i);
        if (c % gran == 0)
            return c;
    }
    return fp_round_up(x, gran);
}

uint64_t fp_class_round_down_gran(uint64_t x, uint64_t gran)
{
    if (x < gran)
        return 0;
    unsigned i = fp_class_of(x);
    if (fp_class_size(i) > x)
        i--;
    for (;; i--) {
        uint64_t c = fp_class_size(i);
        if (c % gran == 0)
            return c;
        if (i == 0)
            return 0;
    }
}
