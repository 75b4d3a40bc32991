/* mpi_mesh.h - a Unix socket between every two ranks of an MPI job on one
 * host, for passing POSIX fds beside the descriptors that MPI moves (fds
 * cannot travel through MPI).  Rank r listens on "<tag>-<job>-<r>"; every
 * lower rank connects to it and says who it is.  Include after testutil.h
 * and mpi.h. */
#ifndef FP_MPI_MESH_H
#define FP_MPI_MESH_H

#include <unistd.h>

/* sock[q] gets the socket to rank q (-1 for this rank itself). */
static void t_mpi_mesh(const char *tag, int rank, int nranks, int *sock)
{
    int job = rank ? 0 : (int)getpid();
    MPI_Bcast(&job, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++)
        sock[q] = -1;
    char name[96];
    snprintf(name, sizeof name, "%s-%d-%d", tag, job, rank);
    int ls = -1;
    CHECK_OK(fabpool_fd_listen(name, &ls));
    MPI_Barrier(MPI_COMM_WORLD); /* every rank listens before any connects */
    for (int q = rank + 1; q < nranks; q++) {
        snprintf(name, sizeof name, "%s-%d-%d", tag, job, q);
        CHECK_OK(fabpool_fd_connect(name, &sock[q], 10000));
        CHECK_OK(fabpool_fd_send(sock[q], NULL, 0, &rank, sizeof rank));
    }
    for (int k = 0; k < rank; k++) {
        int s = -1, who = -1;
        size_t n, len;
        CHECK_OK(fabpool_fd_accept(ls, &s));
        CHECK_OK(fabpool_fd_recv(s, NULL, 0, &n, &who, sizeof who, &len));
        if (who >= 0 && who < nranks)
            sock[who] = s;
        else
            close(s);
    }
    if (ls >= 0)
        close(ls);
}

#endif
