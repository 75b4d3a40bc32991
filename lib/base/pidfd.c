/* pidfd.c - copies of another process's fds by pidfd_getfd, with the ptrace
 * permission they need (Yama's consent for one pid or every process of the
 * user) and a sealed memfd as the proof that the process copied from is the
 * group's (include/fabpool_fdpass.h).  Layer base.  Calls: error. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "error.h"

#define FP_TOKEN_MAX 64
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020 /* Linux 6.3: added by the kernel to memfds where vm.memfd_noexec asks it */
#endif
#define FP_TOKEN_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

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
               "the user; the HybridEP adapter names its parent, the launcher, unless FABPOOL_HYBRIDEP_PTRACER says "
               "otherwise: docs/security.md), or "
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
/* The pid a pidfd names (-1 once that process is reaped); -2 where fd is no
 * pidfd (a pidfd's fdinfo has a Pid: line, other files' have none). */
static int pid_of_pidfd(int pidfd)
{
    char path[64], buf[1024];
    if (pidfd < 0)
        return -2;
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -2;
    ssize_t r = read(f, buf, sizeof buf - 1);
    close(f);
    if (r <= 0)
        return -2;
    buf[r] = '\0';
    const char *p = strstr(buf, "\nPid:");
    if (!p)
        return -2;
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
        /* FABPOOL_ERR_IO for ENOSYS too (a kernel or valgrind without pidfd_open): the message says which */
        return fp_error(FABPOOL_ERR_IO, "pidfd_open(%d): %s: %s", pid, strerror(e), pidfd_advice(e, ptrace_scope()));
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
    return fp_error(FABPOOL_ERR_IO, "pidfd_getfd(%d, %d): %s: %s", pid, fd,
                    strerror(e), pidfd_advice(e, ptrace_scope()));
}

fabpool_status fabpool_fd_from_pidfd(int pidfd, int fd, int *out)
{
    if (!out || fd < 0)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_from_pidfd: %s", !out ? "out is NULL" : "fd < 0");
    int r = getfd(pidfd, fd);
    if (r < 0) {
        int e = errno, pid = pid_of_pidfd(pidfd);
        if (pid == -2)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_from_pidfd: fd %d is not a pidfd "
                            "(fabpool_fd_pidfd_open makes one)", pidfd);
        return getfd_error(pid, fd, e);
    }
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
    if (pid == -2) /* else pidfd_getfd's EBADF would read as a process without the token */
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_fd_token_check: fd %d is not a pidfd (fabpool_fd_pidfd_open "
                        "makes one of the process to check)", pidfd);
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
