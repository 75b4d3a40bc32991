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
 *                   handle type, fd transport, host, pid, socket nonce)
 *           MESH   (its buffer made, the sockets to its host's peers
 *                   connected; the buffer's address window)
 *           then the exchange below, with full descriptors.
 *   resize: ASK    (the size asked; every rank takes the largest)
 *           GROWN  (its buffer resized: all or none stay resized)
 *           then the exchange.
 *   exchange: EXPORTED (its descriptor exported since the generation every
 *                   peer has; its length and fd count)
 *           DESC   (the descriptors, and for pidfd the exporter's fd numbers;
 *                   the fds go over the sockets after this round)
 *           APPLIED (each peer's descriptor applied here: the generation of
 *                   every view; each exporter acknowledges the smallest).
 *
 * Built on fabpool's public API only (fabpool.h, fabpool_fdpass.h); no
 * driver call of its own. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "fabpool.h"
#include "symm.h"

#define SY_MAGIC 0x59535046u /* "FPSY" */
#define SY_VERSION 1u
#define SY_ERR 240           /* bytes of a rank's message carried in its head */
#define SY_HOST 64
#define SY_TIMEOUT_MS 30000
#define SY_REC_HDR FABPOOL_DESC_HEADER_BYTES
#define SY_REC FABPOOL_DESC_RECORD_BYTES

enum { SY_CREATE = 1, SY_RESIZE = 2 };
enum { SY_HELLO = 1, SY_MESH, SY_ASK, SY_GROWN, SY_EXPORTED, SY_DESC, SY_APPLIED };
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
    uint64_t group;          /* rank 0's nonce (0 in HELLO): which object */
    uint64_t v[2];           /* the round's values */
    char err[SY_ERR];        /* this rank's message where status is not FABPOOL_OK */
} sy_head;

typedef struct sy_hello {
    uint64_t max_bytes, bytes, nonce;
    int32_t device, handle_type, transport, pid;
    char host[SY_HOST];
} sy_hello;

/* What a connecting rank says first over a socket. */
typedef struct sy_ident {
    uint64_t group;
    int32_t rank, pad;
} sy_ident;

struct fabpool_torch_symm {
    pthread_mutex_t lock;
    int rank, nranks, device, transport, timeout_ms, handle_type;
    fabpool_torch_symm_allgather_fn allgather;
    void *actx;
    fabpool_t *pool;
    fabpool_buffer_t *buf;
    fabpool_view_t **views;  /* [nranks], NULL for this rank */
    int *sock;               /* [nranks], -1 where none */
    int listener;
    sy_hello *peers;         /* [nranks]: every rank's HELLO */
    uint64_t *gens;          /* [nranks]: scratch, the generation of each view here */
    uint8_t *desc;
    size_t desc_cap;
    int *fds, *rfds;
    size_t fd_cap, rfd_cap;
    uint64_t max_bytes, size, window, acked, acked_told, seq, group, nonce;
    uint8_t op;
    int broken;              /* an exchange broke off: only close is left */
    int behind;              /* the last exchange left some view behind (every rank knows): the next resize
                                exchanges even at the same size */
    char broken_msg[512];
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
    static const char *names[] = {"?", "hello", "mesh", "ask", "grown", "exported", "desc", "applied"};
    return p >= 1 && p <= SY_APPLIED ? names[p] : names[0];
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

/* Waits up to the timeout for sock to be readable. */
static int sy_wait_readable(int sock, int timeout_ms)
{
    struct pollfd p = {sock, POLLIN, 0};
    int r;
    do
        r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    return r > 0;
}

/* Connects to every peer of this host above this rank, and accepts every
 * one below (each says who it is and which object).  Every connection is
 * tried even after one failed. */
static fabpool_status sy_mesh(fabpool_torch_symm_t *s)
{
    fabpool_status st = FABPOOL_OK;
    char name[96];
    for (int q = s->rank + 1; q < s->nranks; q++) {
        if (!same_host(s, q))
            continue;
        sy_sock_name(name, sizeof name, s->peers[q].pid, s->peers[q].nonce);
        sy_ident id = {s->group, s->rank, 0};
        fabpool_status sq = fabpool_fd_connect(name, &s->sock[q], s->timeout_ms);
        if (sq == FABPOOL_OK)
            sq = fabpool_fd_send(s->sock[q], NULL, 0, &id, sizeof id);
        if (sq != FABPOOL_OK && st == FABPOOL_OK)
            st = sy_err_pool(FABPOOL_ERR_IO, "cannot reach rank %d (pid %d, host '%s') over its Unix socket '@%s' "
                             "(the ranks of a host must share a network namespace for abstract sockets; else use the "
                             "pidfd transport)", q, s->peers[q].pid, s->peers[q].host, name);
    }
    int need = 0;
    for (int q = 0; q < s->rank; q++)
        need += same_host(s, q);
    while (need > 0 && s->listener >= 0) {
        if (!sy_wait_readable(s->listener, s->timeout_ms)) {
            char missing[256] = "";
            for (int q = 0; q < s->rank; q++)
                if (same_host(s, q) && s->sock[q] < 0)
                    snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%d", *missing ? ", " : "",
                             q);
            if (st == FABPOOL_OK)
                st = sy_err(FABPOOL_ERR_IO, "rank(s) %s of this host did not connect within %d ms to this rank's Unix "
                            "socket (another network namespace? then use the pidfd transport)", missing,
                            s->timeout_ms);
            break;
        }
        int c = -1;
        if (fabpool_fd_accept(s->listener, &c) != FABPOOL_OK)
            continue;
        sy_ident id = {0, -1, 0};
        size_t n = 0, len = 0;
        int ok = sy_wait_readable(c, s->timeout_ms) &&
                 fabpool_fd_recv(c, NULL, 0, &n, &id, sizeof id, &len) == FABPOOL_OK && len == sizeof id &&
                 id.group == s->group && id.rank >= 0 && id.rank < s->rank && same_host(s, id.rank) &&
                 s->sock[id.rank] < 0;
        if (!ok) {
            close(c); /* not a peer of this object */
            continue;
        }
        s->sock[id.rank] = c;
        need--;
    }
    if (s->listener >= 0)
        close(s->listener);
    s->listener = -1;
    return st;
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
    if (s->listener >= 0)
        close(s->listener);
    free(s->views);
    free(s->sock);
    free(s->peers);
    free(s->gens);
    free(s->desc);
    free(s->fds);
    free(s->rfds);
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

/* The fds of rank q's descriptor (nfds of them) into s->rfds: received over
 * its socket, or copied out of it by pidfd_getfd. */
static fabpool_status sy_peer_fds(fabpool_torch_symm_t *s, int q, const uint8_t *fdnums, size_t nfds)
{
    fabpool_status st = sy_reserve((void **)&s->rfds, &s->rfd_cap, nfds, sizeof(int));
    if (st != FABPOOL_OK || nfds == 0)
        return st;
    if (s->transport == FABPOOL_TORCH_SYMM_FD_PIDFD) {
        for (size_t i = 0; i < nfds; i++) {
            int32_t theirs;
            memcpy(&theirs, fdnums + 4 * i, 4);
            if ((st = fabpool_fd_from_pid(s->peers[q].pid, theirs, &s->rfds[i])) != FABPOOL_OK) {
                for (size_t k = 0; k < i; k++)
                    close(s->rfds[k]);
                return sy_err_pool(FABPOOL_ERR_IO, "cannot copy rank %d's fds (pid %d) by pidfd_getfd: it needs ptrace "
                                   "permission (same user; Yama ptrace_scope 0 or 1; a seccomp filter that allows "
                                   "pidfd_getfd); else use the socket transport", q, s->peers[q].pid);
            }
        }
        return FABPOOL_OK;
    }
    size_t got = 0, len = 0;
    uint64_t their_seq = 0;
    if (!sy_wait_readable(s->sock[q], s->timeout_ms))
        return sy_err(FABPOOL_ERR_IO, "rank %d's fds did not come within %d ms over its socket", q, s->timeout_ms);
    st = fabpool_fd_recv(s->sock[q], s->rfds, nfds, &got, &their_seq, sizeof their_seq, &len);
    if (st == FABPOOL_OK && (got != nfds || len != sizeof their_seq || their_seq != s->seq))
        st = sy_err(FABPOOL_ERR_IO, "rank %d sent %zu fds for call #%llu, this rank expected %zu for call #%llu", q, got,
                    (unsigned long long)their_seq, nfds, (unsigned long long)s->seq);
    else if (st != FABPOOL_OK)
        sy_err_pool(FABPOOL_ERR_IO, "receiving rank %d's fds over its socket", q);
    if (st != FABPOOL_OK)
        for (size_t k = 0; k < got && k < nfds; k++)
            close(s->rfds[k]);
    return st == FABPOOL_OK ? st : FABPOOL_ERR_IO;
}

/* Applies rank q's message of the DESC round here; the generation of the
 * view after it (0 if it failed: the next exchange sends a full one). */
static fabpool_status sy_apply(fabpool_torch_symm_t *s, int q, const uint8_t *msg, size_t len, size_t nfds)
{
    const uint8_t *desc = msg + sizeof(sy_head);
    size_t nf = s->handle_type == FABPOOL_HANDLE_POSIX_FD ? nfds : 0;
    s->gens[q] = 0;
    fabpool_status st = nf ? sy_peer_fds(s, q, desc + len, nf) : FABPOOL_OK;
    if (st != FABPOOL_OK)
        return st;
    const int *fds = nf ? s->rfds : NULL;
    st = s->views[q] ? fabpool_view_apply(s->views[q], desc, len, fds, nf)
                     : fabpool_view_open(s->pool, desc, len, fds, nf, &s->views[q]);
    if (st != FABPOOL_OK)
        return sy_err_pool(st, "mapping rank %d's buffer (host '%s', device %d) here on device %d", q,
                           s->peers[q].host, s->peers[q].device, s->device);
    fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
    if (fabpool_view_get_info(s->views[q], &vi) == FABPOOL_OK)
        s->gens[q] = vi.generation;
    s->c.last_imported += len > SY_REC_HDR ? (len - SY_REC_HDR) / SY_REC : 0;
    return FABPOOL_OK;
}

/* Exports, all-gathers the descriptors, passes the fds, applies every
 * peer's and acknowledges.  On failure *stage says where: SY_STAGE_EXPORT
 * (some rank could not export: nothing was applied anywhere) or
 * SY_STAGE_APPLY (some rank could not apply a peer's: its view of that
 * peer stays as it was); 0 for a broken exchange. */
static fabpool_status sy_exchange(fabpool_torch_symm_t *s, const char *what, int *stage)
{
    *stage = 0;
    s->c.last_exported = s->c.last_imported = 0;
    if (s->nranks == 1)
        return FABPOOL_OK;
    size_t hs = sizeof(sy_head);
    int pidfd = s->transport == FABPOOL_TORCH_SYMM_FD_PIDFD && s->handle_type == FABPOOL_HANDLE_POSIX_FD;
    size_t len = 0, nfds = 0;
    uint8_t *all = NULL;

    /* EXPORTED */
    sy_head h;
    memset(&h, 0, sizeof h);
    head_fail(&h, sy_export(s, &len, &nfds));
    h.v[0] = len;
    h.v[1] = nfds;
    fabpool_status st = sy_round(s, SY_EXPORTED, &h, hs, &all);
    if (st != FABPOOL_OK)
        return st;
    /* every rank's descriptor length and fd count */
    size_t payload = 0;
    uint64_t *lens = malloc(2 * sizeof(uint64_t) * (size_t)s->nranks), *nfds_of = lens ? lens + s->nranks : NULL;
    for (int q = 0; lens && q < s->nranks; q++) {
        lens[q] = head_v(all, hs, q, 0);
        nfds_of[q] = head_v(all, hs, q, 1);
        size_t p = lens[q] + (pidfd ? 4 * nfds_of[q] : 0);
        payload = p > payload ? p : payload;
    }
    st = sy_outcome(s, all, hs, what);
    free(all);
    if (st != FABPOOL_OK || !lens) {
        free(lens);
        (void)fabpool_buffer_export_done(s->buf);
        *stage = SY_STAGE_EXPORT;
        return st != FABPOOL_OK ? st : sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for the exchange"));
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

    /* the fds: to every peer of this host first, then from each */
    fabpool_status mine_st = FABPOOL_OK;
    if (s->handle_type == FABPOOL_HANDLE_POSIX_FD && !pidfd && nfds > 0)
        for (int q = 0; q < s->nranks; q++) {
            if (q == s->rank || s->sock[q] < 0)
                continue;
            fabpool_status t = fabpool_fd_send(s->sock[q], s->fds, nfds, &s->seq, sizeof s->seq);
            if (t == FABPOOL_OK)
                s->c.fds_sent += nfds;
            else if (mine_st == FABPOOL_OK)
                mine_st = sy_err_pool(FABPOOL_ERR_IO, "sending its fds to rank %d", q);
        }
    for (int q = 0; q < s->nranks; q++) {
        if (q == s->rank)
            continue;
        size_t qlen = lens[q];
        if (s->handle_type == FABPOOL_HANDLE_POSIX_FD && !pidfd && s->sock[q] < 0 && nfds_of[q] > 0) {
            if (mine_st == FABPOOL_OK)
                mine_st = sy_err(FABPOOL_ERR_IO, "no socket to rank %d for its fds", q);
            s->gens[q] = 0;
            continue;
        }
        fabpool_status t = sy_apply(s, q, all + (size_t)q * msg, qlen, nfds_of[q]);
        if (t != FABPOOL_OK && mine_st == FABPOOL_OK)
            mine_st = t;
    }
    s->c.records_imported += s->c.last_imported;
    free(all);
    free(lens);

    /* APPLIED: the generation of every view, so that each exporter learns what all its peers hold */
    size_t amsg = hs + sizeof(uint64_t) * (size_t)s->nranks;
    mine = calloc(1, amsg);
    if (!mine)
        return sy_break(s, sy_err(FABPOOL_ERR_HOST_MEMORY, "no host memory for the exchange"));
    head_fail((sy_head *)mine, mine_st);
    memcpy(mine + hs, s->gens, sizeof(uint64_t) * (size_t)s->nranks);
    st = sy_round(s, SY_APPLIED, mine, amsg, &all);
    free(mine);
    if (st != FABPOOL_OK)
        return st;
    uint64_t least = UINT64_MAX;
    for (int q = 0; q < s->nranks; q++) {
        if (q == s->rank)
            continue;
        uint64_t g;
        memcpy(&g, all + (size_t)q * amsg + hs + sizeof(uint64_t) * (size_t)s->rank, sizeof g);
        least = g < least ? g : least;
    }
    st = sy_outcome(s, all, amsg, what);
    free(all);
    s->acked = least;
    (void)fabpool_buffer_export_done(s->buf); /* every peer has imported its copies (or failed to) */
    if (least > s->acked_told) {
        fabpool_status t = fabpool_buffer_peers_ack(s->buf, least);
        if (t != FABPOOL_OK && st == FABPOOL_OK)
            return sy_break(s, sy_err_pool(t, "%s: acknowledging generation %llu", what, (unsigned long long)least));
        s->acked_told = least;
    }
    if (st != FABPOOL_OK)
        *stage = SY_STAGE_APPLY;
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
    s->listener = -1;
    s->views = calloc(n, sizeof *s->views);
    s->sock = malloc(n * sizeof *s->sock);
    s->peers = calloc(n, sizeof *s->peers);
    s->gens = calloc(n, sizeof *s->gens);
    for (size_t q = 0; s->sock && q < n; q++)
        s->sock[q] = -1;
    if (!s->views || !s->sock || !s->peers || !s->gens)
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
    if (o->max_bytes == 0)
        st = sy_err(FABPOOL_ERR_INVALID_ARG, "max_bytes is 0");
    else if (o->bytes > o->max_bytes)
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
        if ((st = fabpool_fd_listen(name, &s->listener)) != FABPOOL_OK)
            sy_err_pool(st, "listening for its peers");
    }
    if (st == FABPOOL_OK && posix && s->transport == FABPOOL_TORCH_SYMM_FD_PIDFD)
        (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* Yama ptrace_scope 1: the peers may copy fds */

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
    memcpy(hello.m.host, s->host, sizeof hello.m.host);
    head_fail(&hello.h, st);
    uint8_t *all = NULL;
    if ((st = sy_round(s, SY_HELLO, &hello, sizeof hello, &all)) != FABPOOL_OK)
        return sy_fail_create(s, st);
    for (size_t q = 0; q < n; q++)
        memcpy(&s->peers[q], all + q * sizeof hello + sizeof(sy_head), sizeof(sy_hello));
    st = sy_outcome(s, all, sizeof hello, "fabpool_torch_symm_create");
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
    h.v[0] = bi.max_size;
    if ((st = sy_round(s, SY_MESH, &h, sizeof h, &all)) != FABPOOL_OK)
        return sy_fail_create(s, st);
    st = sy_outcome(s, all, sizeof h, "fabpool_torch_symm_create");
    for (int q = 1; st == FABPOOL_OK && q < s->nranks; q++)
        if (head_v(all, sizeof h, q, 0) != head_v(all, sizeof h, 0, 0))
            st = sy_err(FABPOOL_ERR_CONFIG, "fabpool_torch_symm_create: the buffers' address windows differ (rank 0: "
                        "%llu bytes on device %d, rank %d: %llu bytes on device %d): the devices have different "
                        "granularities", (unsigned long long)head_v(all, sizeof h, 0, 0), s->peers[0].device, q,
                        (unsigned long long)head_v(all, sizeof h, q, 0), s->peers[q].device);
    free(all);
    if (st != FABPOOL_OK)
        return sy_fail_create(s, st);
    s->window = bi.max_size;
    s->size = target;

    /* every peer's buffer mapped here */
    int stage;
    if ((st = sy_exchange(s, "fabpool_torch_symm_create", &stage)) != FABPOOL_OK)
        return sy_fail_create(s, st);
    s->c.exchanges = 1;
    s->c.last_ns = now_ns() - t0;
    *out = s;
    return FABPOOL_OK;
}

/* --------------------------------------------------------------- resize */

/* After a failed step, this rank's buffer back to `old`, as every rank's;
 * the object breaks if that fails (its size would differ from the others').
 * `exported`: the step exported what it mapped, which no peer applied. */
static void sy_roll_back(fabpool_torch_symm_t *s, uint64_t old, int exported)
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
        (void)sy_break(s, st);
        return;
    }
    memcpy(sy_msg, keep, sizeof sy_msg);
    sy_append("; every rank keeps its old size (%llu bytes)", (unsigned long long)old);
}

fabpool_status fabpool_torch_symm_resize(fabpool_torch_symm_t *s, uint64_t bytes)
{
    if (!s)
        return sy_err(FABPOOL_ERR_INVALID_ARG, "fabpool_torch_symm_resize: the object is NULL");
    pthread_mutex_lock(&s->lock);
    fabpool_status st;
    if (s->broken) {
        st = sy_err(FABPOOL_ERR_IO, "fabpool_torch_symm_resize: an earlier exchange of this buffer broke off (%s): "
                    "only close is left", s->broken_msg);
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
    fabpool_status mine = fabpool_buffer_resize(s->buf, target, NULL);
    if (mine != FABPOOL_OK)
        head_fail(&h, sy_err_pool(mine, "resizing its buffer to %llu bytes", (unsigned long long)target));
    if ((st = sy_round(s, SY_GROWN, &h, sizeof h, &all)) != FABPOOL_OK)
        goto out;
    st = sy_outcome(s, all, sizeof h, what);
    free(all);
    if (st != FABPOOL_OK) {
        if (mine == FABPOOL_OK)
            sy_roll_back(s, old, 0);
        else
            sy_append("; every rank keeps its old size (%llu bytes)", (unsigned long long)old);
        goto out;
    }

    int stage;
    st = sy_exchange(s, what, &stage);
    if (st != FABPOOL_OK && stage == SY_STAGE_EXPORT) {
        sy_roll_back(s, old, 1);
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
    pthread_mutex_lock(&s->lock);
    *out = s->c;
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
    pthread_mutex_lock(&s->lock);
    fabpool_status st = fabpool_buffer_dmabuf(s->buf, offset, size, fd);
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
