/*
 * fabpool_hybridep.hpp - a drop-in for HybridEP's ExtendedMemoryAllocator
 * (DeepEP, csrc/hybrid_ep/allocator), on fabpool's C API.  Header only, C++17.
 *
 * HybridEP's allocator gives every dispatch/combine buffer its own
 * cuMemCreate + cuMemAddressReserve + cuMemMap, exports it as a fixed-size
 * MemHandle that travels as raw bytes through torch.distributed.all_gather,
 * and on growth frees and reallocates the whole buffer set.  This class keeps
 * the same six calls (allocate, free, get_handle, open_handle, close_handle,
 * is_accessible) and the same fixed-size byte handle, and adds growth in
 * place:
 *
 *   - allocate() creates a fabpool growable buffer: its base address never
 *     changes, and resize() maps only the chunks that are missing.
 *   - get_handle() writes a full descriptor; after a resize, get_delta()
 *     writes only what changed, and update_handle() applies it to the peer's
 *     view, whose address stays the same too.  peers_done() tells the
 *     exporter that every peer has applied the last handle.
 *   - every driver reference is released by fabpool itself: a chunk's
 *     handle right after its map, an import handle right after the view's
 *     map, exported fds at peers_done() or when the chunk goes.  free() and
 *     close_handle() return the memory (the leak of DeepEP issue #799 cannot
 *     happen).
 *
 * POSIX file descriptors cannot travel in bytes.  With handle type posix_fd a
 * MemHandle carries the descriptor, the exporter's pid and the numbers of the
 * exporter's fds (which stay open until peers_done()).  A peer gets the fds
 * in one of two ways:
 *   1. open_handle(ptr, h) / update_handle(ptr, h): the adapter copies them
 *      out of the exporter with pidfd_getfd (fabpool_fd_from_pid; Linux 5.6+,
 *      and ptrace permission over the exporter: same user, and Yama's
 *      ptrace_scope 0, or CAP_SYS_PTRACE);
 *   2. the exporter sends them over a Unix socket with fabpool_fd_send(sock,
 *      fds, n, ...) where fds_of(h) lists them, and the peer receives them
 *      with fabpool_fd_recv and passes them to open_handle(ptr, h, fds, n) /
 *      update_handle(ptr, h, fds, n), which take ownership of them.
 * Fabric handles need neither: they are in the descriptor.
 *
 * Errors are thrown as fabpool_hybridep::Error (a std::runtime_error) whose
 * what() names the call and carries fabpool_last_error(), and whose status()
 * is the fabpool_status.  The class is thread-safe.
 */
#ifndef FABPOOL_HYBRIDEP_HPP
#define FABPOOL_HYBRIDEP_HPP

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <signal.h>
#include <unistd.h>

#include "fabpool.h"

/* (the namespace cannot be fabpool::, which C++ sees as the pool's struct tag) */
namespace fabpool_hybridep {

/* Bytes of one handle: what each rank all-gathers per buffer. */
constexpr std::size_t kHandleBytes = 8192;
constexpr std::size_t kHandleHeaderBytes = 128;
constexpr std::size_t kMaxHandleFds = 96;
constexpr std::size_t kMaxDescBytes = kHandleBytes - kHandleHeaderBytes - 4 * kMaxHandleFds;
/* Chunks one handle can describe: a buffer grows by about a quarter of its
 * size a chunk, so this covers growth by more than 10^9 times. */
constexpr std::size_t kMaxHandleChunks = (kMaxDescBytes - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES;

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

/* What a handle says about itself (read_header). */
struct HandleInfo {
    bool full;                 /* a full descriptor (get_handle) or a delta (get_delta) */
    fabpool_handle_type type;  /* posix_fd or fabric */
    int pid;                   /* the exporter's process */
    std::uint64_t generation;  /* the exporter's buffer generation it brings a peer to */
    std::uint64_t size;        /* the buffer's size asked last */
    std::uint32_t desc_len;
    std::uint32_t nfds;
    char host[64];
};

namespace detail {
/* Header layout (little-endian host order; peers share one architecture):
 *   0 char[8] magic "FPHYBEP1"    8 u32 version      12 u32 full (1) / delta (0)
 *  16 u32 handle type             20 i32 pid         24 u64 generation
 *  32 u64 size                    40 u32 desc length 44 u32 fd count
 *  48 char[64] host name         112..128 zero
 * then kMaxHandleFds i32 fd numbers (the exporter's), then the descriptor. */
constexpr char kMagic[8] = {'F', 'P', 'H', 'Y', 'B', 'E', 'P', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kFdsAt = kHandleHeaderBytes;
constexpr std::size_t kDescAt = kHandleHeaderBytes + 4 * kMaxHandleFds;

inline std::string host_name()
{
    char h[64] = {0};
    if (gethostname(h, sizeof h - 1) != 0)
        std::strcpy(h, "unknown");
    return h;
}
inline std::string last() { return fabpool_last_error(); }
} // namespace detail

class ExtendedMemoryAllocator {
  public:
    /* A pool of its own on `device`; conf is FABPOOL_CONF syntax (may be NULL;
     * the FABPOOL_CONF environment variable still applies on top).
     * default_window: the address window of allocate(ptr, size) when no
     * maximum is given: max(default_window, size). */
    explicit ExtendedMemoryAllocator(int device = 0, const char *conf = nullptr,
                                     std::size_t default_window = std::size_t(4) << 30)
        : window_(default_window), host_(detail::host_name())
    {
        fabpool_options o;
        fabpool_options_init(&o);
        o.device = device;
        o.conf = conf;
        fabpool_status s = fabpool_create(&o, &pool_);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: creating the pool on device " + std::to_string(device) + ": " +
                               detail::last());
        owned_ = true;
    }
    /* Uses a pool the caller owns (it must outlive this object). */
    explicit ExtendedMemoryAllocator(fabpool_t *pool, std::size_t default_window = std::size_t(4) << 30)
        : pool_(pool), window_(default_window), host_(detail::host_name())
    {
        if (!pool)
            throw Error(FABPOOL_ERR_INVALID_ARG, "fabpool hybridep: a NULL pool was given");
    }
    ExtendedMemoryAllocator(const ExtendedMemoryAllocator &) = delete;
    ExtendedMemoryAllocator &operator=(const ExtendedMemoryAllocator &) = delete;

    /* Closes every view still open, frees every buffer still allocated, and
     * destroys the pool if it is this object's own. */
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
    }

    fabpool_t *pool() const noexcept { return pool_; }
    fabpool_handle_type handle_type() const noexcept { return fabpool_handle_type_of(pool_); }

    /* ------------------------------------------------ HybridEP's six calls */

    /* size bytes of shareable device memory at *ptr, in a window of
     * max(max_size, size) bytes (0: the default window) that later resize()
     * calls grow into without moving it. */
    void allocate(void **ptr, std::size_t size, std::size_t max_size = 0)
    {
        if (!ptr)
            throw Error(FABPOOL_ERR_INVALID_ARG, "fabpool hybridep: allocate: ptr is NULL");
        if (size == 0)
            size = 1; /* HybridEP rounds 0 up to one granule too */
        std::size_t win = max_size ? max_size : window_;
        if (win < size)
            win = size;
        fabpool_buffer_t *b = nullptr;
        fabpool_status s = fabpool_buffer_create(pool_, win, size, &b);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: allocate(" + std::to_string(size) + " bytes, window " +
                               std::to_string(win) + "): " + detail::last());
        std::lock_guard<std::mutex> g(mu_);
        *ptr = fabpool_buffer_ptr(b);
        bufs_[*ptr] = Buf{b, 0};
    }

    /* Frees a buffer of allocate().  Peers' views keep their own mappings
     * (POSIX fd) or must have been closed first (fabric, as in HybridEP,
     * whose release_buffer closes the peers' handles on every rank). */
    void free(void *ptr)
    {
        if (!ptr)
            return;
        fabpool_buffer_t *b = take_buf(ptr, "free");
        fabpool_buffer_peers_ack(b, UINT64_MAX);
        fabpool_status s = fabpool_buffer_destroy(b, nullptr);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: free: " + detail::last());
    }

    /* The full handle of a buffer of allocate(), for a peer's first view. */
    void get_handle(MemHandle *h, void *ptr) { export_into(h, ptr, true, "get_handle"); }

    /* Opens a peer's handle (full) at *ptr.  POSIX fd: copies the exporter's
     * fds by pidfd_getfd; use the overload with fds to pass them yourself. */
    void open_handle(void **ptr, const MemHandle *h) { open_or_update(ptr, nullptr, h, nullptr, 0, false); }
    /* The same with fds received over a socket (fabpool_fd_recv): the
     * adapter takes them and closes them whatever the outcome. */
    void open_handle(void **ptr, const MemHandle *h, const int *fds, std::size_t nfds)
    {
        open_or_update(ptr, nullptr, h, fds, nfds, true);
    }

    /* Unmaps a peer's buffer opened by open_handle. */
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
        fabpool_status s = fabpool_view_close(v);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: close_handle: " + detail::last());
    }

    /* Whether this process can open h: a well-formed handle of this pool's
     * handle type, exported on this host (HybridEP, too, keeps its fabric
     * handles to one host), and, for POSIX fd, by a process that still runs. */
    bool is_accessible(const MemHandle *h) const noexcept
    {
        HandleInfo in = {};
        if (!h || !read_header(*h, &in))
            return false;
        if (in.type != handle_type() || host_ != in.host)
            return false;
        if (in.type == FABPOOL_HANDLE_POSIX_FD && in.pid != getpid() && kill(in.pid, 0) != 0 && errno == ESRCH)
            return false;
        return true;
    }

    /* --------------------------------------------- growth in place (update_buffer) */

    /* Grows or shrinks a buffer of allocate() to size bytes in place (its
     * address stays; growing maps only the missing chunks; a shrink unmaps
     * once the work on `stream` (a CUstream, or NULL: the context) is done and
     * once peers have applied the shrink's delta).  Returns true if the mapped
     * chunks changed, i.e. the peers need a get_delta(). */
    bool resize(void *ptr, std::size_t size, void *stream = nullptr)
    {
        fabpool_buffer_t *b = find_buf(ptr, "resize");
        fabpool_buffer_info before, after;
        fabpool_buffer_get_info(b, &before);
        fabpool_status s = fabpool_buffer_resize(b, size, stream);
        if (s != FABPOOL_OK)
            throw Error(s, "fabpool hybridep: resize(" + std::to_string(size) + " bytes): " + detail::last());
        fabpool_buffer_get_info(b, &after);
        return after.generation != before.generation;
    }

    /* The delta of a buffer since the last handle exported: only the chunks
     * mapped or dropped since.  Every peer must apply every handle exported,
     * in order (update_handle). */
    void get_delta(MemHandle *h, void *ptr) { export_into(h, ptr, false, "get_delta"); }

    /* Applies a peer's delta (or a newer full handle) to the view at ptr. */
    void update_handle(void *ptr, const MemHandle *h)
    {
        void *p = ptr;
        open_or_update(&p, ptr, h, nullptr, 0, false);
    }
    void update_handle(void *ptr, const MemHandle *h, const int *fds, std::size_t nfds)
    {
        void *p = ptr;
        open_or_update(&p, ptr, h, fds, nfds, true);
    }

    /* Every peer has opened or applied the last handle of ptr: the exporter
     * closes its copies of the fds, and chunks that a shrink dropped may go. */
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
    }

    /* The exporter's fds a handle names, for fabpool_fd_send (valid in the
     * exporting process only, until peers_done).  Returns how many. */
    static std::size_t fds_of(const MemHandle &h, int *fds, std::size_t cap)
    {
        HandleInfo in = {};
        if (!read_header(h, &in))
            return 0;
        std::size_t n = in.nfds < cap ? in.nfds : cap;
        std::memcpy(fds, h.bytes + detail::kFdsAt, 4 * n);
        return in.nfds;
    }

    /* Reads a handle's header; false if it is not a handle of this adapter. */
    static bool read_header(const MemHandle &h, HandleInfo *out) noexcept
    {
        const unsigned char *b = h.bytes;
        std::uint32_t ver, full, type, dl, nf;
        std::memcpy(&ver, b + 8, 4);
        std::memcpy(&full, b + 12, 4);
        std::memcpy(&type, b + 16, 4);
        std::memcpy(&dl, b + 40, 4);
        std::memcpy(&nf, b + 44, 4);
        if (std::memcmp(b, detail::kMagic, 8) != 0 || ver != detail::kVersion || full > 1 ||
            (type != FABPOOL_HANDLE_POSIX_FD && type != FABPOOL_HANDLE_FABRIC) || dl > kMaxDescBytes ||
            nf > kMaxHandleFds || b[48 + 63] != 0)
            return false;
        out->full = full == 1;
        out->type = (fabpool_handle_type)type;
        std::memcpy(&out->pid, b + 20, 4);
        std::memcpy(&out->generation, b + 24, 8);
        std::memcpy(&out->size, b + 32, 8);
        out->desc_len = dl;
        out->nfds = nf;
        std::memcpy(out->host, b + 48, 64);
        return true;
    }

  private:
    struct Buf {
        fabpool_buffer_t *buf;
        std::uint64_t sent_gen; /* generation of the last handle exported */
    };

    static std::string ptr_str(const void *p)
    {
        char s[32];
        std::snprintf(s, sizeof s, "%p", p);
        return s;
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
        fabpool_buffer_t *b = find_buf(ptr, call);
        std::lock_guard<std::mutex> g(mu_);
        bufs_.erase(ptr);
        return b;
    }

    void export_into(MemHandle *h, void *ptr, bool full, const char *call)
    {
        if (!h)
            throw Error(FABPOOL_ERR_INVALID_ARG, std::string("fabpool hybridep: ") + call + ": handle is NULL");
        fabpool_buffer_t *b = find_buf(ptr, call);
        std::uint64_t since = 0;
        if (!full) {
            std::lock_guard<std::mutex> g(mu_);
            since = bufs_[ptr].sent_gen;
        }
        std::memset(h->bytes, 0, kHandleBytes);
        std::size_t len = 0, nfds = 0;
        int fds[kMaxHandleFds];
        fabpool_status s = fabpool_buffer_export(b, since, h->bytes + detail::kDescAt, kMaxDescBytes, &len, fds,
                                                 kMaxHandleFds, &nfds);
        if (s == FABPOOL_ERR_LIMIT)
            throw Error(s, std::string("fabpool hybridep: ") + call + ": the buffer has more chunks than one " +
                               std::to_string(kHandleBytes) + "-byte handle holds (" +
                               std::to_string(kMaxHandleChunks) + "): raise max_chunk in FABPOOL_CONF so that it "
                               "grows in fewer, larger chunks (" + detail::last() + ")");
        if (s != FABPOOL_OK)
            throw Error(s, std::string("fabpool hybridep: ") + call + ": " + detail::last());
        fabpool_buffer_info in;
        fabpool_buffer_get_info(b, &in);
        {
            std::lock_guard<std::mutex> g(mu_);
            bufs_[ptr].sent_gen = in.generation;
        }
        unsigned char *o = h->bytes;
        std::uint32_t ver = detail::kVersion, fl = full ? 1 : 0, type = (std::uint32_t)handle_type(),
                      dl = (std::uint32_t)len, nf = (std::uint32_t)nfds;
        std::int32_t pid = (std::int32_t)getpid();
        std::uint64_t gen = in.generation, size = in.size;
        std::memcpy(o, detail::kMagic, 8);
        std::memcpy(o + 8, &ver, 4);
        std::memcpy(o + 12, &fl, 4);
        std::memcpy(o + 16, &type, 4);
        std::memcpy(o + 20, &pid, 4);
        std::memcpy(o + 24, &gen, 8);
        std::memcpy(o + 32, &size, 8);
        std::memcpy(o + 40, &dl, 4);
        std::memcpy(o + 44, &nf, 4);
        std::strncpy((char *)o + 48, host_.c_str(), 63);
        std::memcpy(o + detail::kFdsAt, fds, 4 * nfds);
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
        if (!update_of && !in.full) {
            close_given();
            throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: open_handle: this is a delta "
                                                            "(get_delta); a first view needs get_handle's full one"));
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
        /* the fds: given (socket), or copied out of the exporter (pidfd_getfd) */
        int fds[kMaxHandleFds];
        std::size_t nfds = 0;
        if (in.type == FABPOOL_HANDLE_POSIX_FD) {
            if (own_given) {
                if (ngiven != in.nfds) {
                    close_given();
                    throw Error(FABPOOL_ERR_DESCRIPTOR, std::string("fabpool hybridep: ") + call + ": the handle "
                                "names " + std::to_string(in.nfds) + " fds but " + std::to_string(ngiven) +
                                " were given: pass the fds fabpool_fd_recv received with this handle");
                }
                std::memcpy(fds, given, 4 * ngiven);
                nfds = ngiven;
            } else {
                const int *theirs = (const int *)(const void *)(h->bytes + detail::kFdsAt);
                for (; nfds < in.nfds; nfds++) {
                    int their;
                    std::memcpy(&their, theirs + nfds, 4);
                    fabpool_status s = fabpool_fd_from_pid(in.pid, their, &fds[nfds]);
                    if (s != FABPOOL_OK) {
                        std::string m = detail::last();
                        for (std::size_t i = 0; i < nfds; i++)
                            ::close(fds[i]);
                        throw Error(s, std::string("fabpool hybridep: ") + call + ": copying the exporter's fd " +
                                           std::to_string(their) + " from process " + std::to_string(in.pid) +
                                           ": " + m + " (or send the fds over a socket: fds_of, fabpool_fd_send, "
                                           "and the overload that takes fds)");
                    }
                }
            }
        } else {
            close_given(); /* fabric: nothing travels beside the descriptor */
        }
        const unsigned char *d = h->bytes + detail::kDescAt;
        fabpool_status s = update_of ? fabpool_view_apply(v, d, in.desc_len, fds, nfds)
                                     : fabpool_view_open(pool_, d, in.desc_len, fds, nfds, &v);
        if (s != FABPOOL_OK) /* fabpool closed the fds */
            throw Error(s, std::string("fabpool hybridep: ") + call + ": " + detail::last());
        if (!update_of) {
            std::lock_guard<std::mutex> g(mu_);
            *ptr = fabpool_view_ptr(v);
            views_[*ptr] = v;
        }
    }

    fabpool_t *pool_ = nullptr;
    bool owned_ = false;
    std::size_t window_;
    std::string host_;
    mutable std::mutex mu_;
    std::map<void *, Buf> bufs_;
    std::map<void *, fabpool_view_t *> views_;
};

} // namespace fabpool_hybridep
#endif
