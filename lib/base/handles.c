/* handles.c - the process's handle area (handles.h).
 *
 * Slots come in segments, each twice the size of the one before, taken
 * from calloc and kept for the process's life: a handle is checked against
 * at most a few dozen segments, a stale one always points into memory of
 * the area, and the leak checkers see what the structs point to (a segment
 * is a heap block that a global names).  Freed slots wait in a FIFO queue
 * (linked through the slots) until FP_HANDLE_QUARANTINE more have been
 * freed; until then new objects take never-used slots.
 *
 * Under AddressSanitizer a freed slot's struct is poisoned, so that the
 * library's own use of a freed buffer or view is still reported, as when
 * the structs were heap blocks of their own.
 *
 * Fork: a thread of the parent may have held the area's lock when another
 * forked; the child (one thread) then drops the queue, which that thread may
 * have left half linked (its slots are lost to the child, nothing else), and
 * takes the lock afresh.  What segments and slots were handed out stays
 * sound at every point of fp_handle_alloc (a segment is published before
 * slots are cut from it). */
#include "handles.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "lock.h"

#if defined(__SANITIZE_ADDRESS__)
#define FP_HANDLES_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP_HANDLES_ASAN 1
#endif
#endif
#ifdef FP_HANDLES_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* A slot's state: 0 never handed out; kind | LIVE a live handle; kind alone
 * an object whose handle is refused (destroyed, released) but that its owner
 * still holds; FREE in the quarantine. */
enum { LIVE = 0x100u, FREE = 0x200u, KIND = 0xffu };

typedef struct slot {
    _Atomic uint32_t state;
    struct slot *next;                 /* the next in the quarantine */
    alignas(max_align_t) unsigned char obj[FP_HANDLE_BYTES];
} slot;

_Static_assert(sizeof(slot) == 256, "a slot is 256 bytes: its state, its queue link and the struct");

#define SEG0 256u  /* slots of the first segment */
#define SEGS 32u   /* segments at most: SEG0 << k slots in segment k */

static _Atomic(slot *) seg[SEGS];
static _Atomic unsigned n_seg;
static size_t used;                    /* slots cut from the last segment */
static slot *q_head, *q_tail;          /* the quarantine, oldest first */
static size_t q_n;
static fp_lock_t lock = FP_LOCK_INITIALIZER(FP_LOCK_HANDLES, "handles");

static void fork_child(void)
{
    if (atomic_load_explicit(&lock.w, memory_order_relaxed)) {
        q_head = q_tail = NULL;
        q_n = 0;
    }
    fp_lock_init(&lock, FP_LOCK_HANDLES, 0, "handles");
}

static void hook_fork(void) { (void)pthread_atfork(NULL, NULL, fork_child); }

static slot *slot_at(void *h) { return (slot *)(void *)((unsigned char *)h - offsetof(slot, obj)); }

/* A slot never handed out: cut from the last segment, or from a new one. */
static slot *fresh(void)
{
    unsigned n = atomic_load_explicit(&n_seg, memory_order_relaxed);
    if (n && used < (size_t)SEG0 << (n - 1))
        return &atomic_load_explicit(&seg[n - 1], memory_order_relaxed)[used++];
    slot *s = n < SEGS ? calloc((size_t)SEG0 << n, sizeof *s) : NULL;
    if (!s)
        return NULL;
    atomic_store_explicit(&seg[n], s, memory_order_relaxed);
    atomic_store_explicit(&n_seg, n + 1, memory_order_release);
    used = 1;
    return s;
}

/* A slot to hand out, zeroed, its handle not live yet: the oldest of the
 * quarantine once more than FP_HANDLE_QUARANTINE wait there, else a fresh
 * one; NULL without host memory. */
static slot *take(void)
{
    static pthread_once_t hooked = PTHREAD_ONCE_INIT;
    (void)pthread_once(&hooked, hook_fork);
    fp_lock(&lock);
    slot *s = q_head;
    if (q_n > FP_HANDLE_QUARANTINE) {
        q_head = s->next;
        q_tail = q_head ? q_tail : NULL;
        q_n--;
    } else {
        s = fresh();
    }
    fp_unlock(&lock);
    if (s) {
        UNPOISON(s->obj, sizeof s->obj);
        s->next = NULL;
        memset(s->obj, 0, sizeof s->obj);
    }
    return s;
}

static void *publish(slot *s, fp_handle_kind kind)
{
    atomic_store_explicit(&s->state, (uint32_t)kind | LIVE, memory_order_release);
    return s->obj;
}

/* Puts s at the back of the quarantine. */
static void quarantine(slot *s)
{
    POISON(s->obj, sizeof s->obj);
    fp_lock(&lock);
    atomic_store_explicit(&s->state, FREE, memory_order_release);
    s->next = NULL;
    if (q_tail)
        q_tail->next = s;
    else
        q_head = s;
    q_tail = s;
    q_n++;
    fp_unlock(&lock);
}

void *fp_handle_alloc(fp_handle_kind kind, fp_meta *m)
{
    slot *s = take();
    if (!s)
        return NULL;
    fp_meta_count(m, sizeof *s, 1);
    return publish(s, kind);
}

void fp_handle_kill(void *h)
{
    slot *s = slot_at(h);
    atomic_store_explicit(&s->state, atomic_load_explicit(&s->state, memory_order_relaxed) & KIND,
                          memory_order_release);
}

void fp_handle_free(void *h, fp_meta *m)
{
    quarantine(slot_at(h));
    fp_meta_count(m, sizeof(slot), 0);
}

void *fp_handle_renew(void *h, fp_handle_kind kind, size_t size)
{
    slot *s = take();
    if (!s)
        return NULL;
    memcpy(s->obj, h, size);
    quarantine(slot_at(h));
    return publish(s, kind);
}

int fp_handle_live(const void *h, fp_handle_kind kind)
{
    uintptr_t p = (uintptr_t)h;
    unsigned n = atomic_load_explicit(&n_seg, memory_order_acquire);
    for (unsigned k = 0; h && k < n; k++) {
        uintptr_t b = (uintptr_t)atomic_load_explicit(&seg[k], memory_order_relaxed);
        size_t off = p - b;
        if (p < b || off >= ((size_t)SEG0 << k) * sizeof(slot))
            continue;
        if (off % sizeof(slot) != offsetof(slot, obj))
            return 0;
        const slot *s = (const slot *)(b + off - offsetof(slot, obj));
        return atomic_load_explicit(&s->state, memory_order_acquire) == ((uint32_t)kind | LIVE);
    }
    return 0;
}

fabpool_status fp_handle_check(const void *h, fp_handle_kind kind, const char *fn, const char *which)
{
    if (!h)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: %s is NULL", fn, which);
    if (fp_handle_live(h, kind))
        return FABPOOL_OK;
    if (kind == FP_HANDLE_BUFFER)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: %s (%p) is not a live buffer: it was destroyed or released, or "
                        "its pool destroyed (a handle is the caller's from fabpool_buffer_create or "
                        "fabpool_buffer_reuse until then), or it is no buffer handle; nothing was done", fn, which, h);
    return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: %s (%p) is not an open view: it was closed or released, or its "
                    "pool destroyed (a handle is the caller's from fabpool_view_open or fabpool_view_open_peer until "
                    "then), or it is no view handle; nothing was done", fn, which, h);
}
