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
#include <sys/stat.h>
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
    const char *e = secure_getenv("FABPOOL_DEBUG");
    if (!e || !*e)
        return FABPOOL_OK;
    /* the words, or their numbers as the conf key debug takes them (debug:1 and FABPOOL_DEBUG=1 agree) */
    int l = e[0] >= '0' && e[0] <= '3' && !e[1] ? e[0] - '0' : fp_log_level_of(e, strlen(e));
    if (l < 0)
        return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_DEBUG='%.64s': not a level; accepted: warn, info, trace (or "
                        "none), or their numbers 1, 2, 3 (0)", e);
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
        /* %d names a pool's device: in a path that belongs to no device (the log's) it stays as written */
        if (s[0] == '%' && (s[1] == 'p' || (s[1] == 'd' && device >= 0) || s[1] == 'h' || s[1] == '%')) {
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

int fp_open_private(const char *path, int append, char *why, size_t cap)
{
    /* O_NOFOLLOW: a link that another user planted in a shared folder is never followed to a file of ours;
     * O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of blocking the open for good */
    int flags = O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0);
    int fd = -1, created = 0;
    /* a file removed between the two opens is created on the next turn; a few turns bound a racing peer */
    for (int turn = 0; turn < 4 && fd < 0; turn++) {
        fd = open(path, flags | O_CREAT | O_EXCL, 0600);
        created = fd >= 0;
        if (fd < 0 && errno == EEXIST) {
            fd = open(path, flags);
            if (fd < 0 && errno == ENOENT)
                continue;
        }
        if (fd < 0)
            break;
    }
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            snprintf(why, cap, "it is a symbolic link (refused: in a shared folder it may point at any file); name a "
                     "file of your own in a folder only you can write (mktemp -d, $XDG_RUNTIME_DIR)");
        else if (e == ENXIO)
            snprintf(why, cap, "it is a FIFO or socket with no reader, not a regular file (refused)");
        else
            snprintf(why, cap, "cannot open it: %s (its folder must exist and be writable)", strerror(e));
        return -1;
    }
    struct stat sb;
    char bad[160] = "";
    int fl;
    if (fstat(fd, &sb) != 0)
        snprintf(bad, sizeof bad, "fstat failed: %s", strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        snprintf(bad, sizeof bad, "it is %s, not a regular file (refused)", S_ISFIFO(sb.st_mode) ? "a FIFO"
                 : S_ISDIR(sb.st_mode) ? "a directory" : S_ISSOCK(sb.st_mode) ? "a socket" : "a device");
    else if (sb.st_uid != geteuid())
        snprintf(bad, sizeof bad, "it is owned by uid %ld, not by this process's uid %ld (refused)", (long)sb.st_uid,
                 (long)geteuid());
    else if (sb.st_nlink > 1) /* another name of it may be in a folder we do not know */
        snprintf(bad, sizeof bad, "it has %lu hard links (refused)", (unsigned long)sb.st_nlink);
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        snprintf(bad, sizeof bad, "clearing O_NONBLOCK failed: %s", strerror(errno));
    /* only now, a regular file known to be ours, is it cut (O_TRUNC at open would cut whatever the name held) */
    else if (!created && ftruncate(fd, 0) != 0)
        snprintf(bad, sizeof bad, "truncating it failed: %s", strerror(errno));
    if (bad[0]) {
        snprintf(why, cap, "%s; name a file of your own in a folder only you can write (mktemp -d, "
                 "$XDG_RUNTIME_DIR)", bad);
        close(fd);
        return -1;
    }
    return fd;
}

/* FABPOOL_DEBUG_FILE opened (if set): FABPOOL_ERR_CONFIG if it cannot be, or is refused. */
static fabpool_status open_file(void)
{
    const char *f = secure_getenv("FABPOOL_DEBUG_FILE");
    if (!f || !*f)
        return FABPOOL_OK;
    char path[4096], why[256];
    if (fp_path_expand(f, -1, path, sizeof path) != 0)
        return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_DEBUG_FILE is longer than %zu bytes once %%h and %%p are "
                        "replaced: choose a shorter path", sizeof path - 1);
    int fd = fp_open_private(path, 1, why, sizeof why);
    if (fd < 0)
        return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_DEBUG_FILE='%.512s': %s", path, why);
    atomic_store(&log_fd, fd);
    return FABPOOL_OK;
}

/* A child forked while another thread of its parent raised the level (opening the log file) would wait for the
 * lock for ever, no thread of the child holding it; a child that never loaded the driver may make a pool, which
 * raises the level again, so the child starts with the lock free. */
static void raise_lock_reset(void) { pthread_mutex_init(&raise_lock, NULL); }
static void raise_fork_hook(void) { (void)pthread_atfork(NULL, NULL, raise_lock_reset); }

fabpool_status fp_log_raise(int lvl)
{
    if (lvl <= atomic_load(&fp_log_level))
        return FABPOOL_OK;
    static pthread_once_t hooked = PTHREAD_ONCE_INIT;
    (void)pthread_once(&hooked, raise_fork_hook);
    pthread_mutex_lock(&raise_lock);
    pthread_once(&host_once, host_name);
    fabpool_status st = FABPOOL_OK;
    if (atomic_load(&fp_log_level) == FP_LOG_OFF)
        st = open_file();
    if (st == FABPOOL_OK && lvl > atomic_load(&fp_log_level)) /* a refused file: the log stays off */
        atomic_store(&fp_log_level, lvl);
    pthread_mutex_unlock(&raise_lock);
    return st;
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
