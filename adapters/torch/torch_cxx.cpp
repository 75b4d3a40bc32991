/* torch_cxx.cpp - fabpool as PyTorch's CUDA allocator: a
 * c10::cuda::CUDACachingAllocator::CUDAAllocator (PyTorch 2.11's whole
 * interface) on torch_core.cpp, installed where torch.cuda.memory.
 * change_current_allocator installs one (the `allocator` pointer), and as
 * c10::GetAllocator(kCUDA), so that torch.accelerator and C++ callers reach
 * it too.  docs/integration.md says what it keeps of PyTorch's contract.
 *
 * The core throws standard exceptions; here they become PyTorch's (an
 * allocation the device cannot serve: c10::OutOfMemoryError, which Python
 * sees as torch.OutOfMemoryError, after PyTorch's OOM observers have run).
 * The CUDA runtime is PyTorch's own (the libcudart torch loaded). */
#include <c10/core/Allocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "fabpool_torch.h"
#include "torch_core.hpp"

namespace CA = c10::cuda::CUDACachingAllocator;
using fabpool_torch::Stream;

namespace {
/* The core's history actions as PyTorch's, in the order of fabpool_torch::HistoryEvent::Action. */
const CA::TraceEntry::Action kTraceAction[fabpool_torch::HistoryEvent::kActions] = {
    CA::TraceEntry::ALLOC,         CA::TraceEntry::FREE_REQUESTED, CA::TraceEntry::FREE_COMPLETED,
    CA::TraceEntry::SEGMENT_ALLOC, CA::TraceEntry::SEGMENT_FREE,   CA::TraceEntry::OOM};
}  // namespace

namespace {

void raw_delete_fn(void *ptr);

/* The CUDA runtime calls the core needs.  Every error is cleared
 * (cudaGetLastError): PyTorch checks the thread's last error after its
 * kernels, and a query's cudaErrorNotReady must not show there. */
class CudaRuntime final : public fabpool_torch::Runtime {
public:
    bool capturing(Stream s) override
    {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(static_cast<cudaStream_t>(s), &st) != cudaSuccess) {
            (void)cudaGetLastError();
            return true;  /* e.g. the legacy stream beside a global-mode capture */
        }
        return st != cudaStreamCaptureStatusNone;
    }

    void *event_record(int device, Stream s) override
    {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        Event *e = take(device);
        if (!e)
            return nullptr;
        if (cudaEventRecord(e->ev, static_cast<cudaStream_t>(s)) != cudaSuccess) {
            (void)cudaGetLastError();
            event_release(e);
            return nullptr;
        }
        return e;
    }

    bool event_done(void *ev) override
    {
        cudaError_t r = cudaEventQuery(static_cast<Event *>(ev)->ev);
        if (r != cudaSuccess)
            (void)cudaGetLastError();
        return r == cudaSuccess;
    }

    void event_wait(void *ev) override
    {
        if (cudaEventSynchronize(static_cast<Event *>(ev)->ev) != cudaSuccess)
            (void)cudaGetLastError();
    }

    void event_release(void *ev) override
    {
        Event *e = static_cast<Event *>(ev);
        std::lock_guard<std::mutex> lk(mu_);
        spare_.push_back(e);
    }

    void device_sync(int device) override
    {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        if (cudaDeviceSynchronize() != cudaSuccess)
            (void)cudaGetLastError();
    }

    void mem_info(int device, size_t *free_bytes, size_t *total) override
    {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        *free_bytes = *total = 0;
        if (cudaMemGetInfo(free_bytes, total) != cudaSuccess)
            (void)cudaGetLastError();
    }

    int relax() override
    {
        cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess)
            (void)cudaGetLastError();
        return static_cast<int>(m);
    }

    void unrelax(int old) override
    {
        cudaStreamCaptureMode m = static_cast<cudaStreamCaptureMode>(old);
        if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess)
            (void)cudaGetLastError();
    }

private:
    /* events are made once per device and reused */
    struct Event {
        cudaEvent_t ev;
        int device;
    };
    std::mutex mu_;
    std::vector<Event *> spare_;

    Event *take(int device)
    {
        {
            std::lock_guard<std::mutex> lk(mu_);
            for (size_t i = spare_.size(); i-- > 0;)
                if (spare_[i]->device == device) {
                    Event *e = spare_[i];
                    spare_.erase(spare_.begin() + std::ptrdiff_t(i));
                    return e;
                }
        }
        cudaEvent_t ev = nullptr;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        return new Event{ev, device};
    }
};

/* torch.cuda.MemPool(allocator=...): that allocator serves its pool. */
class TorchExternal final : public fabpool_torch::External {
public:
    explicit TorchExternal(std::shared_ptr<CA::CUDAAllocator> a) : a_(std::move(a)) {}
    void *alloc(size_t size, Stream s) override { return a_->raw_alloc_with_stream(size, static_cast<cudaStream_t>(s)); }
    void free(void *ptr) override { a_->raw_delete(ptr); }

private:
    std::shared_ptr<CA::CUDAAllocator> a_;
};

/* A private pool's live blocks, for graph trees (torch.compile's
 * reduce-overhead mode). */
struct PoolCheckpoint final : CA::AllocatorState {
    std::shared_ptr<fabpool_torch::PoolState> state;
};

/* The core's standard exceptions as PyTorch's. */
template <class F> auto translate(F &&f) -> decltype(f())
{
    try {
        return f();
    } catch (const c10::Error &) {
        throw;
    } catch (const std::exception &e) {
        TORCH_CHECK(false, e.what());
    }
}

class FabpoolAllocator final : public CA::CUDAAllocator {
public:
    FabpoolAllocator() : core_(&runtime_) {}

    /* ------------------------------------------------ allocation */

    c10::DataPtr allocate(size_t size) override
    {
        constexpr size_t one_exa_bytes = 1152921504606846976ULL;
        TORCH_CHECK_WITH(OutOfMemoryError, size < one_exa_bytes,
                         "CUDA out of memory. Tried to allocate more than 1EB memory.");
        c10::DeviceIndex device = c10::cuda::current_device();
        void *p = size ? malloc(device, size, c10::cuda::getCurrentCUDAStream(device).stream()) : nullptr;
        return {p, p, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_fn; }

    void *raw_alloc(size_t nbytes) override
    {
        if (nbytes == 0)
            return nullptr;
        c10::DeviceIndex device = c10::cuda::current_device();
        return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
    }

    void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override
    {
        if (nbytes == 0)
            return nullptr;
        return malloc(c10::cuda::current_device(), nbytes, stream);
    }

    void raw_delete(void *ptr) override
    {
        if (!ptr)
            return;
        if (const c10::impl::PyInterpreter *interp = c10::impl::GPUTrace::get_trace())
            (*interp)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
        fabpool_torch::Freed f = translate([&] { return core_.free(ptr); });
        if (c10::memoryProfilingEnabled())
            report(ptr, -int64_t(f.usable), f.device);
    }

    void copy_data(void *dest, const void *src, std::size_t count) const final
    {
        C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
    }

    /* ------------------------------------------------ state */

    void init(int /*device_count*/) override { initialized_ = true; }
    bool initialized() override { return initialized_; }
    void enable(bool value) override { enabled_ = value; }
    bool isEnabled() const override { return enabled_; }
    std::string name() override { return "fabpool"; }

    double getMemoryFraction(c10::DeviceIndex device) override
    {
        return translate([&] { return core_.fraction(device); });
    }

    void setMemoryFraction(double fraction, c10::DeviceIndex device) override
    {
        translate([&] { core_.set_fraction(device, fraction); });
    }

    std::vector<CA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex /*device*/) override { return {}; }

    void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override
    {
        translate([&] { core_.empty_cache(mempool_id); });
    }

    void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override
    {
        size_t l = translate([&] { return core_.largest_free(device); });
        *largestBlock = std::max(*largestBlock, l);
    }

    void *getBaseAllocation(void *ptr, size_t *size) override
    {
        size_t u = 0;
        TORCH_CHECK(core_.usable_size(ptr, &u), "fabpool: invalid device pointer: ", ptr);
        if (size)
            *size = u;
        return ptr;
    }

    using CA::CUDAAllocator::recordStream;
    void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override
    {
        /* an empty tensor, or memory that is not this allocator's (another
         * process's, through IPC): nothing to do, as for PyTorch's */
        if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn)
            return;
        TORCH_INTERNAL_ASSERT(core_.record_stream(ptr.get(), stream.stream()), "fabpool: recordStream: no live block at ",
                              ptr.get());
    }

    /* ------------------------------------------------ statistics */

    c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override
    {
        fabpool_torch::DeviceStats s = translate([&] { return core_.stats(device); });
        c10::CachingDeviceAllocator::DeviceStats out;
        for (size_t i = 0; i < 3; i++) {
            out.allocation[i] = stat(s.allocation[i]);
            out.active[i] = out.allocation[i];
            out.allocated_bytes[i] = stat(s.allocated_bytes[i]);
            out.active_bytes[i] = out.allocated_bytes[i];
            out.requested_bytes[i] = stat(s.requested_bytes[i]);
        }
        /* fabpool's memory is not split by PyTorch's small and large pools */
        out.segment[0] = stat(s.segment);
        out.reserved_bytes[0] = stat(s.reserved_bytes);
        out.num_alloc_retries = s.num_alloc_retries;
        out.num_ooms = s.num_ooms;
        out.num_sync_all_streams = s.num_sync_all_streams;
        out.num_device_alloc = s.num_device_alloc;
        out.num_device_free = s.num_device_free;
        out.max_split_size = -1;  /* blocks are never split */
        return out;
    }

    void resetAccumulatedStats(c10::DeviceIndex device) override
    {
        translate([&] { core_.reset_accumulated(device); });
    }

    void resetPeakStats(c10::DeviceIndex device) override
    {
        translate([&] { core_.reset_peak(device); });
    }

    CA::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0}, bool include_traces = true) override
    {
        CA::SnapshotInfo info;
        /* one segment per block: fabpool's blocks are not carved from
         * segments that PyTorch could walk */
        for (const auto &r : translate([&] { return core_.segments(mempool_id); })) {
            c10::CachingDeviceAllocator::SegmentInfo seg;
            seg.device = static_cast<c10::DeviceIndex>(r.device);
            seg.address = reinterpret_cast<size_t>(r.ptr);
            seg.total_size = r.usable;
            seg.requested_size = r.live ? r.size : 0;
            seg.allocated_size = r.live ? r.usable : 0;
            seg.active_size = r.live || r.pending ? r.usable : 0;
            seg.stream = r.stream;
            seg.is_large = r.size > fabpool_torch::kSmallSize;
            seg.is_expandable = false;
            seg.owner_private_pool_id = r.pool;
            c10::CachingDeviceAllocator::BlockInfo b;
            b.size = r.usable;
            b.requested_size = r.size;
            b.allocated = r.live;
            b.active = r.live || r.pending; /* freed, waiting for other streams: "active_pending_free" */
            b.context_when_allocated = std::static_pointer_cast<c10::GatheredContext>(r.stack);
            seg.context_when_allocated = b.context_when_allocated;
            seg.blocks.push_back(b);
            info.segments.push_back(std::move(seg));
        }
        int devices = std::max(core_.devices(), int(c10::cuda::device_count()));
        info.device_traces.resize(size_t(devices));
        if (include_traces) {
            for (auto &e : core_.history()) {
                if (e.device < 0 || size_t(e.device) >= info.device_traces.size())
                    info.device_traces.resize(size_t(e.device) + 1);
                auto &t = info.device_traces[size_t(e.device)];
                t.emplace_back(kTraceAction[e.action], static_cast<c10::DeviceIndex>(e.device), size_t(e.addr), e.size,
                               e.stream, e.pool, c10::approx_time_t(0),
                               std::static_pointer_cast<c10::GatheredContext>(e.context));
                /* the time as PyTorch's snapshot() leaves it for its Python side: microseconds of the Unix epoch */
                t.back().time_.t_ = static_cast<time_t>(e.time);
            }
        }
        auto &md = info.config_metadata;
        md.garbage_collection_threshold = 0;
        md.max_split_size = SIZE_MAX;
        md.pinned_num_register_threads = 0;
        md.expandable_segments = false;
        md.release_lock_on_malloc = false;
        md.pinned_use_host_register = false;
        md.graph_capture_record_stream_reuse = false;
        md.last_allocator_settings = "fabpool";
        return info;
    }

    bool isHistoryEnabled() override { return core_.history_on(); }

    /* torch.cuda.memory._record_memory_history: the core records each allocation, free and segment (a block,
     * as snapshot() lists them) with the time in microseconds of the Unix epoch (snapshot's time_us) and, as
     * `when` asks, the stacks context_recorder gathers */
    void recordHistory(bool enabled, CA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                       CA::RecordContext when, bool clearHistory,
                       const std::vector<std::string> &skip_actions) override
    {
        fabpool_torch::HistoryOptions o;
        o.max_entries = alloc_trace_max_entries;
        for (const auto &a : skip_actions) {
            CA::TraceEntry::Action act = c10::CachingDeviceAllocator::parseTraceEntryAction(a);
            for (unsigned k = 0; k < fabpool_torch::HistoryEvent::kActions; k++)
                if (kTraceAction[k] == act)
                    o.skip |= 1u << k;
        }
        if (context_recorder && when != CA::RecordContext::NEVER) {
            o.stacks_alloc = true;
            o.stacks_trace = when >= CA::RecordContext::ALLOC;
            o.stacks_free = when == CA::RecordContext::ALL;
            o.gather = [context_recorder] { return std::shared_ptr<void>(context_recorder()); };
        }
        o.clock = [] {
            return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
        };
        core_.record_history(enabled, std::move(o), clearHistory);
    }

    void attachOutOfMemoryObserver(CA::OutOfMemoryObserver observer) override
    {
        std::lock_guard<std::mutex> lk(mu_);
        observers_.push_back(std::move(observer));
    }

    void attachAllocatorTraceTracker(CA::AllocatorTraceTracker tracker) override
    {
        /* kept, never called: fabpool has no segments to announce */
        std::lock_guard<std::mutex> lk(mu_);
        trackers_.push_back(std::move(tracker));
    }

    /* ------------------------------------------------ private pools */

    void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                             std::function<bool(cudaStream_t)> filter) override
    {
        translate([&] {
            core_.begin_pool(device, mempool_id,
                             [f = std::move(filter)](Stream s) { return f(static_cast<cudaStream_t>(s)); });
        });
    }

    void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
    {
        translate([&] { core_.end_pool(device, mempool_id); });
    }

    void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
    {
        translate([&] { core_.release_pool(device, mempool_id); });
    }

    int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override
    {
        return core_.use_count(device, mempool_id);
    }

    void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                            std::shared_ptr<CA::CUDAAllocator> allocator = nullptr) override
    {
        std::shared_ptr<fabpool_torch::External> ext;
        if (allocator && allocator.get() != this)
            ext = std::make_shared<TorchExternal>(std::move(allocator));
        translate([&] { core_.create_or_incref(device, mempool_id, std::move(ext)); });
    }

    void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override
    {
        translate([&] { core_.set_use_on_oom(device, mempool_id, use_on_oom); });
    }

    void setNoSplit(c10::DeviceIndex /*device*/, c10::MempoolId_t /*mempool_id*/) override
    {
        /* fabpool never splits a block */
    }

    bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                  const std::unordered_set<void *> &expected_live_allocations) override
    {
        return translate([&] { return core_.check_live(device, mempool_id, expected_live_allocations); });
    }

    std::shared_ptr<CA::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override
    {
        auto cp = std::make_shared<PoolCheckpoint>();
        cp->state = translate([&] { return core_.checkpoint(device, id); });
        return cp;
    }

    CA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                               std::shared_ptr<CA::AllocatorState> pps) override
    {
        auto cp = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
        TORCH_CHECK(cp && cp->state, "fabpool: setCheckpointPoolState: not a checkpoint of fabpool's allocator");
        TORCH_CHECK(cp->state->device == device, "fabpool: setCheckpointPoolState: the checkpoint is of device ",
                    cp->state->device, ", not ", int(device));
        std::vector<void *> freed, made;
        translate([&] { core_.restore(*cp->state, &freed, &made); });
        CA::CheckpointDelta delta;
        delta.ptrs_freed = std::move(freed);
        for (void *p : made)
            delta.dataptrs_allocd.emplace_back(p, p, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
        return delta;
    }

    /* ------------------------------------------------ other processes, other devices */

    /* torch.multiprocessing: the block's chunks exported (fabpool_block_export), their fds served to the
     * receiver over a socket; PyTorch's IPC reference counts keep the block until every receiver lets go */
    CA::ShareableHandle shareIpcHandle(void *ptr) override
    {
        fabpool_torch::IpcShare s = translate([&] { return core_.share_ipc(ptr); });
        return CA::ShareableHandle{s.offset, std::move(s.handle)};
    }

    /* the sender's block mapped here; PyTorch adds the offset.  The deleter waits for the device, then unmaps */
    std::shared_ptr<void> getIpcDevPtr(std::string handle) override
    {
        c10::DeviceIndex device = c10::cuda::current_device();
        return translate([&] { return core_.open_ipc(device, handle); });
    }

    void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override
    {
        c10::cuda::CUDAGuard guard(dev);
        cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else
            C10_CUDA_CHECK(err);
    }

    cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                            cudaStream_t stream, bool /*p2p_enabled*/) override
    {
        if (dstDevice == srcDevice)
            return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
        /* fabpool maps a pool's memory for its own device (and the devices
         * FABPOOL_CONF's peers names): between devices the peer copy, which
         * needs no mapping */
        return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
    }

    /* for the test of C++ callers */
    fabpool_torch::Core &core() { return core_; }

private:
    CudaRuntime runtime_;
    fabpool_torch::Core core_;
    std::atomic<bool> initialized_{false};
    std::atomic<bool> enabled_{true};
    std::atomic<bool> history_{false};
    std::mutex mu_;
    std::vector<CA::OutOfMemoryObserver> observers_;
    std::vector<CA::AllocatorTraceTracker> trackers_;

    static c10::CachingAllocator::Stat stat(const fabpool_torch::Stat &s)
    {
        c10::CachingAllocator::Stat o;
        o.current = s.current;
        o.peak = s.peak;
        o.allocated = s.allocated;
        o.freed = s.freed;
        return o;
    }

    void *malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream)
    {
        void *p = nullptr;
        try {
            p = core_.malloc(device, size, stream);
        } catch (const fabpool_torch::OutOfMemory &e) {
            out_of_memory(e);
        } catch (const c10::Error &) {
            throw;
        } catch (const std::exception &e) {
            TORCH_CHECK(false, e.what());
        }
        if (const c10::impl::PyInterpreter *interp = c10::impl::GPUTrace::get_trace())
            (*interp)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
        if (c10::memoryProfilingEnabled()) {
            size_t u = size;
            core_.usable_size(p, &u);
            report(p, int64_t(u), device);
        }
        return p;
    }

    /* PyTorch's OOM observers, then the exception (the core's lock is free) */
    [[noreturn]] void out_of_memory(const fabpool_torch::OutOfMemory &e)
    {
        std::vector<CA::OutOfMemoryObserver> observers;
        {
            std::lock_guard<std::mutex> lk(mu_);
            observers = observers_;
        }
        for (const auto &obs : observers)
            obs(e.device, e.size, e.allowed, e.device_free);
        if (c10::memoryProfilingEnabled()) {
            fabpool_torch::DeviceStats s = core_.stats(e.device);
            c10::reportOutOfMemoryToProfiler(int64_t(e.size), size_t(s.allocated_bytes[0].current),
                                             size_t(s.reserved_bytes.current),
                                             c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(e.device)));
        }
        TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }

    void report(void *p, int64_t size, int device)
    {
        fabpool_torch::DeviceStats s = core_.stats(device);
        c10::reportMemoryUsageToProfiler(p, size, size_t(s.allocated_bytes[0].current), size_t(s.reserved_bytes.current),
                                         c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    }
};

/* Made by the first install and never destroyed: PyTorch frees tensors
 * during interpreter exit, after static destructors may have run. */
FabpoolAllocator *g_alloc = nullptr;
std::mutex g_install_mu;

void raw_delete_fn(void *ptr) { g_alloc->raw_delete(ptr); }

void put(char *msg, size_t cap, const std::string &s)
{
    if (msg && cap)
        snprintf(msg, cap, "%s", s.c_str());
}

}  // namespace

extern "C" {

/* torch.__version__ of the PyTorch this library was built against. */
FABPOOL_API const char *fabpool_torch_cxx_built_for(void) { return FABPOOL_TORCH_BUILT_FOR; }

/* Makes fabpool PyTorch's CUDA allocator: what
 * torch.cuda.memory.change_current_allocator does, and c10::GetAllocator
 * (kCUDA) too.  Refused (FABPOOL_ERR_BUSY, msg says why) once PyTorch's
 * allocator has been initialized (CUDA initialized in this process).
 * Installing twice is fine. */
FABPOOL_API int fabpool_torch_cxx_install(char *msg, size_t cap)
{
    try {
        std::lock_guard<std::mutex> lk(g_install_mu);
        CA::CUDAAllocator *cur = CA::allocator.load();
        if (g_alloc && cur == g_alloc)
            return FABPOOL_OK;
        if (cur && cur->initialized()) {
            put(msg, cap,
                "PyTorch's CUDA allocator (" + cur->name() +
                    ") is initialized already: CUDA was initialized in this process before install(); call "
                    "fabpool_torch.install() before the first CUDA tensor or CUDA call");
            return FABPOOL_ERR_BUSY;
        }
        if (!g_alloc)
            g_alloc = new FabpoolAllocator();
        /* failures raise in Python; the shim need not print them */
        fabpool_torch_set_verbose(0);
        CA::allocator.store(g_alloc);
        c10::SetAllocator(c10::DeviceType::CUDA, g_alloc, 0);
        return FABPOOL_OK;
    } catch (const std::exception &e) {
        put(msg, cap, std::string("fabpool_torch_cxx_install: ") + e.what());
        return FABPOOL_ERR_DRIVER;
    }
}

/* 1 while fabpool's allocator is PyTorch's. */
FABPOOL_API int fabpool_torch_cxx_installed(void)
{
    return g_alloc && CA::allocator.load() == g_alloc ? 1 : 0;
}

/* What C++ callers see (for the tests): out[0] CUDACachingAllocator::
 * getDeviceStats(device).allocated_bytes[all].current, out[1] its
 * reserved_bytes, out[2] allocated_bytes through c10::getDeviceAllocator
 * (kCUDA) (torch.accelerator's path), out[3] 1 if c10::GetAllocator(kCUDA)
 * is fabpool's, out[4] 1 if CUDACachingAllocator::name() is "fabpool".
 * Returns 0, or -1 (msg says why). */
FABPOOL_API int fabpool_torch_cxx_cpp_view(int device, int64_t *out, char *msg, size_t cap)
{
    try {
        auto d = static_cast<c10::DeviceIndex>(device);
        auto s = CA::getDeviceStats(d);
        out[0] = s.allocated_bytes[0].current;
        out[1] = s.reserved_bytes[0].current;
        out[2] = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(d).allocated_bytes[0].current;
        out[3] = c10::GetAllocator(c10::DeviceType::CUDA) == g_alloc ? 1 : 0;
        out[4] = CA::name() == "fabpool" ? 1 : 0;
        return 0;
    } catch (const std::exception &e) {
        put(msg, cap, e.what());
        return -1;
    }
}

}  // extern "C"
