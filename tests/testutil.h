/* testutil.h - checks, and what the driver holds, for fabpool's tests.
 * The tests use the plain driver API to read data back and to ask what
 * memory the driver holds: the simulated driver's ledger when it is the
 * driver loaded (fabsim_get_ledger), else the real device's used memory less
 * what NVML says the other processes use (held.h; the whole device's use
 * where NVML cannot say). */
#ifndef FP_TESTUTIL_H
#define FP_TESTUTIL_H

#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fabpool.h"
#include "../sim/fabsim.h"
#include "held.h"

static int t_failures;
static int t_checks;
/* the counts as atomics: a test's threads check too (C and C++ alike: the compiler's builtin) */
#define T_COUNT(n) ((void)__atomic_fetch_add(&(n), 1, __ATOMIC_RELAXED))

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        T_COUNT(t_checks);                                                                                   \
        if (!(cond)) {                                                                                \
            T_COUNT(t_failures);                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                  \
        }                                                                                             \
    } while (0)

#define CHECK_OK(expr)                                                                                \
    do {                                                                                              \
        fabpool_status s_ = (expr);                                                                   \
        T_COUNT(t_checks);                                                                                   \
        if (s_ != FABPOOL_OK) {                                                                       \
            T_COUNT(t_failures);                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, fabpool_status_name(s_), \
                    fabpool_last_error());                                                            \
        }                                                                                             \
    } while (0)

#define CHECK_STATUS(expr, want)                                                                      \
    do {                                                                                              \
        fabpool_status s_ = (expr);                                                                   \
        T_COUNT(t_checks);                                                                                   \
        if (s_ != (want)) {                                                                           \
            T_COUNT(t_failures);                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s, expected %s (%s)\n", __FILE__, __LINE__, #expr,          \
                    fabpool_status_name(s_), #want, fabpool_last_error());                            \
        }                                                                                             \
    } while (0)

#define CHECK_CU(expr)                                                                                \
    do {                                                                                              \
        CUresult r_ = (expr);                                                                         \
        T_COUNT(t_checks);                                                                                   \
        if (r_ != CUDA_SUCCESS) {                                                                     \
            const char *n_ = "?";                                                                     \
            cuGetErrorName(r_, &n_);                                                                  \
            T_COUNT(t_failures);                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, n_);                      \
        }                                                                                             \
    } while (0)

static inline int t_done(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, t_checks, t_failures);
    return t_failures ? 1 : 0;
}

/* --- the driver's view ------------------------------------------------- */

typedef int (*t_ledger_fn)(fabsim_ledger *);
static t_ledger_fn t_ledger_p;
static int64_t t_used0;
static CUcontext t_ctx;

/* Real driver: the baseline of t_held(), what this process holds on device 0 now. */
static inline void t_held_rebase(void)
{
    int whole;
    t_used0 = t_used_bytes(0, &whole);
}

/* cuInit, a current context, and the baseline for t_held(). Returns 1 when
 * the simulated driver is the one loaded. */
static inline int t_driver_init(void)
{
    CUdevice d;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&t_ctx, d) != CUDA_SUCCESS || cuCtxSetCurrent(t_ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "no CUDA driver/device: cannot run\n");
        exit(2);
    }
    t_ledger_p = (t_ledger_fn)dlsym(RTLD_DEFAULT, "fabsim_get_ledger");
    if (!t_ledger_p)
        t_held_rebase();
    return t_ledger_p != NULL;
}

/* Physical bytes the driver holds for this process now (sim), or how much
 * more this process (and its children) use on device 0 than at
 * t_driver_init (real driver: held.h). */
static inline int64_t t_held(void)
{
    if (t_ledger_p) {
        fabsim_ledger l;
        t_ledger_p(&l);
        return (int64_t)l.bytes_held;
    }
    int whole;
    return t_used_bytes(0, &whole) - t_used0;
}

static inline fabsim_ledger t_ledger(void)
{
    fabsim_ledger l;
    memset(&l, 0, sizeof l);
    if (t_ledger_p)
        t_ledger_p(&l);
    return l;
}

/* Whether the driver holds the same as at ledger b: handles, mappings, reservations, bytes of device and host
 * memory, allocations, exported fds. */
static inline int t_ledger_same(const fabsim_ledger *a, const fabsim_ledger *b)
{
    return a->handles == b->handles && a->mappings == b->mappings && a->reservations == b->reservations &&
           a->bytes_held == b->bytes_held && a->bytes_held_host == b->bytes_held_host &&
           a->bytes_mapped == b->bytes_mapped && a->allocations == b->allocations &&
           a->exported_fds == b->exported_fds;
}

/* fabpool_sleep_state of p, checked. */
static inline fabpool_sleep_info t_sleep_info(fabpool_t *p)
{
    fabpool_sleep_info si;
    memset(&si, 0, sizeof si); /* (not a designated initializer: C++ tests include this file too) */
    si.struct_size = sizeof si;
    CHECK_OK(fabpool_sleep_state(p, &si));
    return si;
}

static inline uint64_t t_mapped(fabpool_t *p)
{
    fabpool_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    fabpool_get_stats(p, &s);
    return s.mapped_bytes;
}

static inline uint64_t t_calls(const fabpool_stats *s, const char *name)
{
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && s->driver_call_names[i]; i++)
        if (strcmp(s->driver_call_names[i], name) == 0)
            return s->driver_calls[i];
    return 0;
}

/* Real driver: what a process uses moves in steps of its own (it counts
 * other allocations of the context too); allow this much slack there. */
static inline int64_t t_slack(void) { return t_ledger_p ? 0 : (int64_t)64 << 20; }

static inline int t_near(int64_t a, int64_t b) { return a - b <= t_slack() && b - a <= t_slack(); }

/* A pool of the default options with a FABPOOL_CONF-syntax string applied (NULL: none); NULL if creation
 * failed (counted as a failed check). */
static inline fabpool_t *t_pool(const char *conf)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = conf;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    return p;
}

/* A block's two ends marked with tag (its first word) and ~tag (its last),
 * and whether they read back so: a block given to two users, or unmapped,
 * fails the check. */
static inline void t_put_tag(void *at, size_t size, uint64_t tag)
{
    uint64_t t2 = ~tag;
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at, &tag, sizeof tag));
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at + size - sizeof t2, &t2, sizeof t2));
}

static inline int t_tag_ok(void *at, size_t size, uint64_t tag)
{
    uint64_t a = 0, b = 0;
    if (cuMemcpyDtoH(&a, (CUdeviceptr)(uintptr_t)at, sizeof a) != CUDA_SUCCESS ||
        cuMemcpyDtoH(&b, (CUdeviceptr)(uintptr_t)at + size - sizeof b, sizeof b) != CUDA_SUCCESS)
        return 0;
    return a == tag && b == ~tag;
}

/* One word written at a device address and synchronized (a copy from
 * pageable memory returns before its DMA has landed; another process sees
 * the data only after a synchronize), and one word read back. */
static inline void t_put_word(void *at, uint64_t v)
{
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at, &v, sizeof v));
    CHECK_CU(cuCtxSynchronize());
}

static inline uint64_t t_get_word(void *at)
{
    uint64_t v = 0;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)at, sizeof v));
    return v;
}

/* The pool's stats (zeros, and a failed check, if the call fails). */
static inline fabpool_stats t_stats(fabpool_t *p)
{
    fabpool_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_OK(fabpool_get_stats(p, &s));
    return s;
}

/* The pool's counters (zeros, and a failed check, if the call fails). */
static inline fabpool_counters t_counters(fabpool_t *p)
{
    fabpool_counters c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    CHECK_OK(fabpool_get_counters(p, &c));
    return c;
}

/* An event recorded on s now: it completes once the work queued on s before it has. */
static inline CUevent t_marker(CUstream s)
{
    CUevent ev = NULL;
    CHECK_CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CHECK_CU(cuEventRecord(ev, s));
    return ev;
}

/* A peer process: `self flag name` started, where name is an abstract socket
 * named after prefix and this process, on which *ls listens and *s is the
 * peer's connection.  The peer's pid, or -1 (a failed check). */
static inline pid_t t_spawn_peer(const char *self, const char *flag, const char *prefix, int *ls, int *s)
{
    char name[64];
    snprintf(name, sizeof name, "%s-%d", prefix, (int)getpid());
    *ls = *s = -1;
    if (fabpool_fd_listen(name, ls) != FABPOOL_OK) {
        CHECK(!"fabpool_fd_listen");
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, flag, name, (char *)NULL);
        _exit(127);
    }
    CHECK_OK(fabpool_fd_accept(*ls, s));
    return pid;
}

/* The sim's fault injection, call counts, stream holds and cold exports (fabsim.h),
 * looked up at run time: every member is NULL where the real driver is
 * loaded. */
typedef struct t_sim_hooks {
    int (*fault_set)(const char *entry, uint64_t nth, int every, int cuda_error);
    void (*fault_clear)(void);
    uint64_t (*calls)(const char *entry);
    int (*hold)(void *stream);
    int (*release)(void *stream);
    int (*hold_long)(void *stream);
    uint64_t (*cold_exports)(void);
    int (*range_mapped)(const void *va, size_t n);
} t_sim_hooks;

static inline t_sim_hooks t_sim_hooks_get(void)
{
    t_sim_hooks h;
    *(void **)&h.fault_set = dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    *(void **)&h.fault_clear = dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    *(void **)&h.calls = dlsym(RTLD_DEFAULT, "fabsim_calls");
    *(void **)&h.hold = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&h.release = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    *(void **)&h.hold_long = dlsym(RTLD_DEFAULT, "fabsim_stream_hold_long");
    *(void **)&h.cold_exports = dlsym(RTLD_DEFAULT, "fabsim_cold_exports");
    *(void **)&h.range_mapped = dlsym(RTLD_DEFAULT, "fabsim_range_mapped");
    return h;
}

/* The driver, and the sim's hooks, for a test that runs only on the simulated driver: where the driver does
 * not start, or is not the sim (its hooks are missing), says what the test needs and exits 77 (the code for a
 * skipped test).  The hooks are looked up, never linked, so that the test loads beside the real driver. */
static inline t_sim_hooks t_sim_required(const char *test, const char *needs)
{
    t_sim_hooks h;
    if (!t_driver_init() || !(h = t_sim_hooks_get()).fault_set || !h.range_mapped) {
        printf("%s: needs the simulated driver (%s); skipped\n", test, needs);
        exit(77);
    }
    return h;
}

#endif
