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

/* What a test of a file fabpool writes plants in a new shared folder: a link to a file of ours (target, in a
 * folder of the test's own, holding PLANTED_PRECIOUS), a file of uid 65534 (theirs, holding PLANTED_THEIRS)
 * and the name of a FIFO, not yet made, each named <link_name>, theirs.<ext>, fifo.<ext>. */
#define PLANTED_PRECIOUS "a file of root's that nothing fabpool writes may cut\n"
#define PLANTED_THEIRS "uid 65534's own\n"

typedef struct planted {
    char shared[256], link[320], theirs[320], fifo[320], target[320];
    int other; /* what planted_by_other answered: 1 with the file of uid 65534, 0 without */
} planted;

/* Makes the folder, the target in dir, the link and (as root) their file. 0, or -1 after a message. */
static inline int planted_setup(planted *p, const char *dir, const char *link_name, const char *ext)
{
    if (planted_dir_make(p->shared, sizeof p->shared) != 0)
        return -1;
    snprintf(p->link, sizeof p->link, "%s/%s", p->shared, link_name);
    snprintf(p->theirs, sizeof p->theirs, "%s/theirs.%s", p->shared, ext);
    snprintf(p->fifo, sizeof p->fifo, "%s/fifo.%s", p->shared, ext);
    snprintf(p->target, sizeof p->target, "%s/precious", dir);
    if (planted_write(p->target, PLANTED_PRECIOUS, 0644) != 0) {
        perror("planted_setup: the target");
        return -1;
    }
    p->other = planted_by_other(p->link, p->target, p->theirs, PLANTED_THEIRS);
    return p->other >= 0 ? 0 : -1;
}

/* Removes the link, the FIFO (which the test made), their file and the folder: 0, or -1. */
static inline int planted_remove(const planted *p)
{
    int ok = unlink(p->link) == 0 && unlink(p->fifo) == 0 && (p->other <= 0 || unlink(p->theirs) == 0) &&
             rmdir(p->shared) == 0;
    return ok ? 0 : -1;
}

#endif
