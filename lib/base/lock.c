/* lock.c - the slow sides of fp_lock_t (a wait, a wake), and the lock-order
 * and lock-held checks of a FP_DEBUG_LOCKS build (lock.h).  Each thread
 * keeps the locks it holds in a small array; taking a lock checks it against
 * every lock held, before waiting for it, so that a wrong order aborts
 * instead of deadlocking some day. */
#define _GNU_SOURCE
#include "lock.h"

#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Spins this many reads of the word before it sleeps: a pool lock's common holder (a medium block's fit) lets
 * go within a microsecond, a sleep and a wake take several. */
#define FP_LOCK_SPIN 200

void fp_lock_wait(_Atomic unsigned *w)
{
    for (int i = 0; i < FP_LOCK_SPIN; i++) {
        unsigned v = atomic_load_explicit(w, memory_order_relaxed);
        if (v == 0 && atomic_compare_exchange_weak_explicit(w, &v, 1, memory_order_acquire, memory_order_relaxed))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    /* held, and now marked as having a sleeper: whoever lets go wakes one (the woken thread takes it as 2,
     * since others may sleep still) */
    while (atomic_exchange_explicit(w, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void fp_lock_wake(_Atomic unsigned *w) { syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }

#ifdef FP_DEBUG_LOCKS

#define FP_LOCK_MAX_HELD 256   /* every class lock and then some */

static _Thread_local const fp_lock_t *held[FP_LOCK_MAX_HELD];
static _Thread_local unsigned n_held;

static const char *const level_names[] = {"?", "registry", "pool", "class", "retire", "trace list", "trace", "keys",
                                          "handles"};

static void describe(char *out, size_t cap, const fp_lock_t *l)
{
    const char *lv = l->level < sizeof level_names / sizeof *level_names ? level_names[l->level] : "?";
    if (l->level == FP_LOCK_CLASS)
        snprintf(out, cap, "'%s' %u (level %u, %s)", l->name ? l->name : "?", l->sub, l->level, lv);
    else
        snprintf(out, cap, "'%s' (level %u, %s)", l->name ? l->name : "?", l->level, lv);
}

static void die(const char *fn, const char *what, const fp_lock_t *a, const fp_lock_t *b)
{
    char da[128], db[128] = "";
    describe(da, sizeof da, a);
    if (b)
        describe(db, sizeof db, b);
    fprintf(stderr, "fabpool: lock check failed in %s: %s %s%s%s; the lock order is registry < pool < class (ascending "
            "index) < trace list < trace (lib/lock.h)\n", fn, what, da, b ? " while holding " : "", db);
    fflush(stderr);
    abort();
}

void fp_lock_debug_init(fp_lock_t *l, unsigned level, unsigned sub, const char *name)
{
    l->level = level;
    l->sub = sub;
    l->name = name;
}

/* Whether a may be taken while b is held. */
static int may_follow(const fp_lock_t *a, const fp_lock_t *b)
{
    if (a->level != b->level)
        return a->level > b->level;
    return a->level == FP_LOCK_CLASS && a != b && a->sub > b->sub;
}

void fp_lock_debug_lock(fp_lock_t *l, const char *fn)
{
    for (unsigned i = 0; i < n_held; i++) {
        if (held[i] == l)
            die(fn, "taking", l, l);   /* self-deadlock */
        if (!may_follow(l, held[i]))
            die(fn, "taking", l, held[i]);
    }
    if (n_held == FP_LOCK_MAX_HELD)
        die(fn, "too many locks held to take", l, NULL);
    fp_lock_word(&l->w);
    held[n_held++] = l;
}

void fp_lock_debug_unlock(fp_lock_t *l, const char *fn)
{
    for (unsigned i = n_held; i-- > 0;)
        if (held[i] == l) {
            held[i] = held[--n_held];
            fp_unlock_word(&l->w);
            return;
        }
    die(fn, "releasing a lock it does not hold:", l, NULL);
}

void fp_lock_debug_assert_held(const fp_lock_t *l, const char *fn)
{
    for (unsigned i = 0; i < n_held; i++)
        if (held[i] == l)
            return;
    die(fn, "the caller must hold", l, NULL);
}

int fp_lock_debug_enabled(void) { return 1; }

#else

int fp_lock_debug_enabled(void) { return 0; }

#endif
