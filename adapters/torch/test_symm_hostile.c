/* test_symm_hostile: the symmetric buffer's fds over its sockets (symm.c, symm_pass.c) with a peer that does not
 * read, with many fds in flight under an ordinary user's limit, and with a pair whose exchange failed; on the
 * simulated driver, over 2 or 4 forked ranks whose parent is their all-gather (symm_group.h).  Every call is
 * bounded (alarm): a hang fails the test instead of holding it.  Cases (test_symm_hostile CASE):
 *   noread     rank 1 takes part in every round and says it took every fd, but never reads its socket: rank 0's
 *              resizes fail within timeout_ms and a margin, naming rank 1, however many it makes (a send that
 *              waited on the socket would block once its buffer is full, some 280 unread messages on): at the
 *              resize after the one whose message rank 1 left unread, and in the very resize whose fds need a
 *              second message; every rank then broke the object, and the next resize says so at once;
 *   many_fds   8 ranks of 64 chunks each (128 MiB of max_chunk 2 MiB) as a user without CAP_SYS_RESOURCE and a
 *              soft RLIMIT_NOFILE of 1024 (as root: in a child that drops to uid 65534): create, and six shrinks
 *              to one chunk each followed by a grow back, work: the kernel limits the user's fds in flight
 *              (ETOOMANYREFS past 1024), and every fd of such a group in flight at once would be over 3500;
 *   stall      one pass of fds (sy_pass) against a forked peer that breaks it: sends half a message and stops,
 *              reads nothing, announces 65 fds or fewer than it attaches or more, or names another call: the pair
 *              fails by the deadline, no fd stays open, and a peer that stops makes the rank look again at most
 *              once a ms on average (a look every 100 us burned 10 to 17% of a core to a 30 s deadline);
 *   lost_pair  rank 1 is late with its fds by more than timeout_ms in one resize: it fails on both ranks, breaks
 *              the object, and says that the group must create the buffer again, promising no repair; every
 *              later resize says so at once; the group creates a new buffer and it works;
 *   no_fds     the mesh (sy_mesh) of a rank out of fds (RLIMIT_NOFILE at its lowest free fd) while a forked lower
 *              rank's connection and ident wait in its listener's queue: it cannot accept it, and rests rather
 *              than wake again and again on the listener that poll says readable at once (under a quarter of
 *              the wait's time in CPU, where a spin costs all of it): to the deadline, it fails with the mesh's
 *              message naming rank 0; with fds free again after a while, it takes the connection and the mesh
 *              works; no fd stays open (under valgrind, which closes the connection it cannot give an fd, only
 *              the CPU, the wakes and the fds are checked).
 * symm.c and symm_pass.c are compiled into this file so that rank 1 can skip its reads and maps, and the
 * all-gather can tell the rounds apart. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "other_user.h"
#include "symm.h"
#include "symm_group.h"
#include "symm_pass.h"
#include "procfs.h"

/* rank 1 from the first resize of the noread case: it reads nothing its peer sends, and says it took it all
 * (fds of /dev/null stand in) and mapped it, so that it says OK in every round and keeps its socket; its own
 * fds it sends as a rank does */
static int t_noread;
static void t_pass(sy_pass_peer *p, int n, int self, const int *fds, uint64_t seq, uint64_t deadline_ns,
                   int timeout_ms, sy_pass_took_fn took, void *ctx);
static fabpool_status t_view_apply(fabpool_view_t *v, const void *desc, size_t len, const int *fds, size_t nfds)
{
    if (t_noread) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        return FABPOOL_OK;
    }
    return fabpool_view_apply(v, desc, len, fds, nfds);
}
/* the mesh's waits, counted: how often a rank wakes while its peers' connections wait */
static long t_polls;
static int t_poll(struct pollfd *pf, nfds_t n, int timeout)
{
    t_polls++;
    return poll(pf, n, timeout);
}
#define sy_pass t_pass
#define fabpool_view_apply t_view_apply
#define poll t_poll
#include "symm.c"
#undef sy_pass
#undef fabpool_view_apply
#undef poll
/* the pass's waits, counted: how often a rank looks at a pair that does not move */
static long t_ppolls;
static int t_ppoll(struct pollfd *pf, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
    t_ppolls++;
    return ppoll(pf, n, ts, mask);
}
#define ppoll t_ppoll
#include "symm_pass.c"
#undef ppoll

static void t_pass(sy_pass_peer *p, int n, int self, const int *fds, uint64_t seq, uint64_t deadline_ns,
                   int timeout_ms, sy_pass_took_fn took, void *ctx)
{
    size_t in[MAXR] = {0};
    for (int q = 0; t_noread && q < n && q < MAXR; q++) {
        in[q] = p[q].in;
        p[q].in = 0;
    }
    sy_pass(p, n, self, fds, seq, deadline_ns, timeout_ms, took, ctx);
    for (int q = 0; t_noread && q < n && q < MAXR; q++) {
        if (p[q].sock < 0 || p[q].st != FABPOOL_OK || in[q] == 0)
            continue;
        p[q].in = p[q].got = in[q];
        for (size_t i = 0; i < in[q]; i++)
            p[q].fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        p[q].taken = 1;
        took(ctx, q, p[q].fds);
    }
}

#define MB (1ull << 20)

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* this rank waits this long (ms) after the DESC round of its next exchange, before it passes its fds */
static int t_late_ms;
static int t_allgather(void *ctx, const void *send, void *recv, size_t bytes)
{
    sy_head h;
    memcpy(&h, send, sizeof h);
    int rc = allgather(ctx, send, recv, bytes);
    if (rc == 0 && h.phase == SY_DESC && t_late_ms > 0) {
        usleep((useconds_t)t_late_ms * 1000);
        t_late_ms = 0;
    }
    return rc;
}

static fabpool_torch_symm_t *make(grp *g, uint64_t max, uint64_t bytes, int timeout_ms)
{
    fabpool_torch_symm_options o = symm_group_options(g, t_allgather, max, bytes);
    o.conf = "max_chunk:2MiB";
    o.timeout_ms = timeout_ms;
    return symm_group_create(g, &o);
}

/* A resize bounded by an alarm (a call that hangs kills the rank, and the test fails); its time in *ms. */
static fabpool_status resize_bounded(fabpool_torch_symm_t *s, uint64_t bytes, int bound_s, long *ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    alarm((unsigned)bound_s);
    fabpool_status st = fabpool_torch_symm_resize(s, bytes);
    alarm(0);
    *ms = ms_since(&t0);
    return st;
}

/* The object broke on this rank: the next resize answers at once that the group must create it again. */
static void broken_now(fabpool_torch_symm_t *s, int rank)
{
    long ms = 0;
    fabpool_status st = resize_bounded(s, 8 * MB, 5, &ms);
    const char *m = fabpool_torch_symm_last_error();
    if (st != FABPOOL_ERR_IO || !strstr(m, "broke off") || !strstr(m, "creates the buffer again"))
        fprintf(stderr, "rank %d: the resize after the lost pair -> %s: %s\n", rank, fabpool_status_name(st), m);
    CHECK(st == FABPOOL_ERR_IO && strstr(m, "broke off") && strstr(m, "creates the buffer again"));
    CHECK(ms < 500);
}

/* ------------------------------------------------------------------ noread */

#define NOREAD_MS 1000
#define NOREAD_CALLS 400 /* past the ~280 unread messages a socket's default send buffer holds */

/* Resizes between 2 and 4 MiB (a grow sends rank 0's new chunk) until one fails; the number of the call that
 * failed (NOREAD_CALLS: none), its time and message. */
static int noread_loop(fabpool_torch_symm_t *s, long *ms, char *msg, size_t cap)
{
    for (int i = 0; i < NOREAD_CALLS; i++) {
        fabpool_status st = resize_bounded(s, i % 2 ? 2 * MB : 4 * MB, NOREAD_MS / 1000 + 10, ms);
        if (st != FABPOOL_OK) {
            snprintf(msg, cap, "%s: %.3000s", fabpool_status_name(st), fabpool_torch_symm_last_error());
            return i;
        }
    }
    return NOREAD_CALLS;
}

static void case_noread(grp *g, void *arg)
{
    (void)arg;
    char msg[4096] = "";
    long ms = 0;
    /* one message of fds a resize, never read: found unread at the next exchange */
    fabpool_torch_symm_t *s = make(g, 256 * MB, 2 * MB, NOREAD_MS);
    if (!s)
        return;
    t_noread = g->rank == 1;
    int failed_at = noread_loop(s, &ms, msg, sizeof msg);
    if (g->rank == 0) {
        printf("rank 0: resize %d of %d failed after %ld ms: %.600s\n", failed_at, NOREAD_CALLS, ms, msg);
        CHECK(failed_at <= 1);
        CHECK(ms < NOREAD_MS + 2000);
        CHECK(strstr(msg, "rank 0 (this rank): rank 1 left unread") != NULL);
    }
    if (failed_at < NOREAD_CALLS)
        broken_now(s, g->rank);
    t_noread = 0;
    CHECK_OK(fabpool_torch_symm_close(s));

    /* a resize whose fds need two messages: rank 0 waits for rank 1 to read the first, to its deadline */
    s = make(g, 256 * MB, 2 * MB, NOREAD_MS);
    if (!s)
        return;
    t_noread = g->rank == 1;
    fabpool_status st = resize_bounded(s, 200 * MB, NOREAD_MS / 1000 + 10, &ms);
    const char *m = fabpool_torch_symm_last_error();
    if (g->rank == 0) {
        printf("rank 0: a resize of 99 new chunks -> %s after %ld ms: %.600s\n", fabpool_status_name(st), ms, m);
        CHECK(st == FABPOOL_ERR_IO && strstr(m, "rank 1 did not read the fds this rank sent it") != NULL);
        CHECK(ms >= NOREAD_MS - 50 && ms < NOREAD_MS + 2000);
    }
    if (st != FABPOOL_OK)
        broken_now(s, g->rank);
    t_noread = 0;
    CHECK_OK(fabpool_torch_symm_close(s));
}

/* --------------------------------------------------------------- many_fds */

#define MANY_RANKS 8
#define MANY_BYTES (128 * MB) /* 64 chunks of 2 MiB */
#define MANY_NOFILE 1024

static void case_many_fds(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 4 * MANY_BYTES, MANY_BYTES, 10000);
    if (!s)
        return;
    fabpool_torch_symm_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_torch_symm_get_info(s, &in));
    CHECK(in.records_exported == MANY_BYTES / (2 * MB));
    CHECK(in.fds_sent == (MANY_RANKS - 1) * in.records_exported);
    /* down to one chunk and up to 64 again, six times: every grow passes 63 fds to each peer (the sim keeps an
     * fd for every chunk of the buffer and of each view, 512 here, so the buffers stay within 128 MiB) */
    uint64_t sizes[12];
    for (int i = 0; i < 12; i++)
        sizes[i] = i % 2 ? MANY_BYTES : 2 * MB;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        long ms = 0;
        fabpool_status st = resize_bounded(s, sizes[i], 60, &ms);
        if (st != FABPOOL_OK)
            fprintf(stderr, "rank %d: resize to %llu MiB -> %s: %s\n", g->rank, (unsigned long long)(sizes[i] >> 20),
                    fabpool_status_name(st), fabpool_torch_symm_last_error());
        CHECK(st == FABPOOL_OK);
    }
    uint64_t got[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, got, MAXR));
    for (int q = 0; q < g->n; q++)
        CHECK(got[q] >= MANY_BYTES);
    CHECK_OK(fabpool_torch_symm_close(s));
}

static void many_fds_rank(grp *g, void *arg);

/* Whether this process has a capability that lifts the kernel's limit of fds in flight (CAP_SYS_RESOURCE 24,
 * CAP_SYS_ADMIN 21), from /proc/self/status; 1 where it cannot tell. */
static int fds_in_flight_unlimited(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned long long eff = ~0ull;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1)
            break;
    if (f)
        fclose(f);
    return (eff & ((1ull << 24) | (1ull << 21))) != 0;
}

/* The group as a user whose fds in flight the kernel limits, with a soft RLIMIT_NOFILE of MANY_NOFILE: 0 when
 * every rank worked, 1 when one failed, 77 where this process cannot be such a user. */
static int many_fds_as_user(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1;
    if (rl.rlim_max > MANY_NOFILE)
        rl.rlim_cur = MANY_NOFILE;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("test_symm_hostile: setrlimit");
        return 1;
    }
    if (fds_in_flight_unlimited()) {
        printf("test_symm_hostile many_fds: skipped: this process has CAP_SYS_RESOURCE or CAP_SYS_ADMIN, which "
               "lift the kernel's limit of fds in flight, and is not root (which could drop them)\n");
        return 77;
    }
    printf("test_symm_hostile many_fds: uid %d, RLIMIT_NOFILE %llu, %d ranks of %llu chunks\n", (int)geteuid(),
           (unsigned long long)rl.rlim_cur, MANY_RANKS, (unsigned long long)(MANY_BYTES / (2 * MB)));
    fflush(stdout);
    return run_group(MANY_RANKS, many_fds_rank, NULL) ? 1 : 0;
}

static int many_fds_child(void *arg)
{
    (void)arg;
    return many_fds_as_user();
}

/* -------------------------------------------------------------- lost_pair */

#define LATE_MS 1000

static void case_lost_pair(grp *g, void *arg)
{
    (void)arg;
    fabpool_torch_symm_t *s = make(g, 256 * MB, 32 * MB, LATE_MS);
    if (!s)
        return;
    t_late_ms = g->rank == 1 ? LATE_MS + 300 : 0;
    long ms = 0;
    fabpool_status st = resize_bounded(s, 34 * MB, 10, &ms);
    const char *m = fabpool_torch_symm_last_error();
    if (st != FABPOOL_ERR_IO || !strstr(m, "only close is left") || !strstr(m, "creates it again") ||
        strstr(m, "brings the views"))
        fprintf(stderr, "rank %d: the late exchange -> %s: %s\n", g->rank, fabpool_status_name(st), m);
    CHECK(st == FABPOOL_ERR_IO);
    CHECK(strstr(m, g->rank == 0 ? "rank 0 (this rank): rank 1's fds did not come within"
                                 : "rank 0: rank 1's fds did not come within") != NULL);
    CHECK(strstr(m, "only close is left") && strstr(m, "creates it again"));
    CHECK(strstr(m, "brings the views") == NULL); /* no repair is promised: none happens */
    CHECK(ms < LATE_MS + 2500);
    broken_now(s, g->rank);
    broken_now(s, g->rank);
    CHECK_OK(fabpool_torch_symm_close(s));
    /* the group creates the buffer again: its sockets are new, and it works */
    s = make(g, 256 * MB, 32 * MB, LATE_MS);
    if (!s)
        return;
    CHECK_STATUS(resize_bounded(s, 40 * MB, 10, &ms), FABPOOL_OK);
    uint64_t sizes[MAXR];
    CHECK_OK(fabpool_torch_symm_sizes(s, sizes, MAXR));
    CHECK(sizes[0] == 40 * MB && sizes[1] == 40 * MB);
    CHECK_OK(fabpool_torch_symm_close(s));
}

/* ------------------------------------------------------------------ stall */

#define STALL_MS 2000

enum { ST_HALF, ST_NOREAD, ST_TOO_MANY, ST_MORE_FDS, ST_FEWER_FDS, ST_OTHER_CALL, ST_N };
static const char *const stall_names[ST_N] = {"half a message, then silent", "reads nothing", "announces 65 fds",
                                              "attaches 3 fds to a message of 1", "attaches 1 fd to a message of 2",
                                              "names call #8 in call #7"};

/* The hostile rank 1 of a pass: one message as `how` says (a head of nfds fds and 8 bytes of call seq, `att` fds
 * of /dev/null on its first byte, `bytes` of it sent), then silent until killed, reading nothing. */
static void stall_peer(int sock, int how)
{
    uint32_t nfds = how == ST_TOO_MANY ? 65 : how == ST_FEWER_FDS ? 2 : 1;
    uint32_t att = how == ST_MORE_FDS ? 3 : 1;
    uint64_t seq = how == ST_OTHER_CALL ? 8 : 7;
    uint8_t m[16];
    uint32_t head[2] = {nfds, 8};
    memcpy(m, head, 8);
    memcpy(m + 8, &seq, 8);
    int fds[3];
    for (uint32_t i = 0; i < att; i++)
        fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof fds)];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {m, how == ST_HALF ? 5 : sizeof m};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = CMSG_SPACE(sizeof(int) * att)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * att);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * att);
    if (how != ST_NOREAD && sendmsg(sock, &h, MSG_NOSIGNAL) < 0)
        _exit(1);
    for (;;)
        pause();
}

static void stall_took(void *ctx, int q, int *fds)
{
    (void)q;
    for (size_t i = 0; i < *(size_t *)ctx; i++)
        close(fds[i]);
}

/* The CPU time (user and system, s) of who: RUSAGE_SELF or RUSAGE_THREAD. */
static double cpu_s(int who)
{
    struct rusage u;
    getrusage(who, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* Rank 0's pass against rank 1 behaving as `how`: rank 0 takes 1 fd (2 where rank 1 attaches 1 of 2; none where
 * rank 1 reads nothing: then it sends 100, two messages, the second of which waits for rank 1 to read the
 * first). */
static void stall_one(int how)
{
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    pid_t c = fork();
    if (c == 0) {
        close(sv[0]);
        stall_peer(sv[1], how);
    }
    close(sv[1]);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int before = fd_count(), out[100], in[SY_PASS_BATCH];
    for (int i = 0; i < 100; i++)
        out[i] = null; /* any fd will do: rank 1 never reads them */
    sy_pass_peer p[2];
    memset(p, 0, sizeof p);
    p[0].sock = -1;
    p[1].sock = sv[0];
    p[1].fds = in;
    p[1].in = how == ST_NOREAD ? 0 : how == ST_FEWER_FDS ? 2 : 1;
    p[1].out = how == ST_NOREAD ? 100 : 0;
    t_ppolls = 0;
    double c0 = cpu_s(RUSAGE_SELF);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    alarm(STALL_MS / 1000 + 10);
    sy_pass(p, 2, 0, out, 7, pass_now_ns() + (uint64_t)STALL_MS * 1000000u, STALL_MS, stall_took, &p[1].in);
    alarm(0);
    long ms = ms_since(&t0);
    double cpu = cpu_s(RUSAGE_SELF) - c0;
    printf("%-34s -> %ld ms, %.3f s of CPU, %ld looks: %.300s\n", stall_names[how], ms, cpu, t_ppolls, p[1].err);
    CHECK(p[1].st == FABPOOL_ERR_IO || p[1].st == FABPOOL_ERR_DESCRIPTOR);
    CHECK(ms < STALL_MS + 1000);
    CHECK(fd_count() == before); /* every fd that came was closed */
    if (how == ST_HALF || how == ST_NOREAD) {
        CHECK(ms >= STALL_MS - 50);
        CHECK(t_ppolls <= STALL_MS); /* at most a look a ms on average */
        CHECK(cpu < STALL_MS / 1000.0 / 10);
    }
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    close(sv[0]);
    close(null);
}

static int case_stall(void)
{
    for (int how = 0; how < ST_N; how++)
        stall_one(how);
    printf("stall: %d checks, %d failed\n", t_checks, t_failures);
    return t_failures != 0;
}

/* ----------------------------------------------------------------- no_fds */

#define NOFDS_MS 1000 /* the mesh's timeout_ms (its message names it) */
#define NOFDS_FREE_MS 300 /* the second mesh: fds are free again after this long (its line says so) */

/* Rank `rank` of a group of 2 on one host, made by hand for sy_mesh alone: peers[q] declared pid[q] and
 * nonce[q]; the secret is the same on both ranks. */
static void nofds_rank(fabpool_torch_symm_t *s, sy_hello peers[2], int sock[2], int rank, const pid_t pid[2],
                       const uint64_t nonce[2])
{
    memset(s, 0, sizeof *s);
    memset(peers, 0, 2 * sizeof *peers);
    for (int q = 0; q < 2; q++) {
        peers[q].pid = pid[q];
        peers[q].nonce = nonce[q];
        snprintf(peers[q].host, sizeof peers[q].host, "no_fds");
        sock[q] = -1;
    }
    snprintf(s->host, sizeof s->host, "no_fds");
    memset(s->secret, 0x5a, sizeof s->secret);
    s->rank = rank;
    s->nranks = 2;
    s->timeout_ms = NOFDS_MS;
    s->peers = peers;
    s->sock = sock;
    s->listener = -1;
}

/* fds free again: RLIMIT_NOFILE back as it was, after NOFDS_FREE_MS */
static void *nofds_free(void *arg)
{
    usleep(NOFDS_FREE_MS * 1000);
    if (setrlimit(RLIMIT_NOFILE, arg) != 0)
        perror("test_symm_hostile no_fds: setrlimit");
    return NULL;
}

/* Whether this process runs under valgrind, which keeps RLIMIT_NOFILE itself: the kernel takes the connection,
 * and valgrind closes it (EMFILE), so that rank 0 may fail to send its ident and rank 1 waits to the deadline;
 * then only the CPU, the wakes and the fds tell. */
static int under_valgrind(void)
{
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

/* Rank 1's mesh, its process out of fds while rank 0 (a forked child) connects and sends its ident; with
 * free_later, the limit comes back after NOFDS_FREE_MS (from another thread, whose CPU is not counted). */
static void nofds_one(int free_later)
{
    int before = fd_count();
    fabpool_torch_symm_t s;
    sy_hello peers[2];
    int sock[2];
    pid_t pid[2] = {0, getpid()};
    uint64_t nonce[2] = {0, ((uint64_t)getpid() << 32) ^ (uint64_t)now_ns()};
    char name[96];
    sy_sock_name(name, sizeof name, (int)pid[1], nonce[1]);
    int listener = -1;
    CHECK_OK(fabpool_fd_listen(name, &listener));
    CHECK(fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK) == 0);
    fflush(stdout);
    pid[0] = fork();
    if (pid[0] == 0) { /* rank 0: connects to rank 1's listener and says who it is */
        close(listener);
        nofds_rank(&s, peers, sock, 0, pid, nonce);
        s.peers[0].pid = getpid();
        fabpool_status st = sy_mesh(&s);
        if (st != FABPOOL_OK && !under_valgrind())
            fprintf(stderr, "no_fds: rank 0's mesh -> %s: %s\n", fabpool_status_name(st), sy_msg);
        _exit(st == FABPOOL_OK ? 0 : 1);
    }
    CHECK(pid[0] > 0);
    nofds_rank(&s, peers, sock, 1, pid, nonce);
    s.listener = listener;
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    int lowest = fcntl(listener, F_DUPFD, 0); /* the lowest free fd: a limit there leaves no room for one more */
    CHECK(lowest >= 0);
    close(lowest);
    struct rlimit none = {(rlim_t)lowest, old.rlim_max};
    CHECK(setrlimit(RLIMIT_NOFILE, &none) == 0);
    pthread_t th;
    CHECK(!free_later || pthread_create(&th, NULL, nofds_free, &old) == 0);
    t_polls = 0;
    double c0 = cpu_s(RUSAGE_THREAD);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    alarm(NOFDS_MS / 1000 + 10);
    fabpool_status st = sy_mesh(&s);
    alarm(0);
    long ms = ms_since(&t0);
    double cpu = cpu_s(RUSAGE_THREAD) - c0;
    if (free_later)
        CHECK(pthread_join(th, NULL) == 0);
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    printf("rank 1 out of fds%s -> %s after %ld ms, %.3f s of CPU, %ld wakes: %.300s\n",
           free_later ? " (free again after 300 ms)" : "", fabpool_status_name(st), ms, cpu, t_polls,
           st == FABPOOL_OK ? "" : sy_msg);
    CHECK(cpu < ms / 1000.0 / 4); /* resting: a spin on the listener costs the whole wait */
    CHECK(t_polls < ms / 5 + 10);  /* two wakes a rest of SY_ACCEPT_REST_MS; a spin wakes some 200 times a ms */
    int vg = under_valgrind();
    if (vg) {
        CHECK(st == FABPOOL_OK || st == FABPOOL_ERR_IO);
    } else if (free_later) {
        CHECK(st == FABPOOL_OK && s.sock[0] >= 0);
        CHECK(ms >= NOFDS_FREE_MS - 50 && ms < NOFDS_MS);
    } else {
        CHECK(st == FABPOOL_ERR_IO && s.sock[0] < 0);
        CHECK(strstr(sy_msg, "rank(s) 0 of this host did not identify themselves within 1000 ms") != NULL);
        CHECK(ms >= NOFDS_MS - 50 && ms < NOFDS_MS + 1000);
    }
    CHECK(s.listener < 0);
    if (s.sock[0] >= 0)
        close(s.sock[0]);
    int status = -1;
    CHECK(waitpid(pid[0], &status, 0) == pid[0] && WIFEXITED(status) && (vg || WEXITSTATUS(status) == 0));
    CHECK(fd_count() == before);
}

static int case_no_fds(void)
{
    nofds_one(0);
    nofds_one(1);
    printf("no_fds: %d checks, %d failed\n", t_checks, t_failures);
    return t_failures != 0;
}

/* ------------------------------------------------------------------- main */

static void rank_fn(void (*fn)(grp *, void *), grp *g)
{
    fn(g, NULL);
    printf("rank %d: %d checks, %d failed\n", g->rank, t_checks, t_failures);
}
static void noread_rank(grp *g, void *arg) { (void)arg; rank_fn(case_noread, g); }
static void many_fds_rank(grp *g, void *arg) { (void)arg; rank_fn(case_many_fds, g); }
static void lost_pair_rank(grp *g, void *arg) { (void)arg; rank_fn(case_lost_pair, g); }

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    int failed = 0;
    if (strcmp(c, "noread") == 0)
        failed = run_group(2, noread_rank, NULL);
    else if (strcmp(c, "stall") == 0)
        failed = case_stall();
    else if (strcmp(c, "lost_pair") == 0)
        failed = run_group(2, lost_pair_rank, NULL);
    else if (strcmp(c, "no_fds") == 0)
        failed = case_no_fds();
    else if (strcmp(c, "many_fds") == 0 && !other_user_can()) {
        int rc = many_fds_as_user();
        if (rc == 77)
            return 77;
        failed = rc != 0;
    } else if (strcmp(c, "many_fds") == 0) {
        pid_t pid = -1;
        if (other_user_fork(many_fds_child, NULL, &pid) != 0)
            return 1;
        int rc = other_user_wait(pid);
        if (rc == 77)
            return 77;
        failed = rc != 0;
    } else {
        fprintf(stderr, "usage: test_symm_hostile noread|many_fds|lost_pair|stall|no_fds\n");
        return 2;
    }
    printf("test_symm_hostile %s: %s\n", c, failed ? "FAILED" : "passed");
    return failed ? 1 : 0;
}
