/* test_hybridep_private: the cudaMalloc and cudaFree that DeepEP's hybrid-ep
 * code writes after the drop-in (its NVLCoordinator's flags and
 * preprocessing scratch, CustomAllgather's flags and table of pointers),
 * served by the drop-in's pool of private blocks.  Compiled as DeepEP's
 * sources are: cuda_runtime_api.h first, then the adapter, then plain
 * cudaMalloc / cudaFree calls.  Checks, on the simulated or the real driver:
 * a regrow's free-all + allocate-all makes no driver call but the
 * synchronization cudaFree promises; the blocks are 256-byte aligned, apart
 * and keep their data; cudaFree waits for pending work; a block the pool did
 * not give goes back to the driver; FABPOOL_HYBRIDEP_PRIVATE=0 uses the
 * driver; a refused map answers cudaErrorMemoryAllocation and holds nothing;
 * the memory goes back when the last allocator and the last block are gone;
 * threads at once; a block the pool cannot place comes from the driver. */
#include <cuda_runtime_api.h>

#undef _GNU_SOURCE
#include "../../tests/testutil.h"

#include "fabpool_hybridep.hpp"

#include <atomic>
#include <thread>
#include <vector>

using fabpool_hybridep::ExtendedMemoryAllocator;
using fabpool_hybridep::detail::PrivateBlocks;

/* HybridEP's private blocks on one node of 8 ranks with 32 experts a rank
 * (preprocessing scratch of 16-byte states for 32 blocks, then 4- and 8-byte
 * flags, and the all-gather's table of 8 pointers), as allocate_buffers and
 * CustomAllgather::allocate_buffers cudaMalloc them. */
static const std::size_t kSizes[] = {32 * 8 * 16, 32 * 32 * 16, 8, 4, 4, 8, 4, 4, 8, 8, 8 * sizeof(void *)};
static const int kBlocks = (int)(sizeof kSizes / sizeof kSizes[0]);

static std::uint64_t calls(const t_sim_hooks &h, const char *entry) { return h.calls ? h.calls(entry) : 0; }

/* driver calls that allocate, map or free memory */
static std::uint64_t memory_calls(const t_sim_hooks &h)
{
    return calls(h, "cuMemCreate") + calls(h, "cuMemMap") + calls(h, "cuMemUnmap") + calls(h, "cuMemRelease") +
           calls(h, "cuMemAlloc") + calls(h, "cuMemFree");
}

static void alloc_all(void **p, std::uint64_t tag)
{
    for (int i = 0; i < kBlocks; i++) {
        p[i] = nullptr;
        CHECK(cudaMalloc(&p[i], kSizes[i]) == cudaSuccess);
        CHECK(p[i] != nullptr && (std::uintptr_t)p[i] % 256 == 0);
        if (p[i] && kSizes[i] >= 16)
            t_put_tag(p[i], kSizes[i], tag + i);
    }
}

static void check_and_free_all(void **p, std::uint64_t tag)
{
    for (int i = 0; i < kBlocks; i++) {
        for (int j = 0; j < i; j++) /* apart: no two overlap */
            CHECK((char *)p[j] + kSizes[j] <= (char *)p[i] || (char *)p[i] + kSizes[i] <= (char *)p[j]);
        if (p[i] && kSizes[i] >= 16)
            CHECK(t_tag_ok(p[i], kSizes[i], tag + i));
    }
    for (int i = 0; i < kBlocks; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
}

int main()
{
    int sim = t_driver_init();
    t_sim_hooks h = t_sim_hooks_get();
    PrivateBlocks &pb = PrivateBlocks::get();
    std::int64_t held0 = t_held();
    void *p[kBlocks];

    {
        ExtendedMemoryAllocator a;
        /* the first allocation makes the pool; then 20 regrows in DeepEP's order */
        alloc_all(p, 100);
        CHECK(pb.pool(0) != nullptr && pb.live(0) == (std::size_t)kBlocks);
        CHECK(t_ledger().legacy_allocs == 0);
        std::uint64_t mem0 = memory_calls(h), sync0 = calls(h, "cuCtxSynchronize");
        std::uint64_t served0 = pb.pool_allocs();
        for (int r = 0; r < 20; r++) {
            check_and_free_all(p, 100 + 100 * (std::uint64_t)r);
            alloc_all(p, 200 + 100 * (std::uint64_t)r);
        }
        CHECK(pb.pool_allocs() - served0 == 20u * kBlocks);
        if (sim) {
            CHECK(memory_calls(h) == mem0); /* a regrow's blocks: no driver call */
            CHECK(calls(h, "cuCtxSynchronize") - sync0 >= 20u * kBlocks); /* cudaFree's synchronization */
        }
        check_and_free_all(p, 200 + 100 * 19);
        CHECK(pb.live(0) == 0 && pb.pool(0) != nullptr); /* kept while an allocator lives */

        /* cudaFree waits for pending work, as the runtime's does */
        if (sim && h.hold) {
            void *q = nullptr;
            CHECK(cudaMalloc(&q, 64) == cudaSuccess);
            CHECK(h.hold(nullptr) == 0);
            CHECK(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
            CHECK(cudaFree(q) == cudaSuccess);
            CHECK(cuStreamQuery(nullptr) == CUDA_SUCCESS);
        }

        /* cudaMalloc(0) and cudaFree(NULL): success, nothing */
        void *z = &z;
        CHECK(cudaMalloc(&z, 0) == cudaSuccess && z == nullptr);
        CHECK(cudaFree(nullptr) == cudaSuccess);

        /* a block of the driver's (cuMemAlloc before the drop-in) goes back to the driver */
        CUdeviceptr d = 0;
        CHECK_CU(cuMemAlloc(&d, 4096));
        std::uint64_t legacy = t_ledger().legacy_allocs;
        CHECK(cudaFree((void *)(std::uintptr_t)d) == cudaSuccess);
        if (sim)
            CHECK(t_ledger().legacy_allocs == legacy - 1);

        /* FABPOOL_HYBRIDEP_PRIVATE=0: the driver's cudaMalloc and cudaFree */
        setenv("FABPOOL_HYBRIDEP_PRIVATE", "0", 1);
        std::uint64_t served = pb.pool_allocs();
        void *q = nullptr;
        CHECK(cudaMalloc(&q, 1000) == cudaSuccess && q != nullptr);
        CHECK(pb.pool_allocs() == served);
        if (sim)
            CHECK(t_ledger().legacy_allocs == 1);
        t_put_tag(q, 1000, 7);
        CHECK(t_tag_ok(q, 1000, 7));
        CHECK(cudaFree(q) == cudaSuccess);
        if (sim)
            CHECK(t_ledger().legacy_allocs == 0);
        unsetenv("FABPOOL_HYBRIDEP_PRIVATE");

        /* a map the driver refuses: cudaErrorMemoryAllocation, NULL, nothing more held */
        if (sim && h.fault_set) {
            std::int64_t before = t_held();
            void *big = &big;
            CHECK(h.fault_set("cuMemCreate", 0, 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
            CHECK(cudaMalloc(&big, std::size_t(64) << 20) == cudaErrorMemoryAllocation);
            h.fault_clear();
            CHECK(big == nullptr);
            CHECK(t_held() <= before); /* nothing more; the out-of-memory retry may give back what caches kept */
            CHECK(pb.live(0) == 0);
        }

        /* threads at once (HybridEP's are one; the calls are thread-safe anyway) */
        /* (CHECK counts in plain globals: the threads count their own failures) */
        std::atomic<int> bad{0};
        std::vector<std::thread> th;
        for (int t = 0; t < 4; t++)
            th.emplace_back([t, &bad] {
                for (int r = 0; r < 50; r++) {
                    void *b[4];
                    for (int i = 0; i < 4; i++) {
                        std::uint64_t v = ((std::uint64_t)t << 32) | (std::uint64_t)(r * 4 + i), got = 0;
                        if (cudaMalloc(&b[i], 256 * (std::size_t)(t + i + 1)) != cudaSuccess ||
                            cuMemcpyHtoD((CUdeviceptr)(std::uintptr_t)b[i], &v, sizeof v) != CUDA_SUCCESS ||
                            cuMemcpyDtoH(&got, (CUdeviceptr)(std::uintptr_t)b[i], sizeof got) != CUDA_SUCCESS ||
                            got != v)
                            bad++;
                    }
                    for (int i = 0; i < 4; i++)
                        if (cudaFree(b[i]) != cudaSuccess)
                            bad++;
                }
            });
        for (auto &x : th)
            x.join();
        CHECK(bad.load() == 0);
        CHECK(pb.live(0) == 0);

        /* blocks still live when the allocator goes */
        alloc_all(p, 5000);
    }
    CHECK(pb.pool(0) != nullptr && pb.live(0) == (std::size_t)kBlocks);
    for (int i = 0; i < kBlocks - 1; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(pb.pool(0) != nullptr); /* one block left */
    CHECK(cudaFree(p[kBlocks - 1]) == cudaSuccess);
    CHECK(pb.pool(0) == nullptr); /* the last block and the last allocator gone: the pool and its memory */
    CHECK(t_near(t_held(), held0));
    if (sim)
        CHECK(t_ledger().bytes_held == 0 && t_ledger().reservations == 0);

    /* two allocators (two HybridEP buffers): the pool stays until both are gone */
    {
        ExtendedMemoryAllocator a1;
        {
            ExtendedMemoryAllocator a2;
            void *b = nullptr;
            CHECK(cudaMalloc(&b, 4096) == cudaSuccess && cudaFree(b) == cudaSuccess);
            CHECK(pb.pool(0) != nullptr);
        }
        CHECK(pb.pool(0) != nullptr && pb.live(0) == 0);
    }
    CHECK(pb.pool(0) == nullptr);

    /* no allocator: each block's pool goes with it */
    void *q = nullptr;
    CHECK(cudaMalloc(&q, 512) == cudaSuccess);
    CHECK(pb.pool(0) != nullptr);
    CHECK(cudaFree(q) == cudaSuccess);
    CHECK(pb.pool(0) == nullptr);
    if (sim)
        CHECK(t_ledger().bytes_held == 0);

    /* a block the pool cannot place (FABPOOL_HYBRIDEP_PRIVATE_CONF: 2 MiB of address space) comes from the driver */
    setenv("FABPOOL_HYBRIDEP_PRIVATE_CONF", "reserve:2MiB", 1);
    void *small = nullptr, *large = nullptr;
    std::uint64_t served = pb.pool_allocs();
    CHECK(cudaMalloc(&small, 512) == cudaSuccess && pb.pool_allocs() == served + 1);
    CHECK(cudaMalloc(&large, std::size_t(8) << 20) == cudaSuccess && large != nullptr);
    CHECK(pb.pool_allocs() == served + 1);
    if (sim)
        CHECK(t_ledger().legacy_allocs == 1);
    t_put_tag(large, std::size_t(8) << 20, 11);
    CHECK(t_tag_ok(large, std::size_t(8) << 20, 11));
    CHECK(cudaFree(large) == cudaSuccess && cudaFree(small) == cudaSuccess);
    unsetenv("FABPOOL_HYBRIDEP_PRIVATE_CONF");
    CHECK(pb.pool(0) == nullptr);
    if (sim)
        CHECK(t_ledger().legacy_allocs == 0 && t_ledger().bytes_held == 0);

    /* the time spent, for benchmarks */
    PrivateBlocks::Times tm = pb.times();
    CHECK(tm.ns_alloc > 0 && tm.ns_free >= tm.ns_sync && tm.ns_sync > 0);
    return t_done("test_hybridep_private");
}
