/* sleep_wake: give a pool's device memory back between phases, and get it
 * back at the same addresses.
 *
 * An RL trainer and an inference server sharing one GPU, or a server between
 * requests, put a pool to sleep: its memory goes back to the driver (the
 * bytes copied to pinned host memory first with FABPOOL_SLEEP_OFFLOAD, or
 * dropped with FABPOOL_SLEEP_DISCARD), while every block and buffer stays
 * allocated at its address.  Wake maps fresh memory at those addresses and
 * restores the bytes.  Make one pool per kind of memory that sleeps
 * differently (weights offloaded, a KV cache dropped).
 *
 *   cc sleep_wake.c -lfabpool -o sleep_wake && ./sleep_wake
 *   (no GPU: FABPOOL_CUDA_LIBRARY=build/sim/libcuda.so.1 ./sleep_wake)
 */
#include <fabpool.h>
#include <stdio.h>

#include "try.h" /* TRY(call): print fabpool's message and return 1 on failure; MiB */

static unsigned long long mapped_mib(fabpool_t *pool)
{
    fabpool_stats st = {.struct_size = sizeof st};
    if (fabpool_get_stats(pool, &st) != FABPOOL_OK)
        return ~0ull;
    return (unsigned long long)(st.mapped_bytes / MiB);
}

int main(void)
{
    fabpool_t *weights;
    TRY(fabpool_create(NULL, &weights));

    /* Some "weights": a few blocks and a growable buffer. */
    void *w[4];
    for (int i = 0; i < 4; i++)
        TRY(fabpool_alloc(weights, 32 * MiB, &w[i]));
    fabpool_buffer_t *kv;
    TRY(fabpool_buffer_create(weights, 1024 * MiB, 64 * MiB, &kv));
    void *kv_base = fabpool_buffer_ptr(kv);
    unsigned long long awake = mapped_mib(weights);
    printf("awake:   %llu MiB mapped\n", awake);

    /* Sleep.  The stream argument is the work to wait for first (NULL: the whole context). */
    TRY(fabpool_sleep(weights, FABPOOL_SLEEP_OFFLOAD, NULL));
    fabpool_sleep_info si = {.struct_size = sizeof si};
    TRY(fabpool_sleep_state(weights, &si));
    unsigned long long asleep = mapped_mib(weights);
    printf("asleep:  %llu MiB mapped, %llu MiB offloaded to %llu MiB of pinned host memory\n", asleep,
           (unsigned long long)(si.offloaded_bytes / MiB), (unsigned long long)(si.host_bytes / MiB));

    /* While the pool sleeps, allocating is refused with FABPOOL_ERR_ASLEEP (frees still work). */
    void *more;
    fabpool_status s = fabpool_alloc(weights, 1 * MiB, &more);
    printf("alloc while asleep: %s\n", fabpool_status_name(s));

    /* Wake: fresh memory at the same addresses, the offloaded bytes copied back. */
    TRY(fabpool_wake(weights, NULL));
    unsigned long long woken = mapped_mib(weights);
    printf("woken:   %llu MiB mapped, the buffer still at %p\n", woken, fabpool_buffer_ptr(kv));

    int same = fabpool_buffer_ptr(kv) == kv_base;
    for (int i = 0; i < 4; i++)
        TRY(fabpool_free(weights, w[i]));
    TRY(fabpool_buffer_destroy(kv, NULL));
    TRY(fabpool_destroy(weights));

    /* What this example shows must hold. */
    if (asleep != 0 || si.offloaded_bytes == 0 || s != FABPOOL_ERR_ASLEEP || woken != awake || !same) {
        fprintf(stderr, "unexpected: the figures above break sleep and wake's rules\n");
        return 1;
    }
    return 0;
}
