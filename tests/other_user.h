/* other_user.h - a forked child that runs as another user (uid and gid
 * 65534, "nobody"), as an attacker on the same host would: for the tests of
 * what a process of another user can and cannot get (docs/security.md).
 * Needs root to drop to that user; elsewhere other_user_can() is 0 and the
 * test skips what needs it, saying so. */
#ifndef FP_OTHER_USER_H
#define FP_OTHER_USER_H

#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_USER_UID 65534

/* Whether this process can start a child as another user (it runs as root). */
static inline int other_user_can(void) { return geteuid() == 0; }

/* Forks a child that drops to uid/gid `uid` (not 0) and returns fn(arg) as its exit status; *pid gets the
 * child's pid.  The child dies with its parent.  For an attack from several users at once. */
static inline int other_user_fork_as(unsigned uid, int (*fn)(void *), void *arg, pid_t *pid)
{
    fflush(stdout);
    fflush(stderr);
    pid_t c = fork();
    if (c < 0)
        return -1;
    if (c == 0) {
        if (uid == 0 || setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0 || geteuid() != uid) {
            fprintf(stderr, "other_user_fork: dropping to uid %u: %s\n", uid, uid == 0 ? "uid 0 is root" : strerror(errno));
            _exit(120);
        }
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* after the uid change, which clears it */
        if (getppid() == 1)
            _exit(121); /* the parent is already gone */
        _exit(fn(arg) & 0xff);
    }
    *pid = c;
    return 0;
}

/* A child of uid/gid 65534, as other_user_fork_as. */
static inline int other_user_fork(int (*fn)(void *), void *arg, pid_t *pid)
{
    return other_user_fork_as(OTHER_USER_UID, fn, arg, pid);
}

/* The child's exit status (-1 if it died of a signal). */
static inline int other_user_wait(pid_t pid)
{
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0)
        ;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

#endif
