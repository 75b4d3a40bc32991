/* test_hybridep_mpi: HybridEP's buffer sizing replayed across the ranks of an
 * MPI job (one NVLink domain of 4 ranks: hidden 7168, bf16 tokens, 8 experts
 * per rank, one node; hybridep_sizes.h has the formulas), twice over the same
 * seeded token trace that rises and falls:
 *
 *  1. through the adapter (fabpool_hybridep.hpp): allocate once with a window
 *     for the largest token count, get_handle, MPI_Allgather of the handle
 *     bytes (+ the fds over the socket helper for POSIX fd), open_handle;
 *     then every step resizes in place, all-gathers only deltas, applies them
 *     with update_handle, writes a pattern into its buffers and checks every
 *     peer's pattern through its views.
 *  2. through the seed's leaky pattern (DeepEP issue #799), with raw driver
 *     calls: cuMemCreate, export after cuMemRetainAllocationHandle, import,
 *     none of them released, and the whole buffer set freed and allocated
 *     again at every new token high (update_buffer's release_buffer +
 *     allocate_buffer).
 *
 * It asserts the difference on the driver's ledger: the adapter's bytes held
 * stay within a bound of the live set and are 0 at the end; the leaky
 * pattern's climb at every reallocation and stay held after its free (until
 * the test releases the references it leaked).
 *
 *   mpirun -np 4 test_hybridep_mpi [steps]  (FABSIM_FABRIC=1 FABPOOL_CONF=handle_type:fabric for fabric) */
#define HYBRIDEP_TEST
#include "hybridep_sizes.h"

#include <mpi.h>
#include <unistd.h>

#include "../../tests/mpi_mesh.h"

#include <string>
#include <vector>
static const int MAXR = 8;
static const uint64_t kMinTokens = 64, kMaxTokens = 4096;
static const size_t MiB = 1u << 20;

static int rank, nranks;
static int sock[MAXR];

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
/* the token count of every rank this step (the max over the group, as HybridEP's config holds it) */
static uint64_t next_tokens(uint64_t *seed, uint64_t cur)
{
    if (rng_next(seed) % 20 == 0)
        return kMinTokens + rng_next(seed) % (kMaxTokens - kMinTokens);
    long t = (long)cur + (long)(rng_next(seed) % 301) - 150;
    return (uint64_t)(t < (long)kMinTokens ? (long)kMinTokens : t > (long)kMaxTokens ? (long)kMaxTokens : t);
}
static uint64_t pat(int r, long step, int b, int k)
{
    return ((uint64_t)r << 56) ^ ((uint64_t)step << 12) ^ ((uint64_t)b << 4) ^ (uint64_t)k;
}
static uint64_t at_k(uint64_t size, int k) { return (size / 4 * (uint64_t)k) & ~(uint64_t)7; }

static int64_t held() { return t_ledger_p ? (int64_t)t_ledger().bytes_held : t_held(); }

/* fds to every peer: mine[0..n) to each, theirs[q] from q */
static void swap_fds(const int *mine, size_t n, std::vector<int> theirs[MAXR])
{
    for (int q = 0; q < nranks; q++)
        if (q != rank)
            CHECK_OK(fabpool_fd_send(sock[q], mine, n, &n, sizeof n));
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        int f[256];
        size_t got = 0, len = 0, their_n = 0;
        CHECK_OK(fabpool_fd_recv(sock[q], f, 256, &got, &their_n, sizeof their_n, &len));
        CHECK(got == their_n);
        theirs[q].assign(f, f + got);
    }
}

/* ------------------------------------------------------------ 1. the adapter */

struct Result {
    int64_t peak = 0, end = 0, bound = 0;
    long deltas = 0, exchanges = 0, compactions = 0;
    long bad = 0;
};

static Result replay_adapter(long steps, bool posix)
{
    Result res;
    const HybridEpShape sh;
    size_t maxs[NB];
    hybridep_sizes(sh, hybridep_tokens(kMaxTokens), maxs);
    MPI_Barrier(MPI_COMM_WORLD); /* (real driver: every rank's context exists before the baseline) */
    int64_t held0 = held();
    try {
        ExtendedMemoryAllocator a(0);
        void *buf[NB] = {}, *view[MAXR][NB] = {};
        static MemHandle mine[NB], all[MAXR][NB];
        uint64_t seed = 0x5eed, tokens = 1024;
        for (long step = 0; step < steps; step++) {
            tokens = next_tokens(&seed, tokens);
            size_t sz[NB];
            hybridep_sizes(sh, hybridep_tokens(tokens), sz);
            int fds[2 * fabpool_hybridep::kMaxHandleFds];
            size_t nf = 0;
            for (int b = 0; b < NB; b++) {
                memset(mine[b].bytes, 0, 16); /* no magic: nothing changed */
                if (!buf[b]) {
                    a.allocate(&buf[b], sz[b], maxs[b]);
                    a.get_handle(&mine[b], buf[b]);
                } else if (a.resize(buf[b], sz[b])) {
                    a.get_delta(&mine[b], buf[b]);
                    res.deltas++;
                } else
                    continue;
                nf += ExtendedMemoryAllocator::fds_of(mine[b], fds + nf, 2);
            }
            MPI_Allgather(mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
            std::vector<int> theirs[MAXR];
            if (posix)
                swap_fds(fds, nf, theirs);
            for (int q = 0; q < nranks; q++) {
                if (q == rank)
                    continue;
                size_t fi = 0;
                for (int b = 0; b < NB; b++) {
                    HandleInfo in = {};
                    if (!ExtendedMemoryAllocator::read_header(all[q][b], &in))
                        continue;
                    CHECK(in.kind != fabpool_hybridep::HandleKind::full || a.is_accessible(&all[q][b]));
                    const int *f = posix ? theirs[q].data() + fi : nullptr;
                    if (!view[q][b])
                        a.open_handle(&view[q][b], &all[q][b], f, posix ? in.nfds : 0);
                    else
                        a.update_handle(view[q][b], &all[q][b], f, posix ? in.nfds : 0);
                    fi += in.nfds;
                    res.exchanges++;
                }
                CHECK(!posix || fi == theirs[q].size());
            }
            MPI_Barrier(MPI_COMM_WORLD); /* every peer has this step's handles */
            for (int b = 0; b < NB; b++) {
                HandleInfo in = {};
                if (ExtendedMemoryAllocator::read_header(mine[b], &in))
                    a.peers_done(buf[b]);
                for (int k = 0; k < 4; k++) {
                    uint64_t v = pat(rank, step, b, k);
                    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)buf[b] + at_k(sz[b], k), &v, 8));
                }
            }
            /* a copy from pageable memory returns before its DMA lands (seen on the
             * H200): other ranks see the data only after a synchronize */
            CHECK_CU(cuCtxSynchronize());
            MPI_Barrier(MPI_COMM_WORLD);
            for (int q = 0; q < nranks; q++)
                for (int b = 0; b < NB && q != rank; b++)
                    for (int k = 0; k < 4; k++) {
                        uint64_t v = 0;
                        cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)view[q][b] + at_k(sz[b], k), 8);
                        if (v != pat(q, step, b, k) && res.bad++ < 5)
                            fprintf(stderr, "rank %d step %ld: rank %d's %s[%d] reads %llx\n", rank, step, q,
                                    kHybridEpBufferNames[b], k, (unsigned long long)v);
                    }
            int64_t h = held() - held0;
            if (h > res.peak)
                res.peak = h;
            MPI_Barrier(MPI_COMM_WORLD); /* nobody resizes while a peer still reads */
        }
        /* Growths of expert_input_token without an exchange until the delta names more chunks than
         * one handle holds (kMaxHandleChunks), and so does the whole buffer: get_delta compacts it
         * (every peer has applied its last handle: peers_done above) and sends a full handle,
         * which the peers apply to their views at the same addresses. */
        {
            size_t s0 = 1, s3 = 0; /* shrunk to its first chunk, then grown */
            a.resize(buf[0], s0);
            a.get_delta(&mine[0], buf[0]);
            static MemHandle one[MAXR];
            MPI_Allgather(&mine[0], (int)sizeof(MemHandle), MPI_BYTE, one, (int)sizeof(MemHandle), MPI_BYTE,
                          MPI_COMM_WORLD);
            for (int pass = 0; pass < 2; pass++) {
                for (int q = 0; q < nranks; q++) {
                    if (q == rank)
                        continue;
                    /* POSIX fd: this time the bytes-only path (the fds by pidfd_getfd) */
                    a.update_handle(view[q][0], &one[q]);
                }
                MPI_Barrier(MPI_COMM_WORLD);
                a.peers_done(buf[0]);
                if (pass == 1)
                    break;
                fabpool_hybridep::Stats st0 = a.stats();
                CHECK_OK(fabpool_collect(a.pool(), 1)); /* the chunks the shrink dropped go now */
                /* each growth maps one chunk: one more than a handle names */
                for (std::size_t g = 0; g <= fabpool_hybridep::kMaxHandleChunks; g++)
                    CHECK(a.resize(buf[0], (s3 = a.info(buf[0]).mapped + (2u << 20))));
                CHECK(a.info(buf[0]).n_chunks > fabpool_hybridep::kMaxHandleChunks && s3 <= maxs[0]);
                a.get_delta(&mine[0], buf[0]);
                HandleInfo me = {};
                CHECK(ExtendedMemoryAllocator::read_header(mine[0], &me) &&
                      me.kind == fabpool_hybridep::HandleKind::full && me.nfds <= 2);
                fabpool_hybridep::Stats st1 = a.stats();
                CHECK(st1.compactions == st0.compactions + 1);
                res.compactions += st1.compactions - st0.compactions;
                MPI_Allgather(&mine[0], (int)sizeof(MemHandle), MPI_BYTE, one, (int)sizeof(MemHandle), MPI_BYTE,
                              MPI_COMM_WORLD);
            }
            for (int k = 0; k < 4; k++) {
                uint64_t v = pat(rank, 9999, 0, k);
                CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)buf[0] + at_k(s3, k), &v, 8));
            }
            CHECK_CU(cuCtxSynchronize());
            MPI_Barrier(MPI_COMM_WORLD);
            for (int q = 0; q < nranks; q++)
                for (int k = 0; k < 4 && q != rank; k++) {
                    uint64_t v = 0;
                    cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)view[q][0] + at_k(s3, k), 8);
                    if (v != pat(q, 9999, 0, k) && res.bad++ < 5)
                        fprintf(stderr, "rank %d: after the compaction rank %d's token buffer[%d] reads %llx\n",
                                rank, q, k, (unsigned long long)v);
                }
            MPI_Barrier(MPI_COMM_WORLD);
        }
        /* HybridEP's release_buffer: close the peers' views, free the own buffers */
        for (int q = 0; q < nranks; q++)
            for (int b = 0; b < NB; b++)
                if (view[q][b])
                    a.close_handle(view[q][b]);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int b = 0; b < NB; b++)
            a.free(buf[b]);
    } catch (const Error &e) {
        t_failures++;
        fprintf(stderr, "rank %d: adapter: %s (%s)\n", rank, e.what(), fabpool_status_name(e.status()));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    res.end = held() - held0;
    /* what may be held: the own set and a view of every peer's, at the largest size, with
     * a chunk's rounding (max_waste 25 %) and the shrink hysteresis (25 %) over it */
    size_t top = maxs[0] + maxs[1];
    res.bound = (int64_t)(nranks * top * 3 / 2 + (size_t)nranks * NB * 2 * MiB) + t_slack();
    return res;
}

/* --------------------------------------------------------- 2. the leaky pattern */

struct Leaky {
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    size_t gran;
    CUmemAllocationHandleType ht;
    CUdeviceptr own[NB] = {};
    size_t own_size[NB] = {};
    CUdeviceptr peer[MAXR][NB] = {};
    size_t peer_size[MAXR][NB] = {};
    std::vector<CUmemGenericAllocationHandle> leaked; /* what the seed never released */
};

struct LeakHandle {
    uint64_t size;
    CUmemFabricHandle fabric;
};

static void leaky_release_buffer(Leaky &L)
{
    for (int b = 0; b < NB; b++) {
        if (!L.own[b])
            continue;
        /* free(): retain + unmap + address free + release: net zero, the create handle stays */
        CUmemGenericAllocationHandle h;
        size_t size = 0;
        CHECK_CU(cuMemRetainAllocationHandle(&h, (void *)L.own[b]));
        CHECK_CU(cuMemGetAddressRange(NULL, &size, L.own[b]));
        CHECK(size == L.own_size[b]);
        CHECK_CU(cuMemUnmap(L.own[b], size));
        CHECK_CU(cuMemAddressFree(L.own[b], size));
        CHECK_CU(cuMemRelease(h));
        L.own[b] = 0;
    }
    for (int q = 0; q < nranks; q++)
        for (int b = 0; b < NB; b++)
            if (L.peer[q][b]) { /* close_handle(): unmap only */
                size_t size = 0;
                CHECK_CU(cuMemGetAddressRange(NULL, &size, L.peer[q][b]));
                CHECK(size == L.peer_size[q][b]);
                CHECK_CU(cuMemUnmap(L.peer[q][b], size));
                CHECK_CU(cuMemAddressFree(L.peer[q][b], size));
                L.peer[q][b] = 0;
            }
}

static void leaky_allocate_buffer(Leaky &L, const size_t sz[NB], bool posix)
{
    LeakHandle mine[NB], all[MAXR][NB];
    int fds[NB];
    memset(mine, 0, sizeof mine);
    for (int b = 0; b < NB; b++) {
        size_t s = (sz[b] + L.gran - 1) / L.gran * L.gran;
        CUmemGenericAllocationHandle h, r;
        CHECK_CU(cuMemCreate(&h, s, &L.prop, 0)); /* never released */
        L.leaked.push_back(h);
        CHECK_CU(cuMemAddressReserve(&L.own[b], s, L.gran, 0, 0));
        CHECK_CU(cuMemMap(L.own[b], s, 0, h, 0));
        CHECK_CU(cuMemSetAccess(L.own[b], s, &L.acc, 1));
        L.own_size[b] = s;
        size_t range = 0; /* get_handle: the size from the address range, then retain (never released) + export */
        CHECK_CU(cuMemGetAddressRange(NULL, &range, L.own[b]));
        CHECK(range == s);
        CHECK_CU(cuMemRetainAllocationHandle(&r, (void *)L.own[b]));
        L.leaked.push_back(r);
        mine[b].size = s;
        if (posix)
            CHECK_CU(cuMemExportToShareableHandle(&fds[b], r, L.ht, 0));
        else
            CHECK_CU(cuMemExportToShareableHandle(&mine[b].fabric, r, L.ht, 0));
    }
    MPI_Allgather(mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    std::vector<int> theirs[MAXR];
    if (posix)
        swap_fds(fds, NB, theirs);
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        for (int b = 0; b < NB; b++) {
            CUmemGenericAllocationHandle h;
            void *src = posix ? (void *)(uintptr_t)theirs[q][b] : (void *)&all[q][b].fabric;
            CHECK_CU(cuMemImportFromShareableHandle(&h, src, L.ht)); /* open_handle: never released */
            L.leaked.push_back(h);
            if (posix)
                close(theirs[q][b]);
            size_t s = all[q][b].size;
            CHECK_CU(cuMemAddressReserve(&L.peer[q][b], s, 0, 0, 0));
            CHECK_CU(cuMemMap(L.peer[q][b], s, 0, h, 0));
            CHECK_CU(cuMemSetAccess(L.peer[q][b], s, &L.acc, 1));
            L.peer_size[q][b] = s;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (posix)
        for (int b = 0; b < NB; b++)
            close(fds[b]); /* (the fds are not the seed's leak: close them once every peer has imported) */
}

struct LeakResult {
    std::vector<int64_t> at_realloc; /* bytes held after each reallocation */
    int64_t after_free = 0, after_fix = 0;
};

static LeakResult replay_leaky(long steps, bool posix)
{
    LeakResult res;
    Leaky L;
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    memset(&L.prop, 0, sizeof L.prop);
    L.ht = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_FABRIC;
    L.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    L.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    L.prop.location.id = dev;
    L.prop.requestedHandleTypes = L.ht;
    CHECK_CU(cuMemGetAllocationGranularity(&L.gran, &L.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    memset(&L.acc, 0, sizeof L.acc);
    L.acc.location = L.prop.location;
    L.acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MPI_Barrier(MPI_COMM_WORLD);
    int64_t held0 = held();
    const HybridEpShape sh;
    uint64_t seed = 0x5eed, tokens = 1024, config_max = 0;
    for (long step = 0; step < steps; step++) {
        tokens = next_tokens(&seed, tokens);
        uint64_t need = hybridep_tokens(tokens);
        if (need <= config_max)
            continue; /* the buffers fit: HybridEP keeps them */
        config_max = need;
        size_t sz[NB];
        hybridep_sizes(sh, config_max, sz);
        leaky_release_buffer(L);
        leaky_allocate_buffer(L, sz, posix);
        res.at_realloc.push_back(held() - held0);
    }
    leaky_release_buffer(L);
    MPI_Barrier(MPI_COMM_WORLD);
    res.after_free = held() - held0;
    /* the fix of the seed (PR #798): release what was leaked; then nothing is held */
    for (CUmemGenericAllocationHandle h : L.leaked)
        CHECK_CU(cuMemRelease(h));
    MPI_Barrier(MPI_COMM_WORLD);
    res.after_fix = held() - held0;
    return res;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    long steps = argc > 1 ? atol(argv[1]) : 300;
    if (nranks > MAXR || nranks < 2) {
        if (!rank)
            fprintf(stderr, "2 to %d ranks\n", MAXR);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int sim = t_driver_init();
    for (int i = 0; i < MAXR; i++)
        sock[i] = -1;
    bool posix;
    {
        fabpool_t *p = nullptr;
        CHECK_OK(fabpool_create(nullptr, &p));
        if (!p)
            MPI_Abort(MPI_COMM_WORLD, 1);
        posix = fabpool_handle_type_of(p) == FABPOOL_HANDLE_POSIX_FD;
        fabpool_destroy(p);
    }
    if (posix)
        t_mpi_mesh("fabpool-hybridep-mpi", rank, nranks, sock);

    Result ok = replay_adapter(steps, posix);
    CHECK(ok.bad == 0);
    CHECK(ok.peak > 0 && ok.peak <= ok.bound);
    CHECK(t_near(ok.end, 0));
    CHECK(ok.deltas > 10);
    CHECK(ok.compactions == 1);

    LeakResult lk = replay_leaky(steps, posix);
    bool climbs = lk.at_realloc.size() >= 3;
    for (size_t i = 1; i < lk.at_realloc.size(); i++)
        climbs = climbs && lk.at_realloc[i] > lk.at_realloc[i - 1];
    CHECK(climbs);                                   /* every new high adds a whole set */
    CHECK(lk.after_free > 0 && lk.after_free >= lk.at_realloc.back() - t_slack()); /* free returns nothing */
    CHECK(lk.at_realloc.back() > ok.peak);           /* and it ends above all the adapter ever held */
    CHECK(t_near(lk.after_fix, 0));

    for (int q = 0; q < nranks; q++)
        if (sock[q] >= 0)
            close(sock[q]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    int fails = t_failures, total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!rank) {
        printf("test_hybridep_mpi: %d ranks, %ld steps, %s handles (hidden 7168, bf16, 8 experts/rank, %d ranks/domain)\n",
               nranks, steps, posix ? "POSIX fd" : "fabric", (int)HybridEpShape().ranks_per_domain);
        printf("  adapter: %ld compaction(s) of a buffer whose delta did not fit, then its full handle applied\n",
               ok.compactions);
        printf("  adapter: %ld deltas, %ld handles applied, rank 0 held at most %lld MiB (bound %lld), %lld MiB at "
               "the end\n",
               ok.deltas, ok.exchanges, (long long)(ok.peak >> 20), (long long)(ok.bound >> 20),
               (long long)(ok.end >> 20));
        printf("  leaky:   %zu reallocations, rank 0 held", lk.at_realloc.size());
        for (int64_t h : lk.at_realloc)
            printf(" %lld", (long long)(h >> 20));
        printf(" MiB; after free %lld MiB; after releasing the leaked references %lld MiB\n",
               (long long)(lk.after_free >> 20), (long long)(lk.after_fix >> 20));
        printf("test_hybridep_mpi: %d failed checks over all ranks\n", total);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
