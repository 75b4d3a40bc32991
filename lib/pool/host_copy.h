/* host_copy.h - the host copies of sleep with offload (host_copy.c):
 * pinned host memory next to the device, one piece a chunk in a
 * reservation of their own, made through the device layer (vmm.h); kept
 * from a wake for the next offload with sleep_keep_host.  Pool lock held
 * for each. */
#ifndef FP_HOST_COPY_H
#define FP_HOST_COPY_H

#include "pool.h"

/* The record of a sleep: its chunks sorted by address, and the reservation
 * of their host copies. */
struct fp_sleep {
    fp_slept *e;
    size_t n;
    uint64_t stage_va, stage_size;   /* the reservation the host copies are mapped in (0: none) */
    int retry;                       /* a wake failed part way: copies may be queued on another stream */
};

/* Waits for the GPU work on `stream` (NULL: the whole context); why ends the message. */
fabpool_status fp_sleep_sync(struct fabpool *p, void *stream, const char *why);
/* Copies every chunk of r marked `copy` into host memory (the kept copies
 * where they fit, else made anew), on stream, and waits for the copies.  On
 * failure the caller frees what was made (fp_host_release).  Context
 * current. */
fabpool_status fp_host_offload(struct fabpool *p, struct fp_sleep *r, void *stream);
/* Unmaps r's host copies and frees their reservation; idempotent, so that a
 * failure can be retried. */
fabpool_status fp_host_release(struct fabpool *p, struct fp_sleep *r);
/* After a failed offload: r's host copies and their reservation freed (0),
 * or, where the driver refuses an unmap (a host copy, or one it kept mapped
 * when its map failed), what is left handed to the kept host copies, which
 * fabpool_trim, the next offload and destroy free (1): either way r holds
 * none of them and its record can go.  -1: no host memory to list them, r
 * keeps them.  No message of its own. */
int fp_host_give_up(struct fabpool *p, struct fp_sleep *r);
/* Wake with sleep_keep_host: r's host copies become the kept ones. */
fabpool_status fp_host_keep(struct fabpool *p, struct fp_sleep *r);
/* Frees the kept host copies (what the driver refuses to unmap stays, and
 * the status says so). */
fabpool_status fp_host_cache_release(struct fabpool *p);

#endif
