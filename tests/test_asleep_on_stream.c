/* test_asleep_on_stream - a pool asleep hands out no memory through the stream pair, on the simulated and on the
 * real driver: blocks freed on a stream while the pool sleeps are not given out again before the wake (they are
 * unmapped: a kernel writing there would fault).  On a real GPU a block the pool wrongly hands out is written with
 * cuMemsetD8Async, so the driver says what a kernel would meet there. */
#include "testutil.h"

#define MB (1024u * 1024u)

static void refuses(const char *conf, int second_stream, CUstream s, CUstream s2)
{
    const size_t sizes[2] = {4096, 48 * MB};
    fabpool_t *p = t_pool(conf);
    if (!p)
        return;
    if (second_stream) { /* the owner mode ended by a second stream */
        void *x = NULL, *y = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, 100, s, &x));
        CHECK_OK(fabpool_alloc_on_stream(p, 100, s2, &y));
        CHECK_OK(fabpool_free(p, x));
        CHECK_OK(fabpool_free(p, y));
    }
    void *b[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &b[i]));
        CHECK_CU(cuMemsetD8Async((CUdeviceptr)(uintptr_t)b[i], 0x5a, sizes[i], s));
    }
    CHECK_CU(cuStreamSynchronize(s));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, s));
    for (int i = 0; i < 2; i++)
        CHECK_OK(fabpool_free_on_stream(p, b[i], s));
    for (int i = 0; i < 2; i++) {
        void *q = NULL;
        fabpool_status st = fabpool_alloc_on_stream(p, sizes[i], s, &q);
        CHECK(st == FABPOOL_ERR_ASLEEP && q == NULL);
        if (st == FABPOOL_OK && q) {
            CUresult r = cuMemsetD8Async((CUdeviceptr)(uintptr_t)q, 0, sizes[i], s);
            CUresult r2 = cuStreamSynchronize(s);
            fprintf(stderr, "  %s: a %zu-byte block handed out while asleep at %p; a memset there answers %d, the "
                    "stream %d\n", conf, sizes[i], q, (int)r, (int)r2);
            CHECK(0);
            return; /* the context may be gone */
        }
    }
    CHECK_OK(fabpool_wake(p, s));
    for (int i = 0; i < 2; i++) {
        void *q = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &q));
        CHECK_CU(cuMemsetD8Async((CUdeviceptr)(uintptr_t)q, 0, sizes[i], s));
        CHECK_OK(fabpool_free_on_stream(p, q, s));
    }
    CHECK_CU(cuStreamSynchronize(s));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_driver_init();
    CUstream s, s2;
    CHECK_CU(cuStreamCreate(&s, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));
    refuses("handle_type:none,stream_owner:0", 0, s, s2);
    refuses("handle_type:none", 1, s, s2);
    cuStreamDestroy(s);
    cuStreamDestroy(s2);
    return t_done("test_asleep_on_stream");
}
