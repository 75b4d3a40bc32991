/* torch_core.hpp - PyTorch's allocator contract on fabpool, without PyTorch.
 *
 * What c10::cuda::CUDACachingAllocator::CUDAAllocator asks of an allocator,
 * in plain C++ on fabpool's public API, so that it is built and tested on the
 * simulated driver; torch_cxx.cpp turns it into PyTorch's class (DataPtr,
 * c10 exceptions, the OOM observers) and installs it.
 *
 * - The default pool of a device is the shim's (fabpool_torch.c: one
 *   fabpool pool per device, the stream-ordered pair).  A block used on
 *   streams other than its own (record_stream) is freed after the work
 *   queued on them at the free: fabpool_record_stream where the library has
 *   it, else events of the core's own.
 * - A private pool (a CUDA graph's, a torch.cuda.MemPool's) is a fabpool pool
 *   of its own.  Its freed blocks stay with it, on free lists by stream, and
 *   are never handed back to fabpool while the pool is in use: a graph's
 *   replay uses memory that is "free" between replays, so nothing of the
 *   pool may be unmapped or given to anyone else (fabpool only ever unmaps
 *   memory it holds free, which for such a pool is memory never handed out).
 * - While a pool context is open (beginAllocateToPool .. endAllocateToPool),
 *   a CUDA graph may be capturing: the core then makes its calls in the
 *   thread's relaxed capture mode, and a free whose streams are capturing is
 *   deferred (no driver call) until the contexts close.
 * - Every pool the core makes (the shim's default pools, through
 *   fabpool_torch_set_handle_type, and the private ones) has POSIX fd
 *   handles where the device has them, so that a tensor can be shared with
 *   another process (share_ipc / open_ipc, torch_ipc.hpp): its block's chunks
 *   are exported at the share and their fds passed over a socket.
 * - Failures throw: OutOfMemory for memory the pool cannot give (with
 *   fabpool's message), std::invalid_argument / std::logic_error for misuse.
 *
 * Streams are `void *` holding a cudaStream_t / CUstream.  All members are
 * thread-safe.
 */
#ifndef FABPOOL_TORCH_CORE_HPP
#define FABPOOL_TORCH_CORE_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fabpool.h"

namespace fabpool_torch {

using Stream = void *;
using PoolId = std::pair<unsigned long long, unsigned long long>;  // c10::MempoolId_t
constexpr int kMaxDevices = 64;
constexpr size_t kSmallSize = size_t(1) << 20;  // PyTorch's small pool: sizes asked up to 1 MiB
enum { kAll = 0, kSmallPool = 1, kLargePool = 2 };

/* What the core needs of the CUDA runtime (torch_cxx.cpp: PyTorch's; the
 * tests: the driver API). */
struct Runtime {
    virtual ~Runtime() = default;
    /* Is the stream capturing?  True also where the query fails. */
    virtual bool capturing(Stream s) = 0;
    /* An event recorded on s (device's context); nullptr where none could be. */
    virtual void *event_record(int device, Stream s) = 0;
    virtual bool event_done(void *ev) = 0;
    virtual void event_wait(void *ev) = 0;
    virtual void event_release(void *ev) = 0;
    virtual void device_sync(int device) = 0;
    virtual void mem_info(int device, size_t *free_bytes, size_t *total_bytes) = 0;
    /* The calling thread's capture mode made relaxed; returns the old one for unrelax. */
    virtual int relax() = 0;
    virtual void unrelax(int old) = 0;
};

/* A pool's own allocator (torch.cuda.MemPool(allocator=...)). */
struct External {
    virtual ~External() = default;
    virtual void *alloc(size_t size, Stream s) = 0;
    virtual void free(void *ptr) = 0;
};

/* PyTorch's statistics (c10::CachingDeviceAllocator::DeviceStats). */
struct Stat {
    int64_t current = 0, peak = 0, allocated = 0, freed = 0;
    void add(int64_t n)
    {
        current += n;
        if (n > 0)
            allocated += n;
        else
            freed -= n;
        if (current > peak)
            peak = current;
    }
};

struct DeviceStats {
    Stat allocation[3];       /* blocks handed out and not freed (also PyTorch's "active") */
    Stat allocated_bytes[3];  /* their block sizes */
    Stat requested_bytes[3];  /* the sizes asked */
    Stat segment;             /* chunks the device's pools map */
    Stat reserved_bytes;      /* bytes the device's pools map */
    int64_t num_alloc_retries = 0, num_ooms = 0, num_sync_all_streams = 0, num_device_alloc = 0,
            num_device_free = 0;
};

class OutOfMemory : public std::runtime_error {
public:
    OutOfMemory(const std::string &msg, int dev, size_t sz, size_t allowed_bytes, size_t free_bytes)
        : std::runtime_error(msg), device(dev), size(sz), allowed(allowed_bytes), device_free(free_bytes)
    {
    }
    int device;
    size_t size;         /* asked */
    size_t allowed;      /* the cap where a fraction is set, else the device's memory */
    size_t device_free;  /* what the driver says is free */
};

struct BlockRecord {
    void *ptr;
    size_t size, usable;
    Stream stream;
};

/* A private pool's live blocks at one moment (graph trees' checkpoints). */
struct PoolState {
    int device = 0;
    PoolId id{0, 0};
    std::vector<BlockRecord> live;
};

/* One block for a snapshot. */
struct SegmentRecord {
    int device;
    void *ptr;
    size_t size, usable;
    Stream stream;
    bool live;
    PoolId pool;  /* {0, 0}: the default pool */
    bool pending = false;  /* freed, waiting for the work of the streams it was used on (not live) */
    std::shared_ptr<void> stack;  /* a live block's allocation stack, where the history gathered one */
};

/* One event of the allocation history (PyTorch's TraceEntry, what
 * torch.cuda.memory._record_memory_history records).  A segment is a block
 * as segments() lists it: made with the block's first allocation, gone when
 * the block goes back to fabpool (a private pool keeps its freed blocks). */
struct HistoryEvent {
    enum Action { Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, Oom, kActions };
    Action action;
    int device;
    uintptr_t addr;  /* Oom: the bytes the driver said were free */
    size_t size;
    Stream stream;
    PoolId pool;
    uint64_t time;                  /* HistoryOptions::clock at the event */
    std::shared_ptr<void> context;  /* HistoryOptions::gather's answer (the stack), or null */
};

struct HistoryOptions {
    size_t max_entries = 0;      /* the newest this many are kept */
    unsigned skip = 0;           /* 1u << Action: actions not recorded */
    bool stacks_alloc = false;   /* gather a context for each allocation (kept with the block) */
    bool stacks_trace = false;   /* and put it in the Alloc event */
    bool stacks_free = false;    /* gather one for each free */
    std::function<std::shared_ptr<void>()> gather;
    std::function<uint64_t()> clock;  /* default: steady_clock nanoseconds */
};

struct Freed {
    int device;
    size_t usable;
};

/* A block shared with another process: PyTorch's ShareableHandle. */
struct IpcShare {
    std::ptrdiff_t offset;  /* the block's offset from what the receiver's open_ipc returns */
    std::string handle;     /* the bytes PyTorch carries to the receiver (torch_ipc.hpp) */
};

namespace ipc {
class Server;
}

class Core {
public:
    explicit Core(Runtime *rt);
    ~Core();
    Core(const Core &) = delete;
    Core &operator=(const Core &) = delete;

    /* size bytes on device for work on stream: from the pool a context routes
     * the stream to, else the device's default pool.  nullptr for size 0.
     * Throws OutOfMemory, or std::invalid_argument for a bad device. */
    void *malloc(int device, size_t size, Stream stream);
    /* Frees a block; std::invalid_argument if ptr is not a live block. */
    Freed free(void *ptr);
    /* The block is used on s too; false if ptr is not a live block. */
    bool record_stream(void *ptr, Stream s);
    /* The block's size; false if ptr is not a live block. */
    bool usable_size(void *ptr, size_t *out);

    /* Private pools (PyTorch's beginAllocateToPool ... releasePool). */
    void create_or_incref(int device, PoolId id, std::shared_ptr<External> ext);
    void begin_pool(int device, PoolId id, std::function<bool(Stream)> filter);
    void end_pool(int device, PoolId id);
    void release_pool(int device, PoolId id);
    int use_count(int device, PoolId id);
    void set_use_on_oom(int device, PoolId id, bool on);
    bool check_live(int device, PoolId id, const std::unordered_set<void *> &expected);
    std::shared_ptr<PoolState> checkpoint(int device, PoolId id);
    /* Sets the pool to the checkpoint: every live block of it freed (freed),
     * every block live in the checkpoint live again at its address (made). */
    void restore(const PoolState &state, std::vector<void *> *freed, std::vector<void *> *made);

    /* Cached memory back to the driver: {0,0} the default pools and the
     * released private pools of every device, else that pool. */
    void empty_cache(PoolId id);
    void set_fraction(int device, double fraction);
    double fraction(int device);
    DeviceStats stats(int device);
    void reset_peak(int device);
    void reset_accumulated(int device);
    /* The largest block an allocation could get without mapping more, or the
     * memory it could map (free device memory within the cap). */
    size_t largest_free(int device);
    std::vector<SegmentRecord> segments(PoolId only);
    /* The allocation history: on (with its options) or off; clear drops what was recorded.  Recording costs
     * one relaxed load per allocation and free while off. */
    void record_history(bool on, HistoryOptions opts, bool clear);
    bool history_on() const { return hist_on_.load(std::memory_order_relaxed); }
    /* What was recorded, oldest first. */
    std::vector<HistoryEvent> history();
    /* Devices with state (the highest index used + 1). */
    int devices();

    /* Sharing with other processes (torch.multiprocessing).  share_ipc: the
     * handle of a live block (its pool's chunks exported once; the process's
     * fd server started on the first share); std::invalid_argument for a
     * pointer that is not a live block, std::logic_error for memory that
     * cannot be shared (a pool of handle type none, a MemPool's own
     * allocator), std::runtime_error for a driver failure.  open_ipc: another
     * process's block mapped on device (a view in a pool of the core's own,
     * outside the statistics and the cap), the same pointer again for a
     * handle still open; the receiver finds the block at the pointer +
     * IpcShare::offset.  The pointer's deleter waits for the device's work
     * and unmaps.  std::invalid_argument for bytes that are not a handle,
     * std::runtime_error where the sender cannot be reached, refuses (its
     * block is no longer live) or the mapping fails. */
    IpcShare share_ipc(void *ptr);
    std::shared_ptr<void> open_ipc(int device, const std::string &handle);
    /* Views open now, and requests the fd server has answered (served) and refused. */
    size_t ipc_views();
    uint64_t ipc_served(uint64_t *refused);
    /* Blocks shared and not freed since: what the fd server may still serve. */
    size_t ipc_shares();

private:
    struct Block;
    struct Pool;
    struct Device;
    struct Pending {
        Block *b;
        std::vector<void *> events;
    };
    struct Context {
        PoolId id;
        std::function<bool(Stream)> filter;
    };
    struct Shard {
        std::mutex mu;
        std::unordered_map<void *, Block *> live;
    };
    struct Gauge {
        uint64_t mapped = 0, chunks = 0, maps = 0, unmaps = 0, retries = 0;
    };
    class Relaxed;
    struct IpcState;

    Runtime *rt_;
    std::atomic<int> contexts_{0};  /* open pool contexts, every device */
    std::mutex devs_mu_;
    std::atomic<Device *> devs_[kMaxDevices];
    static constexpr size_t kShards = 64;
    Shard shards_[kShards];
    std::shared_ptr<IpcState> ipc_;  /* the receiver's side; the deleters of open_ipc's pointers hold it */
    std::mutex server_mu_;
    ipc::Server *server_ = nullptr;  /* the sender's side: started at the first share */
    std::mutex shares_mu_;           /* a leaf */
    /* The live blocks shared (POSIX fds), by their handles' keys: a key is a random id of the share, not the
     * block's address, so that a process holding the token (any receiver of this process's tensors) reaches only
     * the blocks whose handles it was given, not every block it can guess the address and descriptor of. */
    struct Share {
        uintptr_t ptr;
        std::string desc;
    };
    std::unordered_map<uint64_t, Share> shares_;        /* key -> the block and its descriptor when shared */
    std::unordered_map<uintptr_t, uint64_t> share_keys_; /* a shared block's address -> its key */
    std::atomic<bool> hist_on_{false};
    std::mutex hist_mu_;  /* a leaf: taken with a device's lock held */
    HistoryOptions hist_;
    std::deque<HistoryEvent> hist_events_;

    Device &dev(int device);
    Device *dev_if(int device);
    Shard &shard(void *p);
    void live_put(Block *b);
    Block *live_take(void *p);
    template <class F> bool with_live(void *ptr, F fn);
    Pool *find_pool(Device &d, PoolId id);
    Pool &need_pool(Device &d, PoolId id, const char *what);
    Pool &incref(Device &d, PoolId id, std::shared_ptr<External> ext);
    Pool *route(Device &d, Stream s);
    bool make_fp(Device &d, Pool &p, std::string *why);
    Block *alloc_default(Device &d, size_t size, Stream s, bool ctx, std::string *why);
    Block *alloc_in(Device &d, Pool &p, size_t size, Stream s, bool ctx, std::string *why);
    Block *attempt(Device &d, Pool *p, size_t size, Stream s, bool ctx, std::string *why);
    void undo(Device &d, Block *b);
    void shrink(Device &d);
    bool busy(const Block *b);
    void release(Device &d, Block *b, bool ctx);
    void finish(Device &d, Block *b);
    void poll(Device &d, bool wait);
    void flush_deferred(Device &d);
    void free_pool_memory(Device &d, Pool *only);
    void drop(Device &d, Pool &p, Block *b);
    void destroy_pool(Device &d, Pool &p);
    void count(Device &d, const Block &b, int sign);
    Gauge gauge(Device &d);
    std::shared_ptr<void> gather(bool alloc);
    void note(HistoryEvent::Action a, int device, uintptr_t addr, size_t size, Stream s, PoolId pool,
              std::shared_ptr<void> ctx = nullptr);
    void note_block(HistoryEvent::Action a, const Block &b, std::shared_ptr<void> ctx = nullptr);
    void gone(Block *b);
    void unshare(Block *b);
    void sample(Device &d);
    uint64_t mapped(Device &d);
    [[noreturn]] void out_of_memory(Device &d, size_t size, Stream s, const std::string &why, bool capped);
    int serve_ipc(uint64_t key, const std::string &desc, std::vector<int> *fds, std::string *msg);
    ipc::Server &server();
};

}  // namespace fabpool_torch

#endif
