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

#endif
