/* torch_load.h - the PyTorch backend of the perf tools (libfabpool_bench_torch.so,
 * perf/torch_backend.cpp), loaded at run time so that the tools build and run
 * where PyTorch is absent.  Used by fabpool_bench and fabpool_replay. */
#ifndef FABPOOL_PERF_TORCH_LOAD_H
#define FABPOOL_PERF_TORCH_LOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct fbt_api {
    int (*init)(char *err, size_t cap);
    int (*alloc)(size_t n, void **out, char *err, size_t cap);
    int (*alloc_stream)(size_t n, void *stream, void **out, char *err, size_t cap);
    void (*del)(void *p);
    void (*empty_cache)(void);
    void (*reserved)(uint64_t *current, uint64_t *peak);
    void (*reset_peak)(void);
    void (*device_calls)(uint64_t *allocs, uint64_t *frees);
} fbt_api;

/* Where the backend is: $FABPOOL_BENCH_TORCH_LIB, else libfabpool_bench_torch.so
 * beside the program `exe` (NULL: this process's own program). */
const char *fbt_path(const char *exe, char *buf, size_t cap);
/* Loads the backend, fills api and calls its init: 0, or -1 with why in err. */
int fbt_load(const char *exe, fbt_api *api, char *err, size_t cap);

#endif
