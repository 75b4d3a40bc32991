/* stage_uffd.h - fresh host pages filled without being zeroed first, for the
 * staging ring's copies to the host (stage_copy.c; FABPOOL_STAGE_UFFD=1).
 *
 * A copy into fresh anonymous memory writes each byte twice: the kernel
 * zeroes a page at its first touch, then the memcpy writes it.  A
 * userfaultfd over the pages lets UFFDIO_COPY install each missing page
 * straight from the staging buffer instead.  While a range is registered
 * here, a plain touch of a missing page of it from user mode would wait for
 * a handler that never comes: every write to it goes through
 * stage_uffd_put, and stage_uffd_close gives the pages back to ordinary
 * faults (waking any thread that touched one meanwhile). */
#ifndef FABPOOL_TORCH_STAGE_UFFD_H
#define FABPOOL_TORCH_STAGE_UFFD_H

#include <stddef.h>
#include <stdint.h>

typedef struct stage_uffd {
    int fd;                 /* -1: not in use (copies are plain memcpy) */
    size_t n;               /* registered page ranges */
    uint64_t (*ranges)[2];  /* [start, end) of each, page aligned */
} stage_uffd;

/* Registers the pages of the n ranges [at[i][0], at[i][0] + at[i][1]) (host
 * address, bytes) of anonymous private memory; 0, or -errno (nothing kept
 * registered: the caller copies as without it). */
int stage_uffd_open(stage_uffd *u, const uint64_t (*at)[2], size_t n);

/* Writes len bytes of src to dst, inside the registered ranges: missing
 * pages installed by UFFDIO_COPY, present ones written by memcpy.  0, or
 * -errno of a refused UFFDIO_COPY (the bytes not all written). */
int stage_uffd_put(const stage_uffd *u, char *dst, const char *src, uint64_t len);

/* Unregisters every range and closes the descriptor (no-op when fd < 0). */
void stage_uffd_close(stage_uffd *u);

/* Bytes installed by UFFDIO_COPY in this process. */
uint64_t stage_uffd_bytes(void);

#endif
