/*
 * fabpool_fdpass.h - passing file descriptors between processes of one host:
 * the POSIX fds of an exported buffer's chunks (fabpool_buffer_export) travel
 * beside the descriptor's bytes.  fabpool.h includes this header; it needs
 * nothing of a pool, only the status codes (fabpool_status.h).
 *
 * Every function returns a fabpool_status; on anything but FABPOOL_OK,
 * fabpool_last_error() says what went wrong.
 *
 * Who is on the other side (docs/security.md).  Abstract socket names are
 * listed to every user in /proc/net/unix: a name is never a secret, and any
 * process may connect to a listener or bind a name its owner let go.  So
 * every socket end checks the credentials of its peer (SO_PEERCRED): by
 * default only a process of this process's effective user is accepted, and
 * where the caller names the pid it expects (from a channel it trusts: an
 * all-gather, a tensor handle), only that process.  A refused peer is closed
 * at once, never waited on, and the call answers FABPOOL_ERR_PERMISSION.
 * FABPOOL_PEERS (environment, read once) loosens the default for jobs that
 * span users or pid namespaces: a comma-separated list of
 *   any_user  accept processes of any user (the uid is not compared)
 *   any_pid   do not compare pids (peers in other pid namespaces, where
 *             SO_PEERCRED reads 0 or a pid of this namespace)
 * ("" or "same_user": the default).  The flags of the *_peer functions
 * add to it.
 */
#ifndef FABPOOL_FDPASS_H
#define FABPOOL_FDPASS_H

#include <stddef.h>

#include "fabpool_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flags of the *_peer functions (and the words of FABPOOL_PEERS). */
#define FABPOOL_FD_ANY_USER 0x1u /* any user's process may be the peer */
#define FABPOOL_FD_ANY_PID 0x2u  /* the expected pid is not compared */

/* The bytes of a message without fds in the stream are its payload and a head of this many bytes before it
 * (a u32 fd count and a u32 length): a receiver that sees (FIONREAD) that many more than the payload it
 * expects can read the message without waiting. */
#define FABPOOL_FD_HEAD_BYTES 8u

/* The flags that FABPOOL_PEERS sets (0 where unset), read once in the
 * process's life, at the first call of this or of an accept or connect (a
 * later setenv changes nothing).  Its words are matched in any case and
 * separated by single commas, as FABPOOL_CONF's (blanks around a word are
 * ignored); FABPOOL_ERR_CONFIG for a word it does not know (the message names
 * it and the words it takes), an empty entry (a leading, trailing or doubled
 * comma), same_user beside any_user, or a value over 256 characters, and then
 * *flags is 0 and every accept and connect answers the same FABPOOL_ERR_CONFIG
 * rather than run loosened or not as asked. */
FABPOOL_API fabpool_status fabpool_fd_peers_env(unsigned *flags);

/* fd passing between processes of one host, over Unix stream sockets
 * (SCM_RIGHTS), with an optional payload of bytes. */
FABPOOL_API fabpool_status fabpool_fd_listen(const char *name, int *listener);   /* abstract socket name */
/* One connection from a process of this user (FABPOOL_PEERS may widen it);
 * anyone else's is closed at once, before a byte is read or sent:
 * FABPOOL_ERR_PERMISSION, with the peer's pid and uid and what was expected in
 * the message (and a line in the FABPOOL_DEBUG log at warn), and the caller
 * may accept again.  Blocks as accept(2) does on the listener.  *sock is
 * set only on FABPOOL_OK.  FABPOOL_ERR_IO where accept(2) failed, with errno
 * left as accept(2) set it (EAGAIN: a non-blocking listener's queue is empty;
 * EMFILE or ENFILE: no fd for the connection, which stays queued). */
FABPOOL_API fabpool_status fabpool_fd_accept(int listener, int *sock);
/* The same, and only from process pid (0: any process); *peer_pid (may be
 * NULL) gets the peer's pid as SO_PEERCRED reads it, also when refused.
 * flags: FABPOOL_FD_ANY_USER, FABPOOL_FD_ANY_PID (another bit:
 * FABPOOL_ERR_INVALID_ARG). */
FABPOOL_API fabpool_status fabpool_fd_accept_peer(int listener, int *sock, int pid, unsigned flags, int *peer_pid);
/* Connects to the listener of that name, retrying until timeout_ms while
 * none listens, and waiting while its queue of connections is full, in turn
 * with the other connections that wait (so a flood of them that keeps the
 * queue full lets the caller in as the listener accepts); a listener that
 * accepts no one cannot hold the caller past timeout_ms.  A listener of
 * another user is refused at once, not retried (FABPOOL_ERR_PERMISSION:
 * someone else holds the name), the socket closed before a byte goes out.
 * At the timeout, FABPOOL_ERR_IO with errno as connect(2) last set it
 * (EAGAIN: the queue stayed full, the listener there but busy; ECONNREFUSED
 * or ENOENT: none listened).  The socket given is blocking. */
FABPOOL_API fabpool_status fabpool_fd_connect(const char *name, int *sock, int timeout_ms);
/* The same, and the listener must be process pid (0: any process). */
FABPOOL_API fabpool_status fabpool_fd_connect_peer(const char *name, int *sock, int timeout_ms, int pid,
                                                  unsigned flags);
/* The credentials of the process at the other end of a connected Unix
 * socket (SO_PEERCRED: as of its connect, or of its listen for a listener);
 * pid or uid may be NULL. */
FABPOOL_API fabpool_status fabpool_fd_peer(int sock, int *pid, unsigned *uid);
/* Sends n fds and len bytes as one message (at most 2^20 fds and 2^30
 * bytes: FABPOOL_ERR_INVALID_ARG past them). */
FABPOOL_API fabpool_status fabpool_fd_send(int sock, const int *fds, size_t n, const void *data, size_t len);
/* Receives one message sent by fabpool_fd_send: *n fds, *len bytes.  Blocks
 * until the whole message is in.  On any failure every fd that arrived is
 * closed and *n is 0:
 *   FABPOOL_ERR_LIMIT       more fds than cap, or a payload longer than
 *                           data_cap (*len still says how long): the message
 *                           was read to its end, the socket may carry on;
 *   FABPOOL_ERR_IO          the peer closed the socket (mid-message or
 *                           before it), fds the kernel dropped (MSG_CTRUNC:
 *                           this process is out of fds), a socket error, the
 *                           deadline of fabpool_fd_recv_timed;
 *   FABPOOL_ERR_DESCRIPTOR  a head that announces more than 2^20 fds or 2^30
 *                           bytes, more fds than it announced, a malformed
 *                           control message: no sender of this protocol.
 * After FABPOOL_ERR_IO or FABPOOL_ERR_DESCRIPTOR the socket is out of step
 * (a message part read): close it.  *len is 0 but after OK and LIMIT.
 * n and len are required: a NULL one is refused (FABPOOL_ERR_INVALID_ARG)
 * before anything is read, the message left whole on the socket.  fds may
 * be NULL (room for no fd) and data too (room for no byte). */
FABPOOL_API fabpool_status fabpool_fd_recv(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap,
                                          size_t *len);
/* The same within timeout_ms for the whole message, however the peer
 * trickles it (one deadline on CLOCK_MONOTONIC; below 0: no limit); past it
 * FABPOOL_ERR_IO, nothing kept, the socket out of step. */
FABPOOL_API fabpool_status fabpool_fd_recv_timed(int sock, int *fds, size_t cap, size_t *n, void *data,
                                                size_t data_cap, size_t *len, int timeout_ms);
/* A copy of process pid's descriptor fd, by pidfd_getfd (Linux 5.6+, needs
 * ptrace permission over pid): an alternative to a socket.  Where it is
 * refused, the message names the case (the errno, Yama's ptrace_scope) and
 * what to change.  The pid must come from a channel the caller trusts; a
 * pidfd (below) pins the process so that a reused pid cannot stand in. */
FABPOOL_API fabpool_status fabpool_fd_from_pid(int pid, int fd, int *out);
/* A pidfd of process pid (pidfd_open; close-on-exec), and a copy of its fd
 * through it: a pidfd names the process it was opened for, also once a new
 * process takes its pid (the copy then answers FABPOOL_ERR_IO, "is gone").
 * Refusals as fabpool_fd_from_pid's (FABPOOL_ERR_IO, also where the kernel
 * has no pidfd_open: the message says so); an fd that is no pidfd:
 * FABPOOL_ERR_INVALID_ARG. */
FABPOOL_API fabpool_status fabpool_fd_pidfd_open(int pid, int *pidfd);
FABPOOL_API fabpool_status fabpool_fd_from_pidfd(int pidfd, int fd, int *out);
/* A process's proof that it knows a token, for peers that copy its fds by
 * pidfd: a memfd holding the token's bytes (1 to 64 of them), sealed
 * (F_SEAL_SHRINK, GROW, WRITE and SEAL: nobody changes it).  A peer given the
 * token through a trusted channel checks with fabpool_fd_token_check that
 * the process it copies from holds it at fd: a copy of that fd (pidfd_getfd,
 * closed again) must be a memfd with exactly those seals (and F_SEAL_EXEC,
 * which the kernel adds where vm.memfd_noexec asks), the token's size and
 * its bytes (compared in constant time).  A pid named by a hostile or buggy
 * peer that is not the group's process, with no fd there, another file or
 * other bytes, is refused: FABPOOL_ERR_PERMISSION ("process N does not hold
 * this group's token at fd F").  No ptrace permission over the process:
 * FABPOOL_ERR_IO as fabpool_fd_from_pidfd; a pidfd that is none:
 * FABPOOL_ERR_INVALID_ARG.  The caller closes *fd when no
 * peer needs it any more. */
FABPOOL_API fabpool_status fabpool_fd_token_make(const void *token, size_t len, int *fd);
FABPOOL_API fabpool_status fabpool_fd_token_check(int pidfd, int fd, const void *token, size_t len);
/* Under Yama ptrace_scope 1, lets process pid copy this process's fds with
 * pidfd_getfd (prctl PR_SET_PTRACER: that process and its descendants, one
 * pid at a time: a later call replaces it); pid 0 withdraws the consent.
 * Does nothing where Yama is absent or at 0; FABPOOL_ERR_NOT_SUPPORTED under
 * ptrace_scope 2 or 3, where no consent helps (the message says what does). */
FABPOOL_API fabpool_status fabpool_fd_allow_peer(int pid);
/* Lets every process of this user copy this process's fds under ptrace_scope
 * 1, for the life of the process (PR_SET_PTRACER_ANY), as ptrace_scope 0
 * would: wider than fabpool_fd_allow_peer; docs/security.md says when it is
 * needed.  Otherwise as fabpool_fd_allow_peer. */
FABPOOL_API fabpool_status fabpool_fd_allow_peers(void);

#ifdef __cplusplus
}
#endif
#endif
