#!/usr/bin/env python3
"""patch.py COPY - edits a copy of DeepEP's hybrid-ep tree (never the
checkout itself) to use fabpool's allocator, in two parts:

1. the drop-in (what a DeepEP user writes): in csrc/hybrid_ep/allocator/
   allocator.cuh, upstream's MemHandle and ExtendedMemoryAllocator give way to
   an include and two aliases; allocator.cu is then left out of the build
   (build.py --fabpool lists seven sources instead of eight);
2. growth in place (docs/integration.md, "Growing in place"): update_buffer
   grows the shared buffers with resize + get_delta and applies the peers'
   handles with update_handle instead of release_buffer + allocate_buffer, when
   FABPOOL_HYBRIDEP_INPLACE=1 and only token counts changed.  Every regrow
   (either path) appends one line to $FABPOOL_HYBRIDEP_TIMING if set: the
   path, its total, the allocator's map/export/import/unmap time, the handle
   all-gather time and the handle bytes all-gathered per rank.

Anchors are upstream's text at 94a9f8f (hybrid-ep branch); a missing anchor
stops the patch with its name (exit 1)."""
import os
import sys

DROPIN = """
// ---- fabpool: the drop-in (an include and two aliases; allocator.cu is not built) ----
#include "fabpool_hybridep.hpp"
using MemHandle = fabpool_hybridep::MemHandle;
using ExtendedMemoryAllocator = fabpool_hybridep::ExtendedMemoryAllocator;
"""

DECL = """    // fabpool: grow the shared buffers in place (resize + get_delta + update_handle)
    bool fabpool_grow_in_place(const BufferConfig& before, double* gather_us, long* gathered_bytes);
"""

GROW = r'''
// ---- fabpool: growth in place (docs/integration.md, "Growing in place") ----
bool NVLCoordinator::fabpool_grow_in_place(const BufferConfig& before, double* gather_us, long* gathered_bytes) {
    const BufferConfig& c = buffer_config;
    // only token counts (and chunk sizes) may change: anything else takes upstream's path
    if (c.hidden_dim != before.hidden_dim || c.num_of_experts_per_rank != before.num_of_experts_per_rank ||
        c.num_of_ranks_per_node != before.num_of_ranks_per_node || c.num_of_nodes != before.num_of_nodes ||
        c.num_of_nodes > 1 || c.num_of_blocks_preprocessing_api != before.num_of_blocks_preprocessing_api)
        return false;
    CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t experts = (int64_t)c.num_of_experts_per_rank * c.num_of_ranks_per_node;
    const int64_t flags_d = (int64_t)c.num_of_dispatch_chunks * c.num_of_ranks_per_node * c.num_of_nodes;
    const int64_t flags_c = (int64_t)c.num_of_combine_chunks * c.num_of_ranks_per_node * c.num_of_nodes;
    const size_t tok = get_token_data_type_size(c.token_data_type);
    struct Shared { void* own; size_t bytes; void** views[2]; };
    Shared s[7] = {
        {combine_buffers.expert_input_token, (size_t)(max_num_of_tokens * c.hidden_dim) * sizeof(uint16_t),
         {(void**)combine_buffers.expert_input_token_all_ranks,
          use_shared_buffer ? (void**)dispatch_buffers.expert_output_token_all_ranks : nullptr}},
        {combine_buffers.expert_input_prob, (size_t)(max_num_of_tokens * experts) * sizeof(float),
         {(void**)combine_buffers.expert_input_prob_all_ranks,
          use_shared_buffer ? (void**)dispatch_buffers.expert_output_prob_all_ranks : nullptr}},
        {combine_buffers.intra_node_expert_input_chunk_flags, (size_t)flags_c * sizeof(uint32_t),
         {(void**)combine_buffers.intra_node_expert_input_chunk_flags_all_ranks, nullptr}},
        {dispatch_buffers.expert_output_scaling_factor, (size_t)(max_num_of_tokens * (c.hidden_dim / 128)) * sizeof(float),
         {(void**)dispatch_buffers.expert_output_scaling_factor_all_ranks, nullptr}},
        {dispatch_buffers.intra_node_expert_output_chunk_flags, (size_t)flags_d * sizeof(uint32_t),
         {(void**)dispatch_buffers.intra_node_expert_output_chunk_flags_all_ranks, nullptr}},
        {use_shared_buffer ? nullptr : dispatch_buffers.expert_output_token, (size_t)(max_num_of_tokens * c.hidden_dim) * tok,
         {(void**)dispatch_buffers.expert_output_token_all_ranks, nullptr}},
        {use_shared_buffer ? nullptr : dispatch_buffers.expert_output_prob, (size_t)(max_num_of_tokens * experts) * sizeof(float),
         {(void**)dispatch_buffers.expert_output_prob_all_ranks, nullptr}},
    };
    const int n = 7;
    uint64_t ok = 1;
    try {
        for (int i = 0; i < n; i++)
            if (s[i].own)
                remote_allocator->resize(s[i].own, s[i].bytes);
    } catch (const std::exception& e) {
        // past a buffer's window, or out of memory: this rank says so in the all-gather below,
        // and then every rank takes upstream's path (release + allocate), which all ranks share
        fprintf(stderr, "fabpool: growth in place refused (%s); every rank releases and allocates again\n", e.what());
        ok = 0;
    }
    // The flags start at 0, as after allocate_buffers (upstream memsets them there); the
    // other buffers are written before they are read.  fabpool's new memory is not zeroed.
    if (ok) {
    CUDA_CHECK(cudaMemset(combine_buffers.intra_node_expert_input_chunk_flags, 0, flags_c * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(dispatch_buffers.intra_node_expert_output_chunk_flags, 0, flags_d * sizeof(uint32_t)));
    if (local_rank == 0) {
        CUDA_CHECK(cudaMemset(dispatch_buffers.intra_node_write_completion_flags, 0, 2 * sizeof(uint32_t)));
        CUDA_CHECK(cudaMemset(combine_buffers.intra_node_write_completion_flags, 0, 2 * sizeof(uint32_t)));
    }
    CUDA_CHECK(cudaMemset(dispatch_buffers.expected_intra_node_flag_value, 0, 2 * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(dispatch_buffers.intra_node_flag_parity, 0, sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(dispatch_buffers.expected_permute_flag_value, 0, sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(combine_buffers.expected_intra_node_flag_value, 0, 2 * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(combine_buffers.intra_node_flag_parity, 0, sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(combine_buffers.expected_unpermute_flag_value, 0, sizeof(uint32_t)));
    dispatch_buffers.data_type = c.token_data_type;
    CUDA_CHECK(cudaDeviceSynchronize());
    }

    // A group of one has no peer to send handles to or to agree with: no export, no collective.
    if (process_group.attr("size")().cast<int>() == 1) {
        for (int i = 0; ok && i < n; i++)
            if (s[i].own)
                remote_allocator->peers_done(s[i].own);
        return ok != 0;
    }
    // The handles: every rank all-gathers one per shared buffer, collectively (a rank that
    // skipped this would hang the others: DeepEP issue #604); unchanged buffers send "unchanged".
    std::vector<int> idx;  // the buffers this configuration shares (the same on every rank)
    for (int i = 0; i < n; i++)
        if (s[i].own)
            idx.push_back(i);
    std::vector<MemHandle> handles(idx.size());
    memset(handles.data(), 0, handles.size() * sizeof(MemHandle));
    for (size_t k = 0; ok && k < idx.size(); k++)
        remote_allocator->get_delta(&handles[k], s[idx[k]].own);
    const size_t bytes = sizeof(ok) + handles.size() * sizeof(MemHandle);  // this rank's verdict, its handles
    auto t0 = std::chrono::steady_clock::now();
    auto torch_distributed = py::module_::import("torch.distributed");
    torch::Tensor mine = torch::empty({static_cast<int64_t>(bytes)}, torch::dtype(torch::kUInt8).device(torch::kCPU));
    memcpy(mine.data_ptr<uint8_t>(), &ok, sizeof(ok));
    memcpy(mine.data_ptr<uint8_t>() + sizeof(ok), handles.data(), bytes - sizeof(ok));
    auto mine_cuda = mine.cuda();
    int world_size = process_group.attr("size")().cast<int>();
    py::list out;
    for (int i = 0; i < world_size; i++)
        out.append(torch::empty_like(mine_cuda));
    torch_distributed.attr("all_gather")(out, mine_cuda, process_group);
    std::vector<torch::Tensor> all;
    for (int i = 0; i < world_size; i++)
        all.push_back(out[i].cast<torch::Tensor>().cpu());
    *gather_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    *gathered_bytes += (long)bytes;
    for (int i = 0; i < world_size; i++) {
        uint64_t theirs;
        memcpy(&theirs, all[i].data_ptr<uint8_t>(), sizeof(theirs));
        if (!theirs)
            return false;  // every rank sees the same verdicts: all take upstream's path
    }
    auto global_offset = node_rank * c.num_of_ranks_per_node;
    for (int r = 0; r < c.num_of_ranks_per_node; r++) {
        if (r == local_rank)
            continue;
        const uint8_t* base = all[r + global_offset].data_ptr<uint8_t>() + sizeof(ok);
        for (size_t k = 0; k < idx.size(); k++) {
            MemHandle h;
            memcpy(&h, base + sizeof(MemHandle) * k, sizeof(MemHandle));
            for (void** views : s[idx[k]].views)
                if (views)
                    remote_allocator->update_handle(views[r], &h);  // the view's address stays
        }
    }
    if (world_size > 1) {
        auto t1 = std::chrono::steady_clock::now();
        torch_distributed.attr("barrier")(py::arg("group") = process_group);  // every peer has applied them
        *gather_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count();
    }
    for (int i = 0; i < n; i++)
        if (s[i].own)
            remote_allocator->peers_done(s[i].own);
    return true;
}
'''

AGREE = """  if (fabpool_hybridep::agree_enabled()) {
    // fabpool: every rank sizes for the group's largest need, so every rank regrows or none does
    std::vector<std::int64_t> need = {config.max_num_of_tokens_per_rank, config.hidden_dim,
        config.num_of_experts_per_rank, config.num_of_ranks_per_node, config.num_of_nodes,
        config.num_of_blocks_preprocessing_api, (std::int64_t)get_token_data_type_size(config.token_data_type)};
    need = fabpool_hybridep::agree_max(process_group, need);
    config.max_num_of_tokens_per_rank = (int)need[0];
    config.hidden_dim = (int)need[1];
    config.num_of_experts_per_rank = (int)need[2];
    config.num_of_ranks_per_node = (int)need[3];
    config.num_of_nodes = (int)need[4];
    config.num_of_blocks_preprocessing_api = (int)need[5];
    if ((std::int64_t)get_token_data_type_size(config.token_data_type) < need[6])
      config.token_data_type = APP_TOKEN_DATA_TYPE::UINT16;
  }
"""

UPDATE_OLD = """  if(need_reallocate) {
    nvl_coordinator.update_config(buffer_config);
#ifdef HYBRID_EP_BUILD_MULTINODE_ENABLE
    internode_coordinator.update_config(buffer_config);
#endif
    allgather_obj.update_config(buffer_config);
    release_buffer();
    allocate_buffer();
  }
  return need_reallocate;"""

UPDATE_NEW = """  if(need_reallocate) {
    // fabpool: the allocator's counters and a clock around either path
    auto t0 = std::chrono::steady_clock::now();
    fabpool_hybridep::Stats s0 = remote_allocator.stats();
    auto p0 = fabpool_hybridep::detail::PrivateBlocks::get().times();
    double gather_us = 0, release_us = 0;
    long gathered = 0;
    nvl_coordinator.update_config(buffer_config);
#ifdef HYBRID_EP_BUILD_MULTINODE_ENABLE
    internode_coordinator.update_config(buffer_config);
#endif
    allgather_obj.update_config(buffer_config);
    const char* inplace_env = std::getenv("FABPOOL_HYBRIDEP_INPLACE");
    bool inplace = inplace_env && std::string(inplace_env) == "1" &&
                   nvl_coordinator.fabpool_grow_in_place(fabpool_before, &gather_us, &gathered);
    if (inplace) {
      // the custom all-gather's buffers (small) take upstream's path
      allgather_obj.destroy();
      allgather_obj.allocate_buffers();
      gathered += 2 * (long)sizeof(MemHandle);
      executor.set_intra_node_buffers(&nvl_coordinator.dispatch_buffers, &nvl_coordinator.combine_buffers);
      CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      auto r0 = std::chrono::steady_clock::now();
      release_buffer();
      release_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - r0).count();
      allocate_buffer();
      // upstream all-gathers 9 handles (dispatch 5, combine 4) and the custom all-gather's 2
      gathered = 11 * (long)sizeof(MemHandle);
    }
    if (const char* path = std::getenv("FABPOOL_HYBRIDEP_TIMING")) {
      double total = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      fabpool_hybridep::Stats s1 = remote_allocator.stats();
      auto p1 = fabpool_hybridep::detail::PrivateBlocks::get().times();
      if (FILE* f = fopen(path, "a")) {
        fprintf(f, "%s handle=%s tokens=%d total_us=%.1f map_us=%.1f export_us=%.1f import_us=%.1f unmap_us=%.1f "
                   "gather_us=%.1f gathered_bytes=%ld exports=%llu full_reexports=%llu compactions=%llu reuses=%llu "
                   "release_us=%.1f private_us=%.1f private_sync_us=%.1f\\n",
                inplace ? "inplace" : "realloc",
                remote_allocator.handle_type() == FABPOOL_HANDLE_FABRIC ? "fabric" : "posix_fd",
                (int)buffer_config.max_num_of_tokens_per_rank, total,
                (s1.ns_map - s0.ns_map) / 1e3, (s1.ns_export - s0.ns_export) / 1e3,
                (s1.ns_import - s0.ns_import) / 1e3, (s1.ns_unmap - s0.ns_unmap) / 1e3, gather_us, gathered,
                (unsigned long long)(s1.exports - s0.exports),
                (unsigned long long)(s1.full_reexports - s0.full_reexports),
                (unsigned long long)(s1.compactions - s0.compactions),
                (unsigned long long)(s1.reuses - s0.reuses), release_us,
                (p1.ns_alloc - p0.ns_alloc + p1.ns_free - p0.ns_free) / 1e3, (p1.ns_sync - p0.ns_sync) / 1e3);
        fclose(f);
      }
    }
  }
  return need_reallocate;"""


def edit(path, old, new, what):
    with open(path) as f:
        s = f.read()
    if old not in s:
        sys.exit(f"patch.py: anchor not found in {path}: {what}")
    with open(path, "w") as f:
        f.write(s.replace(old, new, 1))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    hep = os.path.join(root, "csrc", "hybrid_ep")
    # 1. the drop-in: upstream's includes stay, its two types give way to the aliases
    p = os.path.join(hep, "allocator", "allocator.cuh")
    with open(p) as f:
        s = f.read()
    at = s.find("struct MemHandle {")
    if at < 0:
        sys.exit(f"patch.py: anchor not found in {p}: struct MemHandle")
    with open(p, "w") as f:
        f.write(s[:at] + DROPIN)
    # 2. growth in place
    edit(os.path.join(hep, "buffer", "intranode.cuh"),
         "    void exchange_remote_nvl_info();\n",
         "    void exchange_remote_nvl_info();\npublic:\n" + DECL + "private:\n",
         "NVLCoordinator::exchange_remote_nvl_info declaration")
    with open(os.path.join(hep, "buffer", "intranode.cu"), "a") as f:
        f.write(GROW)
    edit(os.path.join(hep, "buffer", "intranode.cu"), '#include "intranode.cuh"\n',
         '#include "intranode.cuh"\n#include <chrono>\n#include <cstdio>\n#include <vector>\n', "intranode.cu include")
    hcu = os.path.join(hep, "hybrid_ep.cu")
    edit(hcu, UPDATE_OLD, UPDATE_NEW, "update_buffer's reallocation")
    edit(hcu, "  bool need_reallocate = false;\n",
         "  const BufferConfig fabpool_before = buffer_config;  // fabpool: what the buffers were sized for\n"
         + AGREE + "  bool need_reallocate = false;\n", "update_buffer's first line")
    edit(hcu, '#include <functional>\n', '#include <functional>\n#include <chrono>\n#include <cstdlib>\n',
         "hybrid_ep.cu includes")
    print(f"patch.py: {root}: allocator.cuh aliased to fabpool_hybridep; update_buffer grows in place "
          f"with FABPOOL_HYBRIDEP_INPLACE=1 and agrees first with FABPOOL_HYBRIDEP_AGREE=1")


if __name__ == "__main__":
    main()
