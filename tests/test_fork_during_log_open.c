/* test_fork_during_log_open: a child forked while another thread of its parent opens the log (the first pool
 * creation that asks for one, FABPOOL_DEBUG_FILE set) makes a pool of its own and never waits for the log's lock,
 * which no thread of the child would ever let go.  The parent had not loaded the driver yet, so the child may make
 * a pool (the fork paragraph of fabpool.h).
 * The window is a few system calls wide, so the test holds it open: this program defines fstat, which the
 * library's open of the log file calls with the log's lock held; in the creating thread it waits (up to
 * HOLD_S seconds) until the child has answered.  The child, given ALARM_S seconds by alarm(), makes a pool with
 * the log on, allocates, writes and reads back a block, destroys the pool and exits 0; the parent counts a child
 * killed by the alarm as a hang.  Needs the simulated driver (a real one would be initialized by the fork's
 * child on its own). */
#define _GNU_SOURCE
#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#define ALARM_S 5
#define HOLD_S 10

static pthread_t holder;
static _Atomic int holder_set, inside, child_done;

/* The library's fstat of the log file: held in the creating thread until the child has answered. */
int fstat(int fd, struct stat *sb)
{
    if (atomic_load(&holder_set) && pthread_equal(pthread_self(), holder) && !atomic_exchange(&inside, 1)) {
        for (int ms = 0; ms < HOLD_S * 1000 && !atomic_load(&child_done); ms++) {
            struct timespec nap = {0, 1000000};
            nanosleep(&nap, NULL);
        }
    }
    return (int)syscall(SYS_fstat, fd, sb);
}

static fabpool_options log_opts(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.debug = FABPOOL_LOG_WARN;
    return o;
}

static void *create_with_log(void *arg)
{
    fabpool_t **out = arg;
    holder = pthread_self();
    atomic_store(&holder_set, 1);
    fabpool_options o = log_opts();
    CHECK_OK(fabpool_create(&o, out));
    return NULL;
}

static int child(void)
{
    alarm(ALARM_S);
    fabpool_options o = log_opts();
    fabpool_t *p;
    if (fabpool_create(&o, &p) != FABPOOL_OK) {
        fprintf(stderr, "child: fabpool_create: %s\n", fabpool_last_error());
        return 1;
    }
    void *b;
    uint64_t v = 0x5eed, r = 0;
    int ok = fabpool_alloc(p, 4096, &b) == FABPOOL_OK &&
             cuMemcpyHtoD((CUdeviceptr)(uintptr_t)b, &v, sizeof v) == CUDA_SUCCESS &&
             cuMemcpyDtoH(&r, (CUdeviceptr)(uintptr_t)b, sizeof r) == CUDA_SUCCESS && r == v &&
             fabpool_free(p, b) == FABPOOL_OK;
    if (!ok)
        fprintf(stderr, "child: the block: %s\n", fabpool_last_error());
    return fabpool_destroy(p) == FABPOOL_OK && ok ? 0 : 1;
}

int main(void)
{
    (void)t_sim_required("test_fork_during_log_open", "a driver that a forked child may load");
    char path[] = "/tmp/fabpool_fork_log_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    unsetenv("FABPOOL_DEBUG");
    setenv("FABPOOL_DEBUG_FILE", path, 1);
    fabpool_t *p = NULL;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, create_with_log, &p) == 0);
    for (int ms = 0; ms < 5000 && !atomic_load(&inside); ms++)
        usleep(1000);
    CHECK(atomic_load(&inside)); /* the creating thread holds the log's lock */
    pid_t pid = fork();
    if (pid == 0)
        _exit(child());
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    atomic_store(&child_done, 1);
    if (WIFSIGNALED(status))
        fprintf(stderr, "the child was killed by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? ": it hung (fabpool_create waited for the log's lock)" : "");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pthread_join(t, NULL);
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_held() == 0);
    unlink(path);
    return t_done("test_fork_during_log_open");
}
