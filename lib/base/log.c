/* log.c - the process's leveled log (log.h). */
#define _GNU_SOURCE
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "error.h"

_Atomic int fp_log_level;

static _Atomic int log_fd = 2;
static pthread_mutex_t raise_lock = PTHREAD_MUTEX_INITIALIZER;
static char host[64];                    /* written once (host_once) */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned pools;

static const char *const level_names[] = {"none", "warn", "info", "trace"};
static const char *const level_tags[] = {"", "WARN", "INFO", "TRACE"};

int fp_log_level_of(const char *w, size_t n)
{
    for (int i = 0; i < 4; i++)
        if (strlen(level_names[i]) == n && strncasecmp(w, level_names[i], n) == 0)
            return i;
    return -1;
}

const char *fp_log_level_name(int lvl) { return lvl >= 0 && lvl < 4 ? level_names[lvl] : "?"; }

fabpool_status fp_log_env(int *lvl)
{
    *lvl = -1;
    const char *e = getenv("FABPOOL_DEBUG");
    if (!e || !*e)
        return FABPOOL_OK;
    int l = fp_log_level_of(e, strlen(e));
    if (l < 0)
        return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_DEBUG='%.64s': not a level; accepted: warn, info, trace (or "
                        "none)", e);
    *lvl = l;
    return FABPOOL_OK;
}

static void host_name(void)
{
    if (gethostname(host, sizeof host - 1) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot)
        *dot = '\0';
}

int fp_path_expand(const char *in, int device, char *out, size_t cap)
{
    size_t len = 0;
    for (const char *s = in; *s; s++) {
        char piece[80];
        if (s[0] == '%' && (s[1] == 'p' || s[1] == 'd' || s[1] == 'h' || s[1] == '%')) {
            if (s[1] == 'p')
                snprintf(piece, sizeof piece, "%ld", (long)getpid());
            else if (s[1] == 'd')
                snprintf(piece, sizeof piece, "%d", device);
            else if (s[1] == 'h') {
                pthread_once(&host_once, host_name);
                snprintf(piece, sizeof piece, "%s", host);
            } else
                snprintf(piece, sizeof piece, "%%");
            s++;
        } else {
            piece[0] = *s;
            piece[1] = '\0';
        }
        size_t l = strlen(piece);
        if (len + l + 1 > cap)
            return -1;
        memcpy(out + len, piece, l);
        len += l;
    }
    out[len] = '\0';
    return 0;
}

/* FABPOOL_DEBUG_FILE opened, or stderr (and a line saying why). */
static void open_file(void)
{
    const char *f = getenv("FABPOOL_DEBUG_FILE");
    if (!f || !*f)
        return;
    char path[4096];
    int fd = -1;
    if (fp_path_expand(f, -1, path, sizeof path) == 0)
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        atomic_store(&log_fd, fd);
        return;
    }
    int e = errno;
    char line[4400];
    int n = snprintf(line, sizeof line, "%s:%ld fabpool WARN FABPOOL_DEBUG_FILE='%s': cannot open it (%s); the log "
                     "goes to stderr\n", host, (long)getpid(), f, strerror(e));
    if (n > 0 && write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0)
        return;
}

void fp_log_raise(int lvl)
{
    if (lvl <= atomic_load(&fp_log_level))
        return;
    pthread_mutex_lock(&raise_lock);
    pthread_once(&host_once, host_name);
    if (atomic_load(&fp_log_level) == FP_LOG_OFF)
        open_file();
    if (lvl > atomic_load(&fp_log_level))
        atomic_store(&fp_log_level, lvl);
    pthread_mutex_unlock(&raise_lock);
}

unsigned fp_log_pool_number(void) { return atomic_fetch_add(&pools, 1) + 1; }

static void vlog(int lvl, const char *prefix, const char *fmt, va_list ap)
{
    /* FP_LOG_ON's load is relaxed: this one orders the host name and the file before the line */
    (void)atomic_load_explicit(&fp_log_level, memory_order_acquire);
    char line[2048];
    size_t cap = sizeof line - 1; /* room for the newline */
    int n = snprintf(line, cap, "%s:%ld:%ld fabpool %s %s", host, (long)getpid(), (long)syscall(SYS_gettid),
                     level_tags[lvl < 0 ? 0 : lvl > 3 ? 3 : lvl], prefix);
    size_t len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    n = vsnprintf(line + len, cap - len, fmt, ap);
    len += n < 0 ? 0 : (size_t)n < cap - len ? (size_t)n : cap - len - 1;
    line[len++] = '\n';
    if (write(atomic_load(&log_fd), line, len) < 0)
        return; /* nowhere to say it */
}

void fp_log(int lvl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, "", fmt, ap);
    va_end(ap);
}

void fp_log_pool(int lvl, unsigned pool, int dev, const char *fmt, ...)
{
    char prefix[48];
    snprintf(prefix, sizeof prefix, "pool %u dev %d: ", pool, dev);
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, prefix, fmt, ap);
    va_end(ap);
}
