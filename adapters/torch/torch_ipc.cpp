/* torch_ipc.cpp - the handle of a shared tensor, the sender's fd server and
 * the receiver's fetch (torch_ipc.hpp). */
#include "torch_ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "conn_wait.h"
#include "fabpool.h"

namespace fabpool_torch {
namespace ipc {

namespace {

/* handle: "FPIH" u16 version, u16 type, u32 pid, u32 fds, token, u64 key, u32 descriptor bytes, i32 token fd,
 * u64 server id, then the fd numbers (i32 each) and the descriptor; little-endian, as the descriptor */
const char kHandleMagic[4] = {'F', 'P', 'I', 'H'};
constexpr uint16_t kVersion = 2;
constexpr size_t kTokenAt = 16, kKeyAt = kTokenAt + kTokenBytes, kDescLenAt = kKeyAt + 8, kTokenFdAt = kDescLenAt + 4,
                 kServerIdAt = kTokenFdAt + 4, kHeader = kServerIdAt + 8;
/* request: "FPRQ" token, u64 key, then the descriptor; reply: u32 status (a fabpool_status), then the message */
const char kRequestMagic[4] = {'F', 'P', 'R', 'Q'};
constexpr size_t kRequestHeader = 4 + kTokenBytes + 8;
constexpr int kTimeoutMs = 10000; /* a peer that stops talking mid-message */
constexpr int kConnectMs = 200;   /* a server that is not there (another network namespace) */
constexpr int kBusyConnectMs = 2000; /* one whose queue stayed full: it is there, others' connections beside ours (a
                                      * flood on a loaded machine outlasted 200 ms) */
constexpr int kAcceptBurst = 256; /* connections taken at one wake of the server at most */
constexpr size_t kFdsPerSend = 250; /* fds on one sendmsg, as fabpool_fd_send: the kernel takes 253 (SCM_MAX_FD) */
constexpr size_t kAnswerFdsMax = size_t(1) << 20; /* what a receiver takes in one message (fabpool_fd_recv) */

void put(std::string &s, const void *p, size_t n) { s.append(static_cast<const char *>(p), n); }
template <class T> void put(std::string &s, T v) { put(s, &v, sizeof v); }
template <class T> T get(const char *p)
{
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

void close_all(const std::vector<int> &fds)
{
    for (int fd : fds)
        if (fd >= 0)
            close(fd);
}

void random_bytes(void *out, size_t n)
{
    uint8_t *t = static_cast<uint8_t *>(out);
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(t + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            throw std::runtime_error(std::string("fabpool: no random bytes for the IPC fd server's token: ") +
                                     strerror(errno));
        got += size_t(r);
    }
}

/* What the token memfd holds: the token, then the pid of the process that made it, so that a child forked from
 * the sender, which inherits the memfd, does not pass for the sender (a handle naming it is refused). */
std::string proof_bytes(const uint8_t *token, int pid)
{
    std::string b(reinterpret_cast<const char *>(token), kTokenBytes);
    put(b, int32_t(pid));
    return b;
}

/* Whether a and b hold the same token, in a time that does not depend on where they differ. */
bool same_token(const uint8_t *a, const void *b)
{
    const uint8_t *q = static_cast<const uint8_t *>(b);
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < kTokenBytes; i++)
        diff |= a[i] ^ q[i];
    return diff == 0;
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
    put(s, int32_t(h.token_fd));
    put(s, h.server_id);
    for (int fd : h.fds)
        put(s, int32_t(fd));
    s += h.desc;
    return s;
}

bool decode(const std::string &bytes, Handle *h, std::string *why)
{
    const char *p = bytes.data();
    if (bytes.size() < 6 || memcmp(p, kHandleMagic, 4) != 0) {
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
    if (bytes.size() < kHeader) {
        *why = "a malformed handle (" + std::to_string(bytes.size()) + " bytes, shorter than its " +
               std::to_string(kHeader) + "-byte header)";
        return false;
    }
    Handle d;
    d.type = get<uint16_t>(p + 6);
    uint32_t pid = get<uint32_t>(p + 8);
    uint32_t nfds = get<uint32_t>(p + 12);
    memcpy(d.token, p + kTokenAt, kTokenBytes);
    d.key = get<uint64_t>(p + kKeyAt);
    uint32_t dlen = get<uint32_t>(p + kDescLenAt);
    d.token_fd = get<int32_t>(p + kTokenFdAt);
    d.server_id = get<uint64_t>(p + kServerIdAt);
    bool posix = d.type == FABPOOL_HANDLE_POSIX_FD;
    const char *bad = nullptr;
    if (dlen > kMaxDesc || nfds > kMaxDesc || bytes.size() != kHeader + 4 * uint64_t(nfds) + dlen)
        bad = "its length is not what its counts say";
    else if (!posix && d.type != FABPOOL_HANDLE_FABRIC)
        bad = "an unknown handle type";
    else if (posix == (nfds == 0))
        bad = posix ? "a POSIX fd handle without fds" : "a fabric handle with fds";
    else if (pid == 0 || pid > uint32_t(INT32_MAX))
        bad = "no valid sender pid";
    else if (posix && d.token_fd < 0)
        bad = "no token fd";
    else if (!posix && d.token_fd != -1)
        bad = "a fabric handle with a token fd";
    if (!bad)
        for (uint32_t i = 0; i < nfds; i++) {
            int32_t fd = get<int32_t>(p + kHeader + 4 * size_t(i));
            if (fd < 0) {
                bad = "a negative fd number";
                break;
            }
            d.fds.push_back(fd);
        }
    if (bad) {
        *why = std::string("a malformed handle (") + bad + ": " + std::to_string(bytes.size()) + " bytes for " +
               std::to_string(nfds) + " fds and a descriptor of " + std::to_string(dlen) + ", handle type " +
               std::to_string(d.type) + ")";
        return false;
    }
    d.pid = int(pid);
    d.desc.assign(p + kHeader + 4 * size_t(nfds), dlen);
    *h = std::move(d);
    return true;
}

std::string socket_name(int pid, uint64_t server_id)
{
    char id[17];
    snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(server_id));
    return "fabpool-ipc-" + std::to_string(pid) + "-" + id;
}

/* ----------------------------------------------------------- the server */

Server::Server(Serve serve) : serve_(std::move(serve)), pid_(int(getpid()))
{
    random_bytes(token_, kTokenBytes);
    random_bytes(&id_, sizeof id_);
    std::string proof = proof_bytes(token_, pid_);
    if (fabpool_fd_token_make(proof.data(), proof.size(), &token_fd_) != FABPOOL_OK)
        throw std::runtime_error(std::string("fabpool: the IPC fd server's token: ") + fabpool_last_error());
    std::string name = socket_name(pid_, id_);
    if (fabpool_fd_listen(name.c_str(), &listener_) != FABPOOL_OK) {
        std::string m = fabpool_last_error();
        close(token_fd_);
        throw std::runtime_error("fabpool: the IPC fd server cannot listen: " + m);
    }
    int fl = fcntl(listener_, F_GETFL);
    if (fl < 0 || fcntl(listener_, F_SETFL, fl | O_NONBLOCK) != 0 || pipe2(wake_, O_CLOEXEC) != 0) {
        int e = errno;
        close(listener_);
        close(token_fd_);
        throw std::runtime_error(std::string("fabpool: the IPC fd server: its listener or pipe: ") + strerror(e));
    }
    try {
        thread_ = std::thread(&Server::run, this);
    } catch (...) { /* no thread (std::system_error): the destructor does not run, the fds are closed here */
        for (int fd : {listener_, wake_[0], wake_[1], token_fd_})
            close(fd);
        throw;
    }
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
    for (int fd : {listener_, wake_[0], wake_[1], token_fd_})
        if (fd >= 0)
            close(fd);
}

void Server::abandon()
{
    for (int *fd : {&listener_, &wake_[0], &wake_[1], &token_fd_})
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
}

/* How many connections wait at once for the start of their request (conn_wait.h says which gives way past it). */
constexpr int kWaitingMax = 64;
/* How long the listener rests once a connection could not be taken for want of an fd (ms). */
constexpr int kAcceptRestMs = 50;
/* How often a connection that has sent part of its request's start is looked at again (ms). */
constexpr int kPartialMs = 5;
/* A request's start in the stream: fabpool_fd_send's head, the magic and the token. */
constexpr size_t kStartBytes = FABPOOL_FD_HEAD_BYTES + 4 + kTokenBytes;

namespace {

int64_t now_ms()
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

/* What became of connection c, past its deadline or not: answered, closed or read from now on beside the others
 * (Look::done: it waits no more for its start), or it waits on, silent or with part of its start. */
Server::Look Server::look(int c, bool expired)
{
    char start[kStartBytes];
    ssize_t got = recv(c, start, sizeof start, MSG_PEEK | MSG_DONTWAIT);
    bool whole = got == ssize_t(kStartBytes), gone = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    gone = gone || (!whole && got > 0 && cw_hung_up(c)); /* part of a start, and no more can come */
    if (!whole && !gone && !expired)
        return got > 0 ? Look::partial : Look::silent;
    if (!whole || memcmp(start + FABPOOL_FD_HEAD_BYTES, kRequestMagic, 4) != 0)
        refused_++; /* silent, cut, gone or not a request: closed unanswered */
    else if (!same_token(token_, reinterpret_cast<const uint8_t *>(start) + FABPOOL_FD_HEAD_BYTES + 4))
        refuse(c); /* answered at once, the rest of the request never read */
    else {
        read_start(c);
        return Look::done;
    }
    close(c);
    return Look::done;
}

/* Every waiting connection looked at: those answered or closed leave w. */
void Server::sweep(cw_conn *w, int *nw)
{
    int64_t now = now_ms();
    for (int i = 0; i < *nw;)
        if (look(w[i].fd, now >= w[i].until) == Look::done)
            w[i] = w[--*nw];
        else
            i++;
}

/* Every connection that waits in the listener's queue is taken at each wake (the listener does not block, so the
 * loop ends where the queue is empty), and looked at at once: one whose start has come is answered, one already
 * gone is closed, so a flood of connections closed at once (another user's, where FABPOOL_PEERS=any_user lets
 * them in) holds the queue for a wake and no room.  The others wait in w; a full w is looked at again first, so
 * that no connection whose start has come since gives way.  True where a connection could not be taken (no fd for
 * it: the process at RLIMIT_NOFILE): it stays queued, and the listener, which poll says readable at once again,
 * rests kAcceptRestMs rather than wake the thread again and again. */
bool Server::take(cw_conn *w, int *nw, uint64_t *seq)
{
    unsigned own = unsigned(geteuid());
    for (int n = 0; n < kAcceptBurst; n++) {
        int conn = -1;
        fabpool_status st = fabpool_fd_accept(listener_, &conn);
        if (st == FABPOOL_ERR_PERMISSION) {
            refused_++;
            continue;
        }
        if (st != FABPOOL_OK) {
            /* the queue empty, or a connection gone before it was taken: poll says when more comes; else (no fd or
             * memory for it, FABPOOL_PEERS malformed) the connection stays queued and the listener readable */
            int e = errno; /* accept's, where it failed */
            return !(st == FABPOOL_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED));
        }
        cw_conn in = {conn, 0, 0, ++*seq, now_ms() + kTimeoutMs};
        if (fabpool_fd_peer(conn, nullptr, &in.uid) != FABPOOL_OK) {
            close(conn);
            refused_++;
            continue;
        }
        Look l = look(conn, false);
        if (l == Look::done)
            continue;
        in.partial = l == Look::partial;
        if (*nw == kWaitingMax)
            sweep(w, nw);
        refused_ += uint64_t(cw_admit(w, nw, kWaitingMax, &in, own));
    }
    return false;
}

/* The server's one thread.  Every connection accepted waits, all of them watched at once, until the start of its
 * request has come (peeked: the head, the magic and the token); only a request with this process's token is then
 * read, beside the others, as its bytes come, and served once whole.  So neither a connection that stays silent
 * or sends part of a start (a process of another user, where FABPOOL_PEERS=any_user lets it in) nor a receiver
 * that stalls mid-request, nor one that does not read its answer, holds anyone's turn; each is closed at its
 * deadline. */
void Server::run() noexcept
{
    /* arrays, not vectors: a process forked while this thread runs holds no heap of it that no one frees */
    cw_conn waiting[kWaitingMax];
    int nw = 0;
    /* nothing thrown here may reach the thread's end, which would terminate the process (a receiver's doing, or
     * memory short): a connection's own exception closes that connection (step); any other stops the server,
     * its listener closed so that receivers are refused at once, the process unharmed */
    try {
        loop(waiting, &nw);
    } catch (const std::exception &e) {
        stop(e.what());
    } catch (...) {
        stop("an exception that is no std::exception");
    }
    for (int i = 0; i < nw; i++)
        close(waiting[i].fd);
    while (nslots_ > 0)
        drop(nslots_ - 1);
}

/* The server no longer serves: why recorded (stopped()) and said on stderr, the listener closed. */
void Server::stop(const char *why) noexcept
{
    snprintf(stop_msg_, sizeof stop_msg_, "%s", why);
    stopped_.store(true);
    fprintf(stderr, "fabpool: the IPC fd server of process %d stopped (%s): other processes can no longer open "
                    "the CUDA tensors it shares\n", pid_, stop_msg_);
    int l = listener_;
    listener_ = -1; /* before the close: a child forked between them closes no fd that is no longer the listener */
    close(l);
}

/* The server's loop, until its wake pipe says stop; what it holds at the end (w, the slots) its caller closes. */
void Server::loop(cw_conn *waiting, int *pnw)
{
    int &nw = *pnw;
    struct pollfd pf[2 + kWaitingMax + kSlotsMax];
    uint64_t seq = 0;
    int64_t listen_at = 0; /* the listener rests until then: out of fds, it is readable and no accept takes one */
    for (;;) {
        int64_t now = now_ms();
        int timeout = -1;
        bool partial = false;
        auto until = [&](int64_t t) {
            int64_t ms = t - now;
            timeout = timeout < 0 || ms < timeout ? int(ms > 0 ? ms : 0) : timeout;
        };
        bool rest = now < listen_at;
        if (rest)
            until(listen_at);
        pf[0] = {listener_, short(rest ? 0 : POLLIN), 0};
        pf[1] = {wake_[0], POLLIN, 0};
        for (int i = 0; i < nw; i++) {
            until(waiting[i].until);
            char start[kStartBytes];
            bool part = recv(waiting[i].fd, start, sizeof start, MSG_PEEK | MSG_DONTWAIT) > 0;
            partial |= part;
            /* part of a start is in: poll would say readable at once, again and again; it is looked at again
             * after kPartialMs (a hang-up is still reported) */
            pf[2 + i] = {waiting[i].fd, short(part ? 0 : POLLIN), 0};
        }
        for (int i = 0; i < nslots_; i++) {
            until(slots_[i].until);
            pf[2 + nw + i] = {slots_[i].fd, short(slots_[i].answering ? POLLOUT : POLLIN), 0};
        }
        if (partial && (timeout < 0 || timeout > kPartialMs))
            timeout = kPartialMs;
        int r = poll(pf, nfds_t(2 + nw + nslots_), timeout);
        wakes_++;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || pf[1].revents)
            return;
        /* the requests being read and the answers being sent first, while pf matches them; from the last, so
         * that the one moved into a slot that was left has been seen already */
        now = now_ms();
        for (int i = nslots_ - 1; i >= 0; i--) {
            if (pf[2 + nw + i].revents && step(i, now))
                continue;
            if (now < slots_[i].until)
                continue;
            if (slots_[i].answering) {
                drop(i); /* a receiver that took not the whole answer within the deadline: it gets none */
            } else {
                refused_++;
                static_assert(kTimeoutMs == 10000, "the message says the deadline");
                finish(i, FABPOOL_ERR_DESCRIPTOR, "a request that did not come whole within 10 s");
            }
        }
        sweep(waiting, &nw);
        if ((pf[0].revents & POLLIN) && take(waiting, &nw, &seq))
            listen_at = now_ms() + kAcceptRestMs;
    }
}

namespace {

/* An answer as fabpool_fd_send frames it (the receiver is fabpool_fd_recv_timed): its head (the fd count, the
 * payload's length), then the payload, the status and the message. */
std::vector<char> answer_bytes(int status, const char *msg, size_t size, size_t nfds)
{
    /* no more than a request's bytes: the bound on what a slot holds */
    size_t len = std::min(size, kMaxDesc);
    uint32_t head[2] = {uint32_t(nfds), uint32_t(4 + len)};
    std::vector<char> b(sizeof head + 4 + len);
    uint32_t st = uint32_t(status);
    memcpy(b.data(), head, sizeof head);
    memcpy(b.data() + sizeof head, &st, 4);
    memcpy(b.data() + sizeof head + 4, msg, len);
    return b;
}

/* Sends what the socket takes now of the answer b (from *off) and its fds (from *sent), as fabpool_fd_send does
 * but never waiting: the bytes in pieces of 4 KiB, each batch of fds on the first byte of one sendmsg (a sendmsg
 * that takes any byte takes its fds with the first; one that takes none, EAGAIN, takes none of them either), the
 * fds left once the bytes are out each batch on a padding byte.  An fd that went out is closed (the message
 * holds the file now) and -1 in fds.  1: all of it is out; 0: the socket takes no more for now; -1: an error
 * (the peer gone).  *moved: whether any byte went. */
int send_some(int c, const std::vector<char> &b, size_t *off, std::vector<int> *fds, size_t *sent, bool *moved)
{
    for (;;) {
        size_t left = b.size() - *off, nf = std::min(fds->size() - *sent, kFdsPerSend);
        if (left == 0 && nf == 0)
            return 1;
        char pad = 0;
        size_t k = std::min(left, size_t(4096));
        struct iovec iov = {k ? const_cast<char *>(b.data() + *off) : &pad, k ? k : 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * kFdsPerSend)];
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct msghdr m = {};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (nf) {
            m.msg_control = ctl.buf;
            m.msg_controllen = CMSG_SPACE(sizeof(int) * nf);
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN(sizeof(int) * nf);
            memcpy(CMSG_DATA(h), fds->data() + *sent, sizeof(int) * nf);
        }
        ssize_t r = sendmsg(c, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r <= 0)
            return -1;
        for (size_t j = *sent; j < *sent + nf; j++) {
            close((*fds)[j]);
            (*fds)[j] = -1;
        }
        *sent += nf;
        if (k)
            *off += size_t(r); /* the rest of a piece the socket took in part goes with the next batch */
        *moved = true;
    }
}

/* A refusal (no fds, a short message) on a connection that is closed next: it goes at once, into a socket that
 * holds nothing of ours yet, or not at all (nor where its bytes find no memory). */
void answer_now(int c, int status, const char *msg) noexcept
{
    std::vector<char> b;
    try {
        b = answer_bytes(status, msg, strlen(msg), 0);
    } catch (const std::bad_alloc &) {
        return;
    }
    std::vector<int> none;
    size_t off = 0, sent = 0;
    bool moved = false;
    send_some(c, b, &off, &none, &sent, &moved);
}

const char kNoToken[] = "a request without this process's token (a handle of another process, or a forged one)";

}  // namespace

/* A request without this process's token: answered at once, nothing more of it read. */
void Server::refuse(int conn)
{
    refused_++;
    answer_now(conn, FABPOOL_ERR_PERMISSION, kNoToken);
}

namespace {

const char kMalformed[] = "a malformed request";

/* Closes every fd that came with message m: true where one did, or some were dropped (a request brings none). */
bool close_fds(struct msghdr *m)
{
    bool any = (m->msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + k * sizeof fd, sizeof fd);
                close(fd);
                any = true;
            }
    return any;
}

}  // namespace

/* Connection c, whose start bears the token, takes a slot, with the whole request due within kTimeoutMs, and
 * what has come of it is read at once.  Where kSlotsMax are taken, each is read or sent to again first (a request
 * whose rest has come since is served, an answer taken since leaves), then one gives way (victim). */
void Server::read_start(int c)
{
    int64_t now = now_ms();
    int pid = -1;
    unsigned uid = ~0u; /* no credentials: a stranger's, the first to give way */
    fabpool_fd_peer(c, &pid, &uid);
    for (int i = nslots_ - 1; i >= 0 && nslots_ == kSlotsMax; i--)
        step(i, now);
    if (nslots_ == kSlotsMax) {
        int v = victim(pid, uid);
        if (slots_[v].answering) {
            drop(v); /* its answer not taken: it gets none */
        } else {
            refused_++;
            finish(v, FABPOOL_ERR_DESCRIPTOR, "a request that stalled, closed for a newer one");
        }
    }
    Slot &r = slots_[nslots_++];
    r.fd = c;
    r.pid = pid;
    r.uid = uid;
    r.until = now + kTimeoutMs;
    r.last = now;
    step(nslots_ - 1, now);
}

/* Which slot gives way for a newcomer of process pid of user uid, all kSlotsMax taken: another user's before this
 * one's, of two users the one that holds more (as for the connections that wait for their start); then one of
 * the process that holds the most slots (the newcomer counted), so that a process that fills the table with
 * connections it leaves stalled closes its own, never another's request still coming in pieces; of it, the one
 * idle the longest: a receiver sends its request whole right after its connect and reads its answer, so that one
 * is the likeliest to have stalled. */
int Server::victim(int pid, unsigned uid) const
{
    unsigned own = unsigned(geteuid());
    auto of_user = [&](unsigned u) {
        int k = uid == u;
        for (int i = 0; i < nslots_; i++)
            k += slots_[i].uid == u;
        return k;
    };
    auto of_process = [&](const Slot &s) {
        int k = uid == s.uid && pid == s.pid;
        for (int i = 0; i < nslots_; i++)
            k += slots_[i].uid == s.uid && slots_[i].pid == s.pid;
        return k;
    };
    auto before = [&](const Slot &a, const Slot &b) {
        if ((a.uid != own) != (b.uid != own))
            return a.uid != own;
        if (a.uid != b.uid) { /* two other users */
            int ca = of_user(a.uid), cb = of_user(b.uid);
            if (ca != cb)
                return ca > cb;
        }
        int pa = of_process(a), pb = of_process(b);
        if (pa != pb)
            return pa > pb;
        return a.last < b.last;
    };
    int v = 0;
    for (int i = 1; i < nslots_; i++)
        if (before(slots_[i], slots_[v]))
            v = i;
    return v;
}

/* slots_[i] read or sent to as far as its socket allows: true where it left the table.  An exception while it
 * is (no memory for its request or its answer, the serve callback's) closes it, with every fd it holds, the
 * receiver told why where it was not answered yet; the others are served on. */
bool Server::step(int i, int64_t now) noexcept
{
    int status = FABPOOL_ERR_IO;
    try {
        return slots_[i].answering ? flush(i, now) : feed(i, now);
    } catch (const std::bad_alloc &) {
        status = FABPOOL_ERR_HOST_MEMORY;
    } catch (...) {
    }
    refused_++;
    if (slots_[i].answering)
        drop(i);
    else
        finish(i, status, "the sender's fd server failed serving this request (short of memory, or an error in "
                          "the sender); it serves on");
    return true;
}

/* Reads what has come of slots_[i]'s request, no further than its end, and never waits for more (MSG_DONTWAIT);
 * a request whole is served.  True where the connection is done with and has left the table (slots_[i] is then
 * another, or none). */
bool Server::feed(int i, int64_t now)
{
    Slot &r = slots_[i];
    for (;;) {
        size_t have = r.buf.size(), want = FABPOOL_FD_HEAD_BYTES;
        if (have >= want) {
            uint32_t head[2];
            memcpy(head, r.buf.data(), sizeof head);
            /* a request brings no fds, and its length is bounded before its bytes are kept */
            if (head[0] != 0 || head[1] < kRequestHeader || head[1] > kRequestHeader + kMaxDesc)
                break;
            want += head[1];
        }
        if (have == want)
            return serve_whole(i, now);
        /* the buffer grows as bytes come, not as the head announces them, and never past the request */
        size_t step = std::min(want - have, size_t(64) << 10);
        if (r.buf.capacity() < have + step)
            r.buf.reserve(std::min(want, std::max(2 * r.buf.capacity(), have + step)));
        r.buf.resize(have + step);
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int) * 4)];
        } ctl;
        struct iovec iov = {r.buf.data() + have, step};
        struct msghdr m = {};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        ssize_t got = recvmsg(r.fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        int e = errno;
        r.buf.resize(have + size_t(got > 0 ? got : 0));
        if (got < 0 && e == EINTR)
            continue;
        if (got < 0 && (e == EAGAIN || e == EWOULDBLOCK))
            return false;
        if (got <= 0 || close_fds(&m))
            break; /* cut short, a socket error, or fds */
        r.last = now;
    }
    refused_++;
    finish(i, FABPOOL_ERR_DESCRIPTOR, kMalformed);
    return true;
}

/* slots_[i]'s request, whole: served, or refused; the answer sent as far as the socket takes it.  True where
 * the connection left the table. */
bool Server::serve_whole(int i, int64_t now)
{
    const char *req = slots_[i].buf.data() + FABPOOL_FD_HEAD_BYTES;
    size_t len = slots_[i].buf.size() - FABPOOL_FD_HEAD_BYTES;
    std::string msg;
    std::vector<int> fds;
    int status = FABPOOL_ERR_DESCRIPTOR;
    try {
        if (memcmp(req, kRequestMagic, 4) != 0) {
            msg = kMalformed;
        } else if (!same_token(token_, req + 4)) {
            status = FABPOOL_ERR_PERMISSION;
            msg = kNoToken;
        } else {
            std::string desc(req + kRequestHeader, len - kRequestHeader);
            status = serve_(get<uint64_t>(req + 4 + kTokenBytes), desc, &fds, &msg);
            if (status < 0 || status > FABPOOL_STATUS_LAST)
                status = FABPOOL_ERR_IO;
            if (status == 0 && fds.size() > kAnswerFdsMax) {
                status = FABPOOL_ERR_LIMIT;
                msg = std::to_string(fds.size()) + " fds, more than one message carries";
            }
        }
        (status == 0 ? served_ : refused_)++;
        if (status != 0) {
            close_all(fds);
            fds.clear();
        }
        return answer(i, status, msg, &fds, now);
    } catch (...) {
        close_all(fds); /* those the callback gave before it threw; an answer's own are its slot's (drop) */
        throw;
    }
}

/* slots_[i] answers, with the fds (status 0), which it takes: the answer is its now, bytes and fds, and goes out
 * as the socket takes it (flush), all of it within kTimeoutMs; a receiver that does not read it holds its own
 * slot, not the thread.  True where the connection left the table (the answer all out, or the peer gone). */
bool Server::answer(int i, int status, const std::string &msg, std::vector<int> *fds, int64_t now)
{
    Slot &r = slots_[i];
    r.fds.swap(*fds); /* first: where the bytes below find no memory, the slot's close closes the fds */
    r.fds_sent = 0;
    std::vector<char> b = answer_bytes(status, msg.data(), msg.size(), r.fds.size());
    r.buf.swap(b); /* the request's memory given back */
    r.off = 0;
    r.answering = true;
    r.until = now + kTimeoutMs;
    r.last = now;
    return flush(i, now);
}

/* Sends what slots_[i]'s socket takes of its answer: true where the connection left the table, its answer all
 * out, or its peer gone. */
bool Server::flush(int i, int64_t now)
{
    Slot &r = slots_[i];
    bool moved = false;
    int done = send_some(r.fd, r.buf, &r.off, &r.fds, &r.fds_sent, &moved);
    if (moved)
        r.last = now;
    if (done == 0)
        return false;
    drop(i);
    return true;
}

/* slots_[i] refused with a short answer, at once, and closed. */
void Server::finish(int i, int status, const char *msg) noexcept
{
    answer_now(slots_[i].fd, status, msg);
    drop(i);
}

/* slots_[i] closed, with every fd of an answer it still holds, and out of the table, its memory given back. */
void Server::drop(int i) noexcept
{
    Slot &r = slots_[i];
    close(r.fd);
    close_all(r.fds);
    r = Slot();
    std::swap(r, slots_[--nslots_]);
}

/* ----------------------------------------------------------- the receiver */

namespace {

enum class Reach { ok, unreachable, refused };

/* Over the socket: the fds, else why (unreachable: no server listens; refused: the listener is not the sender,
 * or the sender said no, *st says how). */
Reach by_socket(const Handle &h, std::vector<int> *out, std::string *why, fabpool_status *st)
{
    int s = -1;
    std::string name = socket_name(h.pid, h.server_id);
    *st = fabpool_fd_connect_peer(name.c_str(), &s, kConnectMs, h.pid, 0);
    if (*st == FABPOOL_ERR_IO && errno == EAGAIN) /* fabpool_fd_connect_peer leaves connect(2)'s errno */
        *st = fabpool_fd_connect_peer(name.c_str(), &s, kBusyConnectMs, h.pid, 0);
    if (*st != FABPOOL_OK) {
        *why = fabpool_last_error();
        /* a listener that is not the sender (it exited and someone took the name): nothing else is tried */
        return *st == FABPOOL_ERR_PERMISSION ? Reach::refused : Reach::unreachable;
    }
    std::string req(kRequestMagic, 4);
    put(req, h.token, kTokenBytes);
    put(req, h.key);
    req += h.desc;
    std::vector<int> fds(h.fds.size(), -1);
    char reply[1024];
    size_t n = 0, len = 0;
    *st = fabpool_fd_send(s, nullptr, 0, req.data(), req.size());
    if (*st == FABPOOL_OK) /* every fd that came is closed on failure (n is then 0) */
        *st = fabpool_fd_recv_timed(s, fds.data(), fds.size(), &n, reply, sizeof reply, &len, kTimeoutMs);
    if (*st != FABPOOL_OK)
        *why = std::string("its answer: ") + fabpool_last_error();
    close(s);
    fds.resize(n);
    if (*st == FABPOOL_OK && (len < 4 || get<uint32_t>(reply) != 0)) {
        uint32_t code = len >= 4 ? get<uint32_t>(reply) : 0;
        *st = code > 0 && code <= FABPOOL_STATUS_LAST ? fabpool_status(code) : FABPOOL_ERR_IO;
        *why = len >= 4 ? std::string(reply + 4, len - 4) : "an empty answer";
    } else if (*st == FABPOOL_OK && n != h.fds.size()) {
        *st = FABPOOL_ERR_IO;
        *why = std::to_string(n) + " fds came for " + std::to_string(h.fds.size()) + " chunks";
    }
    if (*st != FABPOOL_OK) {
        close_all(fds);
        return Reach::refused;
    }
    *out = std::move(fds);
    return Reach::ok;
}

/* Through a pidfd of the sender, once it has shown the handle's token: the fds, else false with *st and why. */
bool by_pidfd(const Handle &h, std::vector<int> *out, std::string *why, fabpool_status *st)
{
    int pidfd = -1;
    *st = fabpool_fd_pidfd_open(h.pid, &pidfd);
    std::string proof = proof_bytes(h.token, h.pid);
    if (*st == FABPOOL_OK)
        *st = fabpool_fd_token_check(pidfd, h.token_fd, proof.data(), proof.size());
    std::vector<int> fds;
    for (size_t i = 0; *st == FABPOOL_OK && i < h.fds.size(); i++) {
        int got = -1;
        *st = fabpool_fd_from_pidfd(pidfd, h.fds[i], &got);
        if (*st == FABPOOL_OK)
            fds.push_back(got);
    }
    if (*st != FABPOOL_OK)
        *why = fabpool_last_error();
    if (pidfd >= 0)
        close(pidfd);
    if (*st != FABPOOL_OK) {
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
    fabpool_status st = FABPOOL_OK;
    Reach r = by_socket(h, &fds, &why, &st);
    if (r == Reach::ok)
        return fds;
    std::string head = "fabpool: cannot map a CUDA tensor shared by process " + std::to_string(h.pid) + ": ";
    if (r == Reach::refused)
        throw Error(st, head + "its fd server: " + why);
    /* no socket (another network namespace): a copy of each fd, where ptrace permission allows, once the process
     * has shown it holds the handle's token */
    std::string sock = why;
    if (!by_pidfd(h, &fds, &why, &st))
        throw Error(st, head + "its fd server: " + sock + "; pidfd_getfd: " + why +
                            " (the sender must still be alive and hold the tensor)");
    return fds;
}

}  // namespace ipc
}  // namespace fabpool_torch
