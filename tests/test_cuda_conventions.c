/* test_cuda_conventions: the edge cases that cudaMalloc, cudaMallocAsync and
 * free() settle by convention, answered as they are (fabpool.h, "Sizes of 0
 * and NULL"): a size of 0 succeeds with NULL, NULL is freed as a no-op (on a
 * stream too), fabpool_destroy(NULL) does nothing, and none of them changes
 * the pool, its stats, its trace or what the driver holds.  A NULL pool or
 * output pointer stays a caller's error. */
#include "testutil.h"

static void size_zero_gives_null(fabpool_t *p, CUstream s)
{
    fabpool_stats s0 = t_stats(p);
    int64_t held0 = t_held();
    void *a = (void *)1, *b = (void *)1;
    CHECK_OK(fabpool_alloc(p, 0, &a));
    CHECK(a == NULL);
    CHECK_OK(fabpool_alloc_on_stream(p, 0, s, &b));
    CHECK(b == NULL);
    /* what a size of 0 gave is taken back as cudaFree takes it */
    CHECK_OK(fabpool_free(p, a));
    CHECK_OK(fabpool_free_on_stream(p, b, s));
    fabpool_stats s1 = t_stats(p);
    CHECK(s1.blocks == s0.blocks && s1.in_use_bytes == s0.in_use_bytes && s1.mapped_bytes == s0.mapped_bytes);
    CHECK(t_held() == held0);
}

static void null_is_freed_as_nothing(fabpool_t *p, CUstream s)
{
    void *live = NULL;
    CHECK_OK(fabpool_alloc(p, 4096, &live));
    fabpool_counters k0 = t_counters(p);
    CHECK_OK(fabpool_free(p, NULL));
    CHECK_OK(fabpool_free_on_stream(p, NULL, s));
    CHECK_OK(fabpool_free_on_stream(p, NULL, NULL));
    CHECK_OK(fabpool_record_stream(p, NULL, s)); /* PyTorch records streams on empty tensors too */
    fabpool_counters k1 = t_counters(p);
    CHECK(k1.stream_frees == k0.stream_frees && k1.stream_pending_blocks == k0.stream_pending_blocks);
    /* the live block is untouched, and the stream never became the pool's owner stream */
    CHECK(t_stats(p).blocks == 1);
    CHECK_OK(fabpool_free(p, live));
    CHECK_OK(fabpool_check(p));
}

static void null_pool_still_refused(void)
{
    void *a = (void *)1;
    CHECK_STATUS(fabpool_alloc(NULL, 0, &a), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "pool is NULL") != NULL);
    CHECK_STATUS(fabpool_free(NULL, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_alloc_on_stream(NULL, 0, NULL, &a), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_free_on_stream(NULL, NULL, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_record_stream(NULL, NULL, NULL), FABPOOL_ERR_INVALID_ARG);
}

static void null_output_still_refused(fabpool_t *p)
{
    CHECK_STATUS(fabpool_alloc(p, 0, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_alloc_on_stream(p, 0, NULL, NULL), FABPOOL_ERR_INVALID_ARG);
}

static void destroy_null_does_nothing(void)
{
    CHECK_OK(fabpool_destroy(NULL));
}

/* Size 0 asked of a sleeping pool: nothing is asked of the driver either, so the answer is the same. */
static void size_zero_while_asleep(void)
{
    fabpool_t *p = t_pool(NULL);
    if (!p)
        return;
    void *a = (void *)1;
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_DISCARD, NULL));
    CHECK_OK(fabpool_alloc(p, 0, &a));
    CHECK(a == NULL);
    CHECK_OK(fabpool_free(p, NULL));
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_driver_init();
    /* no owner stream, so that a stream call that did something would show in the counters */
    fabpool_t *p = t_pool("stream_owner:0");
    CUstream s = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return t_done("test_cuda_conventions");
    size_zero_gives_null(p, s);
    null_is_freed_as_nothing(p, s);
    null_pool_still_refused();
    null_output_still_refused(p);
    destroy_null_does_nothing();
    size_zero_while_asleep();
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
    return t_done("test_cuda_conventions");
}
