/*
 * fabpool_status.h - what every fabpool header shares: the export macro, the
 * status codes each function returns and the calling thread's message for
 * its last failed call.  fabpool.h and fabpool_fdpass.h include it.
 */
#ifndef FABPOOL_STATUS_H
#define FABPOOL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FABPOOL_API __attribute__((visibility("default")))
#else
#define FABPOOL_API
#endif

/* ------------------------------------------------------------------ status */

typedef enum fabpool_status {
    FABPOOL_OK = 0,
    FABPOOL_ERR_INVALID_ARG = 1,   /* a NULL, a zero, a size out of range */
    FABPOOL_ERR_OUT_OF_MEMORY = 2, /* the device has no memory left, even after a trim */
    FABPOOL_ERR_HOST_MEMORY = 3,   /* host metadata could not be allocated */
    FABPOOL_ERR_NO_DRIVER = 4,     /* libcuda.so.1 or one of its entry points is missing */
    FABPOOL_ERR_DRIVER = 5,        /* a driver call failed; the message names it and its error */
    FABPOOL_ERR_NOT_SUPPORTED = 6, /* the device or the process lacks a feature (VMM, fabric) */
    FABPOOL_ERR_CONFIG = 7,        /* FABPOOL_CONF or an option is wrong */
    FABPOOL_ERR_NOT_FOUND = 8,     /* a pointer this pool did not give out, or an interior one (or, to
                                      fabpool_record_stream, a block already freed) */
    FABPOOL_ERR_DOUBLE_FREE = 9,   /* a pointer freed twice */
    FABPOOL_ERR_LIMIT = 10,        /* past a buffer's maximum, or out of reserved address space */
    FABPOOL_ERR_BUSY = 11,         /* the object still has users (e.g. live views) */
    FABPOOL_ERR_DESCRIPTOR = 12,   /* a sharing descriptor that is malformed or does not fit */
    FABPOOL_ERR_IO = 13,           /* a socket or file operation failed (fd passing) */
    FABPOOL_ERR_CORRUPT = 14,      /* fabpool_check found a broken invariant of the pool's structures */
    FABPOOL_ERR_ASLEEP = 15,       /* the pool is asleep (fabpool_sleep): call fabpool_wake first */
    FABPOOL_ERR_PERMISSION = 16,   /* a peer that is not who it must be (another user, another process, no
                                      proof of the group's token): refused, its connection closed */
    FABPOOL_ERR_PARTIAL = 17       /* a driver call failed and so did the undo of what the call had done, or
                                      no undo could give back what was done (a discard sleep's dropped
                                      contents): it is not all or nothing this time; the message says what
                                      changed, and the objects say what they are now (e.g. a buffer's size:
                                      what it maps; a pool asleep: fabpool_sleep_state) */
} fabpool_status;

/* The highest status code: every code from FABPOOL_OK to it is one of the
 * above and has a name (fabpool_status_name).  A reader of a code from
 * elsewhere (a peer's answer, a trace file) takes 0..FABPOOL_STATUS_LAST and
 * nothing else; a later fabpool that adds a status raises it. */
#define FABPOOL_STATUS_LAST FABPOOL_ERR_PARTIAL

/* The enumerator's name, e.g. "FABPOOL_ERR_OUT_OF_MEMORY". */
FABPOOL_API const char *fabpool_status_name(fabpool_status s);
/* The calling thread's message for its last failed call ("" if none): the
 * call, what went wrong and what to do.  A call that succeeds leaves it as
 * it was (errno's rule), so it is read after a status other than FABPOOL_OK. */
FABPOOL_API const char *fabpool_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
