/* test_forked_child_never_hangs: a child forked while a thread of its parent holds a pool's lock (fabpool_sleep
 * waiting for a stream whose work runs long: the sim's fabsim_stream_hold_long) never waits for that lock, which no
 * thread of the child would ever let go.  Every call on the pool, its buffers and its views answers
 * FABPOOL_ERR_NOT_SUPPORTED, its message naming the call and the fork; fabpool_handle_type_of, fabpool_buffer_ptr
 * and fabpool_view_ptr answer as in the parent, fabpool_trace_flush (the process's) FABPOOL_OK.  Then the child's
 * thread, which holds a cache of the pool, ends with pthread_exit, as a thread function that returns does: the
 * library's exit hook must leave that cache alone, and the child exits 0.
 * One child per call, all forked at once, each given ALARM_S seconds by alarm(): the parent counts the calls that
 * hung (the child said nothing before the alarm), the thread exits that hung (it said its call answered) and the
 * wrong answers.  Then the sleep ends, and the parent goes on: the pool checks, wakes and gives every byte back.
 * Needs the simulated driver (its long stream hold). */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#define MB (1ull << 20)
#define ALARM_S 5
/* what the calls below answer where the child's check of them fails (no call of theirs answers it here) */
#define T_WRONG FABPOOL_ERR_CORRUPT

static fabpool_t *P, *Q;              /* P: locked by the sleep; Q: exports the buffer that P's view maps */
static fabpool_buffer_t *B, *B2, *QB; /* B, B2: P's buffers (B exported, acknowledged); QB: Q's */
static fabpool_view_t *V;             /* P's view of QB */
static CUstream S, S2;                /* S: held long, the sleep waits for it; S2: the stream calls' */
static void *small, *large;           /* live blocks of P */
static uint8_t qdesc[1 << 13];        /* QB's descriptor and fds */
static size_t qlen, qnfds;
static int qfds[64];
static uint64_t b_export_id;
static fabpool_handle_type p_type;
static fabpool_status slept;

/* ---- the calls a child makes: one each */

static void *z;
static size_t n_out, n_out2;
static uint8_t desc[1 << 13];
static int fds_out[64];
static fabpool_buffer_t *nb;
static fabpool_view_t *nv;

static fabpool_status c_alloc(void) { return fabpool_alloc(P, 256, &z); }
static fabpool_status c_alloc_medium(void) { return fabpool_alloc(P, 16 << 10, &z); }
static fabpool_status c_alloc_large(void) { return fabpool_alloc(P, 3 * MB, &z); }
static fabpool_status c_alloc_aligned(void) { return fabpool_alloc_aligned(P, 300, 4096, &z); }
static fabpool_status c_free(void) { return fabpool_free(P, small); }
static fabpool_status c_free_large(void) { return fabpool_free(P, large); }
static fabpool_status c_alloc_on_stream(void) { return fabpool_alloc_on_stream(P, 256, S2, &z); }
static fabpool_status c_free_on_stream(void) { return fabpool_free_on_stream(P, small, S2); }
static fabpool_status c_free_per_thread(void) { return fabpool_free_on_stream(P, small, CU_STREAM_PER_THREAD); }
static fabpool_status c_record_stream(void) { return fabpool_record_stream(P, large, S2); }
static fabpool_status c_owner_end(void) { return fabpool_stream_owner_end(P); }
static fabpool_status c_usable_size(void) { return fabpool_usable_size(P, large, &n_out); }
static fabpool_status c_trim(void) { return fabpool_trim(P, 0); }
static fabpool_status c_thread_flush(void) { return fabpool_thread_flush(P); }
static fabpool_status c_collect(void) { return fabpool_collect(P, 0); }
static fabpool_status c_collect_wait(void) { return fabpool_collect(P, 1); }
static fabpool_status c_sleep(void) { return fabpool_sleep(P, FABPOOL_SLEEP_DISCARD, NULL); }
static fabpool_status c_wake(void) { return fabpool_wake(P, NULL); }
static fabpool_status c_sleep_state(void)
{
    fabpool_sleep_info i = {.struct_size = sizeof i};
    return fabpool_sleep_state(P, &i);
}
static fabpool_status c_get_stats(void)
{
    static fabpool_stats s;
    s.struct_size = sizeof s;
    return fabpool_get_stats(P, &s);
}
static fabpool_status c_reset_peak(void) { return fabpool_reset_peak(P); }
static fabpool_status c_get_counters(void)
{
    fabpool_counters c = {.struct_size = sizeof c};
    return fabpool_get_counters(P, &c);
}
static fabpool_status c_get_options(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    return fabpool_get_options(P, &o);
}
static fabpool_status c_device_memory(void) { return fabpool_device_memory(P, &n_out, &n_out2); }
static fabpool_status c_print_stats(void)
{
    FILE *f = fopen("/dev/null", "w");
    fabpool_status st = f ? fabpool_print_stats(P, f, 0) : FABPOOL_ERR_IO;
    if (f)
        fclose(f);
    return st;
}
static fabpool_status c_stats_json(void) { return fabpool_stats_json(P, (char *)desc, sizeof desc, &n_out); }
static fabpool_status c_check(void) { return fabpool_check(P); }
static fabpool_status c_destroy(void) { return fabpool_destroy(P); }
static fabpool_status c_buffer_create(void) { return fabpool_buffer_create(P, 4 * MB, 2 * MB, &nb); }
static fabpool_status c_buffer_reuse(void) { return fabpool_buffer_reuse(P, 2 * MB, NULL, &nb); }
static fabpool_status c_buffer_resize(void) { return fabpool_buffer_resize(B, 16 * MB, NULL); }
static fabpool_status c_buffer_resize_set(void)
{
    fabpool_buffer_t *bufs[2] = {B, B2};
    size_t sizes[2] = {16 * MB, 16 * MB};
    return fabpool_buffer_resize_set(bufs, sizes, 2, S2);
}
static fabpool_status c_buffer_destroy(void) { return fabpool_buffer_destroy(B, NULL); }
static fabpool_status c_buffer_release(void) { return fabpool_buffer_release(B2); }
static fabpool_status c_buffer_get_info(void)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    return fabpool_buffer_get_info(B, &i);
}
static fabpool_status c_buffer_dmabuf(void)
{
    int fd = -1;
    return fabpool_buffer_dmabuf(B, 0, 2 * MB, &fd);
}
static fabpool_status c_buffer_export(void)
{
    return fabpool_buffer_export(B, 0, desc, sizeof desc, &n_out, fds_out, 64, &n_out2);
}
static fabpool_status c_buffer_export_done(void) { return fabpool_buffer_export_done(B); }
static fabpool_status c_buffer_peers_ack(void) { return fabpool_buffer_peers_ack(B, UINT64_MAX); }
static fabpool_status c_peers_ack(void) { return fabpool_peers_ack(P, b_export_id, UINT64_MAX); }
static fabpool_status c_block_export(void)
{
    size_t off = 0;
    return fabpool_block_export(P, large, desc, sizeof desc, &n_out, fds_out, 64, &n_out2, &off);
}
/* A view open or apply owns the fds it is given: refused, it still closes them (else T_WRONG). */
static fabpool_status with_fds(int peer, int apply)
{
    int mine[64];
    for (size_t i = 0; i < qnfds; i++)
        mine[i] = dup(qfds[i]);
    fabpool_status st = apply  ? fabpool_view_apply(V, qdesc, qlen, mine, qnfds)
                        : peer ? fabpool_view_open_peer(P, getppid(), qdesc, qlen, mine, qnfds, &nv)
                               : fabpool_view_open(P, qdesc, qlen, mine, qnfds, &nv);
    for (size_t i = 0; i < qnfds; i++)
        if (fcntl(mine[i], F_GETFD) != -1 || errno != EBADF)
            return T_WRONG;
    return st;
}
static fabpool_status c_view_open(void) { return with_fds(0, 0); }
static fabpool_status c_view_open_peer(void) { return with_fds(1, 0); }
static fabpool_status c_view_apply(void) { return with_fds(0, 1); }
static fabpool_status c_view_get_info(void)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    return fabpool_view_get_info(V, &i);
}
static fabpool_status c_view_close(void) { return fabpool_view_close(V); }
static fabpool_status c_view_release(void) { return fabpool_view_release(V); }
/* the calls that cannot fail answer as in the parent (else T_WRONG) */
static void *b_ptr, *v_ptr;
static fabpool_status same(int yes) { return yes ? FABPOOL_OK : T_WRONG; }
static fabpool_status c_handle_type_of(void) { return same(fabpool_handle_type_of(P) == p_type); }
static fabpool_status c_buffer_ptr(void) { return same(fabpool_buffer_ptr(B) == b_ptr); }
static fabpool_status c_view_ptr(void) { return same(fabpool_view_ptr(V) == v_ptr); }
static fabpool_status c_trace_flush(void) { return fabpool_trace_flush(); }
static fabpool_status c_nothing(void) { return FABPOOL_OK; }

typedef struct call {
    const char *name; /* refused: the message begins with it; NULL: the answer is FABPOOL_OK */
    fabpool_status (*fn)(void);
    const char *what;
} call;

static const call calls[] = {
    {NULL, c_nothing, "no call (the thread's exit alone)"},
    {"fabpool_alloc", c_alloc, "fabpool_alloc, 256 bytes (a hit of the thread's cache in the parent)"},
    {"fabpool_alloc", c_alloc_medium, "fabpool_alloc, 16 KiB"},
    {"fabpool_alloc", c_alloc_large, "fabpool_alloc, 3 MiB"},
    {"fabpool_alloc_aligned", c_alloc_aligned, "fabpool_alloc_aligned"},
    {"fabpool_free", c_free, "fabpool_free, 256 bytes"},
    {"fabpool_free", c_free_large, "fabpool_free, 3 MiB"},
    {"fabpool_alloc_on_stream", c_alloc_on_stream, "fabpool_alloc_on_stream"},
    {"fabpool_free_on_stream", c_free_on_stream, "fabpool_free_on_stream"},
    {"fabpool_free_on_stream", c_free_per_thread, "fabpool_free_on_stream, CU_STREAM_PER_THREAD"},
    {"fabpool_record_stream", c_record_stream, "fabpool_record_stream"},
    {"fabpool_stream_owner_end", c_owner_end, "fabpool_stream_owner_end"},
    {"fabpool_usable_size", c_usable_size, "fabpool_usable_size"},
    {"fabpool_trim", c_trim, "fabpool_trim"},
    {"fabpool_thread_flush", c_thread_flush, "fabpool_thread_flush"},
    {"fabpool_collect", c_collect, "fabpool_collect"},
    {"fabpool_collect", c_collect_wait, "fabpool_collect, wait"},
    {"fabpool_sleep", c_sleep, "fabpool_sleep"},
    {"fabpool_wake", c_wake, "fabpool_wake"},
    {"fabpool_sleep_state", c_sleep_state, "fabpool_sleep_state"},
    {"fabpool_get_stats", c_get_stats, "fabpool_get_stats"},
    {"fabpool_reset_peak", c_reset_peak, "fabpool_reset_peak"},
    {"fabpool_get_counters", c_get_counters, "fabpool_get_counters"},
    {"fabpool_get_options", c_get_options, "fabpool_get_options"},
    {"fabpool_device_memory", c_device_memory, "fabpool_device_memory"},
    {"fabpool_print_stats", c_print_stats, "fabpool_print_stats"},
    {"fabpool_stats_json", c_stats_json, "fabpool_stats_json"},
    {"fabpool_check", c_check, "fabpool_check"},
    {"fabpool_destroy", c_destroy, "fabpool_destroy"},
    {"fabpool_buffer_create", c_buffer_create, "fabpool_buffer_create"},
    {"fabpool_buffer_reuse", c_buffer_reuse, "fabpool_buffer_reuse"},
    {"fabpool_buffer_resize", c_buffer_resize, "fabpool_buffer_resize"},
    {"fabpool_buffer_resize_set", c_buffer_resize_set, "fabpool_buffer_resize_set"},
    {"fabpool_buffer_destroy", c_buffer_destroy, "fabpool_buffer_destroy"},
    {"fabpool_buffer_release", c_buffer_release, "fabpool_buffer_release"},
    {"fabpool_buffer_get_info", c_buffer_get_info, "fabpool_buffer_get_info"},
    {"fabpool_buffer_dmabuf", c_buffer_dmabuf, "fabpool_buffer_dmabuf"},
    {"fabpool_buffer_export", c_buffer_export, "fabpool_buffer_export"},
    {"fabpool_buffer_export_done", c_buffer_export_done, "fabpool_buffer_export_done"},
    {"fabpool_buffer_peers_ack", c_buffer_peers_ack, "fabpool_buffer_peers_ack"},
    {"fabpool_peers_ack", c_peers_ack, "fabpool_peers_ack"},
    {"fabpool_block_export", c_block_export, "fabpool_block_export"},
    {"fabpool_view_open", c_view_open, "fabpool_view_open"},
    {"fabpool_view_open_peer", c_view_open_peer, "fabpool_view_open_peer"},
    {"fabpool_view_apply", c_view_apply, "fabpool_view_apply"},
    {"fabpool_view_get_info", c_view_get_info, "fabpool_view_get_info"},
    {"fabpool_view_close", c_view_close, "fabpool_view_close"},
    {"fabpool_view_release", c_view_release, "fabpool_view_release"},
    {NULL, c_handle_type_of, "fabpool_handle_type_of"},
    {NULL, c_buffer_ptr, "fabpool_buffer_ptr"},
    {NULL, c_view_ptr, "fabpool_view_ptr"},
    {NULL, c_trace_flush, "fabpool_trace_flush"},
};
enum { N_CALLS = sizeof calls / sizeof calls[0] };

/* What a child says before its thread ends: which call, and whether it answered as it should. */
typedef struct said {
    int i, ok;
} said;

static int answered_right(const call *c, fabpool_status st)
{
    if (!c->name)
        return st == FABPOOL_OK;
    const char *m = fabpool_last_error();
    size_t n = strlen(c->name);
    return st == FABPOOL_ERR_NOT_SUPPORTED && strncmp(m, c->name, n) == 0 && m[n] == ':' && strstr(m, "forked");
}

static _Noreturn void child(int i, int wfd)
{
    alarm(ALARM_S);
    const call *c = &calls[i];
    fabpool_status st = c->fn();
    said s = {i, answered_right(c, st)};
    if (!s.ok)
        fprintf(stderr, "child: %s -> %s (%s)\n", c->what, fabpool_status_name(st), fabpool_last_error());
    if (write(wfd, &s, sizeof s) != (ssize_t)sizeof s || !s.ok)
        _exit(1);
    pthread_exit(NULL); /* the child's only thread: its exit hooks run, then the process exits 0 */
}

static void *sleeper(void *arg)
{
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    slept = fabpool_sleep(P, FABPOOL_SLEEP_DISCARD, S); /* waits for S with the pool lock held */
    return NULL;
}

/* The pools, their blocks, buffers and view, and the calling thread's caches of P (small and medium blocks). */
static void build(void)
{
    P = t_pool("handle_type:auto,keep_ms:60000");
    Q = t_pool("handle_type:auto");
    CHECK(P && Q && (p_type = fabpool_handle_type_of(P)) != FABPOOL_HANDLE_NONE);
    CHECK_CU(cuStreamCreate(&S, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&S2, CU_STREAM_NON_BLOCKING));
    void *x[16];
    for (size_t sz = 256; sz <= (16 << 10); sz *= 64) {
        for (int i = 0; i < 16; i++)
            CHECK_OK(fabpool_alloc(P, sz, &x[i]));
        for (int i = 0; i < 16; i++)
            CHECK_OK(fabpool_free(P, x[i]));
    }
    CHECK_OK(fabpool_alloc(P, 256, &small));
    CHECK_OK(fabpool_alloc(P, 3 * MB, &large));
    CHECK_OK(fabpool_buffer_create(P, 64 * MB, 8 * MB, &B));
    CHECK_OK(fabpool_buffer_create(P, 64 * MB, 4 * MB, &B2));
    size_t len = 0, nfds = 0;
    int fds[64];
    CHECK_OK(fabpool_buffer_export(B, 0, desc, sizeof desc, &len, fds, 64, &nfds));
    CHECK_OK(fabpool_buffer_export_done(B));
    CHECK_OK(fabpool_buffer_peers_ack(B, UINT64_MAX)); /* no peer: the sleep is not refused */
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(B, &bi));
    b_export_id = bi.export_id;
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    CHECK_OK(fabpool_buffer_create(Q, 16 * MB, 4 * MB, &QB));
    CHECK_OK(fabpool_buffer_export(QB, 0, qdesc, sizeof qdesc, &qlen, qfds, 64, &qnfds));
    int mine[64];
    for (size_t i = 0; i < qnfds; i++)
        mine[i] = dup(qfds[i]);
    CHECK_OK(fabpool_view_open(P, qdesc, qlen, mine, qnfds, &V));
    b_ptr = fabpool_buffer_ptr(B);
    v_ptr = fabpool_view_ptr(V);
}

static void unbuild(void)
{
    CHECK_OK(fabpool_view_close(V));
    fabpool_buffer_t *bufs[] = {B, B2};
    void *blocks[] = {small, large};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(fabpool_buffer_destroy(bufs[i], NULL));
        CHECK_OK(fabpool_free(P, blocks[i]));
    }
    CHECK_OK(fabpool_check(P));
    CHECK_OK(fabpool_destroy(P));
    for (size_t i = 0; i < qnfds; i++)
        close(qfds[i]);
    CHECK_OK(fabpool_buffer_export_done(QB));
    CHECK_OK(fabpool_buffer_peers_ack(QB, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(QB, NULL));
    CHECK_OK(fabpool_destroy(Q));
    CHECK_CU(cuStreamDestroy(S));
    CHECK_CU(cuStreamDestroy(S2));
}

/* Forks a child per call while the sleep holds P's lock, and counts what hung. */
static void children(void)
{
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid[N_CALLS];
    for (int i = 0; i < N_CALLS; i++) {
        pid[i] = fork();
        if (pid[i] == 0) {
            close(pfd[0]);
            child(i, pfd[1]);
        }
        CHECK(pid[i] > 0);
    }
    close(pfd[1]);
    int ws[N_CALLS], answered[N_CALLS] = {0};
    for (int i = 0; i < N_CALLS; i++)
        CHECK(pid[i] > 0 && waitpid(pid[i], &ws[i], 0) == pid[i]);
    said s;
    while (read(pfd[0], &s, sizeof s) == (ssize_t)sizeof s)
        if (s.i >= 0 && s.i < N_CALLS)
            answered[s.i] = 1 + s.ok;
    close(pfd[0]);
    int hung_calls = 0, hung_exits = 0, wrong = 0;
    for (int i = 0; i < N_CALLS; i++) {
        int alarmed = WIFSIGNALED(ws[i]) && WTERMSIG(ws[i]) == SIGALRM;
        if (alarmed && !answered[i])
            printf("  hung in the call: %s\n", calls[i].what), hung_calls++;
        else if (alarmed && answered[i] == 2)
            printf("  hung at the thread's exit, after %s answered\n", calls[i].what), hung_exits++;
        else if (answered[i] != 2 || !WIFEXITED(ws[i]) || WEXITSTATUS(ws[i]) != 0)
            printf("  wrong: %s (answered %d, wait status 0x%x)\n", calls[i].what, answered[i], ws[i]), wrong++;
    }
    printf("forked children: %d calls, %d hung in the call, %d hung at the thread's exit, %d wrong\n", N_CALLS,
           hung_calls, hung_exits, wrong);
    CHECK(hung_calls == 0);
    CHECK(hung_exits == 0);
    CHECK(wrong == 0);
}

int main(void)
{
    t_sim_hooks h = t_sim_required("test_forked_child_never_hangs", "its long stream hold");
    build();
    CHECK(h.hold_long(S) == 0);
    uint64_t syncs = h.calls("cuStreamSynchronize");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sleeper, NULL) == 0);
    /* the sleep takes the pool lock before it waits for S: once it waits, the lock is held */
    for (int ms = 0; h.calls("cuStreamSynchronize") == syncs && ms < 10000; ms++)
        usleep(1000);
    CHECK(h.calls("cuStreamSynchronize") > syncs);
    children();
    CHECK(h.release(S) == 0);
    pthread_join(t, NULL);
    CHECK_OK(slept);
    CHECK_OK(fabpool_wake(P, NULL));
    unbuild();
    fabsim_ledger l = t_ledger();
    CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    return t_done("test_forked_child_never_hangs");
}
