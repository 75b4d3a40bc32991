/* test_retire_queue.c - the stream queue (lib/device/retire.c, pending.c) on its
 * own, built with the device layer's files and the base files they use (no
 * chunk, no pool): a block freed on a stream is taken back on that stream at
 * once and never on another; behind unfinished work (a held stream of the
 * simulated driver) a poll hands nothing back, and once the work is done it
 * hands the block back; a large block is taken only by a request whose
 * bounds hold its size. */
#include <stdatomic.h>

#include "testutil.h"

#include "pending.h"

static void check_same_stream(fp_retire *r, CUstream s1, CUstream s2)
{
    unsigned cls = fp_class_of(512);
    int poll = 0;
    uint64_t usable = 0;
    CHECK_OK(fp_pending_free(r, s1, 0x10000, 512, cls, &poll));
    CHECK(atomic_load(&r->pending_blocks) == 1 && atomic_load(&r->pending_bytes) == 512);
    CHECK(fp_pending_take(r, s2, cls, 0, 0, &usable) == 0);
    CHECK(fp_pending_take(r, s1, cls + 1, 0, 0, &usable) == 0);
    CHECK(fp_pending_take(r, s1, cls, 0, 0, &usable) == 0x10000 && usable == 512);
    CHECK(atomic_load(&r->pending_blocks) == 0 && atomic_load(&r->pending_bytes) == 0);
}

static void check_poll(fp_retire *r, CUstream s1, t_sim_hooks h)
{
    unsigned cls = fp_class_of(512);
    int poll = 0;
    if (h.hold)
        h.hold(s1);
    CHECK_OK(fp_pending_free(r, s1, 0x20000, 512, cls, &poll));
    if (h.hold) {
        CHECK(fp_pending_poll(r, 0, 0) == NULL); /* its stream's work is not done */
        CHECK(atomic_load(&r->pending_blocks) == 1);
        h.release(s1);
    }
    fp_rblock *c = fp_pending_poll(r, 1, 1);
    CHECK(c != NULL && c->ptr == 0x20000 && c->usable == 512 && c->fnext == NULL);
    CHECK(atomic_load(&r->pending_blocks) == 0);
    fp_pending_recycle(r, c);
}

static void check_large(fp_retire *r, CUstream s1)
{
    int poll = 0;
    uint64_t usable = 0;
    CHECK_OK(fp_pending_free(r, s1, 0x40000000, 4u << 20, FP_PENDING_LARGE, &poll));
    CHECK(fp_pending_take(r, s1, FP_PENDING_LARGE, 5u << 20, 6u << 20, &usable) == 0); /* too small for it */
    CHECK(fp_pending_take(r, s1, FP_PENDING_LARGE, 2u << 20, 3u << 20, &usable) == 0); /* too large for it */
    CHECK(fp_pending_take(r, s1, FP_PENDING_LARGE, 3u << 20, 5u << 20, &usable) == 0x40000000);
    CHECK(usable == 4u << 20);
}

int main(void)
{
    t_driver_init();
    CHECK_OK(fp_drv_load("test_retire_queue"));
    fp_meta meta;
    CHECK_OK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC));
    fp_drv_counters calls;
    memset(&calls, 0, sizeof calls);
    fp_retire r;
    CHECK_OK(fp_retire_init(&r, &meta, &calls, t_ctx, 0, 0));
    CUstream s1 = NULL, s2 = NULL;
    CHECK_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    check_same_stream(&r, s1, s2);
    check_poll(&r, s1, t_sim_hooks_get());
    check_large(&r, s1);
    fp_pending_recycle(&r, fp_pending_poll(&r, 1, 1));
    fp_retire_destroy(&r);
    fp_meta_destroy(&meta);
    cuStreamDestroy(s1);
    cuStreamDestroy(s2);
    return t_done("test_retire_queue");
}
