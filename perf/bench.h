/* bench.h - the pieces of fabpool_bench shared by its files.
 *
 * An allocator under test is a `balloc`: alloc/free of device memory, a way
 * to force the next allocation to miss its cache ("cold"), and a way to give
 * every cached byte back after a case.  A case (one workload at one setting)
 * is a `bcase`; its outcome a `bresult`.  Both are plain structs, so a case
 * can be run in a child process (the PyTorch columns) and its result sent
 * back through a pipe as bytes. */
#ifndef FABPOOL_BENCH_H
#define FABPOOL_BENCH_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"
#include "shapes.h"

/* ---------------------------------------------------------------- driver */

typedef struct bdriver {
    CUresult (*init)(unsigned);
    CUresult (*dev_get)(CUdevice *, int);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_set)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_trim)(CUmemoryPool, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
    CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
    CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*meminfo)(size_t *, size_t *);
    uint64_t (*sim_calls)(const char *); /* fabsim_calls on the simulated driver, else NULL */
    CUcontext ctx;
    CUdevice dev;
    int sim;
    const char *path;
} bdriver;

extern bdriver cu;
int bench_load_driver(void);
/* Bytes of device 0 in use (total - free), as the driver says. */
uint64_t bench_device_used(void);
double bench_now_ns(void);

/* ------------------------------------------------------------- allocators */

typedef struct balloc balloc;
struct balloc {
    const char *key;         /* short name used in JSON and on the command line */
    const char *name;        /* column title */
    const char *cold_means;  /* what a forced miss is for this allocator */
    const char *unavailable; /* non-NULL: why this allocator cannot run here */
    int (*alloc)(balloc *, size_t, void **);
    int (*free)(balloc *, void *);
    void (*cold)(balloc *);      /* make the next allocation miss; NULL: it always does */
    void (*release)(balloc *);   /* give every cached byte back (between cases) */
    uint64_t (*calls)(balloc *); /* driver calls so far; UINT64_MAX: unknown */
    uint64_t (*held)(balloc *);  /* physical bytes the allocator holds by its own account; UINT64_MAX: none */
    uint64_t (*maps)(balloc *);  /* chunks it mapped and unmapped so far (driver calls of about 100 us each on
                                    the H200); UINT64_MAX: unknown */
    int grows_in_place;          /* 1: fabpool's growable buffers */
    int remote;                  /* 1: cases run in a child process */
    int child_in, child_out;     /* pipes to the child */
    int child_pid;
    const char *child_conf;      /* PYTORCH_CUDA_ALLOC_CONF for the child ("" = unset) */
    fabpool_t *pool;
    fabpool_t *peer_pool;        /* importer side for the sharing figures */
    uint64_t own_calls;
    void *impl;
};

enum { A_FABPOOL, A_FABPOOL_NOTC, A_ASYNC, A_CUMEM, A_HYBRIDEP, A_TORCH, A_TORCH_EXP, A_MAX };
extern balloc allocs[A_MAX];
int bench_setup_allocators(const char *self, int child_kind);
void bench_teardown_allocators(void);
/* Makes allocs[kind] PyTorch's allocator in this process (a child's): 0, or
 * nonzero with msg saying why not. */
int bench_torch_local(int kind, char *msg, size_t cap);
/* Runs a child process's loop (the --child mode of the bench, bench_child.c). */
int bench_child_main(int kind, int fd_in, int fd_out);

/* ---------------------------------------------------------------- cases */

enum { W_LATENCY = 1, W_GROWTH, W_TRACE, W_MIXED, W_ACTIVATIONS, W_LOGUNIFORM, W_FAMILIES };

#define BQ 21           /* quantiles p0, p5, ..., p100 */
#define BSERIES 512     /* at most this many steps recorded per growth case */

typedef struct bcase {
    int workload;
    /* latency */
    uint64_t size;
    int threads, cold, samples, batch;
    double budget_s;      /* a cell stops after this much time (at least 5 samples) */
    /* growth (linear): from -> to in step; trace: steps and seed */
    uint64_t from, to, step;
    int steps;
    uint64_t seed;
    int share;            /* export every change to a peer view and import it */
    /* mixed, activations, loguniform: the shape (shapes.h) */
    shape sh;
} bcase;

typedef struct bresult {
    int ok;
    char error[200];
    /* latency and mixed: ns per operation (pair for latency) */
    double median, p99, p999, mean;
    double thread_median_min, thread_median_max;
    double q[BQ];
    int n;
    /* growth and trace */
    int steps, realloc_steps;
    double us_total, us_per_step, us_per_realloc, step_median_us, step_p99_us;
    double calls_per_step;      /* < 0: unknown */
    uint64_t peak_held, peak_live, final_held;
    double peak_ratio;
    int base_changes;
    double exported_bytes_per_step, imported_bytes_per_step, desc_bytes_per_step, fds_per_step;
    int n_series;
    float series_live_mib[BSERIES], series_held_mib[BSERIES], series_us[BSERIES];
    /* mixed, activations, loguniform */
    uint64_t ops_done;
    double ratio_tenth;         /* peak held / peak live over the first tenth of the operations */
    double map_batches;         /* batches that mapped or unmapped a chunk, a fraction; < 0: unknown */
    double maps_p99;            /* chunks mapped or unmapped by a batch, p99 of the batches */
    uint64_t maps;              /* in all */
} bresult;

void bench_run_case(balloc *a, const bcase *c, bresult *r);
int bench_remote_case(balloc *a, const bcase *c, bresult *r);

/* the sharing figures: an exporting pool with handle_type posix_fd and an
 * importing one (NULL where the driver allows no POSIX fds) */
extern fabpool_t *bench_share_pool, *bench_share_peer;
int bench_hyb_share(balloc *a, void *ptr, size_t n, uintptr_t *peer_va, size_t *peer_size);
void bench_hyb_unshare(balloc *a, uintptr_t va, size_t size);

/* torch backend (libfabpool_bench_torch.so), looked up with dlsym */

#endif
