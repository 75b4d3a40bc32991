/* test_owner_fence_fault: a block the owner stream freed at once goes to
 * another user only after the owner's queued work is done, also when the
 * wait for that work (the fence of the allocation that ends the owner mode)
 * was refused by the driver: the refused allocation leaves the owner mode as
 * it was, and the next allocation waits again.  Every call of that wait is
 * made to fail in turn. */
#include "testutil.h"

#define MB (1ull << 20)

static int n_refused;

static void fence_refused(t_sim_hooks *h, const char *entry, uint64_t nth, size_t size)
{
    fabpool_t *p = t_pool("stream_owner:1");
    CUstream s = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS) {
        fabpool_destroy(p);
        return;
    }
    void *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, size, s, &x)); /* s becomes the owner */
    h->hold(s);                                        /* its work pends */
    CHECK_OK(fabpool_free_on_stream(p, x, s));         /* the owner's free: into the pool at once */
    h->fault_set(entry, nth, 0, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_alloc(p, size, &y);
    h->fault_clear();
    if (st == FABPOOL_OK) {
        /* the wait went through: the owner's work is done before its block goes to anyone else */
        CHECK(y != x || cuStreamQuery(s) == CUDA_SUCCESS);
    } else {
        n_refused++;
        CHECK(y == NULL);
        CHECK_OK(fabpool_alloc(p, size, &z));
        CHECK(z != x || cuStreamQuery(s) == CUDA_SUCCESS);
        if (z == x && cuStreamQuery(s) != CUDA_SUCCESS)
            fprintf(stderr, "  call %llu of %s failed: the next allocation got the owner's block %p while the owner's "
                    "work still runs\n", (unsigned long long)nth, entry, z);
    }
    h->release(s);
    if (y)
        CHECK_OK(fabpool_free(p, y));
    if (z)
        CHECK_OK(fabpool_free(p, z));
    CHECK_OK(fabpool_check(p));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_owner_fence_fault", "faults, stream holds");
    static const char *const entries[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuEventCreate", "cuEventRecord",
                                          "cuEventSynchronize", "cuCtxSynchronize"};
    static const size_t sizes[] = {1000, 4 * MB};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        for (uint64_t n = 1; n <= 2; n++)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
                fence_refused(&h, entries[e], n, sizes[k]);
    printf("test_owner_fence_fault: %d allocations refused\n", n_refused);
    return t_done("test_owner_fence_fault");
}
