/* array.c - growable arrays (array.h). */
#include "array.h"

#include <stdlib.h>
#include <string.h>

static void *get(void *items)
{
    void *p;
    memcpy(&p, items, sizeof p);
    return p;
}

static void set(void *items, void *p) { memcpy(items, &p, sizeof p); }

int fp_array_reserve(fp_meta *meta, void *items, size_t elem, size_t n, size_t *cap, size_t need, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : first;
    while (c < need)
        c *= 2;
    void *a = meta ? fp_meta_alloc(meta, c * elem) : calloc(c, elem);
    if (!a)
        return -1;
    void *old = get(items);
    if (n)
        memcpy(a, old, n * elem);
    if (meta)
        fp_meta_free(meta, old, *cap * elem);
    else
        free(old);
    set(items, a);
    *cap = c;
    return 0;
}

void fp_array_free(fp_meta *meta, void *items, size_t elem, size_t *cap)
{
    void *old = get(items);
    if (meta)
        fp_meta_free(meta, old, *cap * elem);
    else
        free(old);
    set(items, NULL);
    *cap = 0;
}
