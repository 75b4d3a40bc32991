/* error.h - status codes and the thread-local error message. */
#ifndef FP_ERROR_H
#define FP_ERROR_H

#include "fabpool.h"

/* Records a message for the calling thread and returns `s`, so that error
 * paths read `return fp_error(FABPOOL_ERR_..., "what happened; what to do", ...);` */
fabpool_status fp_error(fabpool_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends to the calling thread's message (context from an outer layer). */
void fp_error_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fp_error_clear(void);

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
