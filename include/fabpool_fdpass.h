/*
 * fabpool_fdpass.h - passing file descriptors between processes of one host:
 * the POSIX fds of an exported buffer's chunks (fabpool_buffer_export) travel
 * beside the descriptor's bytes.  fabpool.h includes this header; it needs
 * nothing of a pool, only the status codes (fabpool_status.h).
 *
 * Every function returns a fabpool_status; on anything but FABPOOL_OK,
 * fabpool_last_error() says what went wrong.
 */
#ifndef FABPOOL_FDPASS_H
#define FABPOOL_FDPASS_H

#include <stddef.h>

#include "fabpool_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fd passing between processes of one host, over Unix stream sockets
 * (SCM_RIGHTS), with an optional payload of bytes. */
FABPOOL_API fabpool_status fabpool_fd_listen(const char *name, int *listener);   /* abstract socket name */
FABPOOL_API fabpool_status fabpool_fd_accept(int listener, int *sock);
FABPOOL_API fabpool_status fabpool_fd_connect(const char *name, int *sock, int timeout_ms);
FABPOOL_API fabpool_status fabpool_fd_send(int sock, const int *fds, size_t n, const void *data, size_t len);
/* Receives one message sent by fabpool_fd_send: *n fds, *len bytes. */
FABPOOL_API fabpool_status fabpool_fd_recv(int sock, int *fds, size_t cap, size_t *n, void *data, size_t data_cap,
                                          size_t *len);
/* A copy of process pid's descriptor fd, by pidfd_getfd (Linux 5.6+, needs
 * ptrace permission over pid): an alternative to a socket.  Where it is
 * refused, the message names the case (the errno, Yama's ptrace_scope) and
 * what to change. */
FABPOOL_API fabpool_status fabpool_fd_from_pid(int pid, int fd, int *out);
/* Lets every process of this user copy this process's fds with
 * fabpool_fd_from_pid where Yama's ptrace_scope 1 would stop them (ranks are
 * siblings, not ancestors): prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY), which
 * lets them ptrace this process as ptrace_scope 0 would.  Does nothing where
 * Yama is absent or at 0.  FABPOOL_ERR_NOT_SUPPORTED under ptrace_scope 2 or 3,
 * where no consent helps (the message says what does). */
FABPOOL_API fabpool_status fabpool_fd_allow_peers(void);

#ifdef __cplusplus
}
#endif
#endif
