/* fdpass.c - file descriptors between processes of one host: SCM_RIGHTS
 * over Unix stream sockets in the abstract namespace, with the credentials of
 * the peer checked at both ends (include/fabpool_fdpass.h; pidfd.c has the
 * copies by pidfd).  Layer base.  Calls: error, log. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "nearest.h"

#define FP_FDS_PER_MSG 250      /* fds on one sendmsg: the kernel takes at most 253 (SCM_MAX_FD) */
#define FP_FDS_RECV_MAX 253     /* room on one recvmsg: what any sender may put on one, so no fd is dropped */
#define FP_MSG_FDS_MAX (1u << 20)   /* fds one message may announce: no process holds more */
#define FP_MSG_BYTES_MAX (1u << 30) /* payload bytes one message may announce */
#define FP_PEERS_ENV_MAX 256        /* characters of FABPOOL_PEERS read */

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

/* The words of FABPOOL_PEERS, matched as FABPOOL_CONF's are (ignoring case). */
static const char *const peers_words[] = {"any_user", "any_pid", "same_user"};

/* FABPOOL_PEERS refused: the message every later call answers, what is wrong (fmt) and what is accepted. */
static void peers_refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void peers_refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(peers_msg, sizeof peers_msg, fmt, ap);
    va_end(ap);
    size_t at = n < 0 ? 0 : (size_t)n < sizeof peers_msg ? (size_t)n : sizeof peers_msg - 1;
    snprintf(peers_msg + at, sizeof peers_msg - at, "; accepted: any_user, any_pid, same_user (the default), in "
             "any case, separated by single commas, or empty; fd sockets refuse every peer until it is fixed");
    peers_status = FABPOOL_ERR_CONFIG;
}

/* The flag of the word e[a..b) of FABPOOL_PEERS into *flags and *same, or its refusal (-1). */
static int peers_word(const char *e, size_t a, size_t b, unsigned *flags, int *same)
{
    size_t w = 0;
    while (w < 3 && !fp_same_word(e + a, b - a, peers_words[w]))
        w++;
    if (w == 3) {
        char word[65];
        word_copy(word, sizeof word, e + a, b - a);
        const char *near = fp_nearest_name(e + a, b - a, peers_words, 3);
        peers_refuse("FABPOOL_PEERS: '%s' is not a word it knows%s%s%s", word, near ? " (did you mean '" : "",
                     near ? near : "", near ? "'?)" : "");
        return -1;
    }
    *flags |= w == 0 ? FABPOOL_FD_ANY_USER : w == 1 ? FABPOOL_FD_ANY_PID : 0;
    *same |= w == 2;
    return 0;
}

static void peers_read(void)
{
    const char *e = secure_getenv("FABPOOL_PEERS");
    if (!e || !*e)
        return;
    size_t len = strnlen(e, FP_PEERS_ENV_MAX + 1);
    if (len > FP_PEERS_ENV_MAX) {
        peers_refuse("FABPOOL_PEERS is longer than %d characters", FP_PEERS_ENV_MAX);
        return;
    }
    char v[65];
    word_copy(v, sizeof v, e, len);
    for (size_t i = 0; i < len; i++)
        if (strchr(" \t\n\r\v\f", e[i])) { /* as in FABPOOL_CONF: a value is its words and commas alone */
            peers_refuse("FABPOOL_PEERS '%s' holds whitespace at character %zu: no spaces or tabs are accepted "
                         "around or in its words", v, i + 1);
            return;
        }
    unsigned flags = 0;
    int same = 0;
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && e[j] != ',')
            j++;
        if (i == j) { /* as in FABPOOL_CONF: no empty entry, which a word lost in an edit leaves */
            peers_refuse("FABPOOL_PEERS '%s' has an empty entry (%s)", v, i == 0 ? "a leading comma" : j == len ?
                         "a trailing comma" : "between two commas");
            return;
        }
        if (peers_word(e, i, j, &flags, &same) != 0)
            return;
        i = j + 1;
    }
    if (same && (flags & FABPOOL_FD_ANY_USER)) {
        peers_refuse("FABPOOL_PEERS names both same_user and any_user: keep the one meant");
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

static fabpool_status addr_of(const char *fn, const char *name, struct sockaddr_un *a, socklen_t *len)
{
    size_t n = name ? strlen(name) : 0;
    if (!name)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: the socket name is NULL", fn);
    if (n == 0 || n + 1 > sizeof a->sun_path)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: socket name '%s' of %zu characters: give 1 to %zu", fn, name, n,
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
    fabpool_status st = addr_of("fabpool_fd_listen", name, &a, &len);
    if (st != FABPOOL_OK || !out)
        return st != FABPOOL_OK ? st : fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_listen: out is NULL");
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, SOMAXCONN) != 0) {
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
    fabpool_status st = addr_of("fabpool_fd_connect", name, &a, &len);
    if (st != FABPOOL_OK)
        return st;
    if (!out || pid < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_connect('%s'): %s", name,
                        !out ? "sock is NULL" : "pid < 0");
    if ((st = peers_flags_of("fabpool_fd_connect", flags, &flags)) != FABPOOL_OK)
        return st;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long ms = 0;;) {
        /* a listener whose queue is full (one that never accepts, as another user's squatter of the name may be,
         * or one that a flood of connections keeps full) is waited for in the kernel, in turn with the other
         * connections that wait for room, for the time left at most (SO_SNDTIMEO bounds a Unix socket's connect:
         * then EAGAIN), where a connect without it would wait with no limit */
        long left = timeout_ms - ms > 1 ? timeout_ms - ms : 1;
        struct timeval tv = {left / 1000, (left % 1000) * 1000}, none = {0, 0};
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect: socket: %s", strerror(errno));
        if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0 && connect(s, (struct sockaddr *)&a, len) == 0) {
            if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none) != 0) {
                int e = errno;
                close(s);
                return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect('%s'): clearing the socket's send timeout: %s",
                                name, strerror(e));
            }
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
        ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) || ms >= timeout_ms)
            return fp_error(FABPOOL_ERR_IO, "fabpool_fd_connect('%s'): %s after %ld ms%s", name, strerror(e), ms,
                            e == EAGAIN ? " (the listener's queue stayed full: it accepts no one, or too few)" : "");
        if (e != EAGAIN)
            usleep(2000); /* the peer has not listened yet */
    }
}

fabpool_status fabpool_fd_connect(const char *name, int *out, int timeout_ms)
{
    return fabpool_fd_connect_peer(name, out, timeout_ms, 0, 0);
}

_Static_assert(FABPOOL_FD_HEAD_BYTES == 2 * sizeof(uint32_t), "the public head size is the head's");

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

/* One message coming in: its head, how far its bytes are, its fds. */
typedef struct msg_in {
    const char *fn;
    int sock, timeout_ms; /* below 0: no deadline */
    int64_t deadline;     /* CLOCK_MONOTONIC ns */
    uint32_t head[2];     /* fd count, payload length */
    size_t off, want;     /* bytes of head and payload in, and their sum once the head is in */
    uint8_t *data;
    size_t data_cap;
    fd_in in;
} msg_in;

/* "(x of y bytes, i of j fds in)" for a message cut short */
static void msg_progress(const msg_in *m, char *out, size_t cap)
{
    int head_in = m->off >= sizeof m->head;
    snprintf(out, cap, "%zu of %zu bytes, %zu of %u fds in", m->off, head_in ? m->want : (size_t)0, m->in.got,
             head_in ? m->head[0] : 0u);
}

/* Waits until the socket has something to read, no later than the deadline:
 * FABPOOL_ERR_IO past it. */
static fabpool_status msg_wait(msg_in *m)
{
    if (m->timeout_ms < 0)
        return FABPOOL_OK; /* recvmsg blocks */
    for (;;) {
        int64_t left = m->deadline - now_ns();
        int pr = 0;
        if (left > 0) {
            int64_t ms = (left + 999999) / 1000000;
            struct pollfd p = {.fd = m->sock, .events = POLLIN};
            pr = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr < 0)
                return fp_error(FABPOOL_ERR_IO, "%s: poll: %s", m->fn, strerror(errno));
        }
        if (pr > 0)
            return FABPOOL_OK;
        char pg[96];
        msg_progress(m, pg, sizeof pg);
        return fp_error(FABPOOL_ERR_IO, "%s: the message did not come whole within %d ms (%s): the peer stalls or "
                        "does not speak this protocol; what came was closed and the socket is out of step: close it",
                        m->fn, m->timeout_ms, pg);
    }
}

/* Counts r bytes just read (into chunk while the head is not whole); the
 * head is bounded before it is trusted. */
static fabpool_status msg_bytes(msg_in *m, const uint8_t *chunk, size_t r)
{
    if (m->off < sizeof m->head) {
        memcpy((uint8_t *)m->head + m->off, chunk, r);
        m->off += r;
        if (m->off < sizeof m->head)
            return FABPOOL_OK;
        if (m->head[0] > FP_MSG_FDS_MAX || m->head[1] > FP_MSG_BYTES_MAX)
            return fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: the message's head announces %u fds and %u bytes, above the "
                            "%u fds and %u bytes of any message fabpool_fd_send makes: the peer does not speak this "
                            "protocol; nothing kept, and the socket is out of step: close it", m->fn, m->head[0],
                            m->head[1], FP_MSG_FDS_MAX, FP_MSG_BYTES_MAX);
        m->want = sizeof m->head + m->head[1];
    } else if (m->off < m->want)
        m->off += r; /* payload bytes past data_cap went to chunk: dropped */
    /* else: the padding byte that carried fds */
    if (m->off >= sizeof m->head && m->in.got > m->head[0])
        return fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: %zu fds came with a message that announces %u: the peer does not "
                        "speak this protocol; they were closed and the socket is out of step: close it", m->fn,
                        m->in.got, m->head[0]);
    return FABPOOL_OK;
}

/* One recvmsg of the message, no further than its end (the next one may
 * follow at once): its bytes counted, its fds taken. */
static fabpool_status msg_piece(msg_in *m)
{
    uint8_t chunk[4096];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * FP_FDS_RECV_MAX)];
    } ctl;
    struct iovec iov = {chunk, 1}; /* past the payload: the padding byte that carries the last fds */
    if (m->off < m->want) {
        size_t room = m->want - m->off, at = m->off - sizeof m->head;
        if (m->off >= sizeof m->head && at < m->data_cap) { /* straight into the caller's buffer */
            iov.iov_base = m->data + at;
            iov.iov_len = room < m->data_cap - at ? room : m->data_cap - at;
        } else
            iov.iov_len = room < sizeof chunk ? room : sizeof chunk;
    }
    struct msghdr h;
    memset(&h, 0, sizeof h);
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = ctl.buf;
    h.msg_controllen = sizeof ctl.buf;
    ssize_t r = recvmsg(m->sock, &h, MSG_CMSG_CLOEXEC | (m->timeout_ms >= 0 ? MSG_DONTWAIT : 0));
    if (r < 0 && (errno == EINTR || (m->timeout_ms >= 0 && (errno == EAGAIN || errno == EWOULDBLOCK))))
        return FABPOOL_OK; /* nothing came: wait again */
    if (r < 0)
        return fp_error(FABPOOL_ERR_IO, "%s: %s", m->fn, strerror(errno));
    int cmsg_bad = fd_in_cmsgs(&m->in, &h);
    if (h.msg_flags & MSG_CTRUNC)
        return fp_error(FABPOOL_ERR_IO, "%s: the kernel dropped fds of the message (MSG_CTRUNC): this process is out "
                        "of file descriptors (RLIMIT_NOFILE: raise it with ulimit -n, or close fds); what came was "
                        "closed and the socket is out of step: close it", m->fn);
    if (cmsg_bad)
        return fp_error(FABPOOL_ERR_DESCRIPTOR, "%s: a malformed control message; what came was closed and the "
                        "socket is out of step: close it", m->fn);
    if (r == 0) {
        if (m->off == 0 && m->in.got == 0)
            return fp_error(FABPOOL_ERR_IO, "%s: the peer closed the socket", m->fn);
        char pg[96];
        msg_progress(m, pg, sizeof pg);
        return fp_error(FABPOOL_ERR_IO, "%s: the peer closed the socket mid-message (%s): what came was closed",
                        m->fn, pg);
    }
    return msg_bytes(m, chunk, (size_t)r);
}

fabpool_status fabpool_fd_recv_timed(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap,
                                     size_t *len, int timeout_ms)
{
    if (n)
        *n = 0;
    if (len)
        *len = 0;
    msg_in m = {.fn = timeout_ms < 0 ? "fabpool_fd_recv" : "fabpool_fd_recv_timed", .sock = sock,
                .timeout_ms = timeout_ms, .want = sizeof m.head, .data = data, .data_cap = data ? data_cap : 0,
                .in = {fds, fds ? cap : 0, 0, 0}};
    /* before anything is read: without its count a message's fds would stay uncounted (never closed) */
    if (!n || !len)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s(%d): %s is NULL: give it, to learn how many fds and bytes "
                        "came; nothing was read", m.fn, sock, !n ? "the fd count n" : "the payload length len");
    if (timeout_ms >= 0)
        m.deadline = now_ns() + (int64_t)timeout_ms * 1000000;
    fabpool_status st = FABPOOL_OK;
    while (st == FABPOOL_OK && (m.off < m.want || m.in.got < m.head[0]))
        if ((st = msg_wait(&m)) == FABPOOL_OK)
            st = msg_piece(&m);
    if (st == FABPOOL_OK && m.in.over)
        st = fp_error(FABPOOL_ERR_LIMIT, "%s: a message of %u fds, room for %zu: they were closed (the message was "
                      "read whole: the socket may carry on)", m.fn, m.head[0], m.in.cap);
    else if (st == FABPOOL_OK && m.head[1] > m.data_cap)
        st = fp_error(FABPOOL_ERR_LIMIT, "%s: a payload of %u bytes, room for %zu: its fds were closed (the message "
                      "was read whole: the socket may carry on)", m.fn, m.head[1], m.data_cap);
    if (st != FABPOOL_OK) {
        fd_in_close(&m.in);
        *len = st == FABPOOL_ERR_LIMIT ? m.head[1] : 0;
        return st;
    }
    *n = m.in.got;
    *len = m.head[1];
    return FABPOOL_OK;
}

fabpool_status fabpool_fd_recv(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap, size_t *len)
{
    return fabpool_fd_recv_timed(sock, fds, cap, n, data, data_cap, len, -1);
}
