/* fdpass.c - file descriptors between processes of one host: SCM_RIGHTS
 * over Unix stream sockets in the abstract namespace, with the credentials of
 * the peer checked at both ends, or pidfd_getfd with the ptrace permission it
 * needs and a sealed memfd as the proof that the process copied from is the
 * one meant (include/fabpool_fdpass.h).  Layer base.  Calls: error, log. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"

#define FP_FDS_PER_MSG 250      /* fds on one sendmsg: the kernel takes at most 253 (SCM_MAX_FD) */
#define FP_FDS_RECV_MAX 253     /* room on one recvmsg: what any sender may put on one, so no fd is dropped */
#define FP_MSG_FDS_MAX (1u << 20)   /* fds one message may announce: no process holds more */
#define FP_MSG_BYTES_MAX (1u << 30) /* payload bytes one message may announce */
#define FP_PEERS_ENV_MAX 256        /* characters of FABPOOL_PEERS read */
#define FP_TOKEN_MAX 64

#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020 /* Linux 6.3: added by the kernel to memfds where vm.memfd_noexec asks it */
#endif
#define FP_TOKEN_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

/* ---- who may be the peer ---- */

static pthread_once_t peers_once = PTHREAD_ONCE_INIT;
static unsigned peers_flags;          /* written once (peers_once) */
static fabpool_status peers_status;   /* FABPOOL_OK or FABPOOL_ERR_CONFIG */
static char peers_msg[FP_PEERS_ENV_MAX + 256];

/* The word at w (n bytes) for a message: at most 64 characters, anything
 * unprintable as '?'. */
static void word_copy(char *out, size_t cap, const char *w, size_t n)
{
    size_t k = 0;
    for (; k < n && k < 64 && k + 1 < cap; k++)
        out[k] = w[k] >= 0x20 && w[k] < 0x7f ? w[k] : '?';
    out[k] = '\0';
}

static void peers_read(void)
{
    const char *e = getenv("FABPOOL_PEERS");
    if (!e)
        return;
    size_t len = strnlen(e, FP_PEERS_ENV_MAX + 1);
    if (len > FP_PEERS_ENV_MAX) {
        peers_status = FABPOOL_ERR_CONFIG;
        snprintf(peers_msg, sizeof peers_msg, "FABPOOL_PEERS is longer than %d characters: a comma-separated list of "
                 "any_user, any_pid, same_user (or empty) is expected; fd sockets refuse every peer until it is fixed",
                 FP_PEERS_ENV_MAX);
        return;
    }
    unsigned flags = 0;
    int same = 0;
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && e[j] != ',')
            j++;
        size_t a = i, b = j; /* the word, blanks around it dropped */
        while (a < b && (e[a] == ' ' || e[a] == '\t'))
            a++;
        while (b > a && (e[b - 1] == ' ' || e[b - 1] == '\t'))
            b--;
        size_t n = b - a;
        if (n == 8 && memcmp(e + a, "any_user", 8) == 0)
            flags |= FABPOOL_FD_ANY_USER;
        else if (n == 7 && memcmp(e + a, "any_pid", 7) == 0)
            flags |= FABPOOL_FD_ANY_PID;
        else if (n == 9 && memcmp(e + a, "same_user", 9) == 0)
            same = 1;
        else if (n != 0) {
            char w[65];
            word_copy(w, sizeof w, e + a, n);
            peers_status = FABPOOL_ERR_CONFIG;
            snprintf(peers_msg, sizeof peers_msg, "FABPOOL_PEERS: '%s' is not a word it knows; accepted: any_user, "
                     "any_pid, same_user (the default), comma-separated, or empty; fd sockets refuse every peer "
                     "until it is fixed", w);
            return;
        }
        i = j + 1;
    }
    if (same && (flags & FABPOOL_FD_ANY_USER)) {
        peers_status = FABPOOL_ERR_CONFIG;
        snprintf(peers_msg, sizeof peers_msg, "FABPOOL_PEERS names both same_user and any_user: keep the one meant "
                 "(accepted: any_user, any_pid, same_user, comma-separated, or empty); fd sockets refuse every peer "
                 "until it is fixed");
        return;
    }
    peers_flags = flags;
}

fabpool_status fabpool_fd_peers_env(unsigned *flags)
{
    (void)pthread_once(&peers_once, peers_read);
    if (flags)
        *flags = peers_status == FABPOOL_OK ? peers_flags : 0;
    if (peers_status != FABPOOL_OK)
        return fp_error(peers_status, "%s", peers_msg);
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_peer(int sock, int *pid, unsigned *uid)
{
    struct ucred c;
    socklen_t cl = sizeof c;
    memset(&c, 0, sizeof c);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &cl) != 0 || cl != sizeof c)
        return fp_error(FABPOOL_ERR_IO, "fabpool_fd_peer(%d): SO_PEERCRED: %s (a connected Unix socket is needed)",
                        sock, cl != sizeof c ? "short answer" : strerror(errno));
    if (pid)
        *pid = (int)c.pid;
    if (uid)
        *uid = (unsigned)c.uid;
    return FABPOOL_OK;
}

/* Whether the process at the other end of s may be the peer: its uid is
 * this process's effective uid unless FABPOOL_FD_ANY_USER, its pid is `pid`
 * unless pid is 0 or FABPOOL_FD_ANY_PID (flags: the caller's and
 * FABPOOL_PEERS').  FABPOOL_ERR_PERMISSION naming both sides when not (s is
 * left to the caller to close).  `who` says what s is, for the message. */
static fabpool_status peer_check(const char *fn, const char *who, int s, int pid, unsigned flags, int *peer_pid)
{
    int ppid = 0;
    unsigned puid = 0;
    fabpool_status st = fabpool_fd_peer(s, &ppid, &puid);
    if (st != FABPOOL_OK) {
        fp_error_append(" (%s)", fn);
        return st;
    }
    if (peer_pid)
        *peer_pid = ppid;
    unsigned me = (unsigned)geteuid();
    int uid_bad = !(flags & FABPOOL_FD_ANY_USER) && puid != me;
    int pid_bad = pid != 0 && !(flags & FABPOOL_FD_ANY_PID) && ppid != pid;
    if (!uid_bad && !pid_bad)
        return FABPOOL_OK;
    char want[96];
    if (pid != 0 && !(flags & FABPOOL_FD_ANY_PID))
        snprintf(want, sizeof want, "process %d%s", pid, flags & FABPOOL_FD_ANY_USER ? "" : " of uid ");
    else
        snprintf(want, sizeof want, "%s", flags & FABPOOL_FD_ANY_USER ? "any process" : "a process of uid ");
    if (!(flags & FABPOOL_FD_ANY_USER))
        snprintf(want + strlen(want), sizeof want - strlen(want), "%u", me);
    fp_error(FABPOOL_ERR_PERMISSION, "%s: refused %s: it is process %d of uid %u, and only %s may be the peer; the "
             "socket was closed, nothing sent or taken.  If that process is meant to be the peer, set "
             "FABPOOL_PEERS=%s (or pass %s to the *_peer call)", fn, who, ppid, puid, want,
             uid_bad ? "any_user" : "any_pid", uid_bad ? "FABPOOL_FD_ANY_USER" : "FABPOOL_FD_ANY_PID");
    FP_LOG(FP_LOG_WARN, "%s", fabpool_last_error());
    return FABPOOL_ERR_PERMISSION;
}

/* The flags of a call with FABPOOL_PEERS' added; FABPOOL_ERR_CONFIG (the
 * caller refuses to run loosened or not as configured) when it is wrong. */
static fabpool_status peers_flags_of(const char *fn, unsigned flags, unsigned *out)
{
    unsigned env = 0;
    if (fabpool_fd_peers_env(&env) != FABPOOL_OK) {
        fp_error_append(" (%s refused)", fn);
        return FABPOOL_ERR_CONFIG;
    }
    if (flags & ~(FABPOOL_FD_ANY_USER | FABPOOL_FD_ANY_PID))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: flags 0x%x: only FABPOOL_FD_ANY_USER and FABPOOL_FD_ANY_PID "
                        "are known", fn, flags);
    *out = flags | env;
    return FABPOOL_OK;
}

/* ---- sockets ---- */

static fabpool_status addr_of(const char *name, struct sockaddr_un *a, socklen_t *len)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n + 1 > sizeof a->sun_path)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "socket name '%s': 1 to %zu characters", name ? name : "(null)",
                        sizeof a->sun_path - 1);
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path + 1, name, n); /* abstract: no file to clean up */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_listen(const char *name, int *out)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    fabpool_status st = addr_of(name, &a, &len);
    if (st != FABPOOL_OK || !out)
        return st != FABPOOL_OK ? st : fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_listen: out is NULL");
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, 64) != 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        return fp_error(FABPOOL_ERR_IO, "fabpool_fd_listen('%s'): %s", name, strerror(e));
    }
    *out = s;
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_accept_peer(int listener, int *out, int pid, unsigned flags, int *peer_pid)
{
    if (!out || pid < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_accept_peer: %s", !out ? "sock is NULL" : "pid < 0");
    fabpool_status st = peers_flags_of("fabpool_fd_accept", flags, &flags);
    if (st != FABPOOL_OK)
        return st;
    int s = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
        return fp_error(FABPOOL_ERR_IO, "fabpool_fd_accept: %s", strerror(errno));
    st = peer_check("fabpool_fd_accept", "a connection", s, pid, flags, peer_pid);
    if (st != FABPOOL_OK) {
        close(s);
        return st;
    }
    *out = s;
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_accept(int listener, int *out)
{
    return fabpool_fd_accept_peer(listener, out, 0, 0, NULL);
}

fabpool_status fabpool_fd_connect_peer(const char *name, int *out, int timeout_ms, int pid, unsigned flags)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    fabpool_status st = addr_of(name, &a, &len);
    if (st != FABPOOL_OK)
        return st;
    if (!out || pid < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_connect('%s'): %s", name,
                        !out ? "sock is NULL" : "pid < 0");
    if ((st = peers_flags_of("fabpool_fd_connect", flags, &flags)) != FABPOOL_OK)
        return st;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect: socket: %s", strerror(errno));
        if (connect(s, (struct sockaddr *)&a, len) == 0) {
            char who[160];
            snprintf(who, sizeof who, "the listener of '%.100s'", name);
            /* a listener that is not who it must be gets no byte, and is not
             * retried: the name is taken by someone else */
            st = peer_check("fabpool_fd_connect", who, s, pid, flags, NULL);
            if (st != FABPOOL_OK) {
                close(s);
                return st;
            }
            *out = s;
            return FABPOOL_OK;
        }
        int e = errno;
        close(s);
        clock_gettime(CLOCK_MONOTONIC, &t);
        long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if ((e != ECONNREFUSED && e != ENOENT) || ms >= timeout_ms)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect('%s'): %s after %ld ms", name, strerror(e), ms);
        usleep(2000); /* the peer has not listened yet */
    }
}

fabpool_status fabpool_fd_connect(const char *name, int *out, int timeout_ms)
{
    return fabpool_fd_connect_peer(name, out, timeout_ms, 0, 0);
}

/* One message: a u32 fd count and a u32 payload length, then the payload;
 * the fds ride on the first bytes in batches of FP_FDS_PER_MSG, and those
 * left when the bytes are out each on a padding byte of their own. */
fabpool_status fabpool_fd_send(int sock, const int *fds, size_t n, const void *data, size_t len)
{
    if (n > FP_MSG_FDS_MAX || len > FP_MSG_BYTES_MAX || (n && !fds) || (len && !data))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_send: %zu fds and %zu bytes: at most %u fds and %u "
                        "bytes a message, and no NULL array for a count above 0", n, len, FP_MSG_FDS_MAX,
                        FP_MSG_BYTES_MAX);
    uint32_t head[2] = {(uint32_t)n, (uint32_t)len};
    size_t sent_fds = 0;
    const uint8_t *payload = data;
    size_t off = 0, total = sizeof head + len;
    while (off < total || sent_fds < n) {
        uint8_t chunk[4096];
        size_t k = 0;
        while (k < sizeof chunk && off < total) {
            chunk[k++] = off < sizeof head ? ((uint8_t *)head)[off] : payload[off - sizeof head];
            off++;
        }
        if (k == 0) /* fds left but no bytes: carry them on a byte of padding */
            chunk[k++] = 0;
        size_t nf = n - sent_fds < FP_FDS_PER_MSG ? n - sent_fds : FP_FDS_PER_MSG;
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * FP_FDS_PER_MSG)];
        } ctl;
        memset(&ctl, 0, sizeof ctl); /* the padding after the fds goes out too */
        struct iovec iov = {chunk, k};
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (nf) {
            m.msg_control = ctl.buf;
            m.msg_controllen = CMSG_SPACE(sizeof(int) * nf);
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * nf);
            memcpy(CMSG_DATA(c), fds + sent_fds, sizeof(int) * nf);
        }
        ssize_t r;
        do
            r = sendmsg(sock, &m, MSG_NOSIGNAL);
        while (r < 0 && errno == EINTR);
        if (r < 0)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_send: %s", strerror(errno));
        if ((size_t)r < k) /* stream sockets may take less: resend the rest next round */
            off -= k - (size_t)r;
        sent_fds += nf;
        if (off >= total && sent_fds >= n && (size_t)r == k)
            break;
    }
    return FABPOOL_OK;
}

/* The fds of one message as they arrive: in the caller's array while it has
 * room, closed at once past it. */
typedef struct fd_in {
    int *fds;
    size_t cap;
    size_t got;  /* fds that arrived, kept or not */
    int over;    /* more came than cap */
} fd_in;

static void fd_in_take(fd_in *in, int fd)
{
    if (in->got < in->cap)
        in->fds[in->got] = fd;
    else {
        close(fd);
        in->over = 1;
    }
    in->got++;
}

static void fd_in_close(fd_in *in)
{
    size_t k = in->got < in->cap ? in->got : in->cap;
    for (size_t i = 0; i < k; i++) {
        close(in->fds[i]);
        in->fds[i] = -1;
    }
}

/* Takes the fds of every SCM_RIGHTS control message of m into in; -1 when a
 * control message is malformed (its length below its header's or past the
 * buffer), after taking every fd it can read. */
static int fd_in_cmsgs(fd_in *in, struct msghdr *m)
{
    int bad = 0;
    const char *end = (const char *)m->msg_control + m->msg_controllen;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_len < CMSG_LEN(0) || c->cmsg_len > (size_t)(end - (const char *)c)) {
            bad = 1;
            break;
        }
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *p = CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, p + i * sizeof fd, sizeof fd);
            fd_in_take(in, fd);
        }
    }
    return bad ? -1 : 0;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

fabpool_status fabpool_fd_recv_timed(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap,
                                     size_t *len, int timeout_ms)
{
    const char *fn = timeout_ms < 0 ? "fabpool_fd_recv" : "fabpool_fd_recv_timed";
    if (n)
        *n = 0;
    if (len)
        *len = 0;
    fd_in in = {fds, fds ? cap : 0, 0, 0};
    if (!data)
        data_cap = 0;
    int64_t deadline = timeout_ms < 0 ? 0 : now_ns() + (int64_t)timeout_ms * 1000000;
    uint32_t head[2] = {0, 0};
    size_t off = 0, want = sizeof head; /* bytes of the message in, and its length once the head is in */
    fabpool_status st = FABPOOL_OK;
    while (off < want || in.got < head[0]) {
        if (timeout_ms >= 0) { /* wait for the next piece no later than the deadline */
            int64_t left = deadline - now_ns();
            int pr = 0;
            if (left > 0) {
                int64_t ms = (left + 999999) / 1000000;
                struct pollfd p = {.fd = sock, .events = POLLIN};
                pr = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
                if (pr < 0 && errno == EINTR)
                    continue;
                if (pr < 0) {
                    st = fp_error(FABPOOL_ERR_IO, "%s: poll: %s", fn, strerror(errno));
                    break;
                }
            }
            if (pr == 0) {
                st = fp_error(FABPOOL_ERR_IO, "%s: the message did not come whole within %d ms (%zu of %zu bytes, "
                              "%zu of %u fds): the peer stalls or does not speak this protocol; what came was "
                              "closed and the socket is out of step: close it", fn, timeout_ms, off,
                              off < sizeof head ? (size_t)0 : want, in.got, off < sizeof head ? 0u : head[0]);
                break;
            }
        }
        uint8_t chunk[4096];
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * FP_FDS_RECV_MAX)];
        } ctl;
        /* read no further than this message: the next one may follow at once */
        struct iovec iov;
        if (off >= want) { /* the padding byte that carries the last fds */
            iov.iov_base = chunk;
            iov.iov_len = 1;
        } else if (off >= sizeof head && off - sizeof head < data_cap) { /* straight into the caller's buffer */
            size_t at = off - sizeof head, room = want - off;
            iov.iov_base = (uint8_t *)data + at;
            iov.iov_len = room < data_cap - at ? room : data_cap - at;
        } else {
            size_t room = want - off;
            iov.iov_base = chunk;
            iov.iov_len = room < sizeof chunk ? room : sizeof chunk;
        }
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof ctl.buf;
        ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | (timeout_ms >= 0 ? MSG_DONTWAIT : 0));
        if (r < 0 && (errno == EINTR || (timeout_ms >= 0 && (errno == EAGAIN || errno == EWOULDBLOCK))))
            continue;
        if (r < 0) {
            st = fp_error(FABPOOL_ERR_IO, "%s: %s", fn, strerror(errno));
            break;
        }
        int cmsg_bad = fd_in_cmsgs(&in, &m);
        if (m.msg_flags & MSG_CTRUNC) {
            st = fp_error(FABPOOL_ERR_IO, "%s: the kernel dropped fds of the message (MSG_CTRUNC): this process is "
                          "out of file descriptors (RLIMIT_NOFILE: raise it with ulimit -n, or close fds); what came "
                          "was closed and the socket is out of step: close it", fn);
            break;
        }
        if (cmsg_bad) {
            st = fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: a malformed control message; what came was closed and the "
                          "socket is out of step: close it", fn);
            break;
        }
        if (r == 0) {
            if (off == 0 && in.got == 0)
                st = fp_error(FABPOOL_ERR_IO, "%s: the peer closed the socket", fn);
            else
                st = fp_error(FABPOOL_ERR_IO, "%s: the peer closed the socket mid-message (%zu of %zu bytes, %zu of "
                              "%u fds in): what came was closed", fn, off, off < sizeof head ? (size_t)0 : want,
                              in.got, off < sizeof head ? 0u : head[0]);
            break;
        }
        if (off < sizeof head) {
            memcpy((uint8_t *)head + off, chunk, (size_t)r);
            off += (size_t)r;
            if (off == sizeof head) {
                if (head[0] > FP_MSG_FDS_MAX || head[1] > FP_MSG_BYTES_MAX) {
                    st = fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: the message's head announces %u fds and %u bytes, "
                                  "above the %u fds and %u bytes of any message fabpool_fd_send makes: the peer does "
                                  "not speak this protocol; nothing kept, and the socket is out of step: close it",
                                  fn, head[0], head[1], FP_MSG_FDS_MAX, FP_MSG_BYTES_MAX);
                    break;
                }
                want = sizeof head + head[1];
            }
        } else if (off < want) {
            off += (size_t)r; /* bytes past data_cap went to chunk: dropped */
        }
        /* else: a padding byte */
        if (off >= sizeof head && in.got > head[0]) {
            st = fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: %zu fds came with a message that announces %u: the peer does "
                          "not speak this protocol; they were closed and the socket is out of step: close it", fn,
                          in.got, head[0]);
            break;
        }
    }
    if (st == FABPOOL_OK && (in.over || head[1] > data_cap)) {
        if (in.over)
            st = fp_error(FABPOOL_ERR_LIMIT, "%s: a message of %u fds, room for %zu: they were closed (the message "
                          "was read whole: the socket may carry on)", fn, head[0], in.cap);
        else
            st = fp_error(FABPOOL_ERR_LIMIT, "%s: a payload of %u bytes, room for %zu: its fds were closed (the "
                          "message was read whole: the socket may carry on)", fn, head[1], data_cap);
        if (len)
            *len = head[1];
    }
    if (st != FABPOOL_OK) {
        fd_in_close(&in);
        return st;
    }
    if (n)
        *n = in.got;
    if (len)
        *len = head[1];
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_recv(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap, size_t *len)
{
    return fabpool_fd_recv_timed(sock, fds, cap, n, data, data_cap, len, -1);
}

/* ---- pidfds and ptrace consent ---- */

/* Yama's ptrace_scope (0..3), or -1 where Yama is absent. */
static int ptrace_scope(void)
{
    int v = -1;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (!f)
        return -1;
    if (fscanf(f, "%d", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

/* What to change so that pidfd_open / pidfd_getfd on process pid works, for
 * its errno e under Yama ptrace_scope `scope`. */
static const char *pidfd_advice(int e, int scope)
{
    if (e == ENOSYS)
        return "this kernel has no pidfd_getfd (Linux 5.6 or later is needed; see uname -r): pass the fds over a "
               "socket instead (fabpool_fd_send / fabpool_fd_recv)";
    if (e == ESRCH)
        return "the process is gone: it must stay alive until its peers have copied its fds";
    if (e != EPERM && e != EACCES)
        return "the process does not have that fd open, or pass the fds over a socket instead "
               "(fabpool_fd_send / fabpool_fd_recv)";
    switch (scope) {
    case 0:
    case -1:
        return "no ptrace permission over the process: both processes must run as the same user, and a seccomp "
               "filter must allow pidfd_getfd (in Docker: --cap-add SYS_PTRACE, or a profile that allows "
               "pidfd_open and pidfd_getfd); or pass the fds over a socket (fabpool_fd_send / fabpool_fd_recv)";
    case 1:
        return "no ptrace permission over the process: Yama ptrace_scope is 1 and the process did not allow this "
               "one (fabpool_fd_allow_peer with this process's pid, or fabpool_fd_allow_peers for every process of "
               "the user; the HybridEP adapter calls it at its first export unless FABPOOL_HYBRIDEP_PTRACER=0), or "
               "give the processes CAP_SYS_PTRACE, or run sysctl -w kernel.yama.ptrace_scope=0; or pass the fds "
               "over a socket (fabpool_fd_send / fabpool_fd_recv)";
    case 2:
        return "no ptrace permission over the process: Yama ptrace_scope is 2 (only CAP_SYS_PTRACE may): give the "
               "processes CAP_SYS_PTRACE (Docker: --cap-add SYS_PTRACE), or run sysctl -w "
               "kernel.yama.ptrace_scope=1; or pass the fds over a socket (fabpool_fd_send / fabpool_fd_recv)";
    default:
        return "no ptrace permission over the process: Yama ptrace_scope is 3 (no process may, until a reboot): "
               "boot with ptrace_scope 0 or 1, or pass the fds over a socket (fabpool_fd_send / fabpool_fd_recv)";
    }
}

static fabpool_status allow(const char *fn, unsigned long who)
{
    int scope = ptrace_scope();
    if (scope >= 2)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "%s: Yama ptrace_scope is %d: no process may consent to its "
                        "peers; %s", fn, scope, pidfd_advice(EPERM, scope));
    if (scope == 1 && prctl(PR_SET_PTRACER, who, 0, 0, 0) != 0) {
        int e = errno;
        if (who == PR_SET_PTRACER_ANY)
            return fp_error(FABPOOL_ERR_IO, "%s: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): %s", fn, strerror(e));
        return fp_error(FABPOOL_ERR_IO, "%s: prctl(PR_SET_PTRACER, %lu): %s%s", fn, who, strerror(e),
                        e == EINVAL ? " (no process of that pid)" : "");
    }
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_allow_peer(int pid)
{
    if (pid < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_allow_peer(%d): a pid, or 0 to withdraw the consent",
                        pid);
    return allow("fabpool_fd_allow_peer", (unsigned long)pid);
}

fabpool_status fabpool_fd_allow_peers(void) { return allow("fabpool_fd_allow_peers", PR_SET_PTRACER_ANY); }

/* The pid a pidfd stands for (its fdinfo's Pid: line), or -1. */
static int pid_of_pidfd(int pidfd)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -1;
    ssize_t r = read(f, buf, sizeof buf - 1);
    close(f);
    if (r <= 0)
        return -1;
    buf[r] = '\0';
    const char *p = strstr(buf, "\nPid:");
    if (!p)
        return -1;
    long v = strtol(p + 5, NULL, 10);
    return v > 0 && v <= INT_MAX ? (int)v : -1;
}

fabpool_status fabpool_fd_pidfd_open(int pid, int *pidfd)
{
    if (pid <= 0 || !pidfd)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_pidfd_open(%d): %s", pid,
                        pid <= 0 ? "a pid above 0 is needed" : "pidfd is NULL");
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0); /* close-on-exec, always */
    if (pfd < 0) {
        int e = errno;
        return fp_error(e == ENOSYS ? FABPOOL_ERR_NOT_SUPPORTED : FABPOOL_ERR_IO, "pidfd_open(%d): %s: %s", pid,
                        strerror(e), pidfd_advice(e, ptrace_scope()));
    }
    *pidfd = pfd;
    return FABPOOL_OK;
#else
    return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "pidfd_open is not available on this system: %s",
                    pidfd_advice(ENOSYS, -1));
#endif
}

/* pidfd_getfd of fd out of pidfd's process into *out; -1 with errno. */
static int getfd(int pidfd, int fd)
{
#ifdef SYS_pidfd_getfd
    return (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0); /* close-on-exec, always */
#else
    (void)pidfd, (void)fd;
    errno = ENOSYS;
    return -1;
#endif
}

static fabpool_status getfd_error(int pid, int fd, int e)
{
    return fp_error(e == ENOSYS ? FABPOOL_ERR_NOT_SUPPORTED : FABPOOL_ERR_IO, "pidfd_getfd(%d, %d): %s: %s", pid, fd,
                    strerror(e), pidfd_advice(e, ptrace_scope()));
}

fabpool_status fabpool_fd_from_pidfd(int pidfd, int fd, int *out)
{
    if (!out || fd < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_from_pidfd: %s", !out ? "out is NULL" : "fd < 0");
    int r = getfd(pidfd, fd);
    if (r < 0)
        return getfd_error(pid_of_pidfd(pidfd), fd, errno);
    *out = r;
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_from_pid(int pid, int fd, int *out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_from_pid: out is NULL");
    int pfd = -1;
    fabpool_status st = fabpool_fd_pidfd_open(pid, &pfd);
    if (st != FABPOOL_OK)
        return st;
    int r = getfd(pfd, fd);
    int e = errno;
    close(pfd);
    if (r < 0)
        return getfd_error(pid, fd, e);
    *out = r;
    return FABPOOL_OK;
}

/* ---- the token ---- */

fabpool_status fabpool_fd_token_make(const void *token, size_t len, int *out)
{
    if (!token || !out || len == 0 || len > FP_TOKEN_MAX)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_token_make: a token of 1 to %d bytes and an out fd "
                        "are needed (%zu bytes given)", FP_TOKEN_MAX, len);
    int fd = memfd_create("fabpool-token", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return fp_error(errno == ENOSYS ? FABPOOL_ERR_NOT_SUPPORTED : FABPOOL_ERR_IO,
                        "fabpool_fd_token_make: memfd_create: %s", strerror(errno));
    size_t put = 0;
    while (put < len) {
        ssize_t w = pwrite(fd, (const uint8_t *)token + put, len - put, (off_t)put);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_token_make: writing the memfd: %s", strerror(e));
        }
        put += (size_t)w;
    }
    if (fcntl(fd, F_ADD_SEALS, FP_TOKEN_SEALS) != 0) {
        int e = errno;
        close(fd);
        return fp_error(FABPOOL_ERR_IO, "fabpool_fd_token_make: sealing the memfd: %s", strerror(e));
    }
    *out = fd;
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_token_check(int pidfd, int fd, const void *token, size_t len)
{
    if (!token || len == 0 || len > FP_TOKEN_MAX || fd < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_token_check: a token of 1 to %d bytes and an fd >= 0 "
                        "are needed (%zu bytes, fd %d given)", FP_TOKEN_MAX, len, fd);
    int pid = pid_of_pidfd(pidfd);
    int c = getfd(pidfd, fd);
    if (c < 0) {
        int e = errno;
        if (e != EBADF)
            return getfd_error(pid, fd, e);
        return fp_error(FABPOOL_ERR_PERMISSION, "process %d does not hold this group's token at fd %d: it is not "
                        "the process the peer claims (it has no fd %d)", pid, fd, fd);
    }
    const char *why = NULL;
    struct stat sb;
    uint8_t buf[FP_TOKEN_MAX];
    int seals = fcntl(c, F_GET_SEALS);
    if (seals < 0)
        why = "the fd is not a memfd";
    else if ((seals & ~F_SEAL_EXEC) != FP_TOKEN_SEALS)
        why = "the memfd is not sealed as a token is";
    else if (fstat(c, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size != (off_t)len)
        why = "the memfd's size is not the token's";
    else {
        size_t got = 0;
        while (got < len) {
            ssize_t r = pread(c, buf + got, len - got, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got != len)
            why = "the memfd could not be read";
        else {
            volatile uint8_t diff = 0; /* every byte compared, whatever differs */
            for (size_t i = 0; i < len; i++)
                diff |= buf[i] ^ ((const uint8_t *)token)[i];
            if (diff != 0)
                why = "the memfd holds other bytes";
        }
    }
    close(c);
    if (why)
        return fp_error(FABPOOL_ERR_PERMISSION, "process %d does not hold this group's token at fd %d: it is not the "
                        "process the peer claims (%s)", pid, fd, why);
    return FABPOOL_OK;
}
