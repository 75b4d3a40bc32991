#!/usr/bin/env python3
"""build.py --src COPY --build DIR [--fabpool INCLUDE_DIR LIB_DIR] - builds
DeepEP's hybrid_ep_cpp extension from a copy of its tree with PyTorch's
cpp_extension.load, as setup.py's get_extension_hybrid_ep_cpp lists it
(one node, no NVSHMEM): its eight sources (seven with --fabpool: the
allocator is fabpool_hybridep.hpp, allocator.cu is not built), include dirs
csrc/hybrid_ep and csrc/hybrid_ep/backend, nvcc -std=c++17
--expt-relaxed-constexpr -O3, SM_ARCH the quoted TORCH_CUDA_ARCH_LIST (9.0
on the H200; by a pre-included header, so no shell quoting is involved), and
-lcuda.  The module lands in DIR/hybrid_ep_cpp.so.  Run with CC and CXX set
to the system gcc: a module built with another g++ than PyTorch's crashed in
its first std::ostringstream on the H200."""
import argparse
import os
import sys
import time

SOURCES = [
    "csrc/hybrid_ep/hybrid_ep.cu",
    "csrc/hybrid_ep/buffer/intranode.cu",
    "csrc/hybrid_ep/allocator/allocator.cu",
    "csrc/hybrid_ep/jit/compiler.cu",
    "csrc/hybrid_ep/executor/executor.cu",
    "csrc/hybrid_ep/extension/permute.cu",
    "csrc/hybrid_ep/extension/allgather.cu",
    "csrc/hybrid_ep/pybind_hybrid_ep.cu",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--fabpool", nargs=2, metavar=("INCLUDE_DIR", "LIB_DIR"))
    a = ap.parse_args()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from torch.utils.cpp_extension import load

    src = os.path.abspath(a.src)
    os.makedirs(a.build, exist_ok=True)
    sm_h = os.path.join(os.path.abspath(a.build), "sm_arch.h")
    with open(sm_h, "w") as f:
        f.write('#define SM_ARCH "%s"\n' % os.environ["TORCH_CUDA_ARCH_LIST"])
    sources = [os.path.join(src, s) for s in SOURCES]
    incs = [os.path.join(src, "csrc/hybrid_ep"), os.path.join(src, "csrc/hybrid_ep/backend")]
    ld = ["-lcuda"]
    if a.fabpool:
        sources = [s for s in sources if not s.endswith("allocator/allocator.cu")]
        inc, lib = (os.path.abspath(p) for p in a.fabpool)
        incs += [inc, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # + fabpool_hybridep.hpp
        ld += ["-L" + lib, "-lfabpool", "-Wl,-rpath," + lib]
    t0 = time.time()
    load(name="hybrid_ep_cpp", sources=sources, extra_include_paths=incs, extra_cflags=["-O3", "-std=c++17"],
         extra_cuda_cflags=["-std=c++17", "--expt-relaxed-constexpr", "-O3", "-include", sm_h],
         extra_ldflags=ld, build_directory=a.build, verbose=True)
    print(f"build.py: hybrid_ep_cpp built and imported in {time.time() - t0:.0f} s "
          f"({'fabpool' if a.fabpool else 'upstream'} allocator, {len(sources)} sources) -> {a.build}")


if __name__ == "__main__":
    sys.exit(main())
