/* torch_core.cpp - PyTorch's allocator contract on fabpool's public API
 * (torch_core.hpp says what it keeps and why).
 *
 * Locks: one mutex per device (its pools, contexts, waiting blocks and
 * statistics), and the live blocks in shards of a hash map, each with a
 * mutex of its own.  A device's mutex may be held while a shard's is taken,
 * never the other way round.  The shim (fabpool_torch.c) has its own locks
 * and never calls back. */
#include "torch_core.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "fabpool_torch.h"
#include "torch_ipc.hpp"
#include "torch_min_block.h"
#include "torch_size.hpp"

/* fabpool_record_stream (fabpool.h) where the library has it: a block used
 * on other streams is then freed through the pool's stream-ordered free.
 * Where it is missing (a library without it), the core records events of
 * its own and frees the block once they have completed. */
extern "C" fabpool_status fabpool_record_stream(fabpool_t *pool, void *ptr, void *stream) __attribute__((weak));

namespace fabpool_torch {

namespace {

bool have_record_stream() { return fabpool_record_stream != nullptr; }

/* A free block of a private pool serves a request of n bytes if it is at
 * most 1.25x n (fabpool's own bound on a block's size), or 512 bytes. */
size_t fit_limit(size_t n)
{
    size_t l = n + n / 4;
    return l < 512 ? 512 : l;
}

std::string human(uint64_t b)
{
    char buf[48];
    if (b >= (uint64_t(1) << 30))
        snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(uint64_t(1) << 30));
    else if (b >= (uint64_t(1) << 20))
        snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(uint64_t(1) << 20));
    else
        snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)b);
    return buf;
}

std::string pool_name(PoolId id)
{
    return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

const PoolId kDefaultPool{0, 0};

}  // namespace

/* live: given out; stream_free: freed, kept for its stream's next
 * allocation (PyTorch calls it cached; it is not fabpool_stats' cached,
 * memory mapped but free); waiting: freed after use on other streams,
 * waiting for their events. */
enum class BlockState { live, stream_free, waiting };

struct Core::Block {
    void *ptr = nullptr;
    size_t size = 0;    /* asked */
    size_t usable = 0;  /* given */
    Stream stream = nullptr;
    int device = 0;
    Pool *pool = nullptr;  /* nullptr: the device's default pool (the shim's) */
    BlockState state = BlockState::live;
    std::vector<Stream> uses;  /* other streams it was used on (record_stream) */
    bool fresh = true;         /* never handed out yet: its segment is new (the history's SegmentAlloc) */
    bool shared = false;       /* given to share_ipc: in shares_ until it goes */
    std::shared_ptr<void> stack;  /* where it was allocated, if the history gathered it */
};

struct Core::Pool {
    PoolId id{0, 0};
    int use_count = 1;
    bool use_on_oom = false;
    std::shared_ptr<External> ext;  /* the pool's own allocator, if any */
    fabpool_t *fp = nullptr;        /* else fabpool's pool behind it (made before its first capture) */
    std::unordered_map<void *, Block *> held;                 /* every block of the pool, in any state */
    std::map<Stream, std::multimap<size_t, Block *>> stream_free;  /* free blocks by stream and size */
    size_t live = 0;
    size_t waiting = 0;  /* in the device's pending or deferred lists */
};

struct Core::Device {
    std::mutex mu;
    int index = 0;
    std::vector<Context> contexts;
    std::map<PoolId, std::unique_ptr<Pool>> pools;
    std::vector<Pending> pending;   /* freed after use on other streams: waiting for their events */
    std::vector<Block *> deferred;  /* freed while a stream that used them was capturing */
    DeviceStats st;
    double fraction = 1.0;
    bool capped = false;
    uint64_t cap = 0;
    uint64_t ext_bytes = 0, ext_blocks = 0;  /* live blocks of pools' own allocators */
    /* counters of destroyed pools, and the totals at the last reset of accumulated stats */
    uint64_t gone_maps = 0, gone_unmaps = 0, gone_retries = 0;
    uint64_t base_maps = 0, base_unmaps = 0, base_retries = 0, base_syncs = 0;
    uint64_t syncs = 0, retries = 0;  /* the core's own device waits and out-of-memory retries */
};

/* The calling thread's capture mode relaxed while a pool context is open:
 * a capture may be under way, and the pools' driver calls (cuMemCreate,
 * cuMemMap, event queries) are not stream work. */
class Core::Relaxed {
public:
    Relaxed(Runtime *rt, bool on) : rt_(rt), on_(on)
    {
        if (on_)
            old_ = rt_->relax();
    }
    ~Relaxed()
    {
        if (on_)
            rt_->unrelax(old_);
    }
    Relaxed(const Relaxed &) = delete;
    Relaxed &operator=(const Relaxed &) = delete;

private:
    Runtime *rt_;
    bool on_;
    int old_ = 0;
};

/* The receiver's side of IPC: a pool per device for the views of other
 * processes' blocks (outside the statistics: PyTorch does not count them
 * either), and the views open by handle. */
struct Core::IpcState {
    std::mutex mu;
    bool dead = false;  /* the core is gone: a deleter has nothing left to do */
    fabpool_t *pools[kMaxDevices] = {};
    std::map<std::string, std::weak_ptr<void>> open;
    size_t views = 0;
};

Core::Core(Runtime *rt) : rt_(rt), ipc_(std::make_shared<IpcState>())
{
    for (auto &d : devs_)
        d.store(nullptr, std::memory_order_relaxed);
    /* tensors may go to other processes: the devices' pools export their chunks */
    fabpool_torch_set_handle_type(FABPOOL_HANDLE_POSIX_FD);
}

/* For tests and for the end of a program: every block and pool let go. */
Core::~Core()
{
    {
        std::lock_guard<std::mutex> lk(server_mu_);
        if (server_ && server_->pid() == int(getpid()))
            delete server_;
        else if (server_)
            server_->abandon(); /* a forked child's copy of its parent's */
        server_ = nullptr;
    }
    {
        std::lock_guard<std::mutex> lk(ipc_->mu);
        ipc_->dead = true;
        for (fabpool_t *&p : ipc_->pools)
            if (p) {
                fabpool_destroy(p); /* the views still open go with it */
                p = nullptr;
            }
        ipc_->open.clear();
        ipc_->views = 0;
    }
    for (auto &slot : devs_) {
        Device *d = slot.load(std::memory_order_acquire);
        if (!d)
            continue;
        std::lock_guard<std::mutex> lk(d->mu);
        for (Block *b : d->deferred) {
            if (b->pool)
                b->pool->waiting--;
            finish(*d, b);
        }
        d->deferred.clear();
        poll(*d, true);
    }
    for (auto &sh : shards_) {
        std::lock_guard<std::mutex> lk(sh.mu);
        for (auto &kv : sh.live) {
            Block *b = kv.second;
            if (!b->pool) {
                fabpool_torch_free(b->ptr, b->size, b->device, b->stream);
                delete b;
            }
            /* a pool's block, live or not, is in its pool's held list: destroy_pool gives it back once (to the
             * pool's own allocator, or with the pool's fabpool pool) */
        }
        sh.live.clear();
    }
    for (auto &slot : devs_) {
        Device *d = slot.load(std::memory_order_acquire);
        if (!d)
            continue;
        for (auto &kv : d->pools)
            destroy_pool(*d, *kv.second);
        delete d;
        slot.store(nullptr, std::memory_order_release);
    }
}

/* ----------------------------------------------------------- devices */

Core::Device &Core::dev(int device)
{
    if (device < 0 || device >= kMaxDevices)
        throw std::invalid_argument("fabpool: device " + std::to_string(device) +
                                    " is out of range (0 to 63): pass the index of a CUDA device");
    Device *d = devs_[device].load(std::memory_order_acquire);
    if (d)
        return *d;
    std::lock_guard<std::mutex> lk(devs_mu_);
    d = devs_[device].load(std::memory_order_acquire);
    if (!d) {
        d = new Device;
        d->index = device;
        devs_[device].store(d, std::memory_order_release);
    }
    return *d;
}

Core::Device *Core::dev_if(int device)
{
    if (device < 0 || device >= kMaxDevices)
        return nullptr;
    return devs_[device].load(std::memory_order_acquire);
}

int Core::devices()
{
    int n = 0;
    for (int i = 0; i < kMaxDevices; i++)
        if (devs_[i].load(std::memory_order_acquire))
            n = i + 1;
    return n;
}

/* -------------------------------------------------------- live blocks */

Core::Shard &Core::shard(void *p)
{
    uint64_t h = (uint64_t(uintptr_t(p)) >> 8) * 0x9e3779b97f4a7c15ull;
    return shards_[h >> 58];
}

void Core::live_put(Block *b)
{
    Shard &sh = shard(b->ptr);
    std::lock_guard<std::mutex> lk(sh.mu);
    sh.live[b->ptr] = b;
}

Core::Block *Core::live_take(void *p)
{
    Shard &sh = shard(p);
    std::lock_guard<std::mutex> lk(sh.mu);
    auto it = sh.live.find(p);
    if (it == sh.live.end())
        return nullptr;
    Block *b = it->second;
    sh.live.erase(it);
    return b;
}

/* fn(block) under its shard's lock; false if ptr is not a live block. */
template <class F> bool Core::with_live(void *ptr, F fn)
{
    Shard &sh = shard(ptr);
    std::lock_guard<std::mutex> lk(sh.mu);
    auto it = sh.live.find(ptr);
    if (it == sh.live.end())
        return false;
    fn(*it->second);
    return true;
}

bool Core::record_stream(void *ptr, Stream s)
{
    return with_live(ptr, [s](Block &b) {
        if (s != b.stream && std::find(b.uses.begin(), b.uses.end(), s) == b.uses.end())
            b.uses.push_back(s);
    });
}

bool Core::usable_size(void *ptr, size_t *out)
{
    return with_live(ptr, [out](Block &b) { *out = b.usable; });
}

/* -------------------------------------------------------- statistics */

void Core::count(Device &d, const Block &b, int sign)
{
    int k = b.size <= kSmallSize ? kSmallPool : kLargePool;
    for (int i : {int(kAll), k}) {
        d.st.allocation[i].add(sign);
        d.st.allocated_bytes[i].add(sign * int64_t(b.usable));
        d.st.requested_bytes[i].add(sign * int64_t(b.size));
    }
}

/* What the device's pools map, read from fabpool's running counters. */
Core::Gauge Core::gauge(Device &d)
{
    Gauge g;
    auto add = [&g](fabpool_t *fp) {
        fabpool_counters k{};
        k.struct_size = sizeof k;
        if (fp && fabpool_get_counters(fp, &k) == FABPOOL_OK) {
            g.mapped += k.mapped_bytes;
            g.chunks += k.chunks_mapped;
            g.maps += k.chunks_mapped_total;
            g.unmaps += k.chunks_unmapped_total;
            g.retries += k.oom_retries;
        }
    };
    add(fabpool_torch_pool(d.index));
    for (auto &kv : d.pools)
        add(kv.second->fp);
    g.mapped += d.ext_bytes;
    g.chunks += d.ext_blocks;
    g.maps += d.gone_maps;
    g.unmaps += d.gone_unmaps;
    g.retries += d.gone_retries;
    return g;
}

uint64_t Core::mapped(Device &d) { return gauge(d).mapped; }

/* Memory is mapped only inside an allocation, after which this runs: the
 * peaks of reserved_bytes and segment are exact. */
void Core::sample(Device &d)
{
    Gauge g = gauge(d);
    d.st.reserved_bytes.add(int64_t(g.mapped) - d.st.reserved_bytes.current);
    d.st.segment.add(int64_t(g.chunks) - d.st.segment.current);
}

static uint64_t shim_syncs(int device)
{
    fabpool_torch_counters c{};
    c.struct_size = sizeof c;
    return fabpool_torch_get_counters(device, &c) == FABPOOL_OK ? c.syncs : 0;
}

DeviceStats Core::stats(int device)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    sample(d);
    Gauge g = gauge(d);
    DeviceStats s = d.st;
    s.num_device_alloc = int64_t(g.maps - d.base_maps);
    s.num_device_free = int64_t(g.unmaps - d.base_unmaps);
    s.num_alloc_retries = int64_t(d.retries + g.retries - d.base_retries);
    s.num_sync_all_streams = int64_t(d.syncs + shim_syncs(device) - d.base_syncs);
    return s;
}

static void each_stat(DeviceStats &s, void (*fn)(Stat &))
{
    for (int i = 0; i < 3; i++) {
        fn(s.allocation[i]);
        fn(s.allocated_bytes[i]);
        fn(s.requested_bytes[i]);
    }
    fn(s.segment);
    fn(s.reserved_bytes);
}

void Core::reset_peak(int device)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    sample(d);
    each_stat(d.st, [](Stat &s) { s.peak = s.current; });
}

void Core::reset_accumulated(int device)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    sample(d);
    each_stat(d.st, [](Stat &s) { s.allocated = s.freed = 0; });
    Gauge g = gauge(d);
    d.st.num_ooms = 0;
    d.base_maps = g.maps;
    d.base_unmaps = g.unmaps;
    d.base_retries = d.retries + g.retries;
    d.base_syncs = d.syncs + shim_syncs(device);
}

/* ------------------------------------------------------- private pools */

Core::Pool *Core::find_pool(Device &d, PoolId id)
{
    auto it = d.pools.find(id);
    return it == d.pools.end() ? nullptr : it->second.get();
}

/* The pool, or a logic_error naming the call (what) that wanted it. */
Core::Pool &Core::need_pool(Device &d, PoolId id, const char *what)
{
    Pool *p = find_pool(d, id);
    if (!p)
        throw std::logic_error(std::string("fabpool: ") + what + ": device " + std::to_string(d.index) +
                               " has no memory pool " + pool_name(id));
    return *p;
}

Core::Pool &Core::incref(Device &d, PoolId id, std::shared_ptr<External> ext)
{
    Pool *p = find_pool(d, id);
    if (p) {
        if (ext && p->ext != ext)
            throw std::logic_error("fabpool: memory pool " + pool_name(id) + " on device " + std::to_string(d.index) +
                                   " exists already with another allocator");
        p->use_count++;
        return *p;
    }
    auto np = std::make_unique<Pool>();
    np->id = id;
    np->ext = std::move(ext);
    Pool &r = *np;
    d.pools.emplace(id, std::move(np));
    return r;
}

/* The pool's fabpool pool: local memory, no thread cache, and nothing it
 * holds free ever unmapped by age or traded for a new block (decay and
 * large_slack at their maximum): what a private pool holds free is memory
 * it never handed out, and it keeps its size for the next capture. */
bool Core::make_fp(Device &d, Pool &p, std::string *why)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = d.index;
    o.handle_type = FABPOOL_HANDLE_POSIX_FD; /* its tensors may be shared with other processes */
    o.thread_cache = 0;
    o.decay_ms = UINT32_MAX;
    o.large_slack_percent = 1000;
    size_t fr = 0, total = 0;
    rt_->mem_info(d.index, &fr, &total);
    /* twice the device's memory: a pool never maps more than the device
     * has, and many pools fit in the process's address space */
    o.reserve_bytes = uint64_t(total) * 2;
    fabpool_status st = fabpool_create(&o, &p.fp);
    if (st == FABPOOL_ERR_NOT_SUPPORTED) {
        o.handle_type = FABPOOL_HANDLE_NONE; /* a device without POSIX fd handles */
        st = fabpool_create(&o, &p.fp);
    }
    if (st != FABPOOL_OK) {
        p.fp = nullptr;
        *why = std::string(fabpool_last_error()) + " (creating the fabpool pool of PyTorch's memory pool " +
               pool_name(p.id) + ")";
        return false;
    }
    return true;
}

void Core::create_or_incref(int device, PoolId id, std::shared_ptr<External> ext)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    incref(d, id, std::move(ext));
}

/* The pool begun last whose filter takes s: use_mem_pool contexts nest, the inner one serving (PyTorch searches
 * its captures underway in the same order, newest first). */
Core::Pool *Core::route(Device &d, Stream s)
{
    for (auto c = d.contexts.rbegin(); c != d.contexts.rend(); ++c)
        if (c->filter(s))
            return find_pool(d, c->id);
    return nullptr;
}

void Core::begin_pool(int device, PoolId id, std::function<bool(Stream)> filter)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    for (auto &c : d.contexts)
        if (c.id == id)
            throw std::logic_error("fabpool: beginAllocateToPool: device " + std::to_string(device) +
                                   " already allocates to memory pool " + pool_name(id));
    Relaxed relaxed(rt_, contexts_.load(std::memory_order_acquire) > 0);
    Pool &p = incref(d, id, nullptr);
    std::string why;
    if (!p.ext && !p.fp)
        make_fp(d, p, &why);  /* now, before PyTorch begins the capture; a failure shows at the first allocation */
    /* every block freed on a stream so far gets its event now: none is
     * recorded on a stream while it captures (the blocks freed meanwhile on
     * a capturing stream wait in the deferred list) */
    if (fabpool_t *fp = fabpool_torch_pool(d.index)) {
        fabpool_collect(fp, 0);
        /* and the default pool's owner mode ends, its fence made while events are allowed: were the capturing
         * stream the owner, another stream's allocation during the capture would end it then, with an event on
         * the capturing stream; a refusal here leaves that to happen, as before */
        (void)fabpool_stream_owner_end(fp);
    }
    d.contexts.push_back(Context{id, std::move(filter)});
    contexts_.fetch_add(1, std::memory_order_acq_rel);
}

void Core::end_pool(int device, PoolId id)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    auto it = std::find_if(d.contexts.begin(), d.contexts.end(), [&](const Context &c) { return c.id == id; });
    if (it == d.contexts.end())
        throw std::logic_error("fabpool: endAllocateToPool: device " + std::to_string(device) +
                               " does not allocate to memory pool " + pool_name(id));
    d.contexts.erase(it);
    if (contexts_.fetch_sub(1, std::memory_order_acq_rel) == 1)
        flush_deferred(d);
}

void Core::release_pool(int device, PoolId id)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    Pool *p = find_pool(d, id);
    if (!p || p->use_count <= 0)
        throw std::logic_error("fabpool: releasePool: device " + std::to_string(device) + " has no memory pool " +
                               pool_name(id) + " in use");
    /* its memory goes back at the next empty_cache or out-of-memory retry,
     * once nothing of it is live, as with PyTorch's allocator */
    p->use_count--;
}

int Core::use_count(int device, PoolId id)
{
    Device *d = dev_if(device);
    if (!d)
        return 0;
    std::lock_guard<std::mutex> lk(d->mu);
    Pool *p = find_pool(*d, id);
    return p ? p->use_count : 0;
}

void Core::set_use_on_oom(int device, PoolId id, bool on)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    if (on || find_pool(d, id))
        need_pool(d, id, "setUseOnOOM").use_on_oom = on;
}

bool Core::check_live(int device, PoolId id, const std::unordered_set<void *> &expected)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    Pool *p = &need_pool(d, id, "checkPoolLiveAllocations");
    size_t n = 0;
    for (auto &kv : p->held)
        if (kv.second->state == BlockState::live) {
            if (!expected.count(kv.first))
                return false;
            n++;
        }
    return n == expected.size();
}

std::shared_ptr<PoolState> Core::checkpoint(int device, PoolId id)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    Pool *p = &need_pool(d, id, "getCheckpointState");
    auto st = std::make_shared<PoolState>();
    st->device = device;
    st->id = id;
    for (auto &kv : p->held)
        if (kv.second->state == BlockState::live)
            st->live.push_back(BlockRecord{kv.first, kv.second->size, kv.second->usable, kv.second->stream});
    std::sort(st->live.begin(), st->live.end(),
              [](const BlockRecord &a, const BlockRecord &b) { return uintptr_t(a.ptr) < uintptr_t(b.ptr); });
    return st;
}

void Core::restore(const PoolState &state, std::vector<void *> *freed, std::vector<void *> *made)
{
    Device &d = dev(state.device);
    std::lock_guard<std::mutex> lk(d.mu);
    /* this device allocates to a pool: its deferred frees and events wait, its OOM retry frees nothing (per
     * device, as PyTorch's); the runtime's capture mode is relaxed while any device does */
    bool ctx = !d.contexts.empty();
    Relaxed relaxed(rt_, contexts_.load(std::memory_order_acquire) > 0);
    Pool *p = find_pool(d, state.id);
    if (!p || p->ext)
        throw std::logic_error("fabpool: setCheckpointPoolState: device " + std::to_string(state.device) +
                               " has no memory pool " + pool_name(state.id) + " of fabpool's own");
    if (p->waiting && !ctx) {
        flush_deferred(d);
        poll(d, true);
    }
    /* every block the checkpoint names is still the pool's, at its size
     * (the pool gives nothing back while it is in use), and not waiting */
    for (auto &r : state.live) {
        auto it = p->held.find(r.ptr);
        if (it == p->held.end() || it->second->usable != r.usable || it->second->state == BlockState::waiting)
            throw std::logic_error("fabpool: setCheckpointPoolState: the checkpoint names a block at " +
                                   std::to_string(uintptr_t(r.ptr)) + " that memory pool " + pool_name(state.id) +
                                   (it == p->held.end() ? " no longer holds (was its cache emptied?)"
                                                        : " holds in another state"));
    }
    std::vector<Block *> now;
    for (auto &kv : p->held)
        if (kv.second->state == BlockState::live)
            now.push_back(kv.second);
    std::sort(now.begin(), now.end(), [](Block *a, Block *b) { return uintptr_t(a->ptr) < uintptr_t(b->ptr); });
    for (Block *b : now) {
        live_take(b->ptr);
        unshare(b);
        count(d, *b, -1);
        p->live--;
        b->uses.clear();
        b->state = BlockState::stream_free;
        p->stream_free[b->stream].emplace(b->usable, b);
        freed->push_back(b->ptr);
    }
    for (auto &r : state.live) {
        Block *b = p->held[r.ptr];
        auto fl = p->stream_free.find(b->stream);
        if (fl != p->stream_free.end()) {
            auto range = fl->second.equal_range(b->usable);
            for (auto it = range.first; it != range.second; ++it)
                if (it->second == b) {
                    fl->second.erase(it);
                    break;
                }
            if (fl->second.empty())
                p->stream_free.erase(fl);
        }
        b->size = r.size;
        b->stream = r.stream;
        b->state = BlockState::live;
        p->live++;
        count(d, *b, 1);
        live_put(b);
        made->push_back(b->ptr);
    }
    sample(d);
}

/* ---------------------------------------------------------- allocation */

Core::Block *Core::alloc_default(Device &d, size_t size, Stream s, bool ctx, std::string *why)
{
    std::unique_ptr<Block> nb(new Block);
    void *p = fabpool_torch_alloc(size, d.index, s);
    if (!p) {
        *why = fabpool_torch_last_error();
        if (!ctx) {
            /* what PyTorch's allocator does before it gives up: the blocks
             * other streams' work holds, and the released private pools'
             * memory, back to the driver, then once more */
            d.retries++;
            poll(d, true);
            free_pool_memory(d, nullptr);
            p = fabpool_torch_alloc(size, d.index, s);
            if (!p)
                *why = fabpool_torch_last_error();
        }
    }
    if (!p)
        return nullptr;
    size_t u = size;
    fabpool_usable_size(fabpool_torch_pool(d.index), p, &u);
    nb->ptr = p;
    nb->size = size;
    nb->usable = u;
    nb->stream = s;
    nb->device = d.index;
    return nb.release();
}

Core::Block *Core::alloc_in(Device &d, Pool &p, size_t size, Stream s, bool ctx, std::string *why)
{
    std::unique_ptr<Block> nb(new Block);
    nb->size = size;
    nb->stream = s;
    nb->device = d.index;
    nb->pool = &p;
    /* a free block of this stream that fits: blocks are reused by the stream
     * that freed them only, as PyTorch's private pools do */
    auto fl = p.stream_free.find(s);
    if (fl != p.stream_free.end()) {
        auto it = fl->second.lower_bound(size);
        if (it != fl->second.end() && it->first <= fit_limit(size)) {
            Block *b = it->second;
            fl->second.erase(it);
            if (fl->second.empty())
                p.stream_free.erase(fl);
            b->size = size;
            b->state = BlockState::live;
            return b;
        }
    }
    if (p.ext) {
        void *q = p.ext->alloc(size, s);
        if (!q) {
            *why = "the allocator of memory pool " + pool_name(p.id) + " gave no memory";
            return nullptr;
        }
        nb->ptr = q;
        nb->usable = size;
        p.held[q] = nb.get();
        d.ext_bytes += size;
        d.ext_blocks++;
        return nb.release();
    }
    if (!p.fp && !make_fp(d, p, why))
        return nullptr;
    void *q = nullptr;
    size_t ask = size < FT_MIN_BLOCK ? FT_MIN_BLOCK : size; /* as the shim: a tensor's base aligned as cudaMalloc's */
    fabpool_status st = fabpool_alloc(p.fp, ask, &q);
    if (st != FABPOOL_OK && !ctx) {
        d.retries++;
        poll(d, true);
        fabpool_torch_empty(d.index);
        free_pool_memory(d, nullptr);
        st = fabpool_alloc(p.fp, ask, &q);
    }
    if (st != FABPOOL_OK) {
        *why = fabpool_last_error();
        return nullptr;
    }
    size_t u = size;
    fabpool_usable_size(p.fp, q, &u);
    nb->ptr = q;
    nb->usable = u;
    p.held[q] = nb.get();
    return nb.release();
}

Core::Block *Core::attempt(Device &d, Pool *p, size_t size, Stream s, bool ctx, std::string *why)
{
    if (p)
        return alloc_in(d, *p, size, s, ctx, why);
    Block *b = alloc_default(d, size, s, ctx, why);
    /* torch.cuda.MemPool(use_on_oom=True): its memory serves what the
     * default pool cannot */
    for (auto it = d.pools.begin(); !b && it != d.pools.end(); ++it)
        if (it->second->use_on_oom) {
            std::string ignored;
            b = alloc_in(d, *it->second, size, s, ctx, &ignored);
        }
    return b;
}

/* A block allocated just now, never handed out, taken back. */
void Core::undo(Device &d, Block *b)
{
    if (!b->pool) {
        fabpool_torch_free(b->ptr, b->size, d.index, b->stream);
        delete b;
        return;
    }
    drop(d, *b->pool, b);
}

/* Everything the device holds free (blocks kept for their streams, the
 * pools' free memory) back to the driver (outside a capture). */
void Core::shrink(Device &d)
{
    poll(d, true);
    fabpool_torch_empty(d.index);
    free_pool_memory(d, nullptr);
}

void *Core::malloc(int device, size_t size, Stream stream)
{
    if (size == 0)
        return nullptr;
    Device &d = dev(device);
    std::shared_ptr<void> stack = gather(true); /* before the lock: it may run Python */
    std::lock_guard<std::mutex> lk(d.mu);
    /* this device allocates to a pool: its deferred frees and events wait, its OOM retry frees nothing (per
     * device, as PyTorch's); the runtime's capture mode is relaxed while any device does */
    bool ctx = !d.contexts.empty();
    Relaxed relaxed(rt_, contexts_.load(std::memory_order_acquire) > 0);
    if (!ctx) {
        if (!d.deferred.empty())
            flush_deferred(d);
        if (!d.pending.empty())
            poll(d, false);
    }
    Pool *p = d.contexts.empty() ? nullptr : route(d, stream);
    uint64_t before = d.capped ? mapped(d) : 0;
    std::string why;
    Block *b = attempt(d, p, size, stream, ctx, &why);
    bool capped = false;
    /* set_per_process_memory_fraction: an allocation that maps memory may
     * not take the device's pools past the cap; one that maps nothing
     * (served from what is mapped) always may */
    if (b && d.capped) {
        uint64_t m = mapped(d);
        if (m > before && m > d.cap) {
            undo(d, b);
            b = nullptr;
            if (!ctx) {
                d.retries++;
                shrink(d);
                before = mapped(d);
                b = attempt(d, p, size, stream, ctx, &why);
                if (b && (m = mapped(d)) > before && m > d.cap) {
                    undo(d, b);
                    shrink(d);
                    b = nullptr;
                }
            }
            if (!b) {
                capped = true;
                char f[32];
                snprintf(f, sizeof f, "%g", d.fraction);
                why = "an allocation of " + human(size) + " would take the device's pools to " + human(m) +
                      ", past the " + human(d.cap) + " that set_per_process_memory_fraction(" + f +
                      ") allows (cached memory was returned to the driver first)";
            }
        }
    }
    if (!b)
        out_of_memory(d, size, stream, why, capped);
    b->state = BlockState::live;
    if (b->pool)
        b->pool->live++;
    count(d, *b, 1);
    sample(d);
    b->stack = std::move(stack);
    if (history_on()) {
        if (b->fresh)
            note_block(HistoryEvent::SegmentAlloc, *b);
        note_block(HistoryEvent::Alloc, *b, b->stack);
    }
    b->fresh = false;
    live_put(b);
    return b->ptr;
}

void Core::out_of_memory(Device &d, size_t size, Stream s, const std::string &why, bool capped)
{
    d.st.num_ooms++;
    size_t fr = 0, total = 0;
    rt_->mem_info(d.index, &fr, &total);
    uint64_t m = mapped(d);
    uint64_t live = uint64_t(d.st.allocated_bytes[kAll].current);
    char sbuf[32];
    snprintf(sbuf, sizeof sbuf, "%p", s);
    /* PyTorch's own first sentences, word for word where they describe the same thing (programs and PyTorch's
     * tests match them), then fabpool's account */
    std::string msg = "CUDA out of memory. Tried to allocate " + torch_size(size) + ". GPU " +
                      std::to_string(d.index) + " has a total capacity of " + torch_size(total) + " of which " +
                      torch_size(fr) + " is free. " + (d.capped ? torch_size(d.cap) + " allowed; " : std::string()) +
                      "Of the allocated memory " + torch_size(live) + " is allocated by PyTorch, and " +
                      torch_size(m > live ? m - live : 0) + " is reserved by PyTorch but unallocated. fabpool (stream " +
                      sbuf + "): " + why + "; what is reserved but unallocated is the device's pools' cached blocks and "
                      "CUDA graphs' pools";
    if (d.capped && !capped) {
        char f[32];
        snprintf(f, sizeof f, "%g", d.fraction);
        msg += "; set_per_process_memory_fraction(" + std::string(f) + ") caps the device's pools at " + human(d.cap);
    }
    msg += ". Free tensors (del, gc.collect()) or use smaller batches, then allocate again.";
    if (history_on())
        note(HistoryEvent::Oom, d.index, fr, size, s, kDefaultPool);
    throw OutOfMemory(msg, d.index, size, d.capped ? size_t(d.cap) : total, fr);
}

/* --------------------------------------------------------------- frees */

Freed Core::free(void *ptr)
{
    Block *b = live_take(ptr);
    if (!b) {
        char buf[32];
        snprintf(buf, sizeof buf, "%p", ptr);
        throw std::invalid_argument(std::string("fabpool: invalid device pointer ") + buf +
                                    ": not a live block of this allocator (never given out, or freed already)");
    }
    Device &d = *devs_[b->device].load(std::memory_order_acquire);
    std::shared_ptr<void> stack = gather(false);
    std::lock_guard<std::mutex> lk(d.mu);
    /* this device allocates to a pool: its deferred frees and events wait, its OOM retry frees nothing (per
     * device, as PyTorch's); the runtime's capture mode is relaxed while any device does */
    bool ctx = !d.contexts.empty();
    Relaxed relaxed(rt_, contexts_.load(std::memory_order_acquire) > 0);
    Freed f{b->device, b->usable};
    if (history_on())
        note_block(HistoryEvent::FreeRequested, *b, std::move(stack));
    if (b->pool)
        b->pool->live--;
    count(d, *b, -1);
    release(d, b, ctx);
    return f;
}

bool Core::busy(const Block *b)
{
    if (rt_->capturing(b->stream))
        return true;
    for (Stream u : b->uses)
        if (rt_->capturing(u))
            return true;
    return false;
}

/* A block freed: to its pool now, after the events of the streams it was
 * used on, or after the capture that one of them is in. */
void Core::release(Device &d, Block *b, bool ctx)
{
    /* a private pool's block used on no other stream goes back to its pool
     * with no call at all; the default pool's free (the stream pair's
     * events) and the events of other streams wait while a stream captures */
    bool calls = !b->pool || !b->uses.empty();
    if (ctx && calls && busy(b)) {
        b->state = BlockState::waiting;
        d.deferred.push_back(b);
        if (b->pool)
            b->pool->waiting++;
        return;
    }
    bool events = !b->uses.empty() && (b->pool || !have_record_stream());
    if (events) {
        Pending pe{b, {}};
        for (Stream u : b->uses) {
            void *ev = rt_->event_record(d.index, u);
            if (!ev) {
                /* no event: the device's work is waited for instead */
                for (void *e : pe.events)
                    rt_->event_release(e);
                rt_->device_sync(d.index);
                d.syncs++;
                finish(d, b);
                return;
            }
            pe.events.push_back(ev);
        }
        b->state = BlockState::waiting;
        d.pending.push_back(std::move(pe));
        if (b->pool)
            b->pool->waiting++;
        return;
    }
    finish(d, b);
}

void Core::finish(Device &d, Block *b)
{
    if (history_on())
        note_block(HistoryEvent::FreeCompleted, *b);
    if (!b->pool) {
        fabpool_t *fp = fabpool_torch_pool(d.index);
        if (fp && have_record_stream())
            for (Stream u : b->uses)
                if (fabpool_record_stream(fp, b->ptr, u) != FABPOOL_OK) {
                    /* not recorded (the per-thread default stream, no host memory): the free could not wait for
                     * that stream's work, so the device's work is waited for now, as where no event can be made */
                    rt_->device_sync(d.index);
                    d.syncs++;
                    break;
                }
        fabpool_torch_free(b->ptr, b->size, d.index, b->stream);
        gone(b);
        return;
    }
    Pool &p = *b->pool;
    unshare(b); /* the pool keeps the block, and gives its memory to the next tensor of its size */
    b->uses.clear();
    b->state = BlockState::stream_free;
    p.stream_free[b->stream].emplace(b->usable, b);
}

/* Blocks whose events have completed (wait: all of them, once completed)
 * go to their pools. */
void Core::poll(Device &d, bool wait)
{
    if (d.pending.empty())
        return;
    std::vector<Pending> list;
    list.swap(d.pending);
    for (auto &pe : list) {
        bool done = true;
        for (void *ev : pe.events) {
            if (wait)
                rt_->event_wait(ev);
            else if (!rt_->event_done(ev)) {
                done = false;
                break;
            }
        }
        if (!done) {
            d.pending.push_back(std::move(pe));
            continue;
        }
        for (void *ev : pe.events)
            rt_->event_release(ev);
        if (pe.b->pool)
            pe.b->pool->waiting--;
        finish(d, pe.b);
    }
}

/* The blocks freed during a capture, once it is over (those whose streams
 * still capture stay). */
void Core::flush_deferred(Device &d)
{
    std::vector<Block *> list;
    list.swap(d.deferred);
    for (Block *b : list) {
        if (b->pool)
            b->pool->waiting--;
        release(d, b, true);
    }
}

/* Memory of private pools back to the driver: the pools in use give what
 * fabpool holds free (memory they never handed out); a released pool gives
 * its free blocks too, and goes once nothing of it is live.  only: that
 * pool alone. */
void Core::free_pool_memory(Device &d, Pool *only)
{
    bool synced = false;
    for (auto it = d.pools.begin(); it != d.pools.end();) {
        Pool &p = *it->second;
        if (only && &p != only) {
            ++it;
            continue;
        }
        if (p.use_count > 0) {
            if (p.fp)
                fabpool_trim(p.fp, 0);
            ++it;
            continue;
        }
        if (!synced && (p.live == 0 || !p.stream_free.empty())) {
            /* a graph's replay may still run in that memory */
            rt_->device_sync(d.index);
            d.syncs++;
            synced = true;
        }
        if (p.live == 0 && p.waiting == 0) {
            destroy_pool(d, p);
            it = d.pools.erase(it);
            continue;
        }
        for (auto &kv : p.stream_free)
            for (auto &e : kv.second)
                drop(d, p, e.second);
        p.stream_free.clear();
        if (p.fp)
            fabpool_trim(p.fp, 0);
        ++it;
    }
}

/* A block kept free for its stream back to fabpool's pool, or to the
 * pool's own allocator. */
void Core::drop(Device &d, Pool &p, Block *b)
{
    p.held.erase(b->ptr);
    void *ptr = b->ptr;
    size_t usable = b->usable;
    gone(b);
    if (p.ext) {
        d.ext_bytes -= usable;
        d.ext_blocks--;
        p.ext->free(ptr);
    } else {
        fabpool_free(p.fp, ptr);
    }
}

void Core::destroy_pool(Device &d, Pool &p)
{
    if (p.ext) {
        std::vector<Block *> rest;
        for (auto &kv : p.held)
            rest.push_back(kv.second);
        for (Block *b : rest)
            drop(d, p, b);
    }
    if (p.fp) {
        fabpool_counters k{};
        k.struct_size = sizeof k;
        if (fabpool_get_counters(p.fp, &k) == FABPOOL_OK) {
            d.gone_maps += k.chunks_mapped_total;
            d.gone_unmaps += k.chunks_unmapped_total + k.chunks_mapped;
            d.gone_retries += k.oom_retries;
        }
        fabpool_destroy(p.fp);  /* unmaps what is left: blocks the pool kept free */
        p.fp = nullptr;
    }
    for (auto &kv : p.held)
        gone(kv.second);
    p.held.clear();
    p.stream_free.clear();
}

void Core::empty_cache(PoolId id)
{
    for (int i = 0; i < kMaxDevices; i++) {
        Device *d = dev_if(i);
        if (!d)
            continue;
        std::lock_guard<std::mutex> lk(d->mu);
        bool ctx = !d->contexts.empty(); /* this device's contexts, as malloc's */
        Relaxed relaxed(rt_, contexts_.load(std::memory_order_acquire) > 0);
        /* as PyTorch's allocator: nothing while the device allocates to a
         * pool (a capture may be under way); the next call does it */
        if (!d->contexts.empty())
            continue;
        if (id == kDefaultPool) {
            if (!ctx && !d->deferred.empty())
                flush_deferred(*d);
            poll(*d, true);
            fabpool_torch_empty(i);
            free_pool_memory(*d, nullptr);
        } else if (Pool *p = find_pool(*d, id)) {
            poll(*d, true);
            free_pool_memory(*d, p);
        }
        sample(*d);
    }
}

/* ------------------------------------------------------------ the cap */

void Core::set_fraction(int device, double fraction)
{
    if (!(fraction >= 0.0 && fraction <= 1.0))
        throw std::invalid_argument("fabpool: invalid memory fraction " + std::to_string(fraction) +
                                    ": give a value from 0 to 1");
    Device &d = dev(device);
    size_t fr = 0, total = 0;
    rt_->mem_info(device, &fr, &total);
    std::lock_guard<std::mutex> lk(d.mu);
    d.fraction = fraction;
    d.capped = true;
    d.cap = uint64_t(fraction * double(total));
}

double Core::fraction(int device)
{
    Device &d = dev(device);
    std::lock_guard<std::mutex> lk(d.mu);
    return d.fraction;
}

size_t Core::largest_free(int device)
{
    Device &d = dev(device);
    size_t fr = 0, total = 0;
    rt_->mem_info(device, &fr, &total);
    std::lock_guard<std::mutex> lk(d.mu);
    size_t best = 0;
    for (auto &kv : d.pools)
        for (auto &fl : kv.second->stream_free)
            if (!fl.second.empty())
                best = std::max(best, fl.second.rbegin()->first);
    size_t room = fr;
    if (d.capped) {
        uint64_t m = mapped(d);
        room = std::min<uint64_t>(room, m < d.cap ? d.cap - m : 0);
    }
    return std::max(best, room);
}

/* ------------------------------------------------------------ history */

void Core::record_history(bool on, HistoryOptions opts, bool clear)
{
    std::lock_guard<std::mutex> lk(hist_mu_);
    if (!opts.clock)
        opts.clock = [] {
            return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count());
        };
    if (on)
        hist_ = std::move(opts);
    if (clear || !on)
        hist_events_.clear();
    hist_on_.store(on, std::memory_order_relaxed);
}

std::vector<HistoryEvent> Core::history()
{
    std::lock_guard<std::mutex> lk(hist_mu_);
    return std::vector<HistoryEvent>(hist_events_.begin(), hist_events_.end());
}

/* The stack of the calling allocation (alloc) or free, where the history asks for one. */
std::shared_ptr<void> Core::gather(bool alloc)
{
    if (!history_on())
        return nullptr;
    std::function<std::shared_ptr<void>()> fn;
    {
        std::lock_guard<std::mutex> lk(hist_mu_);
        if (!(alloc ? hist_.stacks_alloc : hist_.stacks_free) || !hist_.gather)
            return nullptr;
        fn = hist_.gather;
    }
    return fn();
}

void Core::note(HistoryEvent::Action a, int device, uintptr_t addr, size_t size, Stream s, PoolId pool,
                std::shared_ptr<void> ctx)
{
    std::lock_guard<std::mutex> lk(hist_mu_);
    if (!history_on() || (hist_.skip >> a & 1u) || !hist_.max_entries)
        return;
    if (a == HistoryEvent::Alloc && !hist_.stacks_trace)
        ctx = nullptr;
    if (hist_events_.size() >= hist_.max_entries)
        hist_events_.pop_front();
    hist_events_.push_back(HistoryEvent{a, device, addr, size, s, pool, hist_.clock(), std::move(ctx)});
}

void Core::note_block(HistoryEvent::Action a, const Block &b, std::shared_ptr<void> ctx)
{
    note(a, b.device, uintptr_t(b.ptr), b.usable, b.stream, b.pool ? b.pool->id : kDefaultPool, std::move(ctx));
}

/* A block's record deleted: its memory went back to fabpool (or the pool's own allocator). */
void Core::gone(Block *b)
{
    if (!b->fresh && history_on())
        note_block(HistoryEvent::SegmentFree, *b);
    unshare(b);
    delete b;
}

/* A freed block's share dropped (its device's lock held, as share_ipc holds it to add one): its handles are
 * refused from now on, even once its memory is a new block's, with the same descriptor. */
void Core::unshare(Block *b)
{
    if (!b->shared)
        return;
    b->shared = false;
    std::lock_guard<std::mutex> g(shares_mu_);
    auto it = share_keys_.find(uintptr_t(b->ptr));
    if (it != share_keys_.end()) {
        shares_.erase(it->second);
        share_keys_.erase(it);
    }
}

/* ------------------------------------------------------------ snapshot */

std::vector<SegmentRecord> Core::segments(PoolId only)
{
    std::vector<SegmentRecord> out;
    for (int i = 0; i < kMaxDevices; i++) {
        Device *d = dev_if(i);
        if (!d)
            continue;
        std::lock_guard<std::mutex> lk(d->mu);
        for (auto &sh : shards_) {
            std::lock_guard<std::mutex> lk2(sh.mu);
            for (auto &kv : sh.live) {
                Block *b = kv.second;
                PoolId pid = b->pool ? b->pool->id : kDefaultPool;
                if (b->device != i || (only != kDefaultPool && pid != only))
                    continue;
                out.push_back(SegmentRecord{i, b->ptr, b->size, b->usable, b->stream, true, pid, false, b->stack});
            }
        }
        for (auto &kv : d->pools) {
            if (only != kDefaultPool && kv.first != only)
                continue;
            for (auto &h : kv.second->held)
                if (h.second->state != BlockState::live)
                    out.push_back(SegmentRecord{i, h.first, h.second->size, h.second->usable, h.second->stream, false,
                                                kv.first, h.second->state == BlockState::waiting, nullptr});
        }
        /* the default pool's blocks freed and waiting for other streams' work (a private pool's are in held) */
        std::vector<Block *> waiting(d->deferred);
        for (auto &pe : d->pending)
            waiting.push_back(pe.b);
        for (Block *b : waiting)
            if (!b->pool && only == kDefaultPool)
                out.push_back(SegmentRecord{i, b->ptr, b->size, b->usable, b->stream, false, kDefaultPool, true, nullptr});
    }
    std::sort(out.begin(), out.end(), [](const SegmentRecord &a, const SegmentRecord &b) {
        return a.device != b.device ? a.device < b.device : uintptr_t(a.ptr) < uintptr_t(b.ptr);
    });
    return out;
}

/* ------------------------------------------------------------- IPC */

namespace {

/* fabpool_block_export of ptr into h's descriptor and fd numbers (the
 * pool's: valid while the block is live). */
fabpool_status export_block(fabpool_t *fp, void *ptr, ipc::Handle *h, size_t *offset)
{
    size_t len = 0, nfds = 0;
    std::string d(fabpool_desc_size(1), '\0');
    std::vector<int> fds(1, -1);
    fabpool_status st = fabpool_block_export(fp, ptr, &d[0], d.size(), &len, fds.data(), fds.size(), &nfds, offset);
    if (st == FABPOOL_ERR_LIMIT) { /* it said what it needs */
        d.resize(len);
        fds.resize(nfds ? nfds : 1);
        st = fabpool_block_export(fp, ptr, &d[0], d.size(), &len, fds.data(), fds.size(), &nfds, offset);
    }
    if (st != FABPOOL_OK)
        return st;
    d.resize(len);
    fds.resize(nfds);
    h->type = fabpool_handle_type_of(fp);
    h->desc = std::move(d);
    h->fds = std::move(fds);
    return FABPOOL_OK;
}

/* A share's key: 64 random bits (getrandom), never 0. */
uint64_t random_key()
{
    for (;;) {
        uint64_t k = 0;
        size_t got = 0;
        while (got < sizeof k) {
            ssize_t r = getrandom(reinterpret_cast<char *>(&k) + got, sizeof k - got, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                throw std::runtime_error(std::string("fabpool: shareIpcHandle: no random bytes for the share's "
                                                     "key: ") + strerror(errno));
            got += size_t(r);
        }
        if (k != 0)
            return k;
    }
}

std::string hex(const void *p)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%p", p);
    return buf;
}

}  // namespace

ipc::Server &Core::server()
{
    std::lock_guard<std::mutex> lk(server_mu_);
    if (server_ && server_->pid() != int(getpid())) {
        server_->abandon(); /* a forked child: its parent's server does not run here */
        server_ = nullptr;
    }
    if (!server_)
        server_ = new ipc::Server([this](uint64_t key, const std::string &desc, std::vector<int> *fds,
                                         std::string *msg) { return serve_ipc(key, desc, fds, msg); });
    return *server_;
}

IpcShare Core::share_ipc(void *ptr)
{
    int device = -1;
    with_live(ptr, [&](Block &b) { device = b.device; });
    ipc::Handle h;
    size_t offset = 0;
    h.pid = int(getpid());
    h.key = uint64_t(uintptr_t(ptr)); /* fabric: the descriptor is the whole handle, no server asked */
    if (device >= 0) {
        Device &d = dev(device);
        /* the block's pool stays while it is looked at, and the block stays live until its share is in shares_: a
         * free takes this lock before it drops the share (unshare), so no share outlives its block */
        std::lock_guard<std::mutex> lk(d.mu);
        fabpool_t *fp = nullptr;
        bool ext = false;
        auto pool_of = [&](Block &b) {
            b.shared = true;
            ext = b.pool && b.pool->ext;
            fp = b.pool ? b.pool->fp : fabpool_torch_pool(b.device);
        };
        if (!with_live(ptr, pool_of))
            device = -1;
        else if (ext)
            throw std::logic_error("fabpool: shareIpcHandle: the tensor at " + hex(ptr) + " comes from a "
                                   "torch.cuda.MemPool with an allocator of its own, which fabpool cannot export");
        else if (!fp || export_block(fp, ptr, &h, &offset) != FABPOOL_OK) {
            std::string why = fp ? fabpool_last_error() : "the device has no pool";
            if (fp && fabpool_handle_type_of(fp) == FABPOOL_HANDLE_NONE)
                throw std::logic_error("fabpool: shareIpcHandle: " + why + " (the device's pools were made with "
                                       "handle_type:none, by FABPOOL_CONF or for a device without POSIX fd handles)");
            throw std::runtime_error("fabpool: shareIpcHandle: " + why);
        }
        if (device >= 0 && h.type == FABPOOL_HANDLE_POSIX_FD) {
            /* the block shared again as it was keeps its key (a receiver that has its handle opens it once) */
            std::lock_guard<std::mutex> g(shares_mu_);
            auto k = share_keys_.find(uintptr_t(ptr));
            if (k != share_keys_.end() && shares_.at(k->second).desc == h.desc) {
                h.key = k->second;
            } else {
                if (k != share_keys_.end())
                    shares_.erase(k->second);
                do
                    h.key = random_key();
                while (shares_.count(h.key));
                shares_[h.key] = Share{uintptr_t(ptr), h.desc};
                share_keys_[uintptr_t(ptr)] = h.key;
            }
        }
    }
    if (device < 0)
        throw std::invalid_argument("fabpool: shareIpcHandle: " + hex(ptr) +
                                    " is not a live block of this allocator (never given out, or freed already)");
    if (h.type == FABPOOL_HANDLE_POSIX_FD) {
        ipc::Server &srv = server();
        memcpy(h.token, srv.token(), ipc::kTokenBytes);
        h.token_fd = srv.token_fd();
        h.server_id = srv.id();
    }
    return IpcShare{std::ptrdiff_t(offset), ipc::encode(h)};
}

/* The fd server's question: is the block at key still the one desc
 * describes?  Then copies of its fds. */
int Core::serve_ipc(uint64_t key, const std::string &desc, std::vector<int> *fds, std::string *msg)
{
    void *ptr = nullptr;
    bool shared = false;
    {
        /* only a block this process shared, by the key of its share, as it shared it: the token is the
         * process's, and neither an address nor a descriptor is a secret, so a receiver could otherwise ask for
         * any block it guessed (and make the pool export it) */
        std::lock_guard<std::mutex> g(shares_mu_);
        auto it = shares_.find(key);
        if (it != shares_.end()) {
            ptr = reinterpret_cast<void *>(it->second.ptr);
            shared = it->second.desc == desc;
        }
    }
    int device = -1;
    if (shared)
        with_live(ptr, [&](Block &b) { device = b.device; });
    ipc::Handle h;
    size_t offset = 0;
    fabpool_status st = FABPOOL_ERR_NOT_FOUND;
    if (device >= 0) {
        Device &d = dev(device);
        std::lock_guard<std::mutex> lk(d.mu);
        fabpool_t *fp = nullptr;
        if (with_live(ptr, [&](Block &b) { fp = b.pool ? b.pool->fp : fabpool_torch_pool(b.device); }) && fp)
            st = export_block(fp, ptr, &h, &offset);
        for (size_t i = 0; st == FABPOOL_OK && h.desc == desc && i < h.fds.size(); i++)
            fds->push_back(fcntl(h.fds[i], F_DUPFD_CLOEXEC, 0)); /* the pool's may close once the lock is let go */
    }
    if (st == FABPOOL_OK && h.desc == desc && std::find(fds->begin(), fds->end(), -1) == fds->end())
        return 0;
    for (int fd : *fds)
        if (fd >= 0)
            close(fd);
    fds->clear();
    *msg = (ptr ? "the block at " + hex(ptr) : "the block of this handle") + " in process " + std::to_string(getpid()) +
           (device < 0     ? " is no longer live, or was never shared"
            : st != FABPOOL_OK ? " is no longer live"
                               : " is no longer the one that was shared") +
           ": the sender freed the tensor before this receiver opened it (PyTorch keeps a shared tensor alive "
           "until its receivers let go: was it shared by other means?)";
    return FABPOOL_ERR_NOT_FOUND;
}

std::shared_ptr<void> Core::open_ipc(int device, const std::string &bytes)
{
    dev(device);
    ipc::Handle h;
    std::string why;
    if (!ipc::decode(bytes, &h, &why))
        throw std::invalid_argument("fabpool: getIpcDevPtr: " + why);
    auto state = ipc_;
    auto already_open = [&]() -> std::shared_ptr<void> {
        auto it = state->open.find(bytes);
        return it == state->open.end() ? nullptr : it->second.lock();
    };
    {
        std::lock_guard<std::mutex> lk(state->mu);
        if (auto sp = already_open())
            return sp;
    }
    std::vector<int> fds;
    if (h.type == FABPOOL_HANDLE_POSIX_FD)
        fds = ipc::fetch(h); /* before the lock: a round trip to the sender */
    std::lock_guard<std::mutex> lk(state->mu);
    if (auto sp = already_open()) {
        for (int fd : fds)
            close(fd);
        return sp;
    }
    fabpool_t *&pool = state->pools[device];
    if (!pool) {
        fabpool_options o;
        fabpool_options_init(&o);
        o.device = device;
        o.handle_type = FABPOOL_HANDLE_NONE; /* it only maps other processes' chunks */
        o.thread_cache = 0;
        size_t fr = 0, total = 0;
        rt_->mem_info(device, &fr, &total);
        o.reserve_bytes = uint64_t(total) * 2;
        if (fabpool_create(&o, &pool) != FABPOOL_OK) {
            pool = nullptr;
            for (int fd : fds)
                close(fd);
            throw std::runtime_error("fabpool: getIpcDevPtr: " + std::string(fabpool_last_error()) +
                                     " (making the pool that maps other processes' tensors on device " +
                                     std::to_string(device) + ")");
        }
    }
    fabpool_view_t *v = nullptr;
    if (fabpool_view_open(pool, h.desc.data(), h.desc.size(), fds.data(), fds.size(), &v) != FABPOOL_OK)
        throw std::runtime_error("fabpool: getIpcDevPtr: mapping the tensor of process " + std::to_string(h.pid) +
                                 ": " + fabpool_last_error());
    Runtime *rt = rt_;
    std::shared_ptr<void> sp(fabpool_view_ptr(v), [state, rt, v, device, bytes](void *) {
        {
            std::lock_guard<std::mutex> l2(state->mu);
            if (state->dead)
                return;
        }
        rt->device_sync(device); /* no kernel may still read or write the view when it is unmapped */
        std::lock_guard<std::mutex> l2(state->mu);
        if (state->dead)
            return;
        auto it = state->open.find(bytes);
        if (it != state->open.end() && it->second.expired())
            state->open.erase(it);
        fabpool_view_close(v);
        state->views--;
    });
    state->open[bytes] = sp;
    state->views++;
    return sp;
}

size_t Core::ipc_shares()
{
    std::lock_guard<std::mutex> g(shares_mu_);
    return shares_.size();
}

size_t Core::ipc_views()
{
    std::lock_guard<std::mutex> lk(ipc_->mu);
    return ipc_->views;
}

uint64_t Core::ipc_served(uint64_t *refused)
{
    std::lock_guard<std::mutex> lk(server_mu_);
    *refused = server_ ? server_->refused() : 0;
    return server_ ? server_->served() : 0;
}

}  // namespace fabpool_torch
