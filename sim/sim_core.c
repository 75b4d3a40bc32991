/* sim_core.c - the simulated driver's frame: its settings, call counting and
 * fault injection, error names, devices, contexts, streams and events.  It
 * calls nothing of the memory files; cuInit (sim_init.c) sets both up. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
int sim_inited;
int sim_ndev = 1;
uint64_t sim_capacity = 16ull << 30;
int sim_fabric;
int sim_rdma = 1;
uint64_t sim_host_capacity = 64ull << 30;
char sim_machine[24] = "default";
int sim_trace;

/* ------------------------------------------------------------ errors */

static const struct {
    CUresult r;
    const char *name, *desc;
} errors[] = {
#include "sim_errors.inc"
};
#define NERRORS (sizeof errors / sizeof errors[0])

SIM_API CUresult cuGetErrorName(CUresult r, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < NERRORS; i++)
        if (errors[i].r == r) {
            *s = errors[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorString(CUresult r, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < NERRORS; i++)
        if (errors[i].r == r) {
            *s = errors[i].desc;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

int sim_parse_error(const char *name, CUresult *out)
{
    for (size_t i = 0; i < NERRORS; i++)
        if (strcmp(errors[i].name, name) == 0) {
            *out = errors[i].r;
            return 0;
        }
    return -1;
}

/* ------------------------------------------------------------ calls and faults */

static const char *const entry_names[] = {
#define SIM_NAME(n, ver, sym) #n,
    SIM_ENTRIES(SIM_NAME)
#undef SIM_NAME
};

const char *sim_entry_name(int e) { return e >= 0 && e < E_COUNT ? entry_names[e] : "?"; }

static _Atomic uint64_t calls[E_COUNT];
static struct {
    int armed, every;
    uint64_t countdown;
    uint64_t left; /* every: the calls still to fail (0: all of them) */
    CUresult err;
} faults[E_COUNT];

static int entry_index(const char *name)
{
    for (int i = 0; i < E_COUNT; i++)
        if (strcmp(entry_names[i], name) == 0)
            return i;
    return -1;
}

CUresult sim_enter(int e, int needs_init)
{
    atomic_fetch_add_explicit(&calls[e], 1, memory_order_relaxed);
    if (sim_trace)
        fprintf(stderr, "fabsim[%d]: %s\n", (int)getpid(), entry_names[e]);
    if (needs_init && !__atomic_load_n(&sim_inited, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_lock);
    if (faults[e].armed) {
        if (faults[e].countdown > 0 && --faults[e].countdown == 0) {
            r = faults[e].err;
            if (!faults[e].every)
                faults[e].armed = 0;
        } else if (faults[e].countdown == 0 && faults[e].every) {
            r = faults[e].err;
        }
        if (r != CUDA_SUCCESS && faults[e].left && --faults[e].left == 0)
            faults[e].armed = 0;
    }
    pthread_mutex_unlock(&sim_lock);
    if (r != CUDA_SUCCESS && sim_trace)
        fprintf(stderr, "fabsim[%d]: %s fails by injection\n", (int)getpid(), entry_names[e]);
    return r;
}

SIM_API int fabsim_fault_set(const char *entry, uint64_t nth, int every, int cuda_error)
{
    int e = entry ? entry_index(entry) : -1;
    if (e < 0)
        return -1;
    pthread_mutex_lock(&sim_lock);
    faults[e].armed = 1;
    faults[e].every = every != 0;
    faults[e].left = every > 1 ? (uint64_t)every : 0;
    faults[e].countdown = nth;
    faults[e].err = (CUresult)cuda_error;
    pthread_mutex_unlock(&sim_lock);
    return 0;
}

SIM_API void fabsim_fault_clear(void)
{
    pthread_mutex_lock(&sim_lock);
    memset(faults, 0, sizeof faults);
    pthread_mutex_unlock(&sim_lock);
}

SIM_API uint64_t fabsim_calls(const char *entry)
{
    if (!entry) {
        uint64_t s = 0;
        for (int i = 0; i < E_COUNT; i++)
            s += atomic_load(&calls[i]);
        return s;
    }
    int e = entry_index(entry);
    return e < 0 ? 0 : atomic_load(&calls[e]);
}

SIM_API void fabsim_calls_reset(void)
{
    for (int i = 0; i < E_COUNT; i++)
        atomic_store(&calls[i], 0);
}

/* FABSIM_FAULT=name:nth:ERROR[,...]; nth counts calls from process start, '*' = every call */
void sim_parse_faults(const char *spec)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *a = strchr(tok, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        CUresult err;
        if (!a || !b) {
            fprintf(stderr, "fabsim: FABSIM_FAULT entry '%s' is not name:nth:ERROR\n", tok);
            continue;
        }
        *a = *b = '\0';
        int e = entry_index(tok);
        if (e < 0 || sim_parse_error(b + 1, &err)) {
            fprintf(stderr, "fabsim: FABSIM_FAULT: unknown entry '%s' or error '%s'\n", tok, b + 1);
            continue;
        }
        faults[e].armed = 1;
        faults[e].err = err;
        if (strcmp(a + 1, "*") == 0) {
            faults[e].every = 1;
            faults[e].countdown = 0;
        } else {
            uint64_t n = strtoull(a + 1, NULL, 10);
            uint64_t done = atomic_load(&calls[e]);
            faults[e].countdown = n > done ? n - done : 1;
        }
    }
}

SIM_API CUresult cuDriverGetVersion(int *v)
{
    CUresult r = sim_enter(E_cuDriverGetVersion, 0);
    if (r != CUDA_SUCCESS)
        return r;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ devices */

int sim_valid_device(int dev) { return dev >= 0 && dev < sim_ndev; }

SIM_API CUresult cuDeviceGetCount(int *n)
{
    ENTER(cuDeviceGetCount);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = sim_ndev;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    ENTER(cuDeviceGet);
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    ENTER(cuDeviceGetName);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "fabsim simulated GPU %d", d);
    return CUDA_SUCCESS;
}

static CUresult get_uuid(CUuuid *u, CUdevice d)
{
    if (!u)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    memset(u, 0, sizeof *u);
    memcpy(u->bytes, "fabsim-gpu-", 11);
    u->bytes[11] = (char)('0' + d % 10);
    u->bytes[12] = (char)('0' + d / 10);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    ENTER(cuDeviceGetUuid);
    return get_uuid(u, d);
}

SIM_API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
    ENTER(cuDeviceGetUuid);
    return get_uuid(u, d);
}

SIM_API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    ENTER(cuDeviceGetAttribute);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        *v = 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
        *v = sim_rdma; /* H200: both 1; FABSIM_RDMA=0 plays a device without them */
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        *v = 0x9;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *v = 9;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *v = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = 132;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        *v = d;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        *v = 0;
        return CUDA_SUCCESS;
    default:
        if ((int)a <= 0 || (int)a >= (int)CU_DEVICE_ATTRIBUTE_MAX)
            return CUDA_ERROR_INVALID_VALUE;
        *v = 0;
        return CUDA_SUCCESS;
    }
}

SIM_API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
    ENTER(cuDeviceTotalMem);
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    *b = sim_capacity;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d)
{
    size_t v;
    CUresult r = cuDeviceTotalMem_v2(&v, d);
    if (r == CUDA_SUCCESS && b)
        *b = v > 0xffffffffu ? 0xffffffffu : (unsigned)v;
    return r;
}

SIM_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
    ENTER(cuDeviceCanAccessPeer);
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d) || !sim_valid_device(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    *can = d != peer;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ contexts */

#define CTX_MAGIC 0x43545853
static sim_ctx primary[FABSIM_MAX_DEVICES];
static _Thread_local sim_ctx *current;

sim_ctx *sim_current(void) { return current; }

static int valid_ctx(CUcontext c)
{
    sim_ctx *x = (sim_ctx *)c;
    return x >= primary && x < primary + FABSIM_MAX_DEVICES && x->magic == CTX_MAGIC;
}

int sim_ctx_device(CUcontext c) { return c && valid_ctx(c) ? ((sim_ctx *)c)->dev : -1; }

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    ENTER(cuDevicePrimaryCtxRetain);
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_lock);
    if (primary[d].magic != CTX_MAGIC) { /* set once: threads holding the context read them without the lock */
        primary[d].dev = d;
        primary[d].magic = CTX_MAGIC;
    }
    primary[d].retains++;
    pthread_mutex_unlock(&sim_lock);
    *c = (CUcontext)&primary[d];
    return CUDA_SUCCESS;
}

static CUresult ctx_release(CUdevice d)
{
    if (!sim_valid_device(d))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = primary[d].retains > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        primary[d].retains--;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    ENTER(cuDevicePrimaryCtxRelease);
    return ctx_release(d);
}

SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    ENTER(cuDevicePrimaryCtxRelease);
    return ctx_release(d);
}

SIM_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    ENTER(cuDevicePrimaryCtxReset);
    return sim_valid_device(d) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SIM_API CUresult cuDevicePrimaryCtxReset(CUdevice d)
{
    ENTER(cuDevicePrimaryCtxReset);
    return sim_valid_device(d) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SIM_API CUresult cuCtxSetCurrent(CUcontext c)
{
    ENTER(cuCtxSetCurrent);
    if (c && !valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = (sim_ctx *)c;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetCurrent(CUcontext *c)
{
    ENTER(cuCtxGetCurrent);
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = (CUcontext)current;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetDevice(CUdevice *d)
{
    ENTER(cuCtxGetDevice);
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current->dev;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    ENTER(cuCtxPushCurrent);
    if (!valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = (sim_ctx *)c; /* a stack of one is enough for the sim */
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    ENTER(cuCtxPopCurrent);
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c)
        *c = (CUcontext)current;
    current = NULL;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    ENTER(cuCtxEnablePeerAccess);
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_ctx(peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSynchronize(void)
{
    ENTER(cuCtxSynchronize);
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_complete_all();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ streams and events */

#define STREAM_MAGIC 0x5354524d
#define EVENT_MAGIC 0x4556454e

enum { HELD = 1, HELD_LONG = 2 }; /* a stream's hold: completed by a synchronize, or only by its release */

typedef struct sim_stream {
    int magic;
    int held;                 /* 0, HELD or HELD_LONG */
    uint64_t hold_epoch;
    struct sim_stream *next;
} sim_stream;

typedef struct sim_event {
    int magic;
    sim_stream *stream;
    uint64_t epoch;           /* non-zero: pending while stream->hold_epoch == epoch */
    unsigned flags;           /* of cuEventCreate */
    int recorded;
    uint64_t ns;              /* CLOCK_MONOTONIC at the last record: the sim's work is done when issued */
    struct sim_event *next;
} sim_event;

static sim_stream default_stream = {STREAM_MAGIC, 0, 0, NULL};
static sim_stream *streams = &default_stream;
static sim_event *events;
static uint64_t hold_epochs;

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the default stream. */
static sim_stream *get_stream(CUstream s)
{
    if ((uintptr_t)s <= 2)
        return &default_stream;
    for (sim_stream *x = streams; x; x = x->next)
        if (x == (sim_stream *)s)
            return x;
    return NULL;
}

static sim_event *get_event(CUevent e)
{
    for (sim_event *x = events; x; x = x->next)
        if (x == (sim_event *)e)
            return x;
    return NULL;
}

/* Streams held with fabsim_stream_hold_long: a synchronize waits here until their release. */
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;

static int any_held_long(void)
{
    for (sim_stream *x = streams; x; x = x->next)
        if (x->held == HELD_LONG)
            return 1;
    return 0;
}

void sim_complete_all(void)
{
    pthread_mutex_lock(&sim_lock);
    while (any_held_long())
        pthread_cond_wait(&released, &sim_lock);
    for (sim_stream *x = streams; x; x = x->next)
        x->held = 0;
    pthread_mutex_unlock(&sim_lock);
}

static int hold(void *s, int how)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *x = get_stream((CUstream)s);
    if (x) {
        x->held = how;
        x->hold_epoch = ++hold_epochs;
    }
    pthread_mutex_unlock(&sim_lock);
    return x ? 0 : -1;
}

SIM_API int fabsim_stream_hold(void *s) { return hold(s, HELD); }
SIM_API int fabsim_stream_hold_long(void *s) { return hold(s, HELD_LONG); }

SIM_API int fabsim_stream_release(void *s)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *x = get_stream((CUstream)s);
    if (x)
        x->held = 0;
    pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&sim_lock);
    return x ? 0 : -1;
}

static CUresult stream_create(CUstream *s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_stream *x = calloc(1, sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->magic = STREAM_MAGIC;
    pthread_mutex_lock(&sim_lock);
    x->next = streams;
    streams = x;
    pthread_mutex_unlock(&sim_lock);
    *s = (CUstream)x;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
    ENTER(cuStreamCreate);
    (void)flags;
    return stream_create(s);
}

SIM_API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio)
{
    ENTER(cuStreamCreateWithPriority);
    (void)flags, (void)prio;
    return stream_create(s);
}

static CUresult stream_destroy(CUstream s)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *x = (uintptr_t)s <= 2 ? NULL : get_stream(s);
    if (!x) {
        pthread_mutex_unlock(&sim_lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    for (sim_stream **pp = &streams; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    for (sim_event *e = events; e; e = e->next)
        if (e->stream == x)
            e->stream = NULL, e->epoch = 0; /* its work is done */
    pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&sim_lock);
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER(cuStreamDestroy);
    return stream_destroy(s);
}

SIM_API CUresult cuStreamDestroy(CUstream s)
{
    ENTER(cuStreamDestroy);
    return stream_destroy(s);
}

SIM_API CUresult cuStreamSynchronize(CUstream s)
{
    ENTER(cuStreamSynchronize);
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    sim_stream *x;
    while ((x = get_stream(s)) && x->held == HELD_LONG)
        pthread_cond_wait(&released, &sim_lock);
    if (x)
        x->held = 0;
    pthread_mutex_unlock(&sim_lock);
    return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult cuStreamQuery(CUstream s)
{
    ENTER(cuStreamQuery);
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    sim_stream *x = get_stream(s);
    CUresult r = !x ? CUDA_ERROR_INVALID_HANDLE : x->held ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags)
{
    ENTER(cuStreamWaitEvent);
    (void)flags;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    CUresult r = get_stream(s) && get_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    ENTER(cuEventCreate);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_event *x = calloc(1, sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->magic = EVENT_MAGIC;
    x->flags = flags;
    pthread_mutex_lock(&sim_lock);
    x->next = events;
    events = x;
    pthread_mutex_unlock(&sim_lock);
    *e = (CUevent)x;
    return CUDA_SUCCESS;
}

static CUresult event_destroy(CUevent e)
{
    pthread_mutex_lock(&sim_lock);
    sim_event *x = get_event(e);
    if (x)
        for (sim_event **pp = &events; *pp; pp = &(*pp)->next)
            if (*pp == x) {
                *pp = x->next;
                break;
            }
    pthread_mutex_unlock(&sim_lock);
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuEventDestroy_v2(CUevent e)
{
    ENTER(cuEventDestroy);
    return event_destroy(e);
}

SIM_API CUresult cuEventDestroy(CUevent e)
{
    ENTER(cuEventDestroy);
    return event_destroy(e);
}

SIM_API CUresult cuEventRecord(CUevent e, CUstream s)
{
    ENTER(cuEventRecord);
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_lock);
    sim_event *x = get_event(e);
    sim_stream *y = get_stream(s);
    if (x && y) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x->stream = y;
        x->epoch = y->held ? y->hold_epoch : 0;
        x->recorded = 1;
        x->ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    }
    pthread_mutex_unlock(&sim_lock);
    return x && y ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static int pending(const sim_event *x)
{
    return x->epoch && x->stream && x->stream->held && x->stream->hold_epoch == x->epoch;
}

SIM_API CUresult cuEventQuery(CUevent e)
{
    ENTER(cuEventQuery);
    pthread_mutex_lock(&sim_lock);
    sim_event *x = get_event(e);
    CUresult r = !x ? CUDA_ERROR_INVALID_HANDLE : pending(x) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuEventSynchronize(CUevent e)
{
    ENTER(cuEventSynchronize);
    pthread_mutex_lock(&sim_lock);
    sim_event *x;
    while ((x = get_event(e)) && pending(x) && x->stream->held == HELD_LONG)
        pthread_cond_wait(&released, &sim_lock);
    if (x && pending(x))
        x->stream->held = 0; /* the GPU finishes the work */
    pthread_mutex_unlock(&sim_lock);
    return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    sim_event *x = get_event(a), *y = get_event(b);
    CUresult r = CUDA_SUCCESS;
    /* the driver's answers: a missing, unrecorded or timing-disabled event is
     * INVALID_HANDLE; one whose work is pending, NOT_READY */
    if (!x || !y || !x->recorded || !y->recorded || ((x->flags | y->flags) & CU_EVENT_DISABLE_TIMING))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (pending(x) || pending(y))
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)y->ns - (int64_t)x->ns) / 1e6);
    pthread_mutex_unlock(&sim_lock);
    return r;
}

SIM_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    ENTER(cuEventElapsedTime);
    return elapsed(ms, a, b);
}

SIM_API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    ENTER(cuEventElapsedTime);
    return elapsed(ms, a, b);
}
