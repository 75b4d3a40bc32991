/* test_fd_from_pid: fds copied out of another process (fabpool_fd_from_pid,
 * and through a pidfd: fabpool_fd_pidfd_open / fabpool_fd_from_pidfd, which
 * keeps naming the process it was opened for once that process is gone)
 * and the consent that Yama's ptrace_scope 1 asks of the process copied from
 * (fabpool_fd_allow_peers): a child copies its parent's memfd and reads the
 * parent's bytes through it; a copy refused says why and what to do (a
 * process that is gone, an fd the process does not have), and leaves *out as
 * it was.  No pool and no driver: fd passing needs neither. */
#include "testutil.h"
#include "procfs.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

/* the child: copies the parent's fd and reads what the parent wrote; exit 0
 * when the bytes match, 2 when the system refuses pidfd_getfd (seccomp) */
static int child_copies(int parent, int fd, const char *want)
{
    int got = -1;
    if (fabpool_fd_from_pid(parent, fd, &got) != FABPOOL_OK) {
        fprintf(stderr, "child: %s\n", fabpool_last_error());
        const char *m = fabpool_last_error();
        return strstr(m, strerror(EPERM)) || strstr(m, strerror(ENOSYS)) ? 2 : 1;
    }
    char buf[64] = {0};
    ssize_t n = pread(got, buf, sizeof buf - 1, 0);
    close(got);
    return n == (ssize_t)strlen(want) && strcmp(buf, want) == 0 ? 0 : 1;
}

static void copy_from_parent(void)
{
    const char *msg = "the parent's bytes";
    int fd = memfd_create("test_fd_from_pid", MFD_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(write(fd, msg, strlen(msg)) == (ssize_t)strlen(msg));
    int sc = yama_ptrace_scope();
    if (sc >= 2) {
        CHECK_STATUS(fabpool_fd_allow_peers(), FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(strstr(fabpool_last_error(), "ptrace_scope") != NULL);
        close(fd);
        printf("Yama ptrace_scope %d: no copy between siblings is possible, only the refusal checked\n", sc);
        return;
    }
    CHECK_OK(fabpool_fd_allow_peers());
    CHECK_OK(fabpool_fd_allow_peers()); /* twice: the same answer */
    int parent = (int)getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_copies(parent, fd, msg));
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st));
    if (WEXITSTATUS(st) == 2)
        printf("pidfd_getfd refused by the system (a seccomp filter, valgrind): the copy is not checked here\n");
    else
        CHECK(WEXITSTATUS(st) == 0);
    close(fd);
}

static void copy_from_self(void)
{
    int fd = memfd_create("test_fd_from_pid_self", MFD_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(write(fd, "x", 1) == 1);
    int got = -1;
    fabpool_status s = fabpool_fd_from_pid((int)getpid(), fd, &got);
    if (s == FABPOOL_OK) {
        char c = 0;
        CHECK(got >= 0 && got != fd && pread(got, &c, 1, 0) == 1 && c == 'x');
        close(got);
    } else { /* only a system that refuses pidfd_getfd altogether */
        CHECK(s == FABPOOL_ERR_IO || s == FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(strstr(fabpool_last_error(), "fabpool_fd_send") != NULL);
    }
    close(fd);
}

/* a pidfd names one process: a copy through it while that process lives,
 * ESRCH ("is gone") once it is reaped, whatever pid comes next */
static void copy_through_a_pidfd(void)
{
    int pfd = -7;
    CHECK_STATUS(fabpool_fd_pidfd_open(0, &pfd), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_fd_pidfd_open(-1, &pfd), FABPOOL_ERR_INVALID_ARG);
    CHECK(pfd == -7);
    const char *msg = "the child's bytes";
    int fd = memfd_create("test_fd_from_pidfd", MFD_CLOEXEC), go[2];
    CHECK(fd >= 0 && write(fd, msg, strlen(msg)) == (ssize_t)strlen(msg));
    CHECK(pipe(go) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { /* holds fd until told to go */
        char b;
        _exit(read(go[0], &b, 1) == 1 ? 0 : 1);
    }
    fabpool_status s = fabpool_fd_pidfd_open((int)pid, &pfd);
    if (s != FABPOOL_OK) { /* valgrind 3.19 knows no pidfd_open */
        CHECK(s == FABPOOL_ERR_IO && strstr(fabpool_last_error(), "Linux 5.6") != NULL);
        printf("pidfd_open is not implemented here: only its refusal checked\n");
        CHECK(write(go[1], "g", 1) == 1);
        waitpid(pid, NULL, 0);
        close(fd), close(go[0]), close(go[1]);
        return;
    }
    int got = -7;
    CHECK_STATUS(fabpool_fd_from_pidfd(pfd, fd, NULL), FABPOOL_ERR_INVALID_ARG);
    s = fabpool_fd_from_pidfd(pfd, fd, &got);
    if (s == FABPOOL_OK) {
        char buf[64] = {0};
        CHECK(got >= 0 && got != fd && pread(got, buf, sizeof buf - 1, 0) == (ssize_t)strlen(msg));
        CHECK(strcmp(buf, msg) == 0);
        close(got);
    } else { /* only a system that refuses pidfd_getfd altogether */
        CHECK(s == FABPOOL_ERR_IO || s == FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(strstr(fabpool_last_error(), "fabpool_fd_send") != NULL);
        printf("pidfd_getfd refused by the system: %s\n", fabpool_last_error());
    }
    /* an fd the child does not have: the message names the child's pid */
    got = -7;
    CHECK(fabpool_fd_from_pidfd(pfd, 100000, &got) != FABPOOL_OK && got == -7);
    char txt[48];
    snprintf(txt, sizeof txt, "pidfd_getfd(%d, 100000)", (int)pid);
    CHECK(strstr(fabpool_last_error(), txt) != NULL);
    /* the child gone and reaped: the pidfd still names it, never another process of its pid */
    CHECK(write(go[1], "g", 1) == 1);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(fabpool_fd_from_pidfd(pfd, fd, &got) != FABPOOL_OK && got == -7);
    if (s == FABPOOL_OK) {
        CHECK(strstr(fabpool_last_error(), strerror(ESRCH)) != NULL);
        CHECK(strstr(fabpool_last_error(), "is gone") != NULL);
    }
    close(pfd), close(fd), close(go[0]), close(go[1]);
}

static void refusals_say_why(void)
{
    /* a process that is gone: pidfd_open's ESRCH */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    CHECK(pid > 0 && waitpid(pid, NULL, 0) == pid);
    int got = -7;
    CHECK_STATUS(fabpool_fd_from_pid((int)pid, 0, &got), FABPOOL_ERR_IO);
    CHECK(got == -7);
    CHECK(strstr(fabpool_last_error(), "pidfd_open") != NULL);
    if (strstr(fabpool_last_error(), strerror(ENOSYS))) { /* valgrind 3.19 knows no pidfd_open */
        CHECK(strstr(fabpool_last_error(), "Linux 5.6") != NULL);
        printf("pidfd_open is not implemented here: only its refusal checked\n");
        return;
    }
    CHECK(strstr(fabpool_last_error(), "is gone") != NULL);
    CHECK(strstr(fabpool_last_error(), "stay alive") != NULL);

    /* an fd this process does not have: pidfd_getfd's EBADF */
    int none = 1000;
    while (fcntl(none, F_GETFD) != -1 || errno != EBADF)
        none++;
    fabpool_status s = fabpool_fd_from_pid((int)getpid(), none, &got);
    CHECK(s == FABPOOL_ERR_IO || s == FABPOOL_ERR_NOT_SUPPORTED);
    CHECK(got == -7);
    if (s == FABPOOL_ERR_IO && !strstr(fabpool_last_error(), "Operation not permitted")) {
        CHECK(strstr(fabpool_last_error(), "pidfd_getfd") != NULL);
        CHECK(strstr(fabpool_last_error(), "does not have that fd open") != NULL);
    }
    CHECK(strstr(fabpool_last_error(), "fabpool_fd_send") != NULL);
}

int main(void)
{
    copy_from_self();
    copy_from_parent();
    copy_through_a_pidfd();
    refusals_say_why();
    return t_done("test_fd_from_pid");
}
