/* test_buffer_check_refit_gap: a shrink whose refit replaced the last chunk it keeps by a smaller one, and
 * whose unmaps of the chunk after it the driver refused (each unmap is tried twice, and the collect at the
 * end of the resize tries again), leaves that chunk retired behind a gap: a state the library means
 * (fabpool_collect unmaps it later; a grow does not take it back), which fabpool_check must pass, not report
 * as corruption.
 *
 * A buffer of three 8 MiB chunks, a word written in each MiB, shrinks to 9 MiB with the context synchronized
 * (its second chunk refitted to a smaller one, the third retired and unmapped at once), while every
 * cuMemUnmap of the buffer's window fails from the shrink's n-th unmap on, for every n the shrink reaches
 * (white-box: the library's cuMemUnmap entry is wrapped, so that the unmap of the refit's staging copy,
 * outside the window, succeeds: the driver would keep its address space).  Then, with the driver well:
 *  - the shrink answered FABPOOL_OK, the buffer has 9 MiB, all mapped, its words below 9 MiB kept;
 *  - fabpool_check passes; fabpool_collect gives back what is left retired; fabpool_check passes;
 *  - the buffer grows back to 24 MiB, every byte mapped, its words below 9 MiB kept;
 * and after the pool's destroy the driver holds nothing. */
#include "testutil.h"
#include "driver.h"

#define MB (1ull << 20)

static int words_ok(char *base, size_t n)
{
    for (size_t off = 0; off < n; off += MB)
        if (t_get_word(base + off) != 0x5eed0000 + off / MB)
            return 0;
    return 1;
}

static t_sim_hooks sim; /* the sim's range check */
static int n_gaps;

/* The library's cuMemUnmap, wrapped: from call fail_at on (counted from the wrap), those in [lo, hi) fail. */
static __typeof__(fp_drv.p_cuMemUnmap) real_unmap;
static uint64_t unmaps, fail_at, lo, hi;

static CUresult CUDAAPI unmap_window_refused(CUdeviceptr va, size_t size)
{
    if (++unmaps >= fail_at && fail_at && va >= lo && va < hi)
        return CUDA_ERROR_UNKNOWN;
    return real_unmap(va, size);
}

static uint64_t made; /* the shrink's unmaps */

static void trial(uint64_t n)
{
    fabsim_ledger before = t_ledger();
    fabpool_t *p = t_pool("handle_type:none,max_chunk:8MiB,max_waste:0,shrink_hysteresis:0");
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 24 * MB, 24 * MB, &b));
    if (!b) {
        CHECK_OK(fabpool_destroy(p));
        return;
    }
    char *base = fabpool_buffer_ptr(b);
    for (size_t off = 0; off < 24 * MB; off += MB)
        t_put_word(base + off, 0x5eed0000 + off / MB);
    fabpool_buffer_info i0 = {.struct_size = sizeof i0};
    CHECK_OK(fabpool_buffer_get_info(b, &i0));
    CHECK(i0.n_chunks == 3);
    unmaps = 0;
    fail_at = n;
    lo = (uint64_t)(uintptr_t)base;
    hi = lo + 24 * MB;
    fp_drv.p_cuMemUnmap = unmap_window_refused;
    fabpool_status st = fabpool_buffer_resize(b, 9 * MB, NULL);
    fp_drv.p_cuMemUnmap = real_unmap;
    made = unmaps;
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_buffer_get_info(b, &i));
    n_gaps += t_stats(p).retiring_bytes == 8 * MB && i.mapped < 24 * MB; /* the third chunk behind the refit's */
    int bad = 0;
    if (st != FABPOOL_OK || i.size != 9 * MB || !sim.range_mapped(base, 9 * MB) || !words_ok(base, 9 * MB)) {
        fprintf(stderr, "  the shrink -> %s, size %zu, mapped %s, data %s\n", fabpool_status_name(st), i.size,
                sim.range_mapped(base, 9 * MB) ? "yes" : "no", words_ok(base, 9 * MB) ? "kept" : "lost");
        bad = 1;
    }
    if (fabpool_check(p) != FABPOOL_OK) {
        fprintf(stderr, "  fabpool_check after the shrink: %s\n", fabpool_last_error());
        bad = 1;
    }
    CHECK_OK(fabpool_collect(p, 1));
    CHECK(t_stats(p).retiring_bytes == 0);
    if (fabpool_check(p) != FABPOOL_OK) {
        fprintf(stderr, "  fabpool_check after the collect: %s\n", fabpool_last_error());
        bad = 1;
    }
    CHECK_OK(fabpool_buffer_resize(b, 24 * MB, NULL));
    if (!sim.range_mapped(base, 24 * MB) || !words_ok(base, 9 * MB)) {
        fprintf(stderr, "  grown back: not all mapped, or its data lost\n");
        bad = 1;
    }
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
    fabsim_ledger l = t_ledger();
    CHECK(l.bytes_held == before.bytes_held && l.mappings == before.mappings && l.handles == before.handles);
    CHECK(!bad);
    if (bad)
        fprintf(stderr, "  every cuMemUnmap of the window from the shrink's unmap %llu on failed\n",
                (unsigned long long)n);
}

int main(void)
{
    sim = t_sim_required("test_buffer_check_refit_gap", "the ledger, fabsim_range_mapped");
    fabpool_t *p = t_pool(NULL); /* the driver loaded: its entry points are there to wrap */
    CHECK_OK(fabpool_destroy(p));
    real_unmap = fp_drv.p_cuMemUnmap;
    trial(0); /* how many unmaps the shrink makes with the driver well */
    uint64_t n_unmaps = made;
    CHECK(n_unmaps >= 2);
    for (uint64_t n = 1; n <= n_unmaps; n++)
        trial(n);
    printf("test_buffer_check_refit_gap: the window's unmaps refused from each of %llu on; %d left a retired "
           "chunk behind a gap\n", (unsigned long long)n_unmaps, n_gaps);
    CHECK(n_gaps > 0);
    return t_done("test_buffer_check_refit_gap");
}
