/* symm_pass.h - the fds of one exchange of the symmetric buffer (symm.c) over its Unix sockets, to every peer
 * and from every peer at once, under one deadline (symm_pass.c).  Internal to libfabpool_torch.so. */
#ifndef FP_SYMM_PASS_H
#define FP_SYMM_PASS_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"

/* fds on one message at most.  The kernel counts every fd in flight on Unix sockets against the sender's user
 * and its RLIMIT_NOFILE (ETOOMANYREFS past it, unless it has CAP_SYS_RESOURCE), and takes at most SCM_MAX_FD
 * (253) on one sendmsg: a rank has one message in flight at a time, so a group of n ranks has at most
 * n * SY_PASS_BATCH fds in flight, whatever the size of its buffers (fewer a message where that would pass
 * half of RLIMIT_NOFILE). */
#define SY_PASS_BATCH 64

/* One peer of the pass.  The caller fills sock, out, in and fds; the pass fills the rest. */
typedef struct sy_pass_peer {
    int sock;          /* the socket to this peer; -1: none, nothing passes (this rank's own entry) */
    size_t out;        /* fds this rank sends it: the first `out` of the pass's fds */
    size_t in;         /* fds it sends this rank ... */
    int *fds;          /* ... into fds[0..in), for the caller's `took` once all are in */
    size_t sent, got;  /* fds sent to it, and received from it */
    fabpool_status st; /* FABPOOL_OK, or the pair's failure: its message in err, the socket shut down */
    char err[512];
    /* the pass's own */
    size_t off;        /* bytes of the message going out that are out (0: none going out) */
    size_t cur;        /* fds of the message going out */
    int wait, hup, taken;
} sy_pass_peer;

/* Told that every fd of peer q is in, in fds[0..in): they are the caller's from then on, failed or not. */
typedef void (*sy_pass_took_fn)(void *ctx, int q, int *fds);

/* Passes the fds of one exchange (call number seq) between this rank (self) and its peers p[0..n):
 * fds[0..p[q].out) to each, p[q].in from each, all by deadline_ns (CLOCK_MONOTONIC; timeout_ms is what it was,
 * for messages).  In turn k (1 to n - 1) this rank sends to self + k and receives from self - k (mod n), both at
 * once; each peer's fds go to `took` as soon as they are all in, so that a rank holds the fds of one peer at a
 * time while the caller maps them.  Nothing waits past the deadline: the sends do not block, and each message
 * goes out only once the peers read the last one (SIOCOUTQ), so that a peer that stops reading fails the pair
 * in time instead of filling the socket; a peer that left unread what this rank sent it in an earlier pass
 * fails at once.  Every message a peer sends is checked before its fds are taken (its head, then
 * fabpool_fd_recv_timed's bounds, then the call's number).  A pair that fails has its socket shut down, so that
 * the peer sees the end at once, and the fds received from it that `took` did not get are closed; a pair is
 * still tried after another failed, by the same deadline. */
void sy_pass(sy_pass_peer *p, int n, int self, const int *fds, uint64_t seq, uint64_t deadline_ns, int timeout_ms,
             sy_pass_took_fn took, void *ctx);

#endif
