/* test_buffer_handles: a buffer's handle after its destroy or release, and a view's after its close or release,
 * are refused by every call that takes one (FABPOOL_ERR_INVALID_ARG, NULL for fabpool_buffer_ptr and
 * fabpool_view_ptr, the message naming the call), and reading them reads nothing of what the object was; nor do
 * they name a new object soon after:
 *  - a buffer destroyed twice, with the heap reused in between (blocks of every size a struct of the library
 *    could have, written over); a resize after the destroy; a view closed twice;
 *  - every call that takes a buffer or a view, on a destroyed, released, closed or released one, on a view's
 *    handle given as a buffer's and back, and on a pointer to the caller's own memory;
 *  - a buffer made after a destroy has another handle; the old one destroyed again is refused, and the new
 *    buffer stays live with its data (pool stats: one buffer);
 *  - the same for the handles of a pool destroyed with its buffers and view still live;
 *  - a buffer reused after its release (fabpool_buffer_reuse) and a view taken back after its release
 *    (fabpool_view_open_peer) come under new handles: the released ones stay refused;
 *  - 1024 buffers made and destroyed after a destroy: no handle comes back (each is new, the first one never);
 *  - four threads, each making and destroying buffers and destroying each one's handle again;
 *  - children forked while a thread makes and destroys buffers: each makes a pool and a buffer of its own and
 *    refuses its parent's (not hanging on a lock the fork left held: alarm).
 * The cases that make buffers run twice: with the pools' metadata in libc, and in jemalloc (metadata:jemalloc,
 * whose arena hands a freed block's address to the next one at once; skipped where the process cannot have
 * jemalloc).  Each case runs in a child process of its own: a call that reads freed memory crashes its child
 * (or, in the ASan build, ASan stops it), and the parent reports how each case ended. */
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#define MB (1ull << 20)

static const char *meta = "metadata:libc"; /* the case's pools' metadata */

static fabpool_t *pool(const char *more)
{
    char conf[256];
    /* several pools live at once: each reserves a little, so that their address space fits where it is scarce
     * (under valgrind a default reservation of 8x the device's memory each is too much for two) */
    snprintf(conf, sizeof conf, "%s,reserve:4GiB%s%s", meta, more ? "," : "", more ? more : "");
    return t_pool(conf);
}

/* What a program does between two calls: blocks of every size a struct of the library could have, written. */
static void reuse_heap(void)
{
    for (size_t size = 16; size <= 512; size += 8)
        for (int i = 0; i < 4; i++) {
            void *m = malloc(size);
            if (m)
                memset(m, 0, size); /* left allocated: the heap keeps them, as a program's data */
        }
}

/* An answer refused as a dead handle's: FABPOOL_ERR_INVALID_ARG, the message naming the call. */
static int refused(fabpool_status st, const char *fn)
{
    const char *m = fabpool_last_error();
    int ok = st == FABPOOL_ERR_INVALID_ARG && strncmp(m, fn, strlen(fn)) == 0 && strstr(m, "nothing was done");
    if (!ok)
        fprintf(stderr, "  %s -> %s (%s)\n", fn, fabpool_status_name(st), m);
    return ok;
}

#define REFUSED(call, fn) CHECK(refused((call), (fn)))

/* An exported buffer and a view of it in a second pool (posix fds: the sim has them). */
typedef struct shared {
    fabpool_t *p, *q;
    fabpool_buffer_t *b;
    uint8_t desc[1 << 13];
    size_t len, nfds;
    int fds[64];
} shared;

static int share(shared *s, const char *qconf)
{
    memset(s, 0, sizeof *s);
    s->p = pool("handle_type:posix_fd");
    s->q = pool(qconf);
    if (!s->p || !s->q || fabpool_buffer_create(s->p, 64 * MB, 8 * MB, &s->b) != FABPOOL_OK)
        return -1;
    t_put_tag(fabpool_buffer_ptr(s->b), 8 * MB, 0x5eed);
    return fabpool_buffer_export(s->b, 0, s->desc, sizeof s->desc, &s->len, s->fds, 64, &s->nfds) == FABPOOL_OK ? 0
                                                                                                              : -1;
}

static fabpool_view_t *open_view(shared *s, int peer)
{
    int mine[64];
    for (size_t i = 0; i < s->nfds; i++)
        mine[i] = dup(s->fds[i]);
    fabpool_view_t *v = NULL;
    CHECK_OK(peer ? fabpool_view_open_peer(s->q, getpid(), s->desc, s->len, mine, s->nfds, &v)
                  : fabpool_view_open(s->q, s->desc, s->len, mine, s->nfds, &v));
    return v;
}

/* ---- the cases (each in a child of its own) */

static void destroy_twice(void)
{
    fabpool_t *p = pool(NULL);
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &b));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    reuse_heap();
    REFUSED(fabpool_buffer_destroy(b, NULL), "fabpool_buffer_destroy");
    CHECK(strstr(fabpool_last_error(), "not a live buffer") != NULL);
    CHECK(t_stats(p).buffers == 0);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

static void resize_after_destroy(void)
{
    fabpool_t *p = pool(NULL);
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &b));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    reuse_heap();
    REFUSED(fabpool_buffer_resize(b, 8 * MB, NULL), "fabpool_buffer_resize");
    CHECK(t_stats(p).mapped_bytes == 0);
    CHECK_OK(fabpool_destroy(p));
}

static void view_close_twice(void)
{
    shared s;
    CHECK(share(&s, "handle_type:posix_fd") == 0);
    fabpool_view_t *v = open_view(&s, 0);
    CHECK_OK(fabpool_view_close(v));
    reuse_heap();
    REFUSED(fabpool_view_close(v), "fabpool_view_close");
    CHECK(strstr(fabpool_last_error(), "not an open view") != NULL);
    CHECK(t_stats(s.q).view_bytes == 0);
    CHECK_OK(fabpool_buffer_destroy(s.b, NULL));
    CHECK_OK(fabpool_destroy(s.q));
    CHECK_OK(fabpool_destroy(s.p));
}

/* Every call that takes a buffer, on b (not live), the set calls with a live buffer beside it. */
static void buffer_calls_refused(fabpool_buffer_t *b, fabpool_buffer_t *live)
{
    fabpool_buffer_info in = {.struct_size = sizeof in};
    fabpool_buffer_info before = in;
    CHECK_OK(fabpool_buffer_get_info(live, &before));
    REFUSED(fabpool_buffer_resize(b, 2 * MB, NULL), "fabpool_buffer_resize");
    fabpool_buffer_t *set[2] = {live, b};
    size_t sizes[2] = {16 * MB, 2 * MB};
    REFUSED(fabpool_buffer_resize_set(set, sizes, 2, NULL), "fabpool_buffer_resize_set");
    CHECK(strstr(fabpool_last_error(), "buffer 1") != NULL);
    REFUSED(fabpool_buffer_destroy(b, NULL), "fabpool_buffer_destroy");
    REFUSED(fabpool_buffer_release(b), "fabpool_buffer_release");
    REFUSED(fabpool_buffer_get_info(b, &in), "fabpool_buffer_get_info");
    CHECK(fabpool_buffer_ptr(b) == NULL && strncmp(fabpool_last_error(), "fabpool_buffer_ptr", 18) == 0);
    int fd = 7;
    REFUSED(fabpool_buffer_dmabuf(b, 0, 2 * MB, &fd), "fabpool_buffer_dmabuf");
    CHECK(fd == -1);
    uint8_t desc[1 << 12];
    size_t len = 0, nfds = 0;
    int fds[16];
    REFUSED(fabpool_buffer_export(b, 0, desc, sizeof desc, &len, fds, 16, &nfds), "fabpool_buffer_export");
    REFUSED(fabpool_buffer_export_done(b), "fabpool_buffer_export_done");
    REFUSED(fabpool_buffer_peers_ack(b, UINT64_MAX), "fabpool_buffer_peers_ack");
    CHECK(strstr(fabpool_last_error(), "fabpool_peers_ack") != NULL); /* says how a destroyed one is acknowledged */
    fabpool_buffer_info after = {.struct_size = sizeof after};
    CHECK_OK(fabpool_buffer_get_info(live, &after));
    CHECK(after.size == before.size && after.mapped == before.mapped && after.generation == before.generation);
}

/* Every call that takes a view, on v (not open); fds given to apply are closed. */
static void view_calls_refused(fabpool_view_t *v, shared *s)
{
    int mine[64];
    for (size_t i = 0; i < s->nfds; i++)
        mine[i] = dup(s->fds[i]);
    REFUSED(fabpool_view_apply(v, s->desc, s->len, mine, s->nfds), "fabpool_view_apply");
    for (size_t i = 0; i < s->nfds; i++)
        CHECK(fcntl(mine[i], F_GETFD) == -1); /* taken and closed, as on any failure */
    fabpool_buffer_info in = {.struct_size = sizeof in};
    REFUSED(fabpool_view_get_info(v, &in), "fabpool_view_get_info");
    CHECK(fabpool_view_ptr(v) == NULL && strncmp(fabpool_last_error(), "fabpool_view_ptr", 16) == 0);
    REFUSED(fabpool_view_close(v), "fabpool_view_close");
    REFUSED(fabpool_view_release(v), "fabpool_view_release");
}

static void every_call_refused(void)
{
    shared s;
    CHECK(share(&s, "handle_type:posix_fd,keep_ms:60000") == 0);
    fabpool_t *p = pool("keep_ms:60000");
    fabpool_buffer_t *gone = NULL, *kept = NULL, *live = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &gone));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &kept));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &live));
    fabpool_buffer_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_buffer_get_info(kept, &in));
    uint64_t kept_mapped = in.mapped;
    CHECK_OK(fabpool_buffer_destroy(gone, NULL));
    CHECK_OK(fabpool_buffer_release(kept));
    reuse_heap();
    buffer_calls_refused(gone, live);
    buffer_calls_refused(kept, live);
    fabpool_view_t *closed = open_view(&s, 0), *released = open_view(&s, 1), *open = open_view(&s, 0);
    CHECK_OK(fabpool_view_close(closed));
    CHECK_OK(fabpool_view_release(released));
    view_calls_refused(closed, &s);
    view_calls_refused(released, &s);
    /* a view's handle as a buffer's and a buffer's as a view's, and the caller's own memory as either */
    buffer_calls_refused((fabpool_buffer_t *)open, live);
    view_calls_refused((fabpool_view_t *)live, &s);
    uint64_t mine[64];
    memset(mine, 0, sizeof mine);
    buffer_calls_refused((fabpool_buffer_t *)mine, live);
    view_calls_refused((fabpool_view_t *)mine, &s);
    CHECK(t_tag_ok(fabpool_view_ptr(open), 8 * MB, 0x5eed));
    CHECK(t_stats(p).buffers == 1 && t_stats(p).kept_bytes == kept_mapped);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_check(s.q));
    CHECK_OK(fabpool_view_close(open));
    CHECK_OK(fabpool_buffer_destroy(live, NULL));
    CHECK_OK(fabpool_buffer_destroy(s.b, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK_OK(fabpool_destroy(s.q));
    CHECK_OK(fabpool_destroy(s.p));
}

/* A new buffer after a destroy: another handle; the old one's second destroy leaves the new buffer alone. */
static void new_after_destroy(void)
{
    fabpool_t *p = pool(NULL);
    fabpool_buffer_t *old = NULL, *mine = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &old));
    CHECK_OK(fabpool_buffer_destroy(old, NULL));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 2 * MB, &mine)); /* another part of the program's buffer */
    CHECK(mine && mine != old);
    t_put_tag(fabpool_buffer_ptr(mine), 2 * MB, 0xfeed);
    REFUSED(fabpool_buffer_destroy(old, NULL), "fabpool_buffer_destroy");
    REFUSED(fabpool_buffer_resize(old, 1 * MB, NULL), "fabpool_buffer_resize");
    fabpool_buffer_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_buffer_get_info(mine, &in));
    CHECK(in.size == 2 * MB && t_stats(p).buffers == 1 && t_tag_ok(fabpool_buffer_ptr(mine), 2 * MB, 0xfeed));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_buffer_destroy(mine, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* A pool destroyed with a buffer, a released buffer and a view live: their handles are refused after it (the
 * pool is not read), and the handles of a new pool's buffer and view are other ones. */
static void pool_destroyed(void)
{
    shared s, s2;
    CHECK(share(&s, "handle_type:posix_fd,keep_ms:60000") == 0);
    fabpool_buffer_t *kept = NULL;
    CHECK_OK(fabpool_buffer_create(s.p, 64 * MB, 2 * MB, &kept));
    CHECK_OK(fabpool_buffer_release(kept));
    fabpool_view_t *v = open_view(&s, 1);
    fabsim_ledger l0 = t_ledger();
    CHECK_OK(fabpool_destroy(s.q)); /* a view is no buffer or block: not FABPOOL_ERR_BUSY */
    CHECK_STATUS(fabpool_destroy(s.p), FABPOOL_ERR_BUSY);
    CHECK(!t_ledger_p || t_ledger().mappings < l0.mappings); /* the sim counts mappings; a real driver does not say */
    reuse_heap();
    CHECK(share(&s2, "handle_type:posix_fd") == 0); /* its buffer's tag: 0x5eed */
    fabpool_view_t *w = open_view(&s2, 0);
    CHECK(s2.b && s2.b != s.b && s2.b != kept && w && w != v);
    buffer_calls_refused(s.b, s2.b);
    buffer_calls_refused(kept, s2.b);
    view_calls_refused(v, &s2);
    CHECK(t_stats(s2.p).buffers == 1 && t_tag_ok(fabpool_buffer_ptr(s2.b), 8 * MB, 0x5eed));
    CHECK(t_tag_ok(fabpool_view_ptr(w), 8 * MB, 0x5eed));
    CHECK_OK(fabpool_check(s2.p));
    CHECK_OK(fabpool_check(s2.q));
    CHECK_OK(fabpool_view_close(w));
    CHECK_OK(fabpool_buffer_destroy(s2.b, NULL));
    CHECK_OK(fabpool_destroy(s2.q));
    CHECK_OK(fabpool_destroy(s2.p));
}

/* A released buffer reused, a released view taken back: new handles, the released ones refused. */
static void reuse_new_handle(void)
{
    shared s;
    CHECK(share(&s, "handle_type:posix_fd,keep_ms:60000") == 0);
    fabpool_t *p = pool("keep_ms:60000");
    fabpool_buffer_t *b = NULL, *r = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &b));
    void *base = fabpool_buffer_ptr(b);
    t_put_tag(base, 4 * MB, 0xabcd);
    CHECK_OK(fabpool_buffer_release(b));
    CHECK_OK(fabpool_buffer_reuse(p, 4 * MB, NULL, &r));
    CHECK(r && r != b && fabpool_buffer_ptr(r) == base && t_tag_ok(base, 4 * MB, 0xabcd));
    REFUSED(fabpool_buffer_destroy(b, NULL), "fabpool_buffer_destroy");
    CHECK(t_stats(p).buffers == 1);
    CHECK_OK(fabpool_check(p));
    fabpool_view_t *v = open_view(&s, 1), *w = NULL;
    void *at = fabpool_view_ptr(v);
    CHECK_OK(fabpool_view_release(v));
    w = open_view(&s, 1);
    CHECK(w && w != v && fabpool_view_ptr(w) == at && t_tag_ok(at, 8 * MB, 0x5eed));
    REFUSED(fabpool_view_close(v), "fabpool_view_close");
    fabpool_buffer_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_buffer_get_info(s.b, &in));
    CHECK(t_stats(s.q).view_bytes == in.mapped && t_stats(s.q).kept_bytes == 0);
    CHECK_OK(fabpool_check(s.q));
    CHECK_OK(fabpool_view_close(w));
    CHECK_OK(fabpool_buffer_destroy(r, NULL));
    CHECK_OK(fabpool_buffer_destroy(s.b, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK_OK(fabpool_destroy(s.q));
    CHECK_OK(fabpool_destroy(s.p));
}

enum { QUARANTINE = 1024 };

/* A destroyed buffer's handle is no new buffer's for the next 1024 destroys at least. */
static void quarantine(void)
{
    fabpool_t *p = pool(NULL);
    fabpool_buffer_t *first = NULL;
    CHECK_OK(fabpool_buffer_create(p, 4 * MB, 2 * MB, &first));
    CHECK_OK(fabpool_buffer_destroy(first, NULL));
    static fabpool_buffer_t *seen[QUARANTINE];
    int again = 0;
    for (int i = 0; i < QUARANTINE; i++) {
        CHECK_OK(fabpool_buffer_create(p, 4 * MB, 2 * MB, &seen[i]));
        again += seen[i] == first;
        for (int k = 0; k < i; k++)
            again += seen[k] == seen[i];
        CHECK_OK(fabpool_buffer_destroy(seen[i], NULL));
    }
    CHECK(again == 0);
    if (again)
        fprintf(stderr, "  %d handles came back within %d destroys\n", again, QUARANTINE);
    REFUSED(fabpool_buffer_destroy(first, NULL), "fabpool_buffer_destroy");
    CHECK_OK(fabpool_destroy(p));
}

/* Threads making and destroying buffers, each in a pool of its own, each destroy repeated. */
static void *churn(void *arg)
{
    int *bad = arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    fabpool_t *p = pool(NULL);
    for (int i = 0; i < 200 && p; i++) {
        fabpool_buffer_t *b = NULL;
        if (fabpool_buffer_create(p, 4 * MB, 2 * MB, &b) != FABPOOL_OK ||
            fabpool_buffer_destroy(b, NULL) != FABPOOL_OK || fabpool_buffer_destroy(b, NULL) != FABPOOL_ERR_INVALID_ARG)
            (*bad)++;
    }
    if (!p || t_stats(p).buffers != 0 || fabpool_destroy(p) != FABPOOL_OK)
        (*bad)++;
    return NULL;
}

static void threads(void)
{
    pthread_t t[4];
    int bad[4] = {0};
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, churn, &bad[i]) == 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(bad[i] == 0);
    }
}

static _Atomic int stop, forks_done;

/* Makes and destroys buffers until stop, at most 24 for each child forked so far and the next one: fewer destroys
 * in all than the quarantine holds (past it, the destroyed handle the children try may be a new buffer's for a
 * moment: a child under valgrind once found it live), and the thread busy around every fork (a thread that had
 * ended before the forks is one their TSan reports as never joined). */
static void *churn_until_stop(void *arg)
{
    fabpool_t *p = arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    for (int n = 0; !atomic_load(&stop);) {
        if (n >= 24 * (atomic_load(&forks_done) + 1)) {
            usleep(100);
            continue;
        }
        fabpool_buffer_t *b = NULL;
        if (fabpool_buffer_create(p, 4 * MB, 2 * MB, &b) == FABPOOL_OK)
            (void)fabpool_buffer_destroy(b, NULL);
        n++;
    }
    return NULL;
}

/* Children forked while a thread makes and destroys buffers: a pool is not made in a child (CUDA does not
 * carry over a fork), and the parent's buffer, live or destroyed, is refused without waiting for anything. */
static void forked_children(void)
{
    fabpool_t *p = pool(NULL);
    fabpool_buffer_t *b = NULL, *dead = NULL;
    CHECK_OK(fabpool_buffer_create(p, 4 * MB, 2 * MB, &b));
    CHECK_OK(fabpool_buffer_create(p, 4 * MB, 2 * MB, &dead));
    CHECK_OK(fabpool_buffer_destroy(dead, NULL));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, churn_until_stop, p) == 0);
    int hung = 0, wrong = 0;
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            fabpool_options o;
            fabpool_options_init(&o);
            fabpool_t *c = NULL;
            /* the exit status names the first call answered wrong */
            _exit(fabpool_create(&o, &c) != FABPOOL_ERR_NOT_SUPPORTED || c                ? 1
                  : fabpool_buffer_destroy(dead, NULL) != FABPOOL_ERR_INVALID_ARG         ? 2
                  : fabpool_buffer_resize(b, 4 * MB, NULL) != FABPOOL_ERR_NOT_SUPPORTED ? 3
                  : fabpool_buffer_destroy(b, NULL) != FABPOOL_ERR_NOT_SUPPORTED         ? 4
                                                                                            : 0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        atomic_fetch_add(&forks_done, 1);
        hung += WIFSIGNALED(st);
        if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
            wrong++;
            fprintf(stderr, "  child %d exited %d (1 to 4: that call of its four answered wrong)\n", i,
                    WEXITSTATUS(st));
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    CHECK(hung == 0 && wrong == 0);
    if (hung || wrong)
        fprintf(stderr, "  of 20 children, %d hung or crashed, %d answered wrong\n", hung, wrong);
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* ---- the parent */

typedef struct tcase {
    const char *name;
    void (*fn)(void);
    int both; /* run with the metadata in jemalloc too */
} tcase;

static const tcase cases[] = {
    {"a buffer destroyed twice, the heap reused in between", destroy_twice, 1},
    {"a buffer resized after its destroy", resize_after_destroy, 1},
    {"a view closed twice", view_close_twice, 1},
    {"every call on a destroyed, released or closed handle, or none", every_call_refused, 1},
    {"a new buffer after a destroy, the old handle destroyed again", new_after_destroy, 1},
    {"the handles of a pool destroyed with them live", pool_destroyed, 1},
    {"a buffer and a view released and taken back", reuse_new_handle, 1},
    {"1024 buffers made and destroyed after a destroy", quarantine, 1},
    {"four threads making and destroying buffers", threads, 0},
    {"children forked while a thread makes and destroys buffers", forked_children, 0},
};

/* Runs case c in a child: 0 when it passed, else 1 (said why). */
static int run(const tcase *c)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        t_driver_init();
        c->fn();
        fflush(NULL);
        _exit(t_failures ? 1 : 0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        fprintf(stderr, "%s (%s): no child\n", c->name, meta);
        return 1;
    }
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "%s (%s): crashed with signal %d\n", c->name, meta, WTERMSIG(st));
        return 1;
    }
    if (WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s (%s): failed (exit %d)\n", c->name, meta, WEXITSTATUS(st));
        return 1;
    }
    printf("ok: %s (%s)\n", c->name, meta);
    return 0;
}

static int jemalloc_possible(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = "metadata:jemalloc";
    fabpool_t *p = NULL;
    pid_t pid = fork(); /* the probe's pool in a child: the parent keeps no driver state */
    if (pid == 0)
        _exit(fabpool_create(&o, &p) == FABPOOL_OK && fabpool_destroy(p) == FABPOOL_OK ? 0 : 1);
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int failed = 0, ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++, ran++)
        failed += run(&cases[i]);
    if (jemalloc_possible()) {
        meta = "metadata:jemalloc";
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            if (cases[i].both) {
                failed += run(&cases[i]);
                ran++;
            }
    } else {
        printf("skipped: the cases with metadata:jemalloc (the process cannot load jemalloc)\n");
    }
    printf("test_buffer_handles: %d cases, %d failed\n", ran, failed);
    return failed ? 1 : 0;
}
