/* symm_pass.c - the fds of one exchange of the symmetric buffer over its Unix sockets (symm_pass.h).
 *
 * The fds go in turns, as the pidfd copies do: in turn k (1 to n - 1) rank r sends to rank r + k and
 * receives from rank r - k (mod n), both at once in one poll loop, so that no rank waits on a peer that waits
 * on it, and every turn of every rank runs under the exchange's one deadline: a peer that reads nothing, or
 * sends nothing, costs its peers no more than that.  A rank thus holds the fds of one peer at a time in its
 * table while the caller maps them.  They go in messages as fabpool_fd_send makes them (a u32 fd count, a u32
 * length, the call's number; the fds on the first byte), of at most SY_PASS_BATCH fds, sent without blocking,
 * and a rank sends a message only once its peers have read the last one it sent (SIOCOUTQ, of the socket and of
 * the turn before's): the kernel counts the fds in flight on Unix sockets of a user against RLIMIT_NOFILE
 * (ETOOMANYREFS past it), which a group that sent everything before reading anything passes with a few hundred
 * chunks; with one message in flight a rank, a group of n ranks has at most n messages in flight.  A message is
 * read only once its bytes are in whole and its head is what this rank can take, so that the read does not wait
 * on the peer.
 *
 * Built on fabpool's public API only (fabpool.h, fabpool_fdpass.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fabpool.h"
#include "symm_pass.h"

/* The send of a test build may stand in for sendmsg. */
#ifndef SY_SENDMSG
#define SY_SENDMSG sendmsg
#endif

/* How often a turn looks again at what no poll event announces (ns): a peer that read what was sent (SIOCOUTQ
 * back to 0), fds in flight that the kernel let go (ETOOMANYREFS), the rest of a message come in part.  The
 * first look comes soon, and each look that finds nothing changed doubles the wait up to SY_PASS_TICK_MAX_NS, so
 * that a peer that stalls halfway or reads nothing until the deadline costs a rank a few hundred wakeups a
 * second, not ten thousand; a look that finds progress starts again from the first. */
#define SY_PASS_TICK_NS 100000
#define SY_PASS_TICK_MAX_NS 2000000
/* The read of a message that is in whole: a bound that binds only on a peer that attached fewer fds than its
 * head says (ms). */
#define SY_PASS_READ_MS 2000

enum {
    SY_W_NONE,  /* all sent (or the pair failed) */
    SY_W_OUT,   /* the socket is full: POLLOUT */
    SY_W_DRAIN, /* the peer has not read the last message yet */
    SY_W_GATE,  /* the peer of the turn before has not read the last message it was sent */
    SY_W_REFS   /* ETOOMANYREFS: this user's fds in flight are at its limit, and go down as the peers read */
};

/* One message on the wire: fabpool_fd_send's head and a payload of the call's number. */
typedef struct sy_pass_msg {
    uint32_t head[2]; /* fds, payload bytes */
    uint64_t seq;
} sy_pass_msg;
_Static_assert(sizeof(sy_pass_msg) == FABPOOL_FD_HEAD_BYTES + sizeof(uint64_t), "a head and a u64, no padding");

/* What every turn of a pass shares. */
typedef struct sy_pass_run {
    const int *fds;
    uint64_t seq, deadline;
    int timeout_ms;
    size_t batch; /* fds a message this rank sends */
    sy_pass_took_fn took;
    void *ctx;
} sy_pass_run;

static uint64_t pass_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The pair fails with st and the message; its socket is shut down (the peer sees the end at once, and nothing
 * more is read from it) and the fds received from it that `took` did not get are closed.  A pair that failed
 * already keeps its first message. */
static void pass_fail(sy_pass_peer *p, fabpool_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pass_fail(sy_pass_peer *p, fabpool_status st, const char *fmt, ...)
{
    if (p->st != FABPOOL_OK)
        return;
    p->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    (void)shutdown(p->sock, SHUT_RDWR);
    for (size_t i = 0; !p->taken && i < p->got; i++)
        close(p->fds[i]);
    if (!p->taken)
        p->got = 0;
}

static int pass_live(const sy_pass_peer *p) { return p->sock >= 0 && p->st == FABPOOL_OK; }

/* The bytes of sock that its peer has not read (SIOCOUTQ), or -1 (the pair p of peer q failed). */
static int pass_unread(sy_pass_peer *p, int q, int sock)
{
    int outq = 0;
    if (ioctl(sock, SIOCOUTQ, &outq) == 0)
        return outq;
    pass_fail(p, FABPOOL_ERR_IO, "SIOCOUTQ on the socket to rank %d: %s", q, strerror(errno));
    return -1;
}

/* Sends what it can of this rank's fds to peer q without waiting: what it waits on (SY_W_*).  A message goes
 * out only once q has read the last one and the socket `gate` (-1: none) is read to its end. */
static int pass_send(sy_pass_peer *p, int q, const sy_pass_run *r, int gate)
{
    while (p->st == FABPOOL_OK && (p->off > 0 || p->sent < p->out)) {
        if (p->off == 0) {
            int mine = pass_unread(p, q, p->sock), before = gate >= 0 ? pass_unread(p, q, gate) : 0;
            if (mine != 0 || before != 0)
                return mine < 0 || before < 0 ? SY_W_NONE : mine > 0 ? SY_W_DRAIN : SY_W_GATE;
            p->cur = p->out - p->sent < r->batch ? p->out - p->sent : r->batch;
        }
        sy_pass_msg m = {{(uint32_t)p->cur, (uint32_t)sizeof r->seq}, r->seq};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * SY_PASS_BATCH)];
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct iovec iov = {(uint8_t *)&m + p->off, sizeof m - p->off};
        struct msghdr h;
        memset(&h, 0, sizeof h);
        h.msg_iov = &iov;
        h.msg_iovlen = 1;
        if (p->off == 0) { /* the fds ride on the message's first byte */
            h.msg_control = ctl.buf;
            h.msg_controllen = CMSG_SPACE(sizeof(int) * p->cur);
            struct cmsghdr *c = CMSG_FIRSTHDR(&h);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * p->cur);
            memcpy(CMSG_DATA(c), r->fds + p->sent, sizeof(int) * p->cur);
        }
        ssize_t w = SY_SENDMSG(p->sock, &h, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return SY_W_OUT;
        if (w < 0 && errno == ETOOMANYREFS)
            return SY_W_REFS;
        if (w <= 0) {
            pass_fail(p, FABPOOL_ERR_IO, "sending its fds to rank %d: %s", q, w < 0 ? strerror(errno) : "0 bytes sent");
            break;
        }
        if (p->off == 0)
            p->sent += p->cur;
        p->off += (size_t)w;
        if (p->off >= sizeof m)
            p->off = 0;
    }
    return SY_W_NONE;
}

/* Takes every message of peer q that is in whole, without waiting on the peer, and hands its fds to `took` once
 * all are in: 1 where part of a message is in (looked at again soon), else 0. */
static int pass_recv(sy_pass_peer *p, int q, const sy_pass_run *r)
{
    while (p->st == FABPOOL_OK && p->got < p->in) {
        size_t most = p->in - p->got < SY_PASS_BATCH ? p->in - p->got : SY_PASS_BATCH;
        int avail = 0;
        if (ioctl(p->sock, FIONREAD, &avail) != 0) {
            pass_fail(p, FABPOOL_ERR_IO, "FIONREAD on the socket to rank %d: %s", q, strerror(errno));
            break;
        }
        uint32_t head[2] = {0, 0};
        if (avail >= (int)sizeof head &&
            (recv(p->sock, head, sizeof head, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof head || head[0] == 0 ||
             head[0] > most || head[1] != sizeof r->seq)) {
            pass_fail(p, FABPOOL_ERR_DESCRIPTOR, "rank %d sent a message of %u fds and %u bytes where this rank "
                      "takes 1 to %zu fds and %zu bytes (%zu of its %zu fds in): it does not follow this exchange",
                      q, head[0], head[1], most, sizeof r->seq, p->got, p->in);
            break;
        }
        if (avail < (int)sizeof(sy_pass_msg)) {
            if (p->hup)
                pass_fail(p, FABPOOL_ERR_IO, "rank %d closed its socket with %zu of its %zu fds in (%d bytes of a "
                          "message)", q, p->got, p->in, avail);
            return avail > 0 && !p->hup;
        }
        uint64_t left = r->deadline > pass_now_ns() ? (r->deadline - pass_now_ns()) / 1000000 + 1 : 1;
        uint64_t theirs = 0;
        size_t got = 0, len = 0;
        fabpool_status st = fabpool_fd_recv_timed(p->sock, p->fds + p->got, head[0], &got, &theirs, sizeof theirs,
                                                  &len, left < SY_PASS_READ_MS ? (int)left : SY_PASS_READ_MS);
        if (st != FABPOOL_OK) { /* what came of the message is closed already */
            pass_fail(p, FABPOOL_ERR_IO, "receiving rank %d's fds over its socket: %s", q, fabpool_last_error());
            break;
        }
        if (got != head[0] || len != sizeof theirs || theirs != r->seq) {
            for (size_t k = 0; k < got && k < head[0]; k++)
                close(p->fds[p->got + k]);
            pass_fail(p, FABPOOL_ERR_IO, "rank %d sent %zu fds for call #%llu, this rank expected %u for call #%llu",
                      q, got, (unsigned long long)theirs, head[0], (unsigned long long)r->seq);
            break;
        }
        p->got += got;
    }
    if (p->st == FABPOOL_OK && p->in > 0 && p->got == p->in && !p->taken) {
        p->taken = 1;
        r->took(r->ctx, q, p->fds);
    }
    return 0;
}

/* Peer q's pair at the deadline: what it waited on, on the side of it that was this turn's (recv, send). */
static void pass_late(sy_pass_peer *p, int q, int timeout_ms, int recv, int send, int gate)
{
    char in[160] = "", out[320] = "";
    if (recv)
        snprintf(in, sizeof in, "rank %d's fds did not come within %d ms over its socket (%zu of %zu in)", q,
                 timeout_ms, p->got, p->in);
    struct rlimit rl = {0, 0};
    (void)getrlimit(RLIMIT_NOFILE, &rl);
    if (send && (p->wait == SY_W_DRAIN || p->wait == SY_W_OUT))
        snprintf(out, sizeof out, "rank %d did not read the fds this rank sent it within %d ms (%zu of %zu sent): "
                 "it does not read its socket", q, timeout_ms, p->sent, p->out);
    else if (send && p->wait == SY_W_GATE)
        snprintf(out, sizeof out, "this rank's fds for rank %d waited %d ms for rank %d to read the last ones it was "
                 "sent (%zu of %zu sent)", q, timeout_ms, gate, p->sent, p->out);
    else if (send && p->wait == SY_W_REFS)
        snprintf(out, sizeof out, "the kernel refused more fds in flight on Unix sockets for this user until the "
                 "deadline of %d ms (ETOOMANYREFS: they passed RLIMIT_NOFILE, %llu here; %zu of %zu fds sent to "
                 "rank %d): raise ulimit -n, or use larger chunks", timeout_ms, (unsigned long long)rl.rlim_cur,
                 p->sent, p->out, q);
    pass_fail(p, FABPOOL_ERR_IO, "%s%s%s", in, *in && *out ? "; " : "", out);
}

/* Waits for the turn's sockets (pf[0..np)) or, where soon, the tick (ns), no later than the deadline; marks the
 * peers that hung up. */
static void pass_wait(struct pollfd *pf, int np, sy_pass_peer *const *who, int soon, uint64_t tick, uint64_t deadline)
{
    uint64_t t = pass_now_ns(), left = deadline > t ? deadline - t : 0;
    if (soon && left > tick)
        left = tick;
    struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
    if (ppoll(pf, (nfds_t)np, &ts, NULL) <= 0)
        return;
    for (int i = 0; i < np; i++)
        if (pf[i].revents & (POLLHUP | POLLERR | POLLRDHUP))
            who[i]->hup = 1;
}

/* One turn: this rank sends to `to` and receives from `from` (the same peer where n is 2), until both are done
 * or the deadline.  *gate: the peer of the turn before, whose last message must be read before this turn's
 * first goes out; this turn's once it sent something. */
static void pass_turn(sy_pass_peer *p, int to, int from, int *gate, const sy_pass_run *r)
{
    sy_pass_peer *t = &p[to], *f = &p[from];
    uint64_t tick = SY_PASS_TICK_NS;
    size_t seen[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    for (;;) {
        int part = pass_live(f) ? pass_recv(f, from, r) : 0;
        int gs = *gate >= 0 && pass_live(&p[*gate]) ? p[*gate].sock : -1;
        int w = pass_live(t) ? pass_send(t, to, r, gs) : SY_W_NONE;
        t->wait = w;
        /* a look at which nothing moved (fds in, fds and bytes out, what the send waits on) waits longer */
        size_t now[4] = {f->got, t->sent, t->off, (size_t)w};
        tick = memcmp(now, seen, sizeof now) ? SY_PASS_TICK_NS : tick * 2 < SY_PASS_TICK_MAX_NS ? tick * 2
                                                                                              : SY_PASS_TICK_MAX_NS;
        memcpy(seen, now, sizeof now);
        int rdone = !pass_live(f) || f->got == f->in, sdone = !pass_live(t) || w == SY_W_NONE;
        if (rdone && sdone)
            break;
        if (pass_now_ns() >= r->deadline) {
            if (w == SY_W_GATE) {
                p[*gate].wait = SY_W_DRAIN;
                pass_late(&p[*gate], *gate, r->timeout_ms, 0, 1, -1);
            }
            if (!rdone)
                pass_late(f, from, r->timeout_ms, 1, to == from && !sdone, *gate);
            if (!sdone)
                pass_late(t, to, r->timeout_ms, 0, 1, *gate);
            break;
        }
        struct pollfd pf[2];
        sy_pass_peer *who[2];
        int np = 0;
        if (!rdone) {
            who[np] = f;
            pf[np++] = (struct pollfd){f->sock, (short)(part ? 0 : POLLIN | POLLRDHUP), 0};
        }
        if (!sdone && w == SY_W_OUT && np > 0 && to == from)
            pf[0].events |= POLLOUT;
        else if (!sdone && w == SY_W_OUT) {
            who[np] = t;
            pf[np++] = (struct pollfd){t->sock, POLLOUT, 0};
        }
        pass_wait(pf, np, who, part || w == SY_W_DRAIN || w == SY_W_GATE || w == SY_W_REFS, tick, r->deadline);
    }
    if (pass_live(t) && t->out > 0)
        *gate = to;
}

/* A peer that left unread what this rank sent it in an earlier pass does not read its socket (every rank reads
 * all it is sent before the exchange's next round): that pair fails at once. */
static void pass_check_drained(sy_pass_peer *p, int n)
{
    for (int q = 0; q < n; q++) {
        int outq = p[q].sock >= 0 ? pass_unread(&p[q], q, p[q].sock) : 0;
        if (outq > 0)
            pass_fail(&p[q], FABPOOL_ERR_IO, "rank %d left unread %d bytes that this rank sent it in an earlier "
                      "exchange: it does not read its socket", q, outq);
    }
}

/* The fds of one message this rank sends: SY_PASS_BATCH, fewer where n of them (one message in flight a rank)
 * would pass half of RLIMIT_NOFILE. */
static size_t pass_batch(int n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return SY_PASS_BATCH;
    rlim_t b = rl.rlim_cur / 2 / (rlim_t)n;
    return b < 1 ? 1 : b > SY_PASS_BATCH ? SY_PASS_BATCH : (size_t)b;
}

void sy_pass(sy_pass_peer *p, int n, int self, const int *fds, uint64_t seq, uint64_t deadline_ns, int timeout_ms,
             sy_pass_took_fn took, void *ctx)
{
    for (int q = 0; q < n; q++) {
        p[q].sent = p[q].got = p[q].off = p[q].cur = 0;
        p[q].st = FABPOOL_OK;
        p[q].err[0] = 0;
        p[q].wait = p[q].hup = p[q].taken = 0;
    }
    pass_check_drained(p, n);
    sy_pass_run r = {fds, seq, deadline_ns, timeout_ms, pass_batch(n), took, ctx};
    int gate = -1;
    for (int k = 1; k < n; k++)
        pass_turn(p, (self + k) % n, (self - k + n) % n, &gate, &r);
}
