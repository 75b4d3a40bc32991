/* test_record_stream: fabpool_record_stream, a block used on other streams
 * than its own (PyTorch's Tensor.record_stream).  A block freed with
 * recorded streams is reused, by its own stream too, or unmapped only once
 * the work queued on each of them (and on the stream of the free) up to the
 * free has completed; the simulated driver holds a stream so that its
 * events do not complete.  Several streams; a free by fabpool_free and on
 * another stream; the stream of the free recorded (nothing changes, on the
 * owner stream too); the prefetch pattern on the owner stream; bad input;
 * sleep and wake; destroy; two threads that record each other's streams. */
#include <pthread.h>
#include <unistd.h>

#include "fabpool_trace_format.h"
#include "testutil.h"

#define MB (1ull << 20)

static int (*hold)(void *);
static int (*release)(void *);


static const size_t sizes[] = {4096, 300000, 24 * MB}; /* a small slab class, a large one, a large block */
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* x, allocated and freed on `own` while `used` (held) still reads it, comes
 * back to `own` only once `used`'s work is done: not at once, not to
 * fabpool_alloc, not by a collect; its data stays.  Then to `own`. */
static void reuse_after_recorded(CUstream own, CUstream used)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        void *x = NULL, *y = NULL, *z = NULL, *w = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, n, own, &x));
        t_put_tag(x, n, 0x100u + i);
        fabpool_counters k0 = t_counters(p);
        CHECK_OK(fabpool_record_stream(p, x, used));
        CHECK(t_counters(p).stream_recorded_blocks == 1 && t_counters(p).stream_records == k0.stream_records + 1);
        CHECK_OK(fabpool_check(p));
        hold(used); /* a kernel on `used` reads x */
        CHECK_OK(fabpool_free_on_stream(p, x, own));
        fabpool_counters k1 = t_counters(p);
        CHECK(k1.stream_pending_blocks == 1 && k1.stream_record_waits == k0.stream_record_waits + 1);
        CHECK(k1.stream_recorded_blocks == 0 && k1.stream_events_recorded == k0.stream_events_recorded + 2);
        CHECK_OK(fabpool_alloc_on_stream(p, n, own, &y)); /* without the record: x at once */
        CHECK(y != NULL && y != x);
        CHECK_OK(fabpool_alloc(p, n, &z));
        CHECK(z != NULL && z != x);
        CHECK_OK(fabpool_collect(p, 0));
        CHECK(t_counters(p).stream_pending_blocks == 1 && t_tag_ok(x, n, 0x100u + i));
        CHECK_STATUS(fabpool_free(p, x), FABPOOL_ERR_DOUBLE_FREE);
        CHECK_OK(fabpool_check(p));
        release(used);
        CHECK_OK(fabpool_alloc_on_stream(p, n, own, &w)); /* a miss: the poll hands x over */
        CHECK(w == x && t_tag_ok(w, n, 0x100u + i));
        fabpool_counters k2 = t_counters(p);
        CHECK(k2.stream_pending_blocks == 0 && k2.stream_reuse_after_event == k1.stream_reuse_after_event + 1);
        CHECK_OK(fabpool_free_on_stream(p, w, own));
        CHECK_OK(fabpool_free_on_stream(p, y, own));
        CHECK_OK(fabpool_free(p, z));
    }
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_ledger().bytes_held == 0);
    CHECK_OK(fabpool_destroy(p));
}

/* Several recorded streams (one given twice): the block waits for the last
 * of them, freed on its own stream or by fabpool_free, and for the stream of
 * a free on yet another stream. */
static void several_streams(CUstream own, CUstream s1, CUstream s2, CUstream s3)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    for (int how = 0; how < 3; how++) { /* free on own, fabpool_free, free on s3 (held) */
        for (size_t i = 0; i < NSIZES; i++) {
            void *x = NULL;
            CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], own, &x));
            fabpool_counters k0 = t_counters(p);
            CHECK_OK(fabpool_record_stream(p, x, s1));
            CHECK_OK(fabpool_record_stream(p, x, s2));
            CHECK_OK(fabpool_record_stream(p, x, s1));
            CHECK(t_counters(p).stream_records == k0.stream_records + 2);
            hold(s1);
            hold(s2);
            if (how == 2)
                hold(s3);
            CHECK_OK(how == 0 ? fabpool_free_on_stream(p, x, own)
                              : how == 1 ? fabpool_free(p, x) : fabpool_free_on_stream(p, x, s3));
            CHECK(t_counters(p).stream_pending_blocks == 1);
            release(s1);
            CHECK_OK(fabpool_collect(p, 0));
            CHECK(t_counters(p).stream_pending_blocks == 1);
            release(s2);
            CHECK_OK(fabpool_collect(p, 0));
            CHECK(t_counters(p).stream_pending_blocks == (how == 2 ? 1u : 0u));
            if (how == 2) {
                release(s3);
                CHECK_OK(fabpool_collect(p, 0));
                CHECK(t_counters(p).stream_pending_blocks == 0);
            }
            CHECK(t_counters(p).stream_releases == k0.stream_releases + 1);
            CHECK_STATUS(fabpool_free(p, x), FABPOOL_ERR_DOUBLE_FREE); /* the pool's free memory now */
        }
    }
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_ledger().bytes_held == 0);
    CHECK_OK(fabpool_destroy(p));
}

/* Recording the stream the block is then freed on changes nothing: with the
 * queue, the same stream takes it back at once; on the owner stream, it goes
 * to the pool at once.  No event is recorded, the record goes. */
static void same_stream_is_nothing(CUstream s)
{
    for (int owner = 0; owner < 2; owner++) {
        fabpool_t *p = t_pool(owner ? "handle_type:none" : "handle_type:none,stream_owner:0");
        if (!p)
            return;
        for (size_t i = 0; i < NSIZES; i++) {
            void *x = NULL, *y = NULL;
            CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &x));
            CHECK_OK(fabpool_record_stream(p, x, s));
            fabpool_counters k0 = t_counters(p);
            hold(s);
            CHECK_OK(fabpool_free_on_stream(p, x, s));
            fabpool_counters k1 = t_counters(p);
            CHECK(k1.stream_events_recorded == k0.stream_events_recorded && k1.stream_recorded_blocks == 0);
            CHECK(k1.stream_record_waits == k0.stream_record_waits);
            CHECK(owner ? k1.stream_owner_frees == k0.stream_owner_frees + 1 && k1.stream_pending_blocks == 0
                        : k1.stream_pending_blocks == 1);
            CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s, &y));
            CHECK(y == x);
            release(s);
            CHECK_OK(fabpool_free_on_stream(p, y, s));
        }
        CHECK(t_counters(p).stream_fences == 0);
        CHECK_OK(fabpool_check(p));
        CHECK_OK(fabpool_destroy(p));
        CHECK(t_ledger().bytes_held == 0);
    }
}

/* fabpool_check on a pool whose recorded blocks are the first of their slabs (a slab's run in its arena starts
 * at its first block's address: the check counts that block's records once). */
static void check_first_block_recorded(CUstream s)
{
    fabpool_t *p = t_pool("handle_type:none,thread_cache:0");
    if (!p)
        return;
    void *x = NULL, *y = NULL;
    CHECK_OK(fabpool_alloc(p, 2, &x));
    CHECK_OK(fabpool_alloc(p, 3000, &y));
    CHECK_OK(fabpool_record_stream(p, x, s));
    CHECK_OK(fabpool_record_stream(p, y, s));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_free(p, y));
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

/* The prefetch pattern on the owner stream: a block made on the owner, read
 * on a side stream (recorded), freed on the owner while the side stream's
 * read is queued.  The owner's next allocations of that size get other
 * memory until the side stream's work is done; the owner mode holds. */
static void owner_prefetch(CUstream owner, CUstream side)
{
    fabpool_t *p = t_pool("handle_type:none,decay_ms:600000");
    if (!p)
        return;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        void *x = NULL, *y = NULL;
        CHECK_OK(fabpool_alloc_on_stream(p, n, owner, &x));
        t_put_tag(x, n, 0x200u + i);
        CHECK_OK(fabpool_record_stream(p, x, side));
        hold(side);
        fabpool_counters k0 = t_counters(p);
        CHECK_OK(fabpool_free_on_stream(p, x, owner));
        fabpool_counters k1 = t_counters(p);
        CHECK(k1.stream_pending_blocks == 1 && k1.stream_owner_frees == k0.stream_owner_frees);
        CHECK_OK(fabpool_alloc_on_stream(p, n, owner, &y));
        CHECK(y != NULL && y != x);
        CHECK_OK(fabpool_trim(p, 0)); /* a trim leaves it mapped */
        CHECK(t_tag_ok(x, n, 0x200u + i));
        release(side);
        CHECK_OK(fabpool_collect(p, 0));
        fabpool_counters k2 = t_counters(p);
        CHECK(k2.stream_pending_blocks == 0 && k2.stream_releases == k1.stream_releases + 1);
        CHECK_OK(fabpool_free_on_stream(p, y, owner));
        CHECK(t_counters(p).stream_owner_frees == k2.stream_owner_frees + 1); /* the owner mode holds */
    }
    /* a recorded block freed on the side stream ends the owner mode, as any free on another stream */
    void *z = NULL, *u = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, owner, &z));
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, owner, &u));
    CHECK_OK(fabpool_record_stream(p, z, owner));
    CHECK_OK(fabpool_free_on_stream(p, z, side));
    fabpool_counters k3 = t_counters(p);
    CHECK(k3.stream_record_waits > 0 && k3.stream_recorded_blocks == 0);
    hold(owner);
    CHECK_OK(fabpool_free_on_stream(p, u, owner)); /* queued now */
    fabpool_counters k4 = t_counters(p);
    CHECK(k4.stream_owner_frees == k3.stream_owner_frees && k4.stream_pending_blocks == k3.stream_pending_blocks + 1);
    release(owner);
    CHECK_OK(fabpool_collect(p, 1));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* Bad input: a clear status and message, nothing recorded.  NULL is the
 * legacy default stream, a stream like any other. */
static void bad_input(CUstream own)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0"), *q = t_pool("handle_type:none");
    if (!p || !q)
        return;
    void *x = NULL, *big = NULL, *other = NULL, *gone = NULL, *pend = NULL;
    int local;
    CHECK_OK(fabpool_alloc(p, 4096, &x));
    CHECK_OK(fabpool_alloc(p, 24 * MB, &big));
    CHECK_OK(fabpool_alloc(q, 4096, &other));
    CHECK_OK(fabpool_alloc(p, 4096, &gone));
    CHECK_OK(fabpool_free(p, gone));
    CHECK_OK(fabpool_alloc_on_stream(p, 8192, own, &pend));
    hold(own);
    CHECK_OK(fabpool_free_on_stream(p, pend, own));
    fabpool_counters k0 = t_counters(p);
    CHECK_STATUS(fabpool_record_stream(NULL, x, own), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "pool is NULL") != NULL);
    CHECK_OK(fabpool_record_stream(p, NULL, own)); /* the block of size 0: nothing to record */
    CHECK_STATUS(fabpool_record_stream(p, other, own), FABPOOL_ERR_NOT_FOUND); /* another pool's */
    CHECK(strstr(fabpool_last_error(), "did not give out") != NULL);
    CHECK_STATUS(fabpool_record_stream(p, &local, own), FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_record_stream(p, (char *)x + 256, own), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_record_stream(p, (char *)big + 2 * MB, own), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_record_stream(p, gone, own), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "not live") != NULL);
    CHECK_STATUS(fabpool_record_stream(p, pend, own), FABPOOL_ERR_NOT_FOUND); /* freed on a stream, pending */
    CHECK(strstr(fabpool_last_error(), "not live") != NULL);
    fabpool_counters k1 = t_counters(p);
    CHECK(k1.stream_records == k0.stream_records && k1.stream_recorded_blocks == 0);
    /* the legacy default stream */
    release(own);
    CHECK_OK(fabpool_record_stream(p, x, NULL));
    hold(NULL);
    CHECK_OK(fabpool_free_on_stream(p, x, own));
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_counters(p).stream_pending_blocks == 1);
    release(NULL);
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_counters(p).stream_pending_blocks == 0);
    /* a large block recorded, freed with fabpool_free */
    CHECK_OK(fabpool_record_stream(p, big, own));
    CHECK_OK(fabpool_check(p));
    hold(own);
    CHECK_OK(fabpool_free(p, big));
    CHECK_STATUS(fabpool_free(p, big), FABPOOL_ERR_DOUBLE_FREE);
    CHECK(t_counters(p).stream_pending_blocks == 1);
    release(own);
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_counters(p).stream_pending_blocks == 0);
    CHECK_OK(fabpool_free(q, other));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* Sleep and wake: a block freed with a held recorded stream before the sleep
 * is waited for by the sleep and goes back; the call works while asleep; a
 * block freed while asleep waits for its recorded stream after the wake; a
 * live block keeps its streams across the sleep. */
static void with_sleep(CUstream own, CUstream s1, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 4096, own, &a));
    CHECK_OK(fabpool_alloc_on_stream(p, 24 * MB, own, &b));
    CHECK_OK(fabpool_alloc_on_stream(p, 300000, own, &c));
    t_put_tag(b, 24 * MB, 0xb);
    CHECK_OK(fabpool_record_stream(p, a, s1));
    CHECK_OK(fabpool_record_stream(p, b, s2));
    hold(s1);
    CUevent ev1 = t_marker(s1);
    CHECK_OK(fabpool_free(p, a));
    CHECK(t_counters(p).stream_pending_blocks == 1);
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, own));
    CHECK(cuEventQuery(ev1) == CUDA_SUCCESS && t_counters(p).stream_pending_blocks == 0); /* waited, released */
    CHECK(t_ledger().bytes_held == 0);
    CHECK_OK(fabpool_record_stream(p, c, s1)); /* asleep: only records change */
    hold(s2);
    CHECK_OK(fabpool_free_on_stream(p, b, own)); /* recorded on s2 before the sleep */
    CHECK(t_counters(p).stream_pending_blocks == 1);
    CHECK_OK(fabpool_wake(p, own)); /* (NULL would synchronize the context, s2 too) */
    CHECK(t_tag_ok(b, 24 * MB, 0xb)); /* pending: mapped again with its data */
    CHECK_OK(fabpool_alloc_on_stream(p, 24 * MB, own, &d));
    CHECK(d != b);
    release(s2);
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_counters(p).stream_pending_blocks == 0 && t_counters(p).stream_recorded_blocks == 1);
    hold(s1);
    CHECK_OK(fabpool_free_on_stream(p, c, own));
    CHECK(t_counters(p).stream_pending_blocks == 1 && t_counters(p).stream_recorded_blocks == 0);
    release(s1);
    CHECK_OK(fabpool_free(p, d));
    CHECK_OK(fabpool_check(p));
    cuEventDestroy(ev1);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

/* Destroy with live recorded blocks and recorded blocks freed on held
 * streams: the freed ones are waited for, nothing stays held (ASan and
 * valgrind say whether the records leak). */
static void destroy_recorded(CUstream own, CUstream s1)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    void *x[24];
    for (int i = 0; i < 24; i++) {
        CHECK_OK(fabpool_alloc_on_stream(p, i % 4 ? 1000u * (unsigned)(i + 1) : (size_t)(i + 1) * 3 * MB, own, &x[i]));
        CHECK_OK(fabpool_record_stream(p, x[i], s1));
        CHECK_OK(fabpool_record_stream(p, x[i], own));
    }
    hold(s1);
    CUevent ev = t_marker(s1);
    for (int i = 0; i < 24; i += 2)
        CHECK_OK(fabpool_free_on_stream(p, x[i], own));
    fabpool_counters k = t_counters(p);
    CHECK(k.stream_pending_blocks == 12 && k.stream_recorded_blocks == 12);
    CHECK_OK(fabpool_check(p));
    CHECK_STATUS(fabpool_destroy(p), FABPOOL_ERR_BUSY); /* 12 blocks were live */
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_held == 0 && l.mappings == 0 && l.reservations == 0 && l.handles == 0);
    cuEventDestroy(ev);
}

/* A traced pool: every block freed with recorded streams is freed once in
 * the trace at the pool's level (fabpool_free, a free on a stream, the
 * owner's free), however it comes back. */
static void traced_once(CUstream own, CUstream s1)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_record_stream.%d.trace", (int)getpid());
    for (int owner = 0; owner < 2; owner++) {
        fabpool_options o;
        fabpool_options_init(&o);
        o.handle_type = FABPOOL_HANDLE_NONE;
        o.stream_owner = (uint32_t)owner;
        snprintf(o.trace_path, sizeof o.trace_path, "%s", path);
        fabpool_t *p = NULL;
        CHECK_OK(fabpool_create(&o, &p));
        if (!p)
            return;
        for (int round = 0; round < 2; round++)
            for (size_t i = 0; i < NSIZES; i++) {
                void *x = NULL, *y = NULL, *z = NULL;
                CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], own, &x));
                CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], own, &y));
                CHECK_OK(fabpool_record_stream(p, x, s1));
                CHECK_OK(fabpool_record_stream(p, y, s1));
                hold(s1);
                CHECK_OK(fabpool_free(p, x));
                CHECK_OK(fabpool_free_on_stream(p, y, own));
                CHECK_OK(fabpool_alloc_on_stream(p, sizes[i], s1, &z)); /* a miss on another stream: a poll */
                release(s1);
                CHECK_OK(fabpool_collect(p, 0));
                CHECK_OK(fabpool_free_on_stream(p, z, own));
            }
        CHECK_OK(fabpool_collect(p, 1));
        CHECK_OK(fabpool_destroy(p));
        /* replay the pool's level: every free is of a live block, every allocation of a free one */
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (!f)
            return;
        unsigned char rec[FABPOOL_TRACE_RECORD_BYTES];
        enum { LIVE = 64 };
        uint64_t live[LIVE];
        int n_live = 0, bad = 0, frees = 0;
        fseek(f, FABPOOL_TRACE_HEADER_BYTES, SEEK_SET);
        while (fread(rec, sizeof rec, 1, f) == 1) {
            uint64_t ptr;
            memcpy(&ptr, rec + 8, sizeof ptr);
            int k = 0;
            while (k < n_live && live[k] != ptr)
                k++;
            if (rec[32] == FABPOOL_TR_ALLOC && ptr) {
                bad += k < n_live || n_live == LIVE;
                if (k == n_live && n_live < LIVE)
                    live[n_live++] = ptr;
            } else if (rec[32] == FABPOOL_TR_FREE) {
                frees++;
                bad += k == n_live;
                if (k < n_live)
                    live[k] = live[--n_live];
            }
        }
        fclose(f);
        remove(path);
        CHECK(bad == 0 && n_live == 0 && frees >= 6);
        if (bad || n_live)
            fprintf(stderr, "traced_once (owner %d): %d frees or allocations out of turn, %d blocks never freed\n",
                    owner, bad, n_live);
    }
}

/* Two threads, each allocating on its own stream and recording the other's
 * stream on some blocks, freeing on its own stream or with fabpool_free:
 * no block is given to both (every live block keeps its tag). */
typedef struct worker {
    fabpool_t *p;
    CUstream s, other;
    int id, failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    cuCtxSetCurrent(t_ctx);
    enum { N = 24 };
    void *live[N] = {0};
    size_t sz[N] = {0};
    uint64_t seed = 99 + (uint64_t)w->id * 7919;
    for (int i = 0; i < 3000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % N);
        uint64_t tag = ((uint64_t)w->id << 56) ^ ((uint64_t)k << 40) ^ sz[k];
        if (live[k]) {
            uint64_t t1 = 0;
            if (cuMemcpyDtoH(&t1, (CUdeviceptr)(uintptr_t)live[k], sizeof t1) != CUDA_SUCCESS || t1 != tag)
                w->failures++;
            fabpool_status st = (seed >> 20) % 3 == 0 ? fabpool_free(w->p, live[k])
                                                      : fabpool_free_on_stream(w->p, live[k], w->s);
            w->failures += st != FABPOOL_OK;
            live[k] = NULL;
        } else {
            unsigned r = (unsigned)(seed >> 40);
            sz[k] = r % 7 == 0 ? (size_t)(9 + r % 8) * MB : 256 + r % (200 << 10);
            if (fabpool_alloc_on_stream(w->p, sz[k], w->s, &live[k]) != FABPOOL_OK) {
                w->failures++;
                live[k] = NULL;
                continue;
            }
            uint64_t t1 = ((uint64_t)w->id << 56) ^ ((uint64_t)k << 40) ^ sz[k];
            if (cuMemcpyHtoD((CUdeviceptr)(uintptr_t)live[k], &t1, sizeof t1) != CUDA_SUCCESS)
                w->failures++;
            if (r % 2 && fabpool_record_stream(w->p, live[k], w->other) != FABPOOL_OK)
                w->failures++;
        }
    }
    for (int k = 0; k < N; k++)
        if (live[k] && fabpool_free_on_stream(w->p, live[k], w->s) != FABPOOL_OK)
            w->failures++;
    return NULL;
}

static void threads(CUstream s1, CUstream s2)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:0");
    if (!p)
        return;
    worker w[2] = {{p, s1, s2, 0, 0}, {p, s2, s1, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK(w[0].failures == 0 && w[1].failures == 0);
    fabpool_counters k = t_counters(p);
    CHECK(k.stream_record_waits > 500 && k.stream_recorded_blocks == 0);
    CHECK_OK(fabpool_collect(p, 1));
    fabpool_stats st = t_stats(p);
    CHECK(st.blocks == 0 && st.stream_pending_blocks == 0 && st.in_use_bytes == 0);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

int main(void)
{
    int sim = t_driver_init();
    if (!sim) {
        fprintf(stderr, "test_record_stream needs the simulated driver (stream holds, ledger)\n");
        return t_done("test_record_stream");
    }
    t_sim_hooks h = t_sim_hooks_get();
    hold = h.hold;
    release = h.release;
    CUstream s[4];
    for (int i = 0; i < 4; i++)
        CHECK_CU(cuStreamCreate(&s[i], 0));
    reuse_after_recorded(s[0], s[1]);
    reuse_after_recorded(NULL, s[1]); /* allocated on the legacy default stream */
    several_streams(s[0], s[1], s[2], s[3]);
    same_stream_is_nothing(s[0]);
    check_first_block_recorded(s[1]);
    owner_prefetch(s[0], s[1]);
    bad_input(s[0]);
    with_sleep(s[0], s[1], s[2]);
    destroy_recorded(s[0], s[1]);
    traced_once(s[0], s[1]);
    threads(s[0], s[1]);
    for (int i = 0; i < 4; i++)
        cuStreamDestroy(s[i]);
    return t_done("test_record_stream");
}
