/* test_env_secure: a process that runs with raised privileges (setuid, setgid, file capabilities: the kernel's
 * secure execution, AT_SECURE) reads no FABPOOL_ variable, as the loader ignores LD_PRELOAD there: the driver
 * library FABPOOL_CUDA_LIBRARY names would be loaded and run with those privileges, and FABPOOL_DEBUG_FILE would
 * write where the caller points.  The child is this program executed with a real uid of 65534 and an effective
 * uid of 0, which the kernel runs in secure mode; it makes a pool with FABPOOL_DEBUG_FILE, FABPOOL_DEBUG and
 * FABPOOL_CUDA_LIBRARY set.  Needs root (to set the uids); skipped elsewhere, and where the kernel does not run
 * the child in secure mode. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fabpool.h"
#include "unit.h"

/* The child: AT_SECURE, then the pool's answer and message on one line each. */
static int child(void)
{
    fabpool_t *p = NULL;
    fabpool_status st = fabpool_create(NULL, &p);
    printf("%lu\n%s\n%s\n", getauxval(AT_SECURE), fabpool_status_name(st), st == FABPOOL_OK ? "" : fabpool_last_error());
    if (p)
        fabpool_destroy(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child();
    if (geteuid() != 0) {
        printf("test_env_secure: needs root to run a child with raised privileges; skipped\n");
        return 77;
    }
    char dir[] = "/tmp/fabpool-env-XXXXXX";
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    char log[64], lib[64];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(lib, sizeof lib, "%s/planted-driver.so", dir);
    int fd = open(lib, O_CREAT | O_WRONLY, 0644); /* not a library: a load of it would be named in the message */
    if (fd >= 0)
        close(fd);
    int pfd[2];
    if (pipe(pfd) != 0)
        return perror("pipe"), 1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        setenv("FABPOOL_DEBUG", "1", 1);
        setenv("FABPOOL_DEBUG_FILE", log, 1);
        setenv("FABPOOL_CUDA_LIBRARY", lib, 1);
        if (setresgid(65534, 0, 0) != 0 || setresuid(65534, 0, 0) != 0)
            _exit(120);
        execl("/proc/self/exe", argv[0], "--child", (char *)NULL);
        _exit(121);
    }
    close(pfd[1]);
    char out[4096] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(pfd[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    close(pfd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    struct stat sb;
    int logged = stat(log, &sb) == 0;
    unlink(log);
    unlink(lib);
    rmdir(dir);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || strncmp(out, "1\n", 2) != 0) {
        printf("test_env_secure: the child did not run in secure mode (exit %d, said: %.200s); skipped\n",
               WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, out);
        return 77;
    }
    CHECK(!logged);                               /* FABPOOL_DEBUG_FILE not followed */
    CHECK(strstr(out, "planted-driver") == NULL); /* FABPOOL_CUDA_LIBRARY not loaded */
    if (unit_failures)
        fprintf(stderr, "the child said:\n%s", out);
    return unit_result("test_env_secure");
}
