/* test_peer_crash: one exporter, three importers (this program, fork+exec'd),
 * over fabpool's fd socket helpers.  Every round the exporter grows or shrinks
 * its buffer, writes a tag, and sends each importer the delta; importers apply
 * it, check the tag and write one back.  Mid-run one importer is killed with
 * SIGKILL; the exporter notices (its socket answers an error or EOF), stops
 * counting it, and goes on with the survivors, acknowledging only their
 * generations.  At the end the survivors close their views and exit, the
 * exporter acks UINT64_MAX and frees everything: the whole simulated machine
 * then holds no byte (fabsim_machine_held_bytes(0) == 0, the kernel's own
 * count of what every process keeps alive).  On the real driver the check is
 * what this process holds at the end against the start (testutil.h's t_held:
 * NVML's count for this process), with slack. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../testutil.h"

#define MB (1ull << 20)
#define NPEER 3
#define ROUNDS 40
#define VICTIM 1
#define KILL_AT 12

struct msg {
    uint64_t round, size, last;
};

/* The other processes read what this one writes: a copy from pageable memory
 * returns before its DMA lands (seen on the H200), so synchronize. */
static void put(uint64_t at, uint64_t v)
{
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v));
    CHECK_CU(cuCtxSynchronize());
}
static uint64_t get(uint64_t at)
{
    uint64_t v = ~0ull;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)at, sizeof v));
    return v;
}

static int importer(const char *name, int idx)
{
    t_driver_init(); /* a context of its own, current */
    fabpool_t *p;
    int s;
    if (fabpool_fd_connect(name, &s, 10000) != FABPOOL_OK || fabpool_create(NULL, &p) != FABPOOL_OK) {
        fprintf(stderr, "importer %d: %s\n", idx, fabpool_last_error());
        return 2;
    }
    uint32_t me = (uint32_t)idx;
    fabpool_fd_send(s, NULL, 0, &me, sizeof me);
    static uint8_t d[1 << 16];
    int fds[256];
    fabpool_view_t *v = NULL;
    for (;;) {
        struct msg m;
        size_t nf, len;
        if (fabpool_fd_recv(s, NULL, 0, &nf, &m, sizeof m, &len) != FABPOOL_OK || len != sizeof m)
            return 3;
        if (m.last)
            break;
        if (fabpool_fd_recv(s, fds, 256, &nf, d, sizeof d, &len) != FABPOOL_OK)
            return 4;
        fabpool_status st = v ? fabpool_view_apply(v, d, len, fds, nf) : fabpool_view_open(p, d, len, fds, nf, &v);
        if (st != FABPOOL_OK) {
            fprintf(stderr, "importer %d: round %llu: %s\n", idx, (unsigned long long)m.round, fabpool_last_error());
            return 5;
        }
        uint64_t vb = (uint64_t)(uintptr_t)fabpool_view_ptr(v), x = 0, y;
        cuMemcpyDtoH(&x, (CUdeviceptr)(vb + m.size - 8), 8);
        y = m.round * 10 + (uint64_t)idx;
        cuMemcpyHtoD((CUdeviceptr)(vb + (uint64_t)idx * 8), &y, 8);
        cuCtxSynchronize(); /* a pageable copy's DMA lands after the call returns (H200) */
        fabpool_buffer_info vi = {.struct_size = sizeof vi};
        fabpool_view_get_info(v, &vi);
        uint64_t reply[2] = {vi.generation, x == m.round ? 0u : 1u};
        if (fabpool_fd_send(s, NULL, 0, reply, sizeof reply) != FABPOOL_OK)
            return 6;
    }
    if (v)
        fabpool_view_close(v);
    fabpool_destroy(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--importer") == 0)
        return importer(argv[2], atoi(argv[3]));
    int sim = t_driver_init();
    uint64_t (*machine_held)(int) = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    int64_t u0 = t_held();
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(NULL, &p));
    if (!p || fabpool_handle_type_of(p) == FABPOOL_HANDLE_NONE) {
        printf("test_peer_crash: no shareable handle type here; skipped\n");
        if (p)
            fabpool_destroy(p);
        return t_done("test_peer_crash");
    }
    char name[64];
    snprintf(name, sizeof name, "fabpool-crash-%d", (int)getpid());
    int ls = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    pid_t pid[NPEER];
    int sock[NPEER], alive[NPEER];
    for (int i = 0; i < NPEER; i++) {
        char idx[8];
        snprintf(idx, sizeof idx, "%d", i);
        pid[i] = fork();
        if (pid[i] == 0) {
            execl(argv[0], argv[0], "--importer", name, idx, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < NPEER; i++) { /* accept in any order; each says who it is */
        int s = -1;
        uint32_t who = 0;
        size_t n, len;
        CHECK_OK(fabpool_fd_accept(ls, &s));
        CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n, &who, sizeof who, &len));
        if (who < NPEER) {
            sock[who] = s;
            alive[who] = 1;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(p, 1024 * MB, 32 * MB, &b));
    uint64_t base = (uint64_t)(uintptr_t)fabpool_buffer_ptr(b), seed = 77;
    uint64_t seen[NPEER] = {0};
    static uint8_t d[1 << 16];
    int fds[256], bad = 0, rounds_after_kill = 0;
    for (int r = 1; r <= ROUNDS; r++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t size = (8 + (seed >> 33) % 600) * MB;
        CHECK_OK(fabpool_buffer_resize(b, size, NULL));
        put(base + size - 8, (uint64_t)r);
        if (r == KILL_AT) { /* mid-run, views open */
            kill(pid[VICTIM], SIGKILL);
            int st;
            waitpid(pid[VICTIM], &st, 0);
            CHECK(WIFSIGNALED(st));
        }
        uint64_t min_gen = UINT64_MAX;
        for (int i = 0; i < NPEER; i++) {
            if (!alive[i])
                continue;
            size_t len, nfds;
            CHECK_OK(fabpool_buffer_export(b, seen[i], d, sizeof d, &len, fds, 256, &nfds));
            struct msg m = {(uint64_t)r, size, 0};
            uint64_t reply[2];
            size_t n2, l2;
            if (fabpool_fd_send(sock[i], NULL, 0, &m, sizeof m) != FABPOOL_OK ||
                fabpool_fd_send(sock[i], fds, nfds, d, len) != FABPOOL_OK ||
                fabpool_fd_recv(sock[i], NULL, 0, &n2, reply, sizeof reply, &l2) != FABPOOL_OK || l2 != sizeof reply) {
                /* the peer is gone: drop it */
                CHECK(i == VICTIM && r >= KILL_AT);
                alive[i] = 0;
                close(sock[i]);
                continue;
            }
            bad += reply[1] != 0;
            seen[i] = reply[0];
            CHECK(get(base + (uint64_t)i * 8) == (uint64_t)r * 10 + (uint64_t)i);
            if (seen[i] < min_gen)
                min_gen = seen[i];
        }
        CHECK_OK(fabpool_buffer_export_done(b));
        /* only the survivors hold the buffer back now */
        CHECK_OK(fabpool_buffer_peers_ack(b, min_gen));
        if (r > KILL_AT)
            rounds_after_kill++;
    }
    CHECK(!alive[VICTIM]);
    CHECK(bad == 0);
    for (int i = 0; i < NPEER; i++) {
        if (!alive[i])
            continue;
        struct msg last = {0, 0, 1};
        CHECK_OK(fabpool_fd_send(sock[i], NULL, 0, &last, sizeof last));
        int st;
        waitpid(pid[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        close(sock[i]);
    }
    close(ls);
    CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(p, &s);
    CHECK(s.mapped_bytes == 0 && s.exported_fds_open == 0 && s.handles_outstanding == 0);
    CHECK_OK(fabpool_destroy(p));
    uint64_t machine = machine_held ? machine_held(0) : 0;
    if (machine_held)
        CHECK(machine == 0);
    int64_t u1 = t_held();
    CHECK(t_near(u0, u1));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    printf("test_peer_crash: %d importers, importer %d killed at round %d of %d, survivors went on for %d rounds; "
           "machine holds %llu bytes at the end; this process held %lld bytes at the start, %lld at the end\n",
           NPEER, VICTIM, KILL_AT, ROUNDS, rounds_after_kill, (unsigned long long)machine, (long long)u0,
           (long long)u1);
    return t_done("test_peer_crash");
}
