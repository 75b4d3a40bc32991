/* test_two_gpus_two_processes: process A on GPU 0 and process B on GPU 1
 * (fork + exec of this program) each export a growable buffer (POSIX fds) to
 * the other over fabpool's socket helpers.  Over 100 steps of variable size
 * each one grows or shrinks its buffer, sends the delta since the generation
 * the peer acknowledged, and applies the peer's delta to its view of the
 * peer's buffer (memory of the other GPU, mapped in a pool of its own GPU).
 * Each checks the marks the other wrote into its own buffer, writes a reply
 * into the other's buffer through its view, and acknowledges the generation
 * it applied (fabpool_buffer_peers_ack on the other side).  At the end each
 * GPU holds what it held at the start: cuMemGetInfo per device (sim: what the
 * whole simulated machine keeps alive, fabsim_machine_held_bytes).
 *
 * test_share (tests/) follows one exporter on one device; this test runs both
 * directions at once, across two devices.  Fewer than two devices: exit 77. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mgpu.h"

#define MB (1ull << 20)
#define STEPS 100

struct hdr {
    uint64_t step, size, last;
};
struct ack {
    uint64_t generation, bad;
};

static uint64_t at_k(uint64_t size, int k) { return (size / 8 * (uint64_t)k) & ~(uint64_t)7; }
static uint64_t mark(int role, uint64_t step, int k) { return ((uint64_t)(role + 1) << 56) | (step * 16 + (uint64_t)k); }
static uint64_t reply(int role, uint64_t step) { return ((uint64_t)(role + 1) << 48) | (step + 7777); }

/* a copy from pageable memory returns before its DMA lands: synchronize
 * before the other process is told */
static int put(void *at, uint64_t v)
{
    int bad = cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at, &v, sizeof v) != CUDA_SUCCESS;
    return bad + (cuCtxSynchronize() != CUDA_SUCCESS);
}

static uint64_t get(void *at)
{
    uint64_t v = 0;
    if (cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)at, sizeof v) != CUDA_SUCCESS)
        return ~0ull;
    return v;
}

#define FAIL(...)                                                                                     \
    do {                                                                                              \
        fprintf(stderr, "%s: ", who);                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                                 \
        fprintf(stderr, ": %s\n", fabpool_last_error());                                              \
        return 10 + __LINE__ % 100;                                                                   \
    } while (0)

static int64_t used0[2] = {-1, -1}; /* the parent's baseline per GPU; -1 in B */

/* One side of the exchange: role 0 is A on GPU 0, role 1 is B on GPU 1.
 * Returns 0 if every check passed; *bad_out gets the failures seen. */
static int exchange(int role, int s, uint64_t *bad_out)
{
    const char *who = role ? "B (GPU 1)" : "A (GPU 0)";
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = role;
    o.handle_type = FABPOOL_HANDLE_POSIX_FD;
    fabpool_t *p = NULL;
    if (fabpool_create(&o, &p) != FABPOOL_OK)
        FAIL("pool on device %d", role);
    fabpool_buffer_t *buf = NULL;
    if (fabpool_buffer_create(p, 1024 * MB, 32 * MB, &buf) != FABPOOL_OK)
        FAIL("buffer");
    char *base = fabpool_buffer_ptr(buf);
    static uint8_t d[1 << 16], pd[1 << 16];
    int fds[256], pfds[256];
    fabpool_view_t *v = NULL;
    uint64_t acked = 0, rng = 0x9e3779b97f4a7c15ull * (uint64_t)(role + 1), bad = 0;
    uint64_t sum_delta = 0, sum_full = 0;
    for (uint64_t i = 1; i <= STEPS; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t size = (16 + (rng >> 33) % 900) * MB;
        if (fabpool_buffer_resize(buf, size, NULL) != FABPOOL_OK)
            FAIL("step %llu: resize to %llu MiB", (unsigned long long)i, (unsigned long long)(size >> 20));
        for (int k = 0; k < 8; k++)
            bad += (uint64_t)put(base + at_k(size, k), mark(role, i, k));
        size_t len, nfds;
        if (fabpool_buffer_export(buf, acked, d, sizeof d, &len, fds, 256, &nfds) != FABPOOL_OK)
            FAIL("step %llu: export since %llu", (unsigned long long)i, (unsigned long long)acked);
        fabpool_buffer_info bi = {.struct_size = sizeof bi};
        fabpool_buffer_get_info(buf, &bi);
        sum_delta += len;
        sum_full += fabpool_desc_size(bi.n_chunks);
        struct hdr h = {i, size, 0};
        if (fabpool_fd_send(s, NULL, 0, &h, sizeof h) != FABPOOL_OK || fabpool_fd_send(s, fds, nfds, d, len) != FABPOOL_OK)
            FAIL("step %llu: send", (unsigned long long)i);
        if (fabpool_buffer_export_done(buf) != FABPOOL_OK)
            FAIL("export_done");

        /* the peer's step: its delta, applied to the view of its buffer */
        struct hdr ph;
        size_t n, l;
        if (fabpool_fd_recv(s, NULL, 0, &n, &ph, sizeof ph, &l) != FABPOOL_OK || l != sizeof ph || ph.step != i)
            FAIL("step %llu: the peer's header", (unsigned long long)i);
        if (fabpool_fd_recv(s, pfds, 256, &n, pd, sizeof pd, &l) != FABPOOL_OK)
            FAIL("step %llu: the peer's descriptor", (unsigned long long)i);
        fabpool_status st = v ? fabpool_view_apply(v, pd, l, pfds, n) : fabpool_view_open(p, pd, l, pfds, n, &v);
        if (st != FABPOOL_OK)
            FAIL("step %llu: %s the peer's descriptor (%zu bytes, %zu fds)", (unsigned long long)i,
                 v ? "applying" : "opening a view from", l, n);
        char *vb = fabpool_view_ptr(v);
        fabpool_buffer_info vi = {.struct_size = sizeof vi};
        fabpool_view_get_info(v, &vi);
        if (vi.size < ph.size) {
            fprintf(stderr, "%s: step %llu: the view maps %zu bytes, the peer's buffer is %llu\n", who,
                    (unsigned long long)i, vi.size, (unsigned long long)ph.size);
            bad++;
        }
        /* this GPU reads what the other GPU's process wrote into its own memory */
        for (int k = 0; k < 8; k++)
            if (get(vb + at_k(ph.size, k)) != mark(1 - role, i, k)) {
                if (bad < 5)
                    fprintf(stderr, "%s: step %llu: mark %d of the peer reads %#llx\n", who, (unsigned long long)i, k,
                            (unsigned long long)get(vb + at_k(ph.size, k)));
                bad++;
            }
        /* and writes into the other GPU's memory through the view */
        bad += (uint64_t)put(vb + ph.size - 16, reply(role, i));
        struct ack a = {vi.generation, bad};
        if (fabpool_fd_send(s, NULL, 0, &a, sizeof a) != FABPOOL_OK)
            FAIL("step %llu: send ack", (unsigned long long)i);

        /* the peer's ack: it has applied our generation and written its reply */
        struct ack pa;
        if (fabpool_fd_recv(s, NULL, 0, &n, &pa, sizeof pa, &l) != FABPOOL_OK || l != sizeof pa)
            FAIL("step %llu: the peer's ack", (unsigned long long)i);
        if (pa.bad)
            bad++;
        if (get(base + size - 16) != reply(1 - role, i)) {
            if (bad < 5)
                fprintf(stderr, "%s: step %llu: the peer's reply reads %#llx\n", who, (unsigned long long)i,
                        (unsigned long long)get(base + size - 16));
            bad++;
        }
        if (pa.generation != bi.generation) {
            fprintf(stderr, "%s: step %llu: peer acked generation %llu, exported %llu\n", who, (unsigned long long)i,
                    (unsigned long long)pa.generation, (unsigned long long)bi.generation);
            bad++;
        }
        acked = pa.generation;
        if (fabpool_buffer_peers_ack(buf, acked) != FABPOOL_OK)
            FAIL("peers_ack");
        /* the parent checks that each buffer's memory is on its own GPU */
        if (used0[0] >= 0 && i % 10 == 0) {
            int64_t g0 = mg_used(0) - used0[0], g1 = mg_used(1) - used0[1];
            if (g0 + t_slack() < (int64_t)size || g1 + t_slack() < (int64_t)ph.size) {
                fprintf(stderr, "%s: step %llu: GPU 0 holds +%lld MiB for a %llu MiB buffer, GPU 1 +%lld MiB for "
                        "%llu MiB\n", who, (unsigned long long)i, (long long)(g0 >> 20),
                        (unsigned long long)(size >> 20), (long long)(g1 >> 20), (unsigned long long)(ph.size >> 20));
                bad++;
            }
        }
    }
    struct hdr last = {0, 0, 1}, plast;
    size_t n, l;
    if (fabpool_fd_send(s, NULL, 0, &last, sizeof last) != FABPOOL_OK ||
        fabpool_fd_recv(s, NULL, 0, &n, &plast, sizeof plast, &l) != FABPOOL_OK || !plast.last)
        FAIL("the last message");
    if (fabpool_view_close(v) != FABPOOL_OK)
        FAIL("view close");
    if (fabpool_buffer_peers_ack(buf, UINT64_MAX) != FABPOOL_OK || fabpool_buffer_destroy(buf, NULL) != FABPOOL_OK)
        FAIL("buffer destroy");
    fabpool_stats ps = {.struct_size = sizeof ps};
    fabpool_get_stats(p, &ps);
    if (ps.mapped_bytes || ps.exported_fds_open || ps.handles_outstanding) {
        fprintf(stderr, "%s: the pool still holds %llu bytes, %llu fds, %llu handles\n", who,
                (unsigned long long)ps.mapped_bytes, (unsigned long long)ps.exported_fds_open,
                (unsigned long long)ps.handles_outstanding);
        bad++;
    }
    if (fabpool_destroy(p) != FABPOOL_OK)
        FAIL("pool destroy");
    printf("%s: %d steps, descriptors sent %llu bytes (full ones would be %llu), %llu bad\n", who, STEPS,
           (unsigned long long)sum_delta, (unsigned long long)sum_full, (unsigned long long)bad);
    *bad_out = bad;
    return bad ? 1 : 0;
}

static int peer_main(const char *name)
{
    const char *who = "B (GPU 1)";
    CUdevice dev;
    CUcontext c;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 1) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS || cuCtxSetCurrent(c) != CUDA_SUCCESS) {
        fprintf(stderr, "%s: no context on device 1\n", who);
        return 2;
    }
    int s = -1;
    if (fabpool_fd_connect(name, &s, 10000) != FABPOOL_OK)
        FAIL("connect to '%s'", name);
    uint64_t bad = 0;
    int r = exchange(1, s, &bad);
    close(s);
    cuDevicePrimaryCtxRelease(dev);
    return r;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--peer") == 0)
        return peer_main(argv[2]);
    int sim = t_driver_init();
    mg_two_devices("test_two_gpus_two_processes");
    /* B's memory is in another process: count the whole simulated machine */
    mg_machine_held = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    int64_t u0 = mg_used(0), u1 = mg_used(1);
    printf("%s driver; used at start: GPU 0 %lld MiB, GPU 1 %lld MiB\n", sim ? "simulated" : "real",
           (long long)(u0 >> 20), (long long)(u1 >> 20));

    char name[64];
    snprintf(name, sizeof name, "fabpool-2gpu-%d", (int)getpid());
    int ls = -1, s = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[0], argv[0], "--peer", name, (char *)NULL);
        _exit(127);
    }
    CHECK_OK(fabpool_fd_accept(ls, &s));
    CHECK_CU(cuCtxSetCurrent(mg_ctx[0]));
    uint64_t bad = 0;
    used0[0] = u0;
    used0[1] = u1;
    int r = exchange(0, s, &bad);
    CHECK(r == 0);
    CHECK(bad == 0);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "B exited with %d (signal %d)\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    close(s);
    close(ls);

    int64_t e0 = mg_used(0), e1 = mg_used(1);
    printf("used at end: GPU 0 %lld MiB, GPU 1 %lld MiB\n", (long long)(e0 >> 20), (long long)(e1 >> 20));
    CHECK(t_near(e0, u0));
    CHECK(t_near(e1, u1));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    cuDevicePrimaryCtxRelease(1);
    return t_done("test_two_gpus_two_processes");
}
