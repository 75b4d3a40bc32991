/* test_stream: the stream-ordered pair fabpool_alloc_on_stream /
 * fabpool_free_on_stream and the stream-pending queue behind it (lib/device/pending.c).
 * A block freed on a stream comes back at once to the same stream; another
 * stream and fabpool_alloc get it only once the stream's work is done (the
 * simulated driver holds a stream so that its events do not complete); no
 * trim, decay or large-block chunk trade unmaps memory that a pending block
 * holds (the sim's ledger and the data read back say so); destroy leaves
 * nothing held; bad input changes nothing; two threads on two streams.
 * Those run with stream_owner:0 (every stream queues).  The owner stream
 * (the default): its frees go to the pool at once, so another size reuses
 * the memory with no driver call; a trim, or an allocation that is not the
 * owner's, first waits for the owner's queued work (a fence), and the
 * latter ends the owner mode; two threads on the owner stream. */
#include <pthread.h>

#include "testutil.h"

#define MB (1ull << 20)

static int (*hold)(void *);
static int (*release)(void *);
static uint64_t (*calls)(const char *);

static fabpool_counters counters(fabpool_t *p)
{
    fabpool_counters c = {.struct_size = sizeof c};
    CHECK_OK(fabpool_get_counters(p, &c));
    return c;
}



/* The same stream gets its block back at once, with no driver call. */
static void same_stream(CUstream s)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    size_t sizes[] = {100, 4096, 300000, 5 * MB, 20 * MB, 100 * MB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        void *x = NULL, *y = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, n, s, &x));
        t_put_tag(x, n, 0x1000 + i);
        uint64_t c0 = calls(NULL);
        fabpool_counters k0 = counters(p);
        CHECK_OK(fabpool_free_on_stream(p, x, s));
        CHECK(counters(p).stream_pending_blocks == k0.stream_pending_blocks + 1);
        CHECK_OK(fabpool_alloc_on_stream(p, n - n / 16, s, &y)); /* the same class, or a large block that fits */
        CHECK(calls(NULL) == c0);
        CHECK(y == x);
        CHECK(t_tag_ok(y, n, 0x1000 + i));
        fabpool_counters k1 = counters(p);
        CHECK(k1.stream_reuse_same == k0.stream_reuse_same + 1 && k1.stream_pending_blocks == k0.stream_pending_blocks);
        CHECK_OK(fabpool_free_on_stream(p, y, s));
    }
    /* a large block far larger than asked is not given (at most 1.25x) */
    void *big = NULL, *small = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &big));
    CHECK_OK(fabpool_free_on_stream(p, big, s));
    fabpool_counters k0 = counters(p);
    CHECK_OK(fabpool_alloc_on_stream(p, 40 * MB, s, &small));
    size_t us = 0;
    CHECK_OK(fabpool_usable_size(p, small, &us));
    CHECK(us >= 40 * MB && us <= 50 * MB && counters(p).stream_reuse_same == k0.stream_reuse_same);
    CHECK_OK(fabpool_free(p, small));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

/* Another stream and fabpool_alloc get a block only once the work of the
 * stream it was freed on is done.  `from` may be NULL (the legacy default stream). */
static void other_streams(CUstream from, CUstream to, size_t n)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    void *x = NULL, *y = NULL, *z = NULL, *w = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, n, from, &x));
    t_put_tag(x, n, 0xabcdef);
    hold(from); /* kernels on `from` that use x are still queued */
    CHECK_OK(fabpool_free_on_stream(p, x, from));
    fabpool_counters k0 = counters(p);
    CHECK_OK(fabpool_alloc_on_stream(p, n, to, &y));
    CHECK(y != NULL && y != x);
    CHECK_OK(fabpool_alloc(p, n, &z));
    CHECK(z != NULL && z != x);
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_events_recorded > k0.stream_events_recorded); /* the miss recorded one event on `from` */
    CHECK(k1.stream_pending_blocks == 1 && k1.stream_releases == k0.stream_releases);
    CHECK_OK(fabpool_collect(p, 0)); /* not done yet: it stays */
    CHECK(counters(p).stream_pending_blocks == 1);
    CHECK(t_tag_ok(x, n, 0xabcdef)); /* mapped, data and all */
    /* fabpool_free of it is a double free now */
    CHECK_STATUS(fabpool_free(p, x), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(strstr(fabpool_last_error(), "stream") != NULL);
    release(from);
    CHECK_OK(fabpool_alloc_on_stream(p, n, to, &w));
    CHECK(w == x); /* now it is done: handed over */
    CHECK(t_tag_ok(w, n, 0xabcdef));
    fabpool_counters k2 = counters(p);
    CHECK(k2.stream_reuse_after_event == k1.stream_reuse_after_event + 1 && k2.stream_pending_blocks == 0);
    /* and to fabpool_alloc: freed on a held stream, then collected once done */
    hold(to);
    CHECK_OK(fabpool_free_on_stream(p, w, to));
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(counters(p).stream_pending_blocks == 1);
    release(to);
    CHECK_OK(fabpool_collect(p, 0));
    fabpool_counters k3 = counters(p);
    CHECK(k3.stream_pending_blocks == 0 && k3.stream_releases == k2.stream_releases + 1);
    CHECK_STATUS(fabpool_free(p, w), FABPOOL_ERR_DOUBLE_FREE); /* it is the pool's free memory now */
    CHECK_OK(fabpool_free(p, y));
    CHECK_OK(fabpool_free(p, z));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* fabpool_trim, the decay (decay_ms:0 trims at every slow path) and a
 * large allocation that trades free chunks never unmap a pending block. */
static void pending_stays_mapped(CUstream s, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0,decay_ms:0");
    if (!p)
        return;
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &a)); /* large blocks */
    CHECK_OK(fabpool_alloc_on_stream(p, 1 * MB, s, &b));
    t_put_tag(a, 64 * MB, 0xa);
    t_put_tag(b, 1 * MB, 0xb);
    hold(s);
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    CHECK_OK(fabpool_free_on_stream(p, b, s));
    uint64_t held0 = t_ledger().bytes_held;
    CHECK(held0 >= 66 * MB);
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_ledger().bytes_held == held0);
    CHECK(t_tag_ok(a, 64 * MB, 0xa) && t_tag_ok(b, 1 * MB, 0xb));
    /* decay: every slow path of a decay_ms:0 pool trims all idle memory */
    for (int i = 0; i < 4; i++) {
        void *q = NULL;
        CHECK_OK(fabpool_alloc(p, 3 * MB, &q));
        CHECK_OK(fabpool_free(p, q));
    }
    CHECK(t_tag_ok(a, 64 * MB, 0xa) && t_tag_ok(b, 1 * MB, 0xb));
    /* a larger block on another stream: a miss that would trade a's chunks if they were free */
    void *c = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 96 * MB, s2, &c));
    CHECK(c != a);
    CHECK(t_ledger().bytes_held >= 65 * MB + 96 * MB); /* a and b stay mapped beside c */
    CHECK(t_tag_ok(a, 64 * MB, 0xa) && t_tag_ok(b, 1 * MB, 0xb));
    fabpool_stats st = {.struct_size = sizeof st};
    CHECK_OK(fabpool_get_stats(p, &st));
    CHECK(st.stream_pending_blocks == 2 && st.stream_pending_bytes == 65 * MB);
    CHECK(st.mapped_bytes == t_ledger().bytes_mapped);
    /* done: the pool may take it back, and a trim returns it */
    release(s);
    CHECK_OK(fabpool_free(p, c));
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_ledger().bytes_held == 0);
    CHECK(counters(p).streams == 0); /* idle stream records are forgotten */
    CHECK_OK(fabpool_destroy(p));
}

/* Out of memory with blocks pending on a stream: the pool waits for them and tries once more. */
static void oom_waits_for_pending(CUstream s)
{
    t_sim_hooks sim = t_sim_hooks_get();
    int (*fault)(const char *, uint64_t, int, int) = sim.fault_set;
    void (*fault_clear)(void) = sim.fault_clear;
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0,decay_ms:0");
    if (!p || !fault || !fault_clear)
        return;
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &a));
    hold(s);
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    fabpool_counters k0 = counters(p);
    fault("cuMemCreate", 1, 0, CUDA_ERROR_OUT_OF_MEMORY); /* the next chunk: the device is full */
    CHECK_OK(fabpool_alloc(p, 64 * MB, &b));
    fault_clear();
    CHECK(b == a); /* a's memory, once the stream's work was waited for */
    fabpool_counters k1 = counters(p);
    CHECK(k1.oom_retries == k0.oom_retries + 1 && k1.stream_pending_blocks == 0);
    CHECK_OK(fabpool_free(p, b));
    release(s);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* Destroy with blocks pending on held streams: nothing stays held, no block counts as live. */
static void destroy_pending(CUstream s, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    hold(s);
    hold(s2);
    for (int i = 0; i < 40; i++) {
        void *x = NULL;
        CUstream on = i % 2 ? s : s2;
        CHECK_OK(fabpool_alloc_on_stream(p, (size_t)(i % 5 ? 1000ull * (uint64_t)(i + 1) : (uint64_t)(i + 1) * 3 * MB), on, &x));
        CHECK_OK(fabpool_free_on_stream(p, x, on));
    }
    CHECK(counters(p).stream_pending_blocks > 0);
    CHECK_OK(fabpool_destroy(p));
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_held == 0 && l.mappings == 0 && l.reservations == 0 && l.handles == 0);
    release(s);
    release(s2);
}

/* Bad input: a clear status and message, nothing changed. */
static void bad_input(CUstream s)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0"), *q = t_pool("handle_type:none,stream_owner:0");
    if (!p || !q)
        return;
    void *x = NULL, *big = NULL, *other = NULL;
    CHECK_OK(fabpool_alloc(p, 4096, &x));
    CHECK_OK(fabpool_alloc(p, 24 * MB, &big));
    CHECK_OK(fabpool_alloc(q, 4096, &other));
    fabpool_counters k0 = counters(p);
    hold(s); /* what is freed on s below stays pending */
    CHECK_STATUS(fabpool_free_on_stream(NULL, x, s), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "pool is NULL") != NULL);
    CHECK_OK(fabpool_free_on_stream(p, NULL, s)); /* nothing to free: test_cuda_conventions */
    CHECK_STATUS(fabpool_free_on_stream(p, other, s), FABPOOL_ERR_NOT_FOUND); /* another pool's */
    CHECK(strstr(fabpool_last_error(), "did not give out") != NULL);
    int local;
    CHECK_STATUS(fabpool_free_on_stream(p, &local, s), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_free_on_stream(p, (char *)x + 256, s), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_free_on_stream(p, (char *)big + 2 * MB, s), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_frees == k0.stream_frees && k1.stream_pending_blocks == 0);
    /* double frees: on a stream twice, and on a stream after fabpool_free */
    CHECK_OK(fabpool_free_on_stream(p, x, s));
    CHECK_STATUS(fabpool_free_on_stream(p, x, s), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(strstr(fabpool_last_error(), "double free") != NULL);
    CHECK_OK(fabpool_free_on_stream(p, big, s));
    CHECK_STATUS(fabpool_free_on_stream(p, big, s), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_STATUS(fabpool_free(p, big), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(counters(p).stream_pending_blocks == 2 && counters(p).stream_frees == k0.stream_frees + 2);
    void *y = NULL;
    CHECK_OK(fabpool_alloc(p, 4096, &y));
    CHECK_OK(fabpool_free(p, y));
    CHECK_STATUS(fabpool_free_on_stream(p, y, s), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(counters(p).stream_pending_blocks == 2);
    /* alloc_on_stream's own checks */
    void *z = (void *)1;
    CHECK_STATUS(fabpool_alloc_on_stream(NULL, 10, s, &z), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_alloc_on_stream(p, 10, s, NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_alloc_on_stream(p, 0, s, &z)); /* cudaMallocAsync's answer: NULL */
    CHECK(z == NULL);
    CHECK(fabpool_alloc_on_stream(p, (size_t)1 << 62, s, &z) != FABPOOL_OK && z == NULL);
    CHECK_STATUS(fabpool_get_counters(NULL, &k1), FABPOOL_ERR_INVALID_ARG);
    release(s);
    CHECK_OK(fabpool_free(q, other));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p)); /* the pending blocks are not live blocks: OK, not BUSY */
    CHECK(t_ledger().bytes_held == 0);
}

/* Two threads, each on its own stream (and sometimes the other's frees
 * pending): no block is ever given to both (every live block keeps its tag). */
typedef struct worker {
    fabpool_t *p;
    CUstream s;
    int id, failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    cuCtxSetCurrent(t_ctx);
    enum { N = 32 };
    void *live[N] = {0};
    size_t sz[N] = {0};
    uint64_t seed = 777 + (uint64_t)w->id * 1000003;
    for (int i = 0; i < 4000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % N);
        uint64_t tag = ((uint64_t)w->id << 56) ^ ((uint64_t)k << 40) ^ sz[k];
        if (live[k]) {
            if (!t_tag_ok(live[k], sz[k], tag))
                w->failures++;
            if (fabpool_free_on_stream(w->p, live[k], w->s) != FABPOOL_OK)
                w->failures++;
            live[k] = NULL;
        } else {
            unsigned r = (unsigned)(seed >> 40);
            sz[k] = r % 9 == 0 ? (size_t)(9 + r % 12) * MB : 256 + r % (300 << 10);
            if (fabpool_alloc_on_stream(w->p, sz[k], w->s, &live[k]) != FABPOOL_OK) {
                w->failures++;
                live[k] = NULL;
                continue;
            }
            /* not t_put_tag(): CHECK's counters are the main thread's */
            uint64_t t1 = ((uint64_t)w->id << 56) ^ ((uint64_t)k << 40) ^ sz[k], t2 = ~t1;
            if (cuMemcpyHtoD((CUdeviceptr)(uintptr_t)live[k], &t1, sizeof t1) != CUDA_SUCCESS ||
                cuMemcpyHtoD((CUdeviceptr)(uintptr_t)live[k] + sz[k] - sizeof t2, &t2, sizeof t2) != CUDA_SUCCESS)
                w->failures++;
        }
        if (i % 1000 == 500)
            fabpool_trim(w->p, 0);
    }
    for (int k = 0; k < N; k++)
        if (live[k] && fabpool_free_on_stream(w->p, live[k], w->s) != FABPOOL_OK)
            w->failures++;
    return NULL;
}

static void threads(CUstream s, CUstream s2, const char *conf)
{
    fabpool_t *p = t_pool(conf);
    if (!p)
        return;
    worker w[2] = {{p, s, 0, 0}, {p, s2, 1, 0}};
    pthread_t th[2];
    if (s2 != s)
        hold(s2); /* the second thread's frees stay pending for a while */
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    pthread_join(th[0], NULL);
    release(s2);
    pthread_join(th[1], NULL);
    CHECK(w[0].failures == 0 && w[1].failures == 0);
    fabpool_counters k = counters(p);
    CHECK(s2 == s ? k.stream_owner_frees == k.stream_frees && k.stream_frees > 1000 : k.stream_reuse_same > 100);
    printf("threads (%s): %llu frees on streams, %llu same-stream reuses, %llu after an event, %llu back to the pool, "
           "%llu events recorded\n", conf, (unsigned long long)k.stream_frees, (unsigned long long)k.stream_reuse_same,
           (unsigned long long)k.stream_reuse_after_event, (unsigned long long)k.stream_releases,
           (unsigned long long)k.stream_events_recorded);
    fabpool_stats st = {.struct_size = sizeof st};
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_get_stats(p, &st));
    CHECK(st.blocks == 0 && st.stream_pending_blocks == 0 && st.in_use_bytes == 0);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* ------------------------------------------------------------ the owner stream */

static CUevent marker(CUstream s)
{
    CUevent ev = NULL;
    CHECK_CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CHECK_CU(cuEventRecord(ev, s));
    return ev;
}

/* The owner's frees go to the pool at once: another size on the owner
 * reuses their memory while the owner's work is still queued, with no
 * driver call and no queue. */
static void owner_reuse(CUstream s)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &a));
    CHECK_OK(fabpool_alloc_on_stream(p, 300000, s, &c));
    t_put_tag(a, 64 * MB, 0xa);
    uint64_t held0 = t_ledger().bytes_held;
    fabpool_counters k0 = counters(p);
    hold(s); /* the owner's work on a and c is still queued */
    uint64_t c0 = calls(NULL);
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    CHECK_OK(fabpool_free_on_stream(p, c, s));
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_owner_frees == k0.stream_owner_frees + 2 && k1.stream_frees == k0.stream_frees + 2);
    CHECK(k1.stream_pending_blocks == 0 && k1.streams == k0.streams);
    /* a different size takes a's memory: with the queue it would map more (see same_stream's 1.25x rule) */
    CHECK_OK(fabpool_alloc_on_stream(p, 40 * MB, s, &b));
    CHECK((uintptr_t)b >= (uintptr_t)a && (uintptr_t)b + 40 * MB <= (uintptr_t)a + 64 * MB);
    CHECK_OK(fabpool_alloc_on_stream(p, 300000, s, &d)); /* the rest of the memory a and c left */
    CHECK((uintptr_t)d >= (uintptr_t)c && (uintptr_t)d + 300000 <= (uintptr_t)a + 64 * MB);
    CHECK(calls(NULL) == c0); /* no driver call: no event, no map */
    CHECK(t_ledger().bytes_held == held0);
    fabpool_counters k2 = counters(p);
    CHECK(k2.chunks_mapped_total == k1.chunks_mapped_total && k2.stream_events_recorded == k0.stream_events_recorded);
    CHECK(k2.stream_fences == k0.stream_fences);
    CHECK_OK(fabpool_check(p));
    /* the same double-free and foreign-pointer checks as the queue */
    CHECK_OK(fabpool_free_on_stream(p, d, s));
    CHECK_STATUS(fabpool_free_on_stream(p, d, s), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_STATUS(fabpool_free(p, d), FABPOOL_ERR_DOUBLE_FREE);
    int local;
    CHECK_STATUS(fabpool_free_on_stream(p, &local, s), FABPOOL_ERR_NOT_FOUND);
    CHECK(counters(p).stream_owner_frees == k2.stream_owner_frees + 1);
    CHECK_OK(fabpool_free_on_stream(p, b, s));
    release(s);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

/* An unmap waits for the owner's queued work first, once per batch of frees. */
static void owner_fences(CUstream s, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none,decay_ms:600000");
    if (!p)
        return;
    void *a = NULL, *b = NULL, *x = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &a));
    CHECK_OK(fabpool_alloc_on_stream(p, 1 * MB, s, &b));
    uint64_t held0 = t_ledger().bytes_held;
    hold(s);
    hold(s2); /* another stream's work: the fence does not wait for it */
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    CUevent ev = marker(s), ev2 = marker(s2);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
    fabpool_counters k0 = counters(p);
    CHECK_OK(fabpool_trim(p, 0)); /* unmaps a's chunks: only after the owner's work */
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev2) == CUDA_ERROR_NOT_READY);
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_fences == k0.stream_fences + 1 && k1.chunks_unmapped_total > k0.chunks_unmapped_total);
    CHECK(t_ledger().bytes_held <= held0 - 64 * MB);
    /* nothing freed since: a trim does not wait again */
    hold(s);
    CUevent ev3 = marker(s);
    CHECK_OK(fabpool_alloc_on_stream(p, 8 * MB, s, &x));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(cuEventQuery(ev3) == CUDA_ERROR_NOT_READY && counters(p).stream_fences == k1.stream_fences);
    /* the decay's unmaps fence too (decay_ms:0 trims at every slow path) */
    CHECK_OK(fabpool_free_on_stream(p, x, s));
    CHECK_OK(fabpool_free_on_stream(p, b, s));
    CHECK_OK(fabpool_collect(p, 1)); /* collect with wait: the owner's frees are waited for as well */
    CHECK(cuEventQuery(ev3) == CUDA_SUCCESS && counters(p).stream_fences == k1.stream_fences + 1);
    release(s2);
    cuEventDestroy(ev);
    cuEventDestroy(ev2);
    cuEventDestroy(ev3);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* A fence that cannot record its event waits for the whole context; one
 * that cannot make the context current fails the unmap, which leaves the
 * memory mapped (the sim's ledger) until a later trim; a refused free on
 * another stream leaves the owner mode as it was. */
static void owner_fence_faults(CUstream s)
{
    t_sim_hooks sim = t_sim_hooks_get();
    int (*fault)(const char *, uint64_t, int, int) = sim.fault_set;
    void (*fault_clear)(void) = sim.fault_clear;
    fabpool_t *p = t_pool("handle_type:none,decay_ms:600000");
    if (!p || !fault || !fault_clear)
        return;
    void *a = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 64 * MB, s, &a));
    uint64_t held0 = t_ledger().bytes_held;
    hold(s);
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    fabpool_counters k0 = counters(p);
    fault("cuCtxGetCurrent", 1, 1, CUDA_ERROR_INVALID_CONTEXT);
    fabpool_trim(p, 0); /* best effort: what it could not unmap stays */
    fault_clear();
    CHECK(t_ledger().bytes_held == held0 && counters(p).stream_fences == k0.stream_fences);
    CUevent ev = marker(s);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY); /* nothing waited for */
    fault("cuEventRecord", 1, 1, CUDA_ERROR_INVALID_HANDLE);
    CHECK_OK(fabpool_trim(p, 0)); /* the event failed: the context was synchronized instead */
    fault_clear();
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_fences == k0.stream_fences + 1 && k1.stream_syncs == k0.stream_syncs + 1);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS && t_ledger().bytes_held < held0);
    cuEventDestroy(ev);
    /* a free on another stream refused as bad input leaves the owner mode as it was */
    int local;
    CHECK_STATUS(fabpool_free_on_stream(p, &local, NULL), FABPOOL_ERR_NOT_FOUND);
    void *b = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, s, &b));
    CHECK_OK(fabpool_free_on_stream(p, b, s));
    CHECK(counters(p).stream_owner_frees == k1.stream_owner_frees + 1);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

/* The first allocation that is not the owner's waits for the owner's work
 * and ends the owner mode: from then on the owner's frees queue too. */
static void owner_ends(CUstream s, CUstream s2)
{
    for (int how = 0; how < 3; how++) {
        fabpool_t *p = t_pool("handle_type:none");
        if (!p)
            return;
        void *a = NULL, *b = NULL, *c = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, s, &a));
        t_put_tag(a, 4096, 0x77);
        hold(s);
        CHECK_OK(fabpool_free_on_stream(p, a, s));
        CUevent ev = marker(s);
        fabpool_counters k0 = counters(p);
        if (how == 0) {
            CHECK_OK(fabpool_alloc(p, 4096, &b)); /* plain: may get a's block, so waits first */
        } else if (how == 1) {
            CHECK_OK(fabpool_alloc_on_stream(p, 4096, s2, &b)); /* another stream */
        } else {
            CHECK_OK(fabpool_alloc(p, 100, &b)); /* any plain allocation ends it, even of another class */
        }
        CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
        fabpool_counters k1 = counters(p);
        CHECK(k1.stream_fences == k0.stream_fences + 1);
        if (how < 2)
            CHECK(b == a && t_tag_ok(b, 4096, 0x77)); /* a's block, after the owner's work */
        /* the owner mode is over: a free on s now waits in the queue */
        hold(s);
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, s, &c));
        CHECK_OK(fabpool_free_on_stream(p, c, s));
        fabpool_counters k2 = counters(p);
        CHECK(k2.stream_pending_blocks == 1 && k2.stream_owner_frees == k1.stream_owner_frees);
        release(s);
        CHECK_OK(fabpool_free(p, b));
        cuEventDestroy(ev);
        CHECK_OK(fabpool_destroy(p));
        CHECK(t_ledger().bytes_held == 0);
    }
    /* a pool made with stream_owner:0 never has an owner */
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    fabpool_options o = {.struct_size = sizeof o};
    CHECK_OK(fabpool_get_options(p, &o));
    CHECK(o.stream_owner == 0);
    void *a = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, s, &a));
    hold(s);
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    CHECK(counters(p).stream_pending_blocks == 1 && counters(p).stream_owner_frees == 0);
    release(s);
    CHECK_OK(fabpool_destroy(p));
}

/* A free on a stream refused as bad input (an interior pointer of a slab
 * block or a large one, a double free, a foreign pointer) claims no owner: a
 * second stream that comes after it owns the pool, and its frees go back at
 * once (no queue, no fence). */
static void refused_free_claims_nothing(CUstream s, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    void *x = NULL, *big = NULL, *y = NULL, *z = NULL;
    int local;
    CHECK_OK(fabpool_alloc(p, 4096, &x));
    CHECK_OK(fabpool_alloc(p, 24 * MB, &big));
    CHECK_OK(fabpool_alloc(p, 4096, &y));
    CHECK_OK(fabpool_free(p, y));
    CHECK_STATUS(fabpool_free_on_stream(p, (char *)x + 256, s), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_free_on_stream(p, (char *)big + 2 * MB, s), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_free_on_stream(p, y, s), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_STATUS(fabpool_free_on_stream(p, &local, s), FABPOOL_ERR_NOT_FOUND);
    fabpool_counters k0 = counters(p);
    CHECK(k0.stream_frees == 0 && k0.stream_owner_frees == 0 && k0.streams == 0);
    hold(s2); /* s2's work is queued: its frees go back at once all the same */
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, s2, &z));
    CHECK_OK(fabpool_free_on_stream(p, z, s2));
    CHECK_OK(fabpool_free_on_stream(p, x, s2));
    CHECK_OK(fabpool_free_on_stream(p, big, s2));
    fabpool_counters k1 = counters(p);
    CHECK(k1.stream_owner_frees == 3 && k1.stream_pending_blocks == 0 && k1.stream_fences == 0);
    release(s2);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* While the pool sleeps, fabpool_alloc_on_stream answers FABPOOL_ERR_ASLEEP
 * and changes nothing, whatever the stream holds: blocks it freed while the
 * pool slept (queued: with stream_owner:0, or once a second stream ended the
 * owner mode), or the owner's memory; a pool with no owner yet does not get
 * one from the refused call.  After the wake the blocks come back, their data
 * restored. */
static void asleep_refuses(CUstream s, CUstream s2)
{
    const size_t sizes[2] = {4096, 48 * MB};
    for (int how = 0; how < 3; how++) { /* 0: stream_owner:0, 1: the owner mode ended by s2, 2: s owns the pool */
        fabpool_t *p = t_pool(how == 0 ? "handle_type:none,stream_owner:0" : "handle_type:none");
        if (!p)
            return;
        if (how == 1) {
            void *x = NULL, *y = NULL;
            CHECK_OK(fabpool_alloc_on_stream(p, 100, s, &x));
            CHECK_OK(fabpool_alloc_on_stream(p, 100, s2, &y));
            CHECK_OK(fabpool_free(p, x));
            CHECK_OK(fabpool_free(p, y));
        }
        void *b[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &b[i]));
            t_put_tag(b[i], sizes[i], 0x5100u + (unsigned)i);
        }
        CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
        for (int i = 0; i < 2; i++)
            CHECK_OK(fabpool_free_on_stream(p, b[i], s));
        fabpool_counters k0 = counters(p);
        CHECK(how == 2 ? k0.stream_owner_frees == 2 : k0.stream_pending_blocks == 2);
        for (int i = 0; i < 2; i++) {
            CUstream on[2] = {s, s2};
            for (int k = 0; k < 2; k++) {
                void *q = (void *)1;
                CHECK_STATUS(fabpool_alloc_on_stream(p, sizes[i], on[k], &q), FABPOOL_ERR_ASLEEP);
                CHECK(q == NULL && strstr(fabpool_last_error(), "fabpool_wake") != NULL);
            }
        }
        fabpool_counters k1 = counters(p);
        CHECK(k1.stream_pending_blocks == k0.stream_pending_blocks && k1.stream_pending_bytes == k0.stream_pending_bytes);
        CHECK(k1.stream_reuse_same == k0.stream_reuse_same && k1.stream_reuse_after_event == k0.stream_reuse_after_event);
        CHECK(k1.stream_releases == k0.stream_releases && k1.stream_fences == k0.stream_fences);
        CHECK(k1.chunks_mapped_total == k0.chunks_mapped_total && t_ledger().bytes_held == 0);
        CHECK_OK(fabpool_wake(p, NULL));
        for (int i = 0; i < 2; i++) {
            void *q = NULL;
            CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &q));
            if (how < 2) /* its own freed block, mapped again with its data */
                CHECK(q == b[i] && t_tag_ok(q, sizes[i], 0x5100u + (unsigned)i));
            t_put_tag(q, sizes[i], 0x5200u + (unsigned)i);
            CHECK(t_tag_ok(q, sizes[i], 0x5200u + (unsigned)i));
            CHECK_OK(fabpool_free_on_stream(p, q, s));
        }
        CHECK_OK(fabpool_destroy(p));
        CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
    }
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_DISCARD, NULL));
    void *q = NULL;
    CHECK_STATUS(fabpool_alloc_on_stream(p, 4096, s, &q), FABPOOL_ERR_ASLEEP);
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, s2, &q));
    CHECK_OK(fabpool_free_on_stream(p, q, s2));
    CHECK(counters(p).stream_owner_frees == 1); /* s2 owns the pool, not s */
    CHECK_OK(fabpool_destroy(p));
}

/* CU_STREAM_LEGACY ((void *)0x1, cudaStreamLegacy) is the legacy default stream that NULL names: a block
 * allocated on one and freed on the other is the same stream's, for the owner and for the queue. */
static void legacy_is_null(void)
{
    void *const legacy = (void *)CU_STREAM_LEGACY;
    fabpool_t *p = t_pool("handle_type:none");
    if (p) {
        void *a = NULL, *b = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, NULL, &a)); /* NULL owns the pool */
        fabpool_counters k0 = counters(p);
        CHECK_OK(fabpool_free_on_stream(p, a, legacy)); /* the owner's free: at once, no fence */
        CHECK_OK(fabpool_alloc_on_stream(p, 300000, legacy, &b));
        fabpool_counters k1 = counters(p);
        CHECK(k1.stream_owner_frees == k0.stream_owner_frees + 1 && k1.stream_pending_blocks == 0);
        CHECK(k1.stream_fences == k0.stream_fences && k1.streams == k0.streams);
        /* recorded on the stream it is freed on: nothing added, the owner's free */
        CHECK_OK(fabpool_record_stream(p, b, legacy));
        CHECK_OK(fabpool_free_on_stream(p, b, NULL));
        fabpool_counters k2 = counters(p);
        CHECK(k2.stream_owner_frees == k1.stream_owner_frees + 1 && k2.stream_pending_blocks == 0);
        CHECK(k2.stream_fences == k0.stream_fences);
        CHECK_OK(fabpool_destroy(p));
    }
    p = t_pool("handle_type:none,stream_owner:0");
    if (p) {
        void *x = NULL, *y = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, NULL, &x));
        CHECK_OK(fabpool_free_on_stream(p, x, legacy));
        fabpool_counters k0 = counters(p);
        uint64_t c0 = calls(NULL);
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, NULL, &y)); /* the same stream's block, back at once */
        CHECK(y == x && calls(NULL) == c0 && counters(p).stream_reuse_same == k0.stream_reuse_same + 1);
        CHECK_OK(fabpool_free_on_stream(p, y, NULL));
        CHECK_OK(fabpool_alloc_on_stream(p, 4096, legacy, &x));
        CHECK(x == y && counters(p).stream_reuse_same == k0.stream_reuse_same + 2);
        CHECK_OK(fabpool_free(p, x));
        CHECK(counters(p).streams <= 1);
        CHECK_OK(fabpool_destroy(p));
    }
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

int main(void)
{
    int sim = t_driver_init();
    if (!sim) {
        fprintf(stderr, "test_stream needs the simulated driver (stream holds, ledger)\n");
        return t_done("test_stream");
    }
    *(void **)&hold = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&release = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    *(void **)&calls = dlsym(RTLD_DEFAULT, "fabsim_calls");
    CUstream s1, s2;
    CHECK_CU(cuStreamCreate(&s1, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));
    same_stream(s1);
    same_stream(NULL);
    other_streams(s1, s2, 4096);
    other_streams(s2, s1, 24 * MB);
    other_streams(NULL, s2, 768);    /* the legacy default stream */
    other_streams(s1, NULL, 100000);
    pending_stays_mapped(s1, s2);
    oom_waits_for_pending(s1);
    destroy_pending(s1, s2);
    bad_input(s1);
    threads(s1, s2, "handle_type:none,stream_owner:0");
    threads(s1, s1, "handle_type:none"); /* both on the owner stream */
    owner_reuse(s1);
    owner_reuse(NULL);
    owner_fences(s1, s2);
    owner_fence_faults(s1);
    owner_ends(s1, s2);
    asleep_refuses(s1, s2);
    refused_free_claims_nothing(s1, s2);
    legacy_is_null();
    cuStreamDestroy(s1);
    cuStreamDestroy(s2);
    return t_done("test_stream");
}
