/* alloc_free: the smallest complete program on fabpool.
 *
 * Makes a pool on device 0, allocates a few blocks of device memory, frees
 * them, gives the memory back to the driver and destroys the pool, printing
 * what the pool holds at each step.  Every fabpool call returns a
 * fabpool_status; on failure fabpool_last_error() says what went wrong and
 * what to do, so the program prints it and stops.
 *
 *   cc alloc_free.c -lfabpool -o alloc_free && ./alloc_free
 *
 * No GPU at hand?  Run it on the simulated driver that fabpool builds:
 *   FABPOOL_CUDA_LIBRARY=build/sim/libcuda.so.1 ./alloc_free
 */
#include <fabpool.h>
#include <stdint.h>
#include <stdio.h>

#include "try.h" /* TRY(call): print fabpool's message and return 1 on failure; MiB */

/* Prints the bytes the program holds in blocks and what the driver holds for the pool. */
static int show(fabpool_t *pool, const char *when)
{
    fabpool_stats st = {.struct_size = sizeof st}; /* every struct fabpool fills starts with its size */
    TRY(fabpool_get_stats(pool, &st));
    printf("%-28s in use %9llu bytes, mapped %9llu bytes\n", when, (unsigned long long)st.in_use_bytes,
           (unsigned long long)st.mapped_bytes);
    return 0;
}

int main(void)
{
    printf("fabpool %s\n", fabpool_version());

    /* 1. A pool.  The defaults suit most programs; FABPOOL_CONF changes them without a rebuild. */
    fabpool_options opt;
    fabpool_options_init(&opt); /* the defaults, and opt.struct_size */
    opt.device = 0;
    fabpool_t *pool;
    TRY(fabpool_create(&opt, &pool));
    if (show(pool, "a new pool:"))
        return 1;

    /* 2. Blocks.  Small sizes come from size classes cached per thread, large ones are cut from mapped chunks.
     *    Every block of 256 bytes or more starts on a multiple of 256 bytes, as cudaMalloc's do (300 bytes here);
     *    a smaller one on its size rounded up to a power of two, at least 64: ask for 256 bytes, or use
     *    fabpool_alloc_aligned, where a kernel needs more. */
    void *small, *large;
    TRY(fabpool_alloc(pool, 300, &small));
    TRY(fabpool_alloc(pool, 64u << 20, &large));
    size_t got;
    TRY(fabpool_usable_size(pool, large, &got));
    printf("300-byte block at %p, 64 MiB block at %p, usable size %zu bytes\n", small, large, got);
    int aligned = (uintptr_t)small % 256 == 0 && (uintptr_t)large % 256 == 0;
    if (show(pool, "after two allocations:"))
        return 1;

    /* 3. Free them.  The memory stays mapped, cached for the next allocation (no driver call then). */
    TRY(fabpool_free(pool, small));
    TRY(fabpool_free(pool, large));
    if (show(pool, "after the frees:"))
        return 1;

    /* 4. Give the cached memory back to the driver now (it also goes by itself once unused for decay_ms). */
    TRY(fabpool_trim(pool, 0));
    if (show(pool, "after fabpool_trim(pool, 0):"))
        return 1;

    /* A pointer fabpool did not give out is refused with a clear message, and nothing changes. */
    int not_ours;
    fabpool_status s = fabpool_free(pool, &not_ours);
    printf("freeing a foreign pointer: %s (%s)\n", fabpool_status_name(s), fabpool_last_error());

    fabpool_stats st = {.struct_size = sizeof st};
    TRY(fabpool_get_stats(pool, &st));
    TRY(fabpool_destroy(pool));
    /* What this example shows must hold: the blocks 256-aligned, nothing in use or mapped at the end, the foreign
     * free refused. */
    if (!aligned || st.in_use_bytes != 0 || st.mapped_bytes != 0 || s != FABPOOL_ERR_NOT_FOUND) {
        fprintf(stderr, "unexpected: blocks %s256-aligned, in use %llu, mapped %llu, foreign free %s\n",
                aligned ? "" : "not ", (unsigned long long)st.in_use_bytes, (unsigned long long)st.mapped_bytes,
                fabpool_status_name(s));
        return 1;
    }
    printf("done\n");
    return 0;
}
