/* test_symm: symmetric memory (symm.c) over 4 forked ranks, in C, so that the sanitizers and valgrind see
 * it (test_symm_python covers more through the Python module).  The parent is the group's all-gather: a hub
 * over a socket pair per rank; it never touches CUDA.  Each rank:
 *   - creates with a different size asked (all get the largest), resizes through random sizes up and down,
 *     and after each step writes its words and reads every peer's through the pointers, with no address moved;
 *   - with rank 1's cuMemCreate failing (sim faults): every rank's resize fails naming rank 1, the sizes and
 *     data stay, the next resize works;
 *   - with different max_bytes: every rank's create fails, naming each rank's;
 *   - ends holding nothing (the sim's ledger).
 * Usage: test_symm [steps] */
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "symm.h"

#define NR 4
#define MB (1ull << 20)

static int io_all(int fd, void *p, size_t n, int out)
{
    for (size_t k = 0; k < n;) {
        ssize_t r = out ? write(fd, (char *)p + k, n - k) : read(fd, (char *)p + k, n - k);
        if (r <= 0)
            return -1;
        k += (size_t)r;
    }
    return 0;
}

/* The rank's side of the hub: its bytes out, everyone's back (length 0: a rank has left). */
static int allgather(void *ctx, const void *send, void *recv, size_t bytes)
{
    int fd = *(int *)ctx;
    uint64_t len = bytes;
    if (io_all(fd, &len, 8, 1) || io_all(fd, (void *)send, bytes, 1) || io_all(fd, &len, 8, 0) || len != NR * bytes)
        return 1;
    return io_all(fd, recv, len, 0);
}

static fabpool_torch_symm_t *make(int rank, int *fd, uint64_t max, uint64_t bytes, fabpool_status want)
{
    fabpool_torch_symm_options o;
    fabpool_torch_symm_options_init(&o);
    o.rank = rank;
    o.nranks = NR;
    o.max_bytes = max;
    o.bytes = bytes;
    o.allgather = allgather;
    o.allgather_ctx = fd;
    fabpool_torch_symm_t *s = NULL;
    fabpool_status st = fabpool_torch_symm_create(&o, &s);
    if (st != want)
        fprintf(stderr, "rank %d: create -> %s: %s\n", rank, fabpool_status_name(st), fabpool_torch_symm_last_error());
    CHECK(st == want);
    return s;
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

static void barrier(int *fd)
{
    uint8_t b = 0, all[NR];
    CHECK(allgather(fd, &b, all, 1) == 0);
}

static void rank_main(int rank, int fd, long steps)
{
    t_driver_init();
    /* the largest size asked wins */
    fabpool_torch_symm_t *s = make(rank, &fd, 64 * MB, (uint64_t)(rank + 1) * MB, FABPOOL_OK);
    if (!s)
        return;
    uint64_t ptrs0[NR], ptrs[NR], sizes[NR];
    CHECK_OK(fabpool_torch_symm_ptrs(s, ptrs0, NR));
    fabpool_torch_symm_info in;
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
        barrier(&fd);
        for (int q = 0; q < NR; q++)
            CHECK(words_ok(ptrs[q], size, q, step));
        barrier(&fd);
    }

    /* down to 1 MiB (its chunk and no more, once the peers have acknowledged), then rank 1 cannot grow:
     * every rank fails, keeps its size and data */
    CHECK_OK(fabpool_torch_symm_resize(s, MB));
    size = MB;
    write_words(ptrs[rank], size, rank, ++steps);
    barrier(&fd);
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
    barrier(&fd);
    for (int q = 0; q < NR; q++)
        CHECK(words_ok(ptrs[q], 64 * MB, q, steps + 1));
    barrier(&fd);
    CHECK_OK(fabpool_torch_symm_close(s));

    /* max_bytes differs: every rank refuses, naming each rank's */
    CHECK(make(rank, &fd, (64 + (uint64_t)(rank == 2)) * MB, MB, FABPOOL_ERR_CONFIG) == NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "max_bytes differs") != NULL);
    CHECK(strstr(fabpool_torch_symm_last_error(), "rank 2: 68157440") != NULL);

    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == 0 && l.mappings == 0 && l.handles == 0 && l.exported_fds == 0 && l.reservations == 0);
    }
}

int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 12;
    int sv[NR][2];
    pid_t pid[NR];
    for (int r = 0; r < NR; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]) != 0)
            return 2;
    for (int r = 0; r < NR; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            for (int q = 0; q < NR; q++) {
                close(sv[q][0]);
                if (q != r)
                    close(sv[q][1]);
            }
            rank_main(r, sv[r][1], steps);
            close(sv[r][1]);
            printf("rank %d: %d checks, %d failed\n", r, t_checks, t_failures);
            exit(t_failures ? 1 : 0); /* exit, not _exit: the leak checkers look at the end */
        }
    }
    for (int r = 0; r < NR; r++)
        close(sv[r][1]);
    signal(SIGPIPE, SIG_IGN); /* the last round's answer goes to ranks that have left */
    /* the hub: one message from every rank, then all of them to every rank; a rank gone ends the group */
    static uint8_t in[NR][1 << 16], all[NR << 16];
    int live = 1;
    while (live) {
        uint64_t len[NR];
        for (int r = 0; r < NR && live; r++)
            if (io_all(sv[r][0], &len[r], 8, 0) || len[r] > sizeof in[r] || io_all(sv[r][0], in[r], len[r], 0))
                live = 0;
        uint64_t total = 0;
        for (int r = 0; live && r < NR; r++) {
            memcpy(all + total, in[r], len[r]);
            total += len[r];
        }
        for (int r = 0; r < NR; r++) {
            uint64_t t = live ? total : 0;
            if (io_all(sv[r][0], &t, 8, 1) == 0 && live)
                io_all(sv[r][0], all, total, 1);
        }
    }
    int failed = 0;
    for (int r = 0; r < NR; r++) {
        int status = 0;
        waitpid(pid[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(sv[r][0]);
    }
    printf("test_symm: %d ranks, %ld steps, %d ranks failed\n", NR, steps, failed);
    return failed ? 1 : 0;
}
