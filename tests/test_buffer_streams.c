/* test_buffer_streams: a growable buffer resized on several streams.  A
 * chunk a shrink retires on one stream stays mapped until that stream's
 * work is done, even when a grow on another stream takes it back first and
 * a later shrink or refit (on yet another stream) drops it again: the
 * chunk keeps a ticket of every stream that may still use it.
 *
 * The first case runs on both drivers.  On the simulated one, a stream's
 * work is held pending with fabsim_stream_hold.  On a real GPU, stream B
 * is held by cuStreamWaitValue32 on a device word that a helper thread sets
 * after a while, and B's queued work is a copy that reads the retired range:
 * were the range unmapped under it, B would fault (an illegal address) or
 * read wrong bytes.  The other cases need the sim's holds and ledger. */
#include <pthread.h>
#include <time.h>

#include "testutil.h"

#define MB (1ull << 20)

static int (*hold)(void *);
static int (*release)(void *);

static uint64_t retiring(fabpool_t *p) { return t_stats(p).retiring_bytes; }

/* ------------------------------------------------------------ holding a stream, on either driver */

typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

/* Work queued on a stream that does not complete until gate_open: the sim's
 * hold, or on a real GPU a wait for a device word that a helper thread sets
 * after delay_ms (so that a call that rightly waits for the stream returns). */
typedef struct gate {
    CUstream s;
    int real;
    CUdeviceptr word;
    CUstream setter;
    pthread_t th;
    int started;
    unsigned delay_ms;
} gate;

static void *gate_thread(void *arg)
{
    gate *g = arg;
    cuCtxSetCurrent(t_ctx);
    struct timespec ts = {(time_t)(g->delay_ms / 1000), (long)(g->delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    if (cuMemsetD32Async(g->word, 1, 1, g->setter) == CUDA_SUCCESS)
        cuStreamSynchronize(g->setter);
    return NULL;
}

static int gate_close(gate *g, CUstream s, unsigned delay_ms)
{
    memset(g, 0, sizeof *g);
    g->s = s;
    g->delay_ms = delay_ms;
    if (hold) {
        hold(s);
        return 0;
    }
    g->real = 1;
    wait_value_fn wait_value = NULL;
    *(void **)&wait_value = dlsym(RTLD_DEFAULT, "cuStreamWaitValue32_v2");
    if (!wait_value)
        *(void **)&wait_value = dlsym(RTLD_DEFAULT, "cuStreamWaitValue32");
    if (!wait_value) {
        fprintf(stderr, "the driver has no cuStreamWaitValue32: cannot hold a stream\n");
        return -1;
    }
    if (cuMemAlloc(&g->word, 4) != CUDA_SUCCESS || cuMemsetD32(g->word, 0, 1) != CUDA_SUCCESS ||
        cuStreamCreate(&g->setter, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        wait_value(s, g->word, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
        fprintf(stderr, "could not make stream %p wait for a device word\n", (void *)s);
        return -1;
    }
    g->started = pthread_create(&g->th, NULL, gate_thread, g) == 0;
    return g->started ? 0 : -1;
}

static void gate_open(gate *g)
{
    if (!g->real) {
        release(g->s);
        return;
    }
    if (g->started)
        pthread_join(g->th, NULL);
    cuStreamSynchronize(g->s);
    cuStreamDestroy(g->setter);
    cuMemFree(g->word);
}

/* ------------------------------------------------------------ the cases */

/* A buffer (max 235,429,390 B) created at 73,437,643 B and resized to
 * 112,489 (C), 29,189,175 (B), 94,008,403 (A) and 93,759,289 (C) maps
 * chunks of 2, 32 and 78 MiB.  B's work reads the range 80..112 MiB; then
 * a shrink to 256 KiB on B retires the last two chunks with B's work
 * pending, and a grow to 66,322,275 B on A takes them back and refits the
 * last one (to end at 80 MiB).  The range may be unmapped only once B's
 * work is done: on return of the grow, either B's work has completed or
 * the range is still mapped; and B's copy reads what was written there. */
static void grow_on_a_while_b_pends(CUstream a, CUstream b, CUstream c)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *buf = NULL;
    CHECK_OK(fabpool_buffer_create(p, 235429390, 73437643, &buf));
    if (!buf) {
        fabpool_destroy(p);
        return;
    }
    CHECK_OK(fabpool_buffer_resize(buf, 112489, c));
    CHECK_OK(fabpool_buffer_resize(buf, 29189175, b));
    CHECK_OK(fabpool_buffer_resize(buf, 94008403, a));
    CHECK_OK(fabpool_buffer_resize(buf, 93759289, c));
    CHECK_CU(cuStreamSynchronize(c));
    fabpool_buffer_info in = {.struct_size = sizeof(fabpool_buffer_info)};
    CHECK_OK(fabpool_buffer_get_info(buf, &in));
    CHECK(in.mapped == 112 * MB && in.n_chunks == 3);
    char *base = fabpool_buffer_ptr(buf);
    char *lo = base + 80 * MB, *hi = base + 112 * MB - 4096;
    t_put_tag(lo, 4096, 0x10u);
    t_put_tag(hi, 4096, 0x20u);
    CUdeviceptr seen = 0;
    CHECK_CU(cuMemAlloc(&seen, 8192));
    CHECK_CU(cuMemsetD8(seen, 0, 8192));
    gate g;
    if (gate_close(&g, b, 1000) != 0) {
        CHECK(0);
        return;
    }
    /* B's work: it reads the range that B's shrink retires */
    CHECK_CU(cuMemcpyDtoDAsync(seen, (CUdeviceptr)(uintptr_t)lo, 4096, b));
    CHECK_CU(cuMemcpyDtoDAsync(seen + 4096, (CUdeviceptr)(uintptr_t)hi, 4096, b));
    CUevent done_b = t_marker(b);
    CHECK_OK(fabpool_buffer_resize(buf, 262144, b));
    CHECK(retiring(p) == 110 * MB); /* the 32 and 78 MiB chunks wait for B */
    CHECK_OK(fabpool_buffer_resize(buf, 66322275, a));
    CHECK_OK(fabpool_buffer_get_info(buf, &in));
    CHECK(in.mapped == 80 * MB);
    int b_done = cuEventQuery(done_b) == CUDA_SUCCESS;
    int still_mapped = !b_done && t_tag_ok(lo, 4096, 0x10u) && t_tag_ok(hi, 4096, 0x20u); /* read while it must be */
    CHECK(b_done || still_mapped);
    if (!b_done && !still_mapped)
        fprintf(stderr, "grow on A: 80..112 MiB unmapped while B's work, which reads it, is pending\n");
    gate_open(&g);
    CHECK_CU(cuStreamSynchronize(b));
    uint64_t w[4] = {0, 0, 0, 0};
    CHECK_CU(cuMemcpyDtoH(&w[0], seen, 8));
    CHECK_CU(cuMemcpyDtoH(&w[1], seen + 4096 - 8, 8));
    CHECK_CU(cuMemcpyDtoH(&w[2], seen + 4096, 8));
    CHECK_CU(cuMemcpyDtoH(&w[3], seen + 8192 - 8, 8));
    CHECK(w[0] == 0x10u && w[1] == ~(uint64_t)0x10u && w[2] == 0x20u && w[3] == ~(uint64_t)0x20u);
    cuEventDestroy(done_b);
    cuMemFree(seen);
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_collect(p, 1));
    CHECK(t_mapped(p) == 0);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_near(t_held(), 0));
}

/* A pool (*pp) and a buffer of a 4 MiB chunk and one behind it: grown to
 * 64 MiB, its second chunk is retired on B (held) and taken back by a grow
 * on A.  NULL (and no pool) if that fails. */
static fabpool_buffer_t *taken_back(CUstream a, CUstream b, fabpool_t **pp, char **tail)
{
    fabpool_t *p = *pp = t_pool("handle_type:none");
    fabpool_buffer_t *buf = NULL;
    if (p)
        CHECK_OK(fabpool_buffer_create(p, 256 * MB, 2 * MB, &buf));
    if (!buf) {
        if (p)
            fabpool_destroy(p);
        return NULL;
    }
    CHECK_OK(fabpool_buffer_resize(buf, 64 * MB, a));
    fabpool_buffer_info in = {.struct_size = sizeof(fabpool_buffer_info)};
    CHECK_OK(fabpool_buffer_get_info(buf, &in));
    CHECK(in.n_chunks == 2 && in.mapped >= 64 * MB);
    *tail = (char *)fabpool_buffer_ptr(buf) + 64 * MB - 4096;
    t_put_tag(*tail, 4096, 0x77u);
    hold(b);
    CHECK_OK(fabpool_buffer_resize(buf, 2 * MB, b));
    CHECK(retiring(p) == in.mapped - 4 * MB);
    CHECK_OK(fabpool_buffer_resize(buf, 64 * MB, a));
    CHECK(retiring(p) == 0 && t_tag_ok(*tail, 4096, 0x77u));
    return buf;
}

/* The taken-back chunk shrunk away again on A: it waits for both A and B. */
static void retired_on_two_streams(CUstream a, CUstream b)
{
    fabpool_t *p = NULL;
    char *tail = NULL;
    fabpool_buffer_t *buf = taken_back(a, b, &p, &tail);
    if (!buf)
        return;
    uint64_t held = t_ledger().bytes_held;
    hold(a);
    CHECK_OK(fabpool_buffer_resize(buf, 2 * MB, a));
    CHECK(retiring(p) > 0);
    release(a);
    CHECK_OK(fabpool_collect(p, 0)); /* A is done, B is not: it stays */
    CHECK(t_ledger().bytes_held == held && t_tag_ok(tail, 4096, 0x77u));
    release(b);
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(retiring(p) == 0 && t_ledger().bytes_held == 4 * MB);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
}

/* Once B's work is done, a collect forgets the taken-back chunk's ticket: a
 * shrink on A then unmaps it as soon as A's work is done. */
static void ticket_forgotten_once_done(CUstream a, CUstream b)
{
    fabpool_t *p = NULL;
    char *tail = NULL;
    fabpool_buffer_t *buf = taken_back(a, b, &p, &tail);
    if (!buf)
        return;
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(t_counters(p).streams >= 1); /* B's record: a live chunk still waits on it */
    CHECK_OK(fabpool_check(p));
    release(b);
    CHECK_OK(fabpool_collect(p, 0)); /* drops the done ticket */
    CHECK_OK(fabpool_collect(p, 1)); /* forgets B's record, which nothing waits on now */
    CHECK(t_counters(p).streams == 0);
    CHECK_OK(fabpool_buffer_resize(buf, 2 * MB, a));
    CHECK(retiring(p) == 0 && t_ledger().bytes_held == 4 * MB);
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_ledger().bytes_held == 0);
}

/* Sleep, buffer destroy and pool destroy wait for B's work before they unmap
 * the taken-back chunk, whatever stream they are given. */
static void unmaps_wait_for_b(CUstream a, CUstream b)
{
    for (int how = 0; how < 3; how++) {
        fabpool_t *p = NULL;
        char *tail = NULL;
        fabpool_buffer_t *buf = taken_back(a, b, &p, &tail);
        if (!buf)
            return;
        CUevent ev = t_marker(b);
        if (how == 0) {
            CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_DISCARD, a));
            CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
            CHECK_OK(fabpool_wake(p, NULL));
        } else if (how == 1) {
            CHECK_OK(fabpool_buffer_destroy(buf, a));
            CHECK(cuEventQuery(ev) == CUDA_SUCCESS || t_tag_ok(tail, 4096, 0x77u));
            buf = NULL;
        }
        if (how < 2) {
            release(b);
            if (buf)
                CHECK_OK(fabpool_buffer_destroy(buf, NULL));
            CHECK_OK(fabpool_destroy(p));
        } else {
            CHECK_STATUS(fabpool_destroy(p), FABPOOL_ERR_BUSY); /* the buffer was live */
            CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
        }
        cuEventDestroy(ev);
        CHECK(t_ledger().bytes_held == 0 && t_ledger().mappings == 0);
    }
}

int main(void)
{
    int sim = t_driver_init();
    t_sim_hooks h = t_sim_hooks_get();
    hold = h.hold;
    release = h.release;
    CUstream a, b, c;
    /* non-blocking: the legacy default stream's copies that check the data never wait for a held stream */
    CHECK_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
    grow_on_a_while_b_pends(a, b, c);
    if (sim) {
        retired_on_two_streams(a, b);
        ticket_forgotten_once_done(a, b);
        unmaps_wait_for_b(a, b);
    } else {
        printf("real driver: the cases that need the simulated driver's holds and ledger are skipped\n");
    }
    cuStreamDestroy(a);
    cuStreamDestroy(b);
    cuStreamDestroy(c);
    return t_done("test_buffer_streams");
}
