/* symm.c - symmetric memory over a group of processes (symm.h): a growable
 * buffer per rank, every peer's mapped here, grown and shrunk together.
 *
 * Every collective call is a fixed series of rounds of the caller's
 * all-gather.  Each rank's message of a round starts with a head (the
 * exchange's version, the call's number and kind, the round, the rank, and
 * the status of this rank's step with its message), so that every rank
 * learns in the same round that some rank failed, and which, and all of them
 * return the same answer.  A rank never leaves a round out because its own
 * step failed.
 *
 *   create: HELLO  (each rank's pool made; max_bytes, size asked, device,
 *                   handle type, fd transport, host, pid, socket nonce,
 *                   Yama's ptrace_scope; rank 0's: the group secret)
 *           MESH   (its buffer made, the sockets to its host's peers
 *                   connected and checked; the buffer's address window;
 *                   for pidfd the fd number of its token)
 *           then the exchange below, with full descriptors.
 *   resize: ASK    (the size asked; every rank takes the largest)
 *           GROWN  (its buffer resized: all or none stay resized)
 *           then the exchange; where some rank's resize or export failed
 *           after others had resized, those go back and one more exchange
 *           maps every view to its peer's chunks as they are now.
 *   exchange: EXPORTED (its descriptor exported since the generation every
 *                   peer has; its length and fd count)
 *           DESC   (the descriptors, and for pidfd the exporter's fd numbers;
 *                   the fds go over the sockets after this round, every
 *                   rank sending and receiving at once (symm_pass.c), or are
 *                   copied by pidfd, in TURN rounds under Yama ptrace_scope 1)
 *           APPLIED (each peer's descriptor applied here: the generation of
 *                   every view; each exporter acknowledges the smallest; the
 *                   views emptied, and whether this rank broke the rule of
 *                   symm.h beyond mending, or lost a socket to a peer:
 *                   then every rank breaks).
 *
 * Trust.  The all-gather is the group's own channel: what it carries is
 * the group's word.  Nothing else is: socket names are public
 * (/proc/net/unix), any process may connect to a listener or bind a name
 * let go, and a rank's message may be corrupt.  So the secret that
 * authenticates a rank (random, from rank 0) travels only in HELLO; the
 * socket names carry a separate random that is no secret; both ends of a
 * socket check SO_PEERCRED against the pid HELLO declared (sy_mesh); a pidfd
 * is opened only on a declared pid, and its process proves it holds the
 * group's token before any fd is copied out of it (sy_pidfd_copy); every
 * length and count a rank states is bounded by what its window can hold
 * before anything is sized from it (sy_exchange); and every wait on a peer
 * has a deadline (one for the mesh, one for the fds of an exchange).
 *
 * Built on fabpool's public API only (fabpool.h, fabpool_fdpass.h); no
 * driver call of its own. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "conn_wait.h"
#include "fabpool.h"
#include "symm.h"
#include "symm_pass.h"

#define SY_MAGIC 0x59535046u /* "FPSY" */
#define SY_VERSION 4u
#define SY_ERR 240           /* bytes of a rank's message carried in its head */
#define SY_HOST 64
#define SY_TIMEOUT_MS 30000
#define SY_SECRET 32         /* bytes of the group secret */
#define SY_TOKEN 32          /* bytes of a rank's pidfd token */
#define SY_REC_HDR FABPOOL_DESC_HEADER_BYTES
#define SY_REC FABPOOL_DESC_RECORD_BYTES

enum { SY_CREATE = 1, SY_RESIZE = 2 };
enum { SY_HELLO = 1, SY_MESH, SY_ASK, SY_GROWN, SY_EXPORTED, SY_DESC, SY_APPLIED, SY_TURN };
enum { SY_STAGE_EXPORT = 1, SY_STAGE_APPLY = 2 };

/* Every message of every round begins with this (host byte order: the
 * ranks share one architecture). */
typedef struct sy_head {
    uint32_t magic;
    uint16_t version;
    uint8_t op, phase;
    int32_t rank, nranks;
    int32_t status;          /* this rank's step (fabpool_status) */
    uint64_t seq;            /* the object's collective calls, counted from 1 (create) */
    uint64_t group;          /* rank 0's socket nonce (0 in HELLO): which object; no secret */
    uint64_t v[2];           /* the round's values */
    char err[SY_ERR];        /* this rank's message where status is not FABPOOL_OK */
} sy_head;

typedef struct sy_hello {
    uint64_t max_bytes, bytes;
    uint64_t nonce;                /* of this rank's socket name: public, no secret */
    int32_t device, handle_type, transport, pid;
    int32_t yama, pad;             /* Yama's ptrace_scope here (-1: no Yama) */
    uint8_t secret[SY_SECRET];     /* rank 0's: the group secret; zeros from every other rank */
    char host[SY_HOST];
} sy_hello;

/* What a connecting rank says first over a socket. */
typedef struct sy_ident {
    uint8_t secret[SY_SECRET];
    int32_t rank, pad;
} sy_ident;

struct fabpool_torch_symm {
    pthread_mutex_t lock;
    pid_t pid;               /* the process that made it: sy_forked */
    int rank, nranks, device, transport, timeout_ms, handle_type;
    fabpool_torch_symm_allgather_fn allgather;
    void *actx;
    fabpool_t *pool;
    fabpool_buffer_t *buf;
    fabpool_view_t **views;  /* [nranks], NULL for this rank */
    int *sock;               /* [nranks], -1 where none */
    int *pidfd;              /* [nranks]: pidfd transport, a pidfd of each peer's declared pid, -1 where none */
    int32_t *token_fd;       /* [nranks]: pidfd transport, the fd number of each peer's token (MESH) */
    uint8_t *proved;         /* [nranks]: the peer's token was checked through its pidfd */
    int **pfds;              /* [nranks]: the fds received or copied from each peer in an exchange */
    int token;               /* this rank's token (a sealed memfd), -1 where none */
    int listener;
    unsigned peer_flags;     /* FABPOOL_FD_ANY_*: options.peers and FABPOOL_PEERS */
    int turns;               /* pidfd copies in turns (some rank runs under Yama ptrace_scope 1) */
    int refused;             /* connections refused by the last mesh */
    uint8_t secret[SY_SECRET];
    sy_hello *peers;         /* [nranks]: every rank's HELLO */
    uint64_t *gens;          /* [nranks]: scratch, the generation of each view here */
    uint8_t *desc;
    size_t desc_cap;
    int *fds;
    size_t fd_cap;
    uint64_t max_bytes, size, window, acked, acked_told, seq, group, nonce;
    uint8_t op;
    int broken;              /* an exchange broke off: only close is left */
    int behind;              /* the last exchange left some view behind (every rank knows): the next resize
                                exchanges even at the same size */
    char broken_msg[1024];
    char host[SY_HOST];
    fabpool_torch_symm_info c; /* the counters of get_info */
};

/* ------------------------------------------------------------- messages */

static _Thread_local char sy_msg[4096];

const char *fabpool_torch_symm_last_error(void) { return sy_msg; }

static fabpool_status sy_err(fabpool_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fabpool_status sy_err(fabpool_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sy_msg, sizeof sy_msg, fmt, ap);
    va_end(ap);
    return st;
}

/* fabpool's message for its failed call st, after the words of fmt. */
static fabpool_status sy_err_pool(fabpool_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fabpool_status sy_err_pool(fabpool_status st, const char *fmt, ...)
{
    char pool_msg[2048];
    snprintf(pool_msg, sizeof pool_msg, "%s", fabpool_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sy_msg, sizeof sy_msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(sy_msg);
    snprintf(sy_msg + n, sizeof sy_msg - n, ": %s", pool_msg);
    return st;
}

/* src into dst[cap], cut to fit (messages may be longer than a field). */
static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Appends to the message. */
static void sy_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sy_append(const char *fmt, ...)
{
    size_t n = strlen(sy_msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sy_msg + n, sizeof sy_msg - n, fmt, ap);
    va_end(ap);
}

/* This rank's step failed with st: its head carries the status and message. */
static void head_fail(sy_head *h, fabpool_status st)
{
    if (st == FABPOOL_OK || h->status != FABPOOL_OK)
        return;
    h->status = st;
    copy_cut(h->err, sizeof h->err, sy_msg);
}

static const char *op_name(int op) { return op == SY_CREATE ? "create" : "resize"; }

static const char *phase_name(int p)
{
    static const char *names[] = {"?", "hello", "mesh", "ask", "grown", "exported", "desc", "applied", "turn"};
    return p >= 1 && p <= SY_TURN ? names[p] : names[0];
}

static const char *handle_name(int t)
{
    switch (t) {
    case FABPOOL_HANDLE_NONE: return "none";
    case FABPOOL_HANDLE_POSIX_FD: return "posix_fd";
    case FABPOOL_HANDLE_FABRIC: return "fabric";
    default: return "auto";
    }
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void fabpool_torch_symm_options_init(fabpool_torch_symm_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->nranks = 1;
    o->fd_transport = FABPOOL_TORCH_SYMM_FD_SOCKET;
    o->timeout_ms = SY_TIMEOUT_MS;
}

/* --------------------------------------------------------------- rounds */

static fabpool_status sy_break(fabpool_torch_symm_t *s, fabpool_status st)
{
    s->broken = 1;
    copy_cut(s->broken_msg, sizeof s->broken_msg, sy_msg);
    return st;
}

/* One all-gather of `msg` bytes per rank (mine: a head, then the round's
 * payload).  Fills mine's head but its status, err and v; checks every
 * rank's head.  *out gets the nranks messages (the caller frees it).  A
 * failed all-gather or a head of another call breaks the object. */
static fabpool_status sy_round(fabpool_torch_symm_t *s, int phase, void *mine, size_t msg, uint8_t **out)
{
    *out = NULL;
    sy_head *h = mine;
    h->magic = SY_MAGIC;
    h->version = SY_VERSION;
    h->op = s->op;
    h->phase = (uint8_t)phase;
    h->rank = s->rank;
    h->nranks = s->nranks;
    h->seq = s->seq;
    h->group = s->group;
    if (msg > SIZE_MAX / (size_t)s->nranks)
        return sy_break(s, sy_err(FABPOOL_ERR_LIMIT, "the %s round of %s needs %d messages of %zu bytes: past the "
                                  "address space", phase_name(phase), op_name(s->op), s->nranks, msg));
    uint8_t *all = malloc(msg * (size_t)s->nranks);
    if (!all)
        return sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for the %s round of %s (%zu bytes)",
                                  phase_name(phase), op_name(s->op), msg * (size_t)s->nranks));
    int rc = s->allgather(s->actx, mine, all, msg);
    if (rc != 0) {
        free(all);
        return sy_break(s, sy_err(FABPOOL_ERR_IO, "the group's all-gather failed (it returned %d) in the %s round of "
                                  "%s", rc, phase_name(phase), op_name(s->op)));
    }
    fabpool_status st = FABPOOL_OK;
    for (int q = 0; q < s->nranks && st == FABPOOL_OK; q++) {
        sy_head hq;
        memcpy(&hq, all + (size_t)q * msg, sizeof hq);
        if (hq.magic != SY_MAGIC || hq.version != SY_VERSION)
            st = sy_err(FABPOOL_ERR_CONFIG, "rank %d's message is not of this exchange (magic 0x%08x, version %u; this "
                        "rank's: 0x%08x, %u): every rank must load the same libfabpool_torch", q, hq.magic,
                        hq.version, SY_MAGIC, SY_VERSION);
        else if (hq.nranks != s->nranks)
            st = sy_err(FABPOOL_ERR_CONFIG, "rank %d counts %d ranks in the group, this rank %d", q, hq.nranks,
                        s->nranks);
        else if (hq.rank != q)
            st = sy_err(FABPOOL_ERR_CONFIG, "the all-gather put rank %d's message in place %d: it must give them in "
                        "rank order (or two ranks have the same rank)", hq.rank, q);
        else if (hq.op != h->op || hq.phase != h->phase || hq.seq != h->seq || hq.group != h->group)
            st = sy_err(FABPOOL_ERR_CONFIG, "rank %d is in call #%llu (%s, %s round%s), this rank in call #%llu (%s, "
                        "%s round): every rank must make the same calls on the same buffers in the same order", q,
                        (unsigned long long)hq.seq, op_name(hq.op), phase_name(hq.phase),
                        hq.group != h->group ? ", of another buffer" : "", (unsigned long long)h->seq,
                        op_name(h->op), phase_name(h->phase));
    }
    if (st != FABPOOL_OK) {
        free(all);
        return sy_break(s, st);
    }
    *out = all;
    return FABPOOL_OK;
}

/* The lowest rank whose step failed in a round, or -1. */
static int sy_first_failed(const uint8_t *all, size_t msg, int nranks, sy_head *h)
{
    for (int q = 0; q < nranks; q++) {
        memcpy(h, all + (size_t)q * msg, sizeof *h);
        if (h->status != FABPOOL_OK) {
            h->err[SY_ERR - 1] = 0;
            return q;
        }
    }
    return -1;
}

/* The round's answer: FABPOOL_OK if no rank failed, else the first failing
 * rank's status with its message. */
static fabpool_status sy_outcome(const fabpool_torch_symm_t *s, const uint8_t *all, size_t msg, const char *what)
{
    sy_head h;
    int q = sy_first_failed(all, msg, s->nranks, &h);
    if (q < 0)
        return FABPOOL_OK;
    return sy_err((fabpool_status)h.status, "%s: rank %d%s: %s", what, q, q == s->rank ? " (this rank)" : "", h.err);
}

static uint64_t head_v(const uint8_t *all, size_t msg, int q, int i)
{
    sy_head h;
    memcpy(&h, all + (size_t)q * msg, sizeof h);
    return h.v[i];
}

/* ------------------------------------------------------------- sockets */

static void sy_sock_name(char *name, size_t cap, int pid, uint64_t nonce)
{
    snprintf(name, cap, "fabpool-symm-%d-%016llx", pid, (unsigned long long)nonce);
}

static int same_host(const fabpool_torch_symm_t *s, int q)
{
    return strncmp(s->peers[q].host, s->host, SY_HOST) == 0;
}

/* Milliseconds left until deadline (ns of now_ns), at least 1 while any is left, 0 past it. */
static int sy_left_ms(uint64_t deadline)
{
    uint64_t t = now_ns();
    if (t >= deadline)
        return 0;
    uint64_t ms = (deadline - t + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

static uint64_t sy_deadline(const fabpool_torch_symm_t *s) { return now_ns() + (uint64_t)s->timeout_ms * 1000000ull; }

/* a and b, n bytes, compared in a time that does not depend on where they differ. */
static int sy_same_secret(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* The lower rank of this host with no socket yet that declared pid, or -1. */
static int sy_rank_of_pid(const fabpool_torch_symm_t *s, int pid)
{
    for (int q = 0; q < s->rank; q++)
        if (same_host(s, q) && s->sock[q] < 0 && s->peers[q].pid == pid)
            return q;
    return -1;
}

/* Connections a rank watches at once for their idents (conn_wait.h says which gives way past it). */
#define SY_WAITING_MAX 64
/* Connections taken from the listener's queue at one wake at most. */
#define SY_ACCEPT_BURST 256
/* How often a connection that has sent part of its ident is looked at again (ms). */
#define SY_PARTIAL_MS 5
/* How long the listener is not watched once a connection could not be taken for want of an fd (ms): the
 * connection stays in its queue and poll says the listener readable at once, again and again. */
#define SY_ACCEPT_REST_MS 50
/* The read of an ident that is in whole: a bound that never binds but under a tool that slows every call (ms). */
#define SY_IDENT_READ_MS 2000

/* The bytes waiting on connection c (FIONREAD), or -1 where it cannot say. */
static int sy_ident_bytes(int c)
{
    int n = 0;
    return ioctl(c, FIONREAD, &n) == 0 ? n : -1;
}

/* Reads the ident that has come whole on c and judges it: the rank it proves (the group's secret, a lower rank
 * of this host with no socket yet and, unless any pid may be a peer, the rank whose pid is c's), or -1. */
static int sy_take_ident(fabpool_torch_symm_t *s, int c)
{
    int want = -1, ppid = 0;
    if (!(s->peer_flags & FABPOOL_FD_ANY_PID)) {
        if (fabpool_fd_peer(c, &ppid, NULL) != FABPOOL_OK || (want = sy_rank_of_pid(s, ppid)) < 0)
            return -1;
    }
    /* the head first: an ident's message carries no fd and exactly an ident, so that once it is in (the caller
     * saw that many bytes) the read cannot wait; a head that announces more is refused unread */
    uint32_t head[2] = {1, 0};
    _Static_assert(sizeof head == FABPOOL_FD_HEAD_BYTES, "the head: a u32 fd count, a u32 length");
    if (recv(c, head, sizeof head, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof head || head[0] != 0 ||
        head[1] != sizeof(sy_ident))
        return -1;
    sy_ident id;
    memset(&id, 0, sizeof id);
    size_t n = 0, len = 0;
    int ok = fabpool_fd_recv_timed(c, NULL, 0, &n, &id, sizeof id, &len, SY_IDENT_READ_MS) == FABPOOL_OK &&
             len == sizeof id;
    ok = sy_same_secret(id.secret, s->secret, sizeof id.secret) && ok; /* every byte compared, whatever else */
    ok = ok && id.rank >= 0 && id.rank < s->rank && same_host(s, id.rank) && s->sock[id.rank] < 0 &&
         (want < 0 || want == id.rank);
    int q = ok ? id.rank : -1;
    explicit_bzero(&id, sizeof id);
    return q;
}

/* What became of connection c, waiting for its ident: -1 closed (not a rank of this group, or gone before it said
 * who), 1 taken as its rank's socket, else 0 (it waits on; *partial says whether part of an ident has come). */
static int sy_settle(fabpool_torch_symm_t *s, int c, int *partial)
{
    int bytes = sy_ident_bytes(c);
    int whole = bytes >= (int)(FABPOOL_FD_HEAD_BYTES + sizeof(sy_ident));
    char b;
    ssize_t r = bytes == 0 ? recv(c, &b, 1, MSG_PEEK | MSG_DONTWAIT) : 1; /* 0: the peer closed it */
    int gone = bytes < 0 || r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
               (!whole && bytes > 0 && cw_hung_up(c)); /* part of an ident, and no more can come */
    *partial = bytes > 0;
    if (!whole && !gone)
        return 0;
    int q = whole ? sy_take_ident(s, c) : -1;
    if (q < 0) {
        close(c);
        s->refused++;
        return -1;
    }
    s->sock[q] = c;
    return 1;
}

/* Every waiting connection looked at: those taken or closed leave w; the ranks still to come are returned. */
static int sy_sweep(fabpool_torch_symm_t *s, cw_conn *w, int *nw, int need)
{
    for (int i = 0; i < *nw && need > 0;) {
        int partial, r = sy_settle(s, w[i].fd, &partial);
        w[i].partial = partial;
        if (r == 0) {
            i++;
            continue;
        }
        need -= r > 0;
        w[i] = w[--*nw];
    }
    return need;
}

/* The connections in the listener's queue, up to SY_ACCEPT_BURST at a wake (the listener does not block), so that
 * a flood of them costs a poll for many, not for each: another user's, or one of a pid no lower rank of this host
 * declared, is closed at once (unless the peers option lets it in), one already gone too, and one whose ident has
 * come is judged at once; the others wait in w, which is looked at again when full, so that a rank whose ident
 * has come since never gives way (conn_wait.h).  The ranks still to come are returned; *no_fd is set where a
 * connection could not be taken for want of an fd (EMFILE, ENFILE: it stays queued). */
static int sy_accept_burst(fabpool_torch_symm_t *s, cw_conn *w, int *nw, int need, uint64_t *seq, int *no_fd)
{
    unsigned own = (unsigned)geteuid();
    for (int n = 0; n < SY_ACCEPT_BURST && need > 0; n++) {
        int c = -1, ppid = 0;
        fabpool_status a = fabpool_fd_accept_peer(s->listener, &c, 0, s->peer_flags, &ppid);
        if (a == FABPOOL_ERR_PERMISSION) {
            s->refused++; /* another user's process: closed already */
            continue;
        }
        if (a != FABPOOL_OK) {
            /* the queue is empty, or (errno as accept left it) no fd for the connection, which stays queued */
            *no_fd = a == FABPOOL_ERR_IO && (errno == EMFILE || errno == ENFILE);
            break;
        }
        cw_conn in = {c, 0, 0, ++*seq, 0};
        /* a process that no rank of the group declared (where any pid may not be one), or one whose
         * credentials cannot be read */
        if ((!(s->peer_flags & FABPOOL_FD_ANY_PID) && sy_rank_of_pid(s, ppid) < 0) ||
            fabpool_fd_peer(c, NULL, &in.uid) != FABPOOL_OK) {
            close(c);
            s->refused++;
            continue;
        }
        int r = sy_settle(s, c, &in.partial);
        need -= r > 0;
        if (r != 0)
            continue;
        if (*nw == SY_WAITING_MAX)
            need = sy_sweep(s, w, nw, need);
        s->refused += cw_admit(w, nw, SY_WAITING_MAX, &in, own);
    }
    return need;
}

/* The accepting half of the mesh: the `need` lower ranks of this host, until the deadline; *st gets the first
 * failure. */
static void sy_accept_ranks(fabpool_torch_symm_t *s, uint64_t deadline, int need, fabpool_status *st)
{
    /* the connections accepted whose ident has not come whole: all of them are watched at once, so that one that
     * stays silent (or says half) holds no other's turn */
    cw_conn waiting[SY_WAITING_MAX];
    int nw = 0;
    uint64_t seq = 0;
    uint64_t listen_at = 0; /* the listener rests until then (now_ns): out of fds, it is readable and no accept
                               takes one */
    while (need > 0 && s->listener >= 0) {
        int left = sy_left_ms(deadline), rest = sy_left_ms(listen_at);
        struct pollfd pf[1 + SY_WAITING_MAX];
        pf[0] = (struct pollfd){s->listener, rest > 0 ? 0 : POLLIN, 0};
        int partial = 0;
        for (int i = 0; i < nw; i++) {
            pf[1 + i] = (struct pollfd){waiting[i].fd, waiting[i].partial ? 0 : POLLIN, 0};
            partial |= waiting[i].partial;
        }
        int r = 0, wait = partial && left > SY_PARTIAL_MS ? SY_PARTIAL_MS : left;
        wait = rest > 0 && rest < wait ? rest : wait;
        /* a connection with part of its ident is looked at again after a short while, not watched for input
         * (poll would say readable at once, again and again; a hang-up is still reported) */
        if (left > 0)
            do
                r = poll(pf, (nfds_t)(1 + nw), wait);
            while (r < 0 && errno == EINTR);
        if (r <= 0 && sy_left_ms(deadline) == 0) {
            char missing[256] = "";
            for (int q = 0; q < s->rank; q++)
                if (same_host(s, q) && s->sock[q] < 0)
                    snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%d", *missing ? ", " : "",
                             q);
            if (*st == FABPOOL_OK)
                *st = sy_err(FABPOOL_ERR_IO, "rank(s) %s of this host did not identify themselves within %d ms on "
                             "this rank's Unix socket; %d connection(s) of other processes were refused and %d were "
                             "still silent (another network namespace? then use the pidfd transport; another user or "
                             "pid namespace? then see the peers option)", missing, s->timeout_ms, s->refused, nw);
            break;
        }
        /* the connections waiting first: an ident that came whole is read (it cannot block) and judged */
        need = sy_sweep(s, waiting, &nw, need);
        int no_fd = 0;
        if (need > 0 && (pf[0].revents & POLLIN))
            need = sy_accept_burst(s, waiting, &nw, need, &seq, &no_fd);
        if (no_fd)
            listen_at = now_ns() + SY_ACCEPT_REST_MS * 1000000ull;
    }
    for (int i = 0; i < nw; i++)
        close(waiting[i].fd);
}

/* Connects to every peer of this host above this rank, and accepts every
 * one below, all within one deadline.  A connecting rank sends its ident
 * (the group secret and its rank) only once the listener is the process its
 * peer declared in HELLO, of this user.  The accepting rank refuses at once
 * a connection of another user (fabpool_fd_accept_peer) or of a pid that no
 * lower rank of its host declared, so that no one can stall it by
 * connecting; the others it watches all at once until the deadline, reads
 * an ident only once it has come whole, and takes the connection only with
 * the group's secret and that rank, so that a connection that stays silent
 * or says half (possible where the peers option lets any pid or user in)
 * delays no one.  Every connection is tried even after one failed. */
static fabpool_status sy_mesh(fabpool_torch_symm_t *s)
{
    uint64_t deadline = sy_deadline(s);
    fabpool_status st = FABPOOL_OK;
    char name[96];
    for (int q = s->rank + 1; q < s->nranks; q++) {
        if (!same_host(s, q))
            continue;
        sy_sock_name(name, sizeof name, s->peers[q].pid, s->peers[q].nonce);
        sy_ident id;
        memset(&id, 0, sizeof id);
        memcpy(id.secret, s->secret, sizeof id.secret);
        id.rank = s->rank;
        int left = sy_left_ms(deadline), c = -1;
        fabpool_status sq = left > 0 ? fabpool_fd_connect_peer(name, &c, left, s->peers[q].pid, s->peer_flags)
                                     : FABPOOL_ERR_IO;
        if (sq == FABPOOL_OK && (sq = fabpool_fd_send(c, NULL, 0, &id, sizeof id)) != FABPOOL_OK) {
            close(c);
            c = -1;
        }
        if (sq == FABPOOL_OK)
            s->sock[q] = c;
        else if (st == FABPOOL_OK && left == 0)
            st = sy_err(FABPOOL_ERR_IO, "no time left (%d ms for the mesh) to reach rank %d (pid %d) over its Unix "
                        "socket '@%s'", s->timeout_ms, q, s->peers[q].pid, name);
        else if (st == FABPOOL_OK && sq == FABPOOL_ERR_PERMISSION)
            st = sy_err_pool(sq, "refused to send anything to the listener of rank %d's socket '@%s': it is not "
                             "rank %d's process (pid %d, declared in the group's all-gather)", q, name, q,
                             s->peers[q].pid);
        else if (st == FABPOOL_OK)
            st = sy_err_pool(sq == FABPOOL_ERR_CONFIG ? sq : FABPOOL_ERR_IO, "cannot reach rank %d (pid %d, host "
                             "'%.64s') over its Unix socket '@%s' (the ranks of a host must share a network namespace "
                             "for abstract sockets; else use the pidfd transport)", q, s->peers[q].pid,
                             s->peers[q].host, name);
    }
    int need = 0;
    for (int q = 0; q < s->rank; q++)
        need += same_host(s, q);
    sy_accept_ranks(s, deadline, need, &st);
    if (s->listener >= 0)
        close(s->listener);
    s->listener = -1;
    return st;
}

/* A buffer made before this process was forked: its lock may have been held at the fork by a thread of the parent
 * (an exchange waits for its peers), a thread the child lacks, so that the child would wait for ever; and its
 * pool refuses in the child anyway (fabpool.h's fork paragraph).  Its calls answer before they take the lock;
 * close still frees what it holds here. */
static fabpool_status sy_forked(const fabpool_torch_symm_t *s, const char *fn)
{
    if (s->pid == getpid())
        return FABPOOL_OK;
    return sy_err(FABPOOL_ERR_NOT_SUPPORTED, "%s: this symmetric buffer was made before this process was forked "
                  "(pid %d made it): CUDA does not carry over a fork; start the child with exec or spawn and make "
                  "the buffer there", fn, (int)s->pid);
}

/* ------------------------------------------------------------- teardown */

/* Unmaps and frees everything this rank holds; the first failure's status
 * and message (none: FABPOOL_OK, and the message untouched). */
static fabpool_status sy_free(fabpool_torch_symm_t *s)
{
    if (!s)
        return FABPOOL_OK;
    fabpool_status st = FABPOOL_OK, t;
    char first[1024] = "";
    for (int q = 0; s->views && q < s->nranks; q++)
        if (s->views[q] && (t = fabpool_view_close(s->views[q])) != FABPOOL_OK && st == FABPOOL_OK) {
            st = t;
            snprintf(first, sizeof first, "closing the view of rank %d: %s", q, fabpool_last_error());
        }
    if (s->buf) {
        /* no peer will map anything more: what shrinks left for them may go */
        if ((t = fabpool_buffer_peers_ack(s->buf, UINT64_MAX)) != FABPOOL_OK && st == FABPOOL_OK) {
            st = t;
            snprintf(first, sizeof first, "acknowledging the buffer: %s", fabpool_last_error());
        }
        if ((t = fabpool_buffer_destroy(s->buf, NULL)) != FABPOOL_OK && st == FABPOOL_OK) {
            st = t;
            snprintf(first, sizeof first, "destroying the buffer: %s", fabpool_last_error());
        }
    }
    if (s->pool && (t = fabpool_destroy(s->pool)) != FABPOOL_OK && st == FABPOOL_OK) {
        st = t;
        snprintf(first, sizeof first, "destroying the pool: %s", fabpool_last_error());
    }
    for (int q = 0; s->sock && q < s->nranks; q++)
        if (s->sock[q] >= 0)
            close(s->sock[q]);
    for (int q = 0; s->pidfd && q < s->nranks; q++)
        if (s->pidfd[q] >= 0)
            close(s->pidfd[q]);
    if (s->listener >= 0)
        close(s->listener);
    if (s->token >= 0)
        close(s->token);
    explicit_bzero(s->secret, sizeof s->secret);
    free(s->views);
    free(s->sock);
    free(s->pidfd);
    free(s->token_fd);
    free(s->proved);
    free(s->pfds);
    free(s->peers);
    free(s->gens);
    free(s->desc);
    free(s->fds);
    pthread_mutex_destroy(&s->lock);
    free(s);
    if (st != FABPOOL_OK)
        sy_err(st, "%s", first);
    return st;
}

/* A failed create: everything goes, the message stays the create's. */
static fabpool_status sy_fail_create(fabpool_torch_symm_t *s, fabpool_status st)
{
    char keep[sizeof sy_msg];
    memcpy(keep, sy_msg, sizeof keep);
    (void)sy_free(s);
    memcpy(sy_msg, keep, sizeof sy_msg);
    return st;
}

/* ------------------------------------------------------------- exchange */

static fabpool_status sy_reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return FABPOOL_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for %zu bytes of descriptors or fds", n * elem);
    *p = q;
    *cap = n;
    return FABPOOL_OK;
}

/* This rank's descriptor since the generation every peer has, into s->desc
 * and s->fds. */
static fabpool_status sy_export(fabpool_torch_symm_t *s, size_t *len, size_t *nfds)
{
    *len = *nfds = 0;
    for (;;) {
        fabpool_status st = fabpool_buffer_export(s->buf, s->acked, s->desc, s->desc_cap, len, s->fds, s->fd_cap,
                                                  nfds);
        if (st != FABPOOL_ERR_LIMIT || (*len <= s->desc_cap && *nfds <= s->fd_cap))
            return st == FABPOOL_OK ? st : sy_err_pool(st, "exporting its buffer");
        if ((st = sy_reserve((void **)&s->desc, &s->desc_cap, *len, 1)) != FABPOOL_OK ||
            (st = sy_reserve((void **)&s->fds, &s->fd_cap, *nfds, sizeof(int))) != FABPOOL_OK)
            return st;
    }
}

/* The first failure of a step that goes on after it: its status in *mine
 * and its message in keep (sy_msg is overwritten by later failures). */
static void sy_note(fabpool_status *mine, char *keep, size_t cap, fabpool_status t)
{
    if (t == FABPOOL_OK || *mine != FABPOOL_OK)
        return;
    *mine = t;
    copy_cut(keep, cap, sy_msg);
}

static uint64_t sy_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank q's token for the pidfd transport: derived from the group secret and
 * the rank, so that only a process given the secret by the all-gather makes
 * it, and one rank's token is not another's.  It proves no more than the
 * secret does: that the process behind a declared pid is the group's. */
static void sy_token_of(const fabpool_torch_symm_t *s, int q, uint8_t out[SY_TOKEN])
{
    uint64_t w[SY_SECRET / 8], t[SY_TOKEN / 8];
    memcpy(w, s->secret, sizeof w);
    for (size_t i = 0; i < SY_TOKEN / 8; i++)
        t[i] = sy_mix(w[i] ^ sy_mix(w[(i + 1) % (SY_SECRET / 8)] + (uint64_t)(uint32_t)q * 0x100000001b3ull + i));
    memcpy(out, t, SY_TOKEN);
    explicit_bzero(w, sizeof w);
    explicit_bzero(t, sizeof t);
}

/* What a rank says in its APPLIED round beside the views' generations
 * (head v[0]): the call cannot be left in a state every rank agrees on, or
 * no later exchange can work, so every rank breaks the object. */
enum {
    SY_LOST_SIZE = 1, /* its buffer could not go back to the size every other rank has */
    SY_LOST_VIEW = 2, /* a view of it still maps memory its peer gave up (the emptying failed) */
    SY_LOST_PAIR = 4  /* its socket to a peer failed: fds cannot pass between them any more */
};

/* Copies rank q's nfds fds (their numbers in fdnums, from its DESC message)
 * out of its process into s->pfds[q]: only through the pidfd opened at
 * create on the pid that the all-gather declared, and only once that
 * process has shown that it holds rank q's token.  On failure nothing
 * copied stays open. */
static fabpool_status sy_pidfd_copy(fabpool_torch_symm_t *s, int q, const uint8_t *fdnums, size_t nfds)
{
    if (s->pidfd[q] < 0)
        return sy_err(FABPOOL_ERR_IO, "no pidfd of rank %d's process (pid %d)", q, s->peers[q].pid);
    if (!s->proved[q]) {
        uint8_t tok[SY_TOKEN];
        sy_token_of(s, q, tok);
        fabpool_status st = s->token_fd[q] < 0 ? FABPOOL_ERR_PERMISSION
                                               : fabpool_fd_token_check(s->pidfd[q], s->token_fd[q], tok, sizeof tok);
        explicit_bzero(tok, sizeof tok);
        if (st != FABPOOL_OK && s->token_fd[q] < 0)
            return sy_err(st, "rank %d declared no token (fd %d): nothing is copied from pid %d", q, s->token_fd[q],
                          s->peers[q].pid);
        if (st != FABPOOL_OK)
            return sy_err_pool(st == FABPOOL_ERR_PERMISSION ? st : FABPOOL_ERR_IO, "pid %d, declared as rank %d's, "
                               "did not prove to be rank %d's process: nothing is copied from it", s->peers[q].pid,
                               q, q);
        s->proved[q] = 1;
    }
    int *f = malloc(nfds * sizeof *f);
    if (!f)
        return sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for %zu fds of rank %d", nfds, q);
    for (size_t i = 0; i < nfds; i++) {
        int32_t theirs;
        memcpy(&theirs, fdnums + 4 * i, 4);
        fabpool_status st = theirs < 0 ? FABPOOL_ERR_DESCRIPTOR : fabpool_fd_from_pidfd(s->pidfd[q], theirs, &f[i]);
        if (st != FABPOOL_OK) {
            for (size_t k = 0; k < i; k++)
                close(f[k]);
            free(f);
            if (theirs < 0)
                return sy_err(st, "rank %d named fd %d for its chunk %zu", q, (int)theirs, i);
            return sy_err_pool(FABPOOL_ERR_IO, "cannot copy rank %d's fds (pid %d) by pidfd_getfd: it needs ptrace "
                               "permission (same user; Yama ptrace_scope 0 or 1; a seccomp filter that allows "
                               "pidfd_getfd); else use the socket transport", q, s->peers[q].pid);
        }
    }
    s->pfds[q] = f;
    return FABPOOL_OK;
}

/* Closes the fds copied from peers that no view took. */
static void sy_pfds_drop(fabpool_torch_symm_t *s, const uint64_t *nfds_of)
{
    for (int q = 0; q < s->nranks; q++) {
        for (uint64_t i = 0; s->pfds[q] && i < nfds_of[q]; i++)
            close(s->pfds[q][i]);
        free(s->pfds[q]);
        s->pfds[q] = NULL;
    }
}

/* A barrier of the pidfd turns: an all-gather of heads. */
static fabpool_status sy_turn_round(fabpool_torch_symm_t *s, int k)
{
    sy_head h;
    memset(&h, 0, sizeof h);
    h.v[0] = (uint64_t)k;
    uint8_t *all = NULL;
    fabpool_status st = sy_round(s, SY_TURN, &h, sizeof h, &all);
    free(all);
    return st;
}

/* The pidfd copies of an exchange, from every peer that has fds.  Where no
 * rank runs under Yama ptrace_scope 1, every rank copies from every peer at
 * once (ptrace permission is the uid's).  Under ptrace_scope 1 a process
 * may be copied from only by the one process it names with PR_SET_PTRACER
 * (fabpool_fd_allow_peer), and never by all of them (PR_SET_PTRACER_ANY
 * would let in every process of the user for the life of the process): so
 * the copies go in nranks - 1 turns.  In turn k every rank r names rank
 * r + k (mod nranks), a pid of the group, and copies from rank r - k, which
 * names r; one all-gather round after the consents and one after the copies
 * keep each consent in place until its copies are done, and no consent
 * outlives the turns (fabpool_fd_allow_peer(0) after them, failed or not).
 * A copy that fails is this rank's failure (*mine, keep); a round that
 * fails breaks the object and ends the turns. */
static fabpool_status sy_pidfd_turns(fabpool_torch_symm_t *s, const uint8_t *all, size_t msg, const uint64_t *lens,
                                     const uint64_t *nfds_of, fabpool_status *mine, char *keep, size_t cap)
{
    size_t hs = sizeof(sy_head);
    int n = s->nranks;
#define SY_COPY(q)                                                                                                  \
    do {                                                                                                            \
        if ((q) != s->rank && nfds_of[q] > 0)                                                                       \
            sy_note(mine, keep, cap, sy_pidfd_copy(s, q, all + (size_t)(q) * msg + hs + lens[q], nfds_of[q]));      \
    } while (0)
    if (!s->turns) {
        for (int q = 0; q < n; q++)
            SY_COPY(q);
        return FABPOOL_OK;
    }
    fabpool_status st = FABPOOL_OK;
    for (int k = 1; k < n && st == FABPOOL_OK; k++) {
        int to = (s->rank + k) % n, from = (s->rank - k + n) % n;
        fabpool_status t = fabpool_fd_allow_peer(s->peers[to].pid);
        if (t != FABPOOL_OK)
            sy_note(mine, keep, cap, sy_err_pool(t, "letting rank %d (pid %d) copy its fds", to, s->peers[to].pid));
        if ((st = sy_turn_round(s, 2 * k)) != FABPOOL_OK)
            break;
        SY_COPY(from);
        st = sy_turn_round(s, 2 * k + 1);
    }
#undef SY_COPY
    (void)fabpool_fd_allow_peer(0);
    return st;
}

/* Applies rank q's message of the DESC round here, with its fds (taken by
 * fabpool whatever the outcome); the generation of the view after it (0 if
 * it failed: the next exchange sends a full one). */
static fabpool_status sy_apply(fabpool_torch_symm_t *s, int q, const uint8_t *msg, size_t len, int *fds, size_t nf)
{
    const uint8_t *desc = msg + sizeof(sy_head);
    fabpool_status st = s->views[q] ? fabpool_view_apply(s->views[q], desc, len, fds, nf)
                                    : fabpool_view_open(s->pool, desc, len, fds, nf, &s->views[q]);
    if (st != FABPOOL_OK)
        return sy_err_pool(st, "mapping rank %d's buffer (host '%.64s', device %d) here on device %d", q,
                           s->peers[q].host, s->peers[q].device, s->device);
    fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (fabpool_view_get_info(s->views[q], &vi) == FABPOOL_OK)
        s->gens[q] = vi.generation;
    s->c.last_imported += len > SY_REC_HDR ? (len - SY_REC_HDR) / SY_REC : 0;
    return FABPOOL_OK;
}

/* Whether rank q's stated descriptor (len bytes, nfds fds) fits what a
 * buffer of this window can hold: a header and a record per chunk, a chunk
 * at least a page (no granularity is finer), an fd per record at most (none
 * for fabric handles).  Every rank decides from the same all-gathered
 * values, so every rank reaches the same answer. */
static fabpool_status sy_bounded(const fabpool_torch_symm_t *s, int q, uint64_t len, uint64_t nfds, const char *what)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t max_rec = s->window / (uint64_t)(page > 0 ? page : 4096);
    uint64_t max_len = SY_REC_HDR + SY_REC * max_rec; /* window / page * 96: no overflow */
    uint64_t recs = len >= SY_REC_HDR ? (len - SY_REC_HDR) / SY_REC : 0;
    uint64_t max_fds = s->handle_type == FABPOOL_HANDLE_POSIX_FD ? recs : 0;
    if (len <= max_len && (len == 0 || len >= SY_REC_HDR) && nfds <= max_fds)
        return FABPOOL_OK;
    return sy_err(FABPOOL_ERR_DESCRIPTOR, "%s: rank %d states a descriptor of %llu bytes with %llu fds, which a "
                  "buffer of its window (%llu bytes) cannot have (at most %llu bytes; an fd per record of it at most, "
                  "none for fabric handles): its message is corrupt, or not of this library", what, q,
                  (unsigned long long)len, (unsigned long long)nfds, (unsigned long long)s->window,
                  (unsigned long long)max_len);
}

/* ------------------------------------------------- views that fell behind
 *
 * The rule (symm.h): after any call, failed or not, no view maps memory that
 * its peer's buffer no longer has.  A view that could not take its peer's
 * descriptor keeps what it maps, which is still the peer's memory only where
 * the peer just grew since (new chunks behind the ones the view maps).  A
 * shrink may refit a chunk (new, smaller memory at the same offset), and a
 * rollback may grow new memory behind a refit: a view that missed that maps
 * memory the peer gave up, and is emptied, keeping its window and address,
 * until a later exchange maps it again from a full descriptor.
 *
 * fabpool's API has no call that unmaps a view's chunks but keeps its window,
 * so the emptying is a descriptor of no chunk and no live bytes, of the view's
 * own buffer and generation, which fabpool_view_apply takes like any other:
 * it drops every chunk.  It is written, and a failed peer's descriptor read,
 * in the descriptor's layout of version 1 (docs/design.md, "Descriptors"). */
#if FABPOOL_DESC_VERSION != 1
#error "symm.c reads and writes descriptors of version 1: follow the layout of the new version"
#endif
enum {
    SY_D_RECORDS = 12, SY_D_HANDLE = 16, SY_D_GEN = 24, SY_D_SINCE = 32, SY_D_WINDOW = 40, SY_D_LIVE = 48,
    SY_D_UID = 56, SY_D_PID = 64, SY_D_DEVICE = 68, SY_D_GRAN = 72, SY_D_SUM = 80,
    SY_R_OFF = 0, SY_R_SIZE = 8, SY_R_GEN = 16
};

static uint64_t sy_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Whether a view at generation vgen that maps vlive bytes still maps only
 * its peer's memory although it did not take the peer's descriptor
 * desc[0..len): the descriptor keeps every byte the view maps (live no
 * smaller) and names no chunk newer than the view below vlive (a chunk the
 * view has not seen there is memory that replaced what the view maps).
 * Anything this cannot read as a whole descriptor says no. */
static int sy_view_still_true(const uint8_t *desc, size_t len, uint64_t vlive, uint64_t vgen)
{
    if (!desc || len < SY_REC_HDR || (len - SY_REC_HDR) % SY_REC)
        return 0;
    uint64_t n = (len - SY_REC_HDR) / SY_REC;
    uint32_t stated;
    memcpy(&stated, desc + SY_D_RECORDS, 4);
    if (stated != n || sy_get64(desc + SY_D_LIVE) < vlive)
        return 0;
    for (uint64_t k = 0; k < n; k++) {
        const uint8_t *r = desc + SY_REC_HDR + k * SY_REC;
        if (sy_get64(r + SY_R_OFF) < vlive && sy_get64(r + SY_R_GEN) > vgen)
            return 0;
    }
    return 1;
}

/* Empties this rank's view of rank q (see above): no chunk mapped, its window
 * and address kept.  FABPOOL_OK, or fabpool's failure (an unmap refused: the
 * view keeps what it could not unmap). */
static fabpool_status sy_view_empty(fabpool_torch_symm_t *s, int q)
{
    fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
    fabpool_status st = fabpool_view_get_info(s->views[q], &vi);
    if (st != FABPOOL_OK)
        return sy_err_pool(st, "emptying its view of rank %d", q);
    uint8_t d[SY_REC_HDR];
    memset(d, 0, sizeof d);
    uint32_t magic = 0x53445046u, rec = SY_REC, handle = (uint32_t)s->handle_type;
    uint16_t version = FABPOOL_DESC_VERSION, hdr = SY_REC_HDR;
    uint64_t window = vi.max_size, gran = window & (~window + 1), zero = 0;
    uint32_t pid = (uint32_t)s->peers[q].pid, dev = (uint32_t)s->peers[q].device;
    memcpy(d, &magic, 4);
    memcpy(d + 4, &version, 2);
    memcpy(d + 6, &hdr, 2);
    memcpy(d + 8, &rec, 4);
    memcpy(d + SY_D_HANDLE, &handle, 4);
    memcpy(d + SY_D_GEN, &vi.generation, 8);
    memcpy(d + SY_D_SINCE, &vi.generation, 8);
    memcpy(d + SY_D_WINDOW, &window, 8);
    memcpy(d + SY_D_LIVE, &zero, 8);
    memcpy(d + SY_D_UID, &vi.export_id, 8);
    memcpy(d + SY_D_PID, &pid, 4);
    memcpy(d + SY_D_DEVICE, &dev, 4);
    memcpy(d + SY_D_GRAN, &gran, 8);
    uint64_t h = 1469598103934665603ull; /* FNV-1a, the checksum's own 8 bytes read as zeros */
    for (size_t i = 0; i < sizeof d; i++)
        h = (h ^ d[i]) * 1099511628211ull;
    memcpy(d + SY_D_SUM, &h, 8);
    st = fabpool_view_apply(s->views[q], d, sizeof d, NULL, 0);
    if (st != FABPOOL_OK)
        return sy_err_pool(st, "unmapping its view of rank %d, whose memory changed under it", q);
    return FABPOOL_OK;
}

/* After a peer's step failed (rank q's descriptor not taken: not received,
 * not copied or not applied), this rank's view of q as it was before, at
 * vlive bytes and generation vgen, stays if it still maps only q's memory,
 * else is emptied.  *emptied counts the views emptied; *lost gets
 * SY_LOST_VIEW where emptying failed.  The message is left alone. */
static void sy_view_settle(fabpool_torch_symm_t *s, int q, const uint8_t *desc, size_t len, uint64_t vlive,
                           uint64_t vgen, uint64_t *emptied, uint64_t *lost)
{
    if (!s->views[q] || vlive == 0 || sy_view_still_true(desc, len, vlive, vgen))
        return;
    char keep[sizeof sy_msg];
    memcpy(keep, sy_msg, sizeof keep);
    if (sy_view_empty(s, q) == FABPOOL_OK)
        (*emptied)++;
    else
        *lost |= SY_LOST_VIEW;
    memcpy(sy_msg, keep, sizeof sy_msg);
}

/* What the applies of one exchange share: every rank's DESC message, and what this rank says in APPLIED. */
typedef struct sy_taking {
    fabpool_torch_symm_t *s;
    const uint8_t *all;              /* the DESC round: msg bytes a rank */
    size_t msg;
    const uint64_t *lens, *nfds_of;  /* each rank's descriptor length and fd count (EXPORTED, bounded) */
    int posix;
    uint8_t *done;                   /* [nranks]: the peer's descriptor taken here, or its view settled */
    uint64_t *emptied, *lost;        /* sy_view_settle's */
    fabpool_status *mine;            /* this rank's first failure, its message in keep (sy_note) */
    char *keep;
    size_t cap;
} sy_taking;

/* Applies rank q's descriptor here with its fds (taken by fabpool; NULL where they did not come, a failure
 * noted already), or, where that fails, keeps or empties its view as it was (sy_view_settle). */
static void sy_take(sy_taking *a, int q, int *fds)
{
    fabpool_torch_symm_t *s = a->s;
    fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (s->views[q] && fabpool_view_get_info(s->views[q], &vi) != FABPOOL_OK)
        vi.size = UINT64_MAX; /* unknown: emptied if it fails */
    s->gens[q] = 0;
    size_t nf = a->posix ? (size_t)a->nfds_of[q] : 0;
    const uint8_t *m = a->all + (size_t)q * a->msg;
    int missing = nf > 0 && !fds;
    fabpool_status t = missing ? FABPOOL_ERR_IO : sy_apply(s, q, m, (size_t)a->lens[q], fds, nf);
    if (t != FABPOOL_OK)
        sy_view_settle(s, q, m + sizeof(sy_head), (size_t)a->lens[q], vi.size, vi.generation, a->emptied, a->lost);
    if (!missing)
        sy_note(a->mine, a->keep, a->cap, t);
    a->done[q] = 1;
}

/* symm_pass.c's word that rank q's fds are all in: mapped at once, before the next peer's come. */
static void sy_took(void *ctx, int q, int *fds)
{
    sy_taking *a = ctx;
    sy_take(a, q, fds);
    free(a->s->pfds[q]);
    a->s->pfds[q] = NULL;
}

/* The fds of the exchange over the sockets (symm_pass.c): this rank's nfds to every peer of this host, and
 * each peer's from it, all by one deadline, each peer's descriptor applied as soon as its fds are in.  A pair
 * that fails is this rank's failure (a->mine) and is lost for good: its socket is closed (where its next
 * message would start is unknown, and the sockets are connected only at create), and *a->lost gets
 * SY_LOST_PAIR, so that every rank breaks the object in the APPLIED round.  Nothing received from a failed
 * pair stays open. */
static void sy_sock_pass(sy_taking *a, size_t nfds)
{
    fabpool_torch_symm_t *s = a->s;
    int n = s->nranks;
    sy_pass_peer *p = calloc((size_t)n, sizeof *p);
    if (!p) {
        sy_note(a->mine, a->keep, a->cap, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory to pass fds"));
        return;
    }
    for (int q = 0; q < n; q++) {
        uint64_t in = a->nfds_of[q];
        p[q].sock = -1;
        if (q == s->rank)
            continue;
        fabpool_status t = FABPOOL_OK;
        if (in > 0 && s->sock[q] < 0)
            t = sy_err(FABPOOL_ERR_IO, "no socket to rank %d for its fds", q);
        else if (in > 0 && !(s->pfds[q] = malloc((size_t)in * sizeof(int))))
            t = sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for %llu fds of rank %d", (unsigned long long)in, q);
        if (t != FABPOOL_OK) { /* the pair passes nothing: it is lost as one that failed */
            sy_note(a->mine, a->keep, a->cap, t);
            *a->lost |= SY_LOST_PAIR;
            if (s->sock[q] >= 0)
                close(s->sock[q]);
            s->sock[q] = -1;
            continue;
        }
        p[q] = (sy_pass_peer){.sock = s->sock[q], .out = s->sock[q] >= 0 ? nfds : 0, .in = (size_t)in,
                              .fds = s->pfds[q]};
    }
    sy_pass(p, n, s->rank, s->fds, s->seq, sy_deadline(s), s->timeout_ms, sy_took, a);
    for (int q = 0; q < n; q++)
        s->c.fds_sent += p[q].sent;
    for (int i = 0; i < 2 * (n - 1); i++) { /* in the order of the turns: a peer that held a turn comes first */
        int k = i / 2 + 1, q = i % 2 ? (s->rank - k + n) % n : (s->rank + k) % n;
        if (p[q].sock < 0 || p[q].st == FABPOOL_OK)
            continue;
        p[q].sock = -1;
        free(s->pfds[q]); /* what came of its fds was closed by the pass, or taken */
        s->pfds[q] = NULL;
        close(s->sock[q]);
        s->sock[q] = -1;
        *a->lost |= SY_LOST_PAIR;
        sy_note(a->mine, a->keep, a->cap, sy_err(p[q].st, "%s", p[q].err));
    }
    free(p);
}

/* Exports, all-gathers the descriptors, passes the fds, applies every
 * peer's and acknowledges.  On failure *stage says where: SY_STAGE_EXPORT
 * (some rank could not export, or stated what cannot be: nothing was
 * applied anywhere) or SY_STAGE_APPLY (some rank could not take a peer's:
 * its view of that peer stays as it was where it still maps only the peer's
 * memory, and is emptied where not); 0 for a broken exchange.  `lost`: this
 * rank's SY_LOST_* before the exchange.  `last`: no exchange follows in this
 * call, so after an export that failed the views that may have missed a
 * change are emptied (a full descriptor maps them again).  Whatever failed,
 * every rank that reaches the APPLIED round learns every rank's
 * SY_LOST_*, and all of them break the object if any is set. */
static fabpool_status sy_exchange(fabpool_torch_symm_t *s, const char *what, int *stage, uint64_t lost, int last)
{
    *stage = 0;
    s->c.last_exported = s->c.last_imported = 0;
    if (s->nranks == 1)
        return lost ? sy_break(s, sy_err(FABPOOL_ERR_DRIVER, "%s: its buffer could not go back to its size", what))
                    : FABPOOL_OK;
    size_t hs = sizeof(sy_head);
    int n = s->nranks;
    int posix = s->handle_type == FABPOOL_HANDLE_POSIX_FD;
    int pidfd = s->transport == FABPOOL_TORCH_SYMM_FD_PIDFD && posix;
    size_t len = 0, nfds = 0;
    uint8_t *all = NULL;
    uint64_t emptied = 0;
    fabpool_buffer_info bi = {.struct_size = sizeof(fabpool_buffer_info)};
    (void)fabpool_buffer_get_info(s->buf, &bi);

    /* EXPORTED: the descriptor's length and fd count, and the buffer's generation now */
    struct {
        sy_head h;
        uint64_t gen;
    } ex;
    size_t emsg = sizeof ex;
    memset(&ex, 0, sizeof ex);
    head_fail(&ex.h, sy_export(s, &len, &nfds));
    ex.h.v[0] = len;
    ex.h.v[1] = nfds;
    ex.gen = bi.generation;
    fabpool_status st = sy_round(s, SY_EXPORTED, &ex, emsg, &all);
    if (st != FABPOOL_OK)
        return st;
    st = sy_outcome(s, all, emsg, what);
    /* every rank's descriptor length and fd count, bounded before anything is sized from them */
    size_t payload = 0;
    uint64_t *lens = malloc(3 * sizeof(uint64_t) * (size_t)n + (size_t)n), *nfds_of = lens ? lens + n : NULL;
    uint64_t *pgen = lens ? lens + 2 * n : NULL;
    uint8_t *done = lens ? (uint8_t *)(lens + 3 * n) : NULL; /* [n]: sy_taking's */
    for (int q = 0; lens && q < n; q++) {
        lens[q] = head_v(all, emsg, q, 0);
        nfds_of[q] = head_v(all, emsg, q, 1);
        pgen[q] = sy_get64(all + (size_t)q * emsg + hs);
        if (st == FABPOOL_OK)
            st = sy_bounded(s, q, lens[q], nfds_of[q], what);
        if (st == FABPOOL_OK) {
            size_t p = (size_t)lens[q] + (pidfd ? 4 * (size_t)nfds_of[q] : 0); /* bounded: no overflow */
            payload = p > payload ? p : payload;
        }
    }
    free(all);
    all = NULL;
    if (!lens) {
        (void)fabpool_buffer_export_done(s->buf);
        return sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for the exchange"));
    }
    if (st == FABPOOL_OK && payload > SIZE_MAX - hs) {
        free(lens);
        return sy_break(s, sy_err(FABPOOL_ERR_LIMIT, "%s: descriptors of %zu bytes", what, payload));
    }
    /* an export that failed (nothing is applied anywhere): its status and message are the call's */
    fabpool_status xst = st;
    char xmsg[sizeof sy_msg];
    xmsg[0] = 0;
    fabpool_status mine_st = FABPOOL_OK;
    char keep[SY_ERR];
    keep[0] = 0;
    if (xst != FABPOOL_OK) {
        memcpy(xmsg, sy_msg, sizeof xmsg);
        /* the last exchange of the call: a view whose peer's buffer is at another generation may have missed
         * a change of memory under it */
        for (int q = 0; last && q < n; q++) {
            fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
            if (q == s->rank || !s->views[q] || fabpool_view_get_info(s->views[q], &vi) != FABPOOL_OK ||
                vi.size == 0 || vi.generation == pgen[q])
                continue;
            s->gens[q] = 0;
            sy_view_settle(s, q, NULL, 0, vi.size, vi.generation, &emptied, &lost);
        }
        goto applied;
    }

    /* DESC: the descriptors (and the exporter's fd numbers for pidfd) */
    size_t msg = hs + payload;
    uint8_t *mine = calloc(1, msg);
    if (!mine) {
        free(lens);
        return sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for a %zu-byte descriptor message", msg));
    }
    memcpy(mine + hs, s->desc, len);
    for (size_t i = 0; pidfd && i < nfds; i++) {
        int32_t fd = s->fds[i];
        memcpy(mine + hs + len + 4 * i, &fd, 4);
    }
    st = sy_round(s, SY_DESC, mine, msg, &all);
    free(mine);
    if (st != FABPOOL_OK) {
        free(lens);
        return st;
    }
    s->c.desc_bytes += len;
    s->c.last_exported = len > SY_REC_HDR ? (len - SY_REC_HDR) / SY_REC : 0;
    s->c.records_exported += s->c.last_exported;

    /* the fds: to and from every peer of this host at once, by one deadline, or copied by pidfd; every peer's
     * descriptor applied here */
    memset(done, 0, (size_t)n);
    sy_taking tk = {s, all, msg, lens, nfds_of, posix, done, &emptied, &lost, &mine_st, keep, sizeof keep};
    if (posix && !pidfd)
        sy_sock_pass(&tk, nfds);
    if (pidfd && (st = sy_pidfd_turns(s, all, msg, lens, nfds_of, &mine_st, keep, sizeof keep)) != FABPOOL_OK) {
        sy_pfds_drop(s, nfds_of);
        free(all);
        free(lens);
        return st;
    }
    for (int q = 0; q < n; q++) {
        if (q == s->rank || done[q])
            continue;
        sy_take(&tk, q, s->pfds[q]);
        free(s->pfds[q]); /* its fds are fabpool's now */
        s->pfds[q] = NULL;
    }
    s->c.records_imported += s->c.last_imported;
    free(all);
    all = NULL;

applied:
    free(lens);
    /* APPLIED: the generation of every view, so that each exporter learns what all its peers hold; the views
     * emptied (v[1]) and what no rank can mend (v[0], SY_LOST_*) */
    {
        size_t amsg = hs + sizeof(uint64_t) * (size_t)n;
        uint8_t *am = calloc(1, amsg);
        if (!am)
            return sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for the exchange"));
        if (mine_st != FABPOOL_OK)
            copy_cut(sy_msg, sizeof sy_msg, keep);
        head_fail((sy_head *)am, mine_st);
        ((sy_head *)am)->v[0] = lost;
        ((sy_head *)am)->v[1] = emptied;
        memcpy(am + hs, s->gens, sizeof(uint64_t) * (size_t)n);
        st = sy_round(s, SY_APPLIED, am, amsg, &all);
        free(am);
        if (st != FABPOOL_OK)
            return st;
        uint64_t least = UINT64_MAX;
        for (int q = 0; q < n; q++) {
            if (q == s->rank)
                continue;
            uint64_t g = sy_get64(all + (size_t)q * amsg + hs + sizeof(uint64_t) * (size_t)s->rank);
            least = g < least ? g : least;
        }
        st = xst != FABPOOL_OK ? xst : sy_outcome(s, all, amsg, what);
        if (xst != FABPOOL_OK)
            memcpy(sy_msg, xmsg, sizeof sy_msg);
        int lost_by = -1;
        uint64_t lost_how = 0;
        for (int q = 0; q < n; q++) {
            uint64_t how = head_v(all, amsg, q, 0), em = head_v(all, amsg, q, 1);
            if (em)
                sy_append("; rank %d emptied %llu of its views, whose peers' memory changed under them, until a "
                          "later resize maps them again (their size is 0 there)", q, (unsigned long long)em);
            if (how && lost_by < 0) {
                lost_by = q;
                lost_how = how;
            }
        }
        free(all);
        s->acked = least;
        (void)fabpool_buffer_export_done(s->buf); /* every peer has imported its copies (or failed to) */
        if (least > s->acked_told) {
            fabpool_status t = fabpool_buffer_peers_ack(s->buf, least);
            if (t != FABPOOL_OK && st == FABPOOL_OK && lost_by < 0)
                return sy_break(s, sy_err_pool(t, "%s: acknowledging generation %llu", what,
                                               (unsigned long long)least));
            s->acked_told = least;
        }
        if (lost_by >= 0) {
            const char *who = lost_by == s->rank ? " (this rank)" : "";
            int agree = (lost_how & (SY_LOST_SIZE | SY_LOST_VIEW)) != 0;
            if (agree)
                sy_append("; %s rank %d%s, so the ranks cannot agree on the buffers any more",
                          lost_how & SY_LOST_SIZE ? "the buffer could not go back to the size of the others on"
                                                  : "a view still maps memory its peer gave up (emptying it failed) on",
                          lost_by, who);
            else
                sy_append("; rank %d%s lost its socket to a peer, and sockets are connected only at create, so fds "
                          "can no longer pass between them", lost_by, who);
            sy_append(": only close is left (every rank closes this buffer, and the group creates it again)");
            return sy_break(s, st != FABPOOL_OK ? st : agree ? FABPOOL_ERR_DRIVER : FABPOOL_ERR_IO);
        }
    }
    if (xst != FABPOOL_OK)
        *stage = SY_STAGE_EXPORT;
    else if (st != FABPOOL_OK)
        *stage = SY_STAGE_APPLY;
    return st;
}

/* The pidfd transport: a pidfd of every peer's declared pid, pinned now so
 * that a pid reused later cannot stand in, and this rank's token (a sealed
 * memfd) for its peers to check before they copy from it. */
static fabpool_status sy_pidfd_open(fabpool_torch_symm_t *s)
{
    fabpool_status st = FABPOOL_OK;
    uint8_t tok[SY_TOKEN];
    sy_token_of(s, s->rank, tok);
    st = fabpool_fd_token_make(tok, sizeof tok, &s->token);
    explicit_bzero(tok, sizeof tok);
    if (st != FABPOOL_OK)
        return sy_err_pool(st, "making its token for the pidfd transport");
    for (int q = 0; q < s->nranks; q++) {
        if (q == s->rank)
            continue;
        fabpool_status t = fabpool_fd_pidfd_open(s->peers[q].pid, &s->pidfd[q]);
        if (t != FABPOOL_OK) {
            s->pidfd[q] = -1;
            if (st == FABPOOL_OK)
                st = sy_err_pool(t == FABPOOL_ERR_NOT_SUPPORTED ? t : FABPOOL_ERR_IO, "opening a pidfd of rank %d "
                                 "(pid %d, declared in the group's all-gather)", q, s->peers[q].pid);
        }
    }
    return st;
}

/* --------------------------------------------------------------- create */

static uint64_t sy_nonce(void)
{
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x || x == 0)
        x = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    return x;
}

/* Yama's ptrace_scope (-1: no Yama).  A test build may stand in for it. */
__attribute__((unused)) static int sy_yama_scope_read(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}
#ifndef SY_YAMA_SCOPE
#define SY_YAMA_SCOPE sy_yama_scope_read
#endif

/* Whether every rank's HELLO agrees; else FABPOOL_ERR_CONFIG (or _LIMIT
 * for a size past max_bytes) with a message that says what differs.
 * Every rank reaches the same answer from the same table. */
static fabpool_status sy_check_hello(fabpool_torch_symm_t *s, uint64_t *target)
{
    const sy_hello *p = s->peers;
    int n = s->nranks;
    char list[1024];
#define SY_LIST(fmt, ...)                                                                                           \
    do {                                                                                                            \
        list[0] = 0;                                                                                                \
        for (int k = 0; k < n; k++)                                                                                 \
            snprintf(list + strlen(list), sizeof list - strlen(list), "%srank %d: " fmt, k ? ", " : "", k,          \
                     __VA_ARGS__);                                                                                  \
    } while (0)
    for (int q = 1; q < n; q++)
        if (p[q].max_bytes != p[0].max_bytes) {
            SY_LIST("%llu", (unsigned long long)p[k].max_bytes);
            return sy_err(FABPOOL_ERR_CONFIG, "max_bytes differs between ranks (%s): every rank must give the same "
                          "maximum", list);
        }
    for (int q = 1; q < n; q++)
        if (p[q].handle_type != p[0].handle_type) {
            SY_LIST("%s", handle_name(p[k].handle_type));
            return sy_err(FABPOOL_ERR_CONFIG, "the ranks' pools have different handle types (%s): give every rank "
                          "the same handle_type in conf (posix_fd within a host, fabric across an NVLink fabric; auto "
                          "picks fabric only where the process has an IMEX channel)", list);
        }
    if (n > 1 && p[0].handle_type == FABPOOL_HANDLE_NONE)
        return sy_err(FABPOOL_ERR_CONFIG, "the ranks' pools have handle type none: their memory cannot be shared; "
                      "use handle_type:posix_fd (one host) or fabric (an NVLink fabric), or auto");
    for (int q = 1; q < n; q++)
        if (p[q].transport != p[0].transport) {
            SY_LIST("%s", p[k].transport == FABPOOL_TORCH_SYMM_FD_PIDFD ? "pidfd" : "socket");
            return sy_err(FABPOOL_ERR_CONFIG, "the ranks use different fd transports (%s)", list);
        }
    if (p[0].handle_type == FABPOOL_HANDLE_POSIX_FD && n > 1)
        for (int q = 0; q < n; q++)
            if (p[q].pid <= 0)
                return sy_err(FABPOOL_ERR_CONFIG, "rank %d declared pid %d: every rank must declare its own pid for "
                              "POSIX-fd handles", q, (int)p[q].pid);
    if (p[0].handle_type == FABPOOL_HANDLE_POSIX_FD && n > 1 && p[0].transport == FABPOOL_TORCH_SYMM_FD_PIDFD)
        for (int q = 0; q < n; q++)
            if (p[q].yama >= 2)
                return sy_err(FABPOOL_ERR_NOT_SUPPORTED, "rank %d runs under Yama ptrace_scope %d, where no process "
                              "may copy another's fds by pidfd_getfd: use the socket transport", q, (int)p[q].yama);
    if (p[0].handle_type == FABPOOL_HANDLE_POSIX_FD)
        for (int q = 1; q < n; q++)
            if (strncmp(p[q].host, p[0].host, SY_HOST) != 0)
                return sy_err(FABPOOL_ERR_CONFIG, "rank 0 is on host '%.64s' and rank %d on host '%.64s': POSIX-fd "
                              "handles reach only processes of one host; across hosts every rank needs fabric handles "
                              "(handle_type:fabric, an IMEX channel)", p[0].host, q, p[q].host);
    uint64_t t = 0;
    int asker = 0;
    for (int q = 0; q < n; q++)
        if (p[q].bytes > t) {
            t = p[q].bytes;
            asker = q;
        }
    if (t == 0)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "every rank asked for 0 bytes: at least one must ask for a size");
    if (t > p[0].max_bytes)
        return sy_err(FABPOOL_ERR_LIMIT, "rank %d asked for %llu bytes, past max_bytes %llu", asker,
                      (unsigned long long)t, (unsigned long long)p[0].max_bytes);
#undef SY_LIST
    *target = t;
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_symm_create(const fabpool_torch_symm_options *o, fabpool_torch_symm_t **out)
{
    if (out)
        *out = NULL;
    if (!o || !out || !o->allgather)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_create: the options, out or allgather is NULL");
    if (o->struct_size != sizeof *o)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_create: options.struct_size is %u, not %zu: fill "
                      "them with fabpool_torch_symm_options_init", o->struct_size, sizeof *o);
    if (o->nranks < 1 || o->rank < 0 || o->rank >= o->nranks)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_create: rank %d of %d ranks", o->rank, o->nranks);
    if (o->fd_transport != FABPOOL_TORCH_SYMM_FD_SOCKET && o->fd_transport != FABPOOL_TORCH_SYMM_FD_PIDFD)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_create: fd transport %d is neither socket (0) nor "
                      "pidfd (1)", o->fd_transport);
    size_t n = (size_t)o->nranks;
    fabpool_torch_symm_t *s = calloc(1, sizeof *s);
    if (!s)
        return sy_err(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch_symm_create: no host memory");
    pthread_mutex_init(&s->lock, NULL);
    s->pid = getpid();
    s->listener = -1;
    s->token = -1;
    s->views = calloc(n, sizeof *s->views);
    s->sock = malloc(n * sizeof *s->sock);
    s->pidfd = malloc(n * sizeof *s->pidfd);
    s->token_fd = malloc(n * sizeof *s->token_fd);
    s->proved = calloc(n, sizeof *s->proved);
    s->pfds = calloc(n, sizeof *s->pfds);
    s->peers = calloc(n, sizeof *s->peers);
    s->gens = calloc(n, sizeof *s->gens);
    for (size_t q = 0; s->sock && s->pidfd && s->token_fd && q < n; q++)
        s->sock[q] = s->pidfd[q] = s->token_fd[q] = -1;
    if (!s->views || !s->sock || !s->pidfd || !s->token_fd || !s->proved || !s->pfds || !s->peers || !s->gens)
        return sy_fail_create(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "fabpool_torch_symm_create: no host memory"));
    s->rank = o->rank;
    s->nranks = o->nranks;
    s->device = o->device;
    s->transport = o->fd_transport;
    s->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : SY_TIMEOUT_MS;
    s->allgather = o->allgather;
    s->actx = o->allgather_ctx;
    s->max_bytes = o->max_bytes;
    s->op = SY_CREATE;
    s->seq = 1;
    s->nonce = sy_nonce();
    if (o->host && *o->host)
        snprintf(s->host, sizeof s->host, "%s", o->host);
    else if (gethostname(s->host, sizeof s->host - 1) != 0)
        snprintf(s->host, sizeof s->host, "unknown");
    uint64_t t0 = now_ns();

    /* this rank's pool, and its socket for the peers of its host */
    fabpool_status st = FABPOOL_OK;
    unsigned env_peers = 0;
    if (o->peers & ~(FABPOOL_FD_ANY_USER | FABPOOL_FD_ANY_PID))
        st = sy_err(FABPOOL_ERR_INVALID_ARG, "options.peers is 0x%x: only FABPOOL_FD_ANY_USER (0x%x) and "
                    "FABPOOL_FD_ANY_PID (0x%x) are known", o->peers, FABPOOL_FD_ANY_USER, FABPOOL_FD_ANY_PID);
    else if ((st = fabpool_fd_peers_env(&env_peers)) != FABPOOL_OK)
        sy_err_pool(st, "reading FABPOOL_PEERS");
    s->peer_flags = o->peers | env_peers;
    /* the group secret (rank 0's is the group's): from the kernel's generator only, never a weaker one */
    if (st == FABPOOL_OK && o->rank == 0 && getrandom(s->secret, sizeof s->secret, 0) != (ssize_t)sizeof s->secret)
        st = sy_err(FABPOOL_ERR_IO, "getrandom for the group secret: %s", strerror(errno));
    if (st == FABPOOL_OK && o->max_bytes == 0)
        st = sy_err(FABPOOL_ERR_INVALID_ARG, "max_bytes is 0");
    else if (st == FABPOOL_OK && o->bytes > o->max_bytes)
        st = sy_err(FABPOOL_ERR_LIMIT, "it asked for %llu bytes, past its max_bytes %llu",
                    (unsigned long long)o->bytes, (unsigned long long)o->max_bytes);
    if (st == FABPOOL_OK) {
        fabpool_options po;
        fabpool_options_init(&po);
        po.device = o->device;
        po.conf = o->conf;
        if ((st = fabpool_create(&po, &s->pool)) != FABPOOL_OK)
            sy_err_pool(st, "making its pool on device %d", o->device);
    }
    s->handle_type = s->pool ? (int)fabpool_handle_type_of(s->pool) : FABPOOL_HANDLE_NONE;
    int posix = s->handle_type == FABPOOL_HANDLE_POSIX_FD && s->nranks > 1;
    if (st == FABPOOL_OK && posix && s->transport == FABPOOL_TORCH_SYMM_FD_SOCKET) {
        char name[96];
        sy_sock_name(name, sizeof name, (int)getpid(), s->nonce);
        int fl = -1;
        if ((st = fabpool_fd_listen(name, &s->listener)) != FABPOOL_OK)
            sy_err_pool(st, "listening for its peers");
        else if ((fl = fcntl(s->listener, F_GETFL)) < 0 || fcntl(s->listener, F_SETFL, fl | O_NONBLOCK) != 0)
            st = sy_err(FABPOOL_ERR_IO, "making its listener non-blocking: %s", strerror(errno));
    }

    /* HELLO */
    struct {
        sy_head h;
        sy_hello m;
    } hello;
    memset(&hello, 0, sizeof hello);
    hello.m.max_bytes = o->max_bytes;
    hello.m.bytes = o->bytes;
    hello.m.nonce = s->nonce;
    hello.m.device = o->device;
    hello.m.handle_type = s->handle_type;
    hello.m.transport = s->transport;
    hello.m.pid = (int32_t)getpid();
    hello.m.yama = SY_YAMA_SCOPE();
    if (s->rank == 0)
        memcpy(hello.m.secret, s->secret, sizeof s->secret);
    memcpy(hello.m.host, s->host, sizeof hello.m.host);
    head_fail(&hello.h, st);
    uint8_t *all = NULL;
    st = sy_round(s, SY_HELLO, &hello, sizeof hello, &all);
    explicit_bzero(hello.m.secret, sizeof hello.m.secret);
    if (st != FABPOOL_OK)
        return sy_fail_create(s, st);
    for (size_t q = 0; q < n; q++)
        memcpy(&s->peers[q], all + q * sizeof hello + sizeof(sy_head), sizeof(sy_hello));
    memcpy(s->secret, s->peers[0].secret, sizeof s->secret);
    for (size_t q = 0; q < n; q++) {
        s->turns |= s->peers[q].yama == 1;
        explicit_bzero(s->peers[q].secret, sizeof s->peers[q].secret); /* kept once, in s->secret */
    }
    st = sy_outcome(s, all, sizeof hello, "fabpool_torch_symm_create");
    explicit_bzero(all, n * sizeof hello);
    free(all);
    uint64_t target = 0;
    if (st == FABPOOL_OK && (st = sy_check_hello(s, &target)) != FABPOOL_OK) {
        char keep[sizeof sy_msg];
        memcpy(keep, sy_msg, sizeof keep);
        sy_err(st, "fabpool_torch_symm_create: %s", keep);
    }
    if (st != FABPOOL_OK)
        return sy_fail_create(s, st);
    s->group = s->peers[0].nonce;

    /* MESH: the buffer and the sockets */
    sy_head h;
    memset(&h, 0, sizeof h);
    st = fabpool_buffer_create(s->pool, o->max_bytes, target, &s->buf);
    if (st != FABPOOL_OK)
        sy_err_pool(st, "making its buffer of %llu bytes (max %llu)", (unsigned long long)target,
                    (unsigned long long)o->max_bytes);
    fabpool_buffer_info bi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (s->buf)
        fabpool_buffer_get_info(s->buf, &bi);
    head_fail(&h, st);
    if (posix && s->transport == FABPOOL_TORCH_SYMM_FD_SOCKET)
        head_fail(&h, sy_mesh(s));
    if (posix && s->transport == FABPOOL_TORCH_SYMM_FD_PIDFD)
        head_fail(&h, sy_pidfd_open(s));
    h.v[0] = bi.max_size;
    h.v[1] = (uint64_t)(int64_t)s->token;
    if ((st = sy_round(s, SY_MESH, &h, sizeof h, &all)) != FABPOOL_OK)
        return sy_fail_create(s, st);
    st = sy_outcome(s, all, sizeof h, "fabpool_torch_symm_create");
    for (int q = 1; st == FABPOOL_OK && q < s->nranks; q++)
        if (head_v(all, sizeof h, q, 0) != head_v(all, sizeof h, 0, 0))
            st = sy_err(FABPOOL_ERR_CONFIG, "fabpool_torch_symm_create: the buffers' address windows differ (rank 0: "
                        "%llu bytes on device %d, rank %d: %llu bytes on device %d): the devices have different "
                        "granularities", (unsigned long long)head_v(all, sizeof h, 0, 0), s->peers[0].device, q,
                        (unsigned long long)head_v(all, sizeof h, q, 0), s->peers[q].device);
    for (int q = 0; q < s->nranks; q++) {
        int64_t t = (int64_t)head_v(all, sizeof h, q, 1);
        s->token_fd[q] = t >= 0 && t <= INT32_MAX ? (int32_t)t : -1;
    }
    free(all);
    if (st != FABPOOL_OK)
        return sy_fail_create(s, st);
    s->window = bi.max_size;
    s->size = target;

    /* every peer's buffer mapped here */
    int stage;
    if ((st = sy_exchange(s, "fabpool_torch_symm_create", &stage, 0, 1)) != FABPOOL_OK)
        return sy_fail_create(s, st);
    s->c.exchanges = 1;
    s->c.last_ns = now_ns() - t0;
    *out = s;
    return FABPOOL_OK;
}

/* --------------------------------------------------------------- resize */

/* After a failed step, this rank's buffer back to `old`, as every rank's.
 * `exported`: the step exported what it mapped, which no peer applied.
 * SY_LOST_SIZE where that fails (its size would differ from the others':
 * the exchange that follows breaks the object on every rank), else 0; the
 * message says so. */
static uint64_t sy_roll_back(fabpool_torch_symm_t *s, uint64_t old, int exported)
{
    char keep[sizeof sy_msg];
    memcpy(keep, sy_msg, sizeof keep);
    fabpool_status st = fabpool_buffer_resize(s->buf, old, NULL);
    fabpool_buffer_info bi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (st == FABPOOL_OK && exported && fabpool_buffer_get_info(s->buf, &bi) == FABPOOL_OK)
        /* the peers map what they had before the step, and never what it mapped: that may go at once */
        st = fabpool_buffer_peers_ack(s->buf, bi.generation);
    if (st != FABPOOL_OK) {
        sy_err_pool(st, "%s; then going back to %llu bytes failed too", keep, (unsigned long long)old);
        return SY_LOST_SIZE;
    }
    memcpy(sy_msg, keep, sizeof sy_msg);
    sy_append("; every rank keeps its old size (%llu bytes)", (unsigned long long)old);
    return 0;
}

/* After a step that some rank took and then rolled back: a shrink may have
 * refit a chunk and its rollback grown new memory behind it, which no view
 * maps yet, while the views still map the chunks given up.  One more
 * exchange brings every view to its peer's buffer as it is now (or empties
 * the views that cannot follow).  The call's message stays, with what this
 * exchange adds. */
static void sy_resettle(fabpool_torch_symm_t *s, const char *what, uint64_t lost)
{
    char keep[sizeof sy_msg];
    memcpy(keep, sy_msg, sizeof keep);
    int stage;
    fabpool_status st = sy_exchange(s, what, &stage, lost, 1);
    if (st == FABPOOL_OK) {
        memcpy(sy_msg, keep, sizeof sy_msg);
        sy_append(", and every view maps its peer's buffer as it is now");
        s->behind = 0;
        return;
    }
    char again[sizeof sy_msg];
    memcpy(again, sy_msg, sizeof again);
    memcpy(sy_msg, keep, sizeof sy_msg);
    sy_append("; then mapping the views again failed: %s", again);
    s->behind = 1;
}

fabpool_status fabpool_torch_symm_resize(fabpool_torch_symm_t *s, uint64_t bytes)
{
    if (!s)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_resize: the object is NULL");
    fabpool_status st = sy_forked(s, "fabpool_torch_symm_resize");
    if (st != FABPOOL_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    if (s->broken) {
        st = sy_err(FABPOOL_ERR_IO, "fabpool_torch_symm_resize: an earlier exchange of this buffer broke off (%s): "
                    "only close is left: every rank closes it, and the group creates the buffer again",
                    s->broken_msg);
        goto out;
    }
    uint64_t t0 = now_ns();
    s->seq++;
    s->op = SY_RESIZE;
    char what[96];
    snprintf(what, sizeof what, "fabpool_torch_symm_resize (call #%llu)", (unsigned long long)s->seq);

    /* ASK: the largest size asked wins */
    sy_head h;
    memset(&h, 0, sizeof h);
    h.v[0] = bytes;
    uint8_t *all = NULL;
    if ((st = sy_round(s, SY_ASK, &h, sizeof h, &all)) != FABPOOL_OK)
        goto out;
    uint64_t target = 0;
    int asker = 0;
    for (int q = 0; q < s->nranks; q++)
        if (head_v(all, sizeof h, q, 0) > target) {
            target = head_v(all, sizeof h, q, 0);
            asker = q;
        }
    free(all);
    if (target == 0) {
        st = sy_err(FABPOOL_ERR_INVALID_ARG, "%s: every rank asked for 0 bytes", what);
        goto out;
    }
    if (target > s->max_bytes) {
        st = sy_err(FABPOOL_ERR_LIMIT, "%s: rank %d asked for %llu bytes, past max_bytes %llu; nothing changed", what,
                    asker, (unsigned long long)target, (unsigned long long)s->max_bytes);
        goto out;
    }
    s->c.last_exported = s->c.last_imported = 0;
    if (target == s->size && !s->behind) {
        s->c.exchanges++;
        s->c.last_ns = now_ns() - t0;
        goto out;
    }
    uint64_t old = s->size;

    /* GROWN: all ranks resized, or none stays so */
    memset(&h, 0, sizeof h);
    fabpool_buffer_info b0 = {.struct_size = sizeof(fabpool_buffer_info)}, b1 = b0;
    (void)fabpool_buffer_get_info(s->buf, &b0);
    fabpool_status mine = fabpool_buffer_resize(s->buf, target, NULL);
    if (mine != FABPOOL_OK)
        head_fail(&h, sy_err_pool(mine, "resizing its buffer to %llu bytes", (unsigned long long)target));
    (void)fabpool_buffer_get_info(s->buf, &b1);
    h.v[0] = b1.generation != b0.generation; /* its chunks changed, even where the resize failed */
    if ((st = sy_round(s, SY_GROWN, &h, sizeof h, &all)) != FABPOOL_OK)
        goto out;
    st = sy_outcome(s, all, sizeof h, what);
    int took = 0; /* ranks whose resize went through, or changed their chunks */
    for (int q = 0; q < s->nranks; q++) {
        sy_head hq;
        memcpy(&hq, all + (size_t)q * sizeof h, sizeof hq);
        took += hq.status == FABPOOL_OK || hq.v[0] != 0;
    }
    free(all);
    if (st != FABPOOL_OK) {
        uint64_t lost = 0;
        /* a resize that lost a chunk (FABPOOL_ERR_PARTIAL) left its buffer at a size of its own: back too */
        if (mine == FABPOOL_OK || mine == FABPOOL_ERR_PARTIAL)
            lost = sy_roll_back(s, old, 0);
        else
            sy_append("; every rank keeps its old size (%llu bytes)", (unsigned long long)old);
        if (took > 0) /* every rank knows it: all of them exchange again */
            sy_resettle(s, what, lost);
        goto out;
    }

    int stage;
    st = sy_exchange(s, what, &stage, 0, 0);
    if (st != FABPOOL_OK && stage == SY_STAGE_EXPORT) {
        sy_resettle(s, what, sy_roll_back(s, old, 1));
        goto out;
    }
    if (st == FABPOOL_OK || stage == SY_STAGE_APPLY)
        s->size = target;
    s->behind = stage == SY_STAGE_APPLY;
    if (st == FABPOOL_OK) {
        s->c.exchanges++;
        s->c.last_ns = now_ns() - t0;
    } else if (stage == SY_STAGE_APPLY) {
        sy_append("; the buffers have the new size (%llu bytes), and the next resize brings the views that stayed "
                  "behind up to date", (unsigned long long)target);
    }
out:
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* -------------------------------------------------------------- getters */

/* One value per rank: its base address here (sizes 0) or the bytes of it mapped here (sizes 1). */
static fabpool_status sy_per_rank(fabpool_torch_symm_t *s, uint64_t *out, size_t n, int sizes)
{
    if (!s || !out || n < (size_t)s->nranks)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_%s: NULL, or room for %zu of %d ranks",
                      sizes ? "sizes" : "ptrs", n, s ? s->nranks : 0);
    fabpool_status st = sy_forked(s, sizes ? "fabpool_torch_symm_sizes" : "fabpool_torch_symm_ptrs");
    if (st != FABPOOL_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    for (int q = 0; q < s->nranks; q++) {
        fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
        if (!sizes)
            out[q] = (uint64_t)(uintptr_t)(q == s->rank ? fabpool_buffer_ptr(s->buf) : fabpool_view_ptr(s->views[q]));
        else
            out[q] = q == s->rank ? s->size
                     : s->views[q] && fabpool_view_get_info(s->views[q], &vi) == FABPOOL_OK ? vi.size
                                                                                           : 0;
    }
    pthread_mutex_unlock(&s->lock);
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_symm_ptrs(fabpool_torch_symm_t *s, uint64_t *ptrs, size_t n)
{
    return sy_per_rank(s, ptrs, n, 0);
}

fabpool_status fabpool_torch_symm_sizes(fabpool_torch_symm_t *s, uint64_t *sizes, size_t n)
{
    return sy_per_rank(s, sizes, n, 1);
}

fabpool_status fabpool_torch_symm_get_info(fabpool_torch_symm_t *s, fabpool_torch_symm_info *out)
{
    if (!s || !out)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_get_info: NULL");
    if (out->struct_size != sizeof *out)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_get_info: info.struct_size is %u, not %zu: set it "
                      "to sizeof(fabpool_torch_symm_info) of this library's symm.h", out->struct_size, sizeof *out);
    fabpool_status st = sy_forked(s, "fabpool_torch_symm_get_info");
    if (st != FABPOOL_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    *out = s->c;
    out->struct_size = sizeof *out;
    out->rank = s->rank;
    out->nranks = s->nranks;
    out->device = s->device;
    out->handle_type = s->handle_type;
    out->fd_transport = s->transport;
    out->size = s->size;
    out->max_bytes = s->window;
    out->acked = s->acked;
    fabpool_buffer_info bi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (fabpool_buffer_get_info(s->buf, &bi) == FABPOOL_OK) {
        out->mapped = bi.mapped;
        out->generation = bi.generation;
    }
    uint64_t vb = 0;
    for (int q = 0; q < s->nranks; q++) {
        fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
        if (s->views[q] && fabpool_view_get_info(s->views[q], &vi) == FABPOOL_OK)
            vb += vi.mapped;
    }
    out->view_bytes = vb;
    pthread_mutex_unlock(&s->lock);
    return FABPOOL_OK;
}

fabpool_status fabpool_torch_symm_dmabuf(fabpool_torch_symm_t *s, uint64_t offset, uint64_t size, int *fd)
{
    if (fd)
        *fd = -1;
    if (!s || !fd)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_dmabuf: NULL");
    fabpool_status st = sy_forked(s, "fabpool_torch_symm_dmabuf");
    if (st != FABPOOL_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    st = fabpool_buffer_dmabuf(s->buf, offset, size, fd);
    if (st != FABPOOL_OK)
        sy_err_pool(st, "fabpool_torch_symm_dmabuf");
    pthread_mutex_unlock(&s->lock);
    return st;
}

fabpool_status fabpool_torch_symm_close(fabpool_torch_symm_t *s)
{
    if (!s)
        return FABPOOL_OK;
    fabpool_status st = sy_free(s);
    if (st != FABPOOL_OK) {
        char keep[sizeof sy_msg];
        memcpy(keep, sy_msg, sizeof keep);
        sy_err(st, "fabpool_torch_symm_close: %s", keep);
    }
    return st;
}
