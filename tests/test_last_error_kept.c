/* test_last_error_kept: fabpool_last_error() is the last failed call's message, whatever succeeds after it
 * (errno's rule, docs/api.md).  Before each call of a table, a call that fails leaves a message of its own;
 * the call then succeeds and the message must be the same, byte for byte:
 *  - every public call that can be made to succeed here (blocks, the stream pair, buffers, exports, stats,
 *    checks, trims and collects, sleep and wake, pools made and destroyed);
 *  - calls that meet a failure of the driver's on the way and recover from it: a chunk made after the cache
 *    was trimmed, an allocation that waits for the blocks freed on streams and tries again, a buffer that
 *    grows once the kept ones went back, a shrink that keeps a chunk whole, an event a free, a poll or the owner
 *    stream's fence could not record (the context waited for instead).  Each such call is checked to have met
 *    its fault. */
#include "testutil.h"

#define MB (1ull << 20)

static t_sim_hooks h;
static char before[1024];
static int n_kept;

/* A failed call with a message of its own, n making it unique. */
static void fail_first(int n)
{
    fabpool_options o;
    fabpool_options_init(&o);
    char key[64], conf[80];
    snprintf(key, sizeof key, "no_such_key_%d", n);
    snprintf(conf, sizeof conf, "%s:1", key);
    CHECK_STATUS(fabpool_options_parse(&o, conf), FABPOOL_ERR_CONFIG);
    snprintf(before, sizeof before, "%s", fabpool_last_error());
    CHECK(strstr(before, key) != NULL);
}

static void kept_after(const char *what, fabpool_status st)
{
    n_kept++;
    CHECK(st == FABPOOL_OK);
    int same = strcmp(fabpool_last_error(), before) == 0;
    CHECK(same);
    if (st != FABPOOL_OK || !same)
        fprintf(stderr, "  %s -> %s; the message, '%s' before, is now '%s'\n", what, fabpool_status_name(st), before,
                fabpool_last_error());
}

/* expr, which succeeds, after a failure: the failure's message stays. */
#define KEPT(expr)                                                                                            \
    do {                                                                                                      \
        fail_first(__LINE__);                                                                                 \
        fabpool_status k_ = (expr);                                                                           \
        kept_after(#expr, k_);                                                                                \
    } while (0)

/* The same with the nth call of entry from now failing with err (`every`: that one and all after it): the call
 * recovers from it.  The entry must have been called that many times. */
#define KEPT_FAULT(entry, nth, every, err, expr)                                                              \
    do {                                                                                                      \
        fail_first(__LINE__);                                                                                 \
        uint64_t c_ = h.calls(entry);                                                                         \
        h.fault_set(entry, nth, every, err);                                                                  \
        fabpool_status k_ = (expr);                                                                           \
        h.fault_clear();                                                                                      \
        CHECK(h.calls(entry) - c_ >= (nth));                                                                  \
        kept_after(#expr " with " entry " failing", k_);                                                      \
    } while (0)

static void blocks_and_stats(void)
{
    fabpool_t *p = NULL, *q = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    KEPT(fabpool_options_parse(&o, "handle_type:posix_fd,keep_ms:60000"));
    KEPT(fabpool_create(&o, &p));
    if (!p)
        return;
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    size_t us = 0, free_b = 0, total = 0;
    int n = 0;
    CUstream s = NULL;
    CHECK_CU(cuStreamCreate(&s, 0));
    KEPT(fabpool_alloc(p, 100, &a));
    KEPT(fabpool_alloc(p, 40000, &b));
    KEPT(fabpool_alloc(p, 8 * MB, &c));
    KEPT(fabpool_alloc_aligned(p, 3000, 4096, &d));
    KEPT(fabpool_usable_size(p, c, &us));
    KEPT(fabpool_record_stream(p, b, s));
    KEPT(fabpool_free(p, b));
    KEPT(fabpool_free(p, d));
    KEPT(fabpool_alloc_on_stream(p, 5000, s, &b));
    KEPT(fabpool_free_on_stream(p, b, s));
    KEPT(fabpool_stream_owner_end(p));
    fabpool_stats st = {.struct_size = sizeof st};
    fabpool_counters ct = {.struct_size = sizeof ct};
    fabpool_sleep_info si = {.struct_size = sizeof si};
    fabpool_options got;
    fabpool_options_init(&got);
    KEPT(fabpool_get_stats(p, &st));
    KEPT(fabpool_get_counters(p, &ct));
    KEPT(fabpool_get_options(p, &got));
    KEPT(fabpool_sleep_state(p, &si));
    KEPT(fabpool_reset_peak(p));
    KEPT(fabpool_device_count(&n));
    KEPT(fabpool_device_memory(p, &free_b, &total));
    char json[1 << 16];
    KEPT(fabpool_stats_json(p, json, sizeof json, NULL));
    FILE *null = fopen("/dev/null", "w");
    KEPT(fabpool_print_stats(p, null, 0));
    fclose(null);
    KEPT(fabpool_check(p));
    KEPT(fabpool_collect(p, 1));
    KEPT(fabpool_thread_flush(p));
    KEPT(fabpool_free(p, c));
    KEPT(fabpool_trim(p, 0)); /* unmaps the 8 MiB block's chunk */
    KEPT(fabpool_trace_flush());
    KEPT(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    KEPT(fabpool_wake(p, NULL));
    KEPT(fabpool_free(p, a));
    KEPT(fabpool_create(NULL, &q));
    KEPT(fabpool_destroy(q));
    cuStreamDestroy(s);
    KEPT(fabpool_destroy(p));
}

static void buffers_and_exports(void)
{
    fabpool_t *p = t_pool("handle_type:posix_fd,keep_ms:60000");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL, *y = NULL, *z = NULL;
    KEPT(fabpool_buffer_create(p, 64 * MB, 4 * MB, &x));
    KEPT(fabpool_buffer_create(p, 64 * MB, 2 * MB, &y));
    if (!x || !y)
        return;
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    KEPT(fabpool_buffer_resize(x, 32 * MB, NULL));
    KEPT(fabpool_buffer_resize(x, 6 * MB, NULL));
    fabpool_buffer_t *set[2] = {x, y};
    size_t sizes[2] = {8 * MB, 10 * MB};
    KEPT(fabpool_buffer_resize_set(set, sizes, 2, NULL));
    KEPT(fabpool_buffer_get_info(x, &bi));
    unsigned char desc[8192];
    int fds[64];
    size_t len = 0, nfds = 0, off = 0;
    KEPT(fabpool_buffer_export(x, 0, desc, sizeof desc, &len, fds, 64, &nfds));
    KEPT(fabpool_buffer_export_done(x));
    KEPT(fabpool_buffer_peers_ack(x, UINT64_MAX));
    void *blk = NULL;
    CHECK_OK(fabpool_alloc(p, 1 * MB, &blk));
    KEPT(fabpool_block_export(p, blk, desc, sizeof desc, &len, fds, 64, &nfds, &off));
    CHECK_OK(fabpool_free(p, blk));
    KEPT(fabpool_buffer_release(y));
    KEPT(fabpool_buffer_reuse(p, 4 * MB, NULL, &z));
    KEPT(fabpool_buffer_destroy(x, NULL));
    if (z)
        KEPT(fabpool_buffer_destroy(z, NULL));
    KEPT(fabpool_collect(p, 1));
    KEPT(fabpool_trim(p, 0));
    KEPT(fabpool_destroy(p));
}

/* A chunk the device had no memory for at first, made once the pool's cache went back (the heap's trim and
 * retry, for a block and for a buffer's chunk). */
static void chunk_after_trim(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    void *a = NULL, *b = NULL;
    fabpool_buffer_t *x = NULL;
    CHECK_OK(fabpool_alloc(p, 64 * MB, &a));
    CHECK_OK(fabpool_free(p, a)); /* cached */
    uint64_t retries = t_stats(p).oom_retries;
    KEPT_FAULT("cuMemCreate", 1, 0, CUDA_ERROR_OUT_OF_MEMORY, fabpool_alloc(p, 96 * MB, &b));
    CHECK(t_stats(p).oom_retries > retries);
    CHECK_OK(fabpool_free(p, b)); /* cached again */
    retries = t_stats(p).oom_retries;
    KEPT_FAULT("cuMemCreate", 1, 0, CUDA_ERROR_OUT_OF_MEMORY, fabpool_buffer_create(p, 256 * MB, 128 * MB, &x));
    CHECK(t_stats(p).oom_retries > retries);
    if (x)
        CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* An allocation that found the device out of memory while a block freed on a stream waited for the stream's
 * work: it waits for that work and tries again, and the block freed is what it gets. */
static void alloc_after_stream_wait(void)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:false");
    CUstream s = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return;
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(p, 64 * MB, &a));
    h.hold(s);
    CHECK_OK(fabpool_free_on_stream(p, a, s)); /* pending until s's work is done */
    CHECK_OK(fabpool_trim(p, 0));              /* no free memory mapped: the next block needs a new chunk */
    KEPT_FAULT("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY, fabpool_alloc(p, 64 * MB, &b));
    CHECK(b == a);
    h.release(s);
    CHECK_OK(fabpool_free(p, b));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

/* A buffer that grows once the released ones kept for reuse went back (the device had no memory before). */
static void grow_after_kept(void)
{
    fabpool_t *p = t_pool("handle_type:none,keep_ms:60000");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL, *y = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 32 * MB, &x));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 2 * MB, &y));
    if (!x || !y)
        return;
    CHECK_OK(fabpool_buffer_release(x));
    CHECK(t_stats(p).kept_bytes > 0);
    KEPT_FAULT("cuMemCreate", 1, 0, CUDA_ERROR_OUT_OF_MEMORY, fabpool_buffer_resize(y, 40 * MB, NULL));
    CHECK(t_stats(p).kept_bytes == 0);
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* A shrink whose smaller chunk the device had no memory for: the chunk stays whole, the shrink succeeds. */
static void shrink_keeps_chunk_whole(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL;
    CHECK_OK(fabpool_buffer_create(p, 100 * MB, 100 * MB, &x));
    if (!x)
        return;
    KEPT_FAULT("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY, fabpool_buffer_resize(x, 1 * MB, NULL));
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(x, &i));
    CHECK(i.size == 1 * MB);
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* Events the stream pair could not record: the context is waited for instead, and the call succeeds (the
 * batch event of 256 frees on a stream; a free of a block with another stream recorded; the poll of an
 * allocation while blocks wait on a stream). */
static void events_refused(void)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:false");
    CUstream s = NULL, t = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS || cuStreamCreate(&t, 0) != CUDA_SUCCESS)
        return;
    enum { N = 256 };
    static void *v[N];
    for (int i = 0; i < N; i++)
        CHECK_OK(fabpool_alloc_on_stream(p, 1000, s, &v[i]));
    for (int i = 0; i < N - 1; i++)
        CHECK_OK(fabpool_free_on_stream(p, v[i], s));
    KEPT_FAULT("cuEventRecord", 1, 0, CUDA_ERROR_UNKNOWN, fabpool_free_on_stream(p, v[N - 1], s));
    void *b = NULL, *c = NULL;
    CHECK_OK(fabpool_alloc(p, 3000, &b));
    CHECK_OK(fabpool_record_stream(p, b, t));
    KEPT_FAULT("cuEventRecord", 1, 1, CUDA_ERROR_UNKNOWN, fabpool_free(p, b));
    CHECK_OK(fabpool_alloc_on_stream(p, 2 * MB, t, &b));
    h.hold(t);
    CHECK_OK(fabpool_free_on_stream(p, b, t));
    KEPT_FAULT("cuEventRecord", 1, 1, CUDA_ERROR_UNKNOWN, fabpool_alloc(p, 6 * MB, &c));
    h.release(t);
    CHECK_OK(fabpool_free(p, c));
    CHECK_OK(fabpool_check(p));
    cuStreamDestroy(s);
    cuStreamDestroy(t);
    CHECK_OK(fabpool_destroy(p));
}

/* The first allocation that is not the owner stream's waits for the owner's work (its fence): an event the
 * driver would not record there, the context waited for instead. */
static void fence_event_refused(void)
{
    fabpool_t *p = t_pool("handle_type:none,stream_owner:true");
    CUstream s = NULL;
    if (!p || cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return;
    void *x = NULL, *y = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 5000, s, &x)); /* s owns the pool */
    CHECK_OK(fabpool_free_on_stream(p, x, s));
    KEPT_FAULT("cuEventRecord", 1, 1, CUDA_ERROR_UNKNOWN, fabpool_alloc(p, 5000, &y));
    CHECK_OK(fabpool_free(p, y));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    h = t_sim_required("test_last_error_kept", "faults, stream holds");
    blocks_and_stats();
    buffers_and_exports();
    chunk_after_trim();
    alloc_after_stream_wait();
    grow_after_kept();
    shrink_keeps_chunk_whole();
    events_refused();
    fence_event_refused();
    printf("test_last_error_kept: %d calls succeeded after a failure\n", n_kept);
    return t_done("test_last_error_kept");
}
