/* test_hybridep: the HybridEP adapter (fabpool_hybridep.hpp) between
 * two processes, the second a fork+exec of this program.  The exporter
 * allocates HybridEP's two shared buffers (expert_input_token/_prob, sized by
 * HybridEP's formulas for a domain of two ranks), hands their handles and
 * fds to the peer over fabpool's socket helper, and then grows and shrinks
 * them in place over a token trace, sending only deltas.  The peer opens its
 * views once, applies the deltas (its view addresses never change), checks
 * the exporter's data and writes its own, which the exporter reads back.
 * Then: a view by pidfd_getfd alone (the all_gather-only path), wrong uses
 * refused with their status and nothing mapped, and device memory back to
 * where it started in both processes.  Runs on the simulated or the real
 * driver (POSIX fd handles; fabric with FABSIM_FABRIC=1
 * FABPOOL_CONF=handle_type:fabric on the sim). */
#define HYBRIDEP_TEST
#include "hybridep_sizes.h"
#include "../../tests/procfs.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
/* Bytes the pool keeps for reuse after free() and close_handle() (keep_ms). */
static std::uint64_t kept_bytes(ExtendedMemoryAllocator &a)
{
    fabpool_stats st{};
    st.struct_size = sizeof st;
    fabpool_get_stats(a.pool(), &st);
    return st.kept_bytes;
}

static const uint64_t kTrace[] = {100, 600, 1024, 1031, 3000, 700, 2048, 4096, 512, 3333};
static const int kSteps = (int)(sizeof kTrace / sizeof kTrace[0]);
static const uint64_t kMaxTokens = 4096;

struct Msg {
    uint64_t step, quit, pidfd_probe, bytes_only;
    uint64_t size[NB];
    uint32_t present[NB], nfds[NB];
    MemHandle h[NB];
};
struct Reply {
    uint64_t bad;
    int64_t pidfd_status; /* -1: not tried */
    char msg[200];
};

static uint64_t pat(uint64_t step, int b, int k) { return 0xfab0000000000000ull ^ (step << 16) ^ ((uint64_t)b << 8) ^ (uint64_t)k; }
static uint64_t at_k(uint64_t size, int k) { return (size / 4 * (uint64_t)k) & ~(uint64_t)7; } /* k = 0..3 */

/* A copy from pageable memory returns before its DMA lands (seen on the H200):
 * the other process sees the data only after a synchronize. */
static void put(void *at, uint64_t v)
{
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at, &v, 8));
    CHECK_CU(cuCtxSynchronize());
}
static uint64_t get(void *at)
{
    uint64_t v = 0;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)at, 8));
    return v;
}

static HybridEpShape shape()
{
    HybridEpShape s;
    s.ranks_per_domain = 2;
    return s;
}

/* ------------------------------------------------------------------ peer */

static int peer(const char *name)
{
    t_driver_init();
    int s = -1;
    if (fabpool_fd_connect(name, &s, 10000) != FABPOOL_OK) {
        fprintf(stderr, "peer: %s\n", fabpool_last_error());
        return 2;
    }
    static Msg m;
    uint64_t bad = 0;
    try {
        ExtendedMemoryAllocator a(0);
        void *view[NB] = {nullptr, nullptr};
        for (;;) {
            int fds[2 * fabpool_hybridep::kMaxHandleFds];
            size_t nf = 0, len = 0;
            if (fabpool_fd_recv(s, fds, sizeof fds / sizeof fds[0], &nf, &m, sizeof m, &len) != FABPOOL_OK ||
                len != sizeof m) {
                fprintf(stderr, "peer: recv: %s\n", fabpool_last_error());
                return 3;
            }
            if (m.quit)
                break;
            Reply r;
            memset(&r, 0, sizeof r);
            r.pidfd_status = -1;
            if (m.pidfd_probe) {
                /* the all_gather-only path: the fds come out of the exporter by pidfd_getfd */
                void *p = nullptr;
                try {
                    a.open_handle(&p, &m.h[0]);
                    r.pidfd_status = FABPOOL_OK;
                    bad += get((char *)p + at_k(m.size[0], 1)) != pat(m.step, 0, 1);
                    a.close_handle(p);
                } catch (const Error &e) {
                    r.pidfd_status = e.status();
                    snprintf(r.msg, sizeof r.msg, "%s", e.what());
                }
            } else {
                size_t fi = 0;
                for (int b = 0; b < NB; b++) {
                    if (!m.present[b])
                        continue;
                    void *before = view[b];
                    if (m.bytes_only) { /* HybridEP's all_gather alone: the fds by pidfd_getfd */
                        if (!view[b])
                            a.open_handle(&view[b], &m.h[b]);
                        else
                            a.update_handle(view[b], &m.h[b]);
                    } else {
                        if (!view[b])
                            a.open_handle(&view[b], &m.h[b], fds + fi, m.nfds[b]);
                        else
                            a.update_handle(view[b], &m.h[b], fds + fi, m.nfds[b]);
                        fi += m.nfds[b];
                    }
                    bad += before && view[b] != before;
                }
                bad += fi != nf;
                for (int b = 0; b < NB; b++) {
                    for (int k = 0; k < 4; k++)
                        bad += get((char *)view[b] + at_k(m.size[b], k)) != pat(m.step, b, k);
                    put((char *)view[b] + m.size[b] - 8, pat(m.step, b, 77)); /* the peer writes back */
                }
            }
            r.bad = bad;
            if (fabpool_fd_send(s, nullptr, 0, &r, sizeof r) != FABPOOL_OK)
                return 4;
        }
        for (int b = 0; b < NB; b++)
            a.close_handle(view[b]);
    } catch (const Error &e) {
        fprintf(stderr, "peer: %s (%s)\n", e.what(), fabpool_status_name(e.status()));
        return 5;
    }
    close(s);
    /* what this process holds: the sim's ledger is per process; on the real
     * driver cuMemGetInfo counts the exporter's memory too, and the exporter
     * checks the device once this process is gone */
    if (t_ledger_p)
        CHECK(t_near(t_held(), 0));
    return bad || t_failures ? 6 : 0;
}

/* --------------------------------------------------------------- exporter */

template <class F> static void expect_error(const char *what, fabpool_status want, const char *word, F f)
{
    t_checks++;
    try {
        f();
        t_failures++;
        fprintf(stderr, "%s: no error, expected %s\n", what, fabpool_status_name(want));
    } catch (const Error &e) {
        if (e.status() != want || !strstr(e.what(), word)) {
            t_failures++;
            fprintf(stderr, "%s: %s: %s (expected %s with '%s')\n", what, fabpool_status_name(e.status()), e.what(),
                    fabpool_status_name(want), word);
        }
    }
}

/* A handle rewritten to name a third process (a bug or a hostile rank in the all-gather, or the exporter's pid
 * reused): that process holds memory of its own at the handle's fd numbers, but not the exporter's token (a
 * token memfd of other bytes there, no fd, or the exporter's own memfd inherited by fork, which names the
 * exporter's pid), so open_handle copies nothing, maps nothing and keeps no fd.  The handle as it was opens (the
 * exporter, this process, shows its token). */
static void check_third_process(ExtendedMemoryAllocator &a)
{
    void *b = nullptr;
    a.allocate(&b, 4 << 20);
    put((char *)b + 4096, 0x7e57);
    MemHandle h;
    a.get_handle(&h, b);
    HandleInfo in = {};
    CHECK(ExtendedMemoryAllocator::read_header(h, &in) && in.nfds > 0 && in.token_fd >= 0 && in.pid == getpid());
    int theirs[fabpool_hybridep::kMaxHandleFds];
    size_t n = ExtendedMemoryAllocator::fds_of(h, theirs, fabpool_hybridep::kMaxHandleFds);
    for (int mode = 0; mode < 3; mode++) { /* the token fd: other bytes, none, the exporter's inherited */
        int ready[2];
        CHECK(pipe(ready) == 0);
        fflush(stdout);
        fflush(stderr);
        pid_t c = fork();
        if (c == 0) {
            (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
            bool ok = true;
            for (size_t i = 0; ok && i < n; i++) {
                int m = memfd_create("fabsim:third:dev0", MFD_CLOEXEC);
                struct stat st;
                ok = m >= 0 && fstat(theirs[i], &st) == 0 && ftruncate(m, st.st_size) == 0 &&
                     dup2(m, theirs[i]) == theirs[i];
            }
            int tok = -1;
            if (ok)
                ok = mode == 2   ? true
                     : mode == 1 ? close(in.token_fd) == 0
                                 : fabpool_fd_token_make("another", 8, &tok) == FABPOOL_OK &&
                                       dup2(tok, in.token_fd) == in.token_fd;
            char x = ok;
            if (write(ready[1], &x, 1) != 1 || !ok)
                _exit(2);
            for (;;)
                pause();
        }
        close(ready[1]);
        char x = 0;
        CHECK(c > 0 && read(ready[0], &x, 1) == 1 && x == 1);
        close(ready[0]);
        MemHandle t = h;
        std::int32_t pid = c;
        memcpy(t.bytes + 8, &pid, 4); /* the header's pid (fabpool_hybridep.hpp) */
        fabsim_ledger l0 = t_ledger();
        int fds0 = fd_count();
        void *p = nullptr;
        expect_error(mode == 2   ? "a handle naming a child forked from the exporter"
                     : mode == 1 ? "a handle naming a third process without the token fd"
                                 : "a handle naming a third process with another token",
                     FABPOOL_ERR_PERMISSION, "does not hold this group's token", [&] { a.open_handle(&p, &t); });
        fabsim_ledger l1 = t_ledger();
        CHECK(p == nullptr && l1.mappings == l0.mappings && l1.handles == l0.handles && fd_count() == fds0);
        kill(c, SIGKILL);
        waitpid(c, nullptr, 0);
    }
    void *v = nullptr;
    a.open_handle(&v, &h);
    CHECK(v != nullptr && get((char *)v + 4096) == 0x7e57);
    a.close_handle(v);
    a.peers_done(b);
    a.free(b);
}

/* Whom the exporter lets copy its fds under Yama ptrace_scope 1 (FABPOOL_HYBRIDEP_PTRACER): its parent, the
 * launcher of the ranks, unless told otherwise; never every process of the user unless "any" says so. */
static void check_ptracer_choice()
{
    using fabpool_hybridep::detail::Ptracer;
    using fabpool_hybridep::detail::ptracer_choice;
    Ptracer c = ptracer_choice(nullptr, 4242);
    CHECK(c.kind == Ptracer::one && c.pid == 4242);
    c = ptracer_choice("", 4242);
    CHECK(c.kind == Ptracer::one && c.pid == 4242);
    c = ptracer_choice("Parent", 4242);
    CHECK(c.kind == Ptracer::one && c.pid == 4242);
    c = ptracer_choice(nullptr, 0); /* no parent to name (another pid namespace's): no consent, not everyone's */
    CHECK(c.kind == Ptracer::none);
    c = ptracer_choice("31337", 4242);
    CHECK(c.kind == Ptracer::one && c.pid == 31337);
    CHECK(ptracer_choice("any", 4242).kind == Ptracer::any && ptracer_choice("ANY", 1).kind == Ptracer::any);
    CHECK(ptracer_choice("0", 4242).kind == Ptracer::none && ptracer_choice("none", 4242).kind == Ptracer::none);
    for (const char *bad : {"-1", "12x", "yes", "99999999999", "1073741824", " 5"})
        CHECK(ptracer_choice(bad, 4242).kind == Ptracer::bad);
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = -1;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = -1;
        fclose(f);
    }
    printf("test_hybridep: Yama ptrace_scope %d%s\n", scope,
           scope == 1 ? ": the bytes-only run's peer copies by the parent's consent"
                      : " (no consent needed here: the bytes-only run does not exercise it)");
}

static void exporter(const char *self)
{
    int sim = t_driver_init();
    uint64_t (*machine_held)(int) = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    int64_t held0 = t_held();
    char name[64];
    snprintf(name, sizeof name, "fabpool-hybridep-%d", (int)getpid());
    int ls = -1, s = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--peer", name, (char *)NULL);
        _exit(127);
    }
    CHECK_OK(fabpool_fd_accept(ls, &s));
    const HybridEpShape sh = shape();
    size_t maxs[NB];
    hybridep_sizes(sh, kMaxTokens, maxs);
    static Msg m;
    long deltas = 0, delta_fds = 0, full_fds = 0;
    int64_t peak = 0;
    std::string pidfd_note = "not tried";
    /* FABPOOL_HYBRIDEP_BYTES_ONLY=1: the handles travel as bytes only, as in HybridEP's all_gather */
    const char *bo = getenv("FABPOOL_HYBRIDEP_BYTES_ONLY");
    const uint64_t bytes_only = bo && strcmp(bo, "1") == 0;
    try {
        ExtendedMemoryAllocator a(0);
        bool posix = a.handle_type() == FABPOOL_HANDLE_POSIX_FD;
        void *buf[NB] = {nullptr, nullptr}, *base[NB];
        for (int step = 0; step < kSteps; step++) {
            size_t sz[NB];
            hybridep_sizes(sh, hybridep_tokens(kTrace[step]), sz);
            memset(&m, 0, sizeof m);
            m.step = (uint64_t)step;
            m.bytes_only = bytes_only;
            int fds[2 * fabpool_hybridep::kMaxHandleFds];
            size_t nf = 0;
            for (int b = 0; b < NB; b++) {
                bool send = false;
                if (!buf[b]) {
                    a.allocate(&buf[b], sz[b], maxs[b]);
                    base[b] = buf[b];
                    a.get_handle(&m.h[b], buf[b]);
                    send = true;
                } else if (a.resize(buf[b], sz[b])) {
                    a.get_delta(&m.h[b], buf[b]);
                    send = true;
                    deltas++;
                }
                CHECK(buf[b] == base[b]); /* the address never moves */
                if (send) {
                    HandleInfo in = {};
                    CHECK(ExtendedMemoryAllocator::read_header(m.h[b], &in));
                    /* the first a full handle; then deltas (or a full re-export where a delta would not fit) */
                    CHECK(step ? in.kind != fabpool_hybridep::HandleKind::unchanged
                               : in.kind == fabpool_hybridep::HandleKind::full);
                    m.present[b] = 1;
                    m.nfds[b] = (uint32_t)ExtendedMemoryAllocator::fds_of(m.h[b], fds + nf, 2);
                    CHECK(posix && in.kind == fabpool_hybridep::HandleKind::full ? m.nfds[b] > 0
                                                                                  : posix || m.nfds[b] == 0);
                    (step ? delta_fds : full_fds) += m.nfds[b];
                    nf += m.nfds[b];
                }
                m.size[b] = sz[b];
                for (int k = 0; k < 4; k++)
                    put((char *)buf[b] + at_k(sz[b], k), pat((uint64_t)step, b, k));
            }
            CHECK_OK(fabpool_fd_send(s, fds, bytes_only ? 0 : nf, &m, sizeof m));
            Reply r;
            size_t n2, l2;
            CHECK_OK(fabpool_fd_recv(s, nullptr, 0, &n2, &r, sizeof r, &l2));
            CHECK(l2 == sizeof r && r.bad == 0);
            for (int b = 0; b < NB; b++) {
                CHECK(get((char *)buf[b] + sz[b] - 8) == pat((uint64_t)step, b, 77)); /* the peer's write */
                if (m.present[b])
                    a.peers_done(buf[b]);
            }
            if (t_held() - held0 > peak)
                peak = t_held() - held0;
        }
        CHECK(deltas >= 4);

        /* a view from the handle bytes alone: the peer takes the fds with pidfd_getfd */
        memset(&m, 0, sizeof m);
        m.pidfd_probe = 1;
        m.step = 99;
        size_t sz0[NB];
        hybridep_sizes(sh, hybridep_tokens(kTrace[kSteps - 1]), sz0);
        m.size[0] = sz0[0];
        void *probe = nullptr; /* a fresh buffer: one chunk, so its full handle fits */
        a.allocate(&probe, sz0[0]);
        put((char *)probe + at_k(sz0[0], 1), pat(99, 0, 1));
        a.get_handle(&m.h[0], probe);
        CHECK_OK(fabpool_fd_send(s, nullptr, 0, &m, sizeof m));
        Reply r;
        size_t n2, l2;
        CHECK_OK(fabpool_fd_recv(s, nullptr, 0, &n2, &r, sizeof r, &l2));
        CHECK(r.bad == 0);
        if (r.pidfd_status == FABPOOL_OK)
            pidfd_note = "a view by pidfd_getfd worked";
        else {
            /* without ptrace permission (Yama ptrace_scope 1, not root) it must say so and name the other path */
            CHECK(posix && r.pidfd_status == FABPOOL_ERR_IO && strstr(r.msg, "pidfd_getfd") &&
                  strstr(r.msg, "fabpool_fd_send"));
            pidfd_note = std::string("pidfd_getfd refused, as without ptrace permission: ") + r.msg;
        }
        a.peers_done(probe);
        a.free(probe);
        CHECK_OK(fabpool_trim(a.pool(), 0)); /* what free() kept goes: the ledger below starts from nothing kept */

        /* wrong uses: each refused with its status, nothing mapped */
        fabsim_ledger l0 = t_ledger();
        int64_t h0 = t_held();
        MemHandle junk;
        memset(&junk, 0x5a, sizeof junk);
        void *p = nullptr;
        expect_error("garbage handle", FABPOOL_ERR_DESCRIPTOR, "not a fabpool hybridep handle",
                     [&] { a.open_handle(&p, &junk); });
        MemHandle d;
        void *c = nullptr;
        a.allocate(&c, 4 << 20, 64 << 20);
        a.get_handle(&d, c);
        a.peers_done(c);
        CHECK(a.resize(c, 64 << 20));
        a.get_delta(&d, c);
        expect_error("delta as a first view", FABPOOL_ERR_DESCRIPTOR, "full one", [&] { a.open_handle(&p, &d); });
        a.peers_done(c);
        a.free(c);
        MemHandle full;
        void *two = nullptr; /* two chunks, so two fds */
        a.allocate(&two, 4 << 20, 64 << 20);
        CHECK(a.resize(two, 16 << 20));
        a.get_handle(&full, two);
        CHECK(ExtendedMemoryAllocator::fds_of(full, nullptr, 0) == (posix ? 2u : 0u));
        int few[1] = {dup(2)};
        if (posix)
            expect_error("too few fds", FABPOOL_ERR_DESCRIPTOR, "fds", [&] { a.open_handle(&p, &full, few, 1); });
        else
            close(few[0]);
        a.peers_done(two);
        /* more chunks than a full handle describes; get_handle says so (get_delta would compact:
         * test_hybridep_mpi) */
        while (a.info(two).n_chunks <= fabpool_hybridep::kMaxHandleChunks)
            CHECK(a.resize(two, a.info(two).mapped + (2u << 20)));
        MemHandle big;
        expect_error("full handle of too many chunks", FABPOOL_ERR_LIMIT, "max_chunk",
                     [&] { a.get_handle(&big, two); });
        a.free(two);
        expect_error("free of a pointer not allocated", FABPOOL_ERR_NOT_FOUND, "not the base",
                     [&] { a.free((char *)buf[0] + 256); });
        expect_error("close of a pointer not opened", FABPOOL_ERR_NOT_FOUND, "not a view",
                     [&] { a.close_handle(buf[0]); });
        expect_error("update of a pointer not opened", FABPOOL_ERR_NOT_FOUND, "not a view",
                     [&] { a.update_handle(buf[0], &full); });
        expect_error("resize past the window", FABPOOL_ERR_LIMIT, "resize", [&] { a.resize(buf[0], maxs[0] * 4); });
        if (posix)
            check_third_process(a);
        /* free() kept what it freed for a reuse (keep_ms): a trim gives it back */
        CHECK(kept_bytes(a) > 0);
        CHECK_OK(fabpool_trim(a.pool(), 0));
        CHECK(kept_bytes(a) == 0);
        fabsim_ledger l1 = t_ledger();
        CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles && l1.exported_fds == l0.exported_fds);
        CHECK(t_near(t_held(), h0));
        CHECK(!a.is_accessible(&junk) && a.is_accessible(&d) == posix); /* fabric: only a full one imports */

        m.quit = 1;
        CHECK_OK(fabpool_fd_send(s, nullptr, 0, &m, sizeof m));
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        for (int b = 0; b < NB; b++)
            a.free(buf[b]);
        fabpool_stats st{};
        st.struct_size = sizeof st;
        fabpool_get_stats(a.pool(), &st);
        CHECK(st.kept_bytes == st.mapped_bytes); /* what is left is kept for reuse, and goes with a trim */
        CHECK_OK(fabpool_trim(a.pool(), 0));
        fabpool_get_stats(a.pool(), &st);
        CHECK(st.mapped_bytes == 0 && st.exported_fds_open == 0 && st.handles_outstanding == 0);
        printf("test_hybridep: %s handles%s, %d steps, %ld deltas sent (%ld fds; the first handles %ld), peak held "
               "%lld MiB, %s\n",
               posix ? "POSIX fd" : "fabric", bytes_only ? " as bytes only (pidfd_getfd)" : "", kSteps, deltas, delta_fds, full_fds, (long long)(peak >> 20),
               pidfd_note.c_str());
    } catch (const Error &e) {
        t_failures++;
        fprintf(stderr, "exporter: %s (%s)\n", e.what(), fabpool_status_name(e.status()));
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    close(s);
    close(ls);
    CHECK(t_near(t_held(), held0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
        if (machine_held)
            CHECK(machine_held(0) == 0); /* both processes */
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--peer") == 0)
        return peer(argv[2]);
    check_ptracer_choice();
    exporter(argv[0]);
    return t_done("test_hybridep");
}
