/* fuzz_torch_handle: the PyTorch tensor handle's decoder
 * (adapters/torch/torch_ipc.cpp, ipc::decode) on fuzzed bytes: what a
 * receiver's getIpcDevPtr takes from pickled bytes before it reaches any
 * process.  For every input:
 *  - a refusal says why (a message);
 *  - an accepted handle keeps every promise fetch relies on: a known handle
 *    type, a sender pid above 0, fds only for POSIX fd and each >= 0, a
 *    token fd >= 0 for POSIX fd and -1 for fabric, a descriptor no longer
 *    than kMaxDesc;
 *  - encoded again it gives back the input's bytes (the codec's writer and
 *    reader agree, and nothing of the input is ignored). */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fabpool.h"
#include "torch_ipc.hpp"

namespace ipc = fabpool_torch::ipc;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_torch_handle: %s\n", what);
    abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    std::string bytes(reinterpret_cast<const char *>(data), size);
    ipc::Handle h;
    std::string why;
    if (!ipc::decode(bytes, &h, &why)) {
        if (why.empty())
            fail("a refusal without a message");
        return 0;
    }
    bool posix = h.type == FABPOOL_HANDLE_POSIX_FD;
    if (!posix && h.type != FABPOOL_HANDLE_FABRIC)
        fail("an unknown handle type accepted");
    if (h.pid <= 0)
        fail("a sender pid of 0 or below accepted");
    if (posix ? (h.fds.empty() || h.token_fd < 0) : (!h.fds.empty() || h.token_fd != -1))
        fail("fds or a token fd that do not fit the handle type accepted");
    for (int fd : h.fds)
        if (fd < 0)
            fail("a negative fd number accepted");
    if (h.desc.size() > ipc::kMaxDesc || h.fds.size() > ipc::kMaxDesc)
        fail("a descriptor or fd count past the bound accepted");
    if (ipc::encode(h) != bytes)
        fail("encoded again, the handle is not the input");
    return 0;
}
