/*
 * symm.h - symmetric memory over a group of processes: each rank owns a
 * growable buffer (fabpool_buffer), and every rank maps every other rank's
 * buffer (fabpool_view).  The buffers grow and shrink in place, together:
 * every base address, this rank's and its views of the peers', stays where
 * it is for the object's life, so kernels and CUDA graphs that hold them
 * stay valid, and after the first exchange only deltas move (the chunks
 * mapped since the generation every peer holds).
 *
 * Part of libfabpool_torch.so (exported as fabpool_torch_symm_*), on
 * fabpool's public API alone; adapters/torch/python/fabpool_symm.py is its
 * Python face (by ctypes: SymmetricMemory without torch, SymmetricBuffer
 * over a torch.distributed group).
 *
 * Every call but the getters is collective: every rank of the group makes
 * it, in the same order.  The group moves bytes through the caller's
 * all-gather (the allgather callback: MPI_Allgather, torch.distributed's
 * all_gather, anything); POSIX fds go beside the bytes over a Unix socket
 * between every two ranks of a host (abstract names, made unique per rank;
 * connected at create) or by pidfd_getfd; fabric handles travel in the
 * descriptor's bytes.  Every rank takes part in every round of a call even
 * when its own step failed, and says so in its message: every rank then
 * returns the same status and a message that names the rank and what went
 * wrong there, and no rank is left waiting.
 *
 * Sizes: the ranks agree on the largest size asked (a rank may ask 0: "what
 * the others want"), so every buffer has the same size.  max_bytes must be
 * the same on every rank (the call fails with a message that lists each
 * rank's otherwise).
 *
 * Work on the GPU: a shrink unmaps chunks here (after the context's work,
 * as fabpool_buffer_resize with stream NULL) and in the peers' views at
 * once; the caller makes sure that no kernel of any rank still touches the
 * bytes past the new size (the Python SymmetricBuffer synchronizes the
 * device before every resize).
 *
 * One object is used by one thread at a time (a lock serializes the calls).
 */
#ifndef FABPOOL_TORCH_SYMM_H
#define FABPOOL_TORCH_SYMM_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fabpool_torch_symm fabpool_torch_symm_t;

/* The group's all-gather: every rank gives `bytes` bytes (the same count
 * on every rank), and recv gets nranks * bytes, rank r's at r * bytes.
 * Returns 0 on success; anything else fails the call on this rank (and
 * the object: an exchange that some ranks completed and others did not
 * cannot be resumed, so every later call but close is refused). */
typedef int (*fabpool_torch_symm_allgather_fn)(void *ctx, const void *send, void *recv, size_t bytes);

enum {
    FABPOOL_TORCH_SYMM_FD_SOCKET = 0, /* SCM_RIGHTS over a Unix socket between every two ranks of a host */
    FABPOOL_TORCH_SYMM_FD_PIDFD = 1   /* pidfd_getfd out of the exporter (Linux 5.6+, ptrace permission; under
                                         Yama ptrace_scope 1 the copies go in turns, each exporter consenting
                                         to one peer of the group at a time: see below) */
};

/* Who may be on the other side (docs/security.md).  The all-gather is the
 * group's trusted channel; nothing else is trusted.  Rank 0 makes a random
 * group secret and sends it only through the all-gather (create's first
 * round); every rank declares its pid there.  Socket transport: a rank
 * accepts a connection only from a process of its own user whose pid a
 * lower rank of its host declared, refuses anyone else at once (closed,
 * never waited on), and takes the connection only once it has said the
 * group's secret and its rank; a connecting rank sends nothing until the
 * listener is the pid the peer declared, of its user.  Pidfd transport:
 * each rank holds a sealed memfd with a proof derived from the secret and
 * its rank, and its peers check it through a pidfd of the declared pid
 * before they copy any fd.  `peers` loosens this, like FABPOOL_PEERS (which
 * adds to it), for jobs whose ranks run as other users or in other pid
 * namespaces; it is not the default:
 *   FABPOOL_FD_ANY_USER  the peer's uid is not compared;
 *   FABPOOL_FD_ANY_PID   the peer's pid is not compared (the secret still
 *                        authenticates a connecting rank, but a connecting
 *                        rank then tells the secret to whoever listens at
 *                        the peer's name).
 * Each call waits at most timeout_ms for all its connections and idents
 * (create), and at most timeout_ms for all the fds of an exchange. */

typedef struct fabpool_torch_symm_options {
    uint32_t struct_size;         /* set by fabpool_torch_symm_options_init */
    int rank, nranks;             /* this process's place in the group */
    int device;                   /* CUDA device ordinal of this rank's buffer and views */
    uint64_t max_bytes;           /* every buffer's address window; the same on every rank */
    uint64_t bytes;               /* the size asked now; the buffers get the largest asked (0: the others') */
    const char *conf;             /* the pool's options in FABPOOL_CONF syntax (NULL: the defaults; handle_type:auto
                                     picks fabric where it works, else POSIX fds); FABPOOL_CONF applies after */
    int fd_transport;             /* FABPOOL_TORCH_SYMM_FD_* (POSIX fds only) */
    int timeout_ms;               /* connecting to and hearing from peers over the sockets (0: 30 s) */
    const char *host;             /* the name ranks compare to find who shares a host (NULL: gethostname) */
    unsigned peers;               /* FABPOOL_FD_ANY_USER | FABPOOL_FD_ANY_PID (fabpool_fdpass.h), added to
                                     FABPOOL_PEERS's; 0 (the default): same user, the declared pids only */
    fabpool_torch_symm_allgather_fn allgather;
    void *allgather_ctx;
} fabpool_torch_symm_options;

/* Fills *o with the defaults: device 0, socket transport, 30 s, peers 0, the rest 0 / NULL. */
FABPOOL_API void fabpool_torch_symm_options_init(fabpool_torch_symm_options *o);

/* Collective.  Makes this rank's pool and buffer, checks that the ranks
 * agree (group size and order, max_bytes, handle type, one host for POSIX
 * fds, the fd transport, the address windows), connects the sockets, and
 * maps every peer's buffer here.  On failure nothing is left on any rank
 * and every rank returns the same status: FABPOOL_ERR_CONFIG where the
 * ranks disagree, FABPOOL_ERR_IO where a peer cannot be reached, else the
 * failing rank's; FABPOOL_ERR_PERMISSION where a process that is not the
 * rank it must be stood in (the message names the pid and uid). */
FABPOOL_API fabpool_status fabpool_torch_symm_create(const fabpool_torch_symm_options *o, fabpool_torch_symm_t **out);

/* Collective.  Every rank asks for `bytes` (0: the others'); every buffer
 * becomes the largest size asked, in place, and every view follows by a
 * delta.  Past max_bytes: FABPOOL_ERR_LIMIT on every rank, nothing changed.
 *
 * After any resize, failed or not, no rank's view maps memory that its
 * peer's buffer does not have: within the bytes fabpool_torch_symm_sizes
 * gives for it, a view reads and writes the peer's buffer as it is now.
 *   - A rank that cannot resize or export: every rank keeps its old size.
 *     The ranks whose resize went through go back, which may leave new
 *     memory where they had refit a chunk (a shrink replaces a chunk it
 *     only partly needs by a smaller one; going back grows new chunks behind
 *     it), so one more exchange maps every view to its peer's chunks as they
 *     are now.  The bytes past the size asked may then be lost on those
 *     ranks (a shrink gives them up).
 *   - A rank that cannot map a peer's new chunks (an import or a map that
 *     failed, or a copy by pidfd, in either exchange): the
 *     buffers have the size of the call, and that rank's view of the peer
 *     keeps what is still the peer's memory: after a grow it stays as it
 *     was, shorter; where the peer's memory changed under it (a refit) it
 *     is emptied: its size is 0 and it maps nothing, at the same address.
 *     The next resize (even to the same size) brings it up to date (it
 *     sends that view a full descriptor).
 *   - Where a rank cannot keep the rule (going back or emptying a view
 *     failed too: a second fault), every rank fails the call and the
 *     object, as after a broken exchange: only close is left.
 *   - Where fds could not pass between two ranks over their socket within
 *     timeout_ms (a peer late, that sent part of them, that did not read
 *     what it was sent, or that hung up), their socket is lost, and the
 *     sockets are connected only at create: every rank fails the call and
 *     the object.  Every later resize says so (FABPOOL_ERR_IO): only close
 *     is left, and the group creates the buffer again.
 * Every rank returns the same status. */
FABPOOL_API fabpool_status fabpool_torch_symm_resize(fabpool_torch_symm_t *s, uint64_t bytes);

/* Every rank's base address in this process: ptrs[rank] this rank's
 * buffer, ptrs[q] the view of rank q's.  n >= nranks.  They never change. */
FABPOOL_API fabpool_status fabpool_torch_symm_ptrs(fabpool_torch_symm_t *s, uint64_t *ptrs, size_t n);
/* The bytes of every rank's buffer mapped here (this rank's: the agreed
 * size; a peer's: what its view covers, at least the agreed size unless the
 * view could not follow its peer: then less, or 0 where it was emptied). */
FABPOOL_API fabpool_status fabpool_torch_symm_sizes(fabpool_torch_symm_t *s, uint64_t *sizes, size_t n);

typedef struct fabpool_torch_symm_info {
    uint32_t struct_size;         /* set by the caller: sizeof(fabpool_torch_symm_info) */
    int rank, nranks, device;
    int handle_type;              /* fabpool_handle_type of every rank's pool */
    int fd_transport;
    uint64_t size;                /* the agreed size */
    uint64_t max_bytes;           /* the address window (max_bytes rounded up to the granularity) */
    uint64_t mapped;              /* bytes this rank's buffer maps (>= size: hysteresis) */
    uint64_t generation;          /* this rank's buffer's generation */
    uint64_t acked;               /* the generation of it that every peer has applied */
    uint64_t exchanges;           /* collective calls that completed (create and each resize) */
    uint64_t records_exported;    /* chunks named in this rank's descriptors, all time */
    uint64_t records_imported;    /* chunks of peers mapped here from descriptors, all time */
    uint64_t last_exported;       /* the same, the last call */
    uint64_t last_imported;
    uint64_t desc_bytes;          /* descriptor bytes this rank gave the all-gather, all time */
    uint64_t fds_sent;            /* fds sent to peers (socket transport), all time */
    uint64_t view_bytes;          /* peers' bytes mapped here now */
    uint64_t last_ns;             /* the last collective call's time, nanoseconds */
} fabpool_torch_symm_info;
/* out->struct_size must be sizeof(fabpool_torch_symm_info) (FABPOOL_ERR_INVALID_ARG otherwise, *out untouched). */
FABPOOL_API fabpool_status fabpool_torch_symm_get_info(fabpool_torch_symm_t *s, fabpool_torch_symm_info *out);

/* A dma-buf fd of bytes [offset, offset + size) of this rank's buffer
 * (fabpool_buffer_dmabuf: page-aligned, inside the mapped bytes; the caller
 * closes it, and takes a new one after a resize).  Not collective. */
FABPOOL_API fabpool_status fabpool_torch_symm_dmabuf(fabpool_torch_symm_t *s, uint64_t offset, uint64_t size, int *fd);

/* Not collective: unmaps the views, destroys this rank's buffer and pool,
 * closes the sockets, frees s (NULL is ignored).  Peers that still map
 * this rank's buffer keep its memory alive until they close too.  The
 * caller makes sure that no GPU work still uses the memory. */
FABPOOL_API fabpool_status fabpool_torch_symm_close(fabpool_torch_symm_t *s);

/* The calling thread's message for its last failed symm call ("" if none). */
FABPOOL_API const char *fabpool_torch_symm_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
