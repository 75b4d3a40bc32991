/* log.h - the process's leveled log (FABPOOL_DEBUG=warn|info|trace, the
 * conf key debug; FABPOOL_DEBUG_FILE, docs/config.md), and the expansion of
 * %h, %p, %d and %% in file names it shares with the trace file.
 *
 * Off by default.  Every log call is behind FP_LOG_ON, one predictable
 * branch on a global int, and none is on the cached alloc/free path.  The
 * level is the process's: the highest that FABPOOL_DEBUG or any pool's
 * debug option asked for (a pool never lowers it).  Each line goes out in
 * one write(2), to stderr or the file (opened as fp_open_private says):
 *   "<host>:<pid>:<tid> fabpool INFO pool 1 dev 0: <message>"
 */
#ifndef FP_LOG_H
#define FP_LOG_H

#include <stdatomic.h>
#include <stddef.h>

#include "fabpool.h"

enum { FP_LOG_OFF = 0, FP_LOG_WARN = 1, FP_LOG_INFO = 2, FP_LOG_TRACE = 3 };

extern _Atomic int fp_log_level;

#define FP_LOG_ON(lvl) __builtin_expect(atomic_load_explicit(&fp_log_level, memory_order_relaxed) >= (lvl), 0)

/* A line at level lvl, when the log is at lvl or above. */
#define FP_LOG(lvl, ...)                                                                                       \
    do {                                                                                                       \
        if (FP_LOG_ON(lvl))                                                                                    \
            fp_log((lvl), __VA_ARGS__);                                                                        \
    } while (0)
/* ... about pool `pool` (its number in the log) of device `dev`. */
#define FP_LOG_POOL(lvl, pool, dev, ...)                                                                       \
    do {                                                                                                       \
        if (FP_LOG_ON(lvl))                                                                                    \
            fp_log_pool((lvl), (pool), (dev), __VA_ARGS__);                                                    \
    } while (0)

void fp_log(int lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fp_log_pool(int lvl, unsigned pool, int dev, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The level a word names ("none", "warn", "info", "trace", any case): 0..3,
 * or -1 for another word. */
int fp_log_level_of(const char *word, size_t n);
/* The level's word ("none" .. "trace"). */
const char *fp_log_level_name(int lvl);
/* FABPOOL_DEBUG's level into *lvl (-1 when unset or empty);
 * FABPOOL_ERR_CONFIG naming the value when it is not a level. */
fabpool_status fp_log_env(int *lvl);
/* Raises the process's level to lvl (never lowers it); the first time it
 * leaves 0, opens FABPOOL_DEBUG_FILE (%h, %p expanded; fp_open_private),
 * else the log goes to stderr.  FABPOOL_ERR_CONFIG naming the path and why
 * when that file cannot be opened or is refused: the level then stays off. */
fabpool_status fp_log_raise(int lvl);
/* A number for a new pool in the log's lines: 1, 2, ... */
unsigned fp_log_pool_number(void);

/* The path `in` with %h (host name), %p (pid), %d (device; left as written
 * when device is -1, a path of no device's) and %% (%) replaced, into out;
 * -1 if it does not fit in cap bytes. */
int fp_path_expand(const char *in, int device, char *out, size_t cap);

/* Opens path to write a log or trace into (O_APPEND if append), where the
 * folder may be shared with other users: never through a symbolic link,
 * never blocking on a FIFO, only a regular file with one name owned by this
 * process's effective uid; a new file is created with mode 0600, an existing
 * one is truncated only once it passed those checks.  The fd (close-on-exec),
 * or -1 with why it was refused or failed (a sentence) in why. */
int fp_open_private(const char *path, int append, char *why, size_t cap);

#endif
