#!/bin/bash
# h200-check.sh - PyTorch's pluggable allocator on the real driver (one H200).
# Run from the repository root.  Builds with -DFABPOOL_TEST_DRIVER=real, runs
# the torch-labelled tests against the real driver, then the MoE loop with
# fabpool and with PyTorch's allocator (test_torch_moe.py), and torch.cuda's
# memory statistics with install(stats=True) (test_torch_stats.py).  Writes everything
# to $OUT/torch-h200.txt (and the two runs' JSON reports to $OUT).  Never stops
# at the first failure; the last line says what passed.
set -u
OUT=${OUT:-/tmp/fabpool-torch-out}
mkdir -p "$OUT"
LOG="$OUT/torch-h200.txt"
export PATH=/opt/torch/.venv/bin:$PATH
B=${FABPOOL_TORCH_BUILD:-/tmp/b-torch}
. perf/h200/step.sh   # step NAME TIMEOUT COMMAND..., and the status array
{
  echo "fabpool torch H200 check, $(date -u), commit $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
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
