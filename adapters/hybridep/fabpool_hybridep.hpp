/*
 * fabpool_hybridep.hpp - a drop-in for HybridEP's ExtendedMemoryAllocator
 * (DeepEP, hybrid-ep branch, csrc/hybrid_ep/allocator/allocator.cuh), on
 * fabpool's C API.  Header only, C++17.
 *
 * The drop-in, in DeepEP's allocator.cuh after its own includes:
 *
 *     #include "fabpool_hybridep.hpp"
 *     using MemHandle = fabpool_hybridep::MemHandle;
 *     using ExtendedMemoryAllocator = fabpool_hybridep::ExtendedMemoryAllocator;
 *
 * (and allocator.cu left out of the build).  Every call DeepEP makes keeps its
 * shape: ExtendedMemoryAllocator(), allocate(void **, size_t), free(void *),
 * get_handle(MemHandle *, void *), open_handle(void **, MemHandle *),
 * close_handle(void *), is_accessible(MemHandle *), and, where pybind11 is
 * included before this header, detect_accessible_ranks(pybind11::object).
 *
 * What differs from upstream:
 *   - every driver reference is released by fabpool (a chunk's handle right
 *     after its map, an import handle right after the view's map, exported
 *     fds when the chunk goes): free() and close_handle() give the memory
 *     back, so the leak of DeepEP issue #799 cannot happen;
 *   - allocate() makes a growable buffer in an address window larger than
 *     the size (window_for()), and resize() + get_delta() + update_handle()
 *     grow it in place: its address and its peers' view addresses stay;
 *   - free() keeps a buffer's window and chunks for a while (keep_ms) and
 *     allocate() takes the kept buffer that fits best, growing it in place:
 *     DeepEP's unchanged update_buffer (free every buffer, allocate them
 *     again larger, export, open the peers') then maps, exports and imports
 *     only the growth, and close_handle() keeps a peer's view likewise for
 *     the open_handle() of the same buffer that follows;
 *   - where cuda_runtime_api.h comes first (DeepEP's allocator.cuh), the
 *     cudaMalloc and cudaFree after this header serve DeepEP's own small
 *     blocks from a private pool (detail::PrivateBlocks, and the macros at
 *     the end of this file), so that a regrow's frees and allocations of
 *     them make no driver call;
 *   - a MemHandle is 1,024 bytes (upstream's is 328): a header, up to nine
 *     exporter fd numbers, and fabpool's descriptor of up to nine chunks;
 *   - a POSIX-fd handle carries the exporter's proof of identity (below), and
 *     open_handle copies fds only out of the process that shows it;
 *   - agree_max() (with agree_enabled(), FABPOOL_HYBRIDEP_AGREE=1) lets
 *     update_buffer take the group's largest need before it decides to
 *     regrow, so that ranks with different token counts all regrow or none
 *     does (at the end of this file).
 *
 * Device and handle type (the default constructor): the device of the
 * current context (cuCtxGetDevice; device 0 where no context is current, as
 * the runtime's default device); fabric handles where a real probe works
 * (create + export + import), else POSIX fds, as upstream probes with a
 * cuMemCreate and falls back to cudaIpc; USE_MNNVL=0 or false turns fabric
 * off as upstream.  FABPOOL_CONF still applies on top of everything.
 *
 * POSIX fds cannot travel in bytes.  A POSIX-fd handle names the exporter's
 * pid and its fd numbers, and open_handle(ptr, h) copies the fds out of the
 * exporter with pidfd_getfd (Linux 5.6+).  The handle's bytes are trusted
 * as far as the all-gather that brought them, not further: a pid in them may
 * name a process that is not the exporter (a bug, a hostile rank, or a pid
 * reused once the exporter exited), and the importer would map that
 * process's memory as the peer's.  So every exporting process holds a
 * random token of its own in a sealed memfd (fabpool_fd_token_make) and
 * writes the token and the memfd's fd number into its handles; open_handle
 * pins the named process with a pidfd and copies nothing before that
 * process has shown the token (fabpool_fd_token_check: a process that does
 * not hold it is refused with FABPOOL_ERR_PERMISSION), then copies the fds
 * through that pidfd, which a reused pid cannot stand in for.  One pidfd is
 * kept per exporter and dropped once that process is gone.
 *
 * pidfd_getfd needs ptrace permission over the exporter: the same user, and
 * under Yama ptrace_scope 1 the exporter's consent (PR_SET_PTRACER), which
 * the exporter gives at its first POSIX-fd export, as narrowly as DeepEP's
 * unchanged code allows.  Its peers are the other ranks, which one launcher
 * started (torch.multiprocessing.spawn, torchrun, mpirun's daemon): the
 * exporter's parent.  Yama lets a consented process and its descendants
 * attach, so naming the parent admits the launcher and the ranks it
 * started, and no other process of the user (a browser, an editor's
 * plugins, a job started elsewhere).  No narrower consent works:
 * Yama keeps one ptracer a process, and a rank cannot name each peer
 * before the all-gather that tells their pids has run.  Where the parent is
 * the pid namespace's init (the launcher is a container's entrypoint), that
 * is every process of the container, which is what the container holds
 * anyway.  FABPOOL_HYBRIDEP_PTRACER changes it: unset or "parent" (the
 * default), a pid (the launcher's, where each rank runs under a wrapper of
 * its own: sh -c, srun), "any" (every process of the user for the life of
 * the process, as ptrace_scope 0 would), or
 * "0" (no consent: the peers need CAP_SYS_PTRACE, or use the socket
 * overloads).  The consent is withdrawn when the last allocator that gave
 * it is destroyed.  Where pidfd_getfd cannot work (ptrace_scope 2 or 3, a
 * seccomp filter, an old kernel) open_handle throws a message that says
 * what to change; the overloads taking fds (received over a socket with
 * fabpool_fd_recv, whose peer checks are fabpool_fdpass.h's) need no
 * permission at all.
 *
 * Errors are thrown as fabpool_hybridep::Error (a std::runtime_error) whose
 * what() names the call and carries fabpool_last_error(), and whose status()
 * is the fabpool_status.  The class is thread-safe.
 */
#ifndef FABPOOL_HYBRIDEP_HPP
#define FABPOOL_HYBRIDEP_HPP

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include "fabpool.h"

/* (the namespace cannot be fabpool::, which C++ sees as the pool's struct tag) */
namespace fabpool_hybridep {

/* Bytes of one handle, what each rank all-gathers per buffer.  Upstream's
 * MemHandle is 328 bytes; HybridEP sizes every handle array and all-gather by
 * sizeof(MemHandle), so a larger one costs only the all-gather's bytes.  A
 * kilobyte describes nine chunks: a buffer that DeepEP frees and allocates
 * again larger is reused in place (free + allocate keep the chunks it had,
 * each regrow maps one more), and nine chunks let eight regrows in a row
 * export only their new chunk before allocate() compacts the buffer. */
constexpr std::size_t kHandleBytes = 1024;
constexpr std::size_t kHandleHeaderBytes = 28;
/* as many fd numbers as the descriptor has records */
constexpr std::size_t kMaxHandleFds =
    (kHandleBytes - kHandleHeaderBytes - FABPOOL_DESC_HEADER_BYTES) / (FABPOOL_DESC_RECORD_BYTES + 4);
constexpr std::size_t kFdsAt = kHandleHeaderBytes;
constexpr std::size_t kDescAt = kHandleHeaderBytes + 4 * kMaxHandleFds;
constexpr std::size_t kMaxDescBytes = kHandleBytes - kDescAt;
/* Chunks one handle describes: a full handle of a buffer of at most this many
 * chunks, or a delta naming at most this many. */
constexpr std::size_t kMaxHandleChunks = (kMaxDescBytes - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES;
static_assert(kMaxHandleChunks >= 2 && kMaxHandleChunks == kMaxHandleFds,
              "a handle holds as many chunks as fds: fabpool's descriptor layout changed");

/* The pool's own settings (FABPOOL_CONF applies after them): address space for
 * every peer's window (reserving costs no memory); chunks large enough that a
 * fresh buffer is one chunk and a growth maps one chunk; no rounding past the
 * granularity (max_waste:0), so that a buffer holds what upstream's would (its
 * size rounded up to 2 MiB); and freed buffers and closed views kept 10 s
 * (keep_ms), long enough for a regrow whose collectives are slow (a loaded or
 * oversubscribed machine), while a regrow that reuses nothing, or the
 * allocator's end, gives them back at once.  FABPOOL_CONF=max_waste:25 maps up to a
 * quarter more at a growth, so that some later growths map nothing. */
constexpr const char *kPoolConf = "reserve:16TiB,max_chunk:64GiB,max_waste:0,keep_ms:10000";
/* The window of allocate(ptr, size): kWindowFactor x size, at least 2 MiB, at
 * most kMaxWindow (but never less than size).  An NVL72 token buffer at 16k
 * tokens per rank (72 x 16384 x 7168 x 2 B = 17 GB) fits in the window of one
 * allocated at 256 tokens or more. */
constexpr std::size_t kWindowFactor = 64;
constexpr std::size_t kMaxWindow = std::size_t(32) << 30;

/* A handle: plain bytes, safe to memcpy, all_gather and compare. */
struct MemHandle {
    unsigned char bytes[kHandleBytes];
};
static_assert(std::is_trivially_copyable<MemHandle>::value, "MemHandle must travel as raw bytes");
static_assert(sizeof(MemHandle) == kHandleBytes, "MemHandle has no padding");

class Error : public std::runtime_error {
  public:
    Error(fabpool_status s, const std::string &what) : std::runtime_error(what), status_(s) {}
    fabpool_status status() const noexcept { return status_; }

  private:
    fabpool_status status_;
};

enum class HandleKind : std::uint8_t { delta = 0, full = 1, unchanged = 2 };

/* What a handle says about itself (read_header). */
struct HandleInfo {
    HandleKind kind;           /* full (get_handle, or get_delta's re-export), delta, or unchanged */
    fabpool_handle_type type;  /* posix_fd or fabric */
    int pid;                   /* the exporter's process */
    std::uint32_t desc_len;
    std::uint32_t nfds;
    std::uint64_t host;        /* FNV-1a of the exporter's host name, folded to 32 bits */
    int token_fd;              /* POSIX fd: the exporter's token memfd (its fd number there); fabric: -1 */
};

/* Time and bytes of this allocator's calls (for benchmarks: what a regrow spends where). */
struct Stats {
    std::uint64_t allocs = 0, frees = 0, resizes = 0, exports = 0, full_reexports = 0, compactions = 0;
    std::uint64_t reuses = 0;    /* allocate() that took a buffer free() kept */
    std::uint64_t opens = 0, updates = 0, closes = 0;
    std::uint64_t ns_map = 0;    /* allocate + resize: create, map, set access */
    std::uint64_t ns_export = 0; /* get_handle + get_delta: export (fds, fabric bytes) */
    std::uint64_t ns_import = 0; /* open_handle + update_handle: pidfd_getfd, import, map */
    std::uint64_t ns_unmap = 0;  /* free + close_handle */
    std::uint64_t handle_bytes_used = 0; /* header + fds + descriptor bytes of the handles written */
};

namespace detail {
/* Header (host byte order; peers share one architecture):
 *   0 char[4] "FPH2"   4 u8 version   5 u8 kind   6 u8 handle type   7 u8 records
 *   8 i32 pid         12 i32 token fd (POSIX fd; -1 for fabric)       16 u32 host id
 *  20 u8[8] token (POSIX fd; zero for fabric)
 *  28 i32 fds[kMaxHandleFds] (the exporter's numbers, one per record for POSIX fd)
 *  kDescAt descriptor (fabpool_buffer_export): fabpool_desc_size(records) bytes, none for "unchanged".
 * The header has 28 bytes so that nine records and nine fds fit in 1,024: the
 * descriptor's length follows from its record count, and the token has 8
 * bytes.  The token is no password: it proves only that the process a pid
 * names is the one that made the handle, and a process that is not holds no
 * memfd of those bytes unless it guesses 64 random bits. */
constexpr char kMagic[4] = {'F', 'P', 'H', '2'};
constexpr std::uint8_t kVersion = 4;
constexpr std::size_t kTokenBytes = 8;
constexpr std::size_t kTokenFdAt = 12, kHostAt = 16, kTokenAt = 20;
static_assert(kTokenAt + kTokenBytes == kHandleHeaderBytes, "the header's fields fill it");

inline std::uint64_t host_id()
{
    char h[256] = {0};
    if (gethostname(h, sizeof h - 1) != 0)
        std::strcpy(h, "unknown");
    std::uint64_t x = 1469598103934665603ull;
    for (const char *c = h; *c; c++)
        x = (x ^ (unsigned char)*c) * 1099511628211ull;
    return (x ^ (x >> 32)) & 0xffffffffull;
}

/* What a token memfd holds: the token, then the pid of the process that
 * made it, so that a child forked from the exporter, which inherits the
 * memfd, does not pass for the exporter. */
inline std::string proof_bytes(const unsigned char *token, std::int32_t pid)
{
    std::string b(reinterpret_cast<const char *>(token), kTokenBytes);
    b.append(reinterpret_cast<const char *>(&pid), 4);
    return b;
}

/* This process's proof for its POSIX-fd handles: a random token and the
 * sealed memfd that holds it with this pid, made at the first export (a
 * forked child makes its own at its first).  Never closed: a peer may open
 * a handle as long as the process lives. */
struct Proof {
    fabpool_status status = FABPOOL_OK;
    std::string msg;
    unsigned char token[kTokenBytes] = {};
    int fd = -1;
    int pid = 0; /* the process it was made in */
};
inline const Proof &proof()
{
    static Proof p;
    static std::mutex mu;
    std::lock_guard<std::mutex> g(mu);
    if (p.pid == (int)getpid())
        return p;
    p = Proof(); /* (a parent's memfd stays open in a forked child: it proves nothing for the child's pid) */
    p.pid = (int)getpid();
    std::size_t got = 0;
    while (got < kTokenBytes) {
        ssize_t r = getrandom(p.token + got, kTokenBytes - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            p.status = FABPOOL_ERR_IO;
            p.msg = std::string("no random bytes for the exporter's token: ") + std::strerror(errno);
            return p;
        }
        got += (std::size_t)r;
    }
    std::string b = proof_bytes(p.token, p.pid);
    p.status = fabpool_fd_token_make(b.data(), b.size(), &p.fd);
    if (p.status != FABPOOL_OK)
        p.msg = fabpool_last_error();
    return p;
}

/* Whom this process lets copy its fds under Yama ptrace_scope 1
 * (PR_SET_PTRACER), from FABPOOL_HYBRIDEP_PTRACER (NULL: unset) and the
 * parent's pid: the launcher of the ranks by default (the file's comment
 * says why).  bad: a value it does not know (why says which are). */
struct Ptracer {
    enum Kind { none, one, any, bad } kind;
    int pid; /* one: the process named */
};
inline Ptracer ptracer_choice(const char *env, int parent)
{
    std::string v = env ? env : "";
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return (char)std::tolower(c); });
    if (v.empty() || v == "parent")
        return parent > 0 ? Ptracer{Ptracer::one, parent} : Ptracer{Ptracer::none, 0};
    if (v == "any")
        return {Ptracer::any, 0};
    if (v == "0" || v == "none")
        return {Ptracer::none, 0};
    long pid = 0;
    for (char c : v) {
        if (c < '0' || c > '9' || pid > 99999999)
            return {Ptracer::bad, 0};
        pid = pid * 10 + (c - '0');
    }
    return pid > 0 && pid <= 0x3fffffff ? Ptracer{Ptracer::one, (int)pid} : Ptracer{Ptracer::bad, 0};
}

/* The allocators of this process that gave the consent (Ptracer::one or
 * any): the last to go withdraws it. */
struct Consent {
    std::mutex mu;
    int holders = 0;
};
inline Consent &consent() { static Consent c; return c; }
inline std::string last() { return fabpool_last_error(); }
inline std::uint64_t now_ns()
{
    return (std::uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
struct Timer {
    std::uint64_t &acc, t0;
    explicit Timer(std::uint64_t &a) : acc(a), t0(now_ns()) {}
    ~Timer() { acc += now_ns() - t0; }
};

/* The device of the calling thread's current context, or -1 if none is
 * current (or the driver cannot be loaded: pool creation will say why). */
inline int current_device()
{
    const char *lib = ::secure_getenv("FABPOOL_CUDA_LIBRARY");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    typedef int (*ctx_get_device_t)(int *);
    ctx_get_device_t f = (ctx_get_device_t)dlsym(h, "cuCtxGetDevice");
    int d = -1;
    if (!f || f(&d) != 0)
        d = -1;
    dlclose(h); /* (libcuda stays loaded: fabpool and the runtime hold it) */
    return d;
}

/* An environment variable in lower case ("" where unset). */
inline std::string env_lower(const char *name)
{
    const char *v = ::secure_getenv(name);
    std::string s(v ? v : "");
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char)std::tolower(c); });
    return s;
}

/* USE_MNNVL=0|false (any case) turns fabric off, as upstream. */
inline bool mnnvl_off()
{
    std::string s = env_lower("USE_MNNVL");
    return s == "0" || s == "false";
}

/* A pool on device with conf (FABPOOL_CONF syntax; the environment's applies on top). */
inline fabpool_status create_pool(int device, const std::string &conf, fabpool_t **out)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = device;
    o.conf = conf.c_str();
    return fabpool_create(&o, out);
}

/* A struct fabpool fills, its struct_size set (fabpool.h). */
template <class T> T sized()
{
    T t{};
    t.struct_size = sizeof t;
    return t;
}

/* DeepEP's own device memory.  Besides the shared buffers, HybridEP's
 * NVLCoordinator and CustomAllgather cudaMalloc about a dozen small blocks
 * of their own (flags, preprocessing scratch, the all-gather's table of
 * pointers) and cudaFree them at every regrow: two driver calls a block, and
 * a cudaFree of a block the driver sub-allocated costs tens of microseconds.
 * Where this header follows cuda_runtime_api.h (DeepEP's allocator.cuh), the
 * cudaMalloc and cudaFree written after it come here (the macros at the end
 * of this file): blocks of a pool of local memory per device, kept mapped
 * while an ExtendedMemoryAllocator lives, so that a regrow's frees and
 * allocations make no driver call.  The pool goes, and its memory with it,
 * when the last ExtendedMemoryAllocator and the last of its blocks are gone.
 * free() keeps cudaFree's promise that the device is idle first (one
 * cuCtxSynchronize: HybridEP frees flags that a kernel may still poll).
 * FABPOOL_HYBRIDEP_PRIVATE=0 sends both calls to the driver (cuMemAlloc,
 * cuCtxSynchronize + cuMemFree), as upstream's cudaMalloc and cudaFree do;
 * FABPOOL_HYBRIDEP_PRIVATE_CONF is FABPOOL_CONF syntax for the pools (after
 * handle_type:none; FABPOOL_CONF applies on top).  A block the pool cannot
 * give (its address space used up, say) comes from the driver. */
class PrivateBlocks {
  public:
    /* The one instance, never destroyed: a static destructor of DeepEP's may
     * free a block after this header's statics are gone. */
    static PrivateBlocks &get()
    {
        static PrivateBlocks *p = new PrivateBlocks();
        return *p;
    }

    /* size bytes (cudaMalloc's 256-byte alignment) on the current context's
     * device.  Returns 0 (CUDA_SUCCESS) or the driver's error code; the
     * runtime's codes are the same numbers for the errors this can meet
     * (out of memory 2, invalid value 1, no context 201). */
    int alloc(void **ptr, std::size_t size)
    {
        if (!ptr)
            return kInvalidValue;
        *ptr = nullptr;
        int dev = -1;
        int r = current_device(&dev);
        if (r != 0)
            return r;
        Clock c(ns_alloc_);
        if (!enabled())
            return legacy_alloc(ptr, size);
        /* cudaMalloc(0) succeeds with NULL; a multiple of 256 keeps cudaMalloc's alignment */
        if (size == 0)
            return 0;
        std::size_t n = (size + 255) & ~std::size_t(255);
        if (n < size)
            return kOutOfMemory;
        std::lock_guard<std::mutex> g(mu_);
        Dev &d = devs_[dev];
        if (!d.pool) {
            std::string conf = "handle_type:none";
            const char *more = ::secure_getenv("FABPOOL_HYBRIDEP_PRIVATE_CONF");
            if (more && *more)
                conf += std::string(",") + more;
            if (create_pool(dev, conf, &d.pool) != FABPOOL_OK) {
                d.pool = nullptr;
                return legacy_alloc(ptr, size); /* (fabpool's message is in fabpool_last_error) */
            }
        }
        fabpool_status s = fabpool_alloc(d.pool, n, ptr);
        if (s == FABPOOL_ERR_OUT_OF_MEMORY)
            return kOutOfMemory;
        if (s != FABPOOL_OK)
            return legacy_alloc(ptr, size); /* the pool's address space used up, say */
        d.live++;
        allocs_++;
        return 0;
    }

    /* Waits for the device to be idle, then frees a block of alloc() (or of
     * the driver: one fabpool does not know).  NULL: nothing, as cudaFree. */
    int free(void *ptr)
    {
        if (!ptr)
            return 0;
        Clock c(ns_free_);
        int dev = -1;
        int r = current_device(&dev);
        if (r != 0)
            return r;
        int sync;
        {
            Clock cs(ns_sync_);
            sync = ctx_sync_();
        }
        std::lock_guard<std::mutex> g(mu_);
        for (auto &e : devs_) {
            Dev &d = e.second;
            std::size_t usable = 0;
            if (!d.pool || fabpool_usable_size(d.pool, ptr, &usable) != FABPOOL_OK)
                continue;
            fabpool_status s = fabpool_free(d.pool, ptr);
            if (s != FABPOOL_OK)
                return kInvalidValue;
            d.live--;
            frees_++;
            drop_if_unused(d);
            return sync;
        }
        r = mem_free_((std::uintptr_t)ptr);
        return sync != 0 ? sync : r;
    }

    /* An ExtendedMemoryAllocator begins or ends: while one lives, the pools
     * stay between a free of every block and the next allocation. */
    void allocator_begins()
    {
        std::lock_guard<std::mutex> g(mu_);
        allocators_++;
    }
    void allocator_ends()
    {
        std::lock_guard<std::mutex> g(mu_);
        allocators_--;
        for (auto &e : devs_)
            drop_if_unused(e.second);
    }

    /* For tests: device's pool (NULL while it has none), its live blocks,
     * and the blocks alloc() and free() served from pools so far. */
    fabpool_t *pool(int device)
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = devs_.find(device);
        return it == devs_.end() ? nullptr : it->second.pool;
    }
    std::size_t live(int device)
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = devs_.find(device);
        return it == devs_.end() ? 0 : it->second.live;
    }
    std::uint64_t pool_allocs()
    {
        std::lock_guard<std::mutex> g(mu_);
        return allocs_;
    }
    std::uint64_t pool_frees()
    {
        std::lock_guard<std::mutex> g(mu_);
        return frees_;
    }
    /* Time in alloc() and free() so far, and the part of free() spent in
     * its synchronization (for benchmarks: what a regrow spends where). */
    struct Times {
        std::uint64_t ns_alloc, ns_free, ns_sync;
    };
    Times times() const { return Times{ns_alloc_.load(), ns_free_.load(), ns_sync_.load()}; }
    static bool enabled()
    {
        std::string s = env_lower("FABPOOL_HYBRIDEP_PRIVATE");
        return !(s == "0" || s == "false");
    }

  private:
    static constexpr int kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3;
    struct Dev {
        fabpool_t *pool = nullptr;
        std::size_t live = 0;
    };
    /* adds the time of its scope to a counter */
    struct Clock {
        std::atomic<std::uint64_t> &acc;
        std::uint64_t t0 = now_ns();
        explicit Clock(std::atomic<std::uint64_t> &a) : acc(a) {}
        ~Clock() { acc += now_ns() - t0; }
    };
    PrivateBlocks() = default;

    /* the driver fabpool loads (FABPOOL_CUDA_LIBRARY, else libcuda.so.1), kept loaded */
    int load()
    {
        std::call_once(load_once_, [this] {
            const char *lib = ::secure_getenv("FABPOOL_CUDA_LIBRARY");
            void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!h)
                return;
            *(void **)&ctx_get_device_ = dlsym(h, "cuCtxGetDevice");
            *(void **)&ctx_sync_ = dlsym(h, "cuCtxSynchronize");
            *(void **)&mem_alloc_ = dlsym(h, "cuMemAlloc_v2");
            *(void **)&mem_free_ = dlsym(h, "cuMemFree_v2");
            *(void **)&primary_retain_ = dlsym(h, "cuDevicePrimaryCtxRetain");
            *(void **)&release_primary_ = dlsym(h, "cuDevicePrimaryCtxRelease_v2");
            *(void **)&ctx_set_current_ = dlsym(h, "cuCtxSetCurrent");
        });
        return ctx_get_device_ && ctx_sync_ && mem_alloc_ && mem_free_ && primary_retain_ && release_primary_ &&
                       ctx_set_current_
                   ? 0
                   : kNotInitialized;
    }
    /* The current context's device; in a thread without one, the primary
     * context of device 0 made current, as the runtime does. */
    int current_device(int *dev)
    {
        int r = load();
        if (r != 0)
            return r;
        if (ctx_get_device_(dev) == 0)
            return 0;
        void *ctx = nullptr;
        r = primary_retain_(&ctx, 0);
        if (r == 0) {
            std::lock_guard<std::mutex> g(mu_);
            if (primary_)
                release_primary_(0); /* this process holds one reference, however many threads */
            primary_ = true;
        }
        if (r == 0)
            r = ctx_set_current_(ctx);
        return r == 0 ? ctx_get_device_(dev) : r;
    }
    int legacy_alloc(void **ptr, std::size_t size)
    {
        std::uintptr_t p = 0;
        int r = size ? mem_alloc_(&p, size) : 0;
        *ptr = r == 0 ? (void *)p : nullptr;
        return r;
    }
    /* (mu_ held) */
    void drop_if_unused(Dev &d)
    {
        if (d.pool && d.live == 0 && allocators_ == 0) {
            fabpool_destroy(d.pool);
            d.pool = nullptr;
        }
    }

    std::once_flag load_once_;
    int (*ctx_get_device_)(int *) = nullptr;
    int (*ctx_sync_)(void) = nullptr;
    int (*mem_alloc_)(std::uintptr_t *, std::size_t) = nullptr;
    int (*mem_free_)(std::uintptr_t) = nullptr;
    int (*primary_retain_)(void **, int) = nullptr;
    int (*release_primary_)(int) = nullptr;
    int (*ctx_set_current_)(void *) = nullptr;
    bool primary_ = false;
    std::mutex mu_;
    std::map<int, Dev> devs_;
    int allocators_ = 0;
    std::uint64_t allocs_ = 0, frees_ = 0;
    std::atomic<std::uint64_t> ns_alloc_{0}, ns_free_{0}, ns_sync_{0};
};

} // namespace detail

class ExtendedMemoryAllocator {
  public:
    /* Upstream's constructor: a pool of its own on the current device, with
     * fabric handles where they work and USE_MNNVL allows them, else POSIX fds. */
    ExtendedMemoryAllocator() : ExtendedMemoryAllocator(-1, nullptr, 0) {}
    /* A pool of its own on `device` (-1: the current context's); conf is
     * FABPOOL_CONF syntax applied after the adapter's own settings (may be
     * NULL; the FABPOOL_CONF environment variable still applies on top).
     * default_window: the window of allocate(ptr, size); 0: window_for(size). */
    explicit ExtendedMemoryAllocator(int device, const char *conf = nullptr, std::size_t default_window = 0)
        : window_(default_window), host_(detail::host_id())
    {
        if (device < 0)
            device = detail::current_device();
        if (device < 0)
            device = 0; /* no current context: the runtime's default device */
        std::string c = kPoolConf;
        if (detail::mnnvl_off())
            c += ",handle_type:posix_fd";
        if (conf && *conf)
            c += std::string(",") + conf;
        fabpool_status s = detail::create_pool(device, c, &pool_);
        if (s == FABPOOL_ERR_DRIVER || s == FABPOOL_ERR_LIMIT || s == FABPOOL_ERR_OUT_OF_MEMORY) {
            /* a machine that refuses the large reservation: the pool's default one */
            std::string first = detail::last();
            c.replace(0, std::strlen("reserve:16TiB"), "reserve:0");
            s = detail::create_pool(device, c, &pool_);
            if (s != FABPOOL_OK)
                throw Error(s, "fabpool hybridep: creating the pool on device " + std::to_string(device) + ": " +
                                   first + "; with the default reservation: " + detail::last());
        } else if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: creating the pool on device " + std::to_string(device) + ": " +
                               detail::last());
        owned_ = true;
        detail::PrivateBlocks::get().allocator_begins();
    }
    /* Uses a pool the caller owns (it must outlive this object). */
    explicit ExtendedMemoryAllocator(fabpool_t *pool, std::size_t default_window = 0)
        : pool_(pool), window_(default_window), host_(detail::host_id())
    {
        if (!pool)
            throw Error(FABPOOL_ERR_INVALID_ARG, "fabpool hybridep: a NULL pool was given");
        detail::PrivateBlocks::get().allocator_begins();
    }
    ExtendedMemoryAllocator(const ExtendedMemoryAllocator &) = delete;
    ExtendedMemoryAllocator &operator=(const ExtendedMemoryAllocator &) = delete;

    /* Closes every view still open, frees every buffer still allocated (the
     * test buffer of detect_accessible_ranks too), and destroys the pool if it
     * is this object's own. */
    ~ExtendedMemoryAllocator()
    {
        for (auto &v : views_)
            fabpool_view_close(v.second);
        for (auto &b : bufs_) {
            fabpool_buffer_peers_ack(b.second.buf, UINT64_MAX);
            fabpool_buffer_destroy(b.second.buf, nullptr);
        }
        if (owned_)
            fabpool_destroy(pool_);
        for (auto &e : pidfds_)
            ::close(e.second.pidfd);
        withdraw_consent();
        detail::PrivateBlocks::get().allocator_ends();
    }

    fabpool_t *pool() const noexcept { return pool_; }
    fabpool_handle_type handle_type() const noexcept { return fabpool_handle_type_of(pool_); }
    int device() const noexcept
    {
        fabpool_options o;
        fabpool_options_init(&o);
        return fabpool_get_options(pool_, &o) == FABPOOL_OK ? o.device : -1;
    }
    Stats stats() const
    {
        std::lock_guard<std::mutex> g(mu_);
        return stats_;
    }
    /* What fabpool says of a buffer of allocate() (base, size, mapped, window, chunks, generation). */
    fabpool_buffer_info info(void *ptr)
    {
        fabpool_buffer_info in = detail::sized<fabpool_buffer_info>();
        fabpool_buffer_get_info(find_buf(ptr, "info"), &in);
        return in;
    }
    /* The address window allocate(ptr, size) gives a buffer. */
    std::size_t window_for(std::size_t size) const noexcept
    {
        if (window_)
            return std::max(window_, size);
        std::size_t w = size > kMaxWindow / kWindowFactor ? kMaxWindow : size * kWindowFactor;
        return std::max(std::max(w, std::size_t(2) << 20), size);
    }

    /* ------------------------------------------------ HybridEP's six calls */

    /* size bytes of shareable device memory at *ptr, in a window of
     * window_for(size) bytes that resize() grows into without moving it: a
     * buffer that free() kept, where one's window holds size (it keeps its
     * address and maps only what it lacks), else a new one. */
    void allocate(void **ptr, std::size_t size) { allocate(ptr, size, 0); }
    /* The same in a window of max(max_size, size) bytes (0: window_for(size)),
     * always a new buffer when max_size is given. */
    void allocate(void **ptr, std::size_t size, std::size_t max_size)
    {
        if (!ptr)
            throw Error(FABPOOL_ERR_INVALID_ARG, "fabpool hybridep: allocate: ptr is NULL");
        if (size == 0)
            size = 1; /* upstream rounds 0 up to one granule too */
        std::size_t win = max_size ? std::max(max_size, size) : window_for(size);
        fabpool_buffer_t *b = nullptr;
        std::uint64_t ns = 0;
        fabpool_status s = FABPOOL_ERR_NOT_FOUND;
        bool reused = false, compacted = false;
        {
            detail::Timer t(ns);
            if (!max_size)
                reused = (s = fabpool_buffer_reuse(pool_, size, nullptr, &b)) == FABPOOL_OK;
            if (s == FABPOOL_ERR_NOT_FOUND)
                s = fabpool_buffer_create(pool_, win, size, &b);
            if (s == FABPOOL_OK && reused && chunks_of(b) > kMaxHandleChunks) {
                /* its full handle would not fit: a new buffer of one chunk instead (DeepEP opens
                 * every handle again after a regrow: the address may change) */
                compacted = true;
                reused = false;
                s = fabpool_buffer_destroy(b, nullptr);
                if (s == FABPOOL_OK)
                    s = fabpool_buffer_create(pool_, win, size, &b);
            }
        }
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: allocate(" + std::to_string(size) + " bytes, window " +
                               std::to_string(win) + "): " + detail::last());
        std::lock_guard<std::mutex> g(mu_);
        *ptr = fabpool_buffer_ptr(b);
        bufs_[*ptr] = Buf{b, 0, 0, false};
        stats_.allocs++;
        stats_.reuses += reused;
        stats_.compactions += compacted;
        stats_.ns_map += ns;
    }

    /* Frees a buffer of allocate(): fabpool keeps its window and chunks for
     * the next allocate() a while (keep_ms; FABPOOL_CONF=keep_ms:0 gives
     * them back at once).  Peers' views keep their own mappings (POSIX fd)
     * or must have been closed first (fabric, as in HybridEP, whose
     * release_buffer closes the peers' handles on every rank). */
    void free(void *ptr)
    {
        if (!ptr)
            return;
        std::uint64_t ns = 0;
        fabpool_status s;
        {
            fabpool_buffer_t *b = take_buf(ptr, "free");
            detail::Timer t(ns);
            fabpool_buffer_peers_ack(b, UINT64_MAX);
            s = fabpool_buffer_release(b);
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            stats_.frees++;
            stats_.ns_unmap += ns;
        }
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: free: " + detail::last());
    }

    /* The full handle of a buffer of allocate(), for a peer's first view. */
    void get_handle(MemHandle *mem_handle, void *ptr) { export_into(mem_handle, ptr, true, "get_handle"); }

    /* Opens a peer's full handle at *ptr.  POSIX fd: copies the exporter's
     * fds by pidfd_getfd; the overload with fds takes them from a socket. */
    void open_handle(void **ptr, MemHandle *mem_handle) { open_or_update(ptr, nullptr, mem_handle, nullptr, 0, false); }
    /* The same with the fds received over a socket (fabpool_fd_recv): the
     * adapter takes them and closes them whatever the outcome. */
    void open_handle(void **ptr, const MemHandle *mem_handle, const int *fds, std::size_t nfds)
    {
        open_or_update(ptr, nullptr, mem_handle, fds, nfds, true);
    }

    /* Unmaps a peer's buffer opened by open_handle (fabpool keeps the view
     * for the next open_handle of the same buffer a while: keep_ms). */
    void close_handle(void *ptr)
    {
        if (!ptr)
            return;
        fabpool_view_t *v = nullptr;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = views_.find(ptr);
            if (it == views_.end())
                throw Error(FABPOOL_ERR_NOT_FOUND, "fabpool hybridep: close_handle: " + ptr_str(ptr) +
                                                       " is not a view opened by open_handle");
            v = it->second;
            views_.erase(it);
        }
        std::uint64_t ns = 0;
        fabpool_status s;
        {
            detail::Timer t(ns);
            s = fabpool_view_release(v); /* kept for an open_handle of the same buffer (keep_ms) */
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            stats_.closes++;
            stats_.ns_unmap += ns;
        }
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: close_handle: " + detail::last());
    }

    /* Whether this process can open the handle: a well-formed handle of this
     * pool's handle type; fabric: its import works (as upstream tries); POSIX
     * fd: exported on this host (as upstream compares host names) by a
     * process that still runs. */
    bool is_accessible(MemHandle *mem_handle)
    {
        HandleInfo in = {};
        if (!mem_handle || !read_header(*mem_handle, &in) || in.kind == HandleKind::unchanged)
            return false;
        if (in.type != handle_type())
            return false;
        if (in.type == FABPOOL_HANDLE_POSIX_FD)
            return in.host == host_ &&
                   (in.pid == getpid() || kill(in.pid, 0) == 0 || errno != ESRCH);
        if (in.kind != HandleKind::full)
            return false;
        try { /* fabric: a view opened and closed again (upstream imports and releases) */
            void *p = nullptr;
            open_or_update(&p, nullptr, mem_handle, nullptr, 0, false);
            close_handle(p);
            return true;
        } catch (const Error &) {
            return false;
        }
    }

#ifdef PYBIND11_VERSION_MAJOR
    /* Upstream's probe of the NVLink domain: all-gathers the handle of a small
     * test buffer over process_group (torch.distributed.all_gather of a uint8
     * CUDA tensor, as upstream) and counts the ranks whose handle this process
     * can open, itself included (then one more all-gather, as a barrier). */
    int detect_accessible_ranks(pybind11::object process_group)
    {
        namespace py = pybind11;
        MemHandle mine = test_handle();
        py::module_ torch = py::module_::import("torch");
        py::module_ dist = py::module_::import("torch.distributed");
        py::object builtins = py::module_::import("builtins");
        int world = process_group.attr("size")().cast<int>();
        int me = process_group.attr("rank")().cast<int>();
        py::bytearray raw(reinterpret_cast<const char *>(mine.bytes), sizeof mine.bytes);
        py::object t = torch.attr("frombuffer")(raw, py::arg("dtype") = torch.attr("uint8")).attr("cuda")();
        py::list out;
        for (int i = 0; i < world; i++)
            out.append(torch.attr("empty_like")(t));
        dist.attr("all_gather")(out, t, process_group);
        int n = 1;
        for (int i = 0; i < world; i++) {
            if (i == me)
                continue;
            std::string b = builtins.attr("bytes")(out[(std::size_t)i].attr("cpu")().attr("tolist")()).cast<std::string>();
            MemHandle h;
            std::memset(h.bytes, 0, sizeof h.bytes);
            std::memcpy(h.bytes, b.data(), std::min(b.size(), sizeof h.bytes));
            if (is_accessible(&h))
                n++;
        }
        /* a second all-gather as a barrier: no rank frees its test buffer (with the
         * allocator) while a peer still imports it */
        dist.attr("all_gather")(out, t, process_group);
        return n;
    }
#endif

    /* --------------------------------------------- growth in place (update_buffer) */

    /* Grows or shrinks a buffer of allocate() to size bytes in place (its
     * address stays; growing maps only what is missing, in one chunk; a
     * shrink unmaps once the work on `stream` (a CUstream, or NULL: the
     * context) is done and the peers have applied the shrink's handle).
     * Returns true if the mapped chunks changed, i.e. the peers need the
     * handle get_delta() writes.  FABPOOL_ERR_LIMIT past the window: then
     * free and allocate again (HybridEP's unchanged path).  New memory is
     * not zeroed: fresh chunks hold whatever the driver gives, chunks taken
     * back from a shrink keep their old bytes. */
    bool resize(void *ptr, std::size_t size, void *stream = nullptr)
    {
        fabpool_buffer_t *b = find_buf(ptr, "resize");
        fabpool_buffer_info before = detail::sized<fabpool_buffer_info>(), after = before;
        fabpool_buffer_get_info(b, &before);
        std::uint64_t ns = 0;
        fabpool_status s;
        {
            detail::Timer t(ns);
            s = fabpool_buffer_resize(b, size ? size : 1, stream);
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            stats_.resizes++;
            stats_.ns_map += ns;
        }
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: resize(" + std::to_string(size) + " bytes): " + detail::last());
        fabpool_buffer_get_info(b, &after);
        return after.generation != before.generation;
    }

    /* The handle a peer's view needs after resize(): only the chunks mapped
     * or dropped since the last handle exported ("unchanged" if none).  Where
     * the delta does not fit in one handle, a full handle; where that does
     * not fit either (more than kMaxHandleChunks chunks), the buffer is first
     * compacted into at most two chunks at the same address (its bytes past
     * the first chunk are not kept, as upstream's reallocation keeps none),
     * which needs every peer to have applied the last handle (peers_done).
     * Every peer must apply every handle exported, in order (update_handle). */
    void get_delta(MemHandle *mem_handle, void *ptr) { export_into(mem_handle, ptr, false, "get_delta"); }

    /* Applies a peer's handle of get_delta (a delta, a full one, or
     * "unchanged": nothing to do) to the view at ptr, whose address stays. */
    void update_handle(void *ptr, MemHandle *mem_handle)
    {
        void *p = ptr;
        open_or_update(&p, ptr, mem_handle, nullptr, 0, false);
    }
    void update_handle(void *ptr, const MemHandle *mem_handle, const int *fds, std::size_t nfds)
    {
        void *p = ptr;
        open_or_update(&p, ptr, mem_handle, fds, nfds, true);
    }

    /* Every peer has opened or applied the last handle of ptr: the exporter
     * closes its copies of the fds (a peer can no longer copy them with
     * pidfd_getfd), and chunks that a shrink dropped may go. */
    void peers_done(void *ptr)
    {
        fabpool_buffer_t *b = find_buf(ptr, "peers_done");
        std::uint64_t gen;
        {
            std::lock_guard<std::mutex> g(mu_);
            gen = bufs_[ptr].sent_gen;
        }
        fabpool_status s = fabpool_buffer_peers_ack(b, gen);
        if (s == FABPOOL_OK)
            s = fabpool_buffer_export_done(b);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: peers_done: " + detail::last());
        std::lock_guard<std::mutex> g(mu_);
        bufs_[ptr].acked_gen = gen;
    }

    /* The exporter's fds a handle names, for fabpool_fd_send (valid in the
     * exporting process only, until peers_done).  Returns how many. */
    static std::size_t fds_of(const MemHandle &h, int *fds, std::size_t cap)
    {
        HandleInfo in = {};
        if (!read_header(h, &in))
            return 0;
        std::size_t n = in.nfds < cap ? in.nfds : cap;
        if (n) /* (fds may be NULL with cap 0: just the count) */
            std::memcpy(fds, h.bytes + kFdsAt, 4 * n);
        return in.nfds;
    }

    /* Reads a handle's header; false if it is not a handle of this adapter
     * (every field is bounded: the descriptor and the fds it names lie
     * inside the handle). */
    static bool read_header(const MemHandle &h, HandleInfo *out) noexcept
    {
        const unsigned char *b = h.bytes;
        std::int32_t pid, token_fd;
        std::uint32_t host;
        std::memcpy(&pid, b + 8, 4);
        std::memcpy(&token_fd, b + detail::kTokenFdAt, 4);
        std::memcpy(&host, b + detail::kHostAt, 4);
        const bool posix = b[6] == FABPOOL_HANDLE_POSIX_FD, unchanged = b[5] == (std::uint8_t)HandleKind::unchanged;
        const std::size_t records = b[7];
        if (std::memcmp(b, detail::kMagic, 4) != 0 || b[4] != detail::kVersion || b[5] > 2 ||
            (!posix && b[6] != FABPOOL_HANDLE_FABRIC) || records > kMaxHandleChunks || (unchanged && records) ||
            pid <= 0 || (posix ? token_fd < 0 : token_fd != -1))
            return false;
        for (std::size_t i = 0; posix && i < records; i++) {
            std::int32_t fd;
            std::memcpy(&fd, b + kFdsAt + 4 * i, 4);
            if (fd < 0)
                return false;
        }
        out->kind = (HandleKind)b[5];
        out->type = (fabpool_handle_type)b[6];
        out->nfds = posix ? (std::uint32_t)records : 0;
        out->pid = pid;
        out->desc_len = unchanged ? 0 : (std::uint32_t)fabpool_desc_size(records);
        out->host = host;
        out->token_fd = token_fd;
        return true;
    }

  private:
    struct Buf {
        fabpool_buffer_t *buf;
        std::uint64_t sent_gen;  /* generation of the last handle exported */
        std::uint64_t acked_gen; /* generation every peer has applied (peers_done) */
        bool sent;               /* exported at all */
    };

    static std::string ptr_str(const void *p)
    {
        char s[32];
        std::snprintf(s, sizeof s, "%p", p);
        return s;
    }

    static std::size_t chunks_of(fabpool_buffer_t *b)
    {
        fabpool_buffer_info in = detail::sized<fabpool_buffer_info>();
        fabpool_buffer_get_info(b, &in);
        return in.n_chunks;
    }

    fabpool_buffer_t *find_buf(void *ptr, const char *call)
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = bufs_.find(ptr);
        if (it == bufs_.end())
            throw Error(FABPOOL_ERR_NOT_FOUND, std::string("fabpool hybridep: ") + call + ": " + ptr_str(ptr) +
                                                   " is not the base of a buffer of allocate()");
        return it->second.buf;
    }
    fabpool_buffer_t *take_buf(void *ptr, const char *call)
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = bufs_.find(ptr);
        if (it == bufs_.end())
            throw Error(FABPOOL_ERR_NOT_FOUND, std::string("fabpool hybridep: ") + call + ": " + ptr_str(ptr) +
                                                   " is not the base of a buffer of allocate()");
        fabpool_buffer_t *b = it->second.buf;
        bufs_.erase(it);
        return b;
    }

    /* The test buffer's handle for detect_accessible_ranks (made once, freed
     * with the allocator), as upstream's constructor makes it. */
    MemHandle test_handle()
    {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (test_ptr_)
                return test_handle_;
        }
        void *p = nullptr;
        allocate(&p, 128 * sizeof(int), 128 * sizeof(int));
        MemHandle h;
        get_handle(&h, p);
        std::lock_guard<std::mutex> g(mu_);
        test_ptr_ = p;
        test_handle_ = h;
        return h;
    }

    /* Under Yama ptrace_scope 1, lets the peers copy this process's exported
     * fds with pidfd_getfd (they need ptrace permission over it), once per
     * allocator: the launcher and its descendants by default
     * (FABPOOL_HYBRIDEP_PTRACER, the file's comment). */
    void consent_once()
    {
        std::call_once(ptracer_once_, [this] {
            const char *v = ::secure_getenv("FABPOOL_HYBRIDEP_PTRACER");
            detail::Ptracer c = detail::ptracer_choice(v, (int)getppid());
            if (c.kind == detail::Ptracer::bad)
                throw Error(FABPOOL_ERR_CONFIG, std::string("fabpool hybridep: FABPOOL_HYBRIDEP_PTRACER=") + v +
                                                    ": \"parent\" (the default: the launcher of the ranks), a "
                                                    "launcher's pid, \"any\" or \"0\"");
            if (c.kind == detail::Ptracer::none)
                return;
            detail::Consent &k = detail::consent();
            std::lock_guard<std::mutex> g(k.mu);
            /* refused under ptrace_scope 2 or 3: a peer's open_handle says why */
            fabpool_status s = c.kind == detail::Ptracer::any ? fabpool_fd_allow_peers() : fabpool_fd_allow_peer(c.pid);
            if (s == FABPOOL_OK) {
                k.holders++;
                consented_ = true;
            }
        });
    }
    /* The last allocator that gave the consent withdraws it. */
    void withdraw_consent() noexcept
    {
        if (!consented_)
            return;
        detail::Consent &k = detail::consent();
        std::lock_guard<std::mutex> g(k.mu);
        if (--k.holders == 0)
            (void)fabpool_fd_allow_peer(0);
        consented_ = false;
    }

    /* A pidfd of the exporter a POSIX-fd handle names, once that process has
     * shown the handle's token; kept per pid until the process is gone.  The
     * caller holds pidfds_mu_ while it copies through it.  Throws Error. */
    int exporter_pidfd(const MemHandle &h, const HandleInfo &in, const char *call)
    {
        for (auto it = pidfds_.begin(); it != pidfds_.end();) { /* an exporter that exited: its pid may come back */
            struct pollfd pf = {it->second.pidfd, POLLIN, 0};
            if (poll(&pf, 1, 0) != 0) {
                ::close(it->second.pidfd);
                it = pidfds_.erase(it);
            } else
                ++it;
        }
        const unsigned char *token = h.bytes + detail::kTokenAt;
        auto it = pidfds_.find(in.pid);
        if (it != pidfds_.end() && it->second.token_fd == in.token_fd &&
            std::memcmp(it->second.token, token, detail::kTokenBytes) == 0)
            return it->second.pidfd;
        int pidfd = -1;
        fabpool_status s = it != pidfds_.end() ? FABPOOL_OK : fabpool_fd_pidfd_open(in.pid, &pidfd);
        if (it != pidfds_.end())
            pidfd = it->second.pidfd;
        if (s == FABPOOL_OK) {
            std::string proof = detail::proof_bytes(token, in.pid);
            s = fabpool_fd_token_check(pidfd, in.token_fd, proof.data(), proof.size());
        }
        if (s != FABPOOL_OK) {
            std::string m = detail::last();
            if (it == pidfds_.end() && pidfd >= 0)
                ::close(pidfd);
            throw Error(s, std::string("fabpool hybridep: ") + call + ": process " + std::to_string(in.pid) +
                               " named by the handle: " + m +
                               (s == FABPOOL_ERR_PERMISSION
                                    ? " (nothing was copied or mapped; was the handle all-gathered whole, from "
                                      "the rank that exported it, while that rank still runs?)"
                                    : " (here: fds_of + fabpool_fd_send on the exporter, then the open_handle "
                                      "overload that takes fds)"));
        }
        PidfdOf &e = pidfds_[in.pid];
        e.pidfd = pidfd;
        e.token_fd = in.token_fd;
        std::memcpy(e.token, token, detail::kTokenBytes);
        return pidfd;
    }

    /* fabpool_buffer_export into the handle's descriptor area. */
    fabpool_status export_desc(fabpool_buffer_t *b, std::uint64_t since, MemHandle *h, std::size_t *len, int *fds,
                               std::size_t *nfds)
    {
        return fabpool_buffer_export(b, since, h->bytes + kDescAt, kMaxDescBytes, len, fds, kMaxHandleFds, nfds);
    }

    /* Re-maps b into its first chunk and one more (bytes past the first are not kept).
     * Every peer has applied the handle of generation `sent` (peers_done); the shrink's
     * generation is exported too (fabpool acknowledges only exported generations) but
     * sent to no one: the full handle that follows supersedes it, and until the peers
     * apply that, their own mappings keep the chunks they still map. */
    fabpool_status compact(fabpool_buffer_t *b, bool sent, std::uint64_t sent_gen)
    {
        fabpool_buffer_info in = detail::sized<fabpool_buffer_info>();
        fabpool_buffer_get_info(b, &in);
        fabpool_status s = fabpool_buffer_resize(b, 1, nullptr);
        if (s == FABPOOL_OK && sent) {
            fabpool_buffer_info sh = detail::sized<fabpool_buffer_info>();
            fabpool_buffer_get_info(b, &sh);
            MemHandle scratch;
            std::size_t len = 0, nfds = 0;
            int fds[kMaxHandleFds];
            s = export_desc(b, sent_gen, &scratch, &len, fds, &nfds);
            if (s == FABPOOL_OK)
                s = fabpool_buffer_peers_ack(b, sh.generation);
        }
        if (s == FABPOOL_OK)
            s = fabpool_collect(pool_, 1);
        if (s == FABPOOL_OK)
            s = fabpool_buffer_resize(b, in.size, nullptr);
        return s;
    }

    void export_into(MemHandle *h, void *ptr, bool full, const char *call)
    {
        if (!h)
            throw Error(FABPOOL_ERR_INVALID_ARG, std::string("fabpool hybridep: ") + call + ": handle is NULL");
        fabpool_buffer_t *b = find_buf(ptr, call);
        Buf state;
        {
            std::lock_guard<std::mutex> g(mu_);
            state = bufs_[ptr];
        }
        const bool posix = handle_type() == FABPOOL_HANDLE_POSIX_FD;
        if (posix) {
            consent_once();
            const detail::Proof &pr = detail::proof();
            if (pr.status != FABPOOL_OK)
                throw Error(pr.status, std::string("fabpool hybridep: ") + call + ": the exporter's token, which "
                                       "peers check before they copy its fds: " + pr.msg);
        }
        fabpool_buffer_info info = detail::sized<fabpool_buffer_info>();
        fabpool_buffer_get_info(b, &info);
        std::memset(h->bytes, 0, kHandleBytes);
        HandleKind kind = full ? HandleKind::full : HandleKind::delta;
        std::size_t len = 0, nfds = 0;
        int fds[kMaxHandleFds] = {-1, -1};
        bool reexport = false, compacted = false;
        std::uint64_t ns = 0;
        fabpool_status s = FABPOOL_OK;
        {
            detail::Timer t(ns);
            if (!full && state.sent && info.generation == state.sent_gen) {
                kind = HandleKind::unchanged; /* nothing to describe */
            } else {
                s = export_desc(b, full || !state.sent ? 0 : state.sent_gen, h, &len, fds, &nfds);
                if (!full && !state.sent && s == FABPOOL_OK)
                    kind = HandleKind::full; /* a first export is a full one */
                if (!full && state.sent && s == FABPOOL_ERR_LIMIT) {
                    reexport = true; /* the delta does not fit: the whole buffer */
                    kind = HandleKind::full;
                    s = export_desc(b, 0, h, &len, fds, &nfds);
                }
                if (!full && s == FABPOOL_ERR_LIMIT && (!state.sent || state.acked_gen >= state.sent_gen)) {
                    compacted = true; /* nor the whole buffer: fewer chunks, same address */
                    kind = HandleKind::full;
                    s = compact(b, state.sent, state.sent_gen);
                    if (s == FABPOOL_OK)
                        s = export_desc(b, 0, h, &len, fds, &nfds);
                }
            }
        }
        if (s == FABPOOL_ERR_LIMIT)
            throw Error(s, std::string("fabpool hybridep: ") + call + ": the buffer has more chunks than one " +
                               std::to_string(kHandleBytes) + "-byte handle describes (" +
                               std::to_string(kMaxHandleChunks) + ")" +
                               (full ? ": export it right after allocate() or a compaction (get_delta), or "
                                       "raise max_chunk in FABPOOL_CONF"
                                : state.sent && state.acked_gen < state.sent_gen
                                    ? ", and it cannot be compacted before every peer has applied its last "
                                      "handle: call peers_done(ptr) after each exchange"
                                    : ": raise max_chunk in FABPOOL_CONF") +
                               " (" + detail::last() + ")");
        if (s != FABPOOL_OK)
            throw Error(s, std::string("fabpool hybridep: ") + call + ": " + detail::last());
        /* the descriptor's length is its record count's, and POSIX fd has one fd a record: what the header keeps */
        const std::size_t records =
            len >= FABPOOL_DESC_HEADER_BYTES ? (len - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES : 0;
        if (kind != HandleKind::unchanged &&
            (records > kMaxHandleChunks || fabpool_desc_size(records) != len || (posix && nfds != records)))
            throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: ") + call + ": a descriptor of " +
                                                    std::to_string(len) + " bytes and " + std::to_string(nfds) +
                                                    " fds, not the layout this adapter was built for (fabpool.h): "
                                                    "rebuild it against the fabpool it loads");
        fabpool_buffer_get_info(b, &info);
        unsigned char *o = h->bytes;
        const std::int32_t pid = (std::int32_t)getpid();
        const std::int32_t token_fd = posix ? detail::proof().fd : -1;
        const std::uint32_t host = (std::uint32_t)host_;
        std::memcpy(o, detail::kMagic, 4);
        o[4] = detail::kVersion;
        o[5] = (std::uint8_t)kind;
        o[6] = (std::uint8_t)handle_type();
        o[7] = (std::uint8_t)(kind == HandleKind::unchanged ? 0 : records);
        std::memcpy(o + 8, &pid, 4);
        std::memcpy(o + detail::kTokenFdAt, &token_fd, 4);
        std::memcpy(o + detail::kHostAt, &host, 4);
        if (posix)
            std::memcpy(o + detail::kTokenAt, detail::proof().token, detail::kTokenBytes);
        std::memcpy(o + kFdsAt, fds, 4 * nfds);
        std::lock_guard<std::mutex> g(mu_);
        Buf &st = bufs_[ptr];
        st.sent_gen = info.generation;
        st.sent = true;
        stats_.exports++;
        stats_.full_reexports += reexport;
        stats_.compactions += compacted;
        stats_.ns_export += ns;
        stats_.handle_bytes_used += kind == HandleKind::unchanged ? kHandleHeaderBytes : kDescAt + len;
    }

    /* update_of NULL: open a view at *ptr; else apply h to the view at update_of. */
    void open_or_update(void **ptr, void *update_of, const MemHandle *h, const int *given, std::size_t ngiven,
                        bool own_given)
    {
        const char *call = update_of ? "update_handle" : "open_handle";
        auto close_given = [&] {
            if (own_given)
                for (std::size_t i = 0; i < ngiven; i++)
                    ::close(given[i]);
        };
        HandleInfo in = {};
        if (!ptr || !h || !read_header(*h, &in)) {
            close_given();
            throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: ") + call +
                                                    (!ptr || !h ? ": a NULL argument"
                                                                : ": not a fabpool hybridep handle (bad magic, "
                                                                  "version or field): was it all-gathered whole?"));
        }
        if (!update_of && in.kind != HandleKind::full) {
            close_given();
            throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: open_handle: this is a delta "
                                                            "(get_delta); a first view needs get_handle's full one"));
        }
        if (in.type != handle_type()) {
            close_given();
            throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: ") + call + ": a " +
                                                    (in.type == FABPOOL_HANDLE_FABRIC ? "fabric" : "POSIX fd") +
                                                    " handle, but this pool shares " +
                                                    (handle_type() == FABPOOL_HANDLE_FABRIC ? "fabric" : "POSIX fd") +
                                                    " handles: every rank must agree (USE_MNNVL, FABPOOL_CONF)");
        }
        fabpool_view_t *v = nullptr;
        if (update_of) {
            std::lock_guard<std::mutex> g(mu_);
            auto it = views_.find(update_of);
            if (it == views_.end()) {
                close_given();
                throw Error(FABPOOL_ERR_NOT_FOUND, std::string("fabpool hybridep: update_handle: ") +
                                                       ptr_str(update_of) + " is not a view opened by open_handle");
            }
            v = it->second;
        }
        if (in.kind == HandleKind::unchanged) {
            close_given();
            return;
        }
        std::uint64_t ns = 0;
        fabpool_status s = FABPOOL_OK;
        {
            detail::Timer t(ns);
            /* the fds: given (socket), or copied out of the exporter (pidfd_getfd) */
            int fds[kMaxHandleFds];
            std::size_t nfds = 0;
            if (in.type == FABPOOL_HANDLE_POSIX_FD) {
                if (own_given) {
                    if (ngiven != in.nfds) {
                        close_given();
                        throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: ") + call +
                                    ": the handle names " + std::to_string(in.nfds) + " fds but " +
                                    std::to_string(ngiven) + " were given: pass the fds fabpool_fd_recv "
                                    "received with this handle");
                    }
                    if (ngiven)
                        std::memcpy(fds, given, 4 * ngiven);
                    nfds = ngiven;
                } else {
                    std::lock_guard<std::mutex> g(pidfds_mu_);
                    int pidfd = exporter_pidfd(*h, in, call);
                    for (; nfds < in.nfds; nfds++) {
                        int their;
                        std::memcpy(&their, h->bytes + kFdsAt + 4 * nfds, 4);
                        s = fabpool_fd_from_pidfd(pidfd, their, &fds[nfds]);
                        if (s != FABPOOL_OK) {
                            std::string m = detail::last();
                            for (std::size_t i = 0; i < nfds; i++)
                                ::close(fds[i]);
                            throw Error(s, std::string("fabpool hybridep: ") + call + ": copying the exporter's fd " +
                                               std::to_string(their) + " out of process " + std::to_string(in.pid) +
                                               ": " + m + " (here: fds_of + fabpool_fd_send on the exporter, "
                                               "then the open_handle overload that takes fds)");
                        }
                    }
                }
            } else {
                close_given(); /* fabric: nothing travels beside the descriptor */
            }
            const unsigned char *d = h->bytes + kDescAt;
            s = update_of ? fabpool_view_apply(v, d, in.desc_len, fds, nfds)
                 : in.type == FABPOOL_HANDLE_POSIX_FD && own_given
                     ? fabpool_view_open(pool_, d, in.desc_len, fds, nfds, &v) /* fds of the caller's socket */
                             /* copied out of process in.pid through its pidfd, or a fabric handle of the all-gather:
                              * a view released and kept is taken back only for the same process */
                             : fabpool_view_open_peer(pool_, in.pid, d, in.desc_len, fds, nfds, &v);
        }
        if (s != FABPOOL_OK) /* fabpool closed the fds */
            throw Error(s, std::string("fabpool hybridep: ") + call + ": " + detail::last());
        std::lock_guard<std::mutex> g(mu_);
        if (!update_of) {
            *ptr = fabpool_view_ptr(v);
            views_[*ptr] = v;
            stats_.opens++;
        } else
            stats_.updates++;
        stats_.ns_import += ns;
    }

    fabpool_t *pool_ = nullptr;
    bool owned_ = false;
    std::size_t window_;
    std::uint64_t host_;
    std::once_flag ptracer_once_;
    bool consented_ = false;
    struct PidfdOf {
        int pidfd;
        int token_fd;
        unsigned char token[detail::kTokenBytes];
    };
    std::mutex pidfds_mu_;
    std::map<int, PidfdOf> pidfds_; /* exporters shown to hold their handles' tokens, by pid */
    void *test_ptr_ = nullptr;
    MemHandle test_handle_ = {};
    mutable std::mutex mu_;
    std::map<void *, Buf> bufs_;
    std::map<void *, fabpool_view_t *> views_;
    Stats stats_;
};

/* ------------------------------------------- every rank grows, or none does

HybridEP's update_buffer grows when this rank's call needs more than its
buffers hold, and a growth all-gathers handles.  Ranks whose token counts
differ disagree about growing, and the ranks that grow wait in the all-gather
for peers that never enter it (DeepEP issue #604).  The agreement: before
deciding, every rank takes the largest need of the group for each size
(one small all-reduce), so every rank grows or none does.  It costs a
collective on every call, growing or not: turn it on (FABPOOL_HYBRIDEP_AGREE=1,
read by agree_enabled()) where the ranks' token counts can differ. */

/* FABPOOL_HYBRIDEP_AGREE=1 (or true, any case). */
inline bool agree_enabled()
{
    std::string s = detail::env_lower("FABPOOL_HYBRIDEP_AGREE");
    return s == "1" || s == "true";
}

#ifdef PYBIND11_VERSION_MAJOR
/* The largest of each value over the ranks of process_group: one
 * torch.distributed.all_reduce (op MAX) of an int64 CUDA tensor, as
 * HybridEP all-gathers its handles.  Collective: every rank of the group
 * calls it with as many values. */
inline std::vector<std::int64_t> agree_max(pybind11::object process_group, const std::vector<std::int64_t> &needed)
{
    namespace py = pybind11;
    py::module_ torch = py::module_::import("torch");
    py::module_ dist = py::module_::import("torch.distributed");
    py::list l;
    for (std::int64_t v : needed)
        l.append(v);
    py::object t = torch.attr("tensor")(l, py::arg("dtype") = torch.attr("int64")).attr("cuda")();
    dist.attr("all_reduce")(t, py::arg("op") = dist.attr("ReduceOp").attr("MAX"), py::arg("group") = process_group);
    py::list all = t.attr("cpu")().attr("tolist")();
    std::vector<std::int64_t> out;
    for (py::handle v : all)
        out.push_back(v.cast<std::int64_t>());
    if (out.size() != needed.size())
        throw Error(FABPOOL_ERR_INVALID_ARG, "fabpool hybridep: agree_max: the all-reduce returned " +
                                                 std::to_string(out.size()) + " values for " +
                                                 std::to_string(needed.size()));
    return out;
}
#endif

} // namespace fabpool_hybridep
#endif

/* DeepEP's cudaMalloc and cudaFree served by detail::PrivateBlocks (above):
 * the code after this header (DeepEP's allocator.cuh, after cuda_runtime.h)
 * calls these instead.  Define FABPOOL_HYBRIDEP_KEEP_CUDA_MALLOC before the
 * include to keep the runtime's. */
#if defined(__CUDA_RUNTIME_API_H__) && !defined(FABPOOL_HYBRIDEP_KEEP_CUDA_MALLOC) && \
    !defined(FABPOOL_HYBRIDEP_PRIVATE_MACROS)
#define FABPOOL_HYBRIDEP_PRIVATE_MACROS
namespace fabpool_hybridep {
inline cudaError_t private_malloc(void **ptr, std::size_t size)
{
    return static_cast<cudaError_t>(detail::PrivateBlocks::get().alloc(ptr, size));
}
template <class T> inline cudaError_t private_malloc(T **ptr, std::size_t size)
{
    return private_malloc(reinterpret_cast<void **>(ptr), size);
}
inline cudaError_t private_free(void *ptr) { return static_cast<cudaError_t>(detail::PrivateBlocks::get().free(ptr)); }
} // namespace fabpool_hybridep
#define cudaMalloc(ptr, size) ::fabpool_hybridep::private_malloc(ptr, size)
#define cudaFree(ptr) ::fabpool_hybridep::private_free(ptr)
#endif
