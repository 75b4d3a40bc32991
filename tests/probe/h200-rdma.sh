#!/bin/bash
# h200-rdma.sh - RDMA-ready memory and NCCL registration on the real driver
# (one H200).  Run from the repository root; needs CUDA 13
# (gcc, /usr/local/cuda/include), cmake, PyTorch 2.11 in python3 (or in
# /opt/torch/.venv), no network.  About 2 minutes.  Writes under $OUT:
#   rdma-h200.txt          everything below, in order, with each step's exit status
#   rdma-probe.txt         tests/probe/rdma_probe.c: the driver's answers (attributes, the RDMA flag in a
#                          chunk's properties, dma-buf over 1 chunk / 2 chunks / unaligned / a hole /
#                          mixed properties, an open dma-buf's lifetime, host NUMA create + map + access + copy)
#   conformance-records.txt the RECORD lines of test_conformance on the real driver (each one the sim
#                          answers differently is marked "<- the sim answers ...")
#   nccl_register-posix_fd.json, nccl-debug-posix_fd.txt   the NCCL registration check (PASS/FAIL + reason)
#   nccl_register-none.json, nccl-debug-none.txt           the same with a pool of handle type none
# Never stops at the first failure; the last line says what passed.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-rdma-out rdma-h200.txt
B=${FABPOOL_RDMA_BUILD:-/tmp/b-rdma}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$B"
export B CUDA_INC
build_probe() {
  gcc -std=gnu11 -O1 -I"$CUDA_INC" tests/probe/rdma_probe.c -o "$B/rdma_probe" -lcuda 2>/dev/null ||
    gcc -std=gnu11 -O1 -I"$CUDA_INC" tests/probe/rdma_probe.c -o "$B/rdma_probe" \
        -L"$(dirname "$CUDA_INC")/lib64/stubs" -lcuda
}
{
  h200_head "fabpool RDMA H200 check"
  uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  # timeout runs programs, not shell functions: hand the function to a child bash (B and CUDA_INC are exported)
  step probe-build 60 bash -c "$(declare -f build_probe); build_probe"
  step probe 60 bash -c "'$B/rdma_probe' > '$OUT/rdma-probe.txt' 2>&1"
  cat "$OUT/rdma-probe.txt"
  step configure 60 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFABPOOL_WERROR=ON
  step build 150 cmake --build "$B" -j16 --target test_conformance test_rdma fabpool_torch
  step conformance 60 bash -c "ctest --test-dir '$B' -R '^test_conformance\$' -V > '$OUT/conformance.txt' 2>&1"
  grep -E "RECORD|failed|checks" "$OUT/conformance.txt" | sed 's/^[0-9]*: //' > "$OUT/conformance-records.txt"
  cat "$OUT/conformance-records.txt"
  step test_rdma 60 ctest --test-dir "$B" -R '^test_rdma$' --output-on-failure
  step nccl-posix_fd 90 python3 tests/probe/nccl_register.py --lib "$B/adapters/torch/libfabpool_torch.so" \
       --out "$OUT" --handle-type posix_fd --symm
  step nccl-none 90 python3 tests/probe/nccl_register.py --lib "$B/adapters/torch/libfabpool_torch.so" \
       --out "$OUT" --handle-type none
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
grep -E "^(PASS|FAIL) |RECORD: |SUMMARY" "$LOG"
