/* fabpool_torch_alloc_raising: the shim's alloc_fn for torch.cuda.memory.CUDAPluggableAllocator as the
 * allocator of the whole program (fabpool_torch.install()).  PyTorch takes whatever pointer alloc_fn returns as
 * the allocation, unchecked, so a NULL from a failed allocation would reach the next kernel as address 0.  Here
 * a failed allocation of one byte or more throws a std::runtime_error instead: it unwinds through PyTorch's
 * allocate() like PyTorch's own allocator's out-of-memory error, and PyTorch's Python binding raises it as a
 * RuntimeError with this message.  An out-of-memory message begins "CUDA out of memory." as PyTorch's does, so
 * code that recognises one by its text still does; torch.OutOfMemoryError itself is c10's type, which only a
 * library linked against PyTorch can throw (the C++ allocator, libfabpool_torch_cxx.so).
 * A torch.cuda.MemPool's allocator (mempool(), the tags) keeps fabpool_torch_alloc: PyTorch checks for NULL
 * there, frees its cached blocks, retries and raises torch.OutOfMemoryError itself. */
#include <cstddef>
#include <stdexcept>
#include <string>

#include "fabpool_torch.h"

extern "C" __attribute__((visibility("default"))) void *fabpool_torch_alloc_raising(size_t size, int device,
                                                                                   void *stream);

void *fabpool_torch_alloc_raising(size_t size, int device, void *stream)
{
    void *p = fabpool_torch_alloc(size, device, stream);
    if (p || size == 0)
        return p;
    const char *why = fabpool_torch_last_error();
    /* the device has its pool, which could not serve the size: what PyTorch calls out of memory (more than the
     * device has free, or in all, or than the pool's address space holds); without a pool, the device or the
     * driver is wrong, and the message says that instead */
    std::string msg = fabpool_torch_pool(device) ? "CUDA out of memory. " : "fabpool could not allocate. ";
    msg += "Tried to allocate " + std::to_string(size) + " bytes on device " + std::to_string(device) +
           " through fabpool's pluggable shim: " + why;
    throw std::runtime_error(msg);
}
