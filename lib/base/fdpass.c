/* fdpass.c - file descriptors between processes of one host: SCM_RIGHTS
 * over Unix stream sockets in the abstract namespace, or pidfd_getfd with
 * the ptrace permission it needs (include/fabpool_fdpass.h).  Layer base.  Calls: error. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

#define FP_FDS_PER_MSG 250   /* the kernel takes at most 253 a message */

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

fabpool_status fabpool_fd_accept(int listener, int *out)
{
    int s = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
        return fp_error(FABPOOL_ERR_IO, "fabpool_fd_accept: %s", strerror(errno));
    *out = s;
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_connect(const char *name, int *out, int timeout_ms)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    fabpool_status st = addr_of(name, &a, &len);
    if (st != FABPOOL_OK)
        return st;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect: socket: %s", strerror(errno));
        if (connect(s, (struct sockaddr *)&a, len) == 0) {
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

/* One message: a u32 fd count and a u32 payload length, then the payload;
 * the fds ride on the first bytes in batches of FP_FDS_PER_MSG. */
fabpool_status fabpool_fd_send(int sock, const int *fds, size_t n, const void *data, size_t len)
{
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

fabpool_status fabpool_fd_recv(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap, size_t *len)
{
    uint32_t head[2] = {0, 0};
    size_t got_fds = 0, off = 0, want = sizeof head;
    fabpool_status st = FABPOOL_OK;
    while (off < want || got_fds < head[0]) {
        uint8_t chunk[4096];
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * FP_FDS_PER_MSG)];
        } ctl;
        /* read no further than this message: the next one may follow at once */
        size_t room = want - off;
        if (room == 0)
            room = 1; /* the padding byte that carries the last fds */
        struct iovec iov = {chunk, room < sizeof chunk ? room : sizeof chunk};
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof ctl.buf;
        ssize_t r;
        do
            r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        while (r < 0 && errno == EINTR);
        if (r <= 0)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_recv: %s", r == 0 ? "the peer closed the socket" : strerror(errno));
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int tmp[FP_FDS_PER_MSG];
            memcpy(tmp, CMSG_DATA(c), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (got_fds < cap && fds)
                    fds[got_fds] = tmp[i];
                else {
                    close(tmp[i]);
                    st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_fd_recv: more fds came than the %zu there is room for", cap);
                }
                got_fds++;
            }
        }
        if (off < want) {
            for (ssize_t i = 0; i < r && off < want; i++, off++) {
                if (off < sizeof head)
                    ((uint8_t *)head)[off] = chunk[i];
                else if (off - sizeof head < data_cap && data)
                    ((uint8_t *)data)[off - sizeof head] = chunk[i];
                if (off + 1 == sizeof head)
                    want = sizeof head + head[1];
            }
        }
    }
    if (head[1] > data_cap && st == FABPOOL_OK)
        st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_fd_recv: a payload of %u bytes, room for %zu", head[1], data_cap);
    if (n)
        *n = got_fds < cap ? got_fds : cap;
    if (len)
        *len = head[1];
    return st;
}

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
        return "no ptrace permission over the process: Yama ptrace_scope is 1 and the process did not allow its "
               "peers (fabpool_fd_allow_peers; the HybridEP adapter calls it at its first export unless "
               "FABPOOL_HYBRIDEP_PTRACER=0), or give the processes CAP_SYS_PTRACE, or run "
               "sysctl -w kernel.yama.ptrace_scope=0; or pass the fds over a socket (fabpool_fd_send / "
               "fabpool_fd_recv)";
    case 2:
        return "no ptrace permission over the process: Yama ptrace_scope is 2 (only CAP_SYS_PTRACE may): give the "
               "processes CAP_SYS_PTRACE (Docker: --cap-add SYS_PTRACE), or run sysctl -w "
               "kernel.yama.ptrace_scope=1; or pass the fds over a socket (fabpool_fd_send / fabpool_fd_recv)";
    default:
        return "no ptrace permission over the process: Yama ptrace_scope is 3 (no process may, until a reboot): "
               "boot with ptrace_scope 0 or 1, or pass the fds over a socket (fabpool_fd_send / fabpool_fd_recv)";
    }
}

fabpool_status fabpool_fd_allow_peers(void)
{
    int scope = ptrace_scope();
    if (scope >= 2)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED,
                        "Yama ptrace_scope is %d: no process may consent to its peers; %s", scope,
                        pidfd_advice(EPERM, scope));
    if (scope == 1 && prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
        return fp_error(FABPOOL_ERR_IO, "prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): %s", strerror(errno));
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_from_pid(int pid, int fd, int *out)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0) {
        int e = errno;
        return fp_error(FABPOOL_ERR_IO, "pidfd_open(%d): %s: %s", pid, strerror(e), pidfd_advice(e, ptrace_scope()));
    }
    int r = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
    int e = errno;
    close(pfd);
    if (r < 0)
        return fp_error(FABPOOL_ERR_IO, "pidfd_getfd(%d, %d): %s: %s", pid, fd, strerror(e),
                        pidfd_advice(e, ptrace_scope()));
    *out = r;
    return FABPOOL_OK;
#else
    (void)pid, (void)fd, (void)out;
    return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "pidfd_getfd is not available on this system: %s",
                    pidfd_advice(ENOSYS, -1));
#endif
}
