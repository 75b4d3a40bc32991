/* consumer.c - a program built against an installed fabpool: a pool, a
 * block, its size class, free, destroy; prints OK. */
#include <fabpool.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    fabpool_t *pool;
    if (fabpool_create(NULL, &pool) != FABPOOL_OK) {
        fprintf(stderr, "fabpool_create: %s\n", fabpool_last_error());
        return 1;
    }
    void *p = NULL;
    size_t usable = 0;
    fabpool_status s = fabpool_alloc(pool, 1000000, &p);
    if (s == FABPOOL_OK)
        s = fabpool_usable_size(pool, p, &usable);
    if (s == FABPOOL_OK)
        s = fabpool_free(pool, p);
    if (s != FABPOOL_OK || usable < 1000000) {
        fprintf(stderr, "%s: %s\n", fabpool_status_name(s), fabpool_last_error());
        fabpool_destroy(pool);
        return 1;
    }
    fabpool_stats st = {.struct_size = sizeof st};
    fabpool_get_stats(pool, &st);
    if ((s = fabpool_destroy(pool)) != FABPOOL_OK) {
        fprintf(stderr, "fabpool_destroy: %s\n", fabpool_last_error());
        return 1;
    }
    if (strcmp(fabpool_version(), FABPOOL_VERSION_STRING) != 0) {
        fprintf(stderr, "the library is fabpool %s, the header %s\n", fabpool_version(), FABPOOL_VERSION_STRING);
        return 1;
    }
    printf("OK fabpool %s: a block of %zu bytes, %llu bytes were mapped\n", fabpool_version(), usable,
           (unsigned long long)st.mapped_bytes);
    return 0;
}
