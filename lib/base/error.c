/* error.c - status names, the calling thread's last error message, the
 * library's version, the check of a struct's size and a getter's opening. */
#include "error.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define FP_MSG_MAX 1024

static _Thread_local char fp_msg[FP_MSG_MAX];

static const char *const status_names[] = {
    [FABPOOL_OK] = "FABPOOL_OK",
    [FABPOOL_ERR_INVALID_ARG] = "FABPOOL_ERR_INVALID_ARG",
    [FABPOOL_ERR_OUT_OF_MEMORY] = "FABPOOL_ERR_OUT_OF_MEMORY",
    [FABPOOL_ERR_HOST_MEMORY] = "FABPOOL_ERR_HOST_MEMORY",
    [FABPOOL_ERR_NO_DRIVER] = "FABPOOL_ERR_NO_DRIVER",
    [FABPOOL_ERR_DRIVER] = "FABPOOL_ERR_DRIVER",
    [FABPOOL_ERR_NOT_SUPPORTED] = "FABPOOL_ERR_NOT_SUPPORTED",
    [FABPOOL_ERR_CONFIG] = "FABPOOL_ERR_CONFIG",
    [FABPOOL_ERR_NOT_FOUND] = "FABPOOL_ERR_NOT_FOUND",
    [FABPOOL_ERR_DOUBLE_FREE] = "FABPOOL_ERR_DOUBLE_FREE",
    [FABPOOL_ERR_LIMIT] = "FABPOOL_ERR_LIMIT",
    [FABPOOL_ERR_BUSY] = "FABPOOL_ERR_BUSY",
    [FABPOOL_ERR_DESCRIPTOR] = "FABPOOL_ERR_DESCRIPTOR",
    [FABPOOL_ERR_IO] = "FABPOOL_ERR_IO",
    [FABPOOL_ERR_CORRUPT] = "FABPOOL_ERR_CORRUPT",
    [FABPOOL_ERR_ASLEEP] = "FABPOOL_ERR_ASLEEP",
    [FABPOOL_ERR_PERMISSION] = "FABPOOL_ERR_PERMISSION",
    [FABPOOL_ERR_PARTIAL] = "FABPOOL_ERR_PARTIAL",
};

const char *fabpool_status_name(fabpool_status s)
{
    if ((unsigned)s < sizeof status_names / sizeof status_names[0] && status_names[s])
        return status_names[s];
    return "FABPOOL_ERR_UNKNOWN_STATUS";
}

const char *fabpool_last_error(void) { return fp_msg; }

const char *fabpool_version(void) { return FABPOOL_VERSION_STRING; }

fabpool_status fp_struct_size_check(const char *fn, const char *type, size_t got, size_t want)
{
    if (got == want)
        return FABPOOL_OK;
    return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: the %s's struct_size is %zu, but fabpool %s knows %s of %zu bytes "
                    "only: set struct_size = sizeof(%s) before the call, and build against the fabpool.h of the "
                    "library the program loads (fabpool_version() says which)", fn, type, got,
                    FABPOOL_VERSION_STRING, type, want, type);
}

void fp_error_clear(void) { fp_msg[0] = '\0'; }

fabpool_status fp_error(fabpool_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fp_msg, sizeof fp_msg, fmt, ap);
    va_end(ap);
    return s;
}

void fp_error_append(const char *fmt, ...)
{
    size_t len = strlen(fp_msg);
    if (len + 1 >= sizeof fp_msg)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fp_msg + len, sizeof fp_msg - len, fmt, ap);
    va_end(ap);
}

_Static_assert(offsetof(fabpool_stats, struct_size) == 0 && offsetof(fabpool_counters, struct_size) == 0 &&
                   offsetof(fabpool_sleep_info, struct_size) == 0,
               "fp_getter_begin reads and sets struct_size as the struct's first member");

fabpool_status fp_getter_begin(const char *fn, const char *type, const void *pool, void *out, size_t size)
{
    if (!pool || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: the pool or the output is NULL", fn);
    size_t got = 0;
    memcpy(&got, out, sizeof got);
    fabpool_status st = fp_struct_size_check(fn, type, got, size);
    if (st != FABPOOL_OK)
        return st;
    memset(out, 0, size);
    memcpy(out, &size, sizeof size);
    return FABPOOL_OK;
}
