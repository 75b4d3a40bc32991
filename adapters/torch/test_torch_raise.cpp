/* The shim's alloc_fn for the whole program, fabpool_torch_alloc_raising, called as PyTorch's
 * CUDAPluggableAllocator calls it (a function pointer from dlsym in a std::function<void*(size_t, int,
 * cudaStream_t)>): an allocation the device cannot hold throws a std::runtime_error whose message opens with
 * PyTorch's sentences (the size, the device's capacity and free bytes, PyTorch's allocated and reserved bytes)
 * and then fabpool's reason, where fabpool_torch_alloc answers NULL; a
 * failure that is not out of memory (a device that does not exist) throws with its own reason; size 0 is NULL
 * without a throw; an allocation that fits is a pointer, and after a throw the shim still serves and frees.
 * On any driver (the simulated one of 256 MiB in ctest, FABSIM_MEMORY): test_torch_raise <libfabpool_torch.so>. */
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "torch_size.hpp"

using fabpool_torch::torch_size;

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);

static int failures;

static void check(bool ok, const std::string &what)
{
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
    if (!ok)
        failures++;
}

/* what the call threw, "" where it returned (its result in *out) */
static std::string call(const std::function<void *(size_t, int, void *)> &fn, size_t size, int device, void **out)
{
    *out = nullptr;
    try {
        *out = fn(size, device, nullptr);
    } catch (const std::runtime_error &e) {
        return std::string("runtime_error: ") + e.what();
    } catch (...) {
        return "another exception";
    }
    return "";
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        std::fprintf(stderr, "usage: test_torch_raise <libfabpool_torch.so>\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    auto raising = reinterpret_cast<alloc_fn>(dlsym(lib, "fabpool_torch_alloc_raising"));
    auto plain = reinterpret_cast<alloc_fn>(dlsym(lib, "fabpool_torch_alloc"));
    auto release = reinterpret_cast<free_fn>(dlsym(lib, "fabpool_torch_free"));
    check(raising && plain && release, "the library exports fabpool_torch_alloc_raising beside alloc and free");
    if (!raising || !plain || !release) {
        dlclose(lib);
        return 1;
    }
    /* more than device 0 has (the driver's own figure: the simulated 256 MiB or a GPU's), less than the pool's
     * address space */
    size_t total = 0;
    const char *drv = std::getenv("FABPOOL_CUDA_LIBRARY");
    void *cuda = dlopen(drv && *drv ? drv : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto cu_init = reinterpret_cast<int (*)(unsigned)>(cuda ? dlsym(cuda, "cuInit") : nullptr);
    auto cu_dev = reinterpret_cast<int (*)(int *, int)>(cuda ? dlsym(cuda, "cuDeviceGet") : nullptr);
    auto cu_total = reinterpret_cast<int (*)(size_t *, int)>(cuda ? dlsym(cuda, "cuDeviceTotalMem_v2") : nullptr);
    int dev = 0;
    bool told = cu_init && cu_dev && cu_total && cu_init(0) == 0 && cu_dev(&dev, 0) == 0 &&
                cu_total(&total, dev) == 0 && total > 0;
    check(told, "the driver tells device 0's memory (" + std::to_string(total) + " bytes)");
    if (!told) {
        dlclose(lib);
        return 1;
    }
    std::function<void *(size_t, int, void *)> fn(raising);
    void *p = nullptr;

    std::string e = call(fn, 1 << 20, 0, &p);
    check(e.empty() && p, "1 MiB that fits is a pointer, no throw (" + e + ")");
    void *q = nullptr;
    const size_t over = 2 * total;
    e = call(fn, over, 0, &q);
    /* PyTorch's sentences first (its test_out_of_memory reads "Tried to allocate 800000000.00 GiB. GPU 0 has a
     * total capacity of"), in its units: the 1 MiB block live, nothing else allocated */
    const std::string first = "runtime_error: CUDA out of memory. Tried to allocate " + torch_size(over) +
                              ". GPU 0 has a total capacity of " + torch_size(total) + " of which ";
    check(e.rfind(first, 0) == 0 &&
              e.find(" is free. Of the allocated memory 1024.00 KiB is allocated by PyTorch, and ") !=
                  std::string::npos &&
              e.find(" is reserved by PyTorch but unallocated. fabpool (pluggable shim): fabpool_alloc") !=
                  std::string::npos &&
              !q,
          "twice the device's memory throws a runtime_error in PyTorch's words, then fabpool's reason: " + e);
    const size_t huge = (size_t)1 << 50; /* 1 PiB: more than any device, the simulated one too */
    e = call(fn, huge, 0, &q);
    check(e.rfind("runtime_error: CUDA out of memory. Tried to allocate 1048576.00 GiB. GPU 0 has a total capacity "
                  "of " + torch_size(total), 0) == 0 && !q,
          "1 PiB, more than the pool's address space, throws the same: " + e);
    check(plain(huge, 0, nullptr) == nullptr, "fabpool_torch_alloc answers the same request NULL, no throw");
    e = call(fn, (size_t)1 << 60, 0, &q);
    check(e == "runtime_error: CUDA out of memory. Tried to allocate more than 1EB memory." && !q,
          "1 EiB and more: PyTorch's own words for it: " + e);
    e = call(fn, 4096, 42, &q);
    check(e.rfind("runtime_error: fabpool could not allocate. Tried to allocate 4096 bytes on device 42", 0) == 0 &&
              !q,
          "a device that does not exist throws with its own reason, not out of memory: " + e);
    e = call(fn, 0, 0, &q);
    check(e.empty() && !q, "size 0 is NULL without a throw (" + e + ")");
    void *r = nullptr;
    e = call(fn, 2 << 20, 0, &r);
    check(e.empty() && r && r != p, "after the throws the shim still serves a new block (" + e + ")");
    if (p)
        release(p, 1 << 20, 0, nullptr);
    if (r)
        release(r, 2 << 20, 0, nullptr);
    /* the library stays loaded to the end, as in PyTorch: its pools live in it (a leak checker finds them) */
    std::printf("test_torch_raise: %s\n", failures ? "FAILED" : "every check holds");
    return failures ? 1 : 0;
}
