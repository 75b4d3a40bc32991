/* hybridep_sizes.h - HybridEP's buffer sizing, as DeepEP's hybrid-ep code
 * computes it (HybridEpBuffer::allocate_buffer_for_combine/_dispatch and the
 * Python side's update_buffer), for the buffers its ExtendedMemoryAllocator
 * shares between the ranks of one NVLink domain (one node: num_of_nodes 1,
 * so the dispatch buffers are the combine buffers and the RDMA buffers are
 * empty):
 *
 *   tokens per rank  = max(512, align_up(num_of_tokens_per_rank, 16)); the
 *                      buffer config keeps the highest value seen
 *   tokens for experts = tokens per rank * ranks per NVLink domain * nodes
 *   expert_input_token = tokens for experts * hidden * sizeof(uint16) (bf16)
 *   expert_input_prob  = tokens for experts * (experts per rank * ranks per
 *                        NVLink domain) * sizeof(float)
 *
 * (fp8 dispatch would add tokens for experts * hidden/128 floats of scaling
 * factors; the 4-byte completion flags of local rank 0 never grow.) */
#ifndef FABPOOL_HYBRIDEP_SIZES_H
#define FABPOOL_HYBRIDEP_SIZES_H

#include <cstddef>
#include <cstdint>

struct HybridEpShape {
    std::uint64_t hidden = 7168;        /* DeepSeek-V3's hidden size */
    std::uint64_t token_bytes = 2;      /* bf16, sent as uint16 */
    std::uint64_t experts_per_rank = 8;
    std::uint64_t ranks_per_domain = 4; /* ranks of the NVLink domain */
    std::uint64_t nodes = 1;
};

constexpr int kHybridEpBuffers = 2; /* expert_input_token, expert_input_prob */
static const char *const kHybridEpBufferNames[kHybridEpBuffers] = {"expert_input_token", "expert_input_prob"};

/* HybridEP's per-call alignment of num_of_tokens_per_rank, and its floor */
inline std::uint64_t hybridep_tokens(std::uint64_t num_of_tokens_per_rank)
{
    std::uint64_t t = (num_of_tokens_per_rank + 15) / 16 * 16;
    return t < 512 ? 512 : t;
}

inline void hybridep_sizes(const HybridEpShape &s, std::uint64_t tokens_per_rank, std::size_t out[kHybridEpBuffers])
{
    std::uint64_t te = tokens_per_rank * s.ranks_per_domain * s.nodes;
    out[0] = (std::size_t)(te * s.hidden * s.token_bytes);
    out[1] = (std::size_t)(te * s.experts_per_rank * s.ranks_per_domain * 4);
}

/* what both HybridEP tests share: testutil.h (which defines _GNU_SOURCE
 * itself: g++ predefines it) and the adapter's names */
#ifdef HYBRIDEP_TEST
#undef _GNU_SOURCE
#include "../../tests/testutil.h"
#include "fabpool_hybridep.hpp"

using fabpool_hybridep::Error;
using fabpool_hybridep::ExtendedMemoryAllocator;
using fabpool_hybridep::HandleInfo;
using fabpool_hybridep::MemHandle;

static const int NB = kHybridEpBuffers;
#endif

#endif
