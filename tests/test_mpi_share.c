/* test_mpi_share: ranks of an MPI job, each with a growable dispatch-buffer
 * set, over many variable-length steps.  Each step every rank resizes its
 * set, exports a delta since the generation its peers have, all-gathers the
 * descriptors with MPI_Allgatherv, hands its fds to each peer over the
 * fabpool socket helper, applies the peers' deltas to its views, writes a
 * pattern into its own buffers and checks every peer's pattern through its
 * views.  At the end every rank's driver ledger is empty.
 *
 *   mpirun -np 4 test_mpi_share [steps]   (FABPOOL_CONF=handle_type:fabric FABSIM_FABRIC=1 for fabric) */
#include <mpi.h>
#include <unistd.h>

#include "testutil.h"
#include "mpi_mesh.h"

#define NBUF 3
#define MB (1ull << 20)
#define MAXR 16
#define DESC_CAP (1 << 16)
#define FD_CAP 256

static const uint64_t per_token[NBUF] = {14336, 7392, 256};
static const uint64_t max_tokens = 8192;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t pattern(int rank, long step, int buf, int where)
{
    return ((uint64_t)rank << 48) ^ ((uint64_t)step << 8) ^ ((uint64_t)buf << 4) ^ (uint64_t)where;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    long steps = argc > 1 ? atol(argv[1]) : 1000;
    int sim = t_driver_init();
    /* real driver: where NVML cannot tell each rank's own memory, t_held() reads the whole device's, which all
     * ranks share: take the baseline once every rank has its context, and the last reading once all are done */
    MPI_Barrier(MPI_COMM_WORLD);
    if (!sim)
        t_held_rebase();
    if (nranks > MAXR) {
        if (!rank)
            fprintf(stderr, "at most %d ranks\n", MAXR);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    fabpool_t *pool = NULL;
    CHECK_OK(fabpool_create(NULL, &pool));
    if (!pool)
        MPI_Abort(MPI_COMM_WORLD, 1);
    int posix = fabpool_handle_type_of(pool) == FABPOOL_HANDLE_POSIX_FD;

    /* a socket to every peer, for the fds */
    int sock[MAXR];
    for (int i = 0; i < MAXR; i++)
        sock[i] = -1;
    if (posix)
        t_mpi_mesh("fabpool-mpi", rank, nranks, sock);

    fabpool_buffer_t *buf[NBUF];
    uint64_t tokens = 256;
    uint64_t seed = 0x1234567ull + (uint64_t)rank * 7919;
    for (int b = 0; b < NBUF; b++)
        CHECK_OK(fabpool_buffer_create(pool, max_tokens * per_token[b], tokens * per_token[b], &buf[b]));
    fabpool_view_t *view[MAXR][NBUF];
    memset(view, 0, sizeof view);
    uint64_t sent_gen[NBUF] = {0}; /* what every peer has of my buffers */

    static uint8_t mine[DESC_CAP], all[MAXR * DESC_CAP];
    int fds[FD_CAP], rfds[FD_CAP];
    long bad_data = 0, applied = 0, maps = 0;
    for (long step = 0; step < steps; step++) {
        if (rng_next(&seed) % 25 == 0)
            tokens = 64 + rng_next(&seed) % (max_tokens - 64);
        else {
            long t = (long)tokens + (long)(rng_next(&seed) % 401) - 200;
            tokens = (uint64_t)(t < 64 ? 64 : t > (long)max_tokens ? (long)max_tokens : t);
        }
        size_t sizes[NBUF];
        for (int b = 0; b < NBUF; b++)
            sizes[b] = tokens * per_token[b];
        CHECK_OK(fabpool_buffer_resize_set(buf, sizes, NBUF, NULL));

        /* one message per rank: the deltas of its buffers, back to back */
        size_t off = 0, nf = 0;
        uint32_t lens[NBUF];
        for (int b = 0; b < NBUF; b++) {
            size_t len = 0, n = 0;
            CHECK_OK(fabpool_buffer_export(buf[b], sent_gen[b], mine + off + 4 * NBUF, DESC_CAP - off - 4 * NBUF, &len,
                                           fds + nf, FD_CAP - nf, &n));
            lens[b] = (uint32_t)len;
            off += len;
            nf += n;
            fabpool_buffer_info in = {.struct_size = sizeof in};
            fabpool_buffer_get_info(buf[b], &in);
            sent_gen[b] = in.generation;
        }
        memcpy(mine, lens, sizeof lens);
        int mylen = (int)(off + sizeof lens), lens_all[MAXR], displs[MAXR];
        MPI_Allgather(&mylen, 1, MPI_INT, lens_all, 1, MPI_INT, MPI_COMM_WORLD);
        for (int q = 0, d = 0; q < nranks; q++) {
            displs[q] = d;
            d += lens_all[q];
        }
        MPI_Allgatherv(mine, mylen, MPI_BYTE, all, lens_all, displs, MPI_BYTE, MPI_COMM_WORLD);
        if (posix)
            for (int q = 0; q < nranks; q++)
                if (q != rank)
                    CHECK_OK(fabpool_fd_send(sock[q], fds, nf, &step, sizeof step));
        for (int q = 0; q < nranks; q++) {
            if (q == rank)
                continue;
            size_t got = 0, plen = 0;
            long their_step = -1;
            if (posix) {
                CHECK_OK(fabpool_fd_recv(sock[q], rfds, FD_CAP, &got, &their_step, sizeof their_step, &plen));
                CHECK(their_step == step);
            }
            const uint8_t *p = all + displs[q];
            uint32_t ql[NBUF];
            memcpy(ql, p, sizeof ql);
            size_t at = sizeof ql, fi = 0;
            for (int b = 0; b < NBUF; b++) {
                uint32_t nrec;
                memcpy(&nrec, p + at + 12, 4);
                size_t nfd = posix ? nrec : 0;
                fabpool_status st = view[q][b] ? fabpool_view_apply(view[q][b], p + at, ql[b], rfds + fi, nfd)
                                               : fabpool_view_open(pool, p + at, ql[b], rfds + fi, nfd, &view[q][b]);
                if (st != FABPOOL_OK)
                    fprintf(stderr, "rank %d step %ld: view of rank %d buffer %d: %s\n", rank, step, q, b,
                            fabpool_last_error());
                CHECK(st == FABPOOL_OK);
                applied++;
                maps += nrec;
                at += ql[b];
                fi += nfd;
            }
        }
        /* every peer applied this step's deltas: dropped chunks may go */
        MPI_Barrier(MPI_COMM_WORLD);
        for (int b = 0; b < NBUF; b++) {
            CHECK_OK(fabpool_buffer_peers_ack(buf[b], sent_gen[b]));
            CHECK_OK(fabpool_buffer_export_done(buf[b]));
            char *base = fabpool_buffer_ptr(buf[b]);
            uint64_t v0 = pattern(rank, step, b, 0), v1 = pattern(rank, step, b, 1);
            CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)base, &v0, 8));
            CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)base + sizes[b] - 8, &v1, 8));
        }
        /* a copy from pageable memory returns before its DMA lands: other
         * processes see the data only after a synchronize */
        CHECK_CU(cuCtxSynchronize());
        MPI_Barrier(MPI_COMM_WORLD);
        /* every peer's pattern, through the views; sizes follow from the peer's token count */
        uint64_t their_tokens[MAXR];
        MPI_Allgather(&tokens, 1, MPI_UINT64_T, their_tokens, 1, MPI_UINT64_T, MPI_COMM_WORLD);
        for (int q = 0; q < nranks; q++) {
            if (q == rank)
                continue;
            for (int b = 0; b < NBUF; b++) {
                char *vb = fabpool_view_ptr(view[q][b]);
                uint64_t x = 0, y = 0;
                size_t qs = their_tokens[q] * per_token[b];
                if (cuMemcpyDtoH(&x, (CUdeviceptr)(uintptr_t)vb, 8) != CUDA_SUCCESS ||
                    cuMemcpyDtoH(&y, (CUdeviceptr)(uintptr_t)vb + qs - 8, 8) != CUDA_SUCCESS ||
                    x != pattern(q, step, b, 0) || y != pattern(q, step, b, 1)) {
                    if (bad_data++ < 5)
                        fprintf(stderr, "rank %d step %ld: rank %d's buffer %d reads %llx/%llx\n", rank, step, q, b,
                                (unsigned long long)x, (unsigned long long)y);
                }
            }
        }
        MPI_Barrier(MPI_COMM_WORLD); /* nobody resizes while a peer still reads */
    }
    CHECK(bad_data == 0);

    for (int q = 0; q < nranks; q++)
        for (int b = 0; b < NBUF; b++)
            if (view[q][b])
                CHECK_OK(fabpool_view_close(view[q][b]));
    MPI_Barrier(MPI_COMM_WORLD);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(pool, &s);
    for (int b = 0; b < NBUF; b++) {
        CHECK_OK(fabpool_buffer_peers_ack(buf[b], UINT64_MAX));
        CHECK_OK(fabpool_buffer_destroy(buf[b], NULL));
    }
    CHECK_OK(fabpool_destroy(pool));
    for (int q = 0; q < nranks; q++)
        if (sock[q] >= 0)
            close(sock[q]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    CHECK(t_near(t_held(), 0));
    int fails = t_failures, total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!rank)
        printf("test_mpi_share: %d ranks, %ld steps, %s handles, %ld views applied, %ld chunks imported, %ld chunks "
               "mapped by rank 0; %d failed checks over all ranks\n",
               nranks, steps, posix ? "POSIX fd" : "fabric", applied, maps, (long)s.chunks_mapped_total, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
