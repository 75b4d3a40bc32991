/* error.h - status codes and the thread-local error message. */
#ifndef FP_ERROR_H
#define FP_ERROR_H

#include <stdint.h>

#include "fabpool.h"

/* The longest message kept, with its terminating NUL. */
#define FP_MSG_MAX 1024

/* Records a message for the calling thread and returns `s`, so that error
 * paths read `return fp_error(FABPOOL_ERR_..., "what happened; what to do", ...);`
 * errno is left as the failed call set it (the caller's caller may read it). */
fabpool_status fp_error(fabpool_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends to the calling thread's message (context from an outer layer). */
void fp_error_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* errno's rule for every public call (docs/api.md): a call that succeeds leaves the calling thread's message as
 * it was, so that it stays the last failed call's.  A stretch of work that may fail and recover (a retry, a
 * failure it logs and leaves for later) is put between fp_error_hold and fp_error_unhold.  The message is
 * copied into the hold only when something first changes it, so that a stretch without failures costs a few
 * stores.  Holds nest; each is ended by the function that began it, on every path, innermost first.
 * fp_error_unhold with FABPOOL_OK puts the message back as it was at the hold (what failed under it was
 * recovered from); any other status keeps the new message, the one the caller answers with.  Returns st. */
typedef struct fp_msg_hold {
    struct fp_msg_hold *outer;
    unsigned char taken, lost;
    uint64_t id;
    char text[FP_MSG_MAX];
} fp_msg_hold;
void fp_error_hold(fp_msg_hold *h);
fabpool_status fp_error_unhold(fp_msg_hold *h, fabpool_status st);
/* fp_error_hold for one more try of what has just failed under a hold (an allocation's retry once the device
 * was out of memory): where the message is still the one that failure left, a success puts back the message
 * from before it.  Otherwise an ordinary hold. */
void fp_error_hold_retry(fp_msg_hold *h);

/* FABPOOL_OK if a struct the caller hands in to be filled says the size this
 * library knows (fabpool.h, struct_size), else FABPOOL_ERR_INVALID_ARG with a
 * message naming fn and the struct type. */
fabpool_status fp_struct_size_check(const char *fn, const char *type, size_t got, size_t want);

/* The opening of a getter that fills `out`, a caller's struct of `size`
 * bytes whose first member is its size_t struct_size (fabpool_stats,
 * fabpool_counters, fabpool_sleep_info): FABPOOL_ERR_INVALID_ARG when the
 * pool or out is NULL or struct_size is not `size` (fn and type name the call
 * and the struct in the message); else FABPOOL_OK with out zeroed and its
 * struct_size set. */
fabpool_status fp_getter_begin(const char *fn, const char *type, const void *pool, void *out, size_t size);

#endif
