/* share_fd: one buffer seen by two processes, following it as it grows.
 *
 * The exporter's pool makes memory that can be shared as POSIX file
 * descriptors (handle_type posix_fd; fabric handles work the same way, with
 * no fds, across an NVLink fabric).  It writes a descriptor of its buffer:
 * plain bytes, which a real program moves through its own bootstrap
 * (MPI_Allgather, torch.distributed.all_gather), with the fds beside them over
 * a Unix socket.  The peer maps the buffer from it into its own address space
 * (a view).  When the buffer grows, the exporter sends a delta that names
 * only the new chunks, and the peer's view follows at the same address.  The
 * peer says which generation it applied, so the exporter knows when chunks
 * a shrink dropped may really go.
 *
 * Here the two processes are a parent and the child it forks, talking over a
 * socketpair.  The fork comes first: a process must not fork once it has
 * used the CUDA driver.  (Processes that do not share a parent use
 * fabpool_fd_listen / fabpool_fd_accept / fabpool_fd_connect, abstract Unix
 * socket names, instead of the socketpair.  Anyone may connect to such a
 * name, so both ends check the other's credentials: a process of this user
 * by default, and with fabpool_fd_accept_peer / fabpool_fd_connect_peer only
 * the pid the bootstrap named.)
 *
 *   cc share_fd.c -lfabpool -o share_fd && ./share_fd
 *   (no GPU: FABPOOL_CUDA_LIBRARY=build/sim/libcuda.so.1 ./share_fd)
 */
#include <fabpool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "try.h" /* TRY(call): print fabpool's message and return 1 on failure; MiB */

/* A pool whose memory other processes of this host can map. */
static fabpool_status make_pool(fabpool_t **pool)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = FABPOOL_HANDLE_POSIX_FD;
    return fabpool_create(&o, pool);
}

/* Sends the descriptor of what changed in buf since generation `since` (0: all of it), with its fds. */
static int send_export(int sock, fabpool_buffer_t *buf, uint64_t since)
{
    static unsigned char desc[64 << 10];
    int fds[64];
    size_t len, nfds;
    TRY(fabpool_buffer_export(buf, since, desc, sizeof desc, &len, fds, 64, &nfds));
    TRY(fabpool_fd_send(sock, fds, nfds, desc, len)); /* the socket copies the fds into the peer */
    TRY(fabpool_buffer_export_done(buf));             /* so the pool may close its own copies */
    printf("exporter: sent %zu descriptor bytes and %zu fds (changes since generation %llu)\n", len, nfds,
           (unsigned long long)since);
    return 0;
}

/* The peer: opens a view of the exporter's buffer, then applies one delta, replying each time with the
 * generation it holds and the bytes it sees mapped. */
static int peer(int sock)
{
    fabpool_t *pool;
    TRY(make_pool(&pool));
    static unsigned char desc[64 << 10];
    int fds[64];
    size_t len, nfds;
    fabpool_view_t *view = NULL;
    for (int round = 0; round < 2; round++) {
        TRY(fabpool_fd_recv(sock, fds, 64, &nfds, desc, sizeof desc, &len));
        if (!view)
            TRY(fabpool_view_open(pool, desc, len, fds, nfds, &view)); /* takes the fds and closes them */
        else
            TRY(fabpool_view_apply(view, desc, len, fds, nfds)); /* maps only the new chunks */
        fabpool_buffer_info in = {.struct_size = sizeof in};
        TRY(fabpool_view_get_info(view, &in));
        printf("peer:     view at %p, %llu MiB mapped, generation %llu\n", fabpool_view_ptr(view),
               (unsigned long long)(in.mapped / MiB), (unsigned long long)in.generation);
        uint64_t reply[2] = {in.generation, in.mapped};
        TRY(fabpool_fd_send(sock, NULL, 0, reply, sizeof reply));
    }
    TRY(fabpool_view_close(view));
    TRY(fabpool_destroy(pool));
    return 0;
}

/* The exporter: a buffer, its full descriptor, a growth, its delta. */
static int exporter(int sock)
{
    fabpool_t *pool;
    TRY(make_pool(&pool));
    fabpool_buffer_t *buf;
    TRY(fabpool_buffer_create(pool, 1024 * MiB, 64 * MiB, &buf));

    uint64_t reply[2];
    size_t n, len;
    fabpool_buffer_info in = {.struct_size = sizeof in};
    if (send_export(sock, buf, 0))
        return 1;
    TRY(fabpool_fd_recv(sock, NULL, 0, &n, reply, sizeof reply, &len));
    uint64_t peer_gen = reply[0];

    TRY(fabpool_buffer_resize(buf, 512 * MiB, NULL)); /* grow in place */
    if (send_export(sock, buf, peer_gen))
        return 1;
    TRY(fabpool_fd_recv(sock, NULL, 0, &n, reply, sizeof reply, &len));
    TRY(fabpool_buffer_get_info(buf, &in));
    /* Every peer holds this generation now: chunks dropped by shrinks up to it may go. */
    TRY(fabpool_buffer_peers_ack(buf, reply[0]));
    printf("exporter: buffer %llu MiB mapped, generation %llu; the peer holds generation %llu, %llu MiB\n",
           (unsigned long long)(in.mapped / MiB), (unsigned long long)in.generation, (unsigned long long)reply[0],
           (unsigned long long)(reply[1] / MiB));
    int same = reply[0] == in.generation && reply[1] == in.mapped;
    TRY(fabpool_buffer_destroy(buf, NULL));
    TRY(fabpool_destroy(pool));
    if (!same) {
        fprintf(stderr, "unexpected: the peer's view does not match the buffer\n");
        return 1;
    }
    return 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the two processes' lines in the order they happen */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork(); /* before any CUDA call */
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        int prc = peer(sv[1]);
        fflush(stdout); /* _exit does not flush */
        _exit(prc);
    }
    close(sv[1]);
    int rc = exporter(sv[0]);
    close(sv[0]);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the peer process failed\n");
        rc = 1;
    }
    return rc;
}
