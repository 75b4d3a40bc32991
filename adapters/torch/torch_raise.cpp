/* fabpool_torch_alloc_raising: the shim's alloc_fn for torch.cuda.memory.CUDAPluggableAllocator as the
 * allocator of the whole program (fabpool_torch.install()).  PyTorch takes whatever pointer alloc_fn returns as
 * the allocation, unchecked, so a NULL from a failed allocation would reach the next kernel as address 0.  Here
 * a failed allocation of one byte or more throws a std::runtime_error instead: it unwinds through PyTorch's
 * allocate() like PyTorch's own allocator's out-of-memory error, and PyTorch's Python binding raises it as a
 * RuntimeError with this message.  An out-of-memory message opens with PyTorch's own sentences (the size, the
 * device's capacity and free bytes, what PyTorch has allocated and reserved, in PyTorch's units), so code and
 * tests that read one by its text read fabpool's too; torch.OutOfMemoryError itself is c10's type, which only a
 * library linked against PyTorch can throw (the C++ allocator, libfabpool_torch_cxx.so).
 * A torch.cuda.MemPool's allocator (mempool(), the tags) keeps fabpool_torch_alloc: PyTorch checks for NULL
 * there, frees its cached blocks, retries and raises torch.OutOfMemoryError itself. */
#include <cstddef>
#include <stdexcept>
#include <string>

#include "fabpool.h"
#include "fabpool_torch.h"
#include "torch_size.hpp"

void *fabpool_torch_alloc_raising(size_t size, int device, void *stream)
{
    /* PyTorch's caching allocator refuses this before it looks at a pool, in these words (its own
     * test_out_of_memory reads them) */
    constexpr size_t one_exa_bytes = size_t(1) << 60;
    if (size >= one_exa_bytes)
        throw std::runtime_error("CUDA out of memory. Tried to allocate more than 1EB memory.");
    void *p = fabpool_torch_alloc(size, device, stream);
    if (p || size == 0)
        return p;
    std::string why = fabpool_torch_last_error();
    fabpool_t *pool = fabpool_torch_pool(device);
    /* the device has its pool, which could not serve the size: what PyTorch calls out of memory (more than the
     * device has free, or in all, or than the pool's address space holds); without a pool, the device or the
     * driver is wrong, and the message says that instead */
    if (!pool)
        throw std::runtime_error("fabpool could not allocate. Tried to allocate " + std::to_string(size) +
                                 " bytes on device " + std::to_string(device) +
                                 " through fabpool's pluggable shim: " + why);
    using fabpool_torch::torch_size;
    std::string msg = "CUDA out of memory. Tried to allocate " + torch_size(size) + ". GPU " + std::to_string(device);
    size_t fr = 0, total = 0;
    if (fabpool_device_memory(pool, &fr, &total) == FABPOOL_OK)
        msg += " has a total capacity of " + torch_size(total) + " of which " + torch_size(fr) + " is free. ";
    else
        msg += ": its capacity is unknown. ";
    fabpool_torch_mem_stats ms = {};
    ms.struct_size = sizeof ms;
    if (fabpool_torch_get_memory_stats(device, &ms) == FABPOOL_OK) {
        int64_t live = ms.allocated_bytes[FABPOOL_TORCH_ALL].current, held = ms.reserved_bytes.current;
        msg += "Of the allocated memory " + torch_size(uint64_t(live > 0 ? live : 0)) +
               " is allocated by PyTorch, and " + torch_size(uint64_t(held > live ? held - live : 0)) +
               " is reserved by PyTorch but unallocated. ";
    }
    throw std::runtime_error(msg + "fabpool (pluggable shim): " + why);
}
