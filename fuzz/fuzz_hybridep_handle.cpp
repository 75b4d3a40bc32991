/* fuzz_hybridep_handle: the HybridEP MemHandle's reader
 * (adapters/hybridep/fabpool_hybridep.hpp: read_header, fds_of) on fuzzed
 * bytes: what open_handle and update_handle take from an all-gathered
 * handle before any pidfd or view.  The input fills a 1,024-byte handle
 * (zero past its end).  For every input:
 *  - an accepted header keeps every promise open_handle relies on: a known
 *    kind and handle type, a pid above 0, a descriptor inside the handle
 *    (kDescAt + desc_len <= kHandleBytes), as many fds as records for POSIX
 *    fd (at most kMaxHandleFds, each >= 0) and none for fabric, a token fd
 *    >= 0 for POSIX fd and -1 for fabric, nothing at all for "unchanged";
 *  - fds_of returns the header's count and writes no more than its cap;
 *  - a refused header gives fds_of nothing. */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fabpool_hybridep.hpp"

using fabpool_hybridep::ExtendedMemoryAllocator;
using fabpool_hybridep::HandleInfo;
using fabpool_hybridep::HandleKind;
using fabpool_hybridep::MemHandle;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_hybridep_handle: %s\n", what);
    abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    MemHandle h;
    std::memset(h.bytes, 0, sizeof h.bytes);
    std::memcpy(h.bytes, data, size < sizeof h.bytes ? size : sizeof h.bytes);
    HandleInfo in = {};
    int fds[fabpool_hybridep::kMaxHandleFds + 1];
    for (int &fd : fds)
        fd = -7;
    if (!ExtendedMemoryAllocator::read_header(h, &in)) {
        if (ExtendedMemoryAllocator::fds_of(h, fds, fabpool_hybridep::kMaxHandleFds) != 0 || fds[0] != -7)
            fail("fds_of gave fds of a refused handle");
        return 0;
    }
    bool posix = in.type == FABPOOL_HANDLE_POSIX_FD;
    if ((int)in.kind > 2 || (!posix && in.type != FABPOOL_HANDLE_FABRIC))
        fail("an unknown kind or handle type accepted");
    if (in.pid <= 0)
        fail("a pid of 0 or below accepted");
    if (in.desc_len > fabpool_hybridep::kMaxDescBytes || fabpool_hybridep::kDescAt + in.desc_len > sizeof h.bytes)
        fail("a descriptor past the handle's end accepted");
    if (in.nfds > fabpool_hybridep::kMaxHandleFds || (!posix && in.nfds != 0))
        fail("an fd count past the bound, or fds for fabric, accepted");
    if (posix ? in.token_fd < 0 : in.token_fd != -1)
        fail("a token fd that does not fit the handle type accepted");
    if (in.kind == HandleKind::unchanged ? in.desc_len != 0 || in.nfds != 0
                                         : in.desc_len != fabpool_desc_size((in.desc_len - FABPOOL_DESC_HEADER_BYTES) /
                                                                            FABPOOL_DESC_RECORD_BYTES) ||
                                               (posix && in.nfds != (in.desc_len - FABPOOL_DESC_HEADER_BYTES) /
                                                                        FABPOOL_DESC_RECORD_BYTES))
        fail("a descriptor length that is not its records', or fds that are not one a record, accepted");
    std::size_t n = ExtendedMemoryAllocator::fds_of(h, fds, 2);
    if (n != in.nfds || fds[2] != -7)
        fail("fds_of wrote past its cap or miscounted");
    for (std::size_t i = 0; i < n && i < 2; i++)
        if (fds[i] < 0)
            fail("a negative fd number accepted");
    return 0;
}
