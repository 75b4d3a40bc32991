/* planted.h - what another user can leave in a folder that everyone may
 * write (as /tmp): a sticky, world-writable folder, and in it a symbolic
 * link to a file of ours and a file of their own, planted by a child that
 * runs as uid 65534 (other_user.h).  For the tests of the files fabpool
 * writes (the log, traces): none may be written through such a name.
 * Where this process is not root, the link is planted by this process
 * itself (the refusal of a link does not depend on its owner) and the file
 * of another user is not made: planted_by_other() says so and returns 0. */
#ifndef FP_PLANTED_H
#define FP_PLANTED_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "other_user.h"

/* A new sticky world-writable folder (mode 01777) into out: 0, or -1 after a message. */
static inline int planted_dir_make(char *out, size_t cap)
{
    snprintf(out, cap, "/tmp/fabpool-test-shared-XXXXXX");
    if (!mkdtemp(out) || chmod(out, 01777) != 0) {
        perror("planted_dir_make");
        return -1;
    }
    return 0;
}

/* Writes the text to path (a new file, or truncated), with mode. 0 or -1. */
static inline int planted_write(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    return close(fd) == 0 && ok ? 0 : -1;
}

/* 1 if the file at path holds exactly text. */
static inline int planted_holds(const char *path, const char *text)
{
    char buf[256];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n >= 0 && (size_t)n == strlen(text) && memcmp(buf, text, (size_t)n) == 0;
}

struct planted_args {
    const char *link, *target, *theirs, *theirs_text;
};

static inline int planted_child(void *v)
{
    const struct planted_args *a = v;
    if (symlink(a->target, a->link) != 0) {
        perror("planted: symlink as uid 65534");
        return 1;
    }
    if (a->theirs && planted_write(a->theirs, a->theirs_text, 0666) != 0) {
        perror("planted: a file of uid 65534");
        return 1;
    }
    return 0;
}

/* Plants link -> target and (as root) the file theirs holding theirs_text, both as uid 65534. 1 if another
 * user planted them, 0 if this process planted the link itself (not root: no file of another user), -1 on
 * failure (with a message). */
static inline int planted_by_other(const char *link, const char *target, const char *theirs, const char *theirs_text)
{
    struct planted_args a = {link, target, theirs, theirs_text};
    if (!other_user_can()) {
        printf("planted: not root, so the link is this user's own and no file of another user is made\n");
        return symlink(target, link) == 0 ? 0 : -1;
    }
    pid_t pid;
    if (other_user_fork(planted_child, &a, &pid) != 0 || other_user_wait(pid) != 0) {
        fprintf(stderr, "planted: the child of uid 65534 failed\n");
        return -1;
    }
    struct stat sb;
    if (lstat(link, &sb) != 0 || sb.st_uid != OTHER_USER_UID || !S_ISLNK(sb.st_mode)) {
        fprintf(stderr, "planted: %s is not a link of uid 65534\n", link);
        return -1;
    }
    return 1;
}

#endif
