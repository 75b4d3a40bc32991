#!/bin/bash
# h200-check.sh - PyTorch's pluggable allocator on the real driver (one H200).
# Run from the repository root.  Builds with -DFABPOOL_TEST_DRIVER=real, runs
# the torch-labelled tests against the real driver, then the MoE loop with
# fabpool and with PyTorch's allocator (test_torch_moe.py), and torch.cuda's
# memory statistics with install(stats=True) (test_torch_stats.py).  Writes everything
# to $OUT/torch-h200.txt (and the two runs' JSON reports to $OUT).  Never stops
# at the first failure; the last line says what passed.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-torch-out torch-h200.txt
B=${FABPOOL_TORCH_BUILD:-/tmp/b-torch}
{
  h200_head "fabpool torch H200 check"
  h200_torch
  step configure 60 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFABPOOL_WERROR=ON
  step build 120 cmake --build "$B" -j16 --target fabpool_torch test_torch_shim
  step ctest-torch 60 ctest --test-dir "$B" -L torch --output-on-failure
  # torch loads the library with ctypes from a running interpreter: no LD_PRELOAD, no variable needed
  step moe 200 python3 adapters/torch/test_torch_moe.py --lib "$B/adapters/torch/libfabpool_torch.so" --steps 200 \
       --workdir "$OUT"
  step stats 120 python3 adapters/torch/test_torch_stats.py --lib "$B/adapters/torch/libfabpool_torch.so" \
       --out "$OUT/torch-stats.json"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 25 "$LOG"
