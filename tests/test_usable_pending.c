/* test_usable_pending: fabpool_usable_size of a block freed on a stream whose
 * work is not done yet answers the size the block was given, for a slab
 * block and a block above slab_max alike (both are still given out: the
 * pool hands them to no one else until the stream's work is done). */
#include "testutil.h"

#define MB (1ull << 20)

static void pending_block_keeps_its_size(fabpool_t *p, CUstream s, size_t size, t_sim_hooks *h)
{
    void *x = NULL;
    size_t before = 0, after = 0;
    CHECK_OK(fabpool_alloc(p, size, &x));
    if (!x)
        return;
    CHECK_OK(fabpool_usable_size(p, x, &before));
    CHECK(before >= size);
    h->hold(s);
    CHECK_OK(fabpool_free_on_stream(p, x, s));
    CHECK_OK(fabpool_usable_size(p, x, &after));
    CHECK(after == before);
    if (after != before)
        fprintf(stderr, "  a block of %zu bytes pending on a stream: usable_size answered %zu (%s), %zu before\n",
                size, after, fabpool_last_error(), before);
    h->release(s);
    CHECK_OK(fabpool_collect(p, 1));
}

int main(void)
{
    if (!t_driver_init()) {
        printf("test_usable_pending: needs the simulated driver (stream holds); skipped\n");
        return 77;
    }
    t_sim_hooks h = t_sim_hooks_get();
    fabpool_t *p = t_pool("stream_owner:0");
    CUstream s = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return t_done("test_usable_pending");
    pending_block_keeps_its_size(p, s, 1000, &h);
    pending_block_keeps_its_size(p, s, 3 * MB, &h);
    pending_block_keeps_its_size(p, s, 100 * MB, &h);
    CHECK_OK(fabpool_check(p));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
    return t_done("test_usable_pending");
}
