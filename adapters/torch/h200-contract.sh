#!/bin/bash
# h200-contract.sh - PyTorch's allocator contract with fabpool on the real driver (one H200; run from the
# repository root; CUDA 13, cmake, ninja or make, PyTorch in python3; about 5 minutes).
#   configure  the project's CMake against the real driver: libfabpool_torch_cxx.so is built against the PyTorch
#              that python3 imports (torch_probe.py); its line in the configure log says which
#   build      libfabpool_torch.so (the shim) and libfabpool_torch_cxx.so (the C++ allocator)
#   ctest      the torch-labelled tests against the real driver (the shim's, the install test)
#   contract   adapters/torch/test_torch_contract.py: every case with PyTorch's allocator and with fabpool
#              installed by a plain install() (the C++ allocator), each in a process of its own, compared
# Writes under $OUT: contract.txt (this log), contract.json (every case's figures), configure.txt.  Never stops at
# the first failure; the last line is SUMMARY name=rc ...  CONTRACT_CASES=a,b runs those cases only.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-contract contract.txt
B=${FABPOOL_TORCH_BUILD:-/tmp/b-contract}
# torch.compile's cache outside $OUT (what is under $OUT comes back); the second run of a case reuses the first's
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fabpool-contract-inductor}
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
{
  h200_head "fabpool PyTorch contract"
  h200_torch
  step configure 120 bash -c "cmake -S . -B '$B' $GEN -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release \
      > '$OUT/configure.txt' 2>&1; rc=\$?; grep -E 'fabpool_torch_cxx|Error' '$OUT/configure.txt'; exit \$rc"
  step build 180 cmake --build "$B" -j16 --target fabpool_torch fabpool_torch_cxx test_torch_shim test_torch_core test_symm test_torch_combined \
       test_torch_cxx_stub
  step ctest-torch 120 ctest --test-dir "$B" -L torch --output-on-failure
  step contract 330 python3 adapters/torch/test_torch_contract.py --lib "$B/adapters/torch/libfabpool_torch.so" \
       --out "$OUT" ${CONTRACT_CASES:+--cases "$CONTRACT_CASES"}
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 30 "$LOG"
