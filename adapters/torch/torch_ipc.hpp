/* torch_ipc.hpp - what travels when PyTorch shares a CUDA tensor with another
 * process (torch.multiprocessing: shareIpcHandle in the sender,
 * getIpcDevPtr in the receiver), without PyTorch.
 *
 * - The handle: the bytes PyTorch carries from the sender to the receiver
 *   (a std::string, pickled with the tensor): fabpool_block_export's
 *   descriptor of the chunks under the block, the sender's pid and the fd
 *   numbers of those chunks there, the id of the sender's fd server, the
 *   sender's secret token and the fd number of its token memfd.  The handle
 *   is the one channel both sides trust: it reaches only the receiver the
 *   sender pickled it for.
 * - The fd server: one per process, started at the first share, a thread on
 *   an abstract Unix socket named after the pid and a random id.  The name
 *   is no secret (/proc/net/unix lists it to every user), and once the
 *   sender is gone anyone may bind it, so neither side trusts the name: the
 *   server accepts processes of its own user only (FABPOOL_PEERS may widen
 *   that) and serves a request only with the token in it (compared in
 *   constant time); the receiver connects only to a listener that is the
 *   handle's pid of its own user (fabpool_fd_connect_peer), so an impostor
 *   is refused before a byte is sent.  A request carries the token, the
 *   block's key and descriptor; the thread reads every connection's request
 *   as it comes, none waited for, and once one is whole asks its callback,
 *   which checks that the block is still the one described, and answers
 *   with copies of the fds (SCM_RIGHTS), sent as the receiver's socket takes
 *   them (never waited for) and received whole within a deadline or not at
 *   all.
 * - fetch: the receiver's side, over the socket, else (no listener: another
 *   network namespace) through a pidfd of the sender: the sender proves it
 *   is the handle's process by the token memfd (fabpool_fd_token_check)
 *   before any chunk fd is copied, and the pidfd pins it while they are
 *   (needs ptrace permission over the sender).
 *
 * Fabric handles travel in the descriptor itself: no fd, no server. */
#ifndef FABPOOL_TORCH_IPC_HPP
#define FABPOOL_TORCH_IPC_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <stdexcept>
#include <vector>

#include "fabpool_status.h"

struct cw_conn; /* conn_wait.h: a connection the fd server watches */

namespace fabpool_torch {
namespace ipc {

constexpr size_t kTokenBytes = 16;
constexpr size_t kMaxDesc = size_t(4) << 20;  /* a descriptor of 43,000 chunks: a block of 1.3 TiB */

struct Handle {
    int type = 0;                  /* fabpool_handle_type: posix_fd or fabric */
    int pid = 0;                   /* the sender */
    uint8_t token[kTokenBytes] = {}; /* the sender's secret (posix_fd) */
    int token_fd = -1;             /* the sender's token memfd (posix_fd; -1 for fabric) */
    uint64_t server_id = 0;        /* names the sender's fd server with pid; no secret */
    uint64_t key = 0;              /* the share's key in the sender (random; posix_fd) */
    std::vector<int> fds;          /* the sender's fd numbers, one per chunk (posix_fd) */
    std::string desc;              /* fabpool_block_export's descriptor */
};

/* The bytes of h. */
std::string encode(const Handle &h);
/* h from bytes; false (why says what is wrong) for bytes that are not a
 * handle of this version. */
bool decode(const std::string &bytes, Handle *h, std::string *why);

/* The server's abstract socket name for a pid and a server id. */
std::string socket_name(int pid, uint64_t server_id);

/* What fetch throws: the fabpool_status of the refusal (FABPOOL_ERR_PERMISSION:
 * a peer that is not the handle's sender, or a wrong token; FABPOOL_ERR_NOT_FOUND:
 * the sender no longer has the block; FABPOOL_ERR_IO: no way to reach it). */
class Error : public std::runtime_error {
public:
    Error(fabpool_status s, const std::string &what) : std::runtime_error(what), status_(s) {}
    fabpool_status status() const noexcept { return status_; }

private:
    fabpool_status status_;
};

/* A sender's fd server: a thread serving requests until destroyed. */
class Server {
public:
    /* status 0: *fds are the fds to send (the server's then: each closed once
     * it went out, those left when the connection ends); else a
     * fabpool_status, and *msg says why not (at most kMaxDesc bytes of it
     * are sent). */
    using Serve = std::function<int(uint64_t key, const std::string &desc, std::vector<int> *fds, std::string *msg)>;

    /* Listens and starts the thread; throws std::runtime_error. */
    explicit Server(Serve serve);
    /* Stops the thread and closes the socket. */
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    int pid() const { return pid_; }
    const uint8_t *token() const { return token_; }
    int token_fd() const { return token_fd_; }
    uint64_t id() const { return id_; }
    /* Connections served, refused (another user, a wrong token, a malformed
     * request, a block no longer live). */
    uint64_t served() const { return served_.load(); }
    uint64_t refused() const { return refused_.load(); }
    /* Times the server's thread woke (a connection, a byte, room for an answer, a hang-up or a look again at a
     * part of a start). */
    uint64_t wakes() const { return wakes_.load(); }
    /* Why the server stopped serving before it was destroyed (an exception its thread could not put down to one
     * connection: its listener is closed, receivers are refused), else nullptr. */
    const char *stopped() const { return stopped_.load() ? stop_msg_ : nullptr; }

    /* In a child made by fork: the thread is the parent's and does not run
     * here; the listener, the wake pipe and the token memfd are closed and
     * the thread left alone (the object is then to be leaked, not
     * destroyed).  The child's copies of the connections the thread held at
     * the fork, and of the fds of answers not yet sent, stay open until it
     * exits: their numbers, read from a thread caught mid-step, may be
     * stale by the time this runs. */
    void abandon();

private:
    Serve serve_;
    int pid_ = 0;
    uint8_t token_[kTokenBytes] = {};
    uint64_t id_ = 0;
    int token_fd_ = -1;  /* a sealed memfd of token_: the proof for the pidfd path */
    int listener_ = -1, wake_[2] = {-1, -1};
    std::thread thread_;
    std::atomic<uint64_t> served_{0}, refused_{0}, wakes_{0};
    std::atomic<bool> stopped_{false};
    char stop_msg_[256] = {};

    /* A connection whose request bears the token (the thread's): its request read as its bytes come, then its
     * answer sent as the socket takes it, neither ever waited for.  Members, not the thread's stack: a process
     * forked while the thread runs still reaches their heap. */
    struct Slot {
        int fd = -1;
        int pid = 0;           /* the peer's, as of its connect (SO_PEERCRED): whose slots give way first */
        unsigned uid = 0;
        int64_t until = 0;     /* the deadline of the whole request, then of the whole answer (ms, steady clock) */
        int64_t last = 0;      /* when bytes last moved: of the peer that holds the most, the idlest gives way */
        bool answering = false;
        std::vector<char> buf; /* fabpool_fd_send's head, then the request as far as it came; then the answer */
        size_t off = 0;        /* the answer's bytes that the socket took */
        std::vector<int> fds;  /* the answer's fds: copies this connection owns, each closed once it went out */
        size_t fds_sent = 0;
    };
    /* Connections read or answered at once, each holding at most one request's bytes (the request, then the
     * answer) and an answer's fds: a bound on the memory (64 MiB) and the fds that peers which stall hold. */
    static constexpr int kSlotsMax = 16;
    Slot slots_[kSlotsMax];
    int nslots_ = 0;

    enum class Look { done, silent, partial };
    void run() noexcept;
    void loop(::cw_conn *w, int *nw);
    void stop(const char *why) noexcept;
    Look look(int conn, bool expired);
    void sweep(::cw_conn *w, int *nw);
    bool take(::cw_conn *w, int *nw, uint64_t *seq);
    void read_start(int conn);
    int victim(int pid, unsigned uid) const;
    bool step(int i, int64_t now) noexcept;
    bool feed(int i, int64_t now);
    bool serve_whole(int i, int64_t now);
    bool answer(int i, int status, const std::string &msg, std::vector<int> *fds, int64_t now);
    bool flush(int i, int64_t now);
    void finish(int i, int status, const char *msg) noexcept;
    void drop(int i) noexcept;
    void refuse(int conn);
};

/* The fds of h's chunks, fetched from its sender (the caller owns them):
 * over the sender's socket, else by pidfd_getfd.  Throws Error with what
 * was tried; on any failure no fd that arrived stays open. */
std::vector<int> fetch(const Handle &h);

}  // namespace ipc
}  // namespace fabpool_torch

#endif
