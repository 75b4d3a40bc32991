/* torch_load.c - loading the perf tools' PyTorch backend (torch_load.h). */
#define _GNU_SOURCE
#include "torch_load.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *fbt_path(const char *exe, char *buf, size_t cap)
{
    const char *env = getenv("FABPOOL_BENCH_TORCH_LIB");
    if (env && *env)
        return env;
    char dir[4096];
    ssize_t n = readlink(exe ? exe : "/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
        snprintf(dir, sizeof dir, "%s", exe ? exe : ".");
        n = (ssize_t)strlen(dir);
    }
    dir[n] = 0;
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(buf, cap, "%s/libfabpool_bench_torch.so", dir);
    return buf;
}

int fbt_load(const char *exe, fbt_api *api, char *err, size_t cap)
{
    char buf[4200];
    const char *path = fbt_path(exe, buf, sizeof buf);
    memset(api, 0, sizeof *api);
    if (access(path, R_OK) != 0) {
        snprintf(err, cap, "PyTorch not present (%.250s was not built: no torch found when configuring)", path);
        return -1;
    }
    void *l = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l) {
        snprintf(err, cap, "PyTorch not present (%s)", dlerror());
        return -1;
    }
    static const struct {
        size_t at;
        const char *name;
    } syms[] = {
        {offsetof(fbt_api, init), "fbt_init"},
        {offsetof(fbt_api, alloc), "fbt_alloc"},
        {offsetof(fbt_api, alloc_stream), "fbt_alloc_stream"},
        {offsetof(fbt_api, del), "fbt_free"},
        {offsetof(fbt_api, empty_cache), "fbt_empty_cache"},
        {offsetof(fbt_api, reserved), "fbt_reserved"},
        {offsetof(fbt_api, reset_peak), "fbt_reset_peak"},
        {offsetof(fbt_api, device_calls), "fbt_device_calls"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(l, syms[i].name);
        if (!f) {
            snprintf(err, cap, "PyTorch backend %.250s lacks %s (rebuild it)", path, syms[i].name);
            memset(api, 0, sizeof *api);
            return -1;
        }
        memcpy((char *)api + syms[i].at, &f, sizeof f);
    }
    return api->init(err, cap);
}
