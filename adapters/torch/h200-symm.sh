#!/bin/bash
# h200-symm.sh - fabpool_torch.SymmetricBuffer on the real driver (one H200): 4 ranks of a gloo group on
# the one GPU, each mapping the others' buffers through POSIX fds; 200 random resizes between 1 MiB and
# 1 GiB with every rank's data read through every peer's tensors after each, two CUDA graphs captured at
# the start replayed at every step, the resize time against a new torch.distributed._symmetric_memory
# buffer and against a new fabpool buffer with a full exchange, and nothing held after close
# (adapters/torch/test_symm_gpu.py says what each phase checks).  Run from the repository root; about
# 2 minutes.  Writes $OUT/symm-h200.txt and $OUT/symm-h200.json; the last lines say what passed.
set -u
OUT=${OUT:-/tmp/fabpool-symm-out}
mkdir -p "$OUT"
LOG="$OUT/symm-h200.txt"
export PATH=/opt/torch/.venv/bin:$PATH
# PyTorch's symmetric memory: several ranks on one device, NVLink multicast off
export TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=${FABPOOL_TORCH_BUILD:-/tmp/b-symm}
. perf/h200/step.sh   # step NAME TIMEOUT COMMAND..., and the status array
{
  echo "fabpool symmetric memory H200 check, $(date -u), commit $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
  step configure 60 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFABPOOL_WERROR=ON
  step build 120 cmake --build "$B" -j16 --target fabpool_torch
  step symm 210 python3 adapters/torch/test_symm_gpu.py --lib "$B/adapters/torch/libfabpool_torch.so" --ranks 4 \
       --devices 1 --steps 200 --min-mib 1 --max-mib 1024 --budget-s 40 --out "$OUT/symm-h200.json"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 30 "$LOG"
