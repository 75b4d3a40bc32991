/* growing_buffer: a buffer that grows and shrinks in place.
 *
 * A dispatch buffer whose size follows the token count: fabpool reserves an
 * address window for its largest size once, maps only what is asked, and
 * maps or unmaps chunks at its end as it is resized.  Its address never
 * changes, so kernels, CUDA graphs and peers that hold it keep working.
 *
 *   cc growing_buffer.c -lfabpool -o growing_buffer && ./growing_buffer
 *   (no GPU: FABPOOL_CUDA_LIBRARY=build/sim/libcuda.so.1 ./growing_buffer)
 */
#include <fabpool.h>
#include <stdio.h>

#include "try.h" /* TRY(call): print fabpool's message and return 1 on failure; MiB */

/* Prints the buffer's size, what is mapped under it, in how many chunks, and its base address. */
static int show(fabpool_buffer_t *buf, const char *when, fabpool_buffer_info *in)
{
    in->struct_size = sizeof *in;
    TRY(fabpool_buffer_get_info(buf, in));
    printf("%-22s base %p, size %5llu MiB, mapped %5llu MiB in %u chunks\n", when, in->base,
           (unsigned long long)(in->size / MiB), (unsigned long long)(in->mapped / MiB), in->n_chunks);
    return 0;
}

int main(void)
{
    fabpool_t *pool;
    TRY(fabpool_create(NULL, &pool)); /* NULL: the default options, device 0 */

    /* Up to 4 GiB of address space, 256 MiB of it now (mapped in a chunk of 320 MiB: max_waste lets a chunk
     * map up to a quarter more than asked, room for the buffer to grow). */
    fabpool_buffer_t *buf;
    TRY(fabpool_buffer_create(pool, 4096 * MiB, 256 * MiB, &buf));
    void *base = fabpool_buffer_ptr(buf);
    fabpool_buffer_info a, b, c;
    if (show(buf, "created:", &a))
        return 1;

    /* Grow: only the missing chunks are mapped, behind the ones there; their data stays. */
    TRY(fabpool_buffer_resize(buf, 1024 * MiB, NULL));
    if (show(buf, "grown to 1 GiB:", &b))
        return 1;

    /* Shrink: the chunks past the new size are unmapped once the GPU work that may use them is done.  The
     * stream argument says which work: NULL waits for the whole context; a CUstream waits for that stream
     * only (by an event, without blocking the caller). */
    TRY(fabpool_buffer_resize(buf, 128 * MiB, NULL));
    TRY(fabpool_collect(pool, 1)); /* finish the unmaps now, so that the figures below show them */
    if (show(buf, "shrunk to 128 MiB:", &c))
        return 1;

    TRY(fabpool_buffer_destroy(buf, NULL));
    TRY(fabpool_destroy(pool));

    /* What this example shows must hold: one base address throughout, what was asked mapped at each step,
     * and less mapped after the shrink than before it. */
    if (a.base != base || b.base != base || c.base != base || b.mapped < 1024 * MiB || c.mapped < 128 * MiB ||
        c.mapped >= b.mapped) {
        fprintf(stderr, "unexpected: the figures above break the buffer's rules\n");
        return 1;
    }
    printf("the base address never moved\n");
    return 0;
}
