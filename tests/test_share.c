/* test_share: buffers across processes.
 *  - the handle type: auto picks what works; forced fabric without an IMEX channel fails with its message
 *  - a view in the same process: full descriptor, deltas as the buffer grows and shrinks, data both ways
 *  - malformed descriptors: each refused, nothing mapped
 *  - a late peer opens the acknowledged generation's descriptor after a shrink and a refit
 *  - a peer process that imports over the socket helper and is then killed: once the exporter lets go,
 *    the machine holds nothing (the kernel closed the dead process's fds and mappings)
 * Run with FABPOOL_CONF=handle_type:fabric FABSIM_FABRIC=1 for fabric handles. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include "testutil.h"

#define MB (1ull << 20)

static int sim;
static uint64_t (*machine_held)(int);

#define put t_put_word
#define get t_get_word

/* FNV-1a of the descriptor with its checksum field zeroed (docs/design.md) */
static void reseal(uint8_t *d, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ ((i >= 80 && i < 88) ? 0 : d[i])) * 1099511628211ull;
    memcpy(d + 80, &h, 8);
}

static int dup_all(const int *fds, size_t n, int *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = dup(fds[i]);
    return (int)n;
}

static void handle_types(void)
{
    fabpool_t *p = NULL;
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_FABRIC;
    if (!getenv("FABSIM_FABRIC") && !getenv("FABPOOL_CONF")) {
        /* no IMEX channel: the H200 and the sim by default */
        CHECK_STATUS(fabpool_create(&o, &p), FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(strstr(fabpool_last_error(), "/dev/nvidia-caps-imex-channels") != NULL);
        CHECK(strstr(fabpool_last_error(), "posix_fd") != NULL);
        o.handle_type = FABPOOL_HANDLE_AUTO;
        CHECK_OK(fabpool_create(&o, &p));
        CHECK(p && fabpool_handle_type_of(p) == FABPOOL_HANDLE_POSIX_FD);
        if (p)
            fabpool_destroy(p);
    }
    o.handle_type = FABPOOL_HANDLE_NONE;
    CHECK_OK(fabpool_create(&o, &p));
    if (p && !getenv("FABPOOL_CONF")) { /* FABPOOL_CONF would override the option */
        fabpool_buffer_t *b;
        CHECK_OK(fabpool_buffer_create(p, 8 * MB, 4 * MB, &b));
        size_t len, nfds;
        uint8_t d[1024];
        int fds[8];
        CHECK_STATUS(fabpool_buffer_export(b, 0, d, sizeof d, &len, fds, 8, &nfds), FABPOOL_ERR_NOT_SUPPORTED);
        fabpool_buffer_destroy(b, NULL);
    }
    if (p)
        fabpool_destroy(p);
}

static int posix;

static void same_process(void)
{
    fabpool_t *a = NULL, *b = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    CHECK_OK(fabpool_create(NULL, &b));
    if (!a || !b)
        return;
    posix = fabpool_handle_type_of(a) == FABPOOL_HANDLE_POSIX_FD;
    fabpool_buffer_t *buf;
    CHECK_OK(fabpool_buffer_create(a, 1024 * MB, 64 * MB, &buf));
    char *base = fabpool_buffer_ptr(buf);
    put(base, 11);
    put(base + 64 * MB - 8, 12);

    static uint8_t d[1 << 16];
    int fds[64], mine[64];
    size_t len, nfds;
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 64, &nfds));
    CHECK(posix ? nfds >= 1 : nfds == 0);
    fabpool_view_t *v = NULL;
    dup_all(fds, nfds, mine);
    CHECK_OK(fabpool_view_open(b, d, len, mine, nfds, &v));
    if (!v)
        return;
    char *vb = fabpool_view_ptr(v);
    CHECK(vb != base);
    CHECK(get(vb) == 11 && get(vb + 64 * MB - 8) == 12);
    put(vb + 8, 21); /* the importer writes, the exporter reads */
    CHECK(get(base + 8) == 21);

    /* grow: the delta carries only the new chunks */
    fabpool_buffer_info bi = {.struct_size = sizeof bi}, vi = {.struct_size = sizeof vi};
    fabpool_buffer_get_info(buf, &bi);
    uint64_t g1 = bi.generation;
    CHECK_OK(fabpool_buffer_resize(buf, 300 * MB, NULL));
    put(base + 300 * MB - 8, 13);
    CHECK_OK(fabpool_buffer_export(buf, g1, d, sizeof d, &len, fds, 64, &nfds));
    fabpool_buffer_info b2 = {.struct_size = sizeof b2};
    fabpool_buffer_get_info(buf, &b2);
    CHECK(len == fabpool_desc_size(b2.n_chunks - bi.n_chunks));
    dup_all(fds, nfds, mine);
    CHECK_OK(fabpool_view_apply(v, d, len, mine, nfds));
    fabpool_view_get_info(v, &vi);
    CHECK(vi.base == vb && vi.generation == b2.generation && vi.size == b2.mapped);
    CHECK(get(vb) == 11 && get(vb + 300 * MB - 8) == 13);

    /* applying the same delta again is refused (nothing to add), a stale one too */
    dup_all(fds, nfds, mine);
    fabpool_status st = fabpool_view_apply(v, d, len, mine, nfds);
    CHECK(st == FABPOOL_ERR_DESCRIPTOR || st == FABPOOL_OK);

    /* shrink: the buffer refits (its first chunk held more than 16 MiB + the
     * hysteresis: audit item 6), the data below 16 MiB is copied into a new
     * smaller chunk; the old chunks leave the exporter's window but their
     * memory is held for the peers until they ack; the delta names the new chunk */
    uint64_t g2 = b2.generation;
    int64_t held_before = t_held();
    CHECK_OK(fabpool_buffer_resize(buf, 16 * MB, NULL));
    fabpool_buffer_get_info(buf, &b2);
    CHECK(b2.mapped <= 20 * MB && t_mapped(a) == b2.mapped && fabpool_buffer_ptr(buf) == base);
    CHECK(get(base) == 11 && get(base + 8) == 21);
    CHECK(t_near(t_held(), held_before + (int64_t)b2.mapped)); /* shared: the old ones held for the peers */
    CHECK_OK(fabpool_buffer_export(buf, g2, d, sizeof d, &len, fds, 64, &nfds));
    CHECK(nfds == (posix ? 1u : 0u) && len == fabpool_desc_size(1));
    dup_all(fds, nfds, mine);
    CHECK_OK(fabpool_view_apply(v, d, len, mine, nfds));
    fabpool_view_get_info(v, &vi);
    CHECK(vi.size == b2.mapped && vi.size < 300 * MB && vi.base == vb);
    CHECK(get(vb) == 11 && get(vb + 8) == 21);
    put(vb + 16, 22); /* the new chunk is shared both ways */
    CHECK(get(base + 16) == 22);
    CHECK_OK(fabpool_buffer_peers_ack(buf, vi.generation));
    CHECK(t_mapped(a) == b2.mapped);
    CHECK_OK(fabpool_buffer_export_done(buf));
    if (t_ledger_p) /* the view maps the same memory as the buffer: the old chunks are gone */
        CHECK(t_held() == (int64_t)t_mapped(a) && t_mapped(b) == t_mapped(a));
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(a, &s);
    /* the pool's copies are closed but one, its export anchor, while its chunk is mapped (fabpool.h) */
    CHECK(s.exported_fds_open == (fabpool_handle_type_of(a) == FABPOOL_HANDLE_POSIX_FD) && s.handles_outstanding == 0);

    /* a delta since a generation the view has not reached is refused */
    CHECK_OK(fabpool_buffer_resize(buf, 200 * MB, NULL));
    fabpool_buffer_get_info(buf, &b2);
    CHECK_OK(fabpool_buffer_resize(buf, 400 * MB, NULL));
    CHECK_OK(fabpool_buffer_export(buf, b2.generation, d, sizeof d, &len, fds, 64, &nfds));
    fabsim_ledger l0 = t_ledger();
    dup_all(fds, nfds, mine);
    CHECK_STATUS(fabpool_view_apply(v, d, len, mine, nfds), FABPOOL_ERR_DESCRIPTOR);
    CHECK(strstr(fabpool_last_error(), "delta") != NULL);
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings);

    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_peers_ack(buf, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(b));
    CHECK(t_near(t_held(), 0));
}

/* Two pools, the exporter (*a) and the importer (*b), and a buffer of the
 * exporter's; NULL if anything failed (a failed check). */
static fabpool_buffer_t *exporter_importer(fabpool_t **a, fabpool_t **b, size_t max_size, size_t size)
{
    *a = *b = NULL;
    CHECK_OK(fabpool_create(NULL, a));
    CHECK_OK(fabpool_create(NULL, b));
    fabpool_buffer_t *buf = NULL;
    if (*a && *b)
        CHECK_OK(fabpool_buffer_create(*a, max_size, size, &buf));
    return buf;
}

/* The fds a pool exports (a buffer's, a block's) are closed on exec: a program that runs another must not hand
 * it the pool's memory, and nothing says the driver's export sets the flag. */
static void exported_fds_close_on_exec(void)
{
    fabpool_t *a, *b;
    fabpool_buffer_t *buf = exporter_importer(&a, &b, 64 * MB, 20 * MB);
    if (!buf || fabpool_handle_type_of(a) != FABPOOL_HANDLE_POSIX_FD) {
        if (buf)
            fabpool_buffer_destroy(buf, NULL);
        fabpool_destroy(a);
        fabpool_destroy(b);
        return;
    }
    static uint8_t d[1 << 14];
    int fds[64];
    size_t len = 0, nfds = 0, off = 0;
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 64, &nfds));
    CHECK(nfds > 0);
    for (size_t i = 0; i < nfds; i++)
        CHECK(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
    void *x = NULL;
    CHECK_OK(fabpool_alloc(a, 3 * MB, &x));
    CHECK_OK(fabpool_block_export(a, x, d, sizeof d, &len, fds, 64, &nfds, &off));
    CHECK(nfds > 0);
    for (size_t i = 0; i < nfds; i++)
        CHECK(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
    CHECK_OK(fabpool_free(a, x));
    CHECK_OK(fabpool_buffer_export_done(buf));
    fabpool_buffer_peers_ack(buf, UINT64_MAX);
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(b));
}

static void malformed(void)
{
    fabpool_t *a, *b;
    fabpool_buffer_t *buf = exporter_importer(&a, &b, 256 * MB, 100 * MB);
    if (!buf)
        return;
    static uint8_t d[1 << 14], m[1 << 14];
    int fds[64], mine[64];
    size_t len, nfds;
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 64, &nfds));
    size_t rec = FABPOOL_DESC_HEADER_BYTES;
    fabsim_ledger l0 = t_ledger();
    uint64_t m0 = t_mapped(b);
    fabpool_view_t *v = NULL;
#define TRY(name, code, want_word)                                                                     \
    do {                                                                                               \
        memcpy(m, d, len);                                                                             \
        size_t L = len, nf = nfds;                                                                     \
        code;                                                                                          \
        dup_all(fds, nfds, mine);                                                                      \
        fabpool_status st_ = fabpool_view_open(b, m, L, mine, nf, &v);                                 \
        t_checks++;                                                                                    \
        if (st_ != FABPOOL_ERR_DESCRIPTOR || v || !strstr(fabpool_last_error(), want_word)) {          \
            t_failures++;                                                                              \
            fprintf(stderr, "%s: %s: %s\n", name, fabpool_status_name(st_), fabpool_last_error());     \
        }                                                                                              \
        for (size_t i_ = nf; i_ < nfds; i_++)                                                          \
            close(mine[i_]);                                                                           \
    } while (0)
    TRY("truncated", L = len - 1, "truncated");
    TRY("header only", L = 40, "truncated");
    TRY("bad magic", (m[0] ^= 1, reseal(m, L)), "not a fabpool descriptor");
    TRY("other version", (m[4] = 9, reseal(m, L)), "version");
    TRY("corrupted", m[rec + 3] ^= 0x40, "checksum");
    uint64_t big = 1ull << 40;
    TRY("out of window", (memcpy(m + rec, &big, 8), reseal(m, L)), "outside the window");
    uint64_t one = 4096;
    TRY("unaligned", (memcpy(m + rec, &one, 8), reseal(m, L)), "outside the window");
    if (len >= rec + 2 * FABPOOL_DESC_RECORD_BYTES) {
        TRY("duplicate chunk", (memcpy(m + rec + FABPOOL_DESC_RECORD_BYTES, m + rec, 24), reseal(m, L)), "overlaps");
    }
    uint64_t live = 1ull << 41;
    TRY("live past window", (memcpy(m + 48, &live, 8), reseal(m, L)), "granularity");
    if (posix) {
        TRY("too few fds", nf = nfds - 1, "fds came");
    }
    /* a delta as a first view */
    CHECK_OK(fabpool_buffer_resize(buf, 200 * MB, NULL));
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    fabpool_buffer_get_info(buf, &bi);
    CHECK_OK(fabpool_buffer_export(buf, bi.generation - 1, d, sizeof d, &len, fds, 64, &nfds));
    l0 = t_ledger();
    TRY("delta first", (void)0, "full descriptor");
    fabsim_ledger l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles);
    CHECK(t_mapped(b) == m0);
    CHECK_STATUS(fabpool_view_open(b, NULL, 0, NULL, 0, &v), FABPOOL_ERR_INVALID_ARG);
    /* a delta of another granularity is refused before the view unmaps anything: its chunks would not lie where
     * the view's do */
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 64, &nfds));
    dup_all(fds, nfds, mine);
    CHECK_OK(fabpool_view_open(b, d, len, mine, nfds, &v));
    CHECK_OK(fabpool_buffer_resize(buf, 120 * MB, NULL));
    fabpool_buffer_get_info(buf, &bi);
    CHECK_OK(fabpool_buffer_export(buf, bi.generation - 1, d, sizeof d, &len, fds, 64, &nfds));
    uint64_t gran = 0;
    memcpy(&gran, d + 72, 8);
    gran /= 2;
    memcpy(d + 72, &gran, 8);
    reseal(d, len);
    m0 = t_mapped(b);
    l0 = t_ledger();
    dup_all(fds, nfds, mine);
    CHECK_STATUS(fabpool_view_apply(v, d, len, mine, nfds), FABPOOL_ERR_DESCRIPTOR);
    CHECK(strstr(fabpool_last_error(), "granularity") != NULL);
    l1 = t_ledger();
    CHECK(l1.mappings == l0.mappings && l1.handles == l0.handles && t_mapped(b) == m0);
    CHECK_OK(fabpool_view_close(v));
    v = NULL;
    fabpool_buffer_export_done(buf);
    fabpool_buffer_peers_ack(buf, UINT64_MAX);
    fabpool_buffer_destroy(buf, NULL);
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(b));
#undef TRY
}

/* A late peer: every peer acknowledged generation g, the exporter then
 * shrinks (a chunk retires) and refits (its one remaining chunk replaced by a
 * smaller one), and a peer handed g's full descriptor before (its fds with
 * it) opens it only now.  It is entitled to g's chunks until the peers
 * acknowledge a later generation: with fabric handles the exporter's hold is
 * the only thing that keeps them importable; with POSIX fds the peer's fds
 * would keep them anyway, and the exporter holds them just the same (one
 * rule, one accounting).  The ack of the generation that dropped them lets
 * them go. */
static void late_peer_after_refit(void)
{
    fabpool_t *a, *b;
    fabpool_buffer_t *buf = exporter_importer(&a, &b, 64 * MB, 12 * MB);
    if (!buf)
        return;
    fabpool_buffer_info g = {.struct_size = sizeof(fabpool_buffer_info)};
    fabpool_buffer_get_info(buf, &g);
    uint64_t first = g.mapped; /* the first chunk */
    CHECK_OK(fabpool_buffer_resize(buf, 40 * MB, NULL));
    fabpool_buffer_get_info(buf, &g);
    CHECK(g.n_chunks == 2);
    char *base = fabpool_buffer_ptr(buf);
    put(base, 51);
    put(base + 40 * MB - 8, 52);

    static uint8_t d[1 << 14], d2[1 << 14];
    int fds[16], late1[16], late2[16];
    size_t len, nfds, len2, nfds2;
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 16, &nfds));
    dup_all(fds, nfds, late1); /* what the late peers were sent */
    dup_all(fds, nfds, late2);
    CHECK_OK(fabpool_buffer_export_done(buf));
    CHECK_OK(fabpool_buffer_peers_ack(buf, g.generation));

    /* a shrink that retires the second chunk: it stays mapped for the late peer */
    CHECK_OK(fabpool_buffer_resize(buf, 12 * MB, NULL));
    fabpool_stats s = t_stats(a);
    CHECK(s.mapped_bytes == g.mapped && s.retiring_bytes == g.mapped - first);
    fabpool_view_t *v = NULL;
    CHECK_OK(fabpool_view_open(b, d, len, late1, nfds, &v));
    if (v) {
        CHECK(get(fabpool_view_ptr(v)) == 51 && get((char *)fabpool_view_ptr(v) + 40 * MB - 8) == 52);
        CHECK_OK(fabpool_view_close(v));
    }

    /* the refit: the first chunk is replaced by a smaller one, both old chunks leave the window and are held */
    CHECK_OK(fabpool_buffer_resize(buf, 2 * MB, NULL));
    fabpool_buffer_info g1 = {.struct_size = sizeof(fabpool_buffer_info)};
    fabpool_buffer_get_info(buf, &g1);
    CHECK(g1.n_chunks == 1 && g1.mapped <= 4 * MB && g1.generation > g.generation && get(base) == 51);
    s = t_stats(a);
    CHECK(s.mapped_bytes == g1.mapped && s.retiring_bytes == 0);
    CHECK(s.held_for_peers_bytes == g.mapped && s.handles_outstanding == 2);
    if (t_ledger_p)
        CHECK(t_held() == (int64_t)(g1.mapped + g.mapped));
    v = NULL;
    CHECK_OK(fabpool_view_open(b, d, len, late2, nfds, &v));
    if (v) {
        char *vb = fabpool_view_ptr(v);
        CHECK(get(vb) == 51 && get(vb + 40 * MB - 8) == 52);
        /* the late peer catches up: the delta replaces the old chunk by the new one */
        CHECK_OK(fabpool_buffer_export(buf, g.generation, d2, sizeof d2, &len2, fds, 16, &nfds2));
        dup_all(fds, nfds2, late1);
        CHECK_OK(fabpool_view_apply(v, d2, len2, late1, nfds2));
        CHECK_OK(fabpool_buffer_export_done(buf));
        put(base + 8, 53);
        CHECK(get(vb) == 51 && get(vb + 8) == 53);
        fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
        fabpool_view_get_info(v, &vi);
        CHECK(vi.generation == g1.generation && vi.size == g1.mapped);
        /* every peer is at the refit's generation: the old chunks go */
        CHECK_OK(fabpool_buffer_peers_ack(buf, vi.generation));
        s = t_stats(a);
        CHECK(s.held_for_peers_bytes == 0 && s.handles_outstanding == 0 && s.mapped_bytes == g1.mapped);
        if (t_ledger_p) /* the view maps the exporter's memory: nothing else is held */
            CHECK(t_held() == (int64_t)g1.mapped);
        CHECK_OK(fabpool_check(a));
        CHECK_OK(fabpool_view_close(v));
    }
    CHECK_OK(fabpool_buffer_peers_ack(buf, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(b));
    if (t_ledger_p)
        CHECK(t_held() == 0);
}

/* ---------------------------------------------------------------- a peer that dies */

/* A peer process: device 0's context current, a pool, and a socket to the
 * exporter.  0, or 1 with a message. */
static int peer_setup(const char *who, const char *sock_name, fabpool_t **p, int *s)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "%s: no device 0\n", who);
        return 1;
    }
    if (fabpool_create(NULL, p) != FABPOOL_OK || fabpool_fd_connect(sock_name, s, 5000) != FABPOOL_OK) {
        fprintf(stderr, "%s: %s\n", who, fabpool_last_error());
        return 1;
    }
    return 0;
}

static int child(const char *sock_name)
{
    fabpool_t *p;
    int s;
    if (peer_setup("child", sock_name, &p, &s))
        return 1;
    static uint8_t d[1 << 16];
    int fds[64];
    size_t nf, len;
    if (fabpool_fd_recv(s, fds, 64, &nf, d, sizeof d, &len) != FABPOOL_OK) {
        fprintf(stderr, "child: %s\n", fabpool_last_error());
        return 1;
    }
    fabpool_view_t *v;
    if (fabpool_view_open(p, d, len, fds, nf, &v) != FABPOOL_OK) {
        fprintf(stderr, "child: view: %s\n", fabpool_last_error());
        return 1;
    }
    char *vb = fabpool_view_ptr(v);
    uint64_t x = 0;
    cuMemcpyDtoH(&x, (CUdeviceptr)(uintptr_t)vb, 8);
    uint64_t y = x + 1;
    cuMemcpyHtoD((CUdeviceptr)(uintptr_t)vb + 8, &y, 8);
    cuCtxSynchronize(); /* the DMA lands before the exporter looks */
    fabpool_fd_send(s, NULL, 0, "ok", 2); /* then wait to be killed, views open */
    pause();
    return 0;
}

static void dead_peer(const char *self)
{
    fabpool_t *a = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    if (!a)
        return;
    char name[64];
    snprintf(name, sizeof name, "fabpool-test-%d", (int)getpid());
    int ls = -1, s = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--child", name, (char *)NULL);
        _exit(127);
    }
    fabpool_buffer_t *buf;
    CHECK_OK(fabpool_buffer_create(a, 512 * MB, 96 * MB, &buf));
    char *base = fabpool_buffer_ptr(buf);
    put(base, 41);
    static uint8_t d[1 << 16];
    int fds[64];
    size_t len, nfds, n2, l2;
    CHECK_OK(fabpool_buffer_export(buf, 0, d, sizeof d, &len, fds, 64, &nfds));
    CHECK_OK(fabpool_fd_accept(ls, &s));
    CHECK_OK(fabpool_fd_send(s, fds, nfds, d, len));
    CHECK_OK(fabpool_buffer_export_done(buf)); /* handed over: the exporter's copies go */
    char ok[8];
    CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n2, ok, sizeof ok, &l2));
    CHECK(l2 == 2 && memcmp(ok, "ok", 2) == 0);
    CHECK(get(base + 8) == 42); /* the child read and wrote through its view */
    if (machine_held)
        CHECK(machine_held(0) >= 96 * MB);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    /* the peer is gone: nothing is waiting for it */
    CHECK_OK(fabpool_buffer_peers_ack(buf, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    CHECK(t_mapped(a) == 0);
    if (machine_held)
        CHECK(machine_held(0) == 0); /* what the kernel itself still holds, all processes */
    close(s);
    close(ls);
    CHECK_OK(fabpool_destroy(a));
}

/* ------------------------------------------- a peer that follows a growing buffer */

struct step_msg {
    uint64_t step, size, last;
};

static uint64_t at_k(uint64_t size, int k) { return (size / 8 * (uint64_t)k) & ~(uint64_t)7; }

static int grow_child(const char *sock_name)
{
    fabpool_t *p;
    int s;
    if (peer_setup("grow child", sock_name, &p, &s))
        return 1;
    static uint8_t d[1 << 16];
    int fds[256];
    fabpool_view_t *v = NULL;
    int bad = 0;
    for (;;) {
        struct step_msg m;
        size_t nf, len;
        if (fabpool_fd_recv(s, NULL, 0, &nf, &m, sizeof m, &len) != FABPOOL_OK || len != sizeof m)
            return 3;
        if (m.last)
            break;
        if (fabpool_fd_recv(s, fds, 256, &nf, d, sizeof d, &len) != FABPOOL_OK)
            return 4;
        fabpool_status st = v ? fabpool_view_apply(v, d, len, fds, nf) : fabpool_view_open(p, d, len, fds, nf, &v);
        if (st != FABPOOL_OK) {
            fprintf(stderr, "grow child: step %llu: %s\n", (unsigned long long)m.step, fabpool_last_error());
            return 5;
        }
        char *vb = fabpool_view_ptr(v);
        for (int k = 0; k < 8; k++) {
            uint64_t x = 0;
            cuMemcpyDtoH(&x, (CUdeviceptr)(uintptr_t)(vb + at_k(m.size, k)), 8);
            bad += x != m.step * 16 + (uint64_t)k;
        }
        uint64_t y = m.step + 7777;
        cuMemcpyHtoD((CUdeviceptr)(uintptr_t)(vb + m.size - 16), &y, 8);
        cuCtxSynchronize(); /* the DMA lands before the exporter looks */
        fabpool_buffer_info vi = {.struct_size = sizeof vi};
        fabpool_view_get_info(v, &vi);
        uint64_t reply[2] = {vi.generation, (uint64_t)bad};
        if (fabpool_fd_send(s, NULL, 0, reply, sizeof reply) != FABPOOL_OK)
            return 6;
    }
    if (v)
        fabpool_view_close(v);
    fabpool_destroy(p);
    return bad ? 7 : 0;
}

/* Two processes: the exporter grows and shrinks a buffer over variable steps
 * and sends only the deltas; the peer checks the data and writes back; at
 * the end the device holds what it held at the start. */
static void peer_grows(const char *self)
{
    int64_t u0 = t_held(); /* this process and the peer it forks (real driver: NVML, held.h) */
    fabpool_t *a = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    if (!a)
        return;
    char name[64];
    snprintf(name, sizeof name, "fabpool-grow-%d", (int)getpid());
    int ls = -1, s = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--grow-child", name, (char *)NULL);
        _exit(127);
    }
    CHECK_OK(fabpool_fd_accept(ls, &s));
    fabpool_buffer_t *buf;
    CHECK_OK(fabpool_buffer_create(a, 1024 * MB, 32 * MB, &buf));
    char *base = fabpool_buffer_ptr(buf);
    static uint8_t d[1 << 16];
    int fds[256];
    uint64_t seen = 0, rng = 12345, exported_bytes = 0;
    int steps = 60, bad = 0;
    int64_t peak_dev = 0;
    for (int i = 1; i <= steps; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t size = (16 + (rng >> 33) % 700) * MB;
        CHECK_OK(fabpool_buffer_resize(buf, size, NULL));
        for (int k = 0; k < 8; k++)
            put(base + at_k(size, k), (uint64_t)i * 16 + (uint64_t)k);
        size_t len, nfds;
        CHECK_OK(fabpool_buffer_export(buf, seen, d, sizeof d, &len, fds, 256, &nfds));
        exported_bytes += len;
        struct step_msg m = {(uint64_t)i, size, 0};
        CHECK_OK(fabpool_fd_send(s, NULL, 0, &m, sizeof m));
        CHECK_OK(fabpool_fd_send(s, fds, nfds, d, len));
        CHECK_OK(fabpool_buffer_export_done(buf));
        uint64_t reply[2];
        size_t n2, l2;
        CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n2, reply, sizeof reply, &l2));
        bad += reply[1] != 0;
        CHECK(get(base + size - 16) == (uint64_t)i + 7777);
        seen = reply[0];
        CHECK_OK(fabpool_buffer_peers_ack(buf, seen));
        int64_t now = t_held() - u0;
        if (now > peak_dev)
            peak_dev = now;
    }
    CHECK(bad == 0);
    struct step_msg last = {0, 0, 1};
    CHECK_OK(fabpool_fd_send(s, NULL, 0, &last, sizeof last));
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_OK(fabpool_buffer_peers_ack(buf, UINT64_MAX));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    fabpool_stats st = {.struct_size = sizeof st};
    fabpool_get_stats(a, &st);
    CHECK(st.exported_fds_open == 0 && st.handles_outstanding == 0 && st.mapped_bytes == 0);
    close(s);
    close(ls);
    CHECK_OK(fabpool_destroy(a));
    int64_t u1 = t_held();
    printf("peer_grows: %d steps, %llu descriptor bytes sent, held at start %lld, at end %lld, "
           "peak use %lld MiB\n",
           steps, (unsigned long long)exported_bytes, (long long)u0, (long long)u1, (long long)(peak_dev >> 20));
    CHECK(t_near(u0, u1));
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--grow-child") == 0)
        return grow_child(argv[2]);
    sim = t_driver_init();
    machine_held = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    handle_types();
    same_process();
    malformed();
    exported_fds_close_on_exec();
    late_peer_after_refit();
    dead_peer(argv[0]);
    peer_grows(argv[0]);
    CHECK(t_near(t_held(), 0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    return t_done("test_share");
}
