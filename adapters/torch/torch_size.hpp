/* torch_size.hpp - a size as PyTorch's caching allocator writes it in its out-of-memory message, for the C++
 * allocator's message and the shim's alike. */
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace fabpool_torch {

/* Up to 1024 in bytes, then KiB, MiB and GiB with two decimals, each unit up to and including 1024 of itself,
 * so that code and tests that read the message's sizes read fabpool's too. */
inline std::string torch_size(uint64_t b)
{
    char buf[48];
    if (b <= 1024)
        snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)b);
    else if (b <= (uint64_t(1) << 20))
        snprintf(buf, sizeof buf, "%.2f KiB", double(b) / 1024.0);
    else if (b <= (uint64_t(1) << 30))
        snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(uint64_t(1) << 20));
    else
        snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(uint64_t(1) << 30));
    return buf;
}

}  // namespace fabpool_torch
