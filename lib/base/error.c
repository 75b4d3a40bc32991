/* error.c - status names, the calling thread's last error message, the
 * library's version, the check of a struct's size and a getter's opening. */
#include "error.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"

/* The calling thread's message lives on the heap, made at its first error
 * and freed when the thread exits: not in the library's thread-local block,
 * which stays a few dozen bytes (the thread caches' slot, tcache.h) for a
 * library that a program dlopens.  Only the pointer is thread-local, and
 * only error paths read it. */
static _Thread_local char *fp_msg;
/* Set while the thread's last message could not be kept (no host memory). */
static _Thread_local unsigned char fp_msg_lost;
/* The thread's innermost hold (error.h), NULL outside every one. */
static _Thread_local fp_msg_hold *fp_holds;
static pthread_key_t msg_key;
static pthread_once_t msg_once = PTHREAD_ONCE_INIT;
static int msg_key_ok;

/* Every thread's message on one list: a process forked by one thread still reaches the others' buffers (their
 * threads are gone there), so that leak checkers of the child (valgrind, LeakSanitizer) find them held, not lost.
 * The lock is taken around fork (pthread_atfork), so that a child never inherits it held. */
typedef struct msg_node {
    struct msg_node *prev, *next;
    uint64_t id, ids;   /* the message's id (one per fp_error, kept by an append), and the ids given so far */
    /* the message a hold that ended in failure replaced, for fp_error_hold_retry while the failure's message
     * (id retry_of) stands */
    uint64_t retry_of, retry_id;
    unsigned char retry_lost;
    char text[FP_MSG_MAX];
    char retry_text[FP_MSG_MAX];
} msg_node;
static msg_node *msg_list;
static pthread_mutex_t msg_lock = PTHREAD_MUTEX_INITIALIZER;

static msg_node *msg_node_of(void) { return fp_msg ? (msg_node *)(fp_msg - offsetof(msg_node, text)) : NULL; }

static void msg_lock_take(void) { pthread_mutex_lock(&msg_lock); }
static void msg_lock_give(void) { pthread_mutex_unlock(&msg_lock); }

static void msg_free(void *v)
{
    msg_node *n = v;
    if (n->text == fp_msg)
        fp_msg = NULL;
    msg_lock_take();
    FP_LIST_REMOVE(&msg_list, n, next, prev);
    msg_lock_give();
    free(n);
}

static void msg_make_key(void)
{
    msg_key_ok = pthread_key_create(&msg_key, msg_free) == 0 &&
                 pthread_atfork(msg_lock_take, msg_lock_give, msg_lock_give) == 0;
}

/* The thread's buffer, made on first use (NULL without host memory). */
static char *msg_buf(void)
{
    if (fp_msg)
        return fp_msg;
    pthread_once(&msg_once, msg_make_key);
    msg_node *n = msg_key_ok ? calloc(1, sizeof *n) : NULL;
    if (!n)
        return NULL;
    msg_lock_take();
    FP_LIST_PUSH(&msg_list, n, next, prev);
    msg_lock_give();
    if (pthread_setspecific(msg_key, n) != 0) {
        msg_free(n);
        return NULL;
    }
    fp_msg = n->text;
    return fp_msg;
}

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

const char *fabpool_last_error(void)
{
    if (fp_msg_lost)
        return "fabpool: a call failed, and there was no host memory left to keep its message";
    return fp_msg ? fp_msg : "";
}

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

/* ------------------------------------------------------------ holds */

static void hold_copy(char *dst, const char *src) { memcpy(dst, src, strlen(src) + 1); }

/* Before the message changes: every hold that has not kept it yet keeps it now (the innermost ones: a hold
 * that has kept it has outer ones that have too). */
static void holds_take(void)
{
    const msg_node *n = msg_node_of();
    for (fp_msg_hold *h = fp_holds; h && !h->taken; h = h->outer) {
        hold_copy(h->text, n ? n->text : "");
        h->id = n ? n->id : 0;
        h->lost = fp_msg_lost;
        h->taken = 1;
    }
}

/* An unhold that is not of the innermost hold: a function returned without ending the hold it began, and the
 * next failure would write through a frame that is gone. */
static void holds_broken(const fp_msg_hold *h)
{
    fprintf(stderr, "fabpool: internal error: the message hold at %p was not ended by the function that began it\n",
            (const void *)h);
    abort();
}

void fp_error_hold(fp_msg_hold *h)
{
    h->outer = fp_holds;
    h->taken = 0;
    fp_holds = h;
}

void fp_error_hold_retry(fp_msg_hold *h)
{
    fp_error_hold(h);
    const msg_node *n = msg_node_of();
    if (!n || !n->retry_of || n->retry_of != n->id || fp_msg_lost)
        return;
    hold_copy(h->text, n->retry_text);
    h->id = n->retry_id;
    h->lost = n->retry_lost;
    h->taken = 1;
}

fabpool_status fp_error_unhold(fp_msg_hold *h, fabpool_status st)
{
    if (fp_holds != h)
        holds_broken(fp_holds);
    fp_holds = h->outer;
    if (!h->taken)
        return st;
    msg_node *n = msg_node_of();
    if (st != FABPOOL_OK) {
        if (n) {
            hold_copy(n->retry_text, h->text);
            n->retry_id = h->id;
            n->retry_lost = h->lost;
            n->retry_of = n->id;
        }
        return st;
    }
    fp_msg_lost = h->lost;
    if (n) {
        hold_copy(n->text, h->text);
        n->id = h->id;
    }
    return st;
}

/* ------------------------------------------------------------ the message */

fabpool_status fp_error(fabpool_status s, const char *fmt, ...)
{
    int e = errno; /* the failed call's: the message's buffer (malloc) and vsnprintf may set it */
    char *m = msg_buf();
    holds_take();
    fp_msg_lost = !m;
    if (m) {
        msg_node *n = msg_node_of();
        n->id = ++n->ids;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, FP_MSG_MAX, fmt, ap);
        va_end(ap);
    }
    errno = e;
    return s;
}

void fp_error_append(const char *fmt, ...)
{
    char *m = fp_msg_lost ? NULL : msg_buf();
    if (!m)
        return;
    size_t len = strlen(m);
    if (len + 1 >= FP_MSG_MAX)
        return;
    holds_take();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m + len, FP_MSG_MAX - len, fmt, ap);
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
