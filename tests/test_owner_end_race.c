/* test_owner_end_race: the owner stream's freed memory is never handed out before its work is done, however the
 * end of the owner mode races.  The owner stream S1 allocates blocks and frees them (into the pool at once, the
 * owner mode) while its work is held (the sim's stream hold: its kernels still run); then two threads, one with
 * fabpool_alloc and one with fabpool_alloc_on_stream of another stream, race to end the mode.  The first to end it
 * turns the mode off and then fences (waits for S1's work); the other must not take memory meanwhile:
 *   - with every event record and context synchronize failing, no fence can complete: every allocation of either
 *     thread must fail (it did succeed, with the owner's blocks, while another thread's fence was under way);
 *   - without faults (the fence waits on S1's event, which the sim answers), no thread may get one of the
 *     owner's blocks while S1 is still held.
 * And fabpool_stream_owner_end, the mode ended by a call; and the thread caches while a fence waits: a thread that
 * freed the owner's small blocks into its own cache must not take them back before the fence that ends the mode
 * is done, whoever else allocates meanwhile; a free refused after it ended the mode (a double free found late) puts
 * the mode back.
 * Needs the simulated driver (its stream holds and faults). */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

enum { K = 32 };

static fabpool_t *P;
static CUstream S1, S2;
static void *owned[K];
static int go; /* the start, for both racers at once (atomic builtins) */
static long early, ok_calls;

static int is_owned(void *y)
{
    for (int i = 0; i < K; i++)
        if (owned[i] == y)
            return 1;
    return 0;
}

static void *racer(void *arg)
{
    long id = (long)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE))
        ;
    for (int i = 0; i < 200; i++) {
        void *y = NULL;
        fabpool_status st = id ? fabpool_alloc_on_stream(P, 1 << 20, S2, &y) : fabpool_alloc(P, 1 << 20, &y);
        if (st != FABPOOL_OK)
            continue;
        __atomic_fetch_add(&ok_calls, 1, __ATOMIC_RELAXED);
        if (cuStreamQuery(S1) == CUDA_ERROR_NOT_READY && is_owned(y))
            __atomic_fetch_add(&early, 1, __ATOMIC_RELAXED);
        /* kept live: the next call must find another block */
    }
    return NULL;
}

/* One race; 0 if it held. */
static int trial(t_sim_hooks *h, int fault)
{
    CHECK_OK(fabpool_create(NULL, &P));
    CHECK_CU(cuStreamCreate(&S1, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&S2, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < K; i++)
        CHECK_OK(fabpool_alloc_on_stream(P, 1 << 20, S1, &owned[i]));
    h->hold(S1);
    for (int i = 0; i < K; i++)
        CHECK_OK(fabpool_free_on_stream(P, owned[i], S1));
    if (fault) {
        h->fault_set("cuEventRecord", 0, 1, CUDA_ERROR_LAUNCH_FAILED);
        h->fault_set("cuCtxSynchronize", 0, 1, CUDA_ERROR_LAUNCH_FAILED);
        h->fault_set("cuEventSynchronize", 0, 1, CUDA_ERROR_LAUNCH_FAILED);
    }
    __atomic_store_n(&go, 0, __ATOMIC_RELEASE);
    early = ok_calls = 0;
    pthread_t a, b;
    pthread_create(&a, NULL, racer, (void *)0);
    pthread_create(&b, NULL, racer, (void *)1);
    __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    if (fault)
        h->fault_clear();
    int broken = early > 0 || (fault && ok_calls > 0);
    if (broken)
        fprintf(stderr, "  %s: %ld allocations succeeded, %ld of them an owner's block while its stream was held\n",
                fault ? "no fence could complete" : "no faults", ok_calls, early);
    h->release(S1);
    CHECK_OK(fabpool_collect(P, 1));
    (void)fabpool_destroy(P); /* BUSY: the racers' blocks are live; the pool goes all the same */
    CHECK_CU(cuStreamDestroy(S1));
    CHECK_CU(cuStreamDestroy(S2));
    return broken;
}

/* fabpool_stream_owner_end: with an owner whose work is held, it fences (the work is done when it returns) and the
 * mode is over (the stream's next frees wait for events); on a pool with no owner yet, none comes; a refused
 * fence leaves the mode on; NULL is refused. */
static void owner_end_by_call(t_sim_hooks *h)
{
    CHECK_STATUS(fabpool_stream_owner_end(NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_create(NULL, &P));
    CHECK_CU(cuStreamCreate(&S1, CU_STREAM_NON_BLOCKING));
    void *x = NULL;
    CHECK_OK(fabpool_alloc_on_stream(P, 1 << 20, S1, &x));
    h->hold(S1);
    CHECK_OK(fabpool_free_on_stream(P, x, S1)); /* the owner's: to the pool at once */
    fabpool_counters k0 = {.struct_size = sizeof k0}, k1 = k0;
    CHECK_OK(fabpool_get_counters(P, &k0));
    CHECK(k0.stream_owner_frees == 1);
    h->fault_set("cuEventRecord", 0, 1, CUDA_ERROR_LAUNCH_FAILED);
    h->fault_set("cuCtxSynchronize", 0, 1, CUDA_ERROR_LAUNCH_FAILED);
    CHECK(fabpool_stream_owner_end(P) != FABPOOL_OK); /* no fence: the mode holds */
    h->fault_clear();
    CHECK(cuStreamQuery(S1) == CUDA_ERROR_NOT_READY);
    CHECK_OK(fabpool_stream_owner_end(P));
    CHECK(cuStreamQuery(S1) == CUDA_SUCCESS); /* fenced */
    CHECK_OK(fabpool_alloc_on_stream(P, 1 << 20, S1, &x));
    CHECK_OK(fabpool_free_on_stream(P, x, S1));
    CHECK_OK(fabpool_get_counters(P, &k1));
    CHECK(k1.stream_owner_frees == 1 && k1.stream_fences > k0.stream_fences); /* no owner free since */
    CHECK_OK(fabpool_destroy(P));
    /* no owner yet: none comes */
    CHECK_OK(fabpool_create(NULL, &P));
    CHECK_OK(fabpool_stream_owner_end(P));
    CHECK_OK(fabpool_alloc_on_stream(P, 1 << 20, S1, &x));
    CHECK_OK(fabpool_free_on_stream(P, x, S1));
    CHECK_OK(fabpool_get_counters(P, &k1));
    CHECK(k1.stream_owner_frees == 0);
    CHECK_OK(fabpool_collect(P, 1));
    CHECK_OK(fabpool_destroy(P));
    CHECK_CU(cuStreamDestroy(S1));
}

/* The thread-cache window: W freed the owner's small blocks into its cache; U ends the owner mode and its fence
 * waits on S1's long kernel; T allocates meanwhile (its call waits for that fence too); then W allocates. */
static _Atomic int w_stage; /* 1: W's blocks freed, 2: go, 3: W's allocation returned */
static _Atomic int w_early; /* W got one of the owner's blocks while S1 still ran */

static void *window_w(void *arg)
{
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    void *y = NULL;
    CHECK_OK(fabpool_alloc(P, 256, &y)); /* W's cache, before any owner */
    CHECK_OK(fabpool_free(P, y));
    for (int i = 0; i < K; i++)
        CHECK_OK(fabpool_alloc_on_stream(P, 256, S1, &owned[i])); /* S1 the owner */
    t_sim_hooks h = t_sim_hooks_get();
    h.hold_long(S1);
    for (int i = 0; i < K; i++)
        CHECK_OK(fabpool_free_on_stream(P, owned[i], S1)); /* at once, into W's cache */
    atomic_store(&w_stage, 1);
    while (atomic_load(&w_stage) != 2)
        usleep(1000);
    CHECK_OK(fabpool_alloc(P, 256, &y));
    if (cuStreamQuery(S1) == CUDA_ERROR_NOT_READY && is_owned(y))
        atomic_store(&w_early, 1);
    atomic_store(&w_stage, 3);
    CHECK_OK(fabpool_free(P, y));
    CHECK_OK(fabpool_thread_flush(P));
    return NULL;
}

static void *window_u(void *arg)
{
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    CHECK_OK(fabpool_stream_owner_end(P)); /* the mode off, then its fence waits for S1 */
    return NULL;
}

static void *window_t(void *arg)
{
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    CHECK_OK(fabpool_alloc(P, 256, (void **)arg));
    return NULL;
}

static void thread_cache_window(t_sim_hooks *h)
{
    CHECK_OK(fabpool_create(NULL, &P));
    CHECK_CU(cuStreamCreate(&S1, CU_STREAM_NON_BLOCKING));
    atomic_store(&w_stage, 0);
    atomic_store(&w_early, 0);
    pthread_t w, u, t;
    void *ty = NULL;
    pthread_create(&w, NULL, window_w, NULL);
    while (atomic_load(&w_stage) != 1)
        usleep(1000);
    pthread_create(&u, NULL, window_u, NULL);
    usleep(50000);
    CHECK(cuStreamQuery(S1) == CUDA_ERROR_NOT_READY); /* U's fence still waits */
    pthread_create(&t, NULL, window_t, &ty);
    usleep(50000);
    atomic_store(&w_stage, 2);
    for (int i = 0; i < 200 && atomic_load(&w_stage) != 3; i++)
        usleep(1000);
    int took = atomic_load(&w_early);
    h->release(S1);
    pthread_join(w, NULL);
    pthread_join(u, NULL);
    pthread_join(t, NULL);
    if (took)
        fprintf(stderr, "  a thread took back the owner's block from its cache before the fence was done\n");
    CHECK(!took);
    CHECK_OK(fabpool_free(P, ty));
    CHECK_OK(fabpool_check(P));
    CHECK_OK(fabpool_destroy(P));
    CHECK_CU(cuStreamDestroy(S1));
}

/* A free on another stream that ends the owner mode, then finds the block freed meanwhile by another thread
 * (the program's double free, while the end's fence waited on S1's long kernel), is refused and leaves the owner
 * mode as it was: the owner's next free goes to the pool at once. */
static fabpool_status refused_st;
static void *X;

static void *free_on_s2(void *arg)
{
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    refused_st = fabpool_free_on_stream(P, X, S2); /* not the owner: fences (waits for S1), then marks X pending */
    return NULL;
}

static void refused_free_keeps_owner(t_sim_hooks *h)
{
    CHECK_OK(fabpool_create(NULL, &P));
    CHECK_CU(cuStreamCreate(&S1, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&S2, CU_STREAM_NON_BLOCKING));
    void *y = NULL;
    CHECK_OK(fabpool_alloc_on_stream(P, 256, S1, &y)); /* S1 owns the pool */
    CHECK_OK(fabpool_alloc_on_stream(P, 256, S1, &X));
    h->hold_long(S1);
    CHECK_OK(fabpool_free_on_stream(P, y, S1)); /* an owner's free: the next other user fences */
    fabpool_counters k0 = {.struct_size = sizeof k0}, k1 = k0;
    CHECK_OK(fabpool_get_counters(P, &k0));
    pthread_t t;
    pthread_create(&t, NULL, free_on_s2, NULL);
    usleep(100000); /* t waits in the fence on S1's long kernel */
    CHECK_OK(fabpool_free(P, X));
    h->release(S1);
    pthread_join(t, NULL);
    CHECK(refused_st == FABPOOL_ERR_DOUBLE_FREE);
    CHECK_OK(fabpool_alloc_on_stream(P, 256, S1, &y));
    CHECK_OK(fabpool_free_on_stream(P, y, S1));
    CHECK_OK(fabpool_get_counters(P, &k1));
    CHECK(k1.stream_owner_frees == k0.stream_owner_frees + 1 && k1.stream_pending_blocks == 0);
    CHECK_OK(fabpool_collect(P, 1));
    CHECK_OK(fabpool_destroy(P));
    CHECK_CU(cuStreamDestroy(S1));
    CHECK_CU(cuStreamDestroy(S2));
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_owner_end_race", "stream holds and faults");
    owner_end_by_call(&h);
    thread_cache_window(&h);
    refused_free_keeps_owner(&h);
    int bad = 0;
    for (int t = 0; t < 20; t++)
        bad += trial(&h, 1);
    for (int t = 0; t < 100; t++)
        bad += trial(&h, 0);
    CHECK(bad == 0);
    printf("test_owner_end_race: 120 races, %d handed out memory without a completed fence\n", bad);
    CHECK(t_near(t_held(), 0));
    return t_done("test_owner_end_race");
}
