/* test_torch_core: PyTorch's allocator contract (torch_core.cpp) on the
 * simulated driver, without PyTorch.  The runtime the core asks (events,
 * capture status, the device's memory) is the driver API here; a stream is
 * "capturing" when the test says so, and fabsim_stream_hold keeps a stream's
 * work pending, so the test can tell whether a block used on a busy stream is
 * given out again too early.  What the driver holds is read from the sim's
 * ledger. */
#include <atomic>
#include <memory>
#include <cstdlib>
#include <mutex>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#undef _GNU_SOURCE /* testutil.h defines it; g++ predefines it */
#include "../../tests/testutil.h"
#include "../../tests/procfs.h"
#include "../../tests/other_user.h"
#include "../../tests/conn_flood.h"
#include "fabpool_torch.h"
#include "torch_core.hpp"
#include "torch_ipc.hpp"

using fabpool_torch::Core;
using fabpool_torch::DeviceStats;
using fabpool_torch::OutOfMemory;
using fabpool_torch::PoolId;
using fabpool_torch::Stream;

static const size_t MiB = size_t(1) << 20;

struct SimRuntime final : fabpool_torch::Runtime {
    std::mutex mu;
    std::set<Stream> captures;
    std::atomic<long> relaxes{0}, syncs{0}, events{0};

    void capture(Stream s, bool on)
    {
        std::lock_guard<std::mutex> lk(mu);
        if (on)
            captures.insert(s);
        else
            captures.erase(s);
    }
    bool capturing(Stream s) override
    {
        std::lock_guard<std::mutex> lk(mu);
        return captures.count(s) != 0;
    }
    void *event_record(int, Stream s) override
    {
        CUevent e = nullptr;
        if (cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            return nullptr;
        if (cuEventRecord(e, (CUstream)s) != CUDA_SUCCESS) {
            cuEventDestroy(e);
            return nullptr;
        }
        events++;
        return e;
    }
    bool event_done(void *ev) override { return cuEventQuery((CUevent)ev) == CUDA_SUCCESS; }
    void event_wait(void *ev) override { cuEventSynchronize((CUevent)ev); }
    void event_release(void *ev) override { cuEventDestroy((CUevent)ev); }
    void device_sync(int) override
    {
        syncs++;
        cuCtxSynchronize();
    }
    void mem_info(int, size_t *free_bytes, size_t *total) override { cuMemGetInfo(free_bytes, total); }
    int relax() override
    {
        relaxes++;
        return 0;
    }
    void unrelax(int) override {}
};

static SimRuntime rt;
static int (*S_hold)(void *);
static int (*S_release)(void *);

static uint64_t forbidden_calls()
{
    /* what a capture forbids: event work on streams, waits, unmaps */
    t_sim_hooks h = t_sim_hooks_get();
    uint64_t n = 0;
    for (const char *f : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize",
                          "cuStreamSynchronize", "cuMemUnmap"})
        n += h.calls ? h.calls(f) : 0;
    return n;
}

static CUstream new_stream()
{
    CUstream s = nullptr;
    CHECK_CU(cuStreamCreate(&s, 0));
    return s;
}

static uint64_t shim_frees()
{
    fabpool_torch_counters c{};
    c.struct_size = sizeof c;
    fabpool_torch_get_counters(0, &c);
    return c.frees;
}

/* The end of a section: everything cached back to the driver, which holds
 * what it held before, and the section's streams destroyed. */
static void all_back(Core &core, int64_t held0, std::initializer_list<CUstream> streams)
{
    core.empty_cache(PoolId{0, 0});
    CHECK(t_held() == held0);
    for (CUstream s : streams)
        cuStreamDestroy(s);
}

static void free_all(Core &core, const std::vector<void *> &live)
{
    for (void *p : live)
        core.free(p);
}

static bool pool_of(Core &core, void *ptr, PoolId id)
{
    for (auto &s : core.segments(PoolId{0, 0}))
        if (s.ptr == ptr)
            return s.pool == id;
    return false;
}

/* torch.cuda's statistics: live blocks, sizes asked and given, and what the
 * pools map against what the driver holds. */
static void check_stats(Core &core, int64_t held0)
{
    CUstream s = new_stream();
    const size_t sizes[] = {1000, 4096, MiB, 3 * MiB, 40 * MiB};
    void *p[5];
    int64_t req = 0, given = 0;
    for (int i = 0; i < 5; i++) {
        p[i] = core.malloc(0, sizes[i], s);
        size_t u = 0;
        CHECK(p[i] && core.usable_size(p[i], &u) && u >= sizes[i] && u <= sizes[i] + sizes[i] / 4 + 256);
        req += int64_t(sizes[i]);
        given += int64_t(u);
    }
    DeviceStats st = core.stats(0);
    CHECK(st.allocation[fabpool_torch::kAll].current == 5);
    CHECK(st.allocation[fabpool_torch::kSmallPool].current == 3 && st.allocation[fabpool_torch::kLargePool].current == 2);
    CHECK(st.requested_bytes[fabpool_torch::kAll].current == req);
    CHECK(st.allocated_bytes[fabpool_torch::kAll].current == given);
    CHECK(st.reserved_bytes.current == t_held() - held0);
    CHECK(st.reserved_bytes.peak >= st.reserved_bytes.current && st.segment.current > 0);
    CHECK(st.num_device_alloc == st.segment.current);
    for (void *q : p)
        core.free(q);
    st = core.stats(0);
    CHECK(st.allocation[fabpool_torch::kAll].current == 0 && st.allocated_bytes[fabpool_torch::kAll].peak == given);
    CHECK(st.allocation[fabpool_torch::kAll].allocated == 5 && st.allocation[fabpool_torch::kAll].freed == 5);
    core.reset_peak(0);
    CHECK(core.stats(0).allocated_bytes[fabpool_torch::kAll].peak == 0);
    core.reset_accumulated(0);
    st = core.stats(0);
    CHECK(st.allocation[fabpool_torch::kAll].allocated == 0 && st.num_device_alloc == 0 && st.num_ooms == 0);
    core.empty_cache(PoolId{0, 0});
    CHECK(t_held() == held0);
    st = core.stats(0);
    CHECK(st.reserved_bytes.current == 0 && st.segment.current == 0 && st.num_device_free > 0);
    CHECK(core.malloc(0, 0, s) == nullptr);
    bool refused = false;
    try {
        core.free(p[0]);
    } catch (const std::invalid_argument &e) {
        refused = strstr(e.what(), "not a live block") != nullptr;
    }
    CHECK(refused);
    cuStreamDestroy(s);
}

/* record_stream: a block used on a busy stream is not handed out again until
 * that stream's work queued at the free is done. */
static void check_record_stream(Core &core)
{
    CUstream a = new_stream(), m = new_stream();
    /* without record_stream the block comes back at once on its stream: the
     * hazard the call exists for */
    void *p = core.malloc(0, MiB, a);
    core.free(p);
    void *q = core.malloc(0, MiB, a);
    CHECK(q == p);
    core.free(q);

    p = core.malloc(0, MiB, a);
    t_put_tag(p, MiB, 0x5eed);
    CHECK(core.record_stream(p, m));
    CHECK(core.record_stream(p, a));  /* its own stream: nothing to do */
    S_hold(m);                        /* m's kernels that read p are still queued */
    core.free(p);
    q = core.malloc(0, MiB, a);
    CHECK(q != nullptr && q != p);
    void *q2 = core.malloc(0, MiB, a);
    CHECK(q2 != p);
    CHECK(t_tag_ok(p, MiB, 0x5eed)); /* nobody wrote it */
    S_release(m);
    core.free(q2);
    core.free(q);
    bool back = false;
    void *r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = core.malloc(0, MiB, a);
        back = back || r[i] == p;
    }
    CHECK(back);
    free_all(core, std::vector<void *>(r, r + 3));
    CHECK(!core.record_stream((char *)p + 256, m));
    /* a use fabpool cannot record (the per-thread default stream, a different stream in every thread): the free
     * waits for the device instead, as where no event can be made */
    p = core.malloc(0, MiB, a);
    CHECK(core.record_stream(p, (Stream)CU_STREAM_PER_THREAD));
    long syncs0 = rt.syncs;
    core.free(p);
    CHECK(rt.syncs == syncs0 + 1);
    cuStreamDestroy(a);
    cuStreamDestroy(m);
}

/* Every tensor's base is aligned to 256 bytes as cudaMalloc's, in the default pool and a private one: the sizes
 * below 256 too, whose fabpool classes are aligned to their size only. */
static void check_small_alignment(Core &core)
{
    PoolId P{0, 77};
    for (int in_pool = 0; in_pool < 2; in_pool++) {
        if (in_pool)
            core.begin_pool(0, P, [](Stream) { return true; });
        std::vector<void *> v;
        for (size_t size = 1; size <= 1024; size = size < 16 ? size + 1 : size * 2 - 1) {
            void *p = core.malloc(0, size, nullptr);
            CHECK(p != nullptr && (uintptr_t(p) & 255) == 0);
            v.push_back(p);
        }
        free_all(core, v);
        if (in_pool)
            core.end_pool(0, P);
    }
    core.release_pool(0, P);
    core.empty_cache(PoolId{0, 0});
}

/* An allocation the device cannot serve throws fabpool's message; a
 * MemPool(use_on_oom=True) serves it from what it holds; after the program
 * frees memory it goes on. */
static void check_oom(Core &core, int64_t held0)
{
    CUstream s = new_stream();
    size_t fr = 0, total = 0;
    cuMemGetInfo(&fr, &total);
    const size_t block = total / 8; /* a whole number of 2 MiB granules for the sim's sizes */
    /* a MemPool with one block of that size cached */
    const PoolId U{0, 11};
    core.create_or_incref(0, U, nullptr);
    core.begin_pool(0, U, [](Stream) { return true; });
    void *u = core.malloc(0, block, s);
    core.end_pool(0, U);
    core.free(u);
    std::vector<void *> live;
    std::string msg;
    OutOfMemory *caught = nullptr;
    for (int i = 0; i < 64 && msg.empty(); i++) {
        try {
            live.push_back(core.malloc(0, block, s));
        } catch (const OutOfMemory &e) {
            msg = e.what();
            caught = new OutOfMemory(e);
        }
    }
    CHECK(!msg.empty() && live.size() >= 5 && live.size() <= 7);
    /* PyTorch's own first sentences (its test_out_of_memory matches them), sizes as PyTorch writes them */
    char head[96];
    const bool in_gib = block > (size_t(1) << 30);   /* (a block here is above 1 MiB) */
    snprintf(head, sizeof head, "CUDA out of memory. Tried to allocate %.2f %s. GPU 0 has a total capacity of ",
             double(block) / double(in_gib ? size_t(1) << 30 : size_t(1) << 20), in_gib ? "GiB" : "MiB");
    CHECK(msg.rfind(head, 0) == 0);
    CHECK(msg.find(" is free. Of the allocated memory ") != std::string::npos &&
          msg.find(" is allocated by PyTorch, and ") != std::string::npos &&
          msg.find(" is reserved by PyTorch but unallocated. fabpool (stream ") != std::string::npos);
    CHECK(msg.find("this pool maps") != std::string::npos);  /* fabpool's own account */
    CHECK(caught && caught->device == 0 && caught->size == block && caught->allowed >= live.size() * block);
    delete caught;
    CHECK(core.stats(0).num_ooms == 1);
    core.set_use_on_oom(0, U, true);
    void *v = core.malloc(0, block, s);
    CHECK(v == u && pool_of(core, v, U));
    core.free(v);
    core.set_use_on_oom(0, U, false);
    core.release_pool(0, U);
    core.release_pool(0, U);
    core.free(live.back());
    live.pop_back();
    live.push_back(core.malloc(0, block, s)); /* the program goes on */
    CHECK(live.back() != nullptr);
    free_all(core, live);
    all_back(core, held0, {s});
}

/* set_per_process_memory_fraction caps what the device's pools map. */
static void check_fraction(Core &core, int64_t held0)
{
    CUstream s = new_stream();
    size_t fr = 0, total = 0;
    cuMemGetInfo(&fr, &total);
    CHECK(core.fraction(0) == 1.0);
    core.set_fraction(0, 0.25);
    CHECK(core.fraction(0) == 0.25);
    const int64_t cap = int64_t(total / 4);
    const size_t block = total / 32;
    std::vector<void *> live;
    std::string msg;
    for (int i = 0; i < 64 && msg.empty(); i++) {
        try {
            live.push_back(core.malloc(0, block, s));
            CHECK(t_held() - held0 <= cap);
        } catch (const OutOfMemory &e) {
            msg = e.what();
            CHECK(e.allowed == size_t(cap));
        }
    }
    CHECK(int64_t(live.size()) == cap / int64_t(block));
    CHECK(msg.find("set_per_process_memory_fraction(0.25)") != std::string::npos);
    CHECK(t_held() - held0 <= cap);
    /* at the cap, memory already mapped still serves */
    core.free(live.back());
    live.back() = core.malloc(0, block, s);
    CHECK(live.back() != nullptr);
    bool refused = false;
    try {
        core.set_fraction(0, 1.5);
    } catch (const std::invalid_argument &) {
        refused = true;
    }
    CHECK(refused && core.fraction(0) == 0.25);
    core.set_fraction(0, 1.0);
    live.push_back(core.malloc(0, block, s));
    CHECK(t_held() - held0 > cap);
    free_all(core, live);
    all_back(core, held0, {s});
}

/* A CUDA graph's private pool: capture allocations go to it, its blocks are
 * reused by its own stream only and never given back while it is in use, a
 * free during capture makes no driver call, graph trees' checkpoints
 * restore its live blocks at their addresses, and its memory goes back once
 * it is released and emptied. */
static void check_graph_pool(Core &core, int64_t held0)
{
    CUstream cap_s = new_stream(), other = new_stream();
    Stream S = cap_s;
    const PoolId P{1, 0};
    void *x = core.malloc(0, 4096, cap_s); /* made before the capture, in the default pool */
    uint64_t frees0 = shim_frees();
    core.begin_pool(0, P, [S](Stream s) { return s == S; });
    CHECK(core.use_count(0, P) == 1);
    bool refused = false;
    try {
        core.begin_pool(0, P, [](Stream) { return true; });
    } catch (const std::logic_error &) {
        refused = true;
    }
    CHECK(refused && core.use_count(0, P) == 1);
    rt.capture(S, true);
    long relax0 = rt.relaxes;
    long events0 = rt.events;
    uint64_t calls0 = forbidden_calls();
    void *a = core.malloc(0, MiB, cap_s);
    CHECK(pool_of(core, a, P));
    core.free(x); /* its stream captures: held back, no driver call */
    CHECK(shim_frees() == frees0);
    core.free(a);
    void *b = core.malloc(0, MiB, cap_s);
    CHECK(b == a);
    void *big = core.malloc(0, 64 * MiB, cap_s);
    core.free(big);
    void *c = core.malloc(0, 4096, other); /* not the capture's stream: the default pool */
    CHECK(pool_of(core, c, PoolId{0, 0}));
    CHECK(forbidden_calls() == calls0 && rt.events == events0); /* nothing a capture forbids */
    CHECK(rt.relaxes > relax0);
    rt.capture(S, false);
    core.end_pool(0, P);
    CHECK(shim_frees() == frees0 + 1); /* x, once the capture is over */
    CHECK(core.check_live(0, P, {b}));
    CHECK(!core.check_live(0, P, {}));
    CHECK(!core.check_live(0, P, {b, c}));

    auto state = core.checkpoint(0, P);
    CHECK(state->live.size() == 1 && state->live[0].ptr == b);
    t_put_tag(b, MiB, 0x77);
    core.free(b);
    core.begin_pool(0, P, [S](Stream s) { return s == S; });
    CHECK(core.use_count(0, P) == 2);
    void *e = core.malloc(0, 3 * MiB, cap_s); /* another size: a block of its own */
    void *f = core.malloc(0, 64 * MiB, cap_s); /* the capture's 64 MiB block again */
    CHECK(e != b && f == big);
    core.end_pool(0, P);
    core.free(f);
    core.empty_cache(PoolId{0, 0}); /* the pool is in use: its memory stays */
    CHECK(t_tag_ok(b, MiB, 0x77));
    std::vector<void *> freed, made;
    core.restore(*state, &freed, &made);
    CHECK(freed.size() == 1 && freed[0] == e && made.size() == 1 && made[0] == b);
    CHECK(core.check_live(0, P, {b}));
    CHECK(t_tag_ok(b, MiB, 0x77));
    DeviceStats st = core.stats(0);
    CHECK(st.allocation[fabpool_torch::kAll].current == 2); /* b and c */
    core.free(b);
    refused = false;
    try {
        core.free(e); /* freed by the restore */
    } catch (const std::invalid_argument &) {
        refused = true;
    }
    CHECK(refused);

    int64_t with_pool = t_held();
    core.release_pool(0, P);
    core.release_pool(0, P);
    CHECK(core.use_count(0, P) == 0);
    refused = false;
    try {
        core.release_pool(0, P);
    } catch (const std::logic_error &) {
        refused = true;
    }
    CHECK(refused);
    long syncs0 = rt.syncs;
    core.empty_cache(PoolId{0, 0});
    CHECK(rt.syncs > syncs0); /* a replay may still run in the pool's memory */
    CHECK(t_held() < with_pool);
    CHECK(core.segments(P).empty());
    refused = false;
    try {
        core.check_live(0, P, {});
    } catch (const std::logic_error &) {
        refused = true;
    }
    CHECK(refused);
    core.free(c);
    all_back(core, held0, {cap_s, other});
}

/* Two graphs in one pool: the second capture reuses what the first freed,
 * and the first's live output is not given out again. */
static void check_shared_pool(Core &core, int64_t held0)
{
    CUstream sc = new_stream();
    Stream S = sc;
    const PoolId P{2, 0};
    auto filter = [S](Stream s) { return s == S; };
    core.begin_pool(0, P, filter);
    rt.capture(S, true);
    void *tmp1 = core.malloc(0, 8 * MiB, sc);
    void *out1 = core.malloc(0, 2 * MiB, sc);
    core.free(tmp1);
    rt.capture(S, false);
    core.end_pool(0, P);
    core.begin_pool(0, P, filter); /* graph 2, pool=g1.pool() */
    rt.capture(S, true);
    void *tmp2 = core.malloc(0, 8 * MiB, sc);
    void *out2 = core.malloc(0, 2 * MiB, sc);
    CHECK(tmp2 == tmp1 && out2 != out1);
    core.free(tmp2);
    rt.capture(S, false);
    core.end_pool(0, P);
    core.free(out1);
    core.free(out2);
    core.release_pool(0, P);
    core.release_pool(0, P);
    all_back(core, held0, {sc});
}

/* Two devices (test_torch_core --two-devices, FABSIM_DEVICES=2): a pool context open on device 1 changes nothing
 * of device 0's allocations. A private pool of device 0 that held half of it is released; an allocation that fits
 * only once that pool's memory goes back (PyTorch's OOM retry frees released pools) is served while device 1
 * allocates to a pool of its own, as PyTorch's per-device allocator serves it. */
static void check_other_device_context(Core &core)
{
    int n = 0;
    cuDeviceGetCount(&n);
    CHECK(n >= 2);
    if (n < 2)
        return;
    CUstream s = new_stream();
    size_t fr = 0, total = 0;
    cuMemGetInfo(&fr, &total);
    const PoolId Q{31, 0}, R{32, 0};
    core.begin_pool(0, Q, [](Stream) { return true; });
    void *big = core.malloc(0, total / 2, s);
    core.end_pool(0, Q);
    core.free(big);
    core.release_pool(0, Q);
    cuMemGetInfo(&fr, &total);
    size_t want = fr + total / 4; /* fits only once Q's memory goes back */
    core.begin_pool(1, R, [](Stream) { return true; });
    void *p = nullptr;
    try {
        p = core.malloc(0, want, s);
    } catch (const OutOfMemory &e) {
        fprintf(stderr, "check_other_device_context: %s\n", e.what());
    }
    CHECK(p != nullptr);
    core.end_pool(1, R);
    core.release_pool(1, R);
    if (p)
        core.free(p);
    core.empty_cache(PoolId{0, 0});
    cuStreamDestroy(s);
}

/* A graph captured on the stream that owns fabpool's default pool (the first stream it saw): an allocation of
 * another stream during the capture makes no event or synchronize call (PyTorch makes none while a capture is
 * underway; on a GPU a captured event's synchronize fails and a context synchronize breaks the capture), and
 * succeeds. */
static void check_capture_of_the_owner(Core &core, int64_t held0)
{
    CUstream s = new_stream(), o = new_stream();
    Stream S = s;
    const PoolId P{21, 0};
    void *x = core.malloc(0, MiB, s); /* s: the first stream the default pool sees, its owner */
    core.free(x);                     /* an owner's free: to the pool at once, a fence owed */
    core.begin_pool(0, P, [S](Stream q) { return q == S; });
    rt.capture(S, true);
    void *a = core.malloc(0, MiB, s);
    t_sim_hooks h = t_sim_hooks_get();
    uint64_t c0 = h.calls ? h.calls("cuEventRecord") + h.calls("cuEventSynchronize") + h.calls("cuCtxSynchronize") : 0;
    void *y = nullptr;
    try {
        y = core.malloc(0, MiB, o); /* another stream, not capturing: the default pool */
    } catch (const OutOfMemory &e) {
        fprintf(stderr, "check_capture_of_the_owner: %s\n", e.what());
    }
    uint64_t c1 = h.calls ? h.calls("cuEventRecord") + h.calls("cuEventSynchronize") + h.calls("cuCtxSynchronize") : 0;
    CHECK(y != nullptr && c1 == c0);
    if (c1 != c0)
        fprintf(stderr, "check_capture_of_the_owner: %llu event or synchronize calls during the capture\n",
                (unsigned long long)(c1 - c0));
    rt.capture(S, false);
    core.end_pool(0, P);
    core.free(a);
    if (y)
        core.free(y);
    core.release_pool(0, P);
    all_back(core, held0, {s, o});
    core.reset_accumulated(0); /* check_stats counts from here */
    core.reset_peak(0);
}

/* Pools begun inside one another (use_mem_pool nested): the one begun last serves until it ends, then the one
 * around it again, as PyTorch's test_nested_mempool has it: 20 MiB in A, in B, in C, in B, in A gives A and B two
 * blocks each and C one. */
static void check_nested_pools(Core &core, int64_t held0)
{
    const PoolId A{11, 0}, B{12, 0}, C{13, 0};
    auto all = [](Stream) { return true; };
    std::vector<void *> got;
    auto take = [&] { got.push_back(core.malloc(0, 20 * MiB, nullptr)); };
    core.begin_pool(0, A, all);
    take();
    core.begin_pool(0, B, all);
    take();
    core.begin_pool(0, C, all);
    take();
    core.end_pool(0, C);
    take();
    core.end_pool(0, B);
    take();
    core.end_pool(0, A);
    CHECK(core.segments(A).size() == 2 && core.segments(B).size() == 2 && core.segments(C).size() == 1);
    if (core.segments(A).size() != 2)
        fprintf(stderr, "check_nested_pools: %zu, %zu and %zu blocks in the three pools\n", core.segments(A).size(),
                core.segments(B).size(), core.segments(C).size());
    for (void *p : got)
        core.free(p);
    for (PoolId id : {A, B, C})
        core.release_pool(0, id);
    all_back(core, held0, {});
}

/* A private pool's block used on another stream waits for that stream. */
static void check_pool_record_stream(Core &core, int64_t held0)
{
    CUstream sc = new_stream(), m = new_stream();
    Stream S = sc;
    const PoolId P{0, 3};
    auto filter = [S](Stream s) { return s == S; };
    core.begin_pool(0, P, filter);
    void *y = core.malloc(0, MiB, sc);
    core.end_pool(0, P);
    CHECK(core.record_stream(y, m));
    S_hold(m);
    core.free(y);
    core.begin_pool(0, P, filter);
    void *z = core.malloc(0, MiB, sc);
    core.end_pool(0, P);
    CHECK(z != y);
    S_release(m);
    core.free(core.malloc(0, 256, sc)); /* outside a context: the events are looked at */
    core.begin_pool(0, P, filter);
    void *w = core.malloc(0, MiB, sc);
    core.end_pool(0, P);
    CHECK(w == y);
    core.free(w);
    core.free(z);
    for (int i = 0; i < 3; i++)
        core.release_pool(0, P);
    all_back(core, held0, {sc, m});
}

/* torch.cuda.MemPool(allocator=...): the pool's own allocator serves it. */
struct HostAllocator final : fabpool_torch::External {
    int allocs = 0, frees = 0;
    void *alloc(size_t size, Stream) override
    {
        allocs++;
        return std::malloc(size);
    }
    void free(void *p) override
    {
        frees++;
        std::free(p);
    }
};

static void check_external_pool(Core &core)
{
    auto ext = std::make_shared<HostAllocator>();
    const PoolId Q{0, 9};
    core.create_or_incref(0, Q, ext);
    core.begin_pool(0, Q, [](Stream) { return true; });
    CHECK(core.use_count(0, Q) == 2);
    int64_t reserved0 = core.stats(0).reserved_bytes.current;
    void *p = core.malloc(0, 12345, nullptr);
    CHECK(ext->allocs == 1 && pool_of(core, p, Q));
    CHECK(core.stats(0).reserved_bytes.current == reserved0 + 12345);
    core.free(p);
    void *q = core.malloc(0, 12000, nullptr); /* the pool's cached block serves it */
    CHECK(q == p && ext->allocs == 1 && ext->frees == 0);
    core.end_pool(0, Q);
    core.free(q);
    core.empty_cache(Q); /* in use: it keeps its memory */
    CHECK(ext->frees == 0);
    core.release_pool(0, Q);
    core.release_pool(0, Q);
    core.empty_cache(Q);
    CHECK(ext->frees == 1);
    CHECK(core.use_count(0, Q) == 0 && core.stats(0).reserved_bytes.current == reserved0);
}

/* An allocator that frees only what it gave and counts the frees of anything else (a double free with
 * malloc would abort the test instead of failing a check). */
struct CountingAllocator final : fabpool_torch::External {
    std::set<void *> given;
    int allocs = 0, frees = 0, bad_frees = 0;
    void *alloc(size_t size, Stream) override
    {
        void *p = std::malloc(size);
        allocs++;
        given.insert(p);
        return p;
    }
    void free(void *p) override
    {
        if (!given.erase(p)) {
            bad_frees++;
            return;
        }
        frees++;
        std::free(p);
    }
};

/* A core destroyed while a pool of its own allocator still has a live block and a cached one: the
 * allocator gets each back once. */
static void check_external_pool_teardown()
{
    auto ext = std::make_shared<CountingAllocator>();
    {
        Core core(&rt);
        const PoolId Q{0, 11};
        core.create_or_incref(0, Q, ext);
        core.begin_pool(0, Q, [](Stream) { return true; });
        void *live = core.malloc(0, 4096, nullptr);
        void *cached = core.malloc(0, 8192, nullptr);
        core.end_pool(0, Q);
        core.free(cached);
        CHECK(live && cached && ext->allocs == 2 && ext->frees == 0);
    }
    CHECK(ext->bad_frees == 0);
    CHECK(ext->frees == 2 && ext->given.empty());
}

/* Threads on streams of their own, using each other's streams. */
static void check_threads(Core &core, int64_t held0)
{
    const int n = 4;
    CUstream s[n];
    for (auto &x : s)
        x = new_stream();
    std::atomic<int> errors{0};
    std::vector<std::thread> th;
    for (int t = 0; t < n; t++)
        th.emplace_back([&, t] {
            unsigned seed = 7u + unsigned(t);
            std::vector<void *> live;
            for (int i = 0; i < 3000; i++) {
                seed = seed * 1103515245u + 12345u;
                if (live.size() > 16 || (!live.empty() && (seed >> 16) % 3 == 0)) {
                    void *p = live.back();
                    live.pop_back();
                    if ((seed >> 8) % 5 == 0)
                        core.record_stream(p, s[(t + 1) % n]);
                    core.free(p);
                } else {
                    try {
                        live.push_back(core.malloc(0, 256 + (seed >> 12) % (2 * MiB), s[t]));
                    } catch (...) {
                        errors++;
                    }
                }
            }
            free_all(core, live);
        });
    for (auto &x : th)
        x.join();
    CHECK(errors == 0);
    CHECK(core.stats(0).allocation[fabpool_torch::kAll].current == 0);
    all_back(core, held0, {s[0], s[1], s[2], s[3]});
}

/* ------------------------------------------------------------- IPC
 *
 * torch.multiprocessing's path: the parent shares blocks (share_ipc, as
 * shareIpcHandle), a child process with a core of its own opens them
 * (open_ipc, as getIpcDevPtr), reads what the parent wrote and writes back;
 * the parent frees its blocks and empties its cache while the child still
 * reads them, and once the child lets go the machine holds nothing. */

enum { IPC_BLOCK = 1, IPC_STALE = 2, IPC_GO = 3 };

struct IpcMsg {
    uint64_t kind, offset, usable, tag;
};

static const size_t kIpcSizes[] = {1000, 3 * MiB, 100 * MiB}; /* a small and a medium slab block, a large one */
static const int kIpcBlocks = 3;

static uint64_t ipc_recv(int s, IpcMsg *m, std::string *handle)
{
    static std::vector<char> buf(1 << 20);
    size_t n = 0, len = 0;
    if (fabpool_fd_recv(s, nullptr, 0, &n, buf.data(), buf.size(), &len) != FABPOOL_OK || len < sizeof *m)
        return 0;
    memcpy(m, buf.data(), sizeof *m);
    if (handle)
        handle->assign(buf.data() + sizeof *m, len - sizeof *m);
    return m->kind;
}

static void ipc_send(int s, const IpcMsg &m, const std::string &handle)
{
    std::string b(reinterpret_cast<const char *>(&m), sizeof m);
    b += handle;
    CHECK_OK(fabpool_fd_send(s, nullptr, 0, b.data(), b.size()));
}

static int ipc_child(const char *sock_name)
{
    t_driver_init();
    fabpool_torch_set_verbose(0);
    int s = -1;
    if (fabpool_fd_connect(sock_name, &s, 5000) != FABPOOL_OK) {
        fprintf(stderr, "ipc child: %s\n", fabpool_last_error());
        return 2;
    }
    std::shared_ptr<void> late; /* held past the core's end: its deleter must do nothing then */
    {
        Core core(&rt);
        std::vector<std::shared_ptr<void>> held;
        std::vector<IpcMsg> got;
        std::vector<std::string> handles;
        uint64_t maps0 = t_ledger().mappings;
        IpcMsg m;
        std::string handle;
        while (ipc_recv(s, &m, &handle) == IPC_BLOCK) {
            handles.push_back(handle);
            std::shared_ptr<void> p = core.open_ipc(0, handle);
            CHECK(core.open_ipc(0, handle).get() == p.get()); /* a handle still open: the same mapping */
            char *at = static_cast<char *>(p.get()) + m.offset;
            uint64_t seen = t_tag_ok(at, m.usable, m.tag);
            t_put_tag(at, m.usable, m.tag + 1);
            CHECK_CU(cuCtxSynchronize()); /* the DMA lands before the parent looks */
            held.push_back(p);
            got.push_back(m);
            ipc_send(s, IpcMsg{seen, 0, 0, 0}, "");
        }
        /* a handle whose block the sender has freed: refused by the sender */
        CHECK(m.kind == IPC_STALE);
        uint64_t refused = 0;
        try {
            core.open_ipc(0, handle);
        } catch (const std::runtime_error &e) {
            refused = strstr(e.what(), "no longer live") != nullptr;
        }
        try {
            core.open_ipc(0, handle.substr(0, handle.size() - 1)); /* cut short */
        } catch (const std::invalid_argument &e) {
            refused += strstr(e.what(), "malformed") != nullptr;
        }
        /* a handle with another token: the sender's server refuses it, and nothing is mapped */
        fabpool_torch::ipc::Handle h;
        std::string why;
        CHECK(fabpool_torch::ipc::decode(handles[1], &h, &why));
        h.token[0] ^= 0x5a;
        size_t views = core.ipc_views();
        try {
            core.open_ipc(0, fabpool_torch::ipc::encode(h));
        } catch (const fabpool_torch::ipc::Error &e) {
            refused += e.status() == FABPOOL_ERR_PERMISSION && strstr(e.what(), "token") != nullptr;
        }
        CHECK(core.ipc_views() == views);
        /* the sender's socket out of reach (another network namespace; here a server id that is not its): the
         * fds copied by pidfd_getfd once the sender has shown the token, where ptrace permission allows, else a
         * message that names both ways (before the answer below: the sender still holds its blocks) */
        h.token[0] ^= 0x5a;
        h.server_id ^= 0x5a;
        std::string far = fabpool_torch::ipc::encode(h);
        try {
            std::shared_ptr<void> p = core.open_ipc(0, far);
            CHECK(t_tag_ok(static_cast<char *>(p.get()) + got[1].offset, got[1].usable, got[1].tag + 1));
            printf("test_torch_core: ipc: pidfd_getfd served a handle whose socket could not be reached\n");
        } catch (const std::runtime_error &e) {
            CHECK(strstr(e.what(), "fd server") && strstr(e.what(), "pidfd_getfd"));
            printf("test_torch_core: ipc: no pidfd_getfd here: %s\n", e.what());
        }
        ipc_send(s, IpcMsg{refused, 0, 0, 0}, "");
        CHECK(core.ipc_views() == size_t(kIpcBlocks));
        CHECK(core.stats(0).reserved_bytes.current == 0); /* other processes' memory is not this one's */
        /* the parent has freed its blocks and emptied its cache: the views still hold the data */
        CHECK(ipc_recv(s, &m, nullptr) == IPC_GO);
        uint64_t ok = 0;
        for (size_t i = 0; i < got.size(); i++)
            ok += t_tag_ok(static_cast<char *>(held[i].get()) + got[i].offset, got[i].usable, got[i].tag + 1);
        late = held[0];
        long syncs = rt.syncs;
        held.clear();
        CHECK(core.ipc_views() == 1 && rt.syncs == syncs + kIpcBlocks - 1); /* each deleter waited for the device */
        CHECK(t_ledger().mappings == maps0 + 1);  /* and unmapped its view: the small block's slab is left */
        ipc_send(s, IpcMsg{ok, 0, 0, 0}, "");
    }
    late.reset();
    CHECK(t_ledger().mappings == 0);
    close(s);
    CHECK(fabpool_torch_shutdown() == FABPOOL_OK);
    return t_failures ? 1 : 0;
}

static void check_ipc(Core &core, int64_t held0, const char *self)
{
    uint64_t (*machine_held)(int) = nullptr;
    *(void **)&machine_held = dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    bool bad = false;
    try {
        core.share_ipc(reinterpret_cast<void *>(uintptr_t(0x1000)));
    } catch (const std::invalid_argument &e) {
        bad = strstr(e.what(), "not a live block") != nullptr;
    }
    CHECK(bad);
    bad = false;
    try {
        core.open_ipc(0, std::string(64, 'x'));
    } catch (const std::invalid_argument &e) {
        bad = strstr(e.what(), "not a handle of fabpool's allocator") != nullptr;
    }
    CHECK(bad);
    CUstream s = new_stream();
    int ls = -1, sock = -1;
    pid_t pid = t_spawn_peer(self, "--ipc-child", "fabpool-torch-ipc", &ls, &sock);
    void *p[kIpcBlocks];
    uint64_t bytes = 0;
    for (int i = 0; i < kIpcBlocks; i++) {
        p[i] = core.malloc(0, kIpcSizes[i], s);
        size_t u = 0;
        CHECK(core.usable_size(p[i], &u));
        t_put_tag(p[i], u, 500 + uint64_t(i));
        CHECK_CU(cuCtxSynchronize());
        fabpool_torch::IpcShare sh = core.share_ipc(p[i]);
        CHECK(sh.offset >= 0 && core.share_ipc(p[i]).handle == sh.handle); /* the same block: the same bytes */
        ipc_send(sock, IpcMsg{IPC_BLOCK, uint64_t(sh.offset), u, 500 + uint64_t(i)}, sh.handle);
        IpcMsg r;
        CHECK(ipc_recv(sock, &r, nullptr) == 1);                 /* the child read what this process wrote */
        CHECK(t_tag_ok(p[i], u, 501 + uint64_t(i)));              /* and this one reads what it wrote */
        bytes += u;
    }
    /* a block shared and freed before the receiver opens it */
    void *q = core.malloc(0, 2 * MiB, s);
    std::string stale = core.share_ipc(q).handle;
    core.free(q);
    ipc_send(sock, IpcMsg{IPC_STALE, 0, 0, 0}, stale);
    IpcMsg r;
    /* refused by this process's server (freed, a wrong token), and the malformed one */
    CHECK(ipc_recv(sock, &r, nullptr) == 3);
    uint64_t refused = 0, served = core.ipc_served(&refused);
    CHECK(served >= uint64_t(kIpcBlocks) && refused == 2);
    /* this process lets go first: its memory goes back to the driver, the child's views keep theirs */
    for (int i = 0; i < kIpcBlocks; i++)
        core.free(p[i]);
    core.empty_cache(PoolId{0, 0});
    CHECK(t_held() == held0);
    if (machine_held)
        CHECK(machine_held(0) >= uint64_t(held0) + bytes);
    ipc_send(sock, IpcMsg{IPC_GO, 0, 0, 0}, "");
    CHECK(ipc_recv(sock, &r, nullptr) == uint64_t(kIpcBlocks)); /* the child still read its data */
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (machine_held)
        CHECK(machine_held(0) == uint64_t(held0)); /* both let go: nothing more is held, in any process */
    close(sock);
    close(ls);
    all_back(core, held0, {s});
}

/* share_ipc of a block in a private pool (a MemPool's, a graph's): opened
 * here too, through this process's own fd server; refused, with what to
 * change, for a pool made with handle_type:none and for a MemPool with an
 * allocator of its own. */
static void check_ipc_pools(Core &core, int64_t held0)
{
    const PoolId P{0, 21}, N{0, 22}, X{0, 23};
    auto run = [&](PoolId id, std::shared_ptr<fabpool_torch::External> ext, size_t size, const char *refusal) {
        core.create_or_incref(0, id, ext);
        core.begin_pool(0, id, [](Stream) { return true; });
        void *p = core.malloc(0, size, nullptr);
        core.end_pool(0, id);
        std::string why;
        try {
            fabpool_torch::IpcShare sh = core.share_ipc(p);
            t_put_tag(p, size, 77);
            CHECK_CU(cuCtxSynchronize());
            std::shared_ptr<void> v = core.open_ipc(0, sh.handle);
            CHECK(t_tag_ok(static_cast<char *>(v.get()) + sh.offset, size, 77));
        } catch (const std::logic_error &e) {
            why = e.what();
        }
        CHECK(refusal ? strstr(why.c_str(), refusal) != nullptr : why.empty());
        if (!why.empty() && !refusal)
            fprintf(stderr, "check_ipc_pools: %s\n", why.c_str());
        core.free(p);
        core.release_pool(0, id);
        core.release_pool(0, id);
        core.empty_cache(id);
    };
    run(P, nullptr, 5 * MiB, nullptr);
    setenv("FABPOOL_CONF", "handle_type:none", 1); /* the pool made next has local memory */
    run(N, nullptr, 5 * MiB, "handle_type:none");
    unsetenv("FABPOOL_CONF");
    run(X, std::make_shared<HostAllocator>(), 4096, "allocator of its own");
    CHECK(core.ipc_views() == 0);
    CHECK(t_held() == held0);
}

/* A sender whose answer is not what the handle says (more fds than its
 * chunks): the receiver closes every fd that came, and says why. */
static void check_ipc_answer_closed()
{
    fabpool_torch::ipc::Handle h;
    h.type = FABPOOL_HANDLE_POSIX_FD;
    h.pid = int(getpid()); /* the server below is this process's: the receiver's peer check lets it answer */
    memcpy(h.token, "a wrong answer..", fabpool_torch::ipc::kTokenBytes);
    h.token_fd = 3;
    h.server_id = 0xa11;
    h.key = 0x1000;
    h.fds = {3};
    h.desc = "d";
    int ls = -1;
    CHECK_OK(fabpool_fd_listen(fabpool_torch::ipc::socket_name(h.pid, h.server_id).c_str(), &ls));
    int before = fd_count();
    std::thread server([ls] {
        int c = -1, fds[2] = {open("/dev/null", O_RDONLY), open("/dev/null", O_RDONLY)};
        char req[64];
        size_t n = 0, len = 0;
        uint32_t ok = 0;
        if (fabpool_fd_accept(ls, &c) == FABPOOL_OK && fabpool_fd_recv(c, nullptr, 0, &n, req, sizeof req, &len) == FABPOOL_OK)
            fabpool_fd_send(c, fds, 2, &ok, sizeof ok);
        for (int fd : {c, fds[0], fds[1]})
            if (fd >= 0)
                close(fd);
    });
    bool thrown = false;
    try {
        fabpool_torch::ipc::fetch(h);
    } catch (const fabpool_torch::ipc::Error &e) {
        thrown = e.status() == FABPOOL_ERR_LIMIT && strstr(e.what(), "its answer") != nullptr;
        if (!thrown)
            fprintf(stderr, "check_ipc_answer_closed: %s\n", e.what());
    }
    server.join();
    CHECK(thrown && fd_count() == before);
    close(ls);
}

/* What fetch(h) threw (its status, *why its words), or FABPOOL_OK where it returned (the fds closed). */
static fabpool_status fetch_status(const fabpool_torch::ipc::Handle &h, std::string *why)
{
    try {
        for (int fd : fabpool_torch::ipc::fetch(h))
            close(fd);
    } catch (const fabpool_torch::ipc::Error &e) {
        *why = e.what();
        return e.status();
    }
    return FABPOOL_OK;
}

/* A sender that refuses with a status of its own: the receiver throws that status for every code up to
 * FABPOOL_STATUS_LAST (FABPOOL_ERR_PARTIAL the last), with the sender's words; a code past it reads as
 * FABPOOL_ERR_IO. */
static void check_ipc_answer_status()
{
    for (uint32_t code : {uint32_t(FABPOOL_ERR_PARTIAL), uint32_t(FABPOOL_STATUS_LAST) + 1}) {
        fabpool_torch::ipc::Handle h;
        h.type = FABPOOL_HANDLE_POSIX_FD;
        h.pid = int(getpid());
        memcpy(h.token, "a refused fetch.", fabpool_torch::ipc::kTokenBytes);
        h.token_fd = 3;
        h.server_id = 0xa12;
        h.key = 0x1000;
        h.fds = {3};
        h.desc = "d";
        int ls = -1;
        CHECK_OK(fabpool_fd_listen(fabpool_torch::ipc::socket_name(h.pid, h.server_id).c_str(), &ls));
        std::thread server([ls, code] {
            int c = -1;
            char req[64];
            size_t n = 0, len = 0;
            char reply[4 + 16];
            memcpy(reply, &code, 4);
            memcpy(reply + 4, "the sender's why", 16);
            if (fabpool_fd_accept(ls, &c) == FABPOOL_OK && fabpool_fd_recv(c, nullptr, 0, &n, req, sizeof req, &len) == FABPOOL_OK)
                fabpool_fd_send(c, nullptr, 0, reply, sizeof reply);
            if (c >= 0)
                close(c);
        });
        std::string why;
        fabpool_status got = fetch_status(h, &why);
        server.join();
        close(ls);
        fabpool_status want = code <= uint32_t(FABPOOL_STATUS_LAST) ? fabpool_status(code) : FABPOOL_ERR_IO;
        CHECK(got == want && strstr(why.c_str(), "the sender's why") != nullptr);
        if (got != want)
            fprintf(stderr, "check_ipc_answer_status: code %u: %s (%s)\n", code, fabpool_status_name(got), why.c_str());
    }
}

/* Connections that never send a whole request's start (one silent, one with part of a start) reach the
 * sender's fd server before a receiver: the receiver's fetch is answered at once, not after their deadlines
 * (10 s each, one after the other, before), and the two are closed by theirs. */
static void check_ipc_server_strangers()
{
    int before = fd_count();
    {
        fabpool_torch::ipc::Server srv([](uint64_t, const std::string &, std::vector<int> *, std::string *m) {
            *m = "no block here";
            return int(FABPOOL_ERR_NOT_FOUND);
        });
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id());
        int silent = -1, part = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &silent, 2000));
        CHECK_OK(fabpool_fd_connect(name.c_str(), &part, 2000));
        uint8_t start[FABPOOL_FD_HEAD_BYTES + 6];
        uint32_t head[2] = {0, 100};
        memcpy(start, head, sizeof head);
        memcpy(start + sizeof head, "FPRQ\x01\x02", 6);
        CHECK(send(part, start, sizeof start, MSG_NOSIGNAL) == ssize_t(sizeof start));
        fabpool_torch::ipc::Handle h;
        h.type = FABPOOL_HANDLE_POSIX_FD;
        h.pid = srv.pid();
        memcpy(h.token, srv.token(), fabpool_torch::ipc::kTokenBytes);
        h.token_fd = srv.token_fd();
        h.server_id = srv.id();
        h.key = 0x1000;
        h.fds = {3};
        h.desc = "d";
        auto t0 = std::chrono::steady_clock::now();
        std::string why;
        fabpool_status got = fetch_status(h, &why);
        long ms = long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                           .count());
        CHECK(got == FABPOOL_ERR_NOT_FOUND && strstr(why.c_str(), "no block here") != nullptr);
        CHECK(ms < 2000);
        if (got != FABPOOL_ERR_NOT_FOUND || ms >= 2000)
            fprintf(stderr, "check_ipc_server_strangers: %s after %ld ms: %s\n", fabpool_status_name(got), ms,
                    why.c_str());
        CHECK(srv.served() == 0);
        close(silent);
        close(part);
    }
    CHECK(fd_count() == before);
}

/* The request of the fd server's tests below, as fetch sends it: fabpool_fd_send's head, the magic, the token, the key, the
 * descriptor. */
static std::string ipc_request(const fabpool_torch::ipc::Handle &h)
{
    uint32_t head[2] = {0, uint32_t(4 + fabpool_torch::ipc::kTokenBytes + 8 + h.desc.size())};
    std::string req(reinterpret_cast<const char *>(head), sizeof head);
    req += "FPRQ";
    req.append(reinterpret_cast<const char *>(h.token), fabpool_torch::ipc::kTokenBytes);
    req.append(reinterpret_cast<const char *>(&h.key), sizeof h.key);
    return req + h.desc;
}

/* A handle of srv's with a 64-byte descriptor; no pidfd fallback: only the server's answers count. */
static fabpool_torch::ipc::Handle ipc_handle_of(const fabpool_torch::ipc::Server &srv, uint64_t key)
{
    fabpool_torch::ipc::Handle h;
    h.type = FABPOOL_HANDLE_POSIX_FD;
    h.pid = srv.pid();
    memcpy(h.token, srv.token(), fabpool_torch::ipc::kTokenBytes);
    h.token_fd = 1 << 20;
    h.server_id = srv.id();
    h.key = key;
    h.fds = {3};
    h.desc = std::string(64, 'd');
    return h;
}

static long ms_since(std::chrono::steady_clock::time_point t)
{
    return long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t).count());
}

/* A server that answers every request with a copy of mem. */
static fabpool_torch::ipc::Server::Serve serve_copy_of(int mem)
{
    return [mem](uint64_t, const std::string &, std::vector<int> *fds, std::string *) {
        fds->push_back(dup(mem));
        return fds->back() >= 0 ? 0 : int(FABPOOL_ERR_IO);
    };
}

/* A receiver that holds the token (any receiver of the process's tensors) sends half of its request and stalls:
 * the server keeps serving everyone else (each fetch answered in well under a second, not after the staller's
 * 10 s deadline), and closes the stalled connection at that deadline, answered as a malformed request.  A request
 * whose head announces more than the bound is closed at once. */
static void check_ipc_server_stalled()
{
    int before = fd_count();
    int mem = memfd_create("ipc-stalled", MFD_CLOEXEC);
    CHECK(mem >= 0);
    {
        fabpool_torch::ipc::Server srv(serve_copy_of(mem));
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000);
        std::string req = ipc_request(h);
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id());
        int stalled = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &stalled, 2000));
        size_t half = req.size() / 2; /* past the start (head, magic, token): the server takes it for a request */
        auto t0 = std::chrono::steady_clock::now();
        CHECK(send(stalled, req.data(), half, MSG_NOSIGNAL) == ssize_t(half));
        usleep(100 * 1000); /* its start is in and looked at */
        const int kFetches = 3;
        int answered = 0;
        long worst = 0;
        std::string why;
        for (int i = 0; i < kFetches; i++) {
            auto t = std::chrono::steady_clock::now();
            answered += fetch_status(h, &why) == FABPOOL_OK;
            long ms = ms_since(t);
            worst = ms > worst ? ms : worst;
        }
        CHECK(answered == kFetches && worst < 1000);
        if (answered != kFetches || worst >= 1000)
            fprintf(stderr, "check_ipc_server_stalled: %d of %d fetches answered beside a stalled request, the "
                    "slowest in %ld ms (%s)\n", answered, kFetches, worst, why.c_str());
        CHECK(srv.served() == uint64_t(kFetches));
        /* a request whose head announces more than a request's bound is answered and closed at once, its bytes
         * never awaited */
        int big = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &big, 2000));
        std::string over = req.substr(0, 2 * sizeof(uint32_t) + 4 + fabpool_torch::ipc::kTokenBytes);
        uint32_t over_len = uint32_t(4 + fabpool_torch::ipc::kTokenBytes + 8 + fabpool_torch::ipc::kMaxDesc + 1);
        memcpy(&over[4], &over_len, 4);
        auto t1 = std::chrono::steady_clock::now();
        CHECK(send(big, over.data(), over.size(), MSG_NOSIGNAL) == ssize_t(over.size()));
        char reply[256];
        size_t n = 0, len = 0;
        uint32_t code = 0;
        CHECK_OK(fabpool_fd_recv_timed(big, nullptr, 0, &n, reply, sizeof reply, &len, 15000));
        long big_ms = ms_since(t1);
        if (len >= 4)
            memcpy(&code, reply, 4);
        /* closed: its unread bytes make the close a reset */
        CHECK(code == uint32_t(FABPOOL_ERR_DESCRIPTOR) && recv(big, reply, sizeof reply, 0) <= 0 && big_ms < 1000);
        if (big_ms >= 1000)
            fprintf(stderr, "check_ipc_server_stalled: a request past the bound was answered after %ld ms\n", big_ms);
        close(big);
        /* the stalled connection is answered and closed at its deadline, not before: 10 s after its start came */
        CHECK_OK(fabpool_fd_recv_timed(stalled, nullptr, 0, &n, reply, sizeof reply, &len, 15000));
        long dropped = ms_since(t0);
        code = 0;
        if (len >= 4)
            memcpy(&code, reply, 4);
        CHECK(code == uint32_t(FABPOOL_ERR_DESCRIPTOR) && recv(stalled, reply, sizeof reply, 0) == 0);
        CHECK(dropped >= 9000 && dropped < 15000);
        if (dropped < 9000 || dropped >= 15000)
            fprintf(stderr, "check_ipc_server_stalled: the stalled connection was closed after %ld ms\n", dropped);
        CHECK(srv.refused() == 2);
        close(stalled);
    }
    close(mem);
    CHECK(fd_count() == before);
}

/* A receiver that holds the token asks for a block whose answer does not fit its socket at once and never reads
 * it: the server sends it as the socket takes it and keeps answering everyone else meanwhile (each fetch in well
 * under a second, not after the 10 s a blocking send held the thread); another receiver of the same answer, read
 * while the server sends it in pieces, gets each of its fds once; the unread answer's connection is closed at its
 * 10 s deadline, and no fd of the server's stays open.  The answer is many fds and a long message: fds alone
 * would have to be some 69,000 to fill the default send buffer (it takes about 278 pieces of up to a page, and
 * fabpool_fd_send puts 250 fds on each), more than a process may hold. */
static void check_ipc_server_answer_unread()
{
    int before = fd_count();
    int mem = memfd_create("ipc-unread", MFD_CLOEXEC);
    CHECK(mem >= 0);
    struct stat want;
    CHECK(fstat(mem, &want) == 0);
    const uint64_t kBig = 0xb16;
    const size_t kMany = 1000;
    size_t wmem = 212992; /* net.core.wmem_default: the send buffer the answer must not fit */
    if (FILE *f = fopen("/proc/sys/net/core/wmem_default", "r")) {
        unsigned long v = 0;
        if (fscanf(f, "%lu", &v) == 1 && v > 0)
            wmem = v;
        fclose(f);
    }
    const std::string tail(std::min(2 * wmem + (size_t(64) << 10), fabpool_torch::ipc::kMaxDesc), 'm');
    {
        fabpool_torch::ipc::Server srv([&](uint64_t key, const std::string &, std::vector<int> *fds, std::string *m) {
            for (size_t i = 0; i < (key == kBig ? kMany : 1); i++) {
                fds->push_back(dup(mem));
                if (fds->back() < 0)
                    return int(FABPOOL_ERR_IO);
            }
            if (key == kBig)
                *m = tail;
            return 0;
        });
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000), big = ipc_handle_of(srv, kBig);
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id()), req = ipc_request(big);
        int base = fd_count(); /* the server's own: its listener, pipe and token */
        int unread = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &unread, 2000));
        auto t0 = std::chrono::steady_clock::now();
        CHECK(send(unread, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size()));
        usleep(100 * 1000); /* served, and its answer sent as far as the socket takes it */
        const int kFetches = 3;
        int answered = 0;
        long worst = 0;
        std::string why;
        for (int i = 0; i < kFetches; i++) {
            auto t = std::chrono::steady_clock::now();
            answered += fetch_status(h, &why) == FABPOOL_OK;
            long ms = ms_since(t);
            worst = ms > worst ? ms : worst;
        }
        CHECK(answered == kFetches && worst < 1000);
        if (answered != kFetches || worst >= 1000)
            fprintf(stderr, "check_ipc_server_answer_unread: %d of %d fetches answered beside an unread answer, the "
                    "slowest in %ld ms (%s)\n", answered, kFetches, worst, why.c_str());
        /* the same answer to a receiver that reads it: every fd once, the message whole */
        int reader = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &reader, 2000));
        CHECK(send(reader, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size()));
        std::vector<int> got(kMany + 1, -1);
        std::string reply(tail.size() + 16, '\0');
        size_t n = 0, len = 0;
        CHECK_OK(fabpool_fd_recv_timed(reader, got.data(), got.size(), &n, &reply[0], reply.size(), &len, 5000));
        uint32_t code = 1;
        if (len >= 4)
            memcpy(&code, reply.data(), 4);
        size_t same = 0;
        for (size_t i = 0; i < n; i++) {
            struct stat st;
            same += fstat(got[i], &st) == 0 && st.st_ino == want.st_ino;
            close(got[i]);
        }
        CHECK(code == 0 && n == kMany && same == kMany && len == 4 + tail.size() &&
              reply.compare(4, tail.size(), tail) == 0);
        if (n != kMany || same != kMany)
            fprintf(stderr, "check_ipc_server_answer_unread: %zu fds came for %zu (%zu of them the block's)\n", n,
                    kMany, same);
        close(reader);
        CHECK(srv.served() == uint64_t(kFetches) + 2);
        /* the unread answer's connection closed at its deadline, 10 s after the answer began: it then reads a
         * message cut short (what came of it closed), and the server holds no fd of it */
        struct pollfd p = {unread, POLLRDHUP, 0};
        while (poll(&p, 1, 15000) == 1 && !(p.revents & (POLLRDHUP | POLLHUP)) && ms_since(t0) < 15000)
            usleep(10 * 1000);
        long dropped = ms_since(t0);
        CHECK(dropped >= 9000 && dropped < 15000);
        if (dropped < 9000 || dropped >= 15000)
            fprintf(stderr, "check_ipc_server_answer_unread: the unread answer's connection was closed after %ld "
                    "ms\n", dropped);
        CHECK(fd_count() == base + 1); /* the unread end: nothing of the connection's in the server */
        CHECK(fabpool_fd_recv_timed(unread, got.data(), got.size(), &n, &reply[0], reply.size(), &len, 5000) ==
              FABPOOL_ERR_IO);
        CHECK(fd_count() == base + 1);
        close(unread);
    }
    close(mem);
    CHECK(fd_count() == before);
}

/* A process that holds the token fills the server's slots with connections it leaves stalled mid-request, more
 * than the 16 it reads at once, while another process's request comes in pieces: the flood closes connections
 * of its own, never the other's, whose request completes and is served. */
static void check_ipc_server_flood_by_pid()
{
    int before = fd_count();
    int mem = memfd_create("ipc-by-pid", MFD_CLOEXEC);
    CHECK(mem >= 0);
    {
        fabpool_torch::ipc::Server srv(serve_copy_of(mem));
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000);
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id()), req = ipc_request(h);
        size_t half = req.size() / 2; /* past the start: the server takes it for a request */
        int go[2], said[2];
        CHECK(pipe2(go, O_CLOEXEC) == 0 && pipe2(said, O_CLOEXEC) == 0);
        pid_t kid = fork();
        if (kid == 0) { /* the slow receiver: half of its request, then the rest when told */
            char c = 'n';
            int s = -1;
            if (fabpool_fd_connect(name.c_str(), &s, 2000) == FABPOOL_OK &&
                send(s, req.data(), half, MSG_NOSIGNAL) == ssize_t(half) && write(said[1], "r", 1) == 1 &&
                read(go[0], &c, 1) == 1) {
                c = 'n';
                send(s, req.data() + half, req.size() - half, MSG_NOSIGNAL); /* refused: the answer says so */
                int fd = -1;
                size_t n = 0, len = 0;
                char reply[256];
                uint32_t code = 1;
                if (fabpool_fd_recv_timed(s, &fd, 1, &n, reply, sizeof reply, &len, 5000) == FABPOOL_OK && len >= 4)
                    memcpy(&code, reply, 4);
                c = code == 0 && n == 1 ? 'y' : 'n';
            }
            if (write(said[1], &c, 1) != 1)
                _exit(2);
            _exit(0);
        }
        CHECK(kid > 0);
        close(go[0]);
        close(said[1]);
        char c = 0;
        CHECK(read(said[0], &c, 1) == 1 && c == 'r');
        usleep(100 * 1000); /* its start in, its request read as far as it came */
        const int kFlood = 24;
        std::vector<int> flood;
        for (int i = 0; i < kFlood; i++) {
            int s = -1;
            CHECK_OK(fabpool_fd_connect(name.c_str(), &s, 2000));
            CHECK(send(s, req.data(), half, MSG_NOSIGNAL) == ssize_t(half));
            flood.push_back(s);
        }
        usleep(200 * 1000); /* each taken in: the table overfull */
        CHECK(write(go[1], "g", 1) == 1);
        c = 0;
        CHECK(read(said[0], &c, 1) == 1 && c == 'y');
        if (c != 'y')
            fprintf(stderr, "check_ipc_server_flood_by_pid: a request coming in pieces was closed for another "
                    "process's flood of %d stalled ones\n", kFlood);
        int wst = -1;
        CHECK(waitpid(kid, &wst, 0) == kid && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
        CHECK(srv.served() == 1 && srv.refused() >= uint64_t(kFlood + 1 - 16));
        for (int s : flood)
            close(s);
        close(go[1]);
        close(said[0]);
    }
    close(mem);
    CHECK(fd_count() == before);
}

/* The process is out of fds (RLIMIT_NOFILE: a PyTorch program that holds many, as the file_descriptor sharing
 * strategy does) while a receiver's connection waits in the listener's queue: the server cannot accept it, and
 * does not wake again and again on the listener that poll says readable at once (it woke some 48,000 times in
 * 500 ms, a core's worth, before): it rests a little and tries again, and answers the receiver once fds are
 * free. */
static void check_ipc_server_out_of_fds()
{
    int before = fd_count();
    int mem = memfd_create("ipc-no-fds", MFD_CLOEXEC);
    CHECK(mem >= 0);
    {
        fabpool_torch::ipc::Server srv(serve_copy_of(mem));
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000);
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id()), req = ipc_request(h);
        struct sockaddr_un a = {};
        a.sun_family = AF_UNIX;
        memcpy(a.sun_path + 1, name.data(), name.size()); /* abstract: a NUL first */
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(s >= 0);
        struct rlimit old;
        CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
        int lowest = fcntl(mem, F_DUPFD, 0); /* the lowest free fd number: a limit there leaves no room for one more */
        CHECK(lowest >= 0);
        close(lowest);
        struct rlimit none = {rlim_t(lowest), old.rlim_max};
        CHECK(setrlimit(RLIMIT_NOFILE, &none) == 0);
        socklen_t alen = socklen_t(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
        CHECK(connect(s, reinterpret_cast<struct sockaddr *>(&a), alen) == 0); /* no fd needed: queued, not taken */
        /* valgrind keeps RLIMIT_NOFILE itself: the kernel takes the connection, and valgrind closes it (EMFILE) */
        const char *pre = getenv("LD_PRELOAD");
        bool vg = pre && strstr(pre, "vgpreload");
        ssize_t sent = send(s, req.data(), req.size(), MSG_NOSIGNAL);
        CHECK(vg || sent == ssize_t(req.size()));
        usleep(50 * 1000);
        uint64_t w0 = srv.wakes();
        usleep(500 * 1000);
        uint64_t wakes = srv.wakes() - w0;
        CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
        CHECK(wakes < 100);
        if (wakes >= 100)
            fprintf(stderr, "check_ipc_server_out_of_fds: the server woke %llu times in 500 ms, out of fds with a "
                    "connection in its listener's queue\n", (unsigned long long)wakes);
        int got = -1;
        char reply[256];
        size_t n = 0, len = 0;
        uint32_t code = 1;
        fabpool_status st = fabpool_fd_recv_timed(s, &got, 1, &n, reply, sizeof reply, &len, 5000);
        if (len >= 4)
            memcpy(&code, reply, 4);
        if (vg)
            CHECK(st == FABPOOL_ERR_IO || (st == FABPOOL_OK && code == 0 && n == 1));
        else
            CHECK(st == FABPOOL_OK && code == 0 && n == 1 && srv.served() == 1);
        if (n == 1)
            close(got);
        close(s);
    }
    close(mem);
    CHECK(fd_count() == before);
}

/* The serve callback throws (std::bad_alloc, as Core's own may where memory is short) on the second request, after
 * it took an fd for the answer: that receiver is refused (FABPOOL_ERR_HOST_MEMORY), the fd closed, and the server
 * serves the next one; the process lives on, the server still listening. */
static void check_ipc_server_exception_closes_one()
{
    int before = fd_count();
    int mem = memfd_create("ipc-throws", MFD_CLOEXEC);
    CHECK(mem >= 0);
    {
        int calls = 0; /* the server's thread's alone */
        fabpool_torch::ipc::Server srv([mem, &calls](uint64_t, const std::string &, std::vector<int> *fds,
                                                     std::string *) {
            fds->push_back(dup(mem));
            if (++calls == 2)
                throw std::bad_alloc();
            return fds->back() >= 0 ? 0 : int(FABPOOL_ERR_IO);
        });
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000);
        for (int k = 0; k < 3; k++) {
            std::string why;
            fabpool_status st = fetch_status(h, &why);
            CHECK(st == (k == 1 ? FABPOOL_ERR_HOST_MEMORY : FABPOOL_OK));
            if (st != (k == 1 ? FABPOOL_ERR_HOST_MEMORY : FABPOOL_OK))
                fprintf(stderr, "check_ipc_server_exception_closes_one: fetch %d: %s (%s)\n", k,
                        fabpool_status_name(st), why.c_str());
        }
        CHECK(srv.served() == 2 && srv.refused() == 1 && srv.stopped() == nullptr);
    }
    close(mem);
    CHECK(fd_count() == before);
}

/* Every fetch of a receiver is answered with the sender's fd while processes of other users flood the sender's fd
 * server (FABPOOL_PEERS=any_user: they are let in): a connection whose request has come is never closed to make
 * room for theirs.  Run as its own test, since FABPOOL_PEERS is read once. */
static int check_ipc_server_flood()
{
    /* a receiver's own connections, of this user: no other user needed */
    check_ipc_server_stalled();
    check_ipc_server_answer_unread();
    check_ipc_server_flood_by_pid();
    check_ipc_server_out_of_fds();
    check_ipc_server_exception_closes_one();
    if (!other_user_can()) {
        printf("test_torch_core --ipc-flood: not root, no process of another user to flood with; the floods "
               "skipped\n");
        return t_failures ? t_done("test_torch_core --ipc-flood") : 77;
    }
    const char *peers = getenv("FABPOOL_PEERS");
    CHECK(peers && strcmp(peers, "any_user") == 0);
    int before = fd_count();
    int mem = memfd_create("ipc-flood", MFD_CLOEXEC);
    CHECK(mem >= 0);
    struct stat want;
    CHECK(fstat(mem, &want) == 0);
    const int kFetches = 50;
    int answered = 0;
    std::string first;
    {
        fabpool_torch::ipc::Server srv(serve_copy_of(mem));
        fabpool_torch::ipc::Handle h = ipc_handle_of(srv, 0x1000);
        h.desc = "d";
        /* 3 processes of uid 65534 connect and close at once; 5 of uids 65530-65534 each keep 100 connections
         * open, silent or with a head and the magic (a start without its token): more than the server's table
         * holds, all together */
        std::vector<conn_flood> floods(8);
        std::vector<pid_t> kids;
        uint32_t part[3] = {0, 100, 0};
        memcpy(&part[2], "FPRQ", 4);
        std::string name = fabpool_torch::ipc::socket_name(srv.pid(), srv.id());
        for (size_t i = 0; i < floods.size(); i++) {
            snprintf(floods[i].name, sizeof floods[i].name, "%s", name.c_str());
            floods[i].mode = i < 3 ? CONN_FLOOD_CLOSE : i % 2 ? CONN_FLOOD_SILENT : CONN_FLOOD_PART;
            memcpy(floods[i].part, part, sizeof part);
            floods[i].part_len = sizeof part;
            floods[i].ready = -1;
            unsigned uid = i < 3 ? OTHER_USER_UID : unsigned(OTHER_USER_UID - (i - 3));
            pid_t k = -1;
            CHECK(other_user_fork_as(uid, conn_flood_run, &floods[i], &k) == 0);
            kids.push_back(k);
        }
        usleep(300 * 1000); /* the queue full, the holders' connections in the server's table */
        for (int i = 0; i < kFetches; i++) {
            try {
                std::vector<int> fds = fabpool_torch::ipc::fetch(h);
                struct stat st;
                bool same = fds.size() == 1 && fstat(fds[0], &st) == 0 && st.st_ino == want.st_ino;
                answered += same;
                for (int fd : fds)
                    close(fd);
            } catch (const fabpool_torch::ipc::Error &e) {
                if (first.empty())
                    first = e.what();
            }
        }
        for (pid_t k : kids)
            kill(k, SIGKILL);
        for (pid_t k : kids)
            CHECK(other_user_wait(k) == -1); /* they flooded until killed */
        CHECK(srv.served() == uint64_t(answered) && srv.refused() > 0);
        /* a connection holding part of a start waits in the server's table, and the killed floods' held part of
         * theirs when they hung up: the server closes those at once (no more can come) and looks at this one
         * again every few ms, not at every turn of its loop (poll says readable at once while its bytes are
         * unread) */
        int part_conn = -1;
        CHECK_OK(fabpool_fd_connect(name.c_str(), &part_conn, 2000));
        CHECK(send(part_conn, part, sizeof part, MSG_NOSIGNAL) == ssize_t(sizeof part));
        usleep(50 * 1000);
        uint64_t w0 = srv.wakes();
        usleep(500 * 1000);
        uint64_t wakes = srv.wakes() - w0;
        CHECK(wakes < 1000);
        if (wakes >= 1000)
            fprintf(stderr, "check_ipc_server_flood: the server woke %llu times in 500 ms for one connection "
                    "holding part of a start, beside the floods' cut ones\n", (unsigned long long)wakes);
        close(part_conn);
    }
    CHECK(answered == kFetches);
    if (answered != kFetches)
        fprintf(stderr, "check_ipc_server_flood: %d of %d fetches answered; the first failure: %s\n", answered,
                kFetches, first.c_str());
    close(mem);
    CHECK(fd_count() == before);
    return t_done("test_torch_core --ipc-flood");
}

/* Another process posing as a tensor's sender: under the sender's socket
 * name once the sender's server is gone, or named by a handle on the pidfd
 * path.  It offers memory of its own (bytes of 0x66); the receiver must
 * refuse it with nothing mapped and no fd left open. */
struct Impostor {
    std::string name;          /* the socket name it takes */
    std::vector<off_t> sizes;  /* the sender's chunk sizes: what it offers */
    const fabpool_torch::ipc::Handle *h = nullptr;
    int token_mode = 0;        /* the third process's token fd: 0 other bytes, 1 none, 2 the sender's, inherited */
    int ready[2] = {-1, -1};   /* it writes one byte once it listens (or holds its fds) */
};

/* fds that the sim imports as device memory, sizes[i] bytes of 0x66 each */
static std::vector<int> impostor_memory(const std::vector<off_t> &sizes)
{
    std::vector<int> fds;
    std::vector<char> b(1 << 16, 0x66);
    for (off_t sz : sizes) {
        int fd = memfd_create("fabsim:impostor:dev0", MFD_CLOEXEC);
        if (fd < 0)
            break;
        fds.push_back(fd);
        if (ftruncate(fd, sz) != 0)
            break;
        for (off_t at = 0; at < sz; at += off_t(b.size()))
            if (pwrite(fd, b.data(), b.size(), at) < 0)
                break;
    }
    return fds;
}

static std::vector<off_t> chunk_sizes(const fabpool_torch::ipc::Handle &h)
{
    std::vector<off_t> v;
    for (int fd : h.fds) { /* the sender is this process: the numbers are its own fds */
        struct stat st;
        v.push_back(fstat(fd, &st) == 0 ? st.st_size : off_t(0));
    }
    return v;
}

/* The impostor server: answers the first connection with its memory, as a sender would.  Exit status 0: nothing
 * came from the receiver (it hung up before a byte was sent); 1: a request came; 2: it could not set up. */
static int impostor_serve(void *arg)
{
    Impostor *im = static_cast<Impostor *>(arg);
    std::vector<int> mem = impostor_memory(im->sizes);
    int ls = -1;
    if (mem.size() != im->sizes.size() || fabpool_fd_listen(im->name.c_str(), &ls) != FABPOOL_OK)
        return 2;
    char c = 1;
    if (write(im->ready[1], &c, 1) != 1)
        return 2;
    struct pollfd pf = {ls, POLLIN, 0};
    int conn = poll(&pf, 1, 10000) == 1 ? accept(ls, nullptr, nullptr) : -1;
    if (conn < 0)
        return 2;
    pf = {conn, POLLIN, 0};
    char req[256];
    ssize_t got = poll(&pf, 1, 5000) == 1 ? read(conn, req, sizeof req) : 0;
    uint32_t ok = 0;
    (void)fabpool_fd_send(conn, mem.data(), mem.size(), &ok, sizeof ok); /* "here are the fds" */
    close(conn);
    close(ls);
    return got > 0 ? 1 : 0;
}

/* The third process: memory of its own at the handle's fd numbers, and at its token fd number a token memfd of
 * other bytes, nothing, or the sender's own (inherited by fork: it names the sender's pid); it waits to be
 * killed. */
static int third_process(void *arg)
{
    Impostor *im = static_cast<Impostor *>(arg);
    std::vector<int> mem = impostor_memory(im->sizes);
    int tok = -1;
    bool ok = mem.size() == im->sizes.size() && fabpool_fd_token_make("not the sender..", 16, &tok) == FABPOOL_OK;
    for (size_t i = 0; ok && i < mem.size(); i++)
        ok = dup2(mem[i], im->h->fds[i]) == im->h->fds[i];
    if (ok && im->token_mode != 2)
        ok = im->token_mode == 1 ? close(im->h->token_fd) == 0 : dup2(tok, im->h->token_fd) == im->h->token_fd;
    char c = ok;
    if (write(im->ready[1], &c, 1) != 1 || !ok)
        return 2;
    for (;;)
        pause();
}

/* Starts fn in a child (of another user where other) and waits until it is ready; false if it is not. */
static bool impostor_start(Impostor *im, int (*fn)(void *), bool other, pid_t *pid)
{
    *pid = -1;
    if (pipe2(im->ready, O_CLOEXEC) != 0)
        return false;
    if (other) {
        if (other_user_fork(fn, im, pid) != 0)
            *pid = -1;
    } else {
        fflush(stdout);
        fflush(stderr);
        *pid = fork();
        if (*pid == 0) {
            (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(fn(im));
        }
    }
    close(im->ready[1]);
    char c = 0;
    bool up = *pid > 0 && read(im->ready[0], &c, 1) == 1 && c == 1;
    close(im->ready[0]);
    return up;
}

/* open_ipc of bytes is refused with FABPOOL_ERR_PERMISSION and a message with `word`, and maps nothing, keeps
 * no fd. */
static void check_refused(Core &core, const std::string &bytes, const char *word, const char *what)
{
    fabsim_ledger l0 = t_ledger();
    size_t v0 = core.ipc_views();
    int fds0 = fd_count();
    fabpool_status st = FABPOOL_OK;
    std::string msg = "it was opened";
    try {
        std::shared_ptr<void> v = core.open_ipc(0, bytes);
        msg += t_tag_ok(v.get(), 4096, 901) ? " (the sender's bytes)" : " (bytes that are not the sender's)";
    } catch (const fabpool_torch::ipc::Error &e) {
        st = e.status();
        msg = e.what();
    }
    bool ok = st == FABPOOL_ERR_PERMISSION && strstr(msg.c_str(), word) != nullptr;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "check_refused: %s: %s (%s)\n", what, msg.c_str(), fabpool_status_name(st));
    fabsim_ledger l1 = t_ledger();
    CHECK(core.ipc_views() == v0 && l1.mappings == l0.mappings && l1.handles == l0.handles);
    CHECK(fd_count() == fds0);
}

/* The sender's fd server is gone (the sender exited; here its server ended) and another process binds the same
 * socket name, of this user or of another one: the receiver refuses it before sending a byte. */
static void check_ipc_impostor(Core &core)
{
    void *p = core.malloc(0, 3 * MiB, nullptr);
    size_t u = 0;
    CHECK(core.usable_size(p, &u));
    t_put_tag(p, u, 901);
    CHECK_CU(cuCtxSynchronize());
    fabpool_torch::ipc::Handle h;
    std::string why;
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(p).handle, &h, &why));
    {
        fabpool_torch::ipc::Server gone([](uint64_t, const std::string &, std::vector<int> *, std::string *m) {
            *m = "no block";
            return int(FABPOOL_ERR_NOT_FOUND);
        });
        h.server_id = gone.id();
        memcpy(h.token, gone.token(), fabpool_torch::ipc::kTokenBytes);
        h.token_fd = gone.token_fd();
    }
    std::string bytes = fabpool_torch::ipc::encode(h);
    Impostor im;
    im.name = fabpool_torch::ipc::socket_name(h.pid, h.server_id);
    im.sizes = chunk_sizes(h);
    for (bool other : {false, true}) {
        if (other && !other_user_can()) {
            printf("test_torch_core: ipc: not root, no process of another user to pose as the sender; skipped\n");
            continue;
        }
        pid_t pid = -1;
        bool up = impostor_start(&im, impostor_serve, other, &pid);
        CHECK(up);
        if (up)
            check_refused(core, bytes, "refused the listener", other ? "another user's listener" : "another pid's");
        if (pid > 0)
            CHECK(other_user_wait(pid) == 0); /* it got no byte of the request */
    }
    core.free(p);
    core.empty_cache(PoolId{0, 0});
}

/* A handle of a shared block, its key and descriptor made to name another live block that was never shared
 * (a descriptor names no secret; the token is the process's): refused, and the sender exports nothing for it. */
static void check_ipc_unshared(Core &core)
{
    void *p = core.malloc(0, 3 * MiB, nullptr), *q = core.malloc(0, 3 * MiB, nullptr);
    fabpool_torch::ipc::Handle h, hq;
    std::string why;
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(p).handle, &h, &why));
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(q).handle, &hq, &why)); /* q's descriptor, as one could guess it */
    core.free(q);
    q = core.malloc(0, 3 * MiB, nullptr); /* live again, at the same address or not, and never shared since */
    fabpool_torch::ipc::Handle t = h;
    t.key = uint64_t(uintptr_t(q));
    t.desc = hq.desc;
    uint64_t refused0 = 0, served0 = core.ipc_served(&refused0), refused1 = 0;
    bool refused = false;
    try {
        core.open_ipc(0, fabpool_torch::ipc::encode(t));
    } catch (const std::exception &e) {
        refused = strstr(e.what(), "never shared") != nullptr;
    }
    CHECK(refused);
    CHECK(core.ipc_served(&refused1) == served0 && refused1 == refused0 + 1);
    core.free(p);
    core.free(q);
    core.empty_cache(PoolId{0, 0});
}

/* A private pool's block shared, freed, and its memory given to the next tensor of its size (the same address, the
 * same chunks, so the same descriptor): the freed block's handle is refused, never served the new tensor. */
static void check_ipc_freed_pool_block_refused(Core &core)
{
    const PoolId P{0, 24};
    size_t shares0 = core.ipc_shares();
    core.create_or_incref(0, P, nullptr);
    core.begin_pool(0, P, [](Stream) { return true; });
    void *p = core.malloc(0, 5 * MiB, nullptr);
    std::string handle = core.share_ipc(p).handle;
    core.free(p);
    void *q = core.malloc(0, 5 * MiB, nullptr);
    core.end_pool(0, P);
    CHECK(q == p);
    CHECK(core.ipc_shares() == shares0);
    bool refused = false;
    try {
        core.open_ipc(0, handle);
    } catch (const std::runtime_error &e) {
        refused = strstr(e.what(), "no longer live") != nullptr;
    }
    CHECK(refused);
    core.free(q);
    core.release_pool(0, P);
    core.release_pool(0, P);
    core.empty_cache(P);
}

/* One thread shares a block again and again while another frees it, for many rounds (the window a share could slip
 * in after the free is narrow: thousands of rounds to meet it, at most 5 s of them): once both are done no share is left (none names
 * freed memory, which the next block may reuse), and the freed block's last handle is refused. */
static void check_ipc_share_free_race(Core &core)
{
    size_t shares0 = core.ipc_shares();
    auto t0 = std::chrono::steady_clock::now();
    for (int round = 0; round < 20000 && ms_since(t0) < 5000; round++) { /* fewer under valgrind */
        void *p = core.malloc(0, 3 * MiB, nullptr);
        std::atomic<bool> go{false};
        std::string last;
        std::thread sharer([&] {
            while (!go.load())
                ;
            for (;;) {
                try {
                    last = core.share_ipc(p).handle;
                } catch (const std::invalid_argument &) {
                    return; /* freed */
                }
            }
        });
        go.store(true);
        for (volatile int spin = 0; spin < (round % 300) * 10; spin++)
            ;
        core.free(p);
        sharer.join();
        CHECK(core.ipc_shares() == shares0);
        if (core.ipc_shares() != shares0) {
            fprintf(stderr, "check_ipc_share_free_race: a share outlived its block in round %d\n", round);
            break;
        }
        if (!last.empty()) {
            bool refused = false;
            try {
                core.open_ipc(0, last);
            } catch (const std::runtime_error &) {
                refused = true;
            }
            CHECK(refused);
        }
    }
    core.empty_cache(PoolId{0, 0});
}

/* A receiver of one shared block (it holds the process's token) that names another block shared with someone else,
 * by its address and its descriptor (neither is a secret): refused, for the key of a share is random; the other
 * block's own handle is served; a block shared twice as it was keeps its key. */
static void check_ipc_shared_elsewhere(Core &core)
{
    void *p = core.malloc(0, 3 * MiB, nullptr), *q = core.malloc(0, 3 * MiB, nullptr);
    fabpool_torch::ipc::Handle h, hq, hq2;
    std::string why;
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(p).handle, &h, &why));
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(q).handle, &hq, &why));
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(q).handle, &hq2, &why));
    CHECK(hq2.key == hq.key && hq.key != h.key);
    CHECK(hq.key != uint64_t(uintptr_t(q)) && h.key != uint64_t(uintptr_t(p)));
    fabpool_torch::ipc::Handle t = h;
    t.key = uint64_t(uintptr_t(q));
    t.desc = hq.desc;
    t.fds = hq.fds;
    uint64_t refused0 = 0, served0 = core.ipc_served(&refused0), refused1 = 0;
    std::string got;
    fabpool_status st = fetch_status(t, &got);
    CHECK(st == FABPOOL_ERR_NOT_FOUND && strstr(got.c_str(), "never shared") != nullptr);
    if (st != FABPOOL_ERR_NOT_FOUND)
        fprintf(stderr, "check_ipc_shared_elsewhere: a guessed key: %s (%s)\n", fabpool_status_name(st), got.c_str());
    CHECK(core.ipc_served(&refused1) == served0 && refused1 == refused0 + 1);
    CHECK(fetch_status(hq, &got) == FABPOOL_OK); /* the handle it was shared with */
    CHECK(core.ipc_served(&refused1) == served0 + 1);
    core.free(p);
    core.free(q);
    CHECK(fetch_status(hq, &got) == FABPOOL_ERR_NOT_FOUND); /* gone with the block */
    core.empty_cache(PoolId{0, 0});
}

/* A handle naming a third process on the pidfd path (no server reached): that process does not hold the sender's
 * token (a forked child holds the sender's memfd, which names the sender's pid), so no fd of it is copied. */
static void check_ipc_third_process(Core &core)
{
    int pfd = -1;
    if (fabpool_fd_pidfd_open(getpid(), &pfd) != FABPOOL_OK) { /* valgrind does not know pidfd_open */
        printf("test_torch_core: no pidfd_open here (%s): the pidfd path's cases skipped\n", fabpool_last_error());
        return;
    }
    close(pfd);
    void *p = core.malloc(0, 3 * MiB, nullptr);
    fabpool_torch::ipc::Handle h;
    std::string why;
    CHECK(fabpool_torch::ipc::decode(core.share_ipc(p).handle, &h, &why));
    Impostor im;
    im.h = &h;
    im.sizes = chunk_sizes(h);
    for (int mode : {0, 1, 2}) {
        im.token_mode = mode;
        pid_t pid = -1;
        bool up = impostor_start(&im, third_process, false, &pid);
        CHECK(up);
        fabpool_torch::ipc::Handle t = h;
        t.pid = pid;
        t.server_id ^= 1; /* no server of that name: the pidfd path */
        if (up)
            check_refused(core, fabpool_torch::ipc::encode(t), "does not hold this group's token",
                          mode == 2   ? "a child forked from the sender"
                          : mode == 1 ? "a third process without the token fd"
                                      : "a third process with another token");
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
    core.free(p);
    core.empty_cache(PoolId{0, 0});
}

/* The allocation history (_record_memory_history): every allocation and free with its segment's life, the free
 * of a block used on a busy stream completed only after that stream's work, a private pool's freed block kept as
 * its segment, an OOM with what the driver had free, the stacks asked for, the newest max_entries kept, skipped
 * actions, and nothing recorded once it is off. */
static void check_history(Core &core, int64_t held0)
{
    using H = fabpool_torch::HistoryEvent;
    CUstream a = new_stream(), m = new_stream();
    std::atomic<uint64_t> tick{0};
    fabpool_torch::HistoryOptions o;
    o.max_entries = 1000;
    o.stacks_alloc = o.stacks_trace = o.stacks_free = true;
    o.gather = [] { return std::make_shared<int>(42); };
    o.clock = [&tick] { return ++tick; };
    CHECK(!core.history_on());
    void *before = core.malloc(0, MiB, a); /* allocated before the history: its segment is not new */
    core.record_history(true, o, true);
    CHECK(core.history_on());
    void *x = core.malloc(0, 3 * MiB, a);
    void *y = core.malloc(0, 100000, a);
    for (auto &r : core.segments(PoolId{0, 0})) /* a live block's stack, as PyTorch's segments give it */
        CHECK(r.ptr == before ? !r.stack : (r.stack && *std::static_pointer_cast<int>(r.stack) == 42));
    core.free(x);
    core.free(y);
    core.free(before);
    size_t fr = 0, total = 0;
    cuMemGetInfo(&fr, &total);
    bool oom = false;
    try {
        core.malloc(0, total * 2, a);
    } catch (const OutOfMemory &) {
        oom = true;
    }
    CHECK(oom);
    /* a private pool's block used on a busy stream: its free completes after that stream's work, and the pool
     * keeps it (its segment stays until the pool gives it back) */
    const PoolId P{0, 21};
    core.create_or_incref(0, P, nullptr);
    core.begin_pool(0, P, [](Stream) { return true; });
    void *p1 = core.malloc(0, MiB, a);
    core.end_pool(0, P);
    CHECK(core.record_stream(p1, m));
    S_hold(m);
    core.free(p1);
    bool pending_listed = false;
    for (auto &r : core.segments(PoolId{0, 0}))
        pending_listed |= r.ptr == p1 && r.pending && !r.live;
    CHECK(pending_listed);
    S_release(m);
    void *z = core.malloc(0, 4096, a); /* polls: p1's free completes */
    core.free(z);
    core.begin_pool(0, P, [](Stream) { return true; });
    void *p2 = core.malloc(0, MiB, a);
    CHECK(p2 == p1);
    core.free(p2);
    core.end_pool(0, P);
    while (core.use_count(0, P) > 0) /* create_or_incref and each begin_pool took one */
        core.release_pool(0, P);
    core.empty_cache(PoolId{0, 0});

    std::vector<H> h = core.history();
    struct Want {
        H::Action a;
        void *ptr;
    };
    const Want want[] = {
        {H::SegmentAlloc, x},   {H::Alloc, x},          {H::SegmentAlloc, y},       {H::Alloc, y},
        {H::FreeRequested, x},  {H::FreeCompleted, x},  {H::SegmentFree, x},        {H::FreeRequested, y},
        {H::FreeCompleted, y},  {H::SegmentFree, y},    {H::FreeRequested, before}, {H::FreeCompleted, before},
        {H::SegmentFree, before}, {H::Oom, nullptr},    {H::SegmentAlloc, p1},      {H::Alloc, p1},
        {H::FreeRequested, p1}, {H::FreeCompleted, p1}, {H::SegmentAlloc, z},       {H::Alloc, z},
        {H::FreeRequested, z},  {H::FreeCompleted, z},  {H::SegmentFree, z},        {H::Alloc, p1},
        {H::FreeRequested, p1}, {H::FreeCompleted, p1}, {H::SegmentFree, p1}};
    const size_t n = sizeof want / sizeof want[0];
    CHECK(h.size() == n);
    for (size_t i = n; i < h.size(); i++)
        fprintf(stderr, "history %zu: action %d addr %p (more than expected)\n", i, int(h[i].action), (void *)h[i].addr);
    for (size_t i = 0; i < h.size() && i < n; i++) {
        bool same = h[i].action == want[i].a && (want[i].a == H::Oom || h[i].addr == uintptr_t(want[i].ptr));
        if (!same)
            fprintf(stderr, "history %zu: action %d addr %p, expected %d %p\n", i, int(h[i].action),
                    (void *)h[i].addr, int(want[i].a), want[i].ptr);
        CHECK(same);
        CHECK(h[i].device == 0 && h[i].stream == (Stream)a && (i == 0 || h[i].time > h[i - 1].time));
        if (h[i].action == H::Oom)
            continue;
        bool asked = h[i].action == H::Alloc || h[i].action == H::FreeRequested; /* the caller's stack */
        CHECK(bool(h[i].context) == asked);
        CHECK(h[i].pool == (h[i].addr == uintptr_t(p1) ? P : PoolId{0, 0}) || h[i].action == H::Oom);
    }
    if (h.size() == n) {
        CHECK(h[1].size == 3 * MiB && h[3].size >= 100000);
        CHECK(h[13].size == total * 2 && h[13].addr > 0 && h[13].addr <= fr); /* the driver's free bytes */
    }

    /* the newest max_entries, skipped actions, and off */
    o.max_entries = 4;
    o.skip = 1u << H::FreeRequested | 1u << H::SegmentAlloc | 1u << H::SegmentFree;
    o.stacks_alloc = o.stacks_free = false;
    core.record_history(true, o, true);
    std::vector<void *> live;
    for (int i = 0; i < 6; i++)
        live.push_back(core.malloc(0, 4096, a));
    h = core.history();
    CHECK(h.size() == 4 && h[0].addr == uintptr_t(live[2]) && h[3].addr == uintptr_t(live[5]));
    for (auto &e : h)
        CHECK(e.action == H::Alloc && !e.context);
    free_all(core, live);
    h = core.history();
    CHECK(h.size() == 4 && h[3].action == H::FreeCompleted && h[3].addr == uintptr_t(live[5]));
    core.record_history(false, o, false);
    CHECK(!core.history_on() && core.history().empty());
    core.free(core.malloc(0, 4096, a));
    CHECK(core.history().empty());
    all_back(core, held0, {a, m});
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--ipc-child") == 0)
        return ipc_child(argv[2]);
    if (argc == 2 && strcmp(argv[1], "--ipc-flood") == 0)
        return check_ipc_server_flood();
    t_driver_init();
    if (!t_ledger_p) {
        printf("test_torch_core: the simulated driver is not loaded; skipped\n");
        return 0;
    }
    *(void **)&S_hold = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&S_release = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    fabpool_torch_set_verbose(0);
    int64_t held0 = t_held();
    if (argc == 2 && strcmp(argv[1], "--two-devices") == 0) {
        {
            Core core(&rt);
            check_other_device_context(core);
        }
        CHECK(fabpool_torch_shutdown() == FABPOOL_OK);
        CHECK(t_held() == held0);
        return t_done("test_torch_core --two-devices");
    }
    {
        Core core(&rt);
        check_capture_of_the_owner(core, held0); /* first: the default pool's first stream becomes its owner */
        check_stats(core, held0);
        check_record_stream(core);
        check_small_alignment(core);
        check_oom(core, held0);
        check_fraction(core, held0);
        check_graph_pool(core, held0);
        check_shared_pool(core, held0);
        check_nested_pools(core, held0);
        check_pool_record_stream(core, held0);
        check_external_pool(core);
        check_threads(core, held0);
        check_ipc(core, held0, argv[0]);
        check_ipc_answer_closed();
        check_ipc_answer_status();
        check_ipc_server_strangers();
        check_ipc_impostor(core);
        check_ipc_unshared(core);
        check_ipc_shared_elsewhere(core);
        check_ipc_freed_pool_block_refused(core);
        check_ipc_share_free_race(core);
        check_ipc_third_process(core);
        check_ipc_pools(core, held0);
        check_history(core, held0);
    }
    check_external_pool_teardown();
    CHECK(t_held() == held0);
    CHECK(fabpool_torch_shutdown() == FABPOOL_OK);
    return t_done("test_torch_core");
}
