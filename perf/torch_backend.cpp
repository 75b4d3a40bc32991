// torch_backend.cpp - PyTorch's CUDA caching allocator behind a C interface,
// for fabpool_bench (which is C and dlopens this library in child processes).
// Only c10's public allocator API is used: raw_alloc, raw_alloc_with_stream,
// raw_delete, init, emptyCache, getDeviceStats, resetPeakStats.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdint>
#include <cstdio>
#include <exception>

namespace A = c10::cuda::CUDACachingAllocator;

static void put(char *err, size_t cap, const char *what, const std::exception &e)
{
    if (err && cap)
        std::snprintf(err, cap, "%s: %.200s", what, e.what());
}

extern "C" {

__attribute__((visibility("default"))) int fbt_init(char *err, size_t cap)
{
    try {
        A::init(c10::cuda::device_count());
        void *p = A::raw_alloc(256);
        A::raw_delete(p);
        A::emptyCache();
        return 0;
    } catch (const std::exception &e) {
        put(err, cap, "PyTorch's caching allocator does not start", e);
        return -1;
    }
}

__attribute__((visibility("default"))) int fbt_alloc(size_t n, void **out, char *err, size_t cap)
{
    try {
        *out = A::raw_alloc(n);
        return *out ? 0 : -1;
    } catch (const std::exception &e) {
        put(err, cap, "raw_alloc", e);
        return -1;
    }
}

// an allocation on a given stream (a CUstream / cudaStream_t; NULL: the legacy default stream)
__attribute__((visibility("default"))) int fbt_alloc_stream(size_t n, void *stream, void **out, char *err, size_t cap)
{
    try {
        *out = A::raw_alloc_with_stream(n, static_cast<cudaStream_t>(stream));
        return *out ? 0 : -1;
    } catch (const std::exception &e) {
        put(err, cap, "raw_alloc_with_stream", e);
        return -1;
    }
}

// the allocator's calls to the driver: num_device_alloc (cudaMalloc, or a map with expandable segments) and
// num_device_free
__attribute__((visibility("default"))) void fbt_device_calls(uint64_t *allocs, uint64_t *frees)
{
    try {
        auto s = A::getDeviceStats(0);
        *allocs = static_cast<uint64_t>(s.num_device_alloc);
        *frees = static_cast<uint64_t>(s.num_device_free);
    } catch (const std::exception &) {
        *allocs = *frees = 0;
    }
}

__attribute__((visibility("default"))) void fbt_free(void *p)
{
    try {
        A::raw_delete(p);
    } catch (const std::exception &) {
    }
}

__attribute__((visibility("default"))) void fbt_empty_cache(void)
{
    try {
        A::emptyCache();
    } catch (const std::exception &) {
    }
}

// bytes the allocator has from the driver (reserved), now and at its peak
__attribute__((visibility("default"))) void fbt_reserved(uint64_t *current, uint64_t *peak)
{
    try {
        auto s = A::getDeviceStats(0);
        *current = static_cast<uint64_t>(s.reserved_bytes[0].current);
        *peak = static_cast<uint64_t>(s.reserved_bytes[0].peak);
    } catch (const std::exception &) {
        *current = *peak = 0;
    }
}

__attribute__((visibility("default"))) void fbt_reset_peak(void)
{
    try {
        A::resetPeakStats(0);
    } catch (const std::exception &) {
    }
}
}
