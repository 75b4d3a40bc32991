/* test_ack_faults: a peers' acknowledgement always takes effect.  An
 * exported buffer drops a chunk on a stream (the peers may still import
 * it); once the stream's work is done, the peers acknowledge while the
 * driver refuses a call of the unmap that follows (the event query, the
 * context switch): the ack answers OK, and the next collect unmaps the
 * chunk without another ack; the driver then holds only what the pool
 * maps. */
#include "testutil.h"

#define MB (1ull << 20)

static void ack_with_fault(t_sim_hooks *h, const char *entry, uint64_t nth, int by_id)
{
    fabpool_t *p = t_pool("handle_type:auto,max_chunk:8MiB,shrink_hysteresis:0");
    CUstream s = NULL;
    fabpool_buffer_t *b = NULL;
    if (!p || fabpool_handle_type_of(p) == FABPOOL_HANDLE_NONE || cuStreamCreate(&s, 0) != CUDA_SUCCESS ||
        fabpool_buffer_create(p, 64 * MB, 16 * MB, &b) != FABPOOL_OK) {
        fabpool_destroy(p);
        return;
    }
    static uint8_t d[1 << 13];
    int fds[64];
    size_t len = 0, nfds = 0;
    CHECK_OK(fabpool_buffer_export(b, 0, d, sizeof d, &len, fds, 64, &nfds));
    CHECK_OK(fabpool_buffer_export_done(b));
    h->hold(s);
    CHECK_OK(fabpool_buffer_resize(b, 8 * MB, s)); /* the second chunk retires on s */
    h->release(s);
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    CHECK(t_stats(p).retiring_bytes == 8 * MB);
    h->fault_set(entry, nth, 0, CUDA_ERROR_UNKNOWN);
    fabpool_status st = by_id ? fabpool_peers_ack(p, bi.export_id, bi.generation) : fabpool_buffer_peers_ack(b, bi.generation);
    h->fault_clear();
    CHECK_OK(st);
    if (st != FABPOOL_OK)
        fprintf(stderr, "  call %llu of %s failed: the ack answered %s\n", (unsigned long long)nth, entry,
                fabpool_status_name(st));
    CHECK_OK(fabpool_collect(p, 1)); /* no second ack needed */
    CHECK(t_stats(p).retiring_bytes == 0 && t_mapped(p) == 8 * MB);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_ack_faults", "faults, stream holds");
    fabsim_ledger l0 = t_ledger();
    static const char *const entries[] = {"cuEventQuery", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuMemUnmap"};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        for (uint64_t n = 1; n <= 2; n++)
            for (int by_id = 0; by_id < 2; by_id++)
                ack_with_fault(&h, entries[e], n, by_id);
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.bytes_held == l0.bytes_held && l1.handles == l0.handles);
    return t_done("test_ack_faults");
}
