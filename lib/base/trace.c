/* trace.c - a pool's trace file: every allocation, free, buffer change and
 * trim, with a time stamp, the stream where the call has one and the thread,
 * in fixed-size little-endian records (fabpool_trace_format.h).
 *
 * Records go into a buffer of the trace under its own lock and reach the
 * file when the buffer is full, at pool destroy, and at process exit.  A
 * write that fails stops the trace (one line on stderr says so); the pool
 * goes on.  A child made by fork() records nothing: the file is its
 * parent's. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trace.h"

#include "error.h"
#include "list.h"
#include "lock.h"
#include "log.h"

#define TRACE_BUF_RECORDS 4096u  /* 160 KiB a pool */
#define TRACE_PATH_CAP (FABPOOL_TRACE_PATH_MAX + 64)

struct fp_trace {
    fp_lock_t lock;
    int fd;
    _Atomic int dead;        /* no more records: closed at exit, a failed write, or a forked child */
    int finished;            /* the header is complete and the fd closed */
    uint64_t t0;
    uint64_t n;              /* records written to the file or buffered */
    uint64_t checksum;
    uint64_t dropped;
    unsigned used;           /* records buffered */
    fabpool_trace_header hdr;
    char path[TRACE_PATH_CAP];
    struct fp_trace *next, *prev;  /* every open trace of the process */
    unsigned char buf[TRACE_BUF_RECORDS * FABPOOL_TRACE_RECORD_BYTES];
};

static fp_lock_t traces_lock = FP_LOCK_INITIALIZER(FP_LOCK_TRACE_LIST, "trace list");
static struct fp_trace *traces;
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static _Atomic uint32_t next_thread;
static _Thread_local uint32_t my_thread;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ------------------------------------------------------------ writing */

static int write_all(int fd, const unsigned char *b, size_t n, off_t at)
{
    while (n) {
        ssize_t w = at < 0 ? write(fd, b, n) : pwrite(fd, b, n, at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
        if (at >= 0)
            at += w;
    }
    return 0;
}

/* Writes the buffer out. */
static void flush_locked(struct fp_trace *t)
{
    fp_lock_assert_held(&t->lock);
    if (!t->used || t->fd < 0)
        return;
    if (write_all(t->fd, t->buf, (size_t)t->used * FABPOOL_TRACE_RECORD_BYTES, -1) != 0) {
        int e = errno;
        atomic_store(&t->dead, 1);
        t->dropped += t->used;
        fprintf(stderr, "fabpool: trace %s: writing %u records failed (%s); the trace stops here and its file stays "
                "marked as not closed\n", t->path, t->used, strerror(e ? e : EIO));
        close(t->fd);
        t->fd = -1;
        t->finished = 1;
    }
    t->used = 0;
}

/* Flushes, writes the record count and checksum into the header, closes. */
static void finish_locked(struct fp_trace *t)
{
    fp_lock_assert_held(&t->lock);
    if (t->finished)
        return;
    flush_locked(t);
    if (t->fd < 0) {
        t->finished = 1;
        return;
    }
    unsigned char h[FABPOOL_TRACE_HEADER_BYTES];
    t->hdr.n_records = t->n;
    t->hdr.checksum = t->checksum;
    fabpool_trace_encode_header(h, &t->hdr);
    if (write_all(t->fd, h, sizeof h, 0) != 0)
        fprintf(stderr, "fabpool: trace %s: completing its header failed (%s); the file stays marked as not "
                "closed\n", t->path, strerror(errno));
    close(t->fd);
    t->fd = -1;
    t->finished = 1;
    atomic_store(&t->dead, 1);
}

static void at_exit(void)
{
    fp_lock(&traces_lock);
    for (struct fp_trace *t = traces; t; t = t->next) {
        if (atomic_load(&t->dead))
            continue;
        fp_lock(&t->lock);
        finish_locked(t);
        fp_unlock(&t->lock);
    }
    fp_unlock(&traces_lock);
}

static void fork_prepare(void) { fp_lock(&traces_lock); }
static void fork_parent(void) { fp_unlock(&traces_lock); }
static void fork_child(void)
{
    /* the parent's files: the child writes nothing to them, and does not
     * wait for locks other threads of the parent may have held */
    for (struct fp_trace *t = traces; t; t = t->next) {
        atomic_store(&t->dead, 1);
        t->finished = 1;
        t->used = 0;
        if (t->fd >= 0)
            close(t->fd);
        t->fd = -1;
        fp_lock_init(&t->lock, FP_LOCK_TRACE, 0, "trace");
    }
    fp_unlock(&traces_lock);
}

static void install_hooks(void)
{
    atexit(at_exit);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void fp_trace_record(struct fp_trace *t, unsigned op, unsigned flags, uint64_t ptr, uint64_t size, uint64_t arg,
                     unsigned status)
{
    if (atomic_load_explicit(&t->dead, memory_order_relaxed))
        return;
    if (!my_thread)
        my_thread = atomic_fetch_add(&next_thread, 1) + 1;
    fabpool_trace_rec r = {0, ptr, size, arg, (uint8_t)op, (uint8_t)status, my_thread, (uint16_t)flags};
    fp_lock(&t->lock);
    if (atomic_load_explicit(&t->dead, memory_order_relaxed)) {
        t->dropped++;
        fp_unlock(&t->lock);
        return;
    }
    uint64_t now = now_ns();
    r.t_ns = now > t->t0 ? now - t->t0 : 0;
    unsigned char *b = t->buf + (size_t)t->used * FABPOOL_TRACE_RECORD_BYTES;
    fabpool_trace_encode_rec(b, &r);
    t->checksum = fabpool_fnv1a(t->checksum, b, FABPOOL_TRACE_RECORD_BYTES);
    t->n++;
    if (++t->used == TRACE_BUF_RECORDS)
        flush_locked(t);
    fp_unlock(&t->lock);
}

fabpool_status fabpool_trace_flush(void)
{
    char failed[TRACE_PATH_CAP] = "";
    fp_lock(&traces_lock);
    for (struct fp_trace *t = traces; t; t = t->next) {
        fp_lock(&t->lock);
        if (!atomic_load(&t->dead)) {
            flush_locked(t);
            if (atomic_load(&t->dead) && !failed[0])
                snprintf(failed, sizeof failed, "%s", t->path);
        }
        fp_unlock(&t->lock);
    }
    fp_unlock(&traces_lock);
    if (failed[0])
        return fp_error(FABPOOL_ERR_IO, "fabpool_trace_flush: writing trace %s failed; that trace stops (see the "
                        "line on stderr)", failed);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ open, close */

fabpool_status fp_trace_env(fabpool_options *o)
{
    const char *env = secure_getenv("FABPOOL_TRACE");
    if (!env || !*env)
        return FABPOOL_OK;
    size_t n = strlen(env);
    if (n >= FABPOOL_TRACE_PATH_MAX)
        return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_TRACE is %zu bytes long; a trace path is at most %d bytes: "
                        "choose a shorter path", n, FABPOOL_TRACE_PATH_MAX - 1);
    memset(o->trace_path, 0, sizeof o->trace_path);
    memcpy(o->trace_path, env, n);
    return FABPOOL_OK;
}

void fp_trace_fork_hooks(void) { pthread_once(&hooks_once, install_hooks); }

fabpool_status fp_trace_open(const fabpool_options *o, uint64_t gran, struct fp_trace **out)
{
    *out = NULL;
    if (!o->trace_path[0])
        return FABPOOL_OK;
    pthread_once(&hooks_once, install_hooks);
    struct fp_trace *t = calloc(1, sizeof *t);
    if (!t)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the trace buffer (%zu bytes)", sizeof *t);
    char base[TRACE_PATH_CAP];
    if (fp_path_expand(o->trace_path, o->device, base, sizeof base - 16) != 0) {
        free(t);
        return fp_error(FABPOOL_ERR_CONFIG, "trace path '%s': too long once %%h, %%p and %%d are replaced (at most %d "
                        "bytes); choose a shorter path", o->trace_path, TRACE_PATH_CAP - 17);
    }
    /* a second pool of this process on the same path writes to path.2, ... */
    fp_lock(&traces_lock);
    snprintf(t->path, sizeof t->path, "%s", base);
    for (unsigned k = 2;; k++) {
        int taken = 0;
        for (struct fp_trace *q = traces; q && !taken; q = q->next)
            taken = !q->finished && strcmp(q->path, t->path) == 0;
        if (!taken)
            break;
        char sfx[16];
        snprintf(sfx, sizeof sfx, ".%u", k);
        size_t bl = strlen(base); /* < sizeof t->path - 16 */
        memcpy(t->path, base, bl);
        memcpy(t->path + bl, sfx, strlen(sfx) + 1);
    }
    char why[320];
    t->fd = fp_open_private(t->path, 0, why, sizeof why);
    if (t->fd < 0) {
        fp_unlock(&traces_lock);
        fabpool_status st = fp_error(FABPOOL_ERR_IO, "trace '%s': %s (the path comes from FABPOOL_TRACE, the conf key "
                                     "trace or fabpool_options.trace_path)", t->path, why);
        free(t);
        return st;
    }
    t->hdr.version = FABPOOL_TRACE_VERSION;
    t->hdr.device = o->device;
    t->hdr.granularity = gran;
    t->hdr.slab_max = o->slab_max_bytes;
    t->hdr.n_records = FABPOOL_TRACE_OPEN;
    t->hdr.checksum = 0;
    t->hdr.pid = (uint32_t)getpid();
    t->hdr.flags = FABPOOL_TRACE_F_APP_MARKED;
    t->checksum = FABPOOL_FNV_OFFSET;
    unsigned char h[FABPOOL_TRACE_HEADER_BYTES];
    fabpool_trace_encode_header(h, &t->hdr);
    if (write_all(t->fd, h, sizeof h, -1) != 0) {
        int e = errno;
        close(t->fd);
        fp_unlock(&traces_lock);
        fabpool_status st = fp_error(FABPOOL_ERR_IO, "trace: cannot write the header of '%s': %s", t->path,
                                     strerror(e));
        free(t);
        return st;
    }
    fp_lock_init(&t->lock, FP_LOCK_TRACE, 0, "trace");
    t->t0 = now_ns();
    FP_LIST_PUSH(&traces, t, next, prev);
    fp_unlock(&traces_lock);
    *out = t;
    return FABPOOL_OK;
}

void fp_trace_close(struct fp_trace *t)
{
    if (!t)
        return;
    fp_lock(&traces_lock);
    fp_lock(&t->lock);
    finish_locked(t);
    fp_unlock(&t->lock);
    FP_LIST_REMOVE(&traces, t, next, prev);
    fp_unlock(&traces_lock);
    fp_lock_destroy(&t->lock);
    free(t);
}

const char *fp_trace_path(const struct fp_trace *t) { return t ? t->path : NULL; }
