/* walk.c - the lists of fabpool_check's walks (walk.h), in libc memory. */
#include "walk.h"

#include <stdlib.h>

static int ival_add(fp_ival **v, size_t *n, size_t *cap, fp_ival x)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        fp_ival *t = realloc(*v, c * sizeof *t);
        if (!t)
            return -1;
        *v = t;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}

int fp_walk_use(fp_walk *w, uint64_t lo, uint64_t size, const char *what, const void *obj)
{
    return ival_add(&w->iv, &w->n_iv, &w->cap_iv, (fp_ival){lo, lo + size, what, obj});
}

int fp_walk_keep(fp_walk *w, uint64_t lo, uint64_t size, const char *what, const void *obj)
{
    return ival_add(&w->kept, &w->n_kept, &w->cap_kept, (fp_ival){lo, lo + size, what, obj});
}

static int ival_cmp(const void *a, const void *b)
{
    const fp_ival *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void fp_walk_sort(fp_walk *w)
{
    if (w->n_iv)
        qsort(w->iv, w->n_iv, sizeof *w->iv, ival_cmp);
}

void fp_walk_free(fp_walk *w)
{
    free(w->iv);
    free(w->kept);
    free(w->tc);
    free(w->seen);
}
