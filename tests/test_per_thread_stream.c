/* test_per_thread_stream: the per-thread default stream (CU_STREAM_PER_THREAD, 0x2) names a different stream in
 * every thread, so fabpool cannot order one thread's allocation on it after another thread's free on it.
 *   - thread A frees a block on its per-thread stream while its work there is held: the free waits for that
 *     stream (it is done when the free returns), so a block thread B then gets on its own per-thread stream,
 *     the same block or not, is never one A's work still uses; neither thread's stream becomes the owner;
 *   - fabpool_record_stream with the handle is refused, naming what to pass instead;
 *   - with stream_owner:0 too.
 * Needs the simulated driver (its stream hold). */
#include <pthread.h>

#include "testutil.h"

static fabpool_t *P;

static void *thread_b(void *arg)
{
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    void *y = NULL;
    CHECK_OK(fabpool_alloc_on_stream(P, 4096, CU_STREAM_PER_THREAD, &y));
    return y;
}

static void one(t_sim_hooks *h, const char *conf, int first_on_stream)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = conf;
    CHECK_OK(fabpool_create(&o, &P));
    void *x = NULL;
    if (first_on_stream)
        CHECK_OK(fabpool_alloc_on_stream(P, 4096, CU_STREAM_PER_THREAD, &x));
    else
        CHECK_OK(fabpool_alloc(P, 4096, &x));
    CHECK_STATUS(fabpool_record_stream(P, x, CU_STREAM_PER_THREAD), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "names a different stream in every thread") != NULL);
    h->hold(CU_STREAM_PER_THREAD); /* thread A's work on x still runs */
    CHECK(cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_ERROR_NOT_READY);
    CHECK_OK(fabpool_free_on_stream(P, x, CU_STREAM_PER_THREAD));
    CHECK(cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_SUCCESS); /* the free waited for it */
    pthread_t t;
    void *y = NULL;
    pthread_create(&t, NULL, thread_b, NULL);
    pthread_join(t, &y);
    CHECK(y != NULL);
    fabpool_counters k = {.struct_size = sizeof k};
    CHECK_OK(fabpool_get_counters(P, &k));
    CHECK(k.stream_owner_frees == 0); /* the handle never owned the pool */
    CHECK_OK(fabpool_free(P, y));
    CHECK_OK(fabpool_destroy(P));
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_per_thread_stream", "stream holds");
    one(&h, "", 1);
    one(&h, "", 0);
    one(&h, "stream_owner:0", 1);
    CHECK(t_near(t_held(), 0));
    return t_done("test_per_thread_stream");
}
