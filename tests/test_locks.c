/* test_locks: the lock checks of lib/lock.h fire.
 *
 * Built twice from this file:
 *   test_locks       (FP_TEST_LOCKS_STANDALONE) with lib/lock.c compiled in and FP_DEBUG_LOCKS on, whatever the
 *                    build: locks of every level taken in the right order pass; a wrong order, a lock taken
 *                    twice, a class lock below one held, an unlock of a lock not held and a missing lock abort,
 *                    each in a child process, with a message that names both locks;
 *   test_locks_pool  against the library: in a FABPOOL_DEBUG_LOCKS build (the ASan step of .ci/reliability)
 *                    a *_locked function called without the pool lock, and the pool lock taken under a class
 *                    lock, abort with the message, and a fork after a pool and a traced pool takes its hooks'
 *                    locks in order; in a release build it skips (exit 77), the checks compiled out.
 * White-box: it includes lib/ headers. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lock.h"

#if defined(FP_TEST_LOCKS_STANDALONE) && !defined(FP_DEBUG_LOCKS)
#error "test_locks needs FP_DEBUG_LOCKS (CMake defines it for this test, or for the whole build)"
#endif

#ifdef FP_DEBUG_LOCKS

static int failures, checks;

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        checks++;                                                                                     \
        if (!(cond)) {                                                                                \
            failures++;                                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                  \
        }                                                                                             \
    } while (0)

/* Runs fn in a child with stderr into a pipe: 1 if it aborted (SIGABRT) and
 * its stderr holds every string of want[], 0 if it exited normally (then
 * want must be NULL), -1 otherwise.  The message goes to out. */
static int in_child(void (*fn)(void *), void *arg, const char *const *want, char *out, size_t cap)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        signal(SIGABRT, SIG_DFL);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(pfd[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!want)
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        return -1;
    for (int i = 0; want[i]; i++)
        if (!strstr(out, want[i]))
            return -1;
    return 1;
}

static void expect_abort(const char *what, void (*fn)(void *), void *arg, const char *const *want)
{
    char msg[2048];
    int r = in_child(fn, arg, want, msg, sizeof msg);
    CHECK(r == 1);
    printf("  %-34s %s: %s", what, r == 1 ? "aborted" : "DID NOT ABORT AS EXPECTED", msg[0] ? msg : "(no message)\n");
}

#ifdef FP_TEST_LOCKS_STANDALONE

static fp_lock_t registry = FP_LOCK_INITIALIZER(FP_LOCK_REGISTRY, "registry");
static fp_lock_t pool, cls[8], traces = FP_LOCK_INITIALIZER(FP_LOCK_TRACE_LIST, "trace list"), trace;

static void right_order(void *arg)
{
    (void)arg;
    fp_lock(&registry);
    fp_lock(&pool);
    fp_lock_assert_held(&pool);
    for (int c = 0; c < 8; c += 3)   /* ascending class index, skipping some */
        fp_lock(&cls[c]);
    fp_lock(&traces);
    fp_lock(&trace);
    fp_unlock(&pool);                /* not in reverse order: allowed */
    fp_unlock(&trace);
    fp_unlock(&traces);
    for (int c = 6; c >= 0; c -= 3)
        fp_unlock(&cls[c]);
    fp_unlock(&registry);
    fp_lock(&cls[7]);                /* a class lock alone, then the trace */
    fp_lock(&trace);
    fp_unlock(&trace);
    fp_unlock(&cls[7]);
}

static void pool_under_class(void *arg)
{
    (void)arg;
    fp_lock(&cls[2]);
    fp_lock(&pool);
}

static void registry_under_pool(void *arg)
{
    (void)arg;
    fp_lock(&pool);
    fp_lock(&registry);
}

static void class_descending(void *arg)
{
    (void)arg;
    fp_lock(&cls[5]);
    fp_lock(&cls[3]);
}

static void twice(void *arg)
{
    (void)arg;
    fp_lock(&pool);
    fp_lock(&pool);
}

static void not_held(void *arg)
{
    (void)arg;
    fp_lock(&cls[1]);
    fp_lock_assert_held(&pool);
}

static void unlock_not_held(void *arg)
{
    (void)arg;
    fp_unlock(&trace);
}

int main(void)
{
    fp_lock_init(&pool, FP_LOCK_POOL, 0, "pool");
    for (unsigned c = 0; c < 8; c++)
        fp_lock_init(&cls[c], FP_LOCK_CLASS, c, "class");
    fp_lock_init(&trace, FP_LOCK_TRACE, 0, "trace");
    CHECK(fp_lock_debug_enabled() == 1);
    char msg[2048];
    int r = in_child(right_order, NULL, NULL, msg, sizeof msg);
    CHECK(r == 0);
    printf("  %-34s %s%s", "every level in order", r == 0 ? "passed" : "FAILED: ", r == 0 ? "\n" : msg);
    expect_abort("pool lock under a class lock", pool_under_class, NULL,
                 (const char *const[]){"taking 'pool' (level 2", "while holding 'class' 2 (level 3", "lib/lock.h", NULL});
    expect_abort("registry under the pool lock", registry_under_pool, NULL,
                 (const char *const[]){"taking 'registry'", "while holding 'pool'", NULL});
    expect_abort("class 3 under class 5", class_descending, NULL,
                 (const char *const[]){"taking 'class' 3", "while holding 'class' 5", NULL});
    expect_abort("the pool lock twice", twice, NULL,
                 (const char *const[]){"taking 'pool'", "while holding 'pool'", NULL});
    expect_abort("a lock not held", not_held, NULL,
                 (const char *const[]){"in not_held", "the caller must hold 'pool'", NULL});
    expect_abort("an unlock of a lock not held", unlock_not_held, NULL,
                 (const char *const[]){"releasing a lock it does not hold", "'trace'", NULL});
    printf("test_locks: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

#else /* against a library built with FP_DEBUG_LOCKS */

#include <cuda.h>

#include "fabpool.h"
#include "pool.h"

static void trim_unlocked(void *arg)
{
    struct fabpool *p = arg;
    fp_heap_trim_locked(&p->heap, 0);
}

static void collect_unlocked(void *arg)
{
    struct fabpool *p = arg;
    fp_collect_locked(&p->bufs, 0);
}

static void trim_under_class(void *arg)
{
    struct fabpool *p = arg;
    /* the child runs its parent's pool on purpose (the sim carries over a fork): the fork's mark, which makes
     * every call refuse before it takes a lock, is taken off */
    atomic_store(&p->ch.forked, 0);
    fp_lock(&p->heap.classes[0].lock);
    fabpool_trim(p, 0);   /* takes the pool lock */
}

/* A pool, then a traced pool (so the trace list's fork hooks come after the registry's), then a fork: the fork's
 * hooks take the registry before the trace list, as the lock order says, whichever was registered first. */
static void fork_after_a_traced_pool(void *arg)
{
    (void)arg;
    fabpool_t *a = NULL, *b = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    snprintf(o.trace_path, sizeof o.trace_path, "/tmp/fabpool_test_locks_%d.trace", (int)getpid());
    if (fabpool_create(NULL, &a) != FABPOOL_OK || fabpool_create(&o, &b) != FABPOOL_OK)
        _exit(3);
    pid_t pid = fork(); /* a lock taken out of order in the hooks aborts here */
    if (pid == 0)
        _exit(0);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        _exit(4);
    fabpool_destroy(b);
    fabpool_destroy(a);
    unlink(o.trace_path);
}

int main(void)
{
    if (!fp_lock_debug_enabled()) {
        printf("test_locks_pool: the library was built without FABPOOL_DEBUG_LOCKS: skipped (the ASan step of "
               ".ci/reliability runs it)\n");
        return 77;
    }
    CUdevice d;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, d) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "no CUDA driver/device: cannot run\n");
        return 2;
    }
    char msg[2048];
    int r = in_child(fork_after_a_traced_pool, NULL, NULL, msg, sizeof msg); /* before this process has a pool */
    CHECK(r == 0);
    printf("  %-34s %s%s", "a fork after a traced pool", r == 0 ? "passed" : "FAILED: ", r == 0 ? "\n" : msg);
    fabpool_t *p = NULL;
    fabpool_status st = fabpool_create(NULL, &p);
    CHECK(st == FABPOOL_OK);
    if (!p)
        return 1;
    expect_abort("fp_heap_trim_locked without the lock", trim_unlocked, p,
                 (const char *const[]){"in fp_heap_trim_locked", "the caller must hold 'pool'", NULL});
    expect_abort("fp_collect_locked without the lock", collect_unlocked, p,
                 (const char *const[]){"in fp_collect_locked", "the caller must hold 'pool'", NULL});
    expect_abort("fabpool_trim under a class lock", trim_under_class, p,
                 (const char *const[]){"in fabpool_trim", "taking 'pool'", "while holding 'class' 0", NULL});
    /* the pool itself is fine: its locks are taken in order */
    void *x = NULL;
    CHECK(fabpool_alloc(p, 1000, &x) == FABPOOL_OK && fabpool_free(p, x) == FABPOOL_OK);
    CHECK(fabpool_check(p) == FABPOOL_OK && fabpool_trim(p, 0) == FABPOOL_OK);
    CHECK(fabpool_destroy(p) == FABPOOL_OK);
    printf("test_locks_pool: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

#endif
#else /* a release build: the checks are compiled out of the library */

int main(void)
{
    printf("test_locks_pool: the library was built without FABPOOL_DEBUG_LOCKS: skipped (the ASan step of "
           ".ci/reliability runs it)\n");
    return fp_lock_debug_enabled() ? 1 : 77;
}

#endif
