/* handles.h - the process's handle area: the structs that the API hands out
 * as handles (fabpool_buffer_t, fabpool_view_t) live here, one to a slot of
 * fixed size, so that a handle the caller keeps after its destroy or close
 * (a second destroy, a call on a closed view, a handle of a destroyed pool)
 * is refused, not read as freed memory or as another object.
 *
 * The slots are never given back to the system (a stale handle can always be
 * read), and each has a state word: an entry point asks fp_handle_live()
 * before it reads the struct.  A slot freed goes to the back of a queue and
 * is handed out again only once FP_HANDLE_QUARANTINE slots freed after it
 * have gone before it, so a stale handle names no new object for a long time.
 * Block alloc and free never come here: only buffers and views.
 *
 * Locking: the area's lock (lock.h, level handles) is a leaf, taken with a
 * pool lock held or none; fp_handle_live() takes none (a stale handle read
 * while another thread destroys the object is the caller's race). */
#ifndef FP_HANDLES_H
#define FP_HANDLES_H

#include <stddef.h>

#include "fabpool.h"
#include "meta.h"

/* Bytes a slot holds for its struct. */
#define FP_HANDLE_BYTES 240
/* Slots freed after a slot before it is handed out again. */
#define FP_HANDLE_QUARANTINE 1024

typedef enum fp_handle_kind {
    FP_HANDLE_BUFFER = 1,
    FP_HANDLE_VIEW = 2,
} fp_handle_kind;

/* A zeroed slot of FP_HANDLE_BYTES bytes for an object of `kind`, live (its
 * handle accepted) and counted in m's metadata bytes; NULL without host memory. */
void *fp_handle_alloc(fp_handle_kind kind, fp_meta *m);
/* The handle is refused from now on; the object stays where it is for its
 * owner, until fp_handle_free. */
void fp_handle_kill(void *h);
/* Frees h's slot (refused from now on): to the back of the quarantine. */
void fp_handle_free(void *h, fp_meta *m);
/* A new slot, live, with a copy of the first `size` bytes of h's object;
 * h's slot is freed.  NULL without host memory (h as it was).  For an
 * object handed out again (a kept buffer or view reused): its earlier
 * handle stays refused.  The caller moves what points at h. */
void *fp_handle_renew(void *h, fp_handle_kind kind, size_t size);
/* 1 if h is a live handle of `kind` (the area's slot, its state live),
 * else 0; reads nothing outside the area. */
int fp_handle_live(const void *h, fp_handle_kind kind);
/* FABPOOL_OK if h is a live handle of `kind`, else FABPOOL_ERR_INVALID_ARG
 * with a message that names fn and which ("the buffer", "buffer 2") and
 * says what ends a handle of that kind; nothing of h is read but its slot's
 * state. */
fabpool_status fp_handle_check(const void *h, fp_handle_kind kind, const char *fn, const char *which);

#endif
