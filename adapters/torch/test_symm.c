/* test_symm: symmetric memory (symm.c) over 4 forked ranks, in C, so that the sanitizers and valgrind see
 * it (test_symm_python covers more through the Python module).  The parent is the group's all-gather: a hub
 * over a socket pair per rank; it never touches CUDA.  Each rank:
 *   - creates with a different size asked (all get the largest), resizes through random sizes up and down,
 *     and after each step writes its words and reads every peer's through the pointers, with no address moved;
 *   - with rank 1's cuMemCreate failing (sim faults): every rank's resize fails naming rank 1, the sizes and
 *     data stay, the next resize works;
 *   - with different max_bytes: every rank's create fails, naming each rank's;
 *   - ends holding nothing (the sim's ledger).
 * Then what a process that is not a rank, or a rank's corrupt message, can do (the all-gather of the test
 * stands in for a hostile one where a case needs it; symm.c is compiled into this file for its message
 * layout, and symm_pass.c so that the fd sends can be cut short):
 *   - a process of another user (uid 65534, as root) connects to rank 3's listener during create, silent or
 *     saying "rank 0" of the group's public name: refused at once, no fd, create works well within
 *     timeout_ms;
 *   - the same from a process of this user that no rank declared;
 *   - another user's process listens at the name the ranks are told for rank 3: no rank sends it a byte,
 *     every create fails with FABPOOL_ERR_PERMISSION;
 *   - rank 2 states a descriptor of 2^64-1 bytes, an fd count that wraps, an fd count past its records:
 *     every rank fails naming rank 2, no fd left open, no crash;
 *   - pidfd transport, in turns as under Yama ptrace_scope 1: rank 0's pid replaced by a process holding
 *     memfds: refused by the token check, nothing mapped;
 *   - rank 1 sends part of its fd message and stays connected: create and resize answer within
 *     timeout_ms and a margin, and the resize breaks the object on every rank (that pair has lost its
 *     socket): the next resize says so at once;
 *   - with the peers option letting any user and pid in, a stranger that connects first to rank 3 and stays
 *     silent, or sends half an ident: the mesh forms well within timeout_ms all the same; and processes of seven
 *     other users flooding rank 3's listener (connect and close, or hold connections silent or with half an
 *     ident): the mesh forms all the same.
 * Usage: test_symm [steps [case]]: case (silent, ident, same_user, squat, len, fd_wrap, fd_records, pid, cut,
 * loose_silent, loose_half, loose_flood) runs that case alone after the steps. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "other_user.h"
#include "conn_flood.h"
#include "procfs.h"
#include "symm.h"
#include "symm_group.h"

/* rank 1 cuts its next fd message to rank 0 short (4 bytes of its 8-byte head, no fd) when set, and goes on as
 * if it had sent it whole; rank 0's pid from the last HELLO round (t_allgather) */
static int t_cut_send, t_pid0;
static ssize_t t_sendmsg(int sock, const struct msghdr *m, int flags)
{
    int peer = 0;
    if (t_cut_send && m->msg_controllen > 0 && m->msg_iov[0].iov_len >= 4 &&
        fabpool_fd_peer(sock, &peer, NULL) == FABPOOL_OK && peer == t_pid0) {
        t_cut_send = 0;
        ssize_t r = send(sock, m->msg_iov[0].iov_base, 4, flags);
        return r == 4 ? (ssize_t)m->msg_iov[0].iov_len : -1;
    }
    return sendmsg(sock, m, flags);
}
/* the copies of the pidfd transport in turns, as under Yama ptrace_scope 1, when set */
static int t_yama = -1;
static int t_yama_scope(void) { return t_yama; }
#define SY_SENDMSG t_sendmsg
#define SY_YAMA_SCOPE t_yama_scope
#include "symm.c"
#include "symm_pass.c"

#define NR 4
#define MB (1ull << 20)

/* ---------------------------------------------------------------- what the all-gather does to a round */

enum {
    A_NONE,
    A_SILENT,     /* another user's process connects to rank 3 and says nothing */
    A_IDENT,      /* ... and says "rank 0" of the group's public name, without the secret */
    A_SAME_USER,  /* a process of this user, of no rank's pid, says "rank 0" */
    A_SQUAT,      /* another user's process listens at the name the ranks are told for rank 3 */
    A_LEN,        /* rank 2 states a descriptor of 2^64-1 bytes */
    A_FD_WRAP,    /* rank 2 states 2^62 fds (4 bytes each: 2^64, 0 in a size_t) */
    A_FD_RECORDS, /* rank 2 states one fd more than its records */
    A_PID,        /* rank 0's pid is another process's (pidfd transport) */
    A_CUT,        /* rank 1 sends part of its fd message (see t_fd_send) */
    A_LOOSE_SILENT, /* the ranks let any user's and any pid's process in (peers): one connects first and is silent */
    A_LOOSE_HALF,   /* ... and sends the head and half of an ident, and stays */
    A_LOOSE_FLOOD   /* ... and processes of seven other users flood rank 3's listener with connections */
};
static const char *attack_name[] = {"none",    "silent",     "ident", "same_user", "squat",        "len",
                                    "fd_wrap", "fd_records", "pid",   "cut",       "loose_silent", "loose_half",
                                    "loose_flood"};
#define SQUAT_NONCE 0x5351554154544552ull

static int t_attack, t_rank;
static const char *t_only; /* the one case to run (NULL: all) */

static int run_case(int a) { return !t_only || strcmp(t_only, attack_name[a]) == 0; }
static unsigned t_peers;     /* the options' peers of the next create */
static pid_t t_child = -1; /* a process this rank started for the attack */
static int t_child_other;  /* it runs as another user (other_user_wait) */

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* The abstract name that process pid listens at, from /proc/net/unix as any user reads it. */
static int listener_name(int pid, char *name, size_t cap)
{
    char prefix[64], line[512];
    snprintf(prefix, sizeof prefix, "@fabpool-symm-%d-", pid);
    FILE *f = fopen("/proc/net/unix", "re");
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char *at = strstr(line, prefix);
        if (at) {
            at[strcspn(at, " \n")] = 0;
            snprintf(name, cap, "%s", at + 1);
            found = 1;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* The group's public name: rank 0's socket nonce, as /proc/net/unix shows every user (the listener of the
 * lowest pid of the ranks', forked one after the other up to rank 3's pid).  0 if not all NR are listening
 * within 2 s. */
static uint64_t public_group(int pid3)
{
    for (int tries = 0; tries < 200; tries++) {
        FILE *f = fopen("/proc/net/unix", "re");
        char line[512];
        int n = 0, low = 0;
        unsigned long long nonce = 0;
        while (f && fgets(line, sizeof line, f)) {
            char *at = strstr(line, "@fabpool-symm-");
            int pid;
            unsigned long long x;
            if (at && sscanf(at, "@fabpool-symm-%d-%llx", &pid, &x) == 2 && pid <= pid3 && pid > pid3 - 64) {
                n++;
                if (!low || pid < low) {
                    low = pid;
                    nonce = x;
                }
            }
        }
        if (f)
            fclose(f);
        if (n >= NR)
            return nonce;
        usleep(10000);
    }
    return 0;
}

typedef struct intruder {
    int pid;       /* the rank whose listener it connects to, or whose name it takes */
    int attack;
    int ready;     /* pipe: a byte once connected (or listening) */
    int window_ms; /* A_SQUAT: how long it listens */
} intruder;

/* Connects to the rank's listener, says nothing or an ident of "rank 0" with a wrong secret, and waits for
 * the listener to close the connection.  0: closed within 2 s with no byte and no fd sent to it. */
static int intruder_connect(void *arg)
{
    intruder *in = arg;
    char name[108];
    struct sockaddr_un a;
    socklen_t alen;
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    if (!listener_name(in->pid, name, sizeof name) || (alen = abstract_addr(&a, name)) == 0 ||
        connect(c, (struct sockaddr *)&a, alen) != 0)
        return 10;
    if (in->attack == A_LOOSE_HALF) {
        /* the head of an ident's message and half of its bytes, then nothing */
        uint8_t part[FABPOOL_FD_HEAD_BYTES + sizeof(sy_ident) / 2];
        uint32_t head[2] = {0, (uint32_t)sizeof(sy_ident)};
        memset(part, 0x5a, sizeof part);
        memcpy(part, head, sizeof head);
        if (send(c, part, sizeof part, MSG_NOSIGNAL) != (ssize_t)sizeof part)
            return 11;
    } else if (in->attack != A_SILENT && in->attack != A_LOOSE_SILENT) {
        /* "rank 0 of group <the public nonce>": the nonce where a secret would be, rank 0 */
        uint8_t id[sizeof(sy_ident)];
        memset(id, 0, sizeof id);
        uint64_t group = public_group(in->pid);
        memcpy(id, &group, sizeof group);
        if (group == 0 || fabpool_fd_send(c, NULL, 0, id, sizeof id) != FABPOOL_OK)
            return 11;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (write(in->ready, "c", 1) != 1)
        return 12;
    for (;;) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 2000) != 1)
            return 13; /* still open after 2 s: it was waited on */
        char b[64];
        union {
            struct cmsghdr h;
            char space[CMSG_SPACE(sizeof(int) * 8)];
        } u;
        struct iovec iov = {b, sizeof b};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.space, .msg_controllen = sizeof u};
        ssize_t r = recvmsg(c, &m, 0);
        if (r > 0 && CMSG_FIRSTHDR(&m))
            return 14; /* an fd came */
        if (r > 0)
            return 15; /* a byte came */
        if (r == 0 || errno == ECONNRESET)
            return ms_since(&t0) < 2000 ? 0 : 16;
        if (errno != EINTR)
            return 17;
    }
}

/* Listens at the name the ranks are told for rank pid; accepts whoever connects for window_ms.  0: at least
 * one connection came and none sent a byte or an fd. */
static int intruder_squat(void *arg)
{
    intruder *in = arg;
    char name[108];
    snprintf(name, sizeof name, "fabpool-symm-%d-%016llx", in->pid, (unsigned long long)SQUAT_NONCE);
    struct sockaddr_un a;
    socklen_t alen;
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    if ((alen = abstract_addr(&a, name)) == 0 || bind(l, (struct sockaddr *)&a, alen) != 0 || listen(l, 16) != 0)
        return 20;
    if (write(in->ready, "l", 1) != 1)
        return 21;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int conns = 0;
    long left;
    while ((left = in->window_ms - ms_since(&t0)) > 0) {
        struct pollfd p = {l, POLLIN, 0};
        if (poll(&p, 1, (int)left) != 1)
            continue;
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        conns++;
        struct pollfd q = {c, POLLIN, 0};
        char b[64];
        /* a rank that refused closed at once: EOF; a byte here is what the rank must never send */
        if (poll(&q, 1, 500) == 1 && recv(c, b, sizeof b, 0) > 0)
            return 22;
        close(c);
    }
    return conns > 0 ? 0 : 23;
}

/* A process of this user that holds memory fds at every number from 3 to 127 (and is no rank). */
static pid_t holder_start(void)
{
    pid_t c = fork();
    if (c == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        int m = memfd_create("not-a-rank", 0);
        if (m < 0 || ftruncate(m, 1 << 16) != 0)
            _exit(1);
        for (int fd = 3; fd < 128; fd++)
            if (fd != m)
                (void)dup2(m, fd);
        for (;;)
            pause();
    }
    return c;
}

#define FLOODS 7
static pid_t t_floods[FLOODS];

/* Processes of seven other users at this rank's listener (as root): two connect and close at once, five keep 100
 * connections each, silent or with the head and half of an ident (more than the 64 a rank watches, together).
 * The rank goes on once the first has a connection in (the others may wait for room in the queue, which the
 * rank drains only in its mesh). */
static void flood_start(void)
{
    char name[108];
    CHECK(listener_name(getpid(), name, sizeof name));
    uint32_t head[2] = {0, (uint32_t)sizeof(sy_ident)};
    _Static_assert(FABPOOL_FD_HEAD_BYTES + sizeof(sy_ident) / 2 <= sizeof(((conn_flood *)0)->part), "room");
    int p[2];
    CHECK(pipe(p) == 0);
    for (int i = 0; i < FLOODS; i++) {
        conn_flood f;
        memset(&f, 0, sizeof f);
        snprintf(f.name, sizeof f.name, "%s", name);
        f.mode = i < 2 ? CONN_FLOOD_CLOSE : i % 2 ? CONN_FLOOD_PART : CONN_FLOOD_SILENT;
        memset(f.part, 0x5a, sizeof f.part);
        memcpy(f.part, head, sizeof head);
        f.part_len = FABPOOL_FD_HEAD_BYTES + sizeof(sy_ident) / 2;
        f.ready = i == 0 ? p[1] : -1;
        t_floods[i] = -1;
        CHECK(other_user_fork_as(OTHER_USER_UID - (unsigned)i, conn_flood_run, &f, &t_floods[i]) == 0);
    }
    close(p[1]);
    char b;
    CHECK(read(p[0], &b, 1) == 1);
    close(p[0]);
}

static void flood_stop(void)
{
    for (int i = 0; i < FLOODS; i++)
        if (t_floods[i] > 0)
            kill(t_floods[i], SIGKILL);
    for (int i = 0; i < FLOODS; i++)
        if (t_floods[i] > 0)
            CHECK(other_user_wait(t_floods[i]) == -1); /* it flooded until killed */
}

/* Starts an intruder for this rank's attack (before the HELLO round, while the listeners are up). */
static void attack_before_hello(void)
{
    if (t_rank == 3 && t_attack == A_LOOSE_FLOOD) {
        flood_start();
        return;
    }
    int needs = (t_rank == 3 && (t_attack == A_SILENT || t_attack == A_IDENT || t_attack == A_SAME_USER ||
                                 t_attack == A_SQUAT || t_attack == A_LOOSE_SILENT || t_attack == A_LOOSE_HALF));
    if (t_rank == 0 && t_attack == A_PID) {
        t_child = holder_start();
        t_child_other = 0;
        return;
    }
    if (!needs)
        return;
    int p[2];
    CHECK(pipe(p) == 0);
    intruder in = {getpid(), t_attack, p[1], 3000};
    if (t_attack == A_SAME_USER || (t_attack >= A_LOOSE_SILENT && !other_user_can())) {
        fflush(stdout);
        t_child = fork();
        if (t_child == 0)
            _exit(intruder_connect(&in));
        t_child_other = 0;
    } else {
        CHECK(other_user_fork(t_attack == A_SQUAT ? intruder_squat : intruder_connect, &in, &t_child) == 0);
        t_child_other = 1;
    }
    close(p[1]);
    char b;
    CHECK(read(p[0], &b, 1) == 1); /* connected, or listening */
    close(p[0]);
}

/* The exit status of the intruder (0: it saw what it must); -1 for none. */
static int attack_child_status(void)
{
    if (t_child < 0)
        return -1;
    int st;
    if (t_attack == A_PID) {
        kill(t_child, SIGKILL);
        waitpid(t_child, NULL, 0);
        st = 0;
    } else if (t_child_other) {
        st = other_user_wait(t_child);
    } else {
        int ws = 0;
        waitpid(t_child, &ws, 0);
        st = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    }
    t_child = -1;
    return st;
}

/* The group's all-gather as the case has it: rank 0's HELLO with another pid, rank 3's socket name
 * replaced, rank 2's EXPORTED values replaced (for every rank alike, as one hostile hub would). */
static int t_allgather(void *ctx, const void *send, void *recv, size_t bytes)
{
    sy_head h;
    memcpy(&h, send, sizeof h);
    uint8_t *out = NULL;
    if (h.phase == SY_HELLO) {
        attack_before_hello();
        if (t_rank == 0 && t_attack == A_PID) {
            out = malloc(bytes);
            memcpy(out, send, bytes);
            int32_t pid = (int32_t)t_child;
            memcpy(out + sizeof(sy_head) + offsetof(sy_hello, pid), &pid, sizeof pid);
        }
    }
    int rc = allgather(ctx, out ? out : send, recv, bytes);
    free(out);
    if (rc != 0)
        return rc;
    uint8_t *all = recv;
    if (h.phase == SY_HELLO)
        memcpy(&t_pid0, all + sizeof(sy_head) + offsetof(sy_hello, pid), sizeof t_pid0);
    if (h.phase == SY_HELLO && t_attack == A_SQUAT) {
        uint64_t nonce = SQUAT_NONCE;
        memcpy(all + 3 * bytes + sizeof(sy_head) + offsetof(sy_hello, nonce), &nonce, sizeof nonce);
    }
    if (h.phase == SY_EXPORTED && (t_attack == A_LEN || t_attack == A_FD_WRAP || t_attack == A_FD_RECORDS)) {
        sy_head r2;
        memcpy(&r2, all + 2 * bytes, sizeof r2);
        if (t_attack == A_LEN)
            r2.v[0] = UINT64_MAX;
        else if (t_attack == A_FD_WRAP)
            r2.v[1] = 1ull << 62;
        else
            r2.v[1] = (r2.v[0] - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES + 1;
        memcpy(all + 2 * bytes, &r2, sizeof r2);
    }
    return 0;
}

static fabpool_torch_symm_t *make_o(int rank, grp *g, uint64_t max, uint64_t bytes, int transport, int timeout_ms,
                                    fabpool_status want, long *ms)
{
    fabpool_torch_symm_options o = symm_group_options(g, t_allgather, max, bytes);
    o.rank = rank;
    o.nranks = NR;
    o.fd_transport = transport;
    o.peers = t_peers;
    if (timeout_ms)
        o.timeout_ms = timeout_ms;
    fabpool_torch_symm_t *s = NULL;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fabpool_status st = fabpool_torch_symm_create(&o, &s);
    if (ms)
        *ms = ms_since(&t0);
    if (st != want)
        fprintf(stderr, "rank %d (%s): create -> %s: %s\n", rank, attack_name[t_attack], fabpool_status_name(st),
                fabpool_torch_symm_last_error());
    CHECK(st == want);
    return s;
}

static fabpool_torch_symm_t *make(int rank, grp *g, uint64_t max, uint64_t bytes, fabpool_status want)
{
    return make_o(rank, g, max, bytes, FABPOOL_TORCH_SYMM_FD_SOCKET, 0, want, NULL);
}

static uint64_t word(int rank, long step, int k) { return ((uint64_t)(rank + 1) << 56) ^ ((uint64_t)step << 20) ^ (uint64_t)k; }

static void put(uint64_t at, uint64_t v) { CHECK_CU(cuMemcpyHtoD((CUdeviceptr)at, &v, 8)); }

static uint64_t get(uint64_t at)
{
    uint64_t v = 0;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)at, 8));
    return v;
}

/* Word k of a buffer of `size` bytes: the first, the last, and between. */
static uint64_t off_k(uint64_t size, int k) { return k == 7 ? size - 8 : size / 8 * (uint64_t)k / 8 * 8; }

static void write_words(uint64_t base, uint64_t size, int rank, long step)
{
    for (int k = 0; k < 8; k++)
        put(base + off_k(size, k), word(rank, step, k));
    CHECK_CU(cuCtxSynchronize()); /* other processes see it only then */
}

static int words_ok(uint64_t base, uint64_t size, int rank, long step)
{
    for (int k = 0; k < 8; k++)
        if (get(base + off_k(size, k)) != word(rank, step, k))
            return 0;
    return 1;
}

static void barrier(grp *g)
{
    uint8_t b = 0, all[NR];
    CHECK(allgather(g, &b, all, 1) == 0);
}

/* Every rank writes its words and reads every peer's (the mesh formed with the real ranks). */
static void data_ok(fabpool_torch_symm_t *s, int rank, grp *g, long step)
{
    uint64_t ptrs[NR], size = MB;
    CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs, NR));
    write_words(ptrs[rank], size, rank, step);
    barrier(g);
    for (int q = 0; q < NR; q++)
        CHECK(words_ok(ptrs[q], size, q, step));
    barrier(g);
}

static void attack_pid(int rank, grp *g, int fds0);
static void attack_cut(int rank, grp *g, int fds0);

static void attacks(int rank, grp *g)
{
    t_rank = rank;
    int other = other_user_can();
    if (!other && rank == 0)
        printf("test_symm: not root: the cases of another user's process are skipped (they need to drop to uid %d)\n",
               OTHER_USER_UID);
    int fds0 = fd_count();
    long ms = 0;
    fabpool_torch_symm_t *s;

    /* at rank 3's listener during create: refused at once, no fd; the ranks' mesh forms well within the 10 s.
     * Then the ranks let any process in (peers any_user,any_pid, for jobs across users and pid namespaces): a
     * stranger at rank 3's listener first, silent or with half an ident, holds no rank's turn; the mesh forms
     * as soon and the stranger is closed, no byte and no fd sent to it */
    for (int a = A_SILENT; a <= A_LOOSE_HALF; a++) {
        int loose = a >= A_LOOSE_SILENT;
        if (a > A_SAME_USER && !loose)
            continue;
        if ((a != A_SAME_USER && !loose && !other) || !run_case(a))
            continue;
        t_attack = a;
        t_peers = loose ? FABPOOL_FD_ANY_USER | FABPOOL_FD_ANY_PID : 0;
        s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 10000, FABPOOL_OK, &ms);
        if (ms >= 3000)
            fprintf(stderr, "rank %d (%s): create took %ld ms\n", rank, attack_name[a], ms);
        CHECK(ms < 3000);
        if (rank == 3) {
            int cs = attack_child_status();
            if (cs != 0)
                fprintf(stderr, "rank 3 (%s): the intruder says %d\n", attack_name[a], cs);
            CHECK(cs == 0);
        }
        t_attack = A_NONE;
        t_peers = 0;
        if (s)
            data_ok(s, rank, g, 100 + a);
        CHECK_OK(fabpool_torch_symm_close(s));
        CHECK(fd_count() == fds0);
    }

    /* the ranks let any process in, and processes of seven other users flood rank 3's listener during create: every
     * lower rank's connection is still taken, none closed to make room for theirs */
    if (other && run_case(A_LOOSE_FLOOD)) {
        t_attack = A_LOOSE_FLOOD;
        t_peers = FABPOOL_FD_ANY_USER | FABPOOL_FD_ANY_PID;
        s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 10000, FABPOOL_OK, NULL);
        if (rank == 3)
            flood_stop();
        t_attack = A_NONE;
        t_peers = 0;
        if (s)
            data_ok(s, rank, g, 100 + A_LOOSE_FLOOD);
        CHECK_OK(fabpool_torch_symm_close(s));
        CHECK(fd_count() == fds0);
    }

    /* another user's process listens at the name given for rank 3: no rank sends it anything */
    if (other && run_case(A_SQUAT)) {
        t_attack = A_SQUAT;
        s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 2000, FABPOOL_ERR_PERMISSION, &ms);
        CHECK(s == NULL && strstr(fabpool_torch_symm_last_error(), "rank 3's socket") != NULL);
        CHECK(ms < 2000 + 2500);
        if (rank == 3) {
            int cs = attack_child_status();
            if (cs != 0)
                fprintf(stderr, "rank 3 (squat): the squatter says %d\n", cs);
            CHECK(cs == 0);
        }
        t_attack = A_NONE;
        CHECK(fd_count() == fds0);
        barrier(g);
    }

    /* rank 2 states what no window holds: every rank fails naming it, nothing open */
    for (int a = A_LEN; a <= A_FD_RECORDS; a++) {
        if (!run_case(a))
            continue;
        t_attack = a;
        s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 5000, FABPOOL_ERR_DESCRIPTOR, NULL);
        CHECK(s == NULL && strstr(fabpool_torch_symm_last_error(), "rank 2 states a descriptor") != NULL);
        t_attack = A_NONE;
        CHECK(fd_count() == fds0);
        barrier(g);
    }

    /* pidfd transport, in turns as under Yama ptrace_scope 1: grows, shrinks, the data seen everywhere */
    if (run_case(A_PID))
        attack_pid(rank, g, fds0);
    if (run_case(A_CUT))
        attack_cut(rank, g, fds0);
}

static void attack_pid(int rank, grp *g, int fds0)
{
    fabpool_torch_symm_t *s;
    int pfd = -1;
    if (fabpool_fd_pidfd_open(getpid(), &pfd) != FABPOOL_OK) { /* valgrind does not know pidfd_open */
        if (rank == 0)
            printf("test_symm: the pidfd cases are skipped: %s\n", fabpool_last_error());
        return;
    }
    close(pfd);
    t_yama = 1;
    s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_PIDFD, 5000, FABPOOL_OK, NULL);
    if (s) {
        data_ok(s, rank, g, 200);
        CHECK_OK(fabpool_torch_symm_resize(s, 24 * MB));
        CHECK_OK(fabpool_torch_symm_resize(s, 2 * MB));
        data_ok(s, rank, g, 201);
        fabpool_torch_symm_info in = {.struct_size = sizeof in};
        CHECK_OK(fabpool_torch_symm_get_info(s, &in));
        CHECK(in.records_imported > 0 && in.fds_sent == 0);
    }
    CHECK_OK(fabpool_torch_symm_close(s));
    CHECK(fd_count() == fds0);
    /* ... and rank 0's pid replaced by a process that holds memory fds: refused, nothing mapped */
    t_attack = A_PID;
    s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_PIDFD, 5000, FABPOOL_ERR_PERMISSION, NULL);
    CHECK(s == NULL && strstr(fabpool_torch_symm_last_error(), "did not prove") != NULL);
    if (rank == 0)
        CHECK(attack_child_status() == 0);
    t_attack = A_NONE;
    t_yama = -1;
    CHECK(fd_count() == fds0);
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.mappings == 0 && l.handles == 0);
    }
    barrier(g);
}

static void attack_cut(int rank, grp *g, int fds0)
{
    long ms = 0;
    fabpool_torch_symm_t *s;
    /* rank 1 sends 4 bytes of its fd message to rank 0 and stays: create, then a resize, answer in time */
    t_attack = A_CUT;
    t_cut_send = rank == 1;
    s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 1500, FABPOOL_ERR_IO, &ms);
    CHECK(s == NULL && ms < 1500 + 2500);
    CHECK(fd_count() == fds0);
    t_cut_send = 0;
    s = make_o(rank, g, 64 * MB, MB, FABPOOL_TORCH_SYMM_FD_SOCKET, 1500, FABPOOL_OK, NULL);
    if (s) {
        int fds1 = fd_count();
        t_cut_send = rank == 1;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK_STATUS(fabpool_torch_symm_resize(s, 32 * MB), FABPOOL_ERR_IO);
        ms = ms_since(&t0);
        CHECK(ms < 1500 + 2500);
        /* nothing of what rank 1 sent stays open: rank 0 holds one fd more for its own new chunk and one for
         * each view of ranks 2 and 3 (their turns come before rank 1's), and its socket to rank 1 no more.  On
         * the sim only: the real driver's exports are opens of /dev/nvidiactl that the shrink's own export
         * changes too, so a count there cannot tell rank 1's fds from this rank's */
        if (rank == 0 && t_ledger_p)
            CHECK(fd_count() == fds1 + 1 + (NR - 2) - 1);
        t_cut_send = 0;
        /* rank 0 no longer reads the socket that held the cut message, and no socket is made again after
         * create: every rank broke the object, and the next grow says so at once, on every rank, with what to
         * do, and changes nothing */
        CHECK_STATUS(fabpool_torch_symm_resize(s, 48 * MB), FABPOOL_ERR_IO);
        CHECK(strstr(fabpool_torch_symm_last_error(), "broke off") != NULL);
        CHECK(strstr(fabpool_torch_symm_last_error(), "lost its socket to a peer") != NULL);
        CHECK(strstr(fabpool_torch_symm_last_error(), "creates the buffer again") != NULL);
        if (rank == 0 && t_ledger_p)
            CHECK(fd_count() == fds1 + 1 + (NR - 2) - 1);
    }
    CHECK_OK(fabpool_torch_symm_close(s));
    t_attack = A_NONE;
    CHECK(fd_count() == fds0);
    barrier(g);
}

static void rank_main(grp *g, long steps)
{
    int rank = g->rank;
    /* the largest size asked wins */
    fabpool_torch_symm_t *s = make(rank, g, 64 * MB, (uint64_t)(rank + 1) * MB, FABPOOL_OK);
    if (!s)
        return;
    uint64_t ptrs0[NR], ptrs[NR], sizes[NR];
    CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs0, NR));
    fabpool_torch_symm_info in = {.struct_size = sizeof in};
    CHECK_OK(fabpool_torch_symm_get_info(s, &in));
    CHECK(in.size == NR * MB);
    uint64_t seed = 99, size = in.size;
    for (long step = 1; step <= steps; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t want = ((seed >> 33) % 63 + 1) * MB;
        CHECK_OK(fabpool_torch_symm_resize(s, rank == step % NR ? want : want / 2));
        CHECK_OK(fabpool_torch_symm_get_info(s, &in));
        CHECK(in.size == want);
        CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs, NR));
        CHECK(memcmp(ptrs, ptrs0, sizeof ptrs) == 0);
        if (step > 1 && want >= size) /* what this rank wrote at the last step is still there */
            CHECK(words_ok(ptrs[rank], size, rank, step - 1));
        size = want;
        write_words(ptrs[rank], size, rank, step);
        barrier(g);
        for (int q = 0; q < NR; q++)
            CHECK(words_ok(ptrs[q], size, q, step));
        barrier(g);
    }

    /* down to 1 MiB (its chunk and no more, once the peers have acknowledged), then rank 1 cannot grow:
     * every rank fails, keeps its size and data */
    CHECK_OK(fabpool_torch_symm_resize(s, MB));
    size = MB;
    write_words(ptrs[rank], size, rank, ++steps);
    barrier(g);
    t_sim_hooks h = t_sim_hooks_get();
    if (h.fault_set && rank == 1)
        h.fault_set("cuMemCreate", 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
    if (h.fault_set) {
        CHECK_STATUS(fabpool_torch_symm_resize(s, 64 * MB), FABPOOL_ERR_OUT_OF_MEMORY);
        CHECK(strstr(fabpool_torch_symm_last_error(), "rank 1") != NULL);
        CHECK(strstr(fabpool_torch_symm_last_error(), "every rank keeps its old size") != NULL);
        if (rank == 1)
            h.fault_clear();
        CHECK_OK(fabpool_torch_symm_sizes(s, sizes, NR));
        for (int q = 0; q < NR; q++)
            CHECK(sizes[q] >= size && words_ok(ptrs[q], size, q, steps));
    }
    CHECK_OK(fabpool_torch_symm_resize(s, 64 * MB));
    write_words(ptrs[rank], 64 * MB, rank, steps + 1);
    barrier(g);
    for (int q = 0; q < NR; q++)
        CHECK(words_ok(ptrs[q], 64 * MB, q, steps + 1));
    barrier(g);
    CHECK_OK(fabpool_torch_symm_close(s));

    /* max_bytes differs: every rank refuses, naming each rank's */
    CHECK(make(rank, g, (64 + (uint64_t)(rank == 2)) * MB, MB, FABPOOL_ERR_CONFIG) == NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "max_bytes differs") != NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "rank 2: 68157440") != NULL);

    attacks(rank, g);

    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == 0 && l.mappings == 0 && l.handles == 0 && l.exported_fds == 0 && l.reservations == 0);
    }
}

static void rank_fn(grp *g, void *steps)
{
    rank_main(g, *(long *)steps);
    printf("rank %d: %d checks, %d failed\n", g->rank, t_checks, t_failures);
}

int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 12;
    t_only = argc > 2 ? argv[2] : NULL;
    int failed = run_group(NR, rank_fn, &steps);
    printf("test_symm: %d ranks, %ld steps, %d ranks failed\n", NR, steps, failed);
    return failed ? 1 : 0;
}
