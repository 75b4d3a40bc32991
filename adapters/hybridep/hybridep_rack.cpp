/* hybridep_rack: the seed's run (HybridEP through Megatron-LM's flex dispatcher
 * on an NVL72, variable-length batches) replayed over the ranks of an MPI job
 * on the simulated driver with fabric handles, four ways:
 *
 *   leaky     upstream's fabric allocator as it is (allocator.cu): cuMemCreate,
 *             reserve, map, set access; get_handle retains and exports;
 *             open_handle imports, reserves, maps; free retains, unmaps and
 *             releases once (net zero); close_handle unmaps; none of the
 *             create, retain or import references is ever released;
 *   fixed     the same with the releases added (after the map, the export and
 *             the import: the fix proposed upstream);
 *   unchanged fabpool's adapter under DeepEP's unchanged update_buffer, which
 *             frees every buffer and allocates it again larger (the adapter
 *             keeps the freed buffers and closed views and takes them back:
 *             only the growth is created, exported and imported);
 *   inplace   fabpool's adapter under the patched update_buffer: every shared
 *             buffer grows where it is (resize + get_delta + update_handle).
 *
 * Every rank holds HybridEP's buffer set for one NVLink domain of all the
 * ranks (hybrid_ep.cu, intranode.cu, allgather.cu at 94a9f8f; hidden 7,168,
 * bf16, 8 experts per rank): combine token, prob and chunk flags, dispatch
 * scaling factors and chunk flags, the custom all-gather's destination and
 * flag, and on local rank 0 the two completion flags; 11 handles (9 on the
 * other ranks: the dispatch token and prob buffers are the combine ones,
 * exported again).  The token count per rank follows a seeded trace of
 * variable-length batches (the same on every rank: the dispatcher pads to the
 * group's maximum, or the agreement gives every rank the largest need), and
 * every new high, aligned to 16 tokens, regrows the set.
 *
 * Per step and way it gathers on rank 0: the device memory every GPU holds
 * (all the memory of the simulated machine that any process keeps alive, by
 * the sim's scan of /proc, over the ranks: each GPU's own buffers, whoever
 * pins them), the driver calls of every rank (creates, exports, imports, ...),
 * the handle bytes each rank sends in the all-gathers, and the time of a
 * regrow modelled from the H200's per-call costs (rack_model.h).  It prints
 * one JSON object per line (way, step, ...) to --json, and with --check
 * asserts what each way must show.
 *
 *   mpirun -np N hybridep_rack [--steps S] [--json FILE] [--check] [--no-scan]
 *   (FABSIM_FABRIC=1, FABSIM_MEMORY large: a process's ledger counts its imports) */
#define HYBRIDEP_TEST
#include "hybridep_sizes.h"

#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "rack_model.h"

static int rank, nranks;

/* ------------------------------------------------------------ the buffer set */

enum { C_TOKEN, C_PROB, C_CHUNK, D_SCALE, D_CHUNK, AG_DST, AG_FLAG, C_DONE, D_DONE, NBUF };
static const char *const kBufName[NBUF] = {"combine token", "combine prob", "combine chunk flags",
                                           "dispatch scaling factors", "dispatch chunk flags", "all-gather dst",
                                           "all-gather flag", "combine completion flags",
                                           "dispatch completion flags"};
/* the handles update_buffer exchanges, in upstream's order: combine's 4, dispatch's 5, the all-gather's 2 */
static const int kSlot[] = {C_TOKEN, C_PROB, C_DONE, C_CHUNK, C_TOKEN, C_PROB, D_SCALE, D_DONE, D_CHUNK, AG_DST, AG_FLAG};
static const int NSLOT = (int)(sizeof kSlot / sizeof kSlot[0]);
static const uint64_t kHidden = 7168, kExperts = 8, kChunkTokens = 128;

static bool owned(int b) { return (b != C_DONE && b != D_DONE) || rank == 0; }
/* rank 0's completion flags are opened by the others; everything else by every peer */
static bool opens(int b, int q) { return q != rank && ((b != C_DONE && b != D_DONE) || q == 0); }

static void set_sizes(uint64_t T, size_t sz[NBUF])
{
    const uint64_t R = (uint64_t)nranks, M = T * R;
    sz[C_TOKEN] = M * kHidden * 2;
    sz[C_PROB] = M * kExperts * R * 4;
    sz[C_CHUNK] = sz[D_CHUNK] = (T + kChunkTokens - 1) / kChunkTokens * R * 4;
    sz[D_SCALE] = M * (kHidden / 128) * 4;
    sz[AG_DST] = kExperts * R * T * R;
    sz[AG_FLAG] = 8;
    sz[C_DONE] = sz[D_DONE] = 8;
}
static const size_t G = 2u << 20;
static size_t round2m(size_t s) { return (s + G - 1) / G * G; }

/* ------------------------------------------------------------ the token trace */

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
/* Tokens per rank of step `step` of `steps`: packed variable-length batches around `base`, the longest ones
 * longer as the run goes on (long documents are rare; a few steps hold one), aligned to 16 as HybridEP does. */
static uint64_t trace_tokens(uint64_t *seed, long step, long steps, uint64_t base)
{
    double u = (double)(rng(seed) % 1000000) / 1e6;
    double reach = std::sqrt((double)(step + 1) / (double)steps);
    uint64_t t = base + (uint64_t)(base / 4.0 * u * u * reach);
    return hybridep_tokens(t);
}

/* ------------------------------------------------------------ what each way records */

struct Calls {
    uint64_t n[kRackCalls];
};
static Calls calls_now()
{
    static t_sim_hooks h = t_sim_hooks_get();
    Calls c{};
    for (int i = 0; i < kRackCalls; i++)
        c.n[i] = h.calls ? h.calls(kRackCallName[i]) : 0;
    return c;
}

/* one rank's record of one step */
struct Rec {
    double model_us;          /* the regrow's modelled time (0: no regrow) */
    double bytes[kRackBytes]; /* what the model prices by the byte */
    uint64_t calls[kRackCalls];
    uint64_t sent;            /* handle bytes this rank sent in the step's all-gathers */
    int64_t ledger;           /* what this process keeps alive (own buffers and its imports) */
    uint64_t bad;             /* peers' data that did not read back */
};

/* ------------------------------------------------------------ upstream's fabric allocator */

struct Raw {
    bool fixed;
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    std::vector<CUmemGenericAllocationHandle> leaked;
    CUdeviceptr own[NBUF] = {};
    CUdeviceptr view[NBUF][128] = {};
    struct Handle {
        uint64_t size;
        CUmemFabricHandle fabric;
        unsigned char pad[328 - 8 - sizeof(CUmemFabricHandle)]; /* upstream's MemHandle is 328 bytes */
    };
};

static CUdeviceptr raw_map(Raw &w, CUmemGenericAllocationHandle h, size_t s)
{
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAddressReserve(&p, s, 0, 0, 0));
    CHECK_CU(cuMemMap(p, s, 0, h, 0));
    CHECK_CU(cuMemSetAccess(p, s, &w.acc, 1));
    return p;
}
static void raw_unmap(CUdeviceptr p)
{
    size_t s = 0;
    CHECK_CU(cuMemGetAddressRange(NULL, &s, p));
    CHECK_CU(cuMemUnmap(p, s));
    CHECK_CU(cuMemAddressFree(p, s));
}

static void raw_release_buffer(Raw &w)
{
    for (int b = 0; b < NBUF; b++) {
        if (w.own[b]) { /* free(): retain, unmap, address free, release: net zero */
            CUmemGenericAllocationHandle h;
            CHECK_CU(cuMemRetainAllocationHandle(&h, (void *)w.own[b]));
            raw_unmap(w.own[b]);
            CHECK_CU(cuMemRelease(h));
            w.own[b] = 0;
        }
        for (int q = 0; q < nranks; q++)
            if (w.view[b][q]) { /* close_handle(): unmap only */
                raw_unmap(w.view[b][q]);
                w.view[b][q] = 0;
            }
    }
}

static uint64_t raw_allocate_buffer(Raw &w, const size_t sz[NBUF])
{
    for (int b = 0; b < NBUF; b++) {
        if (!owned(b))
            continue;
        CUmemGenericAllocationHandle h;
        CHECK_CU(cuMemCreate(&h, round2m(sz[b]), &w.prop, 0));
        w.own[b] = raw_map(w, h, round2m(sz[b]));
        if (w.fixed)
            CHECK_CU(cuMemRelease(h));
        else
            w.leaked.push_back(h);
    }
    std::vector<Raw::Handle> mine((size_t)NSLOT), all((size_t)NSLOT * (size_t)nranks);
    memset(mine.data(), 0, mine.size() * sizeof(Raw::Handle));
    for (int k = 0; k < NSLOT; k++) { /* get_handle: the size, then retain + export */
        int b = kSlot[k];
        if (!owned(b))
            continue;
        CUmemGenericAllocationHandle r;
        CHECK_CU(cuMemGetAddressRange(NULL, &mine[(size_t)k].size, w.own[b]));
        CHECK_CU(cuMemRetainAllocationHandle(&r, (void *)w.own[b]));
        CHECK_CU(cuMemExportToShareableHandle(&mine[(size_t)k].fabric, r, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        if (w.fixed)
            CHECK_CU(cuMemRelease(r));
        else
            w.leaked.push_back(r);
    }
    int n = (int)(sizeof(Raw::Handle) * (size_t)NSLOT);
    MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++)
        for (int k = 0; k < NSLOT; k++) {
            int b = kSlot[k];
            if (!opens(b, q) || w.view[b][q])
                continue; /* (the dispatch token and prob handles name the combine buffers: one view each) */
            Raw::Handle &hd = all[(size_t)q * (size_t)NSLOT + (size_t)k];
            CUmemGenericAllocationHandle h;
            CHECK_CU(cuMemImportFromShareableHandle(&h, &hd.fabric, CU_MEM_HANDLE_TYPE_FABRIC));
            w.view[b][q] = raw_map(w, h, hd.size);
            if (w.fixed)
                CHECK_CU(cuMemRelease(h));
            else
                w.leaked.push_back(h);
        }
    return (uint64_t)n;
}

/* ------------------------------------------------------------ fabpool's adapter */

struct Fab {
    ExtendedMemoryAllocator *a = nullptr;
    bool inplace;
    void *own[NBUF] = {};
    void *view[NBUF][128] = {};
};

static void fab_release_buffer(Fab &w)
{
    for (int b = 0; b < NBUF; b++) {
        for (int q = 0; q < nranks; q++)
            if (w.view[b][q]) {
                w.a->close_handle(w.view[b][q]);
                w.view[b][q] = nullptr;
            }
        if (w.own[b]) {
            w.a->free(w.own[b]);
            w.own[b] = nullptr;
        }
    }
}

/* allocate_buffer (DeepEP's): allocate, get_handle of every slot, all-gather, open_handle */
static uint64_t fab_allocate_buffer(Fab &w, const size_t sz[NBUF])
{
    for (int b = 0; b < NBUF; b++)
        if (owned(b))
            w.a->allocate(&w.own[b], sz[b]);
    std::vector<MemHandle> mine((size_t)NSLOT), all((size_t)NSLOT * (size_t)nranks);
    memset(mine.data(), 0, mine.size() * sizeof(MemHandle));
    for (int k = 0; k < NSLOT; k++)
        if (owned(kSlot[k]))
            w.a->get_handle(&mine[(size_t)k], w.own[kSlot[k]]);
    int n = (int)(sizeof(MemHandle) * (size_t)NSLOT);
    MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++)
        for (int k = 0; k < NSLOT; k++)
            if (opens(kSlot[k], q) && !w.view[kSlot[k]][q])
                w.a->open_handle(&w.view[kSlot[k]][q], &all[(size_t)q * (size_t)NSLOT + (size_t)k]);
    MPI_Barrier(MPI_COMM_WORLD); /* every peer has imported: the exporters may close their copies */
    for (int b = 0; b < NBUF; b++)
        if (w.own[b])
            w.a->peers_done(w.own[b]);
    return (uint64_t)n;
}

/* the patched update_buffer: resize every own buffer, one handle per buffer (a delta, or "unchanged"),
 * all-gather, update_handle on the views, then peers_done */
static uint64_t fab_grow_in_place(Fab &w, const size_t sz[NBUF])
{
    std::vector<MemHandle> mine((size_t)NBUF), all((size_t)NBUF * (size_t)nranks);
    memset(mine.data(), 0, mine.size() * sizeof(MemHandle));
    for (int b = 0; b < NBUF; b++)
        if (w.own[b]) {
            w.a->resize(w.own[b], sz[b]);
            w.a->get_delta(&mine[(size_t)b], w.own[b]);
        }
    /* (the completion flags of other ranks than 0 do not exist: nothing is sent for them) */
    int n = (int)(sizeof(MemHandle) * (size_t)NBUF);
    MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++)
        for (int b = 0; b < NBUF; b++)
            if (w.view[b][q])
                w.a->update_handle(w.view[b][q], &all[(size_t)q * (size_t)NBUF + (size_t)b]);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int b = 0; b < NBUF; b++)
        if (w.own[b])
            w.a->peers_done(w.own[b]);
    return (uint64_t)(rank == 0 ? NBUF : NBUF - 2) * sizeof(MemHandle);
}

/* ------------------------------------------------------------ one way over the trace */

enum { LEAKY, FIXED, UNCHANGED, INPLACE, NWAYS };
static const char *const kWayName[NWAYS] = {"leaky", "fixed", "unchanged", "inplace"};

struct Opts {
    long steps = 40;
    uint64_t base = 3584;
    bool scan = true, check = false;
    unsigned ways = (1u << NWAYS) - 1; /* which ways run (--ways) */
    FILE *json = nullptr;
};

/* a pattern in every own token buffer, read back by every peer through its view */
static uint64_t data_check(CUdeviceptr token, const std::vector<CUdeviceptr> &views, size_t at, uint64_t stamp)
{
    uint64_t v = ((uint64_t)rank << 48) ^ stamp, bad = 0;
    CHECK_CU(cuMemcpyHtoD(token + at, &v, 8));
    CHECK_CU(cuCtxSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        uint64_t got = 0;
        CHECK_CU(cuMemcpyDtoH(&got, views[(size_t)q] + at, 8));
        bad += got != (((uint64_t)q << 48) ^ stamp);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return bad;
}

/* every rank lets the simulated driver close the memory nothing holds any more (its ledger does), then waits
 * for the others: what the machine scan sees after it is what some process keeps alive */
static void settle_barrier()
{
    (void)t_ledger();
    MPI_Barrier(MPI_COMM_WORLD);
}

struct WaySummary {
    std::vector<double> held_gpu; /* per step: bytes per GPU */
    long regrows = 0;
    uint64_t bad = 0;
    double end_gpu = 0; /* after the last release */
    double model_us_sum = 0;
};

static WaySummary run_way(int way, const Opts &o)
{
    WaySummary sum;
    Raw raw{};
    Fab fab{};
    raw.fixed = way == FIXED;
    if (way == LEAKY || way == FIXED) {
        CUdevice dev;
        CHECK_CU(cuDeviceGet(&dev, 0));
        memset(&raw.prop, 0, sizeof raw.prop);
        raw.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        raw.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        raw.prop.location.id = dev;
        raw.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
        memset(&raw.acc, 0, sizeof raw.acc);
        raw.acc.location = raw.prop.location;
        raw.acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    } else {
        fab.a = new ExtendedMemoryAllocator(0);
        fab.inplace = way == INPLACE;
        CHECK(fab.a->handle_type() == FABPOOL_HANDLE_FABRIC);
    }
    settle_barrier();
    const double held0 = rank == 0 && o.scan ? (double)fabsim_machine_held_bytes(0) : 0;
    MPI_Barrier(MPI_COMM_WORLD); /* (no rank allocates while rank 0 scans) */
    uint64_t seed = 0x5eed0f72ull, high = 0;
    size_t sz[NBUF], old[NBUF] = {};
    for (long step = 0; step < o.steps; step++) {
        uint64_t t = trace_tokens(&seed, step, o.steps, o.base);
        Rec rec{};
        Calls c0 = calls_now();
        bool regrow = t > high;
        if (regrow) {
            high = t;
            set_sizes(high, sz);
            if (way == LEAKY || way == FIXED) {
                raw_release_buffer(raw);
                rec.sent = raw_allocate_buffer(raw, sz);
            } else if (way == UNCHANGED || !fab.own[C_TOKEN]) {
                fab_release_buffer(fab);
                rec.sent = fab_allocate_buffer(fab, sz);
            } else {
                rec.sent = fab_grow_in_place(fab, sz);
            }
            Calls c1 = calls_now();
            for (int i = 0; i < kRackCalls; i++)
                rec.calls[i] = c1.n[i] - c0.n[i];
            int own[NBUF], views[NBUF];
            for (int b = 0; b < NBUF; b++) {
                own[b] = owned(b);
                views[b] = 0;
                for (int q = 0; q < nranks; q++)
                    views[b] += opens(b, q);
            }
            /* fabpool's unchanged way reuses the buffers and views it kept at the release (fabpool_buffer_reuse,
             * fabpool_view_release): like in place it creates, maps and exports only the growth (the calls
             * counted above say so) */
            rack_bytes((way == INPLACE || way == UNCHANGED) && old[C_TOKEN], old, sz, NBUF, own, views, rec.bytes);
            rec.model_us = rack_model_us(rec.calls, rec.bytes);
            memcpy(old, sz, sizeof sz);
            if (o.check) {
                std::vector<CUdeviceptr> peer((size_t)nranks);
                CUdeviceptr token = way <= FIXED ? raw.own[C_TOKEN] : (CUdeviceptr)(uintptr_t)fab.own[C_TOKEN];
                for (int q = 0; q < nranks; q++)
                    peer[(size_t)q] = way <= FIXED ? raw.view[C_TOKEN][q]
                                                   : (CUdeviceptr)(uintptr_t)fab.view[C_TOKEN][q];
                rec.bad = data_check(token, peer, sz[C_TOKEN] - 8, (uint64_t)step);
            }
        }
        rec.ledger = (int64_t)t_ledger().bytes_held;
        MPI_Barrier(MPI_COMM_WORLD); /* (the ledger lets the sim close what nothing holds any more) */
        std::vector<Rec> all(rank == 0 ? (size_t)nranks : 1);
        MPI_Gather(&rec, (int)sizeof rec, MPI_BYTE, all.data(), (int)sizeof rec, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double machine = o.scan ? (double)fabsim_machine_held_bytes(0) - held0 : 0;
            double live = 0; /* the live set, every buffer rounded up to 2 MiB, over the ranks */
            for (int b = 0; b < NBUF; b++)
                live += (double)round2m(sz[b]) * (b == C_DONE || b == D_DONE ? 1 : nranks);
            sum.held_gpu.push_back(machine / nranks);
            uint64_t tc[kRackCalls] = {}, sent = 0, bad = 0;
            double model = 0, model_max = 0;
            for (const Rec &r : all) {
                for (int i = 0; i < kRackCalls; i++)
                    tc[i] += r.calls[i];
                sent += r.sent;
                bad += r.bad;
                model += r.model_us;
                model_max = r.model_us > model_max ? r.model_us : model_max;
            }
            sum.regrows += regrow;
            sum.bad += bad;
            sum.model_us_sum += model / nranks;
            if (o.json) {
                fprintf(o.json,
                        "{\"way\": \"%s\", \"ranks\": %d, \"step\": %ld, \"tokens\": %llu, \"high\": %llu, "
                        "\"regrow\": %d, \"held_per_gpu\": %.0f, \"live_per_gpu\": %.0f, \"rank0_ledger\": %lld",
                        kWayName[way], nranks, step, (unsigned long long)t, (unsigned long long)high, (int)regrow,
                        machine / nranks, live / nranks, (long long)all[0].ledger);
                for (int i = 0; i < kRackCalls; i++)
                    fprintf(o.json, ", \"%s_per_rank\": %.2f", kRackCallName[i], (double)tc[i] / nranks);
                fprintf(o.json,
                        ", \"sent_per_rank\": %.0f, \"gathered_per_rank\": %.0f, \"model_us_mean\": %.1f, "
                        "\"model_us_max\": %.1f, \"bad\": %llu}\n",
                        (double)sent / nranks, (double)sent, model / nranks, model_max, (unsigned long long)bad);
            }
        }
        MPI_Barrier(MPI_COMM_WORLD); /* (no rank regrows while rank 0 scans) */
    }
    if (way == LEAKY || way == FIXED) {
        raw_release_buffer(raw);
    } else {
        fab_release_buffer(fab);
        settle_barrier();
        delete fab.a;
    }
    settle_barrier();
    if (rank == 0 && o.scan)
        sum.end_gpu = ((double)fabsim_machine_held_bytes(0) - held0) / nranks;
    MPI_Barrier(MPI_COMM_WORLD);
    for (CUmemGenericAllocationHandle h : raw.leaked) /* (so that the next way starts from nothing) */
        CHECK_CU(cuMemRelease(h));
    settle_barrier();
    return sum;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    Opts o;
    const char *json = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--steps" && i + 1 < argc)
            o.steps = atol(argv[++i]);
        else if (a == "--base" && i + 1 < argc)
            o.base = (uint64_t)atoll(argv[++i]);
        else if (a == "--json" && i + 1 < argc)
            json = argv[++i];
        else if (a == "--help") {
            if (!rank)
                printf("usage: hybridep_rack [--steps S] [--base TOKENS] [--json FILE] [--check] [--no-scan] "
                       "[--ways leaky,fixed,unchanged,inplace]\n"
                       "The seed's run over this MPI world's ranks on the simulated driver, the ways asked for\n"
                       "(docs/performance.md, \"The seed's run at rack scale\"):\n"
                       "  --steps S      steps of the trace (default 40)\n"
                       "  --base TOKENS  the tokens per rank the trace starts from\n"
                       "  --json FILE    every rank's figures, per step, into FILE\n"
                       "  --check        exit 1 unless the leak shows, the other ways hold the live set and\n"
                       "                 give everything back, and in place costs less than release + allocate\n"
                       "  --no-scan      leave out the machine's memory scan (faster; no per-GPU memory)\n"
                       "  --ways LIST    some of leaky, fixed, unchanged, inplace (default all)\n"
                       "Exit status: 0; 1 if a check failed; 2 for a wrong command line.\n");
            MPI_Finalize();
            return 0;
        }
        else if (a == "--check")
            o.check = true;
        else if (a == "--no-scan")
            o.scan = false;
        else if (a == "--ways" && i + 1 < argc) {
            o.ways = 0;
            std::string list = std::string(",") + argv[i + 1] + ",";
            for (int w = 0; w < NWAYS; w++)
                if (list.find(std::string(",") + kWayName[w] + ",") != std::string::npos)
                    o.ways |= 1u << w;
            i++;
        }
        else {
            if (!rank)
                fprintf(stderr, "usage: hybridep_rack [--steps S] [--base TOKENS] [--json FILE] [--check] "
                                "[--no-scan] [--ways leaky,fixed,unchanged,inplace]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nranks > 128) {
        if (!rank)
            fprintf(stderr, "hybridep_rack: at most 128 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int sim = t_driver_init();
    if (!sim) {
        if (!rank)
            fprintf(stderr, "hybridep_rack: needs the simulated driver (fabric handles on one machine)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0 && json)
        o.json = fopen(json, "w");
    WaySummary s[NWAYS];
    try {
        for (int w = 0; w < NWAYS; w++)
            if (o.ways >> w & 1)
                s[w] = run_way(w, o);
    } catch (const Error &e) {
        t_failures++;
        fprintf(stderr, "rank %d: %s (%s)\n", rank, e.what(), fabpool_status_name(e.status()));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (o.json)
        fclose(o.json);
    if (rank == 0) {
        printf("hybridep_rack: %d ranks, %ld steps, %ld regrows (hidden %llu, %llu experts per rank, fabric "
               "handles on the simulated driver)\n",
               nranks, o.steps, s[0].regrows, (unsigned long long)kHidden, (unsigned long long)kExperts);
        for (int w = 0; w < NWAYS; w++)
            if (o.ways >> w & 1)
                printf("  %-9s device memory per GPU: first %.2f GiB, last %.2f GiB, after the release %.2f GiB; "
                   "modelled time per regrow %.0f us (mean); %llu bad reads\n",
                   kWayName[w], s[w].held_gpu.front() / (1 << 30), s[w].held_gpu.back() / (1 << 30),
                   s[w].end_gpu / (1 << 30), s[w].model_us_sum / (double)s[w].regrows,
                   (unsigned long long)s[w].bad);
    }
    if (o.check && rank == 0 && o.scan && o.ways == (1u << NWAYS) - 1) {
        CHECK(s[0].regrows >= 3);
        /* upstream as it is: every regrow adds a whole set, and nothing comes back at the release */
        double prev = 0;
        for (long i = 0; i < o.steps; i++) {
            CHECK(s[LEAKY].held_gpu[(size_t)i] >= prev);
            prev = s[LEAKY].held_gpu[(size_t)i];
        }
        CHECK(s[LEAKY].held_gpu.back() > 2 * s[LEAKY].held_gpu.front());
        CHECK(s[LEAKY].end_gpu >= s[LEAKY].held_gpu.back() * 0.99);
        /* the other three: the live set, and nothing at the end */
        for (int w = FIXED; w < NWAYS; w++) {
            CHECK(s[w].held_gpu.back() <= s[FIXED].held_gpu.back() * 1.01 + 4.0 * G);
            CHECK(s[w].held_gpu.back() < s[LEAKY].held_gpu.back() / 2);
            CHECK(s[w].end_gpu == 0);
        }
        /* in place no dearer than release + allocate, which with the kept buffers and views makes the same driver
         * calls (what DeepEP's release_buffer and allocate_buffer do besides, its own cudaMalloc'ed buffers,
         * the model does not price) */
        CHECK(s[INPLACE].model_us_sum <= s[UNCHANGED].model_us_sum);
        for (int w = 0; w < NWAYS; w++)
            CHECK(s[w].bad == 0);
    }
    fabsim_ledger l = t_ledger();
    CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    int fails = t_failures, total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!rank)
        printf("hybridep_rack: %d failed checks over all ranks\n", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
