/* rack_model.h - the time of a HybridEP regrow, modelled from the driver calls
 * a rank makes (counted by the simulated driver) and the H200's per-call
 * costs (one H200, driver 580.159.04, medians; docs/performance.md, "The
 * seed's run at rack scale", lists them).  A call costs a + b x its bytes:
 * the fit through the 2 MiB and 1 GiB medians where the cost grows with the
 * size, a constant where it does not.  The export and import are the POSIX-fd
 * figures: fabric handles are not permitted on the H200 (no IMEX channel), so
 * the fabric calls are priced as the fd ones. */
#ifndef FABPOOL_RACK_MODEL_H
#define FABPOOL_RACK_MODEL_H

#include <cstddef>
#include <cstdint>

enum { RB_CREATED, RB_MAPPED, RB_UNMAPPED, RB_EXPORTED, kRackBytes };

constexpr int kRackCalls = 10;
static const char *const kRackCallName[kRackCalls] = {
    "cuMemCreate",   "cuMemAddressReserve", "cuMemMap",    "cuMemSetAccess", "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle", "cuMemRetainAllocationHandle", "cuMemRelease", "cuMemUnmap",
    "cuMemAddressFree"};

struct RackCost {
    double a_us;    /* per call */
    double b_us;    /* per MiB of the call's size */
    int bytes;      /* which bytes (RB_*) the size term uses; -1: none */
};
/* 2 MiB -> 1 GiB medians: create 28.0 -> 346, map 3.6 -> 4.7, set access 51.6 -> 115, fd export 622 -> 849,
 * unmap 70.9 -> 578; reserve and address free 12.5 (64 MiB and up); import 98 (another process's fd);
 * release 1.4; retain not measured, taken as a release. */
static const RackCost kRackCost[kRackCalls] = {
    {27.38, 0.3112, RB_CREATED}, {12.5, 0, -1}, {3.6, 0.00108, RB_MAPPED}, {51.48, 0.0620, RB_MAPPED},
    {621.6, 0.2221, RB_EXPORTED}, {98.0, 0, -1}, {1.4, 0, -1}, {1.4, 0, -1}, {69.91, 0.4962, RB_UNMAPPED},
    {12.5, 0, -1}};
/* the handle all-gather of one regrow (torch.distributed.all_gather of the handle bytes and its copies; the
 * H200's in-place breakdown at world size 1) */
constexpr double kRackGatherUs = 226;

/* The bytes (MiB) one rank's regrow creates, maps (its own buffers and its views), unmaps and exports: from
 * `old` to `now` (sizes of n buffers; old all 0 at the first allocation), released and allocated again, or grown
 * in place.  own[b]: this rank has buffer b (0 or 1); views[b]: how many views of buffer b it maps (of its
 * peers' buffers b).  Each buffer's export is priced once by its size. */
inline void rack_bytes(bool in_place, const std::size_t *old, const std::size_t *now, int n, const int *own,
                       const int *views, double out[kRackBytes])
{
    auto mib = [](std::size_t s) { return 2.0 * (double)((s + (std::size_t(2) << 20) - 1) >> 21); };
    for (int i = 0; i < kRackBytes; i++)
        out[i] = 0;
    for (int b = 0; b < n; b++) {
        double nw = mib(now[b]), od = mib(old[b]), mine = own[b], all = own[b] + views[b];
        if (in_place) {
            double grown = nw > od ? nw - od : 0;
            out[RB_CREATED] += mine * grown;
            out[RB_MAPPED] += all * grown;
            out[RB_EXPORTED] += mine * grown;
        } else {
            out[RB_CREATED] += mine * nw;
            out[RB_MAPPED] += all * nw;
            out[RB_UNMAPPED] += all * od;
            out[RB_EXPORTED] += mine * nw;
        }
    }
}

/* the modelled time of a regrow whose calls and bytes (MiB) were counted */
inline double rack_model_us(const std::uint64_t calls[kRackCalls], const double bytes[kRackBytes])
{
    double us = kRackGatherUs;
    for (int i = 0; i < kRackCalls; i++)
        us += (double)calls[i] * kRackCost[i].a_us +
              (kRackCost[i].bytes >= 0 ? kRackCost[i].b_us * bytes[kRackCost[i].bytes] : 0);
    return us;
}

#endif
