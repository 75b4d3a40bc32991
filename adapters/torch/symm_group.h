/* symm_group.h - the group the symmetric buffer's tests (test_symm.c, test_symm_faults.c) run in: up to
 * MAXR forked ranks whose parent is their all-gather, a hub over a socket pair per rank that never touches
 * CUDA.  Include after testutil.h. */
#ifndef FP_SYMM_GROUP_H
#define FP_SYMM_GROUP_H

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 8

static int io_all(int fd, void *p, size_t n, int out)
{
    for (size_t k = 0; k < n;) {
        ssize_t r = out ? write(fd, (char *)p + k, n - k) : read(fd, (char *)p + k, n - k);
        if (r <= 0)
            return -1;
        k += (size_t)r;
    }
    return 0;
}

/* a rank: its end of the hub, its number, and how many ranks the group has */
typedef struct grp {
    int fd, rank, n;
} grp;

/* The rank's side of the hub: its bytes out, everyone's back (length 0: a rank has left). */
static int allgather(void *ctx, const void *send, void *recv, size_t bytes)
{
    grp *g = ctx;
    uint64_t len = bytes;
    if (io_all(g->fd, &len, 8, 1) || io_all(g->fd, (void *)send, bytes, 1) || io_all(g->fd, &len, 8, 0) ||
        len != (uint64_t)g->n * bytes)
        return 1;
    return io_all(g->fd, recv, len, 0);
}

/* Runs fn in n forked ranks (the driver initialised in each), the parent as their all-gather: one message
 * from every rank, then all of them to every rank; a rank gone ends the group.  The ranks that failed. */
static int run_group(int n, void (*fn)(grp *, void *), void *arg)
{
    int sv[MAXR][2];
    pid_t pid[MAXR];
    for (int r = 0; r < n; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]) != 0)
            return n;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            for (int q = 0; q < n; q++) {
                close(sv[q][0]);
                if (q != r)
                    close(sv[q][1]);
            }
            grp g = {sv[r][1], r, n};
            t_driver_init();
            fn(&g, arg);
            close(sv[r][1]);
            exit(t_failures ? 1 : 0); /* exit, not _exit: the leak checkers look at the end */
        }
    }
    for (int r = 0; r < n; r++)
        close(sv[r][1]);
    signal(SIGPIPE, SIG_IGN); /* the last round's answer goes to ranks that have left */
    static uint8_t in[MAXR][1 << 17], all[MAXR << 17];
    int live = 1;
    while (live) {
        uint64_t len[MAXR];
        for (int r = 0; r < n && live; r++)
            if (io_all(sv[r][0], &len[r], 8, 0) || len[r] > sizeof in[r] || io_all(sv[r][0], in[r], len[r], 0))
                live = 0;
        uint64_t total = 0;
        for (int r = 0; live && r < n; r++) {
            memcpy(all + total, in[r], len[r]);
            total += len[r];
        }
        for (int r = 0; r < n; r++) {
            uint64_t t = live ? total : 0;
            if (io_all(sv[r][0], &t, 8, 1) == 0 && live)
                io_all(sv[r][0], all, total, 1);
        }
    }
    for (int r = 0; r < n; r++) /* a rank still in the group reads the end of it, not a wait */
        close(sv[r][0]);
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pid[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

/* The options of this rank's create in the group: its rank, the all-gather ag over g, the sizes, the rest the
 * defaults.  Needs symm.h. */
static inline fabpool_torch_symm_options symm_group_options(grp *g, fabpool_torch_symm_allgather_fn ag, uint64_t max,
                                                            uint64_t bytes)
{
    fabpool_torch_symm_options o;
    fabpool_torch_symm_options_init(&o);
    o.rank = g->rank;
    o.nranks = g->n;
    o.max_bytes = max;
    o.bytes = bytes;
    o.allgather = ag;
    o.allgather_ctx = g;
    return o;
}

/* This rank's create with options o: the object, or NULL after a failed check (the message printed). */
static inline fabpool_torch_symm_t *symm_group_create(grp *g, const fabpool_torch_symm_options *o)
{
    fabpool_torch_symm_t *s = NULL;
    fabpool_status st = fabpool_torch_symm_create(o, &s);
    if (st != FABPOOL_OK)
        fprintf(stderr, "rank %d: create -> %s: %s\n", g->rank, fabpool_status_name(st),
                fabpool_torch_symm_last_error());
    CHECK(st == FABPOOL_OK);
    return s;
}

#endif
