/* fabpool_replay: runs a recorded fabpool trace (FABPOOL_TRACE) against
 * several allocators, each in a child process of its own, one after the
 * other, and reports for each: latency per operation (median, p99), the peak
 * held by the driver, and driver calls (docs/performance.md, "Replay").
 *
 *   fabpool_replay TRACE[.gz] [--allocators fabpool,cudaMallocAsync,torch_default,torch_expandable]
 *                  [--level auto|app|pool] [--sample N] [--fabpool-conf STR] [--device N]
 *                  [--json FILE] [--check [--max-held R]] [--pace] [--gpu-lag N]
 *
 * (--help says what each option does; exit 1 when the trace is refused, no
 * allocator could run or a --check failed, 2 for a wrong command line.)
 *
 * What is replayed: by default (--level auto) the application's calls, as
 * it made them (trace_rec_app: in a trace that marks them, every public call
 * of the program, whatever the mix of fabpool_alloc / fabpool_free, the
 * stream-ordered pair with its streams, buffers and trims; in one that does
 * not, an adapter's app_alloc / app_free and the buffers), where the trace
 * says which they are; else (--level pool) every alloc / free that reached
 * the pool.  Buffer records (fabpool_buffer_*) are replayed at both
 * levels: as fabpool buffers for fabpool, and as allocate-new / free-old for
 * the others (what HybridEP and PyTorch users do: a resize to another size is
 * an allocation of the new size and a free of the old block, no copy timed).
 * Every stream the trace names becomes a stream of its own, created at the
 * start of the replay (the NULL stream stays NULL).  No GPU work is queued:
 * the replay measures the allocators, not kernels.  What the trace left live
 * at its end is freed after the timed part.
 *
 * Peak held by the driver: cuMemGetInfo (device used less the baseline taken
 * after the allocator started), sampled before the first operation and every
 * --sample operations (default 16) outside the timed calls; on the simulated
 * driver, its ledger of bytes held.  The allocator's own peak is shown beside
 * it (fabpool: mapped_bytes_peak; cudaMallocAsync: the pool's
 * RESERVED_MEM_HIGH; PyTorch: reserved_bytes peak).  Driver calls: fabpool's
 * counters of every driver call; cudaMallocAsync: the cuMemAllocAsync /
 * cuMemFreeAsync / trim calls the replay made; PyTorch: num_device_alloc +
 * num_device_free (cudaMalloc / cudaFree, or maps and unmaps with expandable
 * segments).
 *
 * FABPOOL_REPLAY_PEAK=1 in the environment: fabpool's stats at each sample, and on stderr what it held at its
 * held peak and at its in-use peak: blocks in use (of them slab blocks), free slab blocks, free large ranges,
 * retiring, pending on streams (use --sample 1 to catch the exact peaks).
 *
 * --pace: each operation waits for its time stamp (the trace's own timing, so that
 * time-based policies such as fabpool's decay_ms act as they did when it was
 * recorded; the replay then takes as long as the recording).  The maps in the
 * second half of the operations are reported apart (the steady state).
 *
 * fabpool at the application's level is called as the program called it:
 * fabpool_alloc_on_stream / fabpool_free_on_stream on the recorded streams
 * for app_alloc / app_free (a free on the stream the program gave it), and
 * fabpool_alloc / fabpool_free for the plain pair.
 * --gpu-lag N (the simulated driver only): the GPU runs behind the CPU.
 * Every stream is held (its events do not complete) and released and held
 * again every N operations, so what is freed on a stream waits as it would
 * for queued kernels; a synchronize (a fence, a wait) completes a stream at
 * once, as on the GPU.  The training trace has about 1,550 operations a
 * step.  Without it the sim's streams are always done.
 *
 * --check: exit 1 unless every allocator asked for ran, every allocation,
 * buffer creation and resize that succeeded in the trace succeeded in the
 * replay, and fabpool has no live byte, block or buffer once the replay freed
 * what the trace left live and the blocks freed on streams went back to the
 * pool (fabpool_collect, waiting) (on the simulated driver: nothing held after
 * its pool is destroyed).  --max-held R (with --check): and fabpool's peak
 * held at most R times the trace's live peak.  Times mean something only on a
 * real GPU.
 *
 * FABPOOL_REPLAY_DROP_FREES=N in the environment: fabpool's replay leaves out
 * the trace's first N frees, and frees those blocks at no point: a leak made
 * on purpose, which --check must report (the test of the check). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/base/json.h"
#include "cli.h"
#include "fabpool.h"
#include "trace_file.h"
#include "torch_load.h"

/* ------------------------------------------------------------ the ops */

enum { R_ALLOC, R_FREE, R_BCREATE, R_BRESIZE, R_BDESTROY, R_TRIM, R_EMPTY, R_NKINDS };
static const char *const kind_name[R_NKINDS] = {"alloc", "free", "buffer_create", "buffer_resize",
                                                "buffer_destroy", "trim", "empty_cache"};

typedef struct rop {
    uint8_t kind;
    uint8_t plain;    /* at the application's level: fabpool_alloc / fabpool_free, not the stream-ordered pair */
    uint16_t stream;  /* index into streams; 0 = NULL */
    uint32_t obj;     /* object index (blocks and buffers) */
    uint64_t size;    /* alloc / buffer size; trim: keep */
    uint64_t max;     /* buffer create: max_size */
    uint64_t t;       /* the record's time stamp (ns since the trace began): --pace */
} rop;

typedef struct plan {
    rop *ops;
    size_t n;
    uint32_t n_objs;
    unsigned n_streams;   /* streams[1..n_streams-1] are real ones */
    uint64_t live_peak;   /* bytes of the level replayed + buffers */
    uint64_t skipped_failed, skipped_unknown;
    int app;
} plan;

#define MAX_STREAMS 256

static int build_plan(const trace_data *d, int level_app, plan *pl, char *err, size_t cap)
{
    memset(pl, 0, sizeof *pl);
    pl->app = level_app;
    pl->ops = malloc((d->n ? d->n : 1) * sizeof *pl->ops);
    uint64_t *obj_size = NULL;
    u64map live = {0}, streams = {0};
    if (!pl->ops)
        goto nomem;
    size_t obj_cap = 0;
    pl->n_streams = 1;
    uint64_t bytes = 0;
    for (size_t i = 0; i < d->n; i++) {
        const fabpool_trace_rec *r = &d->recs[i];
        /* the level's records: the application's calls, or all that reached the pool */
        if (level_app && !trace_rec_app(d, r))
            continue;
        int plain = r->op == FABPOOL_TR_ALLOC || r->op == FABPOOL_TR_FREE;
        int is_alloc = r->op == FABPOOL_TR_ALLOC || (level_app && r->op == FABPOOL_TR_APP_ALLOC);
        int is_free = r->op == FABPOOL_TR_FREE || (level_app && r->op == FABPOOL_TR_APP_FREE);
        int is_buf = r->op == FABPOOL_TR_BUF_CREATE || r->op == FABPOOL_TR_BUF_RESIZE || r->op == FABPOOL_TR_BUF_DESTROY;
        int is_trim = r->op == FABPOOL_TR_TRIM;
        int is_empty = level_app && r->op == FABPOOL_TR_APP_EMPTY;
        if (!is_alloc && !is_free && !is_buf && !is_trim && !is_empty)
            continue;
        rop o = {0};
        o.t = r->t_ns;
        o.plain = (uint8_t)(plain && level_app);
        uint64_t stream = (r->op == FABPOOL_TR_APP_ALLOC || r->op == FABPOOL_TR_APP_FREE || r->op == FABPOOL_TR_BUF_RESIZE ||
                           r->op == FABPOOL_TR_BUF_DESTROY) ? r->arg : 0;
        if (stream) {
            uint64_t si = 0;
            if (!u64map_get(&streams, stream, &si)) {
                if (pl->n_streams >= MAX_STREAMS) {
                    snprintf(err, cap, "the trace names more than %d streams", MAX_STREAMS - 1);
                    goto fail;
                }
                si = pl->n_streams++;
                if (u64map_put(&streams, stream, si))
                    goto nomem;
            }
            o.stream = (uint16_t)si;
        }
        uint64_t obj = 0;
        if (is_alloc || r->op == FABPOOL_TR_BUF_CREATE) {
            if (r->status != FABPOOL_TRACE_STATUS_UNKNOWN && r->status != FABPOOL_OK) {
                pl->skipped_failed++;
                continue;
            }
            if (pl->n_objs == UINT32_MAX) { /* an object's index is 32 bits (rop.obj) */
                snprintf(err, cap, "the trace gives out more than %u blocks and buffers", UINT32_MAX - 1);
                goto fail;
            }
            if (pl->n_objs == obj_cap) {
                obj_cap = obj_cap ? obj_cap * 2 : 4096;
                uint64_t *ns = realloc(obj_size, obj_cap * sizeof *ns);
                if (!ns)
                    goto nomem;
                obj_size = ns;
            }
            obj = pl->n_objs++;
            obj_size[obj] = r->size;
            if (u64map_put(&live, r->ptr, obj + 1))
                goto nomem;
            o.kind = is_alloc ? R_ALLOC : R_BCREATE;
            o.size = r->size;
            o.max = r->op == FABPOOL_TR_BUF_CREATE ? (r->arg ? r->arg : r->size) : 0;
            if (r->size > UINT64_MAX - bytes)
                goto too_many;
            bytes += r->size;
        } else if (is_free || r->op == FABPOOL_TR_BUF_DESTROY) {
            uint64_t v = 0;
            if (!u64map_del(&live, r->ptr, &v)) {
                pl->skipped_unknown++;
                continue;
            }
            obj = v - 1;
            o.kind = is_free ? R_FREE : R_BDESTROY;
            bytes -= obj_size[obj];
        } else if (r->op == FABPOOL_TR_BUF_RESIZE) {
            uint64_t v = 0;
            if (!u64map_get(&live, r->ptr, &v)) {
                pl->skipped_unknown++;
                continue;
            }
            obj = v - 1;
            o.kind = R_BRESIZE;
            o.size = r->size;
            bytes -= obj_size[obj]; /* obj_size[] of the live objects adds up to bytes */
            if (r->size > UINT64_MAX - bytes)
                goto too_many;
            bytes += r->size;
            obj_size[obj] = r->size;
            if (r->size == 0) /* a buffer left without a byte by a lost chunk (FABPOOL_ERR_PARTIAL): no resize asks
                               * 0, and the next one grows it from the size the replay has */
                continue;
        } else {
            o.kind = is_trim ? R_TRIM : R_EMPTY;
            o.size = is_trim ? r->size : 0;
        }
        o.obj = (uint32_t)obj;
        if (bytes > pl->live_peak)
            pl->live_peak = bytes;
        pl->ops[pl->n++] = o;
    }
    free(obj_size);
    u64map_free(&live);
    u64map_free(&streams);
    return 0;
too_many:
    snprintf(err, cap, "the trace's live blocks and buffers add up to more bytes than 64 bits count");
    goto fail;
nomem:
    snprintf(err, cap, "no host memory to plan the replay");
fail:
    free(obj_size);
    free(pl->ops);
    pl->ops = NULL;
    u64map_free(&live);
    u64map_free(&streams);
    return -1;
}

/* ------------------------------------------------------------ driver */

static struct {
    CUresult (*init)(unsigned);
    CUresult (*dev_get)(CUdevice *, int);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*ctx_sync)(void);
    CUresult (*meminfo)(size_t *, size_t *);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_set)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_get)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_trim)(CUmemoryPool, size_t);
    int (*ledger)(void *);
    int (*hold)(void *), (*release)(void *); /* the simulated driver's stream holds (--gpu-lag) */
    CUdevice dev;
    CUcontext ctx;
} cu;

typedef struct sim_ledger { /* fabsim_ledger's first fields (sim/fabsim.h); room to spare for the fields the
                               sim adds later (it fills the whole struct: a copy too small was overwritten) */
    uint64_t handles, allocations, mappings, reservations, exported_fds, bytes_held, bytes_mapped;
    uint64_t rest[256];
} sim_ledger;

static int load_driver(int device, char *err, size_t cap)
{
    const char *path = getenv("FABPOOL_CUDA_LIBRARY");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *l = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l) {
        snprintf(err, cap, "cannot load the driver %s: %s%s", path, dlerror(), cli_sim_hint());
        return -1;
    }
#define SYM(f, n) *(void **)&cu.f = dlsym(l, n)
    SYM(init, "cuInit");
    SYM(dev_get, "cuDeviceGet");
    SYM(ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(ctx_sync, "cuCtxSynchronize");
    SYM(meminfo, "cuMemGetInfo_v2");
    SYM(stream_create, "cuStreamCreate");
    SYM(stream_destroy, "cuStreamDestroy_v2");
    SYM(stream_sync, "cuStreamSynchronize");
    SYM(alloc_async, "cuMemAllocAsync");
    SYM(free_async, "cuMemFreeAsync");
    SYM(default_pool, "cuDeviceGetDefaultMemPool");
    SYM(pool_set, "cuMemPoolSetAttribute");
    SYM(pool_get, "cuMemPoolGetAttribute");
    SYM(pool_trim, "cuMemPoolTrimTo");
    SYM(ledger, "fabsim_get_ledger");
    SYM(hold, "fabsim_stream_hold");
    SYM(release, "fabsim_stream_release");
#undef SYM
    if (!cu.init || !cu.dev_get || !cu.ctx_retain || !cu.ctx_set || !cu.meminfo || !cu.stream_create ||
        !cu.stream_sync || !cu.ctx_sync) {
        snprintf(err, cap, "the driver %s lacks an entry point the replay needs", path);
        return -1;
    }
    CUresult r;
    if ((r = cu.init(0)) || (r = cu.dev_get(&cu.dev, device)) || (r = cu.ctx_retain(&cu.ctx, cu.dev)) ||
        (r = cu.ctx_set(cu.ctx))) {
        snprintf(err, cap, "the driver %s does not start on device %d (CUresult %d)%s", path, device, (int)r,
                 cli_sim_hint());
        return -1;
    }
    return 0;
}

/* What the driver holds: the sim's ledger, else the device's used memory. */
static uint64_t driver_held(void)
{
    if (cu.ledger) {
        sim_ledger l;
        memset(&l, 0, sizeof l);
        cu.ledger(&l);
        return l.bytes_held;
    }
    size_t f = 0, t = 0;
    if (cu.meminfo(&f, &t) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(t - f);
}

static int pace; /* --pace: follow the trace's time stamps */
static size_t gpu_lag; /* --gpu-lag N: on the sim, every stream's work completes only every N operations */

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* ------------------------------------------------------------ allocators */

enum { A_FABPOOL, A_ASYNC, A_TORCH, A_TORCH_EXP, A_N };
static const char *const a_key[A_N] = {"fabpool", "cudaMallocAsync", "torch_default", "torch_expandable"};

typedef struct rres {
    int ran;                     /* 1: ran; 0: could not (error says why) */
    char error[1024];
    uint64_t ops, failures, first_failure;
    uint64_t count[R_NKINDS];
    double med[R_NKINDS], p99[R_NKINDS];
    double seconds;
    uint64_t held_base, held_peak;       /* driver: baseline, and peak less baseline */
    uint64_t own_peak;                   /* allocator's own peak; UINT64_MAX unknown */
    uint64_t calls;                      /* driver calls; UINT64_MAX unknown */
    uint64_t maps;                       /* physical allocations / maps; UINT64_MAX unknown */
    uint64_t maps_late;                  /* of those, in the second half of the operations (steady state) */
    uint64_t left_live;                  /* objects the trace left live, freed after the timed part */
    uint64_t live_end;                   /* fabpool: in_use bytes after that and a collect; UINT64_MAX n/a */
    uint64_t live_blocks_end, live_buffers_end; /* fabpool: blocks and buffers live then */
    uint64_t held_after;                 /* sim: bytes held after the allocator is gone; UINT64_MAX n/a */
    int sim;                             /* ran on the simulated driver */
    char calls_what[120];
} rres;

/* PyTorch's allocator (libfabpool_bench_torch.so, perf/torch_backend.cpp) */
static fbt_api tb;

static int load_torch(char *err, size_t cap)
{
    return fbt_load(NULL, &tb, err, cap);
}

typedef struct replay_state {
    int kind;
    fabpool_t *pool;
    CUmemoryPool mp;
    uint64_t own_calls;
    CUstream streams[MAX_STREAMS];
    void **ptr;           /* per object: block (or buffer base for the others) */
    fabpool_buffer_t **buf;
    uint16_t *obj_stream; /* the stream of the block's allocation */
    int stream_pair;      /* fabpool at the application's level: fabpool_alloc_on_stream / free_on_stream for
                             its app_alloc / app_free, as it called them */
    uint64_t drop_frees;  /* FABPOOL_REPLAY_DROP_FREES: frees still to leave out */
} replay_state;

/* pair: fabpool's stream-ordered pair (at the application's level), else fabpool_alloc / fabpool_free */
static int x_alloc(replay_state *s, size_t n, unsigned si, int pair, void **p)
{
    CUstream st = s->streams[si];
    switch (s->kind) {
    case A_FABPOOL:
        return (pair ? fabpool_alloc_on_stream(s->pool, n, (void *)st, p) : fabpool_alloc(s->pool, n, p)) == FABPOOL_OK
                       ? 0 : -1;
    case A_ASYNC: {
        CUdeviceptr d = 0;
        s->own_calls++;
        if (cu.alloc_async(&d, n, st) != CUDA_SUCCESS) {
            /* out of memory with the pool's cache full: give it back, once more */
            s->own_calls += 2;
            cu.ctx_sync();
            cu.pool_trim(s->mp, 0);
            s->own_calls++;
            if (cu.alloc_async(&d, n, st) != CUDA_SUCCESS)
                return -1;
        }
        *p = (void *)(uintptr_t)d;
        return 0;
    }
    default:
        return tb.alloc_stream(n, (void *)st, p, NULL, 0);
    }
}

static int x_free(replay_state *s, void *p, unsigned si, int pair)
{
    switch (s->kind) {
    case A_FABPOOL:
        return (pair ? fabpool_free_on_stream(s->pool, p, (void *)s->streams[si]) : fabpool_free(s->pool, p)) ==
                       FABPOOL_OK ? 0 : -1;
    case A_ASYNC:
        s->own_calls++;
        return cu.free_async((CUdeviceptr)(uintptr_t)p, s->streams[si]) == CUDA_SUCCESS ? 0 : -1;
    default:
        tb.del(p);
        return 0;
    }
}

static void x_trim(replay_state *s, uint64_t keep)
{
    switch (s->kind) {
    case A_FABPOOL:
        fabpool_trim(s->pool, keep);
        break;
    case A_ASYNC:
        s->own_calls += 2;
        cu.ctx_sync();
        cu.pool_trim(s->mp, keep);
        break;
    default:
        tb.empty_cache();
        break;
    }
}

/* One op; returns 0 or -1 (failed). */
static int do_op(replay_state *s, const rop *o)
{
    void *p = NULL;
    switch (o->kind) {
    case R_ALLOC:
        if (x_alloc(s, o->size, o->stream, s->stream_pair && !o->plain, &p))
            return -1;
        s->ptr[o->obj] = p;
        s->obj_stream[o->obj] = o->stream;
        return 0;
    case R_FREE:
        if (!s->ptr[o->obj])
            return 0; /* its allocation failed in the replay: counted there */
        p = s->ptr[o->obj];
        s->ptr[o->obj] = NULL;
        if (s->drop_frees) { /* a leak on purpose: the block stays the replay's, never freed */
            s->drop_frees--;
            return 0;
        }
        /* on the stream the program gave the free (the PyTorch shim gives the allocation's); a plain free and
         * the pool's level name none */
        return x_free(s, p, o->stream, s->stream_pair && !o->plain);
    case R_BCREATE:
        if (s->kind == A_FABPOOL) {
            if (fabpool_buffer_create(s->pool, o->max, o->size, &s->buf[o->obj]) != FABPOOL_OK)
                return -1;
            s->ptr[o->obj] = fabpool_buffer_ptr(s->buf[o->obj]);
            return 0;
        }
        if (x_alloc(s, o->size, 0, 0, &p))
            return -1;
        s->ptr[o->obj] = p;
        s->obj_stream[o->obj] = 0;
        return 0;
    case R_BRESIZE:
        if (!s->ptr[o->obj])
            return -1;
        if (s->kind == A_FABPOOL)
            return fabpool_buffer_resize(s->buf[o->obj], o->size, (void *)s->streams[o->stream]) == FABPOOL_OK ? 0
                                                                                                            : -1;
        /* allocate the new size, free the old block */
        if (x_alloc(s, o->size, o->stream, 0, &p))
            return -1;
        x_free(s, s->ptr[o->obj], s->obj_stream[o->obj], 0);
        s->ptr[o->obj] = p;
        s->obj_stream[o->obj] = o->stream;
        return 0;
    case R_BDESTROY:
        if (!s->ptr[o->obj])
            return 0;
        p = s->ptr[o->obj];
        s->ptr[o->obj] = NULL;
        if (s->kind == A_FABPOOL) {
            fabpool_status st = fabpool_buffer_destroy(s->buf[o->obj], (void *)s->streams[o->stream]);
            s->buf[o->obj] = NULL;
            return st == FABPOOL_OK ? 0 : -1;
        }
        return x_free(s, p, s->obj_stream[o->obj], 0);
    case R_TRIM:
        x_trim(s, o->size);
        return 0;
    case R_EMPTY:
        x_trim(s, 0);
        return 0;
    }
    return 0;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static uint64_t fab_calls(fabpool_t *pool, uint64_t *maps)
{
    static fabpool_stats st = {.struct_size = sizeof st};
    if (fabpool_get_stats(pool, &st) != FABPOOL_OK)
        return UINT64_MAX;
    uint64_t n = 0;
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS; i++)
        n += st.driver_calls[i];
    if (maps)
        *maps = st.chunks_mapped_total;
    return n;
}

/* What one allocator's run keeps from one step to the next. */
typedef struct run {
    replay_state s;
    fabpool_stats *fst;                        /* fabpool: its stats, read after the timed part */
    uint64_t calls0, maps0, dallocs0, dfrees0; /* the allocator's counts before the replay */
    float *lat[R_NKINDS];                      /* ns of each operation, by kind */
    uint64_t done[R_NKINDS];
    uint64_t peak;                             /* driver held less its baseline, at the samples */
    uint64_t maps_mid;                         /* maps at half of the operations (UINT64_MAX: not read) */
    /* FABPOOL_REPLAY_PEAK: fabpool's stats at its held peak [0] and at its in-use peak [2] ([1]: the last) */
    fabpool_stats *detail;
    size_t detail_at, detail_live_at;
    int lag;                                   /* --gpu-lag on a driver that can hold streams */
} run;

static int start_fabpool(run *x, int device, const char *fconf, rres *r)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.device = device;
    o.conf = fconf;
    if (fabpool_create(&o, &x->s.pool) != FABPOOL_OK) {
        snprintf(r->error, sizeof r->error, "fabpool_create: %s", fabpool_last_error());
        return -1;
    }
    x->fst = calloc(1, sizeof *x->fst);
    if (!x->fst) {
        snprintf(r->error, sizeof r->error, "no host memory");
        return -1;
    }
    x->fst->struct_size = sizeof *x->fst;
    snprintf(r->calls_what, sizeof r->calls_what, "every driver call of the pool (its counters)");
    return 0;
}

static int start_async(run *x, rres *r)
{
    if (!cu.alloc_async || !cu.free_async || !cu.default_pool || !cu.pool_set || !cu.pool_trim ||
        cu.default_pool(&x->s.mp, cu.dev) != CUDA_SUCCESS) {
        snprintf(r->error, sizeof r->error, "the driver has no stream-ordered allocator");
        return -1;
    }
    cuuint64_t thr = UINT64_MAX; /* keep freed memory: what a tuned cudaMallocAsync user does */
    cu.pool_set(x->s.mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
    cuuint64_t zero = 0;
    if (cu.pool_get)
        cu.pool_set(x->s.mp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
    snprintf(r->calls_what, sizeof r->calls_what, "cuMemAllocAsync / cuMemFreeAsync / trim calls made");
    return 0;
}

static int start_torch(run *x, int kind, rres *r)
{
    const char *conf = kind == A_TORCH_EXP ? "expandable_segments:True" : NULL;
    if (conf) {
        setenv("PYTORCH_CUDA_ALLOC_CONF", conf, 1);
        setenv("PYTORCH_ALLOC_CONF", conf, 1);
    } else {
        unsetenv("PYTORCH_CUDA_ALLOC_CONF");
        unsetenv("PYTORCH_ALLOC_CONF");
    }
    if (load_torch(r->error, sizeof r->error))
        return -1;
    tb.device_calls(&x->dallocs0, &x->dfrees0);
    snprintf(r->calls_what, sizeof r->calls_what, "num_device_alloc + num_device_free (%s)",
             kind == A_TORCH_EXP ? "maps and unmaps" : "cudaMalloc and cudaFree");
    return 0;
}

/* The trace's streams, the objects' tables and room for every latency. */
static int make_tables(run *x, const plan *pl, rres *r)
{
    for (unsigned i = 1; i < pl->n_streams; i++)
        if (cu.stream_create(&x->s.streams[i], 0) != CUDA_SUCCESS) {
            snprintf(r->error, sizeof r->error, "cuStreamCreate failed for stream %u of %u", i, pl->n_streams - 1);
            return -1;
        }
    size_t nobj = pl->n_objs ? pl->n_objs : 1;
    x->s.ptr = calloc(nobj, sizeof *x->s.ptr);
    x->s.buf = calloc(nobj, sizeof *x->s.buf);
    x->s.obj_stream = calloc(nobj, sizeof *x->s.obj_stream);
    uint64_t cnt[R_NKINDS] = {0};
    for (size_t i = 0; i < pl->n; i++)
        cnt[pl->ops[i].kind]++;
    int nomem = !x->s.ptr || !x->s.buf || !x->s.obj_stream;
    for (int k = 0; k < R_NKINDS; k++)
        if (!(x->lat[k] = malloc((cnt[k] ? cnt[k] : 1) * sizeof(float))))
            nomem = 1;
    if (nomem) {
        snprintf(r->error, sizeof r->error, "no host memory for the replay's tables");
        return -1;
    }
    return 0;
}

/* --pace: waits for operation o's time stamp, counted from t_all */
static void pace_to(double t_all, const rop *o, const plan *pl)
{
    double due = t_all + (double)(o->t - pl->ops[0].t);
    double now;
    while ((now = now_ns()) < due) {
        double left = due - now;
        struct timespec ts = {(time_t)(left / 1e9), (long)((uint64_t)left % 1000000000ull)};
        if (left > 200e3)
            nanosleep(&ts, NULL);
    }
}

/* the steady state's maps: counted from half of the operations on */
static void mark_half(run *x)
{
    if (x->s.kind == A_FABPOOL) {
        fab_calls(x->s.pool, &x->maps_mid);
    } else if (x->s.kind != A_ASYNC) {
        uint64_t a = 0, f = 0;
        tb.device_calls(&a, &f);
        x->maps_mid = a;
    }
}

/* what the driver holds now, after operation i; with FABPOOL_REPLAY_PEAK, fabpool's stats at the peaks */
static void sample_held(run *x, size_t i, uint64_t base)
{
    uint64_t h = driver_held();
    if (h > base && h - base > x->peak) {
        x->peak = h - base;
        if (x->detail && fabpool_get_stats(x->s.pool, x->detail) == FABPOOL_OK)
            x->detail_at = i;
    }
    if (x->detail && fabpool_get_stats(x->s.pool, &x->detail[1]) == FABPOOL_OK &&
        x->detail[1].in_use_bytes > x->detail[2].in_use_bytes) {
        x->detail[2] = x->detail[1];
        x->detail_live_at = i;
    }
}

/* The timed part: every operation of the plan, in order. */
static void replay_ops(run *x, const plan *pl, int sample, rres *r)
{
    int since = 0;
    double t_all = now_ns();
    for (size_t i = 0; i < pl->n; i++) {
        const rop *o = &pl->ops[i];
        if (i == pl->n / 2)
            mark_half(x);
        if (pace) /* the trace's own timing: time-based policies (fabpool's decay) act as they did */
            pace_to(t_all, o, pl);
        if (x->lag && i % gpu_lag == 0) /* the GPU catches up with what was queued so far, then lags again */
            for (unsigned k = 0; k < pl->n_streams; k++) {
                cu.release((void *)x->s.streams[k]);
                cu.hold((void *)x->s.streams[k]);
            }
        double t0 = now_ns();
        int bad = do_op(&x->s, o);
        double t1 = now_ns();
        x->lat[o->kind][x->done[o->kind]++] = (float)(t1 - t0);
        if (bad) {
            if (!r->failures)
                r->first_failure = i;
            r->failures++;
        }
        if (++since >= sample) {
            since = 0;
            sample_held(x, i, r->held_base);
        }
    }
    r->seconds = (now_ns() - t_all) / 1e9;
}

/* FABPOOL_REPLAY_PEAK: what fabpool held at its held peak and at its in-use peak */
static void print_peak_detail(const run *x)
{
    for (int w = 0; x->detail && w < 2; w++) {
        const fabpool_stats *d = &x->detail[w * 2];
        uint64_t slab_free = 0, slab_used = 0;
        for (int c = 0; c < FABPOOL_NUM_CLASSES && d->classes[c].size; c++)
            if (d->classes[c].slabs) {
                slab_free += d->classes[c].cached * d->classes[c].size;
                slab_used += d->classes[c].in_use * d->classes[c].size;
            }
        fprintf(stderr, "fabpool at its %s (operation %zu): mapped %.1f MiB = in use %.1f MiB (slab blocks %.1f) + "
                "cached %.1f MiB (free slab blocks %.1f, free large ranges and the rest %.1f) + retiring %.1f MiB; "
                "pending on streams %.1f MiB\n", w ? "in-use peak" : "held peak", w ? x->detail_live_at : x->detail_at,
                d->mapped_bytes / 1048576.0, d->in_use_bytes / 1048576.0, slab_used / 1048576.0,
                d->cached_bytes / 1048576.0, slab_free / 1048576.0, (d->cached_bytes - slab_free) / 1048576.0,
                d->retiring_bytes / 1048576.0, d->stream_pending_bytes / 1048576.0);
    }
}

/* median and p99 of each kind's latencies */
static void take_latencies(run *x, rres *r)
{
    for (int k = 0; k < R_NKINDS; k++) {
        uint64_t n = x->done[k];
        r->count[k] = n;
        if (n) {
            qsort(x->lat[k], n, sizeof(float), cmp_f);
            r->med[k] = x->lat[k][n / 2];
            size_t q = (size_t)((double)n * 0.99 + 0.999999);
            r->p99[k] = x->lat[k][q ? q - 1 : 0];
        }
        free(x->lat[k]);
    }
}

/* the allocator's own figures: its peak, its driver calls and maps over the replay */
static void own_figures(run *x, rres *r)
{
    if (x->s.kind == A_FABPOOL) {
        uint64_t maps = 0;
        r->calls = fab_calls(x->s.pool, &maps) - x->calls0;
        r->maps = maps - x->maps0;
        if (x->maps_mid != UINT64_MAX)
            r->maps_late = maps - x->maps_mid;
        if (fabpool_get_stats(x->s.pool, x->fst) == FABPOOL_OK)
            r->own_peak = x->fst->mapped_bytes_peak;
    } else if (x->s.kind == A_ASYNC) {
        r->calls = x->s.own_calls;
        cuuint64_t high = 0;
        if (cu.pool_get && cu.pool_get(x->s.mp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high) == CUDA_SUCCESS)
            r->own_peak = high;
    } else {
        uint64_t cur = 0, pk = 0, a = 0, f = 0;
        tb.reserved(&cur, &pk);
        r->own_peak = pk;
        tb.device_calls(&a, &f);
        r->calls = (a - x->dallocs0) + (f - x->dfrees0);
        r->maps = a - x->dallocs0;
        if (x->maps_mid != UINT64_MAX)
            r->maps_late = a - x->maps_mid;
    }
}

/* what the trace left live goes, after the timed part */
static void free_left_live(run *x, const plan *pl, rres *r)
{
    replay_state *s = &x->s;
    for (uint32_t i = 0; i < pl->n_objs; i++) {
        if (!s->ptr[i])
            continue;
        r->left_live++;
        if (s->kind == A_FABPOOL && s->buf[i])
            fabpool_buffer_destroy(s->buf[i], NULL);
        else
            x_free(s, s->ptr[i], s->obj_stream[i], s->stream_pair);
        s->ptr[i] = NULL;
    }
    cu.ctx_sync();
}

/* fabpool: what stays live once everything is freed, then the pool goes; the others give their cache back */
static void stop_allocator(run *x, const plan *pl, rres *r)
{
    if (x->s.kind == A_FABPOOL) {
        /* blocks freed on a stream that does not own the pool wait in its queue for the stream's work (no call
         * of the replay made the pool poll them, and the replay queues no work): they are not live, so they go
         * back to the pool first; what stays counted is what the replay did not free */
        if (fabpool_collect(x->s.pool, 1) != FABPOOL_OK)
            snprintf(r->error, sizeof r->error, "fabpool_collect: %s", fabpool_last_error());
        if (fabpool_get_stats(x->s.pool, x->fst) == FABPOOL_OK) {
            r->live_end = x->fst->in_use_bytes;
            r->live_blocks_end = x->fst->blocks;
            r->live_buffers_end = x->fst->buffers;
        }
        fabpool_status st = fabpool_destroy(x->s.pool);
        if (st != FABPOOL_OK)
            snprintf(r->error, sizeof r->error, "fabpool_destroy: %s", fabpool_last_error());
        if (cu.ledger)
            r->held_after = driver_held();
        free(x->fst);
    } else if (x->s.kind == A_ASYNC) {
        cu.pool_trim(x->s.mp, 0);
    } else {
        tb.empty_cache();
    }
    for (unsigned i = 1; i < pl->n_streams; i++)
        if (cu.stream_destroy)
            cu.stream_destroy(x->s.streams[i]);
    free(x->s.ptr);
    free(x->s.buf);
    free(x->s.obj_stream);
}

/* The child's whole run for one allocator. */
static void run_child(int kind, const plan *pl, int device, int sample, const char *fconf, rres *r)
{
    memset(r, 0, sizeof *r);
    r->own_peak = r->calls = r->maps = r->maps_late = r->live_end = r->held_after = UINT64_MAX;
    if (load_driver(device, r->error, sizeof r->error))
        return;
    r->sim = cu.ledger != NULL;
    static run x;
    memset(&x, 0, sizeof x);
    x.s.kind = kind;
    x.maps_mid = UINT64_MAX;
    int bad = kind == A_FABPOOL ? start_fabpool(&x, device, fconf, r)
              : kind == A_ASYNC ? start_async(&x, r)
                                : start_torch(&x, kind, r);
    if (bad || make_tables(&x, pl, r))
        return;
    if (kind == A_FABPOOL)
        x.calls0 = fab_calls(x.s.pool, &x.maps0);
    x.s.stream_pair = kind == A_FABPOOL && pl->app;
    const char *drop = getenv("FABPOOL_REPLAY_DROP_FREES");
    if (kind == A_FABPOOL && drop)
        x.s.drop_frees = strtoull(drop, NULL, 10);
    x.lag = gpu_lag && cu.hold && cu.release;
    r->held_base = driver_held();
    x.detail = getenv("FABPOOL_REPLAY_PEAK") && x.s.pool ? calloc(3, sizeof *x.detail) : NULL;
    for (int k = 0; x.detail && k < 3; k++)
        x.detail[k].struct_size = sizeof x.detail[k];

    replay_ops(&x, pl, sample, r);

    print_peak_detail(&x);
    free(x.detail);
    if (x.lag)
        for (unsigned k = 0; k < pl->n_streams; k++)
            cu.release((void *)x.s.streams[k]);
    uint64_t h = driver_held();
    if (h > r->held_base && h - r->held_base > x.peak)
        x.peak = h - r->held_base;
    r->held_peak = x.peak;
    r->ops = pl->n;
    take_latencies(&x, r);
    own_figures(&x, r);
    free_left_live(&x, pl, r);
    stop_allocator(&x, pl, r);
    r->ran = 1;
}

/* Runs one allocator in a child process; its result comes back through a pipe. */
static void run_forked(int kind, const plan *pl, int device, int sample, const char *fconf, rres *r)
{
    int fds[2];
    memset(r, 0, sizeof *r);
    if (pipe(fds) != 0) {
        snprintf(r->error, sizeof r->error, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        static rres cr;
        run_child(kind, pl, device, sample, fconf, &cr);
        const char *p = (const char *)&cr;
        size_t left = sizeof cr;
        while (left) {
            ssize_t w = write(fds[1], p, left);
            if (w <= 0)
                _exit(1);
            p += w;
            left -= (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        snprintf(r->error, sizeof r->error, "fork: %s", strerror(errno));
        return;
    }
    char *p = (char *)r;
    size_t left = sizeof *r;
    while (left) {
        ssize_t n = read(fds[0], p, left);
        if (n <= 0)
            break;
        p += n;
        left -= (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (left) {
        memset(r, 0, sizeof *r);
        if (WIFSIGNALED(status))
            snprintf(r->error, sizeof r->error, "the child process died of signal %d (%s)", WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
        else
            snprintf(r->error, sizeof r->error, "the child process ended with status %d before its result",
                     WEXITSTATUS(status));
    }
}

/* ------------------------------------------------------------ output */

static void mib(uint64_t b, char *out, size_t cap)
{
    if (b == UINT64_MAX)
        snprintf(out, cap, "n/a");
    else
        snprintf(out, cap, "%.1f MiB", (double)b / (1 << 20));
}

static void num(uint64_t v, char *out, size_t cap)
{
    if (v == UINT64_MAX)
        snprintf(out, cap, "n/a");
    else
        snprintf(out, cap, "%" PRIu64, v);
}

static const char usage_line[] =
    "usage: fabpool_replay [--allocators LIST] [--level auto|app|pool] [--sample N] [--fabpool-conf STR]\n"
    "                      [--device N] [--json FILE] [--check [--max-held R]] [--pace] [--gpu-lag N] TRACE[.gz]\n";

static void help(void)
{
    printf("%s\n"
           "Runs a trace that FABPOOL_TRACE recorded against each allocator, each in a process of its own, and\n"
           "reports latency per operation, the peak the driver held and the driver calls (docs/performance.md,\n"
           "\"Replay\").\n\n"
           "  --allocators LIST   which, separated by commas, in this order: fabpool, cudaMallocAsync,\n"
           "                      torch_default, torch_expandable (default: all four; PyTorch's where found)\n"
           "  --level L           auto (default): the application's calls where the trace says which they are,\n"
           "                      else the pool's; app: the application's; pool: every alloc and free that\n"
           "                      reached the pool\n"
           "  --sample N          the driver's holding read every N operations (default 16; 1 catches every peak)\n"
           "  --fabpool-conf STR  a FABPOOL_CONF string for fabpool's pool\n"
           "  --device N          the CUDA device (default 0)\n"
           "  --json FILE         every figure as one JSON object into FILE\n"
           "  --check             exit 1 unless every allocator asked for ran, every operation that succeeded\n"
           "                      in the trace succeeded, and fabpool ends with nothing live (and, on the\n"
           "                      simulated driver, nothing held)\n"
           "  --max-held R        with --check: and fabpool's peak held at most R times the trace's live peak\n"
           "  --pace              each operation waits for its time stamp, so time-based policies (decay_ms)\n"
           "                      act as when it was recorded\n"
           "  --gpu-lag N         simulated driver: every stream's work completes only every N operations\n"
           "  --help              this text\n\n"
           "Exit status: 0; 1 if the trace is refused, no allocator could run, or a --check failed; 2 for a\n"
           "wrong command line.\n",
           usage_line);
}

enum { O_ALLOCATORS = 256, O_LEVEL, O_SAMPLE, O_CONF, O_DEVICE, O_JSON, O_CHECK, O_MAX_HELD, O_PACE, O_LAG };

/* The command line, read. */
typedef struct opts {
    const char *json, *fconf, *list, *path;
    int check, sample, device, level; /* level: -1 auto, 0 pool, 1 app */
    double max_held;
    int want[A_N];
} opts;

/* --allocators: want[] from the list; -1 (said why) on a name not known or none */
static int parse_allocators(opts *op)
{
    int n_want = 0;
    for (const char *p = op->list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = 0;
        for (int k = 0; k < A_N; k++)
            if (strlen(a_key[k]) == n && !strncmp(p, a_key[k], n))
                op->want[k] = found = 1;
        if (!found) {
            fprintf(stderr, "fabpool_replay: unknown allocator '%.*s'; known: fabpool, cudaMallocAsync, "
                            "torch_default, torch_expandable\n", (int)n, p);
            return -1;
        }
        n_want += found;
        p = e ? e + 1 : p + n;
    }
    if (!n_want) {
        fprintf(stderr, "fabpool_replay: --allocators names none\n");
        return -1;
    }
    return 0;
}

/* One option; CLI_OK to go on, else the exit status. */
static int parse_option(opts *op, int c)
{
    const char *me = "fabpool_replay";
    uint64_t v = 0;
    switch (c) {
    case O_ALLOCATORS: op->list = optarg; break;
    case O_CONF: op->fconf = optarg; break;
    case O_JSON: op->json = optarg; break;
    case O_CHECK: op->check = 1; break;
    case O_PACE: pace = 1; break;
    case O_SAMPLE:
        if (cli_u64(me, "--sample", optarg, 1, 1u << 30, &v) != 0)
            return cli_usage_error(usage_line);
        op->sample = (int)v;
        break;
    case O_DEVICE:
        if (cli_u64(me, "--device", optarg, 0, 1023, &v) != 0)
            return cli_usage_error(usage_line);
        op->device = (int)v;
        break;
    case O_LAG:
        if (cli_u64(me, "--gpu-lag", optarg, 1, UINT32_MAX, &v) != 0)
            return cli_usage_error(usage_line);
        gpu_lag = (size_t)v;
        break;
    case O_MAX_HELD:
        if (cli_ratio(me, "--max-held", optarg, &op->max_held) != 0)
            return cli_usage_error(usage_line);
        break;
    case O_LEVEL:
        op->level = !strcmp(optarg, "app") ? 1 : !strcmp(optarg, "pool") ? 0 : !strcmp(optarg, "auto") ? -1 : -2;
        if (op->level == -2) {
            fprintf(stderr, "fabpool_replay: --level %s: accepted: auto, app, pool\n", optarg);
            return cli_usage_error(usage_line);
        }
        break;
    default: return cli_usage_error(usage_line);
    }
    return CLI_OK;
}

/* The command line into op: -1 to go on, else the exit status (--help, a wrong line). */
static int parse_args(int argc, char **argv, opts *op)
{
    static const struct option longs[] = {
        {"allocators", required_argument, NULL, O_ALLOCATORS}, {"level", required_argument, NULL, O_LEVEL},
        {"sample", required_argument, NULL, O_SAMPLE},         {"fabpool-conf", required_argument, NULL, O_CONF},
        {"device", required_argument, NULL, O_DEVICE},         {"json", required_argument, NULL, O_JSON},
        {"check", no_argument, NULL, O_CHECK},                 {"max-held", required_argument, NULL, O_MAX_HELD},
        {"pace", no_argument, NULL, O_PACE},                   {"gpu-lag", required_argument, NULL, O_LAG},
        {"help", no_argument, NULL, 'h'},                      {0}};
    for (int c; (c = getopt_long(argc, argv, "h", longs, NULL)) != -1;) {
        if (c == 'h') {
            help();
            return CLI_OK;
        }
        int st = parse_option(op, c);
        if (st != CLI_OK)
            return st;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "fabpool_replay: %s\n", optind == argc ? "no trace named" : "one trace at a time");
        return cli_usage_error(usage_line);
    }
    op->path = argv[optind];
    if (op->max_held > 0 && !op->check) {
        fprintf(stderr, "fabpool_replay: --max-held is a bound of --check: give both\n");
        return cli_usage_error(usage_line);
    }
    return parse_allocators(op) ? cli_usage_error(usage_line) : -1;
}

/* The trace, loaded and turned into the plan of operations (said on stdout): -1 to go on, else the exit status. */
static int load_plan(const opts *op, plan *pl)
{
    trace_data d;
    char err[512];
    if (trace_load(op->path, &d, err, sizeof err) != 0) {
        fprintf(stderr, "fabpool_replay: refused: %s\n", err);
        return CLI_FAILED;
    }
    int app = op->level == -1 ? d.has_app : op->level;
    if (app && !d.has_app) {
        fprintf(stderr, "fabpool_replay: --level app: the trace does not say which calls the application made (no "
                "marked records, no app_* records); use --level pool\n");
        trace_free(&d);
        return CLI_USAGE;
    }
    if (build_plan(&d, app, pl, err, sizeof err) != 0) {
        fprintf(stderr, "fabpool_replay: %s\n", err);
        trace_free(&d);
        return CLI_FAILED;
    }
    printf("replay of %s: %zu records (%s), %zu operations at the %s level, %u objects, %u streams + NULL, peak "
           "live %.1f MiB%s\n", op->path, d.n, d.h.flags & FABPOOL_TRACE_F_SYNTHETIC ? "SYNTHETIC" : "recorded",
           pl->n, app ? "application's" : "pool's", pl->n_objs, pl->n_streams - 1,
           (double)pl->live_peak / (1 << 20), d.note[0] ? " (trace not completed by its writer)" : "");
    if (pl->skipped_failed || pl->skipped_unknown)
        printf("not replayed: %" PRIu64 " allocations that failed in the trace, %" PRIu64
               " frees/resizes of pointers it never gave out\n", pl->skipped_failed, pl->skipped_unknown);
    trace_free(&d);
    return -1;
}

/* One allocator's row of the table; 1 when it failed somehow. */
static int print_row(int k, const rres *r, const plan *pl)
{
    if (!r->ran) {
        printf("%-17s not run: %s\n", a_key[k], r->error);
        return 1;
    }
    char c1[24], c2[24], c3[24], h[24], o[24], dc[24], mp[24];
    snprintf(c1, sizeof c1, "%.0f/%.0f", r->med[R_ALLOC], r->p99[R_ALLOC]);
    snprintf(c2, sizeof c2, "%.0f/%.0f", r->med[R_FREE], r->p99[R_FREE]);
    if (r->count[R_BRESIZE])
        snprintf(c3, sizeof c3, "%.0f/%.0f", r->med[R_BRESIZE], r->p99[R_BRESIZE]);
    else
        snprintf(c3, sizeof c3, "-");
    mib(r->held_peak, h, sizeof h);
    mib(r->own_peak, o, sizeof o);
    num(r->calls, dc, sizeof dc);
    num(r->maps, mp, sizeof mp);
    printf("%-17s %9" PRIu64 " %7" PRIu64 "  %-19s %-19s %-19s %13s %13s %10s %8s %8.3f\n", a_key[k], r->ops,
           r->failures, c1, c2, c3, h, o, dc, mp, r->seconds);
    int failed = 0;
    if (r->failures) {
        printf("  %" PRIu64 " operations failed (the first: operation %" PRIu64 ", %s)\n", r->failures,
               r->first_failure, kind_name[pl->ops[r->first_failure].kind]);
        failed = 1;
    }
    if (r->error[0]) {
        printf("  error: %s\n", r->error);
        failed = 1;
    }
    return failed;
}

/* the figures of a run that ran, into its JSON object */
static void json_figures(FILE *js, const rres *r)
{
    fprintf(js, ",\"ops\":%" PRIu64 ",\"failures\":%" PRIu64 ",\"seconds\":", r->ops, r->failures);
    fp_json_double(js, r->seconds, 6);
    fprintf(js, ",\"held_peak\":%" PRIu64 ",\"held_base\":%" PRIu64, r->held_peak, r->held_base);
    if (r->own_peak != UINT64_MAX)
        fprintf(js, ",\"own_peak\":%" PRIu64, r->own_peak);
    if (r->calls != UINT64_MAX)
        fprintf(js, ",\"driver_calls\":%" PRIu64, r->calls);
    if (r->maps != UINT64_MAX)
        fprintf(js, ",\"maps\":%" PRIu64, r->maps);
    if (r->maps_late != UINT64_MAX)
        fprintf(js, ",\"maps_second_half\":%" PRIu64, r->maps_late);
    fprintf(js, ",\"driver_calls_are\":");
    fp_json_str(js, r->calls_what);
    fprintf(js, ",\"left_live_by_trace\":%" PRIu64, r->left_live);
    if (r->live_end != UINT64_MAX)
        fprintf(js, ",\"live_end\":%" PRIu64 ",\"live_blocks_end\":%" PRIu64 ",\"live_buffers_end\":%" PRIu64,
                r->live_end, r->live_blocks_end, r->live_buffers_end);
    if (r->held_after != UINT64_MAX)
        fprintf(js, ",\"held_after\":%" PRIu64, r->held_after);
    fprintf(js, ",\"latency_ns\":{");
    for (int q = 0, f1 = 1; q < R_NKINDS; q++)
        if (r->count[q]) {
            fp_json_key(js, &f1, kind_name[q]);
            fprintf(js, "{\"n\":%" PRIu64 ",\"median\":", r->count[q]);
            fp_json_double(js, r->med[q], 1);
            fprintf(js, ",\"p99\":");
            fp_json_double(js, r->p99[q], 1);
            fprintf(js, "}");
        }
    fprintf(js, "}");
}

/* One allocator's JSON object */
static void json_row(FILE *js, int k, const rres *r, int first)
{
    fprintf(js, "%s{\"allocator\":", first ? "" : ",");
    fp_json_str(js, a_key[k]);
    fprintf(js, ",\"ran\":%d", r->ran);
    if (!r->ran || r->error[0]) {
        fprintf(js, ",\"error\":");
        fp_json_str(js, r->error);
    }
    if (r->ran)
        json_figures(js, r);
    fprintf(js, "}");
}

/* What the table's columns mean, and the notes of each allocator that ran */
static void print_notes(const opts *op, const rres *res, const plan *pl)
{
    int sim = 0;
    for (int k = 0; k < A_N; k++)
        sim |= op->want[k] && res[k].ran && res[k].sim;
    printf("\npeak held: what the driver holds (%s) less its value when the allocator had started, sampled every "
           "%d operations; own peak: the allocator's own count. Buffer ops for the others: allocate the new size, "
           "free the old. Live peak of the trace: %.1f MiB.\n",
           sim ? "the simulated driver's ledger" : "cuMemGetInfo", op->sample, (double)pl->live_peak / (1 << 20));
    for (int k = 0; k < A_N; k++)
        if (op->want[k] && res[k].ran && res[k].maps_late != UINT64_MAX)
            printf("%s: %" PRIu64 " of its maps came in the second half of the operations (the steady state)%s\n",
                   a_key[k], res[k].maps_late, pace ? ", paced by the trace's time stamps" : "");
    for (int k = 0; k < A_N; k++)
        if (op->want[k] && res[k].ran && res[k].left_live)
            printf("%s: %" PRIu64 " objects the trace left live were freed after the timed part\n", a_key[k],
                   res[k].left_live);
}

/* --check of fabpool's run: nothing live or held at the end, the peak within --max-held; 1 when it failed */
static int check_fabpool(const rres *r, const plan *pl, double max_held)
{
    int failed = 0;
    if (r->live_end != 0 || r->live_blocks_end != 0 || r->live_buffers_end != 0) {
        printf("CHECK FAILED: fabpool holds %" PRIu64 " live bytes in %" PRIu64 " block%s and %" PRIu64
               " buffer%s after the replay freed everything and the blocks freed on streams went back to the "
               "pool\n", r->live_end, r->live_blocks_end, r->live_blocks_end == 1 ? "" : "s",
               r->live_buffers_end, r->live_buffers_end == 1 ? "" : "s");
        failed = 1;
    }
    if (r->held_after != UINT64_MAX && r->held_after != 0) {
        printf("CHECK FAILED: the driver still holds %" PRIu64 " bytes after fabpool's pool was destroyed\n",
               r->held_after);
        failed = 1;
    }
    if (max_held > 0 && (double)r->held_peak > max_held * (double)pl->live_peak) {
        printf("CHECK FAILED: fabpool's peak held %.1f MiB is %.3fx the live peak, above --max-held %.3f\n",
               (double)r->held_peak / (1 << 20), (double)r->held_peak / (double)pl->live_peak, max_held);
        failed = 1;
    } else if (max_held > 0) {
        printf("fabpool's peak held is %.3fx the live peak (--max-held %.3f)\n",
               (double)r->held_peak / (double)pl->live_peak, max_held);
    }
    return failed;
}

int main(int argc, char **argv)
{
    opts op = {.list = "fabpool,cudaMallocAsync,torch_default,torch_expandable", .sample = 16, .level = -1};
    int st = parse_args(argc, argv, &op);
    if (st >= 0)
        return st;
    unsetenv("FABPOOL_TRACE"); /* the replay is not itself traced */
    plan pl;
    if ((st = load_plan(&op, &pl)) >= 0)
        return st;

    rres res[A_N];
    int failed = 0, ran = 0;
    FILE *js = NULL;
    if (op.json && !(js = fopen(op.json, "w"))) {
        fprintf(stderr, "fabpool_replay: cannot write %s: %s\n", op.json, strerror(errno));
        free(pl.ops);
        return CLI_FAILED;
    }
    if (js) {
        fprintf(js, "{\"trace\":");
        fp_json_str(js, op.path);
        fprintf(js, ",\"operations\":%zu,\"level\":\"%s\",\"live_peak\":%" PRIu64 ",\"allocators\":[", pl.n,
                pl.app ? "app" : "pool", pl.live_peak);
    }
    printf("\n%-17s %9s %7s  %-19s %-19s %-19s %13s %13s %10s %8s %8s\n", "allocator", "ops", "failed",
           "alloc ns med/p99", "free ns med/p99", "resize ns med/p99", "peak held", "own peak", "drv calls",
           "maps", "time s");
    for (int k = 0, first = 1; k < A_N; k++) {
        if (!op.want[k])
            continue;
        run_forked(k, &pl, op.device, op.sample, op.fconf, &res[k]);
        ran += res[k].ran;
        failed |= print_row(k, &res[k], &pl);
        if (js)
            json_row(js, k, &res[k], first);
        first = 0;
    }
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    print_notes(&op, res, &pl);
    if (op.check && op.want[A_FABPOOL] && res[A_FABPOOL].ran)
        failed |= check_fabpool(&res[A_FABPOOL], &pl, op.max_held);
    free(pl.ops);
    if (!ran) {
        fprintf(stderr, "fabpool_replay: no allocator could run (each one's reason is above)\n");
        return CLI_FAILED;
    }
    if (op.check) {
        printf("%s\n", failed ? "CHECK FAILED" : "check passed: every operation succeeded, fabpool ends with 0 live "
                                                  "bytes");
        return failed ? CLI_FAILED : CLI_OK;
    }
    return CLI_OK;
}
