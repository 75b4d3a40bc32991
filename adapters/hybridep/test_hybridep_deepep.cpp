/* test_hybridep_deepep: a stand-in for DeepEP's hybrid-ep call sites of its
 * allocator, compiled against the adapter by the same edit a DeepEP user makes
 * (an include and two aliases in allocator.cuh), and run over the ranks of an
 * MPI job.  What it does is what DeepEP does (hybrid-ep branch, 94a9f8f):
 *
 *   - pybind_hybrid_ep.cu binds the class: py::class_<ExtendedMemoryAllocator>
 *     with py::init<>() and detect_accessible_ranks(process_group);
 *   - hybrid_ep_buffer.py calls ExtendedMemoryAllocator().detect_accessible_ranks
 *     (group) from Python: here with a stand-in `torch` module whose
 *     distributed.all_gather is an MPI_Allgather (no PyTorch needed);
 *   - HybridEPBuffer holds `ExtendedMemoryAllocator remote_allocator;` (default
 *     constructed: the current device, USE_MNNVL), and NVLCoordinator
 *     (buffer/intranode.cu) allocates its shared buffers with allocate(void **,
 *     size_t), packs `MemHandle handles[N]` with get_handle into bytes that
 *     are all-gathered, opens the peers' with open_handle(void **, MemHandle *)
 *     from the bytes alone (POSIX fd: pidfd_getfd), and on every growth
 *     (update_buffer) releases everything (free, close_handle) and allocates
 *     it again.
 *
 * It checks: the handle type the environment asks for (EXPECT_HANDLE: fabric,
 * or posix_fd where USE_MNNVL=0 or where fabric does not work), the device of
 * the current context, every peer's data through the views, the bytes the
 * driver holds (the live set only, and 0 at the end), and is_accessible. */
#include <mpi.h>
#include <pybind11/embed.h>

#undef _GNU_SOURCE
#include "../../tests/testutil.h"

/* ---- the edit of DeepEP's allocator.cuh (adapters/hybridep/deepep-run.sh makes the same) ---- */
#include "fabpool_hybridep.hpp"
using MemHandle = fabpool_hybridep::MemHandle;
using ExtendedMemoryAllocator = fabpool_hybridep::ExtendedMemoryAllocator;
/* ---- */

#include <string>
#include <vector>

namespace py = pybind11;

static int rank, nranks;

/* pybind_hybrid_ep.cu's binding, verbatim in shape */
PYBIND11_EMBEDDED_MODULE(hybrid_ep_cpp, m)
{
    pybind11::class_<ExtendedMemoryAllocator>(m, "ExtendedMemoryAllocator")
        .def(py::init<>())
        .def("detect_accessible_ranks", &ExtendedMemoryAllocator::detect_accessible_ranks, py::arg("process_group"));
}

/* the transport of the stand-in torch.distributed.all_gather */
PYBIND11_EMBEDDED_MODULE(fabpool_test_mpi, m)
{
    m.def("allgather", [](py::bytes b) {
        std::string s = b;
        std::vector<char> all(s.size() * (size_t)nranks);
        MPI_Allgather(s.data(), (int)s.size(), MPI_BYTE, all.data(), (int)s.size(), MPI_BYTE, MPI_COMM_WORLD);
        py::list out;
        for (int q = 0; q < nranks; q++)
            out.append(py::bytes(all.data() + s.size() * (size_t)q, s.size()));
        return out;
    });
}

/* what detect_accessible_ranks uses of torch, no more */
static const char *kTorchStandIn = R"(
import sys, types, fabpool_test_mpi
class Tensor:
    def __init__(self, b, device='cpu'):
        self.b, self.device = bytes(b), device
    def cuda(self): return Tensor(self.b, 'cuda')
    def cpu(self): return Tensor(self.b, 'cpu')
    def tolist(self): return list(self.b)
torch = types.ModuleType('torch')
dist = types.ModuleType('torch.distributed')
torch.uint8 = 'uint8'
def frombuffer(buf, dtype=None):
    assert dtype == 'uint8'
    return Tensor(buf)
def empty_like(t): return Tensor(b'\0' * len(t.b), t.device)
def all_gather(out, t, group=None):
    assert t.device == 'cuda', 'NCCL all-gathers CUDA tensors'
    assert len(out) == group.size()
    for o, g in zip(out, fabpool_test_mpi.allgather(t.b)):
        o.b = g
torch.frombuffer, torch.empty_like, dist.all_gather, torch.distributed = frombuffer, empty_like, all_gather, dist
sys.modules['torch'], sys.modules['torch.distributed'] = torch, dist
class Group:
    def __init__(self, rank, size): self._r, self._n = rank, size
    def rank(self): return self._r
    def size(self): return self._n
)";

/* hybrid_ep_buffer.py's two lines */
static const char *kDetect = R"(
import hybrid_ep_cpp
allocator = hybrid_ep_cpp.ExtendedMemoryAllocator()
detected_ranks = allocator.detect_accessible_ranks(group)
del allocator
)";

/* ---------------------------------------------- NVLCoordinator, cut down */

struct Coordinator {
    ExtendedMemoryAllocator *remote_allocator = nullptr;
    int local_rank = 0, ranks = 0;
    uint16_t *expert_input_token = nullptr;
    float *expert_input_prob = nullptr;
    uint32_t *intra_node_write_completion_flags = nullptr; /* local rank 0's, the others open it */
    uint32_t *intra_node_expert_input_chunk_flags = nullptr;
    uint16_t *expert_input_token_all_ranks[16] = {};
    float *expert_input_prob_all_ranks[16] = {};
    uint32_t *chunk_flags_all_ranks[16] = {};
    size_t token_bytes = 0, prob_bytes = 0, flag_bytes = 0;
    long opened = 0, accessible = 0;

    void allocate_combine_buffers(int64_t max_num_of_tokens, int64_t hidden, int64_t experts, int64_t chunks,
                                  MemHandle handles[4])
    {
        token_bytes = (size_t)(max_num_of_tokens * hidden) * sizeof(uint16_t);
        prob_bytes = (size_t)(max_num_of_tokens * experts * ranks) * sizeof(float);
        flag_bytes = (size_t)(chunks * ranks) * sizeof(uint32_t);
        remote_allocator->allocate((void **)&expert_input_token, token_bytes);
        remote_allocator->allocate((void **)&expert_input_prob, prob_bytes);
        if (local_rank == 0)
            remote_allocator->allocate((void **)&intra_node_write_completion_flags, 2 * sizeof(uint32_t));
        remote_allocator->allocate((void **)&intra_node_expert_input_chunk_flags, flag_bytes);
        remote_allocator->get_handle(&handles[0], expert_input_token);
        remote_allocator->get_handle(&handles[1], expert_input_prob);
        if (local_rank == 0)
            remote_allocator->get_handle(&handles[2], intra_node_write_completion_flags);
        remote_allocator->get_handle(&handles[3], intra_node_expert_input_chunk_flags);
    }

    void open_handles_from_other_ranks(const std::vector<unsigned char> &all)
    {
        const size_t per_rank = 4 * sizeof(MemHandle);
        if (local_rank != 0) {
            MemHandle h;
            memcpy(&h, all.data() + sizeof(MemHandle) * 2, sizeof(MemHandle)); /* rank 0's flags */
            remote_allocator->open_handle((void **)(&intra_node_write_completion_flags), &h);
        }
        for (int i = 0; i < ranks; i++) {
            MemHandle token, prob, flags;
            const unsigned char *base_ptr = all.data() + per_rank * (size_t)i;
            memcpy(&token, base_ptr, sizeof(MemHandle));
            memcpy(&prob, base_ptr + sizeof(MemHandle), sizeof(MemHandle));
            memcpy(&flags, base_ptr + sizeof(MemHandle) * 3, sizeof(MemHandle));
            if (i != local_rank) {
                accessible += remote_allocator->is_accessible(&token);
                remote_allocator->open_handle((void **)(&expert_input_token_all_ranks[i]), &token);
                remote_allocator->open_handle((void **)(&expert_input_prob_all_ranks[i]), &prob);
                remote_allocator->open_handle((void **)&chunk_flags_all_ranks[i], &flags);
                opened += 3;
            } else {
                expert_input_token_all_ranks[i] = expert_input_token;
                expert_input_prob_all_ranks[i] = expert_input_prob;
                chunk_flags_all_ranks[i] = intra_node_expert_input_chunk_flags;
            }
        }
    }

    void destroy()
    {
        remote_allocator->free(expert_input_token);
        remote_allocator->free(expert_input_prob);
        if (local_rank == 0)
            remote_allocator->free(intra_node_write_completion_flags);
        else
            remote_allocator->close_handle(intra_node_write_completion_flags);
        for (int i = 0; i < ranks; i++) {
            if (i == local_rank) {
                remote_allocator->free(chunk_flags_all_ranks[i]);
            } else {
                remote_allocator->close_handle(expert_input_token_all_ranks[i]);
                remote_allocator->close_handle(expert_input_prob_all_ranks[i]);
                remote_allocator->close_handle(chunk_flags_all_ranks[i]);
            }
        }
    }
};

/* HybridEPBuffer, cut down: the allocator is a default-constructed member */
struct Buffer {
    ExtendedMemoryAllocator remote_allocator;
    Coordinator nvl;
    int64_t hidden = 7168, experts = 8, tokens_per_chunk = 128, max_tokens_per_rank = 0;

    explicit Buffer(int64_t tokens)
    {
        nvl.remote_allocator = &remote_allocator;
        nvl.local_rank = rank;
        nvl.ranks = nranks;
        allocate_buffer(tokens);
    }
    ~Buffer() { nvl.destroy(); }

    void allocate_buffer(int64_t tokens)
    {
        max_tokens_per_rank = tokens;
        MemHandle handles[4];
        memset(handles, 0, sizeof handles); /* (upstream leaves handles[2] of ranks != 0 unset) */
        nvl.allocate_combine_buffers(tokens * nranks, hidden, experts, (tokens - 1) / tokens_per_chunk + 1, handles);
        std::vector<unsigned char> all(sizeof handles * (size_t)nranks);
        MPI_Allgather(handles, (int)sizeof handles, MPI_BYTE, all.data(), (int)sizeof handles, MPI_BYTE,
                      MPI_COMM_WORLD);
        nvl.open_handles_from_other_ranks(all);
    }
    /* update_buffer: a larger config releases the whole set and allocates it again */
    bool update_buffer(int64_t tokens)
    {
        if (tokens <= max_tokens_per_rank)
            return false;
        MPI_Barrier(MPI_COMM_WORLD); /* (HybridEP: cudaDeviceSynchronize, and peers done with the buffers) */
        nvl.destroy();
        nvl = Coordinator{&remote_allocator, rank, nranks};
        allocate_buffer(tokens);
        return true;
    }
};

static uint64_t pat(int r, int step, int k) { return ((uint64_t)r << 48) ^ ((uint64_t)step << 8) ^ (uint64_t)k; }

/* each rank writes into its buffers, then reads every peer's through its views */
static void check_data(Buffer &b, int step)
{
    size_t at[3] = {0, b.nvl.token_bytes / 2 & ~(size_t)7, b.nvl.token_bytes - 8};
    for (int k = 0; k < 3; k++) {
        uint64_t v = pat(rank, step, k);
        CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)b.nvl.expert_input_token + at[k], &v, 8));
    }
    uint32_t f = 0xf1a90000u + (uint32_t)rank;
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)b.nvl.intra_node_expert_input_chunk_flags, &f, 4));
    CHECK_CU(cuCtxSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        for (int k = 0; k < 3; k++) {
            uint64_t v = 0;
            CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)b.nvl.expert_input_token_all_ranks[q] + at[k], 8));
            CHECK(v == pat(q, step, k));
        }
        uint32_t g = 0;
        CHECK_CU(cuMemcpyDtoH(&g, (CUdeviceptr)(uintptr_t)b.nvl.chunk_flags_all_ranks[q], 4));
        CHECK(g == 0xf1a90000u + (uint32_t)q);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int sim = t_driver_init();
    const char *expect = getenv("EXPECT_HANDLE");
    fabpool_handle_type want = expect && strcmp(expect, "fabric") == 0 ? FABPOOL_HANDLE_FABRIC : FABPOOL_HANDLE_POSIX_FD;
    CHECK(sizeof(MemHandle) <= 512); /* a handle of a few hundred bytes, all-gathered per buffer */
    int64_t held0 = t_held(), peak = 0, live_top = 0;
    long regrows = 0, opened = 0, accessible = 0;
    int detected = -1;
    try {
        /* the current context's device, not device 0 (FABSIM_DEVICES=2: device 1 current) */
        int ndev = 0;
        cuDeviceGetCount(&ndev);
        if (ndev > 1) {
            CUcontext c1, c0;
            CUdevice d1;
            CHECK_CU(cuCtxGetCurrent(&c0));
            CHECK_CU(cuDeviceGet(&d1, 1));
            CHECK_CU(cuDevicePrimaryCtxRetain(&c1, d1));
            CHECK_CU(cuCtxSetCurrent(c1));
            {
                ExtendedMemoryAllocator on_current;
                CHECK(on_current.device() == 1);
            }
            CHECK_CU(cuCtxSetCurrent(c0));
            CHECK_CU(cuDevicePrimaryCtxRelease(d1));
        }
        {
            py::scoped_interpreter python;
            py::dict scope = py::module_::import("__main__").attr("__dict__");
            py::exec(kTorchStandIn, scope);
            scope["group"] = scope["Group"](rank, nranks);
            py::exec(kDetect, scope);
            detected = scope["detected_ranks"].cast<int>();
        }
        CHECK(detected == nranks);

        {
            Buffer b(512);
            CHECK(b.remote_allocator.handle_type() == want);
            CHECK(b.remote_allocator.device() == 0);
            check_data(b, 0);
            for (int64_t t = 1024; t <= 4096; t += 1024) {
                regrows += b.update_buffer(t);
                check_data(b, (int)t);
                int64_t h = t_held() - held0;
                peak = h > peak ? h : peak;
                /* the live set: own buffers and a view of each peer's, each rounded up to 2 MiB (what
                 * upstream's fabric path holds once nothing leaks) */
                int64_t live = 0;
                for (size_t s : {b.nvl.token_bytes, b.nvl.prob_bytes, b.nvl.flag_bytes})
                    live += (int64_t)((s + (2u << 20) - 1) / (2u << 20) * (2u << 20));
                live = live * nranks + (2 << 20); /* + rank 0's completion flags */
                live_top = live > live_top ? live : live_top;
                CHECK(h <= live + t_slack());
            }
            opened = b.nvl.opened;
            accessible = b.nvl.accessible;
            MPI_Barrier(MPI_COMM_WORLD);
        }
    } catch (const std::exception &e) {
        t_failures++;
        fprintf(stderr, "rank %d: %s\n", rank, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(regrows == 4 && opened == 3L * (nranks - 1) && accessible == nranks - 1);
    CHECK(t_near(t_held(), held0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    int fails = t_failures, total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!rank)
        printf("test_hybridep_deepep: %d ranks, %s handles (%zu bytes each), %d ranks detected, %ld regrows, rank 0 "
               "held at most %lld MiB (live set %lld MiB), %d failed checks over all ranks\n",
               nranks, want == FABPOOL_HANDLE_FABRIC ? "fabric" : "POSIX fd", sizeof(MemHandle), detected, regrows,
               (long long)(peak >> 20), (long long)(live_top >> 20), total);
    MPI_Finalize();
    return total ? 1 : 0;
}
