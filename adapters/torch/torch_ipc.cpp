/* torch_ipc.cpp - the handle of a shared tensor, the sender's fd server and
 * the receiver's fetch (torch_ipc.hpp). */
#include "torch_ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "fabpool.h"

namespace fabpool_torch {
namespace ipc {

namespace {

/* handle: "FPIH" u16 version, u16 type, u32 pid, u32 fds, token, u64 key, u32 descriptor bytes, u32 0,
 * then the fd numbers (i32 each) and the descriptor; little-endian, as the descriptor */
const char kHandleMagic[4] = {'F', 'P', 'I', 'H'};
constexpr uint16_t kVersion = 1;
constexpr size_t kHeader = 4 + 2 + 2 + 4 + 4 + kTokenBytes + 8 + 4 + 4;
/* request: "FPRQ" u64 key, then the descriptor; reply: u32 status, then the message */
const char kRequestMagic[4] = {'F', 'P', 'R', 'Q'};
constexpr int kTimeoutS = 10;  /* a peer that stops talking mid-request */

void put(std::string &s, const void *p, size_t n) { s.append(static_cast<const char *>(p), n); }
template <class T> void put(std::string &s, T v) { put(s, &v, sizeof v); }
template <class T> T get(const char *p)
{
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

void timeouts(int fd)
{
    struct timeval tv = {kTimeoutS, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void close_all(const std::vector<int> &fds)
{
    for (int fd : fds)
        if (fd >= 0)
            close(fd);
}

void random_token(uint8_t *t)
{
    size_t got = 0;
    while (got < kTokenBytes) {
        ssize_t r = getrandom(t + got, kTokenBytes - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            throw std::runtime_error(std::string("fabpool: no random bytes for the IPC socket's name: ") +
                                     strerror(errno));
        got += size_t(r);
    }
}

}  // namespace

std::string encode(const Handle &h)
{
    std::string s;
    s.reserve(kHeader + 4 * h.fds.size() + h.desc.size());
    put(s, kHandleMagic, 4);
    put(s, kVersion);
    put(s, uint16_t(h.type));
    put(s, uint32_t(h.pid));
    put(s, uint32_t(h.fds.size()));
    put(s, h.token, kTokenBytes);
    put(s, h.key);
    put(s, uint32_t(h.desc.size()));
    put(s, uint32_t(0));
    for (int fd : h.fds)
        put(s, int32_t(fd));
    s += h.desc;
    return s;
}

bool decode(const std::string &bytes, Handle *h, std::string *why)
{
    const char *p = bytes.data();
    if (bytes.size() < kHeader || memcmp(p, kHandleMagic, 4) != 0) {
        *why = "not a handle of fabpool's allocator (" + std::to_string(bytes.size()) +
               " bytes): the process that shared the tensor uses another CUDA allocator (PyTorch's own?); install "
               "fabpool in both processes (fabpool_torch.install() before CUDA is used) or in neither";
        return false;
    }
    uint16_t version = get<uint16_t>(p + 4);
    if (version != kVersion) {
        *why = "a handle of version " + std::to_string(version) + ", this fabpool reads version " +
               std::to_string(kVersion) + ": both processes must load the same fabpool";
        return false;
    }
    h->type = get<uint16_t>(p + 6);
    h->pid = int(get<uint32_t>(p + 8));
    uint32_t nfds = get<uint32_t>(p + 12);
    memcpy(h->token, p + 16, kTokenBytes);
    h->key = get<uint64_t>(p + 16 + kTokenBytes);
    uint32_t dlen = get<uint32_t>(p + 24 + kTokenBytes);
    if (dlen > kMaxDesc || nfds > kMaxDesc || bytes.size() != kHeader + 4 * uint64_t(nfds) + dlen ||
        (h->type != FABPOOL_HANDLE_POSIX_FD && h->type != FABPOOL_HANDLE_FABRIC) ||
        (h->type == FABPOOL_HANDLE_FABRIC) != (nfds == 0)) {
        *why = "a malformed handle (" + std::to_string(bytes.size()) + " bytes for " + std::to_string(nfds) +
               " fds and a descriptor of " + std::to_string(dlen) + ", handle type " + std::to_string(h->type) + ")";
        return false;
    }
    h->fds.resize(nfds);
    for (uint32_t i = 0; i < nfds; i++)
        h->fds[i] = get<int32_t>(p + kHeader + 4 * size_t(i));
    h->desc.assign(p + kHeader + 4 * size_t(nfds), dlen);
    return true;
}

std::string socket_name(int pid, const uint8_t *token)
{
    char hex[2 * kTokenBytes + 1];
    for (size_t i = 0; i < kTokenBytes; i++)
        snprintf(hex + 2 * i, 3, "%02x", token[i]);
    return "fabpool-ipc-" + std::to_string(pid) + "-" + hex;
}

/* ----------------------------------------------------------- the server */

Server::Server(Serve serve) : serve_(std::move(serve)), pid_(int(getpid()))
{
    random_token(token_);
    std::string name = socket_name(pid_, token_);
    if (fabpool_fd_listen(name.c_str(), &listener_) != FABPOOL_OK)
        throw std::runtime_error(std::string("fabpool: the IPC fd server cannot listen: ") + fabpool_last_error());
    if (pipe2(wake_, O_CLOEXEC) != 0) {
        int e = errno;
        close(listener_);
        throw std::runtime_error(std::string("fabpool: the IPC fd server: pipe: ") + strerror(e));
    }
    thread_ = std::thread(&Server::run, this);
}

Server::~Server()
{
    if (wake_[1] >= 0) {
        char c = 0;
        ssize_t r;
        do
            r = write(wake_[1], &c, 1);
        while (r < 0 && errno == EINTR);
    }
    if (thread_.joinable())
        thread_.join();
    for (int fd : {listener_, wake_[0], wake_[1]})
        if (fd >= 0)
            close(fd);
}

void Server::abandon()
{
    for (int *fd : {&listener_, &wake_[0], &wake_[1]})
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
}

void Server::run()
{
    for (;;) {
        struct pollfd pf[2] = {{listener_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
        int r = poll(pf, 2, -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || pf[1].revents)
            return;
        if (!(pf[0].revents & POLLIN))
            continue;
        int conn = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        one(conn);
        close(conn);
    }
}

void Server::one(int conn)
{
    timeouts(conn);
    std::string msg;
    std::vector<int> fds;
    int status = 1;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    std::vector<char> &req = buf_;
    req.resize(12 + kMaxDesc);
    size_t n = 0, len = 0;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != geteuid()) {
        msg = "the process asking runs as another user";
    } else if (fabpool_fd_recv(conn, nullptr, 0, &n, req.data(), req.size(), &len) != FABPOOL_OK || len < 12 ||
               memcmp(req.data(), kRequestMagic, 4) != 0) {
        msg = "a malformed request";
    } else {
        std::string desc(req.data() + 12, len - 12);
        status = serve_(get<uint64_t>(req.data() + 4), desc, &fds, &msg);
    }
    (status == 0 ? served_ : refused_)++;
    std::string reply;
    put(reply, uint32_t(status));
    reply += msg;
    fabpool_fd_send(conn, status == 0 ? fds.data() : nullptr, status == 0 ? fds.size() : 0, reply.data(),
                    reply.size());
    close_all(fds);
}

/* ----------------------------------------------------------- the receiver */

namespace {

/* Over the socket: the fds, or false with why (refused: the server said no). */
bool by_socket(const Handle &h, std::vector<int> *out, std::string *why, bool *refused)
{
    int s = -1;
    std::string name = socket_name(h.pid, h.token);
    if (fabpool_fd_connect(name.c_str(), &s, 200) != FABPOOL_OK) {
        *why = fabpool_last_error();
        return false;
    }
    timeouts(s);
    std::string req(kRequestMagic, 4);
    put(req, h.key);
    req += h.desc;
    std::vector<int> fds(h.fds.size(), -1);
    char reply[1024];
    size_t n = 0, len = 0;
    bool ok = fabpool_fd_send(s, nullptr, 0, req.data(), req.size()) == FABPOOL_OK &&
              fabpool_fd_recv(s, fds.data(), fds.size(), &n, reply, sizeof reply, &len) == FABPOOL_OK;
    if (!ok)
        *why = fabpool_last_error();
    close(s);
    fds.resize(n); /* what came, also when the answer is refused or cut short: closed below */
    if (ok && (len < 4 || get<uint32_t>(reply) != 0)) {
        *refused = true;
        *why = len >= 4 ? std::string(reply + 4, std::min(len, sizeof reply) - 4) : "an empty answer";
        ok = false;
    } else if (ok && n != h.fds.size()) {
        *why = std::to_string(n) + " fds came for " + std::to_string(h.fds.size()) + " chunks";
        ok = false;
    }
    if (!ok) {
        close_all(fds);
        return false;
    }
    *out = std::move(fds);
    return true;
}

}  // namespace

std::vector<int> fetch(const Handle &h)
{
    std::vector<int> fds;
    std::string why;
    bool refused = false;
    if (by_socket(h, &fds, &why, &refused))
        return fds;
    std::string head = "fabpool: cannot map a CUDA tensor shared by process " + std::to_string(h.pid) + ": ";
    if (refused)
        throw std::runtime_error(head + "it refused: " + why);
    /* no socket (another network namespace): a copy of each fd, where ptrace permission allows */
    for (int fd : h.fds) {
        int got = -1;
        if (fabpool_fd_from_pid(h.pid, fd, &got) != FABPOOL_OK) {
            std::string pidfd = fabpool_last_error();
            close_all(fds);
            throw std::runtime_error(head + "its fd server: " + why + "; pidfd_getfd: " + pidfd +
                                     " (the sender must still be alive and hold the tensor)");
        }
        fds.push_back(got);
    }
    return fds;
}

}  // namespace ipc
}  // namespace fabpool_torch
