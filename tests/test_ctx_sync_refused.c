/* test_ctx_sync_refused: where the pool cannot ask about or record an event and falls back on
 * cuCtxSynchronize, and the driver refuses that too, nothing is taken for done: memory that GPU work on a
 * stream may still use is neither handed out again nor unmapped (retire.h).
 *
 * The stream s2 is held (its work does not complete; fabsim_stream_hold), and the driver refuses every
 * cuEventQuery or cuEventSynchronize or cuEventRecord, and every cuCtxSynchronize, while one call runs:
 *  - a block freed on s2 (fabpool_free_on_stream), and fabpool_collect(pool, 0): the block stays pending, and
 *    no allocation (on another stream or fabpool_alloc) returns it;
 *  - the same with a buffer chunk retired on s2 (a shrink on s2) beside it: the chunk stays mapped and
 *    retiring, also through a collect after the faults;
 *  - a block used on s2 (fabpool_record_stream) and freed with fabpool_free: it stays pending;
 *  - such a block's free, where no event can be recorded on s2: refused with the block still the caller's,
 *    or queued; either way no allocation returns it while s2 holds;
 *  - the owner stream s2 freed a block at once: a fabpool_alloc, which must wait for the owner's work first,
 *    is refused, and the owner mode holds.
 * Then s2 is released, everything pending comes back, the pool passes fabpool_check, and after its destroy
 * the driver holds nothing. */
#include "testutil.h"

#define MB (1ull << 20)
#define NTRY 8

static t_sim_hooks h;
static CUstream s2, s3;

/* The driver refuses every call of `wait` (cuEventQuery, cuEventSynchronize or cuEventRecord) and of
 * cuCtxSynchronize from now on. */
static void refuse(const char *wait)
{
    h.fault_set(wait, 0, 1, CUDA_ERROR_UNKNOWN);
    h.fault_set("cuCtxSynchronize", 0, 1, CUDA_ERROR_UNKNOWN);
}

/* Whether allocations of `size` bytes, NTRY on s3 and NTRY with fabpool_alloc, all keep clear of x. */
static int never_hands_out(fabpool_t *p, const void *x, size_t size)
{
    void *got[2 * NTRY] = {0};
    int clear = 1;
    for (int i = 0; i < 2 * NTRY; i++) {
        fabpool_status st = i < NTRY ? fabpool_alloc_on_stream(p, size, s3, &got[i]) : fabpool_alloc(p, size, &got[i]);
        CHECK_OK(st);
        if (got[i] == x) {
            fprintf(stderr, "  allocation %d (%s) returned %p, freed while the work of stream s2 pends\n", i,
                    i < NTRY ? "on s3" : "fabpool_alloc", x);
            clear = 0;
        }
    }
    for (int i = 0; i < 2 * NTRY; i++)
        if (got[i])
            CHECK_OK(i < NTRY ? fabpool_free_on_stream(p, got[i], s3) : fabpool_free(p, got[i]));
    return clear;
}

/* The end of a scenario: s2 released, everything back, the pool checked and destroyed, the ledger as before. */
static void finish(fabpool_t *p, fabsim_ledger before)
{
    CHECK(h.release(s2) == 0);
    CHECK_OK(fabpool_collect(p, 1));
    CHECK(t_counters(p).stream_pending_blocks == 0);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_held == before.bytes_held && l.mappings == before.mappings && l.handles == before.handles);
}

static void pending_block(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("stream_owner:0");
    void *x = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, s2, &x));
    CHECK(h.hold(s2) == 0);
    CHECK_OK(fabpool_free_on_stream(p, x, s2));
    refuse("cuEventQuery");
    (void)fabpool_collect(p, 0);
    h.fault_clear();
    uint64_t pending = t_counters(p).stream_pending_blocks;
    if (pending != 1)
        fprintf(stderr, "  a block freed on a held stream: %llu pending after a collect whose event query and "
                "context synchronize failed\n", (unsigned long long)pending);
    CHECK(pending == 1);
    CHECK(never_hands_out(p, x, 1000));
    finish(p, before);
}

static void retired_chunk(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("stream_owner:0,max_chunk:8MiB,handle_type:none");
    fabpool_buffer_t *b = NULL;
    void *x = NULL;
    CHECK_OK(fabpool_buffer_create(p, 16 * MB, 16 * MB, &b));
    if (!b) {
        CHECK_OK(fabpool_destroy(p));
        return;
    }
    char *base = fabpool_buffer_ptr(b);
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, s2, &x));
    CHECK(h.hold(s2) == 0);
    CHECK_OK(fabpool_free_on_stream(p, x, s2));
    CHECK_OK(fabpool_buffer_resize(b, 8 * MB, s2)); /* its second chunk retires on s2 */
    uint64_t retiring = t_stats(p).retiring_bytes;
    CHECK(retiring == 8 * MB);
    refuse("cuEventQuery");
    (void)fabpool_collect(p, 0);
    h.fault_clear();
    CHECK_OK(fabpool_collect(p, 0));
    int mapped = h.range_mapped(base + 8 * MB, 8 * MB);
    if (!mapped || t_stats(p).retiring_bytes != retiring)
        fprintf(stderr, "  a chunk retired on a held stream was unmapped after a collect whose event query and "
                "context synchronize failed (retiring %llu -> %llu bytes)\n", (unsigned long long)retiring,
                (unsigned long long)t_stats(p).retiring_bytes);
    CHECK(mapped);
    CHECK(t_stats(p).retiring_bytes == retiring);
    CHECK(t_counters(p).stream_pending_blocks == 1);
    CHECK(never_hands_out(p, x, 1000));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    finish(p, before);
}

static void recorded_block(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("stream_owner:0");
    void *x = NULL;
    CHECK_OK(fabpool_alloc(p, 1000, &x));
    CHECK(h.hold(s2) == 0);
    CHECK_OK(fabpool_record_stream(p, x, s2));
    CHECK_OK(fabpool_free(p, x));
    refuse("cuEventQuery");
    (void)fabpool_collect(p, 0);
    h.fault_clear();
    CHECK(t_counters(p).stream_pending_blocks == 1);
    CHECK(never_hands_out(p, x, 1000));
    finish(p, before);
}

static void recorded_free_unrecordable(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("stream_owner:0");
    void *x = NULL;
    CHECK_OK(fabpool_alloc(p, 1000, &x));
    t_put_tag(x, 1000, 0xfeed);
    CHECK(h.hold(s2) == 0);
    CHECK_OK(fabpool_record_stream(p, x, s2));
    refuse("cuEventRecord");
    fabpool_status st = fabpool_free(p, x);
    h.fault_clear();
    if (st != FABPOOL_OK) { /* refused: the block is still the caller's, its stream recorded */
        size_t u = 0;
        CHECK_OK(fabpool_usable_size(p, x, &u));
        CHECK(t_tag_ok(x, 1000, 0xfeed));
    }
    CHECK_OK(fabpool_collect(p, 0));
    CHECK(never_hands_out(p, x, 1000));
    if (st != FABPOOL_OK)
        CHECK_OK(fabpool_free(p, x));
    finish(p, before);
}

static void owner_fence(void)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("stream_owner:1");
    void *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, s2, &x));
    CHECK(h.hold(s2) == 0);
    CHECK_OK(fabpool_free_on_stream(p, x, s2));
    CHECK(t_counters(p).stream_owner_frees == 1);
    refuse("cuEventSynchronize");
    fabpool_status st = fabpool_alloc(p, 1000, &y);
    h.fault_clear();
    if (st == FABPOOL_OK)
        fprintf(stderr, "  fabpool_alloc gave %p (the owner freed %p) though it could not wait for the owner's "
                "work\n", y, x);
    CHECK(st != FABPOOL_OK && y == NULL);
    /* the owner mode holds: s2's free goes to the pool at once */
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, s2, &z));
    CHECK_OK(fabpool_free_on_stream(p, z, s2));
    CHECK(t_counters(p).stream_owner_frees == 2);
    if (y)
        CHECK_OK(fabpool_free(p, y));
    finish(p, before);
}

int main(void)
{
    h = t_sim_required("test_ctx_sync_refused", "faults, stream holds");
    CHECK_CU(cuStreamCreate(&s2, 0));
    CHECK_CU(cuStreamCreate(&s3, 0));
    pending_block();
    retired_chunk();
    recorded_block();
    recorded_free_unrecordable();
    owner_fence();
    CHECK_CU(cuStreamDestroy(s2));
    CHECK_CU(cuStreamDestroy(s3));
    return t_done("test_ctx_sync_refused");
}
