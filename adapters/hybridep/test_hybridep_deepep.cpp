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
 * driver holds (the live set only, and 0 at the end), and is_accessible.
 *
 * Ranks with different token counts (HYBRIDEP_UNEVEN=1): at each step one
 * rank has a new high and the others fewer tokens than their buffers hold.
 * Each step is update_buffer, then a stand-in of the dispatch kernel (every
 * rank stamps its flags and spins on every peer's, as HybridEP's kernels
 * spin on flags), then the data check.  Without the agreement the rank that
 * grows waits in the regrow's first collective for peers that never enter it,
 * and the peers spin on its flags: HYBRIDEP_EXPECT_HANG=SECONDS expects
 * exactly that (each wait bounded by SECONDS, then the ranks drain the
 * collective and free everything).  With FABPOOL_HYBRIDEP_AGREE=1
 * update_buffer first takes the group's largest need (agree_max, through the
 * stand-in torch.distributed.all_reduce), every rank grows at every step,
 * and nothing waits. */
#include <mpi.h>
#include <pybind11/embed.h>

#undef _GNU_SOURCE
#include "../../tests/testutil.h"

/* ---- the edit of DeepEP's allocator.cuh (adapters/hybridep/deepep-run.sh makes the same) ---- */
#include "fabpool_hybridep.hpp"
using MemHandle = fabpool_hybridep::MemHandle;
using ExtendedMemoryAllocator = fabpool_hybridep::ExtendedMemoryAllocator;
/* ---- */

#include <chrono>
#include <string>
#include <vector>

namespace py = pybind11;

static int rank, nranks;
static double wait_limit_s = 60; /* a wait longer than this is a hang */

/* A rank waited wait_limit_s for peers that did not come. */
struct Hang {
    const char *where;
    double waited_s;
};
static double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
    m.def("allreduce_max", [](py::list l) {
        std::vector<int64_t> v, out(l.size());
        for (py::handle x : l)
            v.push_back(x.cast<int64_t>());
        MPI_Allreduce(v.data(), out.data(), (int)v.size(), MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        py::list r;
        for (int64_t x : out)
            r.append(x);
        return r;
    });
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
class IntTensor:
    def __init__(self, v, device='cpu'):
        self.v, self.device = [int(x) for x in v], device
    def cuda(self): return IntTensor(self.v, 'cuda')
    def cpu(self): return IntTensor(self.v, 'cpu')
    def tolist(self): return list(self.v)
torch.int64 = 'int64'
def tensor(v, dtype=None):
    assert dtype == 'int64'
    return IntTensor(v)
class ReduceOp:
    MAX = 'max'
def all_reduce(t, op=None, group=None):
    assert t.device == 'cuda', 'NCCL all-reduces CUDA tensors'
    assert op == ReduceOp.MAX and group is not None
    t.v = fabpool_test_mpi.allreduce_max(t.v)
torch.tensor, dist.all_reduce, dist.ReduceOp = tensor, all_reduce, ReduceOp
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
    py::object group; /* the process group update_buffer agrees over */
    int64_t hidden = 7168, experts = 8, tokens_per_chunk = 128, max_tokens_per_rank = 0;
    MPI_Request pending = MPI_REQUEST_NULL; /* a collective a hang left behind */

    Buffer(int64_t tokens, py::object g) : group(std::move(g))
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
        if (fabpool_hybridep::agree_enabled())
            tokens = fabpool_hybridep::agree_max(group, {tokens})[0];
        if (tokens <= max_tokens_per_rank)
            return false;
        /* (HybridEP: cudaDeviceSynchronize, and peers done with the buffers) the regrow's first collective,
         * its wait bounded: a peer that does not regrow never enters it */
        MPI_Ibarrier(MPI_COMM_WORLD, &pending);
        double t0 = now_s();
        for (int done = 0; !done;) {
            MPI_Test(&pending, &done, MPI_STATUS_IGNORE);
            if (!done && now_s() - t0 > wait_limit_s)
                throw Hang{"update_buffer, in the regrow's collective", now_s() - t0};
        }
        nvl.destroy();
        nvl = Coordinator{&remote_allocator, rank, nranks};
        allocate_buffer(tokens);
        return true;
    }
};

static uint64_t pat(int r, int step, int k) { return ((uint64_t)r << 48) ^ ((uint64_t)step << 8) ^ (uint64_t)k; }

/* The dispatch kernel, stood in for: stamp this rank's chunk flags with the step, then spin on every peer's
 * (stamps only rise), each spin bounded by wait_limit_s. */
static void dispatch(Buffer &b, uint32_t stamp)
{
    const size_t at = sizeof(uint32_t); /* (check_data writes the first flag) */
    CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)b.nvl.intra_node_expert_input_chunk_flags + at, &stamp, 4));
    CHECK_CU(cuCtxSynchronize());
    double t0 = now_s();
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        for (uint32_t got = 0;;) {
            CHECK_CU(cuMemcpyDtoH(&got, (CUdeviceptr)(uintptr_t)b.nvl.chunk_flags_all_ranks[q] + at, 4));
            if (got >= stamp)
                break;
            if (now_s() - t0 > wait_limit_s)
                throw Hang{"dispatch, spinning on a peer's flags", now_s() - t0};
            usleep(200);
        }
    }
}

/* Step t's token count of rank r: rank (t-1) % ranks has a new high (1,024 t), the others fewer tokens than
 * their buffers hold. */
static int64_t uneven_tokens(int r, int t) { return r == (t - 1) % nranks ? 1024 * t : 512 - 16 * r; }

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

/* The driver calls a regrow costs: chunks created, exported and imported. */
struct Calls {
    uint64_t create = 0, exp = 0, imp = 0;
};
static Calls calls(ExtendedMemoryAllocator &a)
{
    fabpool_stats st{};
    st.struct_size = sizeof st;
    fabpool_get_stats(a.pool(), &st);
    Calls c;
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && st.driver_call_names[i]; i++) {
        const char *n = st.driver_call_names[i];
        uint64_t v = st.driver_calls[i];
        if (!strcmp(n, "cuMemCreate"))
            c.create = v;
        else if (!strcmp(n, "cuMemExportToShareableHandle"))
            c.exp = v;
        else if (!strcmp(n, "cuMemImportFromShareableHandle"))
            c.imp = v;
    }
    return c;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int sim = t_driver_init();
    const char *expect = getenv("EXPECT_HANDLE");
    fabpool_handle_type want = expect && strcmp(expect, "fabric") == 0 ? FABPOOL_HANDLE_FABRIC : FABPOOL_HANDLE_POSIX_FD;
    CHECK(sizeof(MemHandle) <= 1024); /* a handle of a kilobyte at most, all-gathered per buffer */
    int64_t held0 = t_held(), peak = 0, live_top = 0;
    long regrows = 0, opened = 0, accessible = 0;
    uint64_t regrow_imports = 0;
    const bool keep_on = !getenv("FABPOOL_CONF") || !strstr(getenv("FABPOOL_CONF"), "keep_ms:0");
    int detected = -1;
    const bool uneven = getenv("HYBRIDEP_UNEVEN") && atoi(getenv("HYBRIDEP_UNEVEN"));
    const char *expect_hang = getenv("HYBRIDEP_EXPECT_HANG");
    if (expect_hang)
        wait_limit_s = atof(expect_hang);
    /* where each rank waited in vain: 0 nowhere, 1 in update_buffer, 2 in the dispatch (rank 0 gathers) */
    int hung_at = 0;
    double waited = 0;
    std::vector<int> hung_all((size_t)nranks);
    py::scoped_interpreter python; /* (outlives the try: a Python error's what() needs it) */
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
        py::dict scope = py::module_::import("__main__").attr("__dict__");
        py::exec(kTorchStandIn, scope);
        scope["group"] = scope["Group"](rank, nranks);
        py::exec(kDetect, scope);
        detected = scope["detected_ranks"].cast<int>();
        CHECK(detected == nranks);

        {
            Buffer b(512, scope["group"]);
            CHECK(b.remote_allocator.handle_type() == want);
            CHECK(b.remote_allocator.device() == 0);
            check_data(b, 0);
            for (int t = 1; t <= 4; t++) {
                bool grew = false;
                Calls c0 = calls(b.remote_allocator);
                try {
                    grew = b.update_buffer(uneven ? uneven_tokens(rank, t) : 1024 * t);
                    dispatch(b, (uint32_t)t);
                } catch (const Hang &h) {
                    hung_at = b.pending != MPI_REQUEST_NULL ? 1 : 2;
                    waited = h.waited_s;
                    fprintf(stderr, "rank %d, step %d: waited %.1f s in %s\n", rank, t, h.waited_s, h.where);
                    /* the ranks that did not regrow enter its collective now, and every rank says where it
                     * waited; then the buffers of before the step are freed */
                    if (b.pending == MPI_REQUEST_NULL)
                        MPI_Ibarrier(MPI_COMM_WORLD, &b.pending); /* (only a nonblocking one matches it) */
                    MPI_Wait(&b.pending, MPI_STATUS_IGNORE);
                }
                int any = hung_at, hung_any = 0;
                MPI_Allreduce(&any, &hung_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
                if (hung_any) {
                    MPI_Gather(&hung_at, 1, MPI_INT, hung_all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
                    break;
                }
                regrows += grew;
                check_data(b, t);
                if (grew && !uneven) {
                    /* DeepEP's regrow frees and allocates every buffer and opens every peer's handle again;
                     * kept (keep_ms, the default) only the two buffers that grow (token, prob) map, export
                     * and import anything, one chunk each; given back at once, all of them */
                    Calls c1 = calls(b.remote_allocator);
                    uint64_t created = c1.create - c0.create, exported = c1.exp - c0.exp,
                             imported = c1.imp - c0.imp;
                    if (keep_on)
                        CHECK(created >= 1 && created <= 2 && exported == created &&
                              imported == created * (uint64_t)(nranks - 1));
                    else
                        CHECK(created >= 3 && imported >= 3 * (uint64_t)(nranks - 1));
                    if (getenv("HYBRIDEP_VERBOSE"))
                        fprintf(stderr, "rank %d step %d: created %llu exported %llu imported %llu\n", rank, t,
                                (unsigned long long)created, (unsigned long long)exported,
                                (unsigned long long)imported);
                    regrow_imports += imported;
                }
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
    if (expect_hang) {
        /* the regrowing rank waited in its collective, every other rank in the dispatch */
        if (!rank)
            for (int q = 0; q < nranks; q++)
                CHECK(hung_all[(size_t)q] == (q == 0 ? 1 : 2));
        CHECK(hung_at && waited >= wait_limit_s && regrows == 0);
    } else {
        CHECK(!hung_at);
        CHECK(regrows == 4 && opened == 3L * (nranks - 1) && accessible == nranks - 1);
    }
    CHECK(t_near(t_held(), held0));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    }
    int fails = t_failures, total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!rank && expect_hang)
        printf("test_hybridep_deepep: ranks with different token counts, no agreement: rank 0 (a new high) waited "
               "%.1f s in the regrow's collective, ranks 1-%d waited in the dispatch for its flags: the hang of "
               "ranks that disagree about regrowing\n", waited, nranks - 1);
    if (!rank)
        printf("test_hybridep_deepep: %d ranks, %s handles (%zu bytes each), %d ranks detected, %ld regrows "
               "(%s: rank 0 imported %llu chunks in them), rank 0 held at most %lld MiB (live set %lld MiB), %d "
               "failed checks over all ranks\n",
               nranks, want == FABPOOL_HANDLE_FABRIC ? "fabric" : "POSIX fd", sizeof(MemHandle), detected, regrows,
               keep_on ? "freed buffers and closed views kept" : "keep_ms:0", (unsigned long long)regrow_imports,
               (long long)(peak >> 20), (long long)(live_top >> 20), total);
    MPI_Finalize();
    return total ? 1 : 0;
}
