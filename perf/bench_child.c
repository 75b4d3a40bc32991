/* bench_child.c - the PyTorch columns' child processes: each runs the cases
 * its parent sends (bench_remote_case) with the PyTorch caching allocator of
 * its own PYTORCH_CUDA_ALLOC_CONF, and answers with their results.  The
 * parent starts it in bench_setup_allocators (bench_alloc.c). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

int bench_child_main(int kind, int fd_in, int fd_out)
{
    signal(SIGPIPE, SIG_IGN);
    char msg[300];
    memset(msg, 0, sizeof msg);
    int st = bench_torch_local(kind, msg, sizeof msg);
    if (write(fd_out, &st, sizeof st) != (ssize_t)sizeof st || write(fd_out, msg, sizeof msg) != (ssize_t)sizeof msg)
        return 1;
    if (st)
        return 1;
    balloc *a = &allocs[kind];
    bcase c;
    static bresult r;
    while (read(fd_in, &c, sizeof c) == (ssize_t)sizeof c) {
        memset(&r, 0, sizeof r);
        bench_run_case(a, &c, &r);
        a->cold(a); /* empties PyTorch's cache between cases */
        const char *p = (const char *)&r;
        size_t left = sizeof r;
        while (left) {
            ssize_t w = write(fd_out, p, left);
            if (w <= 0)
                return 1;
            p += w;
            left -= (size_t)w;
        }
    }
    return 0;
}

/* Runs a case in the child and reads its result. */
int bench_remote_case(balloc *a, const bcase *c, bresult *r)
{
    if (write(a->child_out, c, sizeof *c) != (ssize_t)sizeof *c)
        goto dead;
    char *p = (char *)r;
    size_t left = sizeof *r;
    while (left) {
        ssize_t n = read(a->child_in, p, left);
        if (n <= 0)
            goto dead;
        p += n;
        left -= (size_t)n;
    }
    return 0;
dead:
    memset(r, 0, sizeof *r);
    snprintf(r->error, sizeof r->error, "the PyTorch child process died (see stderr)");
    a->unavailable = "the PyTorch child process died during the run";
    return -1;
}
