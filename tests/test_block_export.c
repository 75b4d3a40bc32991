/* test_block_export: blocks of a pool shared with another process (fabpool_block_export).
 *  - a small and a medium slab block and a large block of several chunks, each sent to a peer process over a
 *    socket: the peer opens views, reads what the owner wrote and writes back, the owner reads it; the owner
 *    frees its blocks and trims: the peer still reads its data (its views keep the memory), and once it closes
 *    them the machine holds nothing
 *  - each chunk is exported once: blocks of one slab get the same fd, a second export makes no export call;
 *    the pool closes its fds when it unmaps the chunks (a trim, a sleep)
 *  - a released view is never taken back for other memory at the same address: the exporter frees the block,
 *    trims and allocates again at the same address, or sleeps with offload and wakes; the next export is a new
 *    descriptor, and the view opened from it reads the exporter's new bytes and writes into its block
 *  - refused with nothing changed: NULLs, a pool of handle type none, another pool's pointer, interior, freed
 *    and buffer pointers, too small a descriptor, the pool asleep, an export call that fails on a middle chunk
 * Run with FABPOOL_CONF=handle_type:fabric FABSIM_FABRIC=1 for fabric handles (no fds). */
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)
#define NB 3

static int sim;
static uint64_t (*machine_held)(int);

/* The descriptor header's record count and window (lib/desc.h) */
static uint32_t desc_records(const uint8_t *d)
{
    uint32_t n;
    memcpy(&n, d + 12, sizeof n);
    return n;
}

static uint64_t desc_window(const uint8_t *d)
{
    uint64_t w;
    memcpy(&w, d + 40, sizeof w);
    return w;
}

/* What the owner sends with each descriptor. */
struct blk_msg {
    uint64_t offset, usable, tag;
};

/* ---------------------------------------------------------------- the peer */

static int peer(const char *sock_name)
{
    CUdevice dev;
    CUcontext ctx;
    fabpool_t *p;
    int s;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        fabpool_create(NULL, &p) != FABPOOL_OK || fabpool_fd_connect(sock_name, &s, 5000) != FABPOOL_OK) {
        fprintf(stderr, "peer: %s\n", fabpool_last_error());
        return 1;
    }
    static uint8_t buf[1 << 16];
    fabpool_view_t *v[NB];
    char *at[NB];
    struct blk_msg m[NB];
    for (int i = 0; i < NB; i++) {
        int fds[64];
        size_t nf, len;
        if (fabpool_fd_recv(s, fds, 64, &nf, buf, sizeof buf, &len) != FABPOOL_OK || len < sizeof m[i]) {
            fprintf(stderr, "peer: %s\n", fabpool_last_error());
            return 2;
        }
        memcpy(&m[i], buf, sizeof m[i]);
        if (fabpool_view_open(p, buf + sizeof m[i], len - sizeof m[i], fds, nf, &v[i]) != FABPOOL_OK) {
            fprintf(stderr, "peer: view of block %d: %s\n", i, fabpool_last_error());
            return 3;
        }
        at[i] = (char *)fabpool_view_ptr(v[i]) + m[i].offset;
        uint64_t seen = t_tag_ok(at[i], m[i].usable, m[i].tag);
        t_put_tag(at[i], m[i].usable, m[i].tag + 1);
        cuCtxSynchronize(); /* the DMA lands before the owner looks */
        if (fabpool_fd_send(s, NULL, 0, &seen, sizeof seen) != FABPOOL_OK)
            return 4;
    }
    /* the owner has freed its blocks and trimmed: the views still hold the data */
    uint64_t go, ok = 0;
    size_t nf, len;
    if (fabpool_fd_recv(s, NULL, 0, &nf, &go, sizeof go, &len) != FABPOOL_OK)
        return 5;
    for (int i = 0; i < NB; i++)
        ok += t_tag_ok(at[i], m[i].usable, m[i].tag + 1);
    for (int i = 0; i < NB; i++)
        fabpool_view_close(v[i]);
    fabpool_destroy(p);
    if (fabpool_fd_send(s, NULL, 0, &ok, sizeof ok) != FABPOOL_OK)
        return 6;
    return t_failures ? 7 : 0;
}

/* ---------------------------------------------------------------- the owner */

/* A small and a medium slab block and a large block of several chunks, to a peer and back. */
static void to_peer(const char *self)
{
    int64_t u0 = t_held();
    fabpool_t *a = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    if (!a)
        return;
    int posix = fabpool_handle_type_of(a) == FABPOOL_HANDLE_POSIX_FD;
    int ls, s;
    pid_t pid = t_spawn_peer(self, "--peer", "fabpool-blk", &ls, &s);
    const size_t sizes[NB] = {1000, 3 * MB, 100 * MB};
    const uint32_t min_chunks[NB] = {1, 1, 4}; /* 100 MiB on the 32 MiB grid of large chunks */
    void *blk[NB];
    size_t usable[NB];
    uint64_t chunk_bytes = 0;
    static uint8_t buf[1 << 16];
    for (int i = 0; i < NB; i++) {
        CHECK_OK(fabpool_alloc(a, sizes[i], &blk[i]));
        CHECK_OK(fabpool_usable_size(a, blk[i], &usable[i]));
        t_put_tag(blk[i], usable[i], 100 + (uint64_t)i);
        CHECK_CU(cuCtxSynchronize());
        int fds[64];
        size_t len = 0, nfds = 0, off = 0;
        struct blk_msg m = {0, usable[i], 100 + (uint64_t)i};
        CHECK_OK(fabpool_block_export(a, blk[i], buf + sizeof m, sizeof buf - sizeof m, &len, fds, 64, &nfds, &off));
        uint32_t n = desc_records(buf + sizeof m);
        CHECK(n >= min_chunks[i] && nfds == (posix ? n : 0));
        CHECK(off + usable[i] <= desc_window(buf + sizeof m)); /* the block lies in the run of chunks */
        m.offset = off;
        memcpy(buf, &m, sizeof m);
        CHECK_OK(fabpool_fd_send(s, fds, nfds, buf, sizeof m + len));
        uint64_t seen = 0;
        size_t n2, l2;
        CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n2, &seen, sizeof seen, &l2));
        CHECK(seen == 1);                                        /* the peer read what the owner wrote */
        CHECK(t_tag_ok(blk[i], usable[i], 101 + (uint64_t)i));  /* and the owner reads what it wrote */
        chunk_bytes += usable[i];
    }
    CHECK_OK(fabpool_check(a));
    /* the owner lets go first: its blocks freed, its memory trimmed and its fds closed */
    for (int i = 0; i < NB; i++)
        CHECK_OK(fabpool_free(a, blk[i]));
    CHECK_OK(fabpool_trim(a, 0));
    fabpool_stats st = t_stats(a);
    CHECK(st.mapped_bytes == 0 && st.exported_fds_open == 0 && st.handles_outstanding == 0);
    if (machine_held)
        CHECK(machine_held(0) >= chunk_bytes); /* the peer's views hold the chunks */
    uint64_t go = 1, ok = 0;
    size_t n2, l2;
    CHECK_OK(fabpool_fd_send(s, NULL, 0, &go, sizeof go));
    CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n2, &ok, sizeof ok, &l2));
    CHECK(ok == NB); /* the peer still read its data after the owner let go */
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (machine_held)
        CHECK(machine_held(0) == 0); /* both let go: nothing is held, in any process */
    close(s);
    close(ls);
    CHECK_OK(fabpool_destroy(a));
    CHECK(t_near(t_held(), u0));
}

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* Each chunk is exported once, its fd kept while it stays mapped. */
static void exported_once(void)
{
    fabpool_t *a = NULL, *b = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    CHECK_OK(fabpool_create(NULL, &b));
    if (!a || !b)
        return;
    int posix = fabpool_handle_type_of(a) == FABPOOL_HANDLE_POSIX_FD;
    void *x, *y;
    CHECK_OK(fabpool_alloc(a, 1000, &x));
    CHECK_OK(fabpool_alloc(a, 1000, &y)); /* the same slab */
    uint8_t d1[1024], d2[1024];
    int f1[16], f2[16];
    memset(f1, 0xff, sizeof f1);
    memset(f2, 0xff, sizeof f2);
    size_t l1, l2, n1, n2, o1, o2;
    fabpool_stats s0 = t_stats(a);
    CHECK_OK(fabpool_block_export(a, x, d1, sizeof d1, &l1, f1, 16, &n1, &o1));
    fabpool_stats s1 = t_stats(a);
    CHECK_OK(fabpool_block_export(a, y, d2, sizeof d2, &l2, f2, 16, &n2, &o2));
    CHECK_OK(fabpool_block_export(a, x, d2, sizeof d2, &l2, f2, 16, &n2, &o2));
    fabpool_stats s2 = t_stats(a);
    CHECK(t_calls(&s1, "cuMemExportToShareableHandle") == t_calls(&s0, "cuMemExportToShareableHandle") + 1);
    CHECK(t_calls(&s2, "cuMemExportToShareableHandle") == t_calls(&s1, "cuMemExportToShareableHandle"));
    CHECK(l1 == l2 && memcmp(d1, d2, l1) == 0 && o1 == o2); /* the same block: the same bytes */
    CHECK(desc_records(d1) == 1 && n1 == (posix ? 1u : 0u));
    CHECK(s2.exported_fds_open == s0.exported_fds_open + (posix ? 1u : 0u));
    if (posix)
        CHECK(f1[0] >= 0 && f1[0] == f2[0]);
    /* a view in this process: fabpool_view_open takes its fds, so it gets copies */
    int mine[16];
    for (size_t i = 0; i < n1; i++)
        mine[i] = dup(f1[i]);
    fabpool_view_t *v = NULL;
    CHECK_OK(fabpool_view_open(b, d1, l1, mine, n1, &v));
    if (v) {
        t_put_tag(x, 1024, 7);
        CHECK(t_tag_ok((char *)fabpool_view_ptr(v) + o1, 1024, 7));
        CHECK_OK(fabpool_view_close(v));
    }
    CHECK_OK(fabpool_check(a));
    /* the fd goes with the chunk's mapping */
    CHECK_OK(fabpool_free(a, x));
    CHECK_OK(fabpool_free(a, y));
    if (posix)
        CHECK(fd_open(f1[0])); /* the slab is still mapped (cached) */
    CHECK_OK(fabpool_trim(a, 0));
    CHECK(t_stats(a).exported_fds_open == 0);
    if (posix)
        CHECK(!fd_open(f1[0]));
    /* a sleep unmaps a live block's chunks: their fds go too, and the export after the wake is new */
    CHECK_OK(fabpool_alloc(a, 20 * MB, &x));
    CHECK_OK(fabpool_block_export(a, x, d1, sizeof d1, &l1, f1, 16, &n1, &o1));
    CHECK_OK(fabpool_sleep(a, FABPOOL_SLEEP_DISCARD, NULL));
    CHECK(t_stats(a).exported_fds_open == 0);
    CHECK_STATUS(fabpool_block_export(a, x, d1, sizeof d1, &l1, f1, 16, &n1, &o1), FABPOOL_ERR_ASLEEP);
    CHECK_OK(fabpool_wake(a, NULL));
    s0 = t_stats(a);
    CHECK_OK(fabpool_block_export(a, x, d1, sizeof d1, &l1, f1, 16, &n1, &o1));
    s1 = t_stats(a);
    CHECK(t_calls(&s1, "cuMemExportToShareableHandle") > t_calls(&s0, "cuMemExportToShareableHandle"));
    CHECK_OK(fabpool_check(a));
    CHECK_OK(fabpool_free(a, x));
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(b));
}

/* Bad input is refused with its own message, and nothing changes. */
static void refused(void)
{
    fabpool_t *a = NULL, *n = NULL;
    CHECK_OK(fabpool_create(NULL, &a));
    if (!a)
        return;
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_NONE;
    CHECK_OK(fabpool_create(&o, &n));
    int posix = fabpool_handle_type_of(a) == FABPOOL_HANDLE_POSIX_FD;
    void *small, *large, *gone, *other = NULL;
    CHECK_OK(fabpool_alloc(a, 1000, &small));
    CHECK_OK(fabpool_alloc(a, 64 * MB, &large));
    CHECK_OK(fabpool_alloc(a, 1000, &gone));
    CHECK_OK(fabpool_free(a, gone));
    if (n)
        CHECK_OK(fabpool_alloc(n, 1000, &other));
    fabpool_buffer_t *buf = NULL;
    CHECK_OK(fabpool_buffer_create(a, 64 * MB, 16 * MB, &buf));
    static uint8_t d[1 << 14];
    int fds[64];
    size_t len = 0, nfds = 0, off = 0;
    fabpool_stats s0 = t_stats(a);
    CHECK_STATUS(fabpool_block_export(NULL, small, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_block_export(a, NULL, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_block_export(a, small, d, sizeof d, NULL, fds, 64, &nfds, &off), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_block_export(a, small, d, sizeof d, &len, fds, 64, &nfds, NULL), FABPOOL_ERR_INVALID_ARG);
    if (n && other && !getenv("FABPOOL_CONF")) { /* FABPOOL_CONF would override the handle type */
        CHECK_STATUS(fabpool_block_export(n, other, d, sizeof d, &len, fds, 64, &nfds, &off),
                     FABPOOL_ERR_NOT_SUPPORTED);
        CHECK(strstr(fabpool_last_error(), "handle_type:posix_fd") != NULL);
    }
    if (other) {
        CHECK_STATUS(fabpool_block_export(a, other, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_NOT_FOUND);
        CHECK(strstr(fabpool_last_error(), "did not give out") != NULL);
    }
    CHECK_STATUS(fabpool_block_export(a, (char *)small + 256, d, sizeof d, &len, fds, 64, &nfds, &off),
                 FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_block_export(a, (char *)large + 2 * MB, d, sizeof d, &len, fds, 64, &nfds, &off),
                 FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "interior") != NULL);
    CHECK_STATUS(fabpool_block_export(a, gone, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_NOT_FOUND);
    CHECK(strstr(fabpool_last_error(), "is free") != NULL);
    if (buf)
        CHECK_STATUS(fabpool_block_export(a, fabpool_buffer_ptr(buf), d, sizeof d, &len, fds, 64, &nfds, &off),
                     FABPOOL_ERR_NOT_FOUND);
    CHECK_STATUS(fabpool_block_export(a, &len, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_NOT_FOUND);
    /* too small: what is needed is said */
    CHECK_STATUS(fabpool_block_export(a, small, d, 10, &len, fds, 64, &nfds, &off), FABPOOL_ERR_LIMIT);
    CHECK(len == fabpool_desc_size(1) && nfds == (posix ? 1u : 0u));
    if (posix) {
        CHECK_STATUS(fabpool_block_export(a, small, d, sizeof d, &len, fds, 0, &nfds, &off), FABPOOL_ERR_LIMIT);
        CHECK(nfds == 1);
    }
    fabpool_stats s1 = t_stats(a);
    CHECK(s1.exported_fds_open == s0.exported_fds_open && s1.mapped_bytes == s0.mapped_bytes);
    CHECK(t_calls(&s1, "cuMemExportToShareableHandle") == t_calls(&s0, "cuMemExportToShareableHandle"));
    /* a failed export of the second chunk: the first one's export is undone */
    t_sim_hooks h = t_sim_hooks_get();
    if (h.fault_set) {
        h.fault_set("cuMemExportToShareableHandle", 2, 0, CUDA_ERROR_UNKNOWN);
        CHECK_STATUS(fabpool_block_export(a, large, d, sizeof d, &len, fds, 64, &nfds, &off), FABPOOL_ERR_DRIVER);
        CHECK(strstr(fabpool_last_error(), "cuMemExportToShareableHandle") != NULL);
        h.fault_clear();
        fabpool_stats s2 = t_stats(a);
        CHECK(s2.exported_fds_open == s0.exported_fds_open && s2.handles_outstanding == s0.handles_outstanding);
        CHECK_OK(fabpool_check(a));
        CHECK_OK(fabpool_block_export(a, large, d, sizeof d, &len, fds, 64, &nfds, &off));
        CHECK(desc_records(d) >= 2);
    }
    CHECK_OK(fabpool_free(a, small));
    CHECK_OK(fabpool_free(a, large));
    if (buf)
        CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    if (n) {
        if (other)
            CHECK_OK(fabpool_free(n, other));
        CHECK_OK(fabpool_destroy(n));
    }
    CHECK_OK(fabpool_destroy(a));
}

/* How the exporter puts new memory at the block's old address. */
enum renew { RENEW_REALLOC, RENEW_SLEEP };

/* A view released and kept by the peer pool, then the exporter's block at the same address is new memory: the
 * next export names it as such, and the peer's view maps the new memory, not the kept one. */
static void kept_view_of_new_memory(size_t size, enum renew how)
{
    fabpool_t *p = t_pool("handle_type:auto"), *q = t_pool("handle_type:auto,keep_ms:60000");
    if (!p || !q || fabpool_handle_type_of(p) == FABPOOL_HANDLE_NONE) {
        fabpool_destroy(p);
        fabpool_destroy(q);
        return;
    }
    static uint8_t d1[1 << 14], d2[1 << 14];
    int f1[64], f2[64], mine[64];
    size_t l1 = 0, l2 = 0, n1 = 0, n2 = 0, o1 = 0, o2 = 0;
    void *x = NULL, *y = NULL;
    CHECK_OK(fabpool_alloc(p, size, &x));
    if (!x)
        goto out;
    t_put_tag(x, size, 0x1111);
    CHECK_OK(fabpool_block_export(p, x, d1, sizeof d1, &l1, f1, 64, &n1, &o1));
    for (size_t i = 0; i < n1; i++)
        mine[i] = dup(f1[i]);
    fabpool_view_t *v = NULL;
    CHECK_OK(fabpool_view_open_peer(q, getpid(), d1, l1, mine, n1, &v)); /* released below, kept */
    if (!v)
        goto out;
    CHECK(t_tag_ok((char *)fabpool_view_ptr(v) + o1, size, 0x1111));
    CHECK_OK(fabpool_view_release(v));

    if (how == RENEW_REALLOC) {
        CHECK_OK(fabpool_free(p, x));
        CHECK_OK(fabpool_trim(p, 0));
        CHECK_OK(fabpool_alloc(p, size, &y));
        if (y != x) { /* the case needs the same address */
            printf("test_block_export: a block of %zu bytes came back at another address; case skipped\n", size);
            CHECK_OK(fabpool_free(p, y));
            goto out;
        }
    } else {
        CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
        CHECK_OK(fabpool_wake(p, NULL));
        y = x;
    }
    t_put_tag(y, size, 0x2222);
    CHECK_OK(fabpool_block_export(p, y, d2, sizeof d2, &l2, f2, 64, &n2, &o2));
    CHECK(l2 != l1 || memcmp(d1, d2, l1) != 0); /* new memory: a new descriptor */
    for (size_t i = 0; i < n2; i++)
        mine[i] = dup(f2[i]);
    fabpool_view_t *w = NULL;
    CHECK_OK(fabpool_view_open_peer(q, getpid(), d2, l2, mine, n2, &w)); /* the kept view's peer */
    if (w) {
        char *at = (char *)fabpool_view_ptr(w) + o2;
        CHECK(t_tag_ok(at, size, 0x2222)); /* the exporter's bytes, not the old memory's */
        t_put_tag(at, size, 0x3333);
        CHECK_CU(cuCtxSynchronize());
        CHECK(t_tag_ok(y, size, 0x3333)); /* writes through the view reach the block */
        CHECK_OK(fabpool_view_close(w));
    }
    CHECK_OK(fabpool_check(q));
    CHECK_OK(fabpool_free(p, y));
    x = NULL;
out:
    if (x)
        CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
}

static void kept_views_of_new_memory(void)
{
    const size_t sizes[] = {1 * MB, 8 * MB, 100 * MB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kept_view_of_new_memory(sizes[i], RENEW_REALLOC);
        kept_view_of_new_memory(sizes[i], RENEW_SLEEP);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--peer") == 0)
        return peer(argv[2]);
    sim = t_driver_init();
    machine_held = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "fabsim_machine_held_bytes");
    refused();
    exported_once();
    kept_views_of_new_memory();
    to_peer(argv[0]);
    CHECK(t_near(t_held(), 0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    return t_done("test_block_export");
}
