/* torch_ipc.hpp - what travels when PyTorch shares a CUDA tensor with another
 * process (torch.multiprocessing: shareIpcHandle in the sender,
 * getIpcDevPtr in the receiver), without PyTorch.
 *
 * - The handle: the bytes PyTorch carries from the sender to the receiver
 *   (a std::string, pickled with the tensor): fabpool_block_export's
 *   descriptor of the chunks under the block, the sender's pid and the fd
 *   numbers of those chunks there, and the name of the sender's fd server.
 * - The fd server: one per process, started at the first share, a thread on
 *   an abstract Unix socket named after the pid and 16 random bytes (the
 *   bytes travel only in handles, so only a receiver of one can connect;
 *   the server also refuses other users' processes).  A receiver sends the
 *   block's key and descriptor; the server asks its callback, which checks
 *   that the block is still the one described, and answers with copies of
 *   the fds (SCM_RIGHTS).
 * - fetch: the receiver's side, over the socket, else by pidfd_getfd of the
 *   fd numbers in the handle (where the socket cannot be reached: another
 *   network namespace; it needs ptrace permission over the sender).
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
#include <vector>

namespace fabpool_torch {
namespace ipc {

constexpr size_t kTokenBytes = 16;
constexpr size_t kMaxDesc = size_t(4) << 20;  /* a descriptor of 43,000 chunks: a block of 1.3 TiB */

struct Handle {
    int type = 0;                  /* fabpool_handle_type: posix_fd or fabric */
    int pid = 0;                   /* the sender */
    uint8_t token[kTokenBytes] = {};
    uint64_t key = 0;              /* the block's address in the sender */
    std::vector<int> fds;          /* the sender's fd numbers, one per chunk (posix_fd) */
    std::string desc;              /* fabpool_block_export's descriptor */
};

/* The bytes of h. */
std::string encode(const Handle &h);
/* h from bytes; false (why says what is wrong) for bytes that are not a
 * handle of this version. */
bool decode(const std::string &bytes, Handle *h, std::string *why);

/* The server's abstract socket name for a pid and a token. */
std::string socket_name(int pid, const uint8_t *token);

/* A sender's fd server: a thread serving requests until destroyed. */
class Server {
public:
    /* status 0: *fds are the fds to send (closed by the server afterwards);
     * else *msg says why not. */
    using Serve = std::function<int(uint64_t key, const std::string &desc, std::vector<int> *fds, std::string *msg)>;

    /* Listens and starts the thread; throws std::runtime_error. */
    explicit Server(Serve serve);
    /* Stops the thread and closes the socket. */
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    int pid() const { return pid_; }
    const uint8_t *token() const { return token_; }
    /* Connections served, refused (another user, a malformed request). */
    uint64_t served() const { return served_.load(); }
    uint64_t refused() const { return refused_.load(); }

    /* In a child made by fork: the thread is the parent's and does not run
     * here; the sockets are closed and the thread left alone (the object is
     * then to be leaked, not destroyed). */
    void abandon();

private:
    Serve serve_;
    int pid_ = 0;
    uint8_t token_[kTokenBytes] = {};
    int listener_ = -1, wake_[2] = {-1, -1};
    std::thread thread_;
    std::vector<char> buf_;  /* a request (the thread's) */
    std::atomic<uint64_t> served_{0}, refused_{0};

    void run();
    void one(int conn);
};

/* The fds of h's chunks, fetched from its sender (the caller owns them):
 * over the sender's socket, else by pidfd_getfd.  Throws
 * std::runtime_error with what was tried. */
std::vector<int> fetch(const Handle &h);

}  // namespace ipc
}  // namespace fabpool_torch

#endif
